"""autoscaler.controller.workqueue: one key in the queue at most once and never on two workers,
resync every sync period, at once on a spec change, backoff on failures, slow ones hold nobody up,
deletion forgets, leadership gates the workers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from autoscaler.controller.leader import NotLeader
from autoscaler.controller.reconciler import ReconcileResult
from autoscaler.controller.stats import ControllerMetrics
from autoscaler.controller.watching import AutoscalerEntry, AutoscalerKey, project_autoscaler
from autoscaler.controller.workqueue import (
    CURRENT_OBJECT,
    Controller,
    QueueShutDown,
    Schedule,
    WorkQueue,
    needs_immediate_sync,
)
from autoscaler.decision.persistence import DRY_RUN_ANNOTATION
from metricscale.kube.informer import InformerEvent, ObjectKey
from tests.autoscaler.controller_support import eventually

SYNC = timedelta(seconds=15)


def key(name: str) -> AutoscalerKey:
    return AutoscalerKey("Autoscaler", "shop", name)


class FakeReconciler:
    """Records calls; `behaviour[name]` decides what a reconcile of that key does."""

    def __init__(self) -> None:
        self.calls: list[AutoscalerKey] = []
        self.running: dict[AutoscalerKey, int] = {}
        self.most_at_once: dict[AutoscalerKey, int] = {}
        self.behaviour: dict[str, Callable[[], Any]] = {}
        self.forgotten: list[AutoscalerKey] = []
        self.resets = 0
        self.seen_object: list[str] = []

    async def reconcile_once(self, key: AutoscalerKey, now: datetime) -> ReconcileResult:
        self.calls.append(key)
        self.seen_object.append(CURRENT_OBJECT.get())
        self.running[key] = self.running.get(key, 0) + 1
        self.most_at_once[key] = max(self.most_at_once.get(key, 0), self.running[key])
        try:
            action = self.behaviour.get(key.name)
            if action is not None:
                outcome = action()
                if asyncio.iscoroutine(outcome):
                    outcome = await outcome
                if isinstance(outcome, ReconcileResult):
                    return outcome
            await asyncio.sleep(0)
            return ReconcileResult("no_change")
        finally:
            self.running[key] -= 1

    def forget(self, key: AutoscalerKey) -> None:
        self.forgotten.append(key)

    def reset(self) -> None:
        self.resets += 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def reconciler() -> FakeReconciler:
    return FakeReconciler()


@contextlib.asynccontextmanager
async def running(controller: Controller) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(controller.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# ------------------------------------------------------------------------------- the queue


async def test_a_key_is_queued_once_however_often_it_is_added() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for _ in range(3):
        queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    assert await queue.get() == "a"
    assert await queue.get() == "b"


async def test_a_key_added_while_processing_comes_back_after_done_not_before() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    assert await queue.get() == "a"
    queue.add("a")
    assert len(queue) == 0  # not handed to a second worker while the first holds it
    queue.done("a")
    assert await queue.get() == "a"


async def test_shut_down_releases_waiting_workers() -> None:
    queue: WorkQueue[str] = WorkQueue()
    waiter = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    queue.shut_down()
    with pytest.raises(QueueShutDown):
        await waiter


def test_schedule_keeps_only_the_latest_time_per_key() -> None:
    schedule: Schedule[str] = Schedule()
    schedule.at("a", 10)
    schedule.at("b", 5)
    schedule.at("a", 20)
    assert schedule.next_due() == 5
    assert schedule.pop_due(15) == ["b"]
    assert schedule.pop_due(19) == []
    schedule.cancel("a")
    assert schedule.pop_due(100) == []
    assert schedule.next_due() is None


# ----------------------------------------------------------------------- workers and keys


async def test_never_two_workers_on_one_autoscaler(reconciler: FakeReconciler) -> None:
    gate = asyncio.Event()

    async def slow() -> None:
        await gate.wait()

    reconciler.behaviour["a"] = slow
    controller = Controller(reconciler, sync_period=SYNC, workers=5)
    async with running(controller):
        controller.queue.add(key("a"))
        await eventually(lambda: reconciler.calls == [key("a")])
        for _ in range(10):
            controller.queue.add(key("a"))
            await asyncio.sleep(0)
        gate.set()
        await eventually(lambda: len(reconciler.calls) == 2)
    assert reconciler.most_at_once[key("a")] == 1


async def test_a_stuck_reconcile_holds_only_its_own_worker(reconciler: FakeReconciler) -> None:
    async def stuck() -> None:
        await asyncio.Event().wait()

    reconciler.behaviour["stuck"] = stuck
    controller = Controller(reconciler, sync_period=SYNC, workers=2, reconcile_timeout=0.2)
    async with running(controller):
        controller.queue.add(key("stuck"))
        await eventually(lambda: key("stuck") in reconciler.calls)
        others = [key(f"k{i}") for i in range(20)]
        controller.enqueue_all(others)
        await eventually(lambda: set(others) <= set(reconciler.calls))
        # ... and the stuck one is cut at its time limit and rescheduled with a backoff.
        await eventually(lambda: key("stuck") in controller.schedule._due)


async def test_a_failing_autoscaler_does_not_stop_the_others(reconciler: FakeReconciler) -> None:
    def boom() -> None:
        raise RuntimeError("bug")

    reconciler.behaviour["bad"] = boom
    registry = CollectorRegistry()
    controller = Controller(reconciler, sync_period=SYNC, workers=1,
                            metrics=ControllerMetrics(registry))
    async with running(controller):
        controller.enqueue_all([key("bad"), key("good")])
        await eventually(lambda: key("good") in reconciler.calls)
    assert registry.get_sample_value("metricscale_autoscaler_reconciles_total",
                                     {"result": "failed"}) == 1
    assert registry.get_sample_value("metricscale_autoscaler_reconciles_total",
                                     {"result": "ok"}) == 1
    assert registry.get_sample_value("metricscale_autoscaler_errors_total",
                                     {"reason": "reconcile_failed"}) == 1


async def test_log_lines_of_a_reconcile_carry_its_object(reconciler: FakeReconciler) -> None:
    controller = Controller(reconciler, sync_period=SYNC)
    await controller.process_one(key("web"))
    assert reconciler.seen_object == ["shop/web"]
    assert CURRENT_OBJECT.get() == ""


# -------------------------------------------------------------------------------- timing


async def test_every_autoscaler_is_resynced_one_sync_period_after_its_last_start(
        reconciler: FakeReconciler) -> None:
    clock = Clock()
    controller = Controller(reconciler, sync_period=SYNC, monotonic=clock)
    await controller.process_one(key("a"))
    assert controller.schedule.next_due() == 1015
    assert controller.release_due(1014.9) == 0
    assert controller.release_due(1015) == 1
    assert len(controller.queue) == 1


async def test_an_autoscalers_own_sync_period_schedules_it_alone(
        reconciler: FakeReconciler) -> None:
    # KEP-6003's behavior.syncPeriodSeconds: the reconcile reports it, the schedule uses it
    # for that key; the others keep the global period.
    reconciler.behaviour["fast"] = lambda: ReconcileResult("no_change", sync_period=2.0)
    reconciler.behaviour["slow"] = lambda: ReconcileResult("failed", failed=True,
                                                           sync_period=60.0)
    clock = Clock()
    controller = Controller(reconciler, sync_period=SYNC, monotonic=clock)
    for name in ("fast", "slow", "default"):
        await controller.process_one(key(name))
    assert controller.release_due(1002) == 1  # fast, after its own 2 s
    assert controller.release_due(1015) == 1  # default, after the global 15 s
    assert controller.release_due(1059.9) == 0
    assert controller.release_due(1060) == 1  # slow: its period is the backoff's base


@pytest.mark.parametrize(("failures", "delay"), [(1, 15), (2, 30), (3, 60), (4, 120),
                                                 (5, 240), (6, 300), (9, 300)])
async def test_failures_back_off_from_the_sync_period_to_five_minutes(
        reconciler: FakeReconciler, failures: int, delay: float) -> None:
    reconciler.behaviour["a"] = lambda: ReconcileResult("failed", failed=True)
    clock = Clock()
    controller = Controller(reconciler, sync_period=SYNC, monotonic=clock)
    for _ in range(failures):
        await controller.process_one(key("a"))
    assert controller.schedule.next_due() == 1000 + delay


async def test_retry_after_is_honoured_and_success_resets_the_backoff(
        reconciler: FakeReconciler) -> None:
    clock = Clock()
    controller = Controller(reconciler, sync_period=SYNC, monotonic=clock)
    reconciler.behaviour["a"] = lambda: ReconcileResult("failed", failed=True, retry_after=42)
    await controller.process_one(key("a"))
    assert controller.schedule.next_due() == 1042
    await controller.process_one(key("a"))
    assert controller.schedule.next_due() == 1042  # max(30, 42)
    reconciler.behaviour.pop("a")
    await controller.process_one(key("a"))
    assert controller.schedule.next_due() == 1015


async def test_the_timer_queues_due_autoscalers_without_a_nudge(
        reconciler: FakeReconciler) -> None:
    controller = Controller(reconciler, sync_period=timedelta(milliseconds=50), workers=1)
    async with running(controller):
        controller.queue.add(key("a"))
        await eventually(lambda: reconciler.calls.count(key("a")) >= 3)


# ---------------------------------------------------------------------- informer events


def entry(name: str, *, generation: int = 1, status: dict[str, Any] | None = None,
          annotations: dict[str, str] | None = None) -> AutoscalerEntry:
    return project_autoscaler({
        "apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
        "metadata": {"name": name, "namespace": "shop", "generation": generation,
                     "annotations": annotations or {}},
        "spec": {"scaleTargetRef": {"kind": "Deployment", "name": name}, "maxReplicas": 3},
        "status": status or {"desiredReplicas": 1}})


def event(kind: str, old: AutoscalerEntry | None,
          new: AutoscalerEntry | None) -> InformerEvent[AutoscalerEntry]:
    return InformerEvent(kind, ObjectKey("shop", "a"), old, new)  # type: ignore[arg-type]


@pytest.mark.parametrize(("change", "immediate"), [
    (event("ADDED", None, entry("a")), True),
    (event("MODIFIED", entry("a"), entry("a", generation=2)), True),
    (event("MODIFIED", entry("a"), entry("a", status={"desiredReplicas": 3})), False),
    (event("MODIFIED", entry("a"), entry("a", annotations={"team": "x"})), False),
    (event("MODIFIED", entry("a"), entry("a", annotations={DRY_RUN_ANNOTATION: "true"})), True),
    (event("DELETED", entry("a"), None), False),
])
def test_spec_changes_sync_at_once_and_status_changes_wait(
        change: InformerEvent[AutoscalerEntry], immediate: bool) -> None:
    assert needs_immediate_sync(change) is immediate


async def test_a_spec_change_queues_the_autoscaler_at_once(reconciler: FakeReconciler) -> None:
    clock = Clock()
    controller = Controller(reconciler, sync_period=SYNC, monotonic=clock)
    await controller.process_one(key("a"))
    controller.on_event(event("MODIFIED", entry("a"), entry("a", status={"desiredReplicas": 2})))
    assert len(controller.queue) == 0
    controller.on_event(event("MODIFIED", entry("a"), entry("a", generation=2)))
    assert len(controller.queue) == 1


async def test_deletion_drops_the_schedule_and_the_memory(reconciler: FakeReconciler) -> None:
    controller = Controller(reconciler, sync_period=SYNC, monotonic=Clock())
    await controller.process_one(key("a"))
    assert len(controller.schedule) == 1
    controller.on_event(event("DELETED", entry("a"), None))
    assert len(controller.schedule) == 0
    assert reconciler.forgotten == [key("a")]


async def test_a_key_no_longer_cached_is_forgotten_instead_of_reconciled(
        reconciler: FakeReconciler) -> None:
    controller = Controller(reconciler, sync_period=SYNC, workers=1, exists=lambda k: False)
    async with running(controller):
        controller.queue.add(key("gone"))
        await eventually(lambda: reconciler.forgotten == [key("gone")])
    assert reconciler.calls == []


# ---------------------------------------------------------------------------- leadership


async def test_workers_wait_for_the_lease_and_a_lost_lease_stops_rescheduling(
        reconciler: FakeReconciler) -> None:
    leading = asyncio.Event()

    async def may_work() -> None:
        await leading.wait()

    controller = Controller(reconciler, sync_period=SYNC, workers=2, may_work=may_work)
    async with running(controller):
        controller.enqueue_all([key("a"), key("b")])
        for _ in range(50):  # loop turns enough for a worker to reach the reconciler if it may
            await asyncio.sleep(0)
        assert reconciler.calls == []
        leading.set()
        await eventually(lambda: len(reconciler.calls) == 2)

    def lost() -> None:
        raise NotLeader("gone")

    reconciler.behaviour["c"] = lost
    assert await controller.process_one(key("c")) is None
    assert key("c") not in controller.schedule._due


def test_a_new_leadership_forgets_memory_and_syncs_everything(
        reconciler: FakeReconciler) -> None:
    controller = Controller(reconciler, sync_period=SYNC)
    controller.reset([key("a"), key("b")])
    assert reconciler.resets == 1
    assert len(controller.queue) == 2


def test_at_least_one_worker() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Controller(FakeReconciler(), sync_period=SYNC, workers=0)


def test_wall_clock_is_utc() -> None:
    controller = Controller(FakeReconciler(), sync_period=SYNC)
    assert controller._wall_clock().tzinfo is UTC
