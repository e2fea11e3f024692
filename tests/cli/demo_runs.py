"""`metricscale demo` as a process, for the tests that run it (tests/cli/test_demo.py on the
fake, tests/cluster/test_demo_cluster.py on the real control plane): started in a process group
of its own, its output read line by line as it comes, and what it may leave behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from testbed.fakes.tools import require_tool

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def demo_process(workdir: Path, *extra: str, fake: bool = True, sigint_ignored: bool = False
                 ) -> Iterator[subprocess.Popen[str]]:
    """`metricscale demo --fast` in its own process group, so that whatever it starts can be
    found (and, if the test fails, killed) by that group; on the fake cluster (`--fake`, with
    the PATH's kubectl) unless told otherwise. `sigint_ignored` starts it as a shell without
    job control starts `cmd &`: with SIGINT ignored, which Python then leaves ignored."""
    require_tool("prometheus", env_var="PROMETHEUS")
    backend = ["--fake", "--kubectl", require_tool("kubectl", env_var="KUBECTL")] if fake else []
    process = subprocess.Popen(
        [sys.executable, "-m", "metricscale", "demo", "--fast", "--workdir", str(workdir),
         *backend, *extra],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored
        else None)
    try:
        yield process
    finally:
        if process.poll() is None or group_alive(process.pid):
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def leftovers(workdir: Path) -> list[Path]:
    """Temporary run directories and private keys the demo should have removed."""
    return sorted([*workdir.glob("run-*"), *workdir.rglob("*.key")])


class Lines:
    """The demo's output, read line by line as it comes."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self.stream = process.stdout
        self.seen: list[str] = []

    def until(self, marker: str) -> str:
        """Read until a line holding `marker` (which it returns); fail if the output ends."""
        for line in self.stream:
            self.seen.append(line)
            if marker in line:
                return line
        pytest.fail(f"the demo ended before {marker!r}:\n{self.text[-3000:]}")

    def rest(self) -> str:
        self.seen.extend(self.stream)
        return self.text

    @property
    def text(self) -> str:
        return "".join(self.seen)
