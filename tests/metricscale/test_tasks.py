"""metricscale.tasks: single flights (shared calls) and guarded background tasks."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from metricscale.tasks import Flight, SingleFlight, TaskEnded, start_guarded_task


class Gate:
    """A call that counts how often it started and finishes when released."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()

    async def __call__(self) -> int:
        self.calls += 1
        await self.release.wait()
        return self.calls


async def test_concurrent_callers_of_one_key_share_one_call() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    gate = Gate()
    waiters = [asyncio.create_task(flights.run("k", gate)) for _ in range(5)]
    await asyncio.sleep(0)
    gate.release.set()
    assert await asyncio.gather(*waiters) == [1] * 5
    assert gate.calls == 1
    assert len(flights) == 0


async def test_a_caller_that_gives_up_does_not_cancel_the_call_for_the_others() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    gate = Gate()
    quitter = asyncio.create_task(flights.run("k", gate))
    stayer = asyncio.create_task(flights.run("k", gate))
    await asyncio.sleep(0)
    quitter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await quitter
    gate.release.set()
    assert await stayer == 1


async def test_every_waiter_gets_the_same_error_and_a_later_call_starts_anew() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    calls = 0

    async def failing() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        raise ValueError("boom")

    results = await asyncio.gather(flights.run("k", failing), flights.run("k", failing),
                                   return_exceptions=True)
    assert [str(r) for r in results] == ["boom", "boom"] and calls == 1
    with pytest.raises(ValueError):
        await flights.run("k", failing)
    assert calls == 2


async def test_joins_decides_which_flight_of_a_key_a_caller_shares() -> None:
    landed: list[tuple[str, int]] = []

    def remember(key: str, flight: Flight[int]) -> None:
        landed.append((key, flight.tag))

    flights: SingleFlight[str, int] = SingleFlight(landed=remember)
    gate = Gate()
    first, joined_first = flights.join("q", gate, tag=100)
    near, joined_near = flights.join("q", gate, tag=100, joins=lambda tag: abs(tag - 101) <= 1)
    far, joined_far = flights.join("q", gate, tag=105, joins=lambda tag: abs(tag - 105) <= 1)
    assert (joined_first, joined_near, joined_far) == (False, True, False)
    assert near is first and far is not first and len(flights) == 2
    gate.release.set()
    await asyncio.gather(first.task, far.task)
    await asyncio.sleep(0)
    assert sorted(landed) == [("q", 100), ("q", 105)]


async def test_close_cancels_the_calls_in_flight() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    flight, _ = flights.join("k", Gate())
    await flights.close()
    assert flight.task.cancelled() and len(flights) == 0


async def test_a_guarded_loop_that_returns_is_reported() -> None:
    failures: list[BaseException] = []

    async def returns() -> None:
        return None

    task = start_guarded_task(returns(), name="loop", on_failure=failures.append)
    await task
    await asyncio.sleep(0)
    assert len(failures) == 1 and isinstance(failures[0], TaskEnded)
