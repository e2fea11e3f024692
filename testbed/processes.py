"""Child processes that cannot outlive us: started with a parent-death signal, logged to a file,
stopped with SIGTERM then SIGKILL."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

__all__ = ["Child", "ChildFailed", "free_port", "wait_until"]

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


class ChildFailed(RuntimeError):
    """A child exited, or did not become ready; the message carries its log's tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    # Ctrl-C in a terminal reaches the whole foreground group; the parent stops us in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Child:
    """One program running in the background with its output in `log`."""

    def __init__(self, name: str, argv: Sequence[str], *, log: Path,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log = log
        self._log_file: IO[bytes] = open(log, "ab")  # noqa: SIM115 - closed in stop()
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.process = subprocess.Popen(
            self.argv, stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=full_env, cwd=cwd, preexec_fn=_die_with_parent)
        logger.info("started %s (pid %d): %s", name, self.process.pid, " ".join(self.argv))

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def check_running(self) -> None:
        if not self.running:
            raise ChildFailed(f"{self.name} exited with status {self.process.returncode}; "
                              f"the end of {self.log}:\n{self.tail()}")

    def stop(self, *, timeout: float = 15.0) -> None:
        if self.running:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                logger.warning("%s ignored SIGTERM for %.0f s; killing it", self.name, timeout)
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(OSError):
            self._log_file.close()


def wait_until(check: Callable[[], bool], *, what: str, timeout: float,
               children: Sequence[Child] = (), interval: float = 0.1) -> None:
    """Poll `check` until it holds; fail at once if a child died, or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        for child in children:
            child.check_running()
        if check():
            return
        if time.monotonic() > deadline:
            tails = "".join(f"\n--- {c.name} ({c.log}):\n{c.tail()}" for c in children)
            raise ChildFailed(f"not within {timeout:.0f} s: {what}{tails}")
        time.sleep(interval)
