"""Shell completion of `metricscale` through argcomplete, driven as the shell hook drives it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def complete(line: str, tmp_path: Path) -> list[str]:
    """What argcomplete offers for `line` (cursor at its end), read from fd 8 as the hook does."""
    answer = tmp_path / "fd8"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_IFS": "\n"}
    with answer.open("wb") as file:
        saved = _save_fd(8)
        os.dup2(file.fileno(), 8)
        try:
            subprocess.run(
                [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"],
                cwd=REPO, env=env, check=True, timeout=60, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, pass_fds=(8,))
        finally:
            if saved is None:
                os.close(8)
            else:
                os.dup2(saved, 8)
                os.close(saved)
    return answer.read_text().split("\n")


def _save_fd(fd: int) -> int | None:
    try:
        return os.dup(fd)
    except OSError:
        return None


def test_subcommand_names_are_completed(tmp_path: Path) -> None:
    assert [o.strip() for o in complete("metricscale ad", tmp_path)] == ["adapter"]
    offered = complete("metricscale ", tmp_path)
    assert {"adapter", "autoscaler", "certs", "explain"} <= {o.strip() for o in offered}


@pytest.mark.parametrize(("line", "option"), [
    ("metricscale certs --drop", "--drop-san"),
    ("metricscale adapter --check-c", "--check-config"),
])
def test_subcommand_options_are_completed(tmp_path: Path, line: str, option: str) -> None:
    assert option in [o.strip() for o in complete(line, tmp_path)]
