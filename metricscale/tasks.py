"""Background tasks: guarded ones (an unexpected end is logged and reported, never lost) and
single flights (concurrent callers of one call share it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["Flight", "SingleFlight", "TaskEnded", "start_guarded_task"]

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


K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class Flight(Generic[V]):
    """One shared call: its task, and the tag it was started with (e.g. an evaluation time)."""

    task: asyncio.Task[V]
    tag: Any = None


def _any_flight(tag: Any) -> bool:
    return True


class SingleFlight(Generic[K, V]):
    """Concurrent callers with the same key share one call (as Go's singleflight).

    The call runs as its own task, so a caller that gives up does not cancel it for the others;
    every waiter gets the same result or the same exception. A key may have several flights at
    once when a caller's `joins` refuses the ones in the air (the Prometheus client joins only
    a query evaluated close enough in time). `landed` sees each flight once it has finished.
    """

    def __init__(self, *, landed: Callable[[K, Flight[V]], None] | None = None) -> None:
        self._flights: dict[K, list[Flight[V]]] = {}
        self._landed = landed

    def __len__(self) -> int:
        return sum(len(flights) for flights in self._flights.values())

    def join(self, key: K, call: Callable[[], Coroutine[Any, Any, V]], *, tag: Any = None,
             joins: Callable[[Any], bool] = _any_flight) -> tuple[Flight[V], bool]:
        """The flight for `key` that `joins` accepts, else a new one running `call()`; and
        whether an existing flight was joined."""
        flights = self._flights.setdefault(key, [])
        for flight in flights:
            if joins(flight.tag):
                return flight, True
        flight = Flight(asyncio.create_task(call()), tag)
        flights.append(flight)
        flight.task.add_done_callback(lambda done: self._finished(key, flight))
        return flight, False

    async def run(self, key: K, call: Callable[[], Coroutine[Any, Any, V]]) -> V:
        """Join or start the one call for `key` and wait for its result."""
        flight, _ = self.join(key, call)
        # shield: one caller giving up must not cancel the call the others wait for.
        return await asyncio.shield(flight.task)

    def _finished(self, key: K, flight: Flight[V]) -> None:
        flights = self._flights.get(key)
        if flights is not None:
            with contextlib.suppress(ValueError):
                flights.remove(flight)
            if not flights:
                del self._flights[key]
        if flight.task.cancelled():
            return
        flight.task.exception()  # retrieved here: every waiter may have gone
        if self._landed is not None:
            self._landed(key, flight)

    async def close(self) -> None:
        """Cancel the calls still in flight and wait for them to end."""
        flights = [flight for group in self._flights.values() for flight in group]
        self._flights = {}
        for flight in flights:
            flight.task.cancel()
        for flight in flights:
            with contextlib.suppress(BaseException):
                await flight.task
