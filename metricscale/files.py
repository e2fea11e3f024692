"""Files the commands read: bounded in size, UTF-8, parsed as YAML or JSON, one-line errors.

Every way such a file can be unusable (missing, a directory, too large, not UTF-8, not YAML,
nested deeper than the parser's recursion allows) is a `FileError` whose message names the file
and the problem, so that a command prints one line and exits 2 instead of a traceback.
"""

from __future__ import annotations

import json
from typing import IO, Any

import yaml

__all__ = ["MAX_FILE_BYTES", "FileError", "decode_text", "parse_json_or_yaml", "parse_yaml",
           "read_bytes", "read_document", "read_text"]

# A bound on what a command reads, so that /dev/zero or a log file given by mistake is refused
# instead of filling memory. The API server refuses request bodies over 3 MiB, so one object
# (an Autoscaler, an HPA, a ConfigMap of rules) is far below it; a decision snapshot holds a
# pod list, and several thousand pods still fit, as does any kubeconfig.
MAX_FILE_BYTES = 16 * 1024 * 1024


class FileError(ValueError):
    """A file that cannot be used. `str()` is one line naming the file and the problem:
    `cannot read PATH: PROBLEM` when `reading` (missing, a directory, too large), else
    `PATH is PROBLEM` (`not UTF-8 text (byte 3)`, `not YAML: ...`). `strerror` is the
    operating system's own words when it refused the read (`No such file or directory`),
    for a command that quotes them; None for every other problem."""

    def __init__(self, path: str, problem: str, *, reading: bool = False,
                 strerror: str | None = None) -> None:
        super().__init__(f"cannot read {path}: {problem}" if reading else f"{path} is {problem}")
        self.path = path
        self.problem = problem
        self.reading = reading
        self.strerror = strerror


def _too_large(path: str, limit: int) -> FileError:
    size = f"{limit // 2**20} MiB" if limit % 2**20 == 0 else f"{limit} bytes"
    return FileError(path, f"larger than {size} (the most a command reads)", reading=True)


def read_bytes(path: str, *, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of `path`, at most `limit` of them (more is an error, never read whole)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as error:
        words = error.strerror or str(error)
        raise FileError(path, words.lower(), reading=True, strerror=words) from None
    if len(data) > limit:
        raise _too_large(path, limit)
    return data


def decode_text(data: bytes, path: str) -> str:
    """UTF-8 text, or FileError naming the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise FileError(path, f"not UTF-8 text (byte {error.start})") from None


def read_text(path: str, *, limit: int = MAX_FILE_BYTES, stream: IO[str] | None = None
              ) -> str:
    """The UTF-8 text of `path`, or of the text `stream` (standard input) named `path` in
    errors; at most `limit` bytes (characters for a stream)."""
    if stream is None:
        return decode_text(read_bytes(path, limit=limit), path)
    try:
        text = stream.read(limit + 1)
    except UnicodeDecodeError as error:
        raise FileError(path, f"not UTF-8 text (byte {error.start})") from None
    except OSError as error:
        raise FileError(path, (error.strerror or str(error)).lower(), reading=True) from None
    if len(text) > limit:
        raise _too_large(path, limit)
    return text


def _one_line(error: yaml.YAMLError) -> str:
    """PyYAML's messages span lines (with a caret picture); errors here are one line."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem:
        mark = error.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        return f"{error.problem}{where}"
    return " ".join(str(error).split())


def parse_yaml(text: str, path: str, *,
               loader: type[yaml.SafeLoader] = yaml.SafeLoader) -> Any:
    """One YAML document, with a SafeLoader (or a subclass): no arbitrary objects."""
    try:
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as error:
        raise FileError(path, f"not YAML: {_one_line(error)}") from None
    except RecursionError:
        raise FileError(path, "not YAML: nested too deeply") from None


def parse_json_or_yaml(text: str, path: str, *,
                       loader: type[yaml.SafeLoader] = yaml.SafeLoader) -> Any:
    """JSON when the text is a JSON object, else YAML (JSON's flow style is YAML too)."""
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass  # maybe YAML flow style; let YAML have a go and report its error
        except RecursionError:
            raise FileError(path, "neither JSON nor YAML: nested too deeply") from None
    try:
        return parse_yaml(text, path, loader=loader)
    except FileError as error:
        problem = error.problem.replace("not YAML", "neither JSON nor YAML", 1)
        raise FileError(path, problem) from None


def read_document(path: str, *, loader: type[yaml.SafeLoader] = yaml.SafeLoader,
                  stream: IO[str] | None = None, limit: int = MAX_FILE_BYTES) -> Any:
    """The JSON or YAML document in `path` (or in `stream`, named `path`): bounded, UTF-8,
    every failure a one-line FileError."""
    return parse_json_or_yaml(read_text(path, limit=limit, stream=stream), path, loader=loader)
