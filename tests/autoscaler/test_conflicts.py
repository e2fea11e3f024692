"""Conflicting writers: replicas changed between two syncs by someone else raise an event, then
a ScalingConflict condition that clears after a quiet window; our own writes never count."""

from __future__ import annotations

from datetime import timedelta

from autoscaler.decision.conflicts import (
    CONFLICT_WINDOW,
    ConflictMemory,
    apply_conflict_condition,
    observe_replicas,
)
from autoscaler.decision.pause import PAUSED
from autoscaler.model.status import Condition
from tests.autoscaler.test_reconciler import KEY, NS, T0, World, at


def _reasons(world: World) -> list[str]:
    return [e.reason for e in world.kube.events]


def _external(world: World, replicas: int) -> None:
    world.kube.scales[(NS, "web")]["spec"]["replicas"] = replicas


# ------------------------------------------------------------------------------ the pure rule


def test_the_first_sync_has_nothing_to_compare_with() -> None:
    seen = observe_replicas(ConflictMemory(), observed=5, now=T0)
    assert seen.events == () and not seen.memory.conflicting


def test_one_change_is_an_event_naming_both_sizes_two_within_the_window_a_conflict() -> None:
    first = observe_replicas(ConflictMemory(expected_replicas=3), observed=5, now=T0)
    assert [e.reason for e in first.events] == ["ExternalScaleChange"]
    assert "from 3 to 5" in first.events[0].message
    assert "did not write" in first.events[0].message
    assert not first.memory.conflicting
    second = observe_replicas(replace_expected(first.memory, 3), observed=5,
                              now=T0 + timedelta(minutes=9))
    assert second.memory.conflicting


def test_two_changes_further_apart_than_the_window_are_no_conflict() -> None:
    first = observe_replicas(ConflictMemory(expected_replicas=3), observed=5, now=T0)
    second = observe_replicas(replace_expected(first.memory, 3), observed=5,
                              now=T0 + CONFLICT_WINDOW)
    assert not second.memory.conflicting


def test_the_conflict_clears_with_an_event_after_a_quiet_window() -> None:
    memory = ConflictMemory(expected_replicas=3, changes=(T0, T0), conflicting=True)
    still = observe_replicas(memory, observed=3, now=T0 + CONFLICT_WINDOW / 2)
    assert still.memory.conflicting and still.events == ()
    cleared = observe_replicas(memory, observed=3, now=T0 + CONFLICT_WINDOW)
    assert not cleared.memory.conflicting
    assert [e.reason for e in cleared.events] == ["ScalingConflictResolved"]


def test_the_condition_keeps_its_transition_time_and_is_absent_without_a_conflict() -> None:
    able = Condition("AbleToScale", "True", "ReadyForNewScale", "", T0)
    assert apply_conflict_condition((able,), previous=(), conflicting=False, now=T0) == (able,)
    raised = apply_conflict_condition((able,), previous=(), conflicting=True, now=T0)
    assert [(c.type, c.status, c.reason) for c in raised] == [
        ("AbleToScale", "True", "ReadyForNewScale"),
        ("ScalingConflict", "True", "ExternalScaleChanges")]
    assert "Conflicting writers" in raised[1].message
    later = apply_conflict_condition((able,), previous=raised, conflicting=True,
                                     now=T0 + timedelta(minutes=1))
    assert later == raised


def replace_expected(memory: ConflictMemory, replicas: int) -> ConflictMemory:
    return ConflictMemory(expected_replicas=replicas, changes=memory.changes,
                          conflicting=memory.conflicting)


# ------------------------------------------------------------------------------ the reconciler


def _external_changes(world: World) -> float:
    return world.registry.get_sample_value(
        "metricscale_autoscaler_external_scale_changes_total",
        {"namespace": NS, "autoscaler": "web"}) or 0


async def test_a_change_behind_our_back_is_an_event_twice_a_condition_then_it_clears() -> None:
    world = World(replicas=2, qps="10")
    await world.reconciler.reconcile_once(KEY, at(0))
    _external(world, 2)  # no change at all: nothing to report
    await world.reconciler.reconcile_once(KEY, at(15))
    assert world.kube.events == []
    _external(world, 4)
    await world.reconciler.reconcile_once(KEY, at(30))  # kept: the scale-down is stabilized
    assert "ExternalScaleChange" in _reasons(world)
    assert "ScalingConflict" not in world.conditions()
    assert _external_changes(world) == 1
    _external(world, 6)
    await world.reconciler.reconcile_once(KEY, at(60))
    assert world.conditions()["ScalingConflict"] == ("True", "ExternalScaleChanges")
    assert _external_changes(world) == 2
    world.kube.events.clear()
    quiet = 60 + CONFLICT_WINDOW.total_seconds()
    await world.reconciler.reconcile_once(KEY, at(quiet - 1))
    assert "ScalingConflict" in world.conditions()
    await world.reconciler.reconcile_once(KEY, at(quiet))
    assert "ScalingConflict" not in world.conditions()
    assert "ScalingConflictResolved" in _reasons(world)


async def test_our_own_scale_writes_never_count_as_external() -> None:
    world = World(replicas=2, qps="10")
    for step, load in enumerate(["10", "40", "40", "5", "5", "40"]):
        world.load(load)
        await world.reconciler.reconcile_once(KEY, at(400 * step))
    assert world.kube.scale_writes  # we did write
    assert "ExternalScaleChange" not in _reasons(world)
    assert "ScalingConflict" not in world.conditions()


async def test_a_dry_run_writes_nothing_so_a_change_there_is_still_external() -> None:
    world = World(replicas=2, qps="40", dry_run=True)
    await world.reconciler.reconcile_once(KEY, at(0))
    await world.reconciler.reconcile_once(KEY, at(15))
    assert world.kube.scale_writes == [] and "ExternalScaleChange" not in _reasons(world)
    _external(world, 3)
    await world.reconciler.reconcile_once(KEY, at(30))
    assert "ExternalScaleChange" in _reasons(world)


async def test_a_paused_autoscaler_still_reports_an_external_change() -> None:
    world = World(replicas=2, qps="40", annotations={PAUSED: "true"})
    await world.reconciler.reconcile_once(KEY, at(0))
    _external(world, 3)
    await world.reconciler.reconcile_once(KEY, at(15))
    assert world.kube.scale_writes == []
    assert "ExternalScaleChange" in _reasons(world)


async def test_a_new_leader_starts_fresh() -> None:
    world = World(replicas=2, qps="10")
    await world.reconciler.reconcile_once(KEY, at(0))
    world.reconciler.reset()
    _external(world, 4)
    await world.reconciler.reconcile_once(KEY, at(15))
    assert "ExternalScaleChange" not in _reasons(world)
