"""Guarded background tasks: an unexpected end is logged at once and reported, never lost."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["TaskEnded", "start_guarded_task"]

logger = logging.getLogger(__name__)


class TaskEnded(RuntimeError):
    """A background loop that should run until stopped returned on its own."""


def start_guarded_task(coro: Coroutine[Any, Any, Any], *, name: str,
                       on_failure: Callable[[BaseException], None] | None = None,
                       forever: bool = True) -> asyncio.Task[Any]:
    """Start a background task whose unexpected end is logged at once and reported.

    With `forever`, returning normally is also a failure (a loop that should never end did).
    Cancellation is the normal way to stop, and is not reported.
    """
    task = asyncio.create_task(coro, name=name)

    def _done(finished: asyncio.Task[Any]) -> None:
        if finished.cancelled():
            return
        exc = finished.exception()
        if exc is None:
            if not forever:
                return
            exc = TaskEnded(f"background task {name} returned; it should run until stopped")
        logger.error("background task %s ended unexpectedly: %r", name, exc, exc_info=exc)
        if on_failure is not None:
            try:
                on_failure(exc)
            except Exception:
                logger.exception("failure handler of background task %s raised", name)

    task.add_done_callback(_done)
    return task
