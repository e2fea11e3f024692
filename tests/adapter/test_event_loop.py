"""The adapter's event loop: uvloop's when it is installed, asyncio's own without it."""

from __future__ import annotations

import asyncio
import sys

import pytest

from adapter.server import event_loop_factory


def test_the_loop_is_uvloops_when_it_is_installed() -> None:
    uvloop = pytest.importorskip("uvloop")
    factory = event_loop_factory()
    assert factory is uvloop.new_event_loop
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_without_uvloop_asyncio_runs_the_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # what `import uvloop` meets uninstalled
    factory = event_loop_factory()
    assert factory is None
    with asyncio.Runner(loop_factory=factory) as runner:
        assert runner.run(asyncio.sleep(0, result="served")) == "served"
