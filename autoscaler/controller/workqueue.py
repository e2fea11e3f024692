"""The controller loop: a work queue of autoscalers, a resync schedule, and the workers.

As upstream's HPA controller (and client-go's workqueue): a key is in the queue at most once
and is never handed to two workers at the same time (a change that arrives while it is being
reconciled queues it again for afterwards); every autoscaler is reconciled once per sync period
and at once when it appears or its spec changes (a new `metadata.generation`). Each reconcile
has a time limit, so a slow or stuck one only ever holds its own worker; a failing one is
retried with a per-key exponential backoff that starts at the sync period.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from typing import Generic, Protocol, TypeVar

from autoscaler.controller.leader import NotLeader
from autoscaler.controller.reconciler import ReconcileResult
from autoscaler.controller.stats import ControllerMetrics
from autoscaler.controller.watching import AutoscalerEntry, AutoscalerKey
from autoscaler.decision.pause import PAUSE_ANNOTATIONS
from autoscaler.decision.persistence import DRY_RUN_ANNOTATION
from metricscale.kube.informer import InformerEvent

__all__ = [
    "CURRENT_OBJECT",
    "Controller",
    "QueueShutDown",
    "Reconciler",
    "Schedule",
    "WorkQueue",
    "needs_immediate_sync",
]

logger = logging.getLogger(__name__)

K = TypeVar("K")

# The object a log line is about: set by the worker for everything it logs (see server.py).
CURRENT_OBJECT: ContextVar[str] = ContextVar("metricscale_object", default="")


class Reconciler(Protocol):
    async def reconcile_once(self, key: AutoscalerKey, now: datetime) -> ReconcileResult: ...

    def forget(self, key: AutoscalerKey) -> None: ...

    def reset(self) -> None: ...


# --------------------------------------------------------------------------------------------
# The queue


class QueueShutDown(Exception):
    """The queue was shut down; workers stop."""


class WorkQueue(Generic[K]):
    """client-go's workqueue in asyncio: dirty set, processing set, FIFO order."""

    def __init__(self) -> None:
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._shut_down = False

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def processing(self) -> int:
        return len(self._processing)

    def add(self, key: K) -> None:
        if self._shut_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return  # queued again by done()
        self._queue.append(key)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def get(self) -> K:
        """The next key; the caller must call done(key) when finished with it."""
        while not self._queue:
            if self._shut_down:
                raise QueueShutDown
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # pass the wake-up on: another worker takes the key
                raise
        key = self._queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._wake_one()

    def shut_down(self) -> None:
        self._shut_down = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)


class Schedule(Generic[K]):
    """When each key is due next (monotonic seconds); a later call for a key replaces the
    earlier one."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, K]] = []
        self._due: dict[K, float] = {}
        self._sequence = 0

    def __len__(self) -> int:
        return len(self._due)

    def at(self, key: K, due: float) -> None:
        self._due[key] = due
        self._sequence += 1
        heapq.heappush(self._heap, (due, self._sequence, key))

    def cancel(self, key: K) -> None:
        self._due.pop(key, None)

    def next_due(self) -> float | None:
        while self._heap:
            due, _, key = self._heap[0]
            if self._due.get(key) == due:
                return due
            heapq.heappop(self._heap)  # replaced or cancelled
        return None

    def pop_due(self, now: float) -> list[K]:
        ready = []
        while self._heap and self._heap[0][0] <= now:
            due, _, key = heapq.heappop(self._heap)
            if self._due.get(key) == due:
                del self._due[key]
                ready.append(key)
        return ready


# --------------------------------------------------------------------------------------------
# The controller


def needs_immediate_sync(event: InformerEvent[AutoscalerEntry]) -> bool:
    """A new autoscaler, a changed spec (generation), a dry-run or pause switch: reconcile now.
    Status and other metadata changes (our own writes among them) wait for the resync."""
    if event.kind != "MODIFIED" or event.old is None or event.new is None:
        return event.kind == "ADDED"
    old, new = event.old, event.new
    if old.generation != new.generation or (old.error is None) != (new.error is None):
        return True
    if old.generation is None and old.raw.get("spec") != new.raw.get("spec"):
        return True  # a server that does not count generations
    return any(old.annotations.get(key) != new.annotations.get(key)
               for key in (DRY_RUN_ANNOTATION, *PAUSE_ANNOTATIONS))


class Controller:
    """Queue, schedule and workers around a Reconciler."""

    def __init__(
        self,
        reconciler: Reconciler,
        *,
        sync_period: timedelta,
        workers: int = 5,
        metrics: ControllerMetrics | None = None,
        reconcile_timeout: float | None = None,
        max_backoff: timedelta = timedelta(minutes=5),
        may_work: Callable[[], Awaitable[None]] | None = None,
        exists: Callable[[AutoscalerKey], bool] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if workers < 1:
            raise ValueError("--concurrent-syncs must be at least 1")
        self._reconciler = reconciler
        self._sync_period = sync_period.total_seconds()
        self._workers = workers
        self._metrics = metrics
        self._timeout = reconcile_timeout if reconcile_timeout is not None else max(
            30.0, 2 * self._sync_period)
        self._max_backoff = max_backoff.total_seconds()
        self._may_work = may_work
        self._exists = exists or (lambda key: True)
        self._monotonic = monotonic
        self._wall_clock = wall_clock
        self.queue: WorkQueue[AutoscalerKey] = WorkQueue()
        self.schedule: Schedule[AutoscalerKey] = Schedule()
        self._failures: dict[AutoscalerKey, int] = {}
        self._wakeup = asyncio.Event()
        self.reconciled = 0

    # -- events --

    def on_event(self, event: InformerEvent[AutoscalerEntry]) -> None:
        """Informer callback (runs inside the watch loop: only bookkeeping here)."""
        entry = event.new if event.new is not None else event.old
        assert entry is not None
        key = entry.key
        if event.kind == "DELETED":
            self.forget(key)
            return
        if needs_immediate_sync(event):
            self.queue.add(key)

    def forget(self, key: AutoscalerKey) -> None:
        """The autoscaler is gone: no more syncs, no memory of it."""
        self.schedule.cancel(key)
        self._failures.pop(key, None)
        self._reconciler.forget(key)

    def enqueue_all(self, keys: list[AutoscalerKey]) -> None:
        for key in keys:
            self.queue.add(key)

    def reset(self, keys: list[AutoscalerKey]) -> None:
        """Leadership changed: forget every in-memory history (it is read back from the
        autoscalers) and reconcile everything now."""
        self._reconciler.reset()
        self._failures.clear()
        self.enqueue_all(keys)

    # -- scheduling --

    def _after(self, key: AutoscalerKey, result: ReconcileResult | None, *,
               started: float) -> None:
        if not self._exists(key):
            self.forget(key)
            return
        # An autoscaler's own period (KEP-6003's behavior.syncPeriodSeconds) replaces the
        # global one for it alone; the schedule costs the others nothing either way.
        period = self._sync_period
        if result is not None and result.sync_period is not None:
            period = result.sync_period
        if result is not None and not result.failed:
            self._failures.pop(key, None)
            delay = period if result.requeue_after is None else result.requeue_after
        else:
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
            delay = min(self._max_backoff, period * 2 ** (failures - 1))
            if result is not None and result.retry_after is not None:
                delay = max(delay, result.retry_after)
        self.schedule.at(key, started + delay)
        self._wakeup.set()

    def release_due(self, now: float | None = None) -> int:
        """Queue every key whose time has come; returns how many."""
        due = self.schedule.pop_due(self._monotonic() if now is None else now)
        for key in due:
            self.queue.add(key)
        return len(due)

    async def _timer(self) -> None:
        while True:
            self.release_due()
            next_due = self.schedule.next_due()
            self._wakeup.clear()
            timeout = None if next_due is None else max(0.0, next_due - self._monotonic())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wakeup.wait()

    # -- work --

    async def process_one(self, key: AutoscalerKey) -> ReconcileResult | None:
        """Reconcile one key with the time limit; never raises (except cancellation)."""
        started = self._monotonic()
        token = CURRENT_OBJECT.set(str(key))
        result: ReconcileResult | None = None
        label = "ok"
        try:
            async with asyncio.timeout(self._timeout):
                result = await self._reconciler.reconcile_once(key, self._wall_clock())
            label = "failed" if result.failed else "ok"
        except TimeoutError:
            label = "timeout"
            logger.warning("reconcile did not finish within %.0fs; retrying later", self._timeout)
        except NotLeader:
            label = "not_leader"
            logger.info("lost the lease during the reconcile; nothing more is written")
        except Exception:
            label = "failed"
            logger.exception("reconcile failed")
        finally:
            CURRENT_OBJECT.reset(token)
            self.reconciled += 1
            if self._metrics is not None:
                self._metrics.reconciles.labels(label).inc()
                self._metrics.duration.observe(self._monotonic() - started)
                if label in {"timeout", "failed"} and result is None:
                    self._metrics.errors.labels(f"reconcile_{label}").inc()
        if label != "not_leader":
            self._after(key, result, started=started)
        return result

    async def _worker(self) -> None:
        while True:
            if self._may_work is not None:
                await self._may_work()
            try:
                key = await self.queue.get()
            except QueueShutDown:
                return
            try:
                if self._metrics is not None:
                    self._metrics.queue_depth.set(len(self.queue))
                if self._exists(key):
                    await self.process_one(key)
                else:
                    self.forget(key)
            finally:
                self.queue.done(key)

    async def run(self) -> None:
        """Run the timer and the workers until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._timer(), name="controller timer")
            for number in range(self._workers):
                group.create_task(self._worker(), name=f"controller worker {number}")

    def shut_down(self) -> None:
        self.queue.shut_down()
