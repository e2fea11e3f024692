"""The fenced blocks of README.md and docs/**/*.md, with the example marker before each.

A block's kind is said by an HTML comment on the line before its fence (the comment does not
show on GitHub or on the site): `<!-- example: KIND [file=NAME] [status=N] -->`. YAML and shell
blocks must carry one (tests/docs/test_examples.py fails on an unmarked one); other languages
(`text`, `promql`, `mermaid`) are shown, not run. docs/getting-started/development.md lists the
kinds and what checks each.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARKED_LANGUAGES = {"yaml", "yml", "sh", "bash", "shell", "console"}
KINDS = {"autoscaler", "rules", "rules-invalid", "snapshot", "kubernetes", "kustomization",
         "helm-values", "run", "cluster-check", "cluster"}

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^\s*<!--\s*example:\s*(?P<body>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its marker and its text."""

    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    kind: str | None
    options: dict[str, str] = field(default_factory=dict)
    text: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").split("\n")
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        language = (opening["info"].strip().split() or [""])[0].lower()
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not re.match(rf"^\s*{re.escape(fence)}\s*$", lines[end]):
            body.append(lines[end][indent:] if lines[end][:indent].strip() == "" else lines[end])
            end += 1
        previous = index - 1
        while previous >= 0 and not lines[previous].strip():
            previous -= 1
        marker = _MARKER.match(lines[previous]) if previous >= 0 else None
        kind, options = None, {}
        if marker:
            words = shlex.split(marker["body"])
            kind = words[0] if words else ""
            options = dict(word.split("=", 1) for word in words[1:])
        found.append(Block(page, index + 1, language, kind, options, "\n".join(body) + "\n"))
        index = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks_of(page)]


def commands_and_outputs(block: Block) -> list[tuple[str, list[str]]]:
    """A console block as (command, the lines it prints); `\\` continues a command line."""
    pairs: list[tuple[str, list[str]]] = []
    lines = block.text.rstrip("\n").split("\n")
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.startswith("$ "):
            raise AssertionError(f"{block.where}: output before any `$ ` command: {line!r}")
        command = line[2:]
        while command.endswith("\\") and index + 1 < len(lines):
            index += 1
            command = command[:-1] + " " + lines[index].strip()
        index += 1
        output: list[str] = []
        while index < len(lines) and not lines[index].startswith("$ "):
            output.append(lines[index])
            index += 1
        pairs.append((command, output))
    return pairs


def script_of(block: Block) -> str:
    """The shell a block runs: a console block's commands, or a sh block as it is."""
    if block.language == "console":
        return "\n".join(command for command, _ in commands_and_outputs(block)) + "\n"
    return block.text


def command_lines(script: str) -> list[str]:
    """Each command of a script on one line (continuations joined, comments and blanks out)."""
    joined = re.sub(r"\\\n\s*", " ", script)
    return [line.strip() for line in joined.split("\n")
            if line.strip() and not line.strip().startswith("#")]


def _normalised(line: str) -> str:
    """A line with its run-to-run figures blurred: a word with a digit in it is `#`."""
    return " ".join("#" if any(c.isdigit() for c in word) else word for word in line.split())


def output_matches(shown: list[str], actual: list[str]) -> bool:
    """Whether the printed lines match the shown ones: `...` alone stands for any lines, and a
    word with a digit for any word with a digit (times, ages, counts, names with numbers)."""
    want = [line for line in shown]
    got = [_normalised(line) for line in actual if line.strip()]

    def match(w: int, g: int) -> bool:
        if w == len(want):
            return g == len(got)
        if want[w].strip() == "...":
            return any(match(w + 1, k) for k in range(g, len(got) + 1))
        if not want[w].strip():
            return match(w + 1, g)
        return g < len(got) and _normalised(want[w]) == got[g] and match(w + 1, g + 1)

    return match(0, 0)
