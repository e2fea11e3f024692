"""Helpers shared by the controller's tests: bounded waits for things that happen elsewhere."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def eventually(check: Callable[[], object], within: float = 5.0,
                     message: str = "") -> None:
    """Poll `check` until it is truthy; fail after `within` seconds (a bound, not a delay)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        if check():
            return
        if loop.time() > deadline:
            raise AssertionError(message or f"condition not met within {within}s")
        await asyncio.sleep(0.01)
