"""`metricscale explain FILE` on a file that cannot be a snapshot: exit 2 with one line naming
the file and the problem (not UTF-8, nested too deeply, too large), never a traceback.

The snapshot's fields are tests/autoscaler/test_explain_cli.py's; these are the file's bytes.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from cli.main import main
from metricscale.files import MAX_FILE_BYTES

PREFIX = "metricscale explain: invalid snapshot: "


def _explain_error(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    status = main(["explain", *arguments])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert status == 2, captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), captured.err
    return lines[0][len(PREFIX):]


def test_a_file_that_is_not_utf8_is_named(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "snapshot.yaml"
    path.write_bytes(b"now: \xff\xfe\n")
    assert _explain_error([str(path)], capsys) == f"{path} is not UTF-8 text (byte 5)"


@pytest.mark.parametrize(("text", "problem"), [
    ("[" * 20_000 + "\n", "neither JSON nor YAML: nested too deeply"),
    ('{"a": ' * 20_000 + "1" + "}" * 20_000, "neither JSON nor YAML: nested too deeply"),
])
def test_a_file_nested_too_deeply_is_named(tmp_path: Path, text: str, problem: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(text, encoding="utf-8")
    assert _explain_error([str(path)], capsys) == f"{path} is {problem}"


@pytest.mark.parametrize("source", ["sparse", "/dev/zero"])
def test_a_file_is_read_with_a_bound(tmp_path: Path, source: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(source) if source.startswith("/") else tmp_path / source
    if not source.startswith("/"):
        with path.open("wb") as handle:  # sparse: no disk used
            handle.truncate(MAX_FILE_BYTES + 1)
    assert _explain_error([str(path)], capsys) == \
        f"cannot read {path}: larger than 16 MiB (the most a command reads)"


def test_standard_input_is_read_with_a_bound(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(" " * (MAX_FILE_BYTES + 1)))
    assert _explain_error(["-"], capsys) == \
        "cannot read -: larger than 16 MiB (the most a command reads)"


def test_a_missing_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "missing.yaml"
    assert _explain_error([str(path)], capsys) == \
        f"cannot read {path}: no such file or directory"
