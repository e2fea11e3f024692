"""Conflicting writers: replicas changed between two syncs by someone else raise an event, then
a ScalingConflict condition that clears after a quiet window; our own writes never count."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from autoscaler.decision.conflicts import (
    CONFLICT_WINDOW,
    conflict_conditions,
    observe_replicas,
)
from autoscaler.decision.pause import PAUSED
from autoscaler.decision.snapshot import decide_snapshot, parse_snapshot, render_decision
from autoscaler.model.history import History, ScaleWatch, parse_history, render_history
from autoscaler.model.status import Condition
from tests.autoscaler.test_reconciler import KEY, NS, T0, World, at


def _reasons(world: World) -> list[str]:
    return [e.reason for e in world.kube.events]


def _external(world: World, replicas: int) -> None:
    world.kube.scales[(NS, "web")]["spec"]["replicas"] = replicas


# ------------------------------------------------------------------------------ the pure rule

MINUTE = timedelta(minutes=1)


@pytest.mark.parametrize(("case", "watch", "observed", "now", "reasons", "changes",
                          "conflicting"), [
    ("the first sync has nothing to compare with",
     None, 5, T0, [], (), False),
    ("the size we left: nothing to report",
     ScaleWatch(replicas=5), 5, T0, [], (), False),
    ("one change: an event, no conflict yet",
     ScaleWatch(replicas=3), 5, T0, ["ExternalScaleChange"], (T0,), False),
    ("a second change within the window: a conflict",
     ScaleWatch(replicas=3, external_changes=(T0,)), 5, T0 + 9 * MINUTE,
     ["ExternalScaleChange"], (T0, T0 + 9 * MINUTE), True),
    ("a second change a whole window later: no conflict",
     ScaleWatch(replicas=3, external_changes=(T0,)), 5, T0 + CONFLICT_WINDOW,
     ["ExternalScaleChange"], (T0 + CONFLICT_WINDOW,), False),
    ("a conflict holds while a change is within the window",
     ScaleWatch(replicas=3, external_changes=(T0, T0), conflicting=True), 3,
     T0 + CONFLICT_WINDOW / 2, [], (T0, T0), True),
    ("a conflict clears with an event after a quiet window",
     ScaleWatch(replicas=3, external_changes=(T0, T0), conflicting=True), 3,
     T0 + CONFLICT_WINDOW, ["ScalingConflictResolved"], (), False),
    ("a change during a conflict keeps it",
     ScaleWatch(replicas=3, external_changes=(T0,), conflicting=True), 4,
     T0 + CONFLICT_WINDOW, ["ExternalScaleChange"], (T0 + CONFLICT_WINDOW,), True),
])
def test_observe_replicas(case: str, watch: ScaleWatch | None, observed: int, now: datetime,
                          reasons: list[str], changes: tuple[datetime, ...],
                          conflicting: bool) -> None:
    seen = observe_replicas(watch, observed=observed, now=now)
    assert [e.reason for e in seen.events] == reasons, case
    assert seen.watch == ScaleWatch(replicas=observed, external_changes=changes,
                                    conflicting=conflicting), case


def test_an_external_change_event_names_both_sizes() -> None:
    seen = observe_replicas(ScaleWatch(replicas=3), observed=5, now=T0)
    assert seen.changed_from == 3
    assert seen.events[0].type == "Warning"
    assert "from 3 to 5" in seen.events[0].message
    assert "did not write" in seen.events[0].message


def test_the_condition_keeps_its_transition_time_and_is_absent_without_a_conflict() -> None:
    able = Condition("AbleToScale", "True", "ReadyForNewScale", "", T0)
    assert conflict_conditions((able,), conflicting=False, now=T0) == (able,)
    raised = conflict_conditions((able,), conflicting=True, now=T0)
    assert [(c.type, c.status, c.reason) for c in raised] == [
        ("AbleToScale", "True", "ReadyForNewScale"),
        ("ScalingConflict", "True", "ExternalScaleChanges")]
    assert "Conflicting writers" in raised[1].message
    later = conflict_conditions(raised, conflicting=True, now=T0 + timedelta(minutes=1))
    assert later == raised
    assert conflict_conditions(raised, conflicting=False, now=T0) == (able,)


def test_the_scale_watch_round_trips_through_the_history() -> None:
    for watch in (ScaleWatch(replicas=0),
                  ScaleWatch(replicas=4, external_changes=(T0, T0 + MINUTE), conflicting=True)):
        rendered = render_history(History(scale_watch=watch))
        assert parse_history(rendered).scale_watch == watch
    assert render_history(History(scale_watch=ScaleWatch(replicas=3)))["scaleWatch"] == {
        "replicas": 3}


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


async def test_a_new_leader_continues_from_the_persisted_scale_watch() -> None:
    world = World(replicas=2, qps="10")
    await world.reconciler.reconcile_once(KEY, at(0))
    assert world.status()["history"]["scaleWatch"] == {"replicas": 2}
    world.reconciler.reset()
    _external(world, 4)
    await world.reconciler.reconcile_once(KEY, at(15))
    assert "ExternalScaleChange" in _reasons(world)


# ------------------------------------------------------------------------------ the decision


def _snapshot(*, replicas: int, watch: dict[str, object] | None) -> dict[str, object]:
    history: dict[str, object] = {"recommendations": [
        {"timestamp": "2026-01-01T00:00:00Z", "replicas": 3}]}
    if watch is not None:
        history["scaleWatch"] = watch
    return {
        "now": "2026-01-01T00:05:00Z",
        "autoscaler": {"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
                       "metadata": {"name": "web", "namespace": NS},
                       "spec": {"scaleTargetRef": {"apiVersion": "apps/v1",
                                                   "kind": "Deployment", "name": "web"},
                                "minReplicas": 1, "maxReplicas": 10,
                                "metrics": [{"type": "External", "external": {
                                    "metric": {"name": "queue"},
                                    "target": {"type": "AverageValue",
                                               "averageValue": "10"}}}]}},
        "scale": {"spec": {"replicas": replicas},
                  "status": {"replicas": replicas, "selector": "app=web"}},
        "metrics": [{"kind": "ExternalMetricValueList",
                     "apiVersion": "external.metrics.k8s.io/v1beta1",
                     "items": [{"metricName": "queue", "timestamp": "2026-01-01T00:05:00Z",
                                "value": str(10 * replicas)}]}],
        "history": history,
    }


def test_explain_reports_an_external_change_from_the_snapshots_scale_watch() -> None:
    decision = decide_snapshot(parse_snapshot(_snapshot(replicas=5, watch={"replicas": 3})))
    assert [e.reason for e in decision.events] == ["ExternalScaleChange"]
    assert any("changed from 3 to 5, and this autoscaler did not write them" in line
               for line in decision.explanation)
    assert "ScalingConflict" not in {c.type for c in decision.status.conditions}
    watch = decision.history.scale_watch
    assert watch is not None and watch.replicas == 5 and len(watch.external_changes) == 1
    assert render_decision(decision)["history"]["scaleWatch"]["replicas"] == 5


def test_explain_raises_the_conflict_on_a_second_change_within_the_window() -> None:
    decision = decide_snapshot(parse_snapshot(_snapshot(
        replicas=5, watch={"replicas": 3, "externalChanges": ["2026-01-01T00:01:00Z"]})))
    conflict = {c.type: c for c in decision.status.conditions}["ScalingConflict"]
    assert (conflict.status, conflict.reason) == ("True", "ExternalScaleChanges")
    assert any(line.startswith("ScalingConflict:") for line in decision.explanation)


def test_the_decision_keeps_the_size_it_leaves_and_the_size_it_writes() -> None:
    kept = decide_snapshot(parse_snapshot(_snapshot(replicas=3, watch={"replicas": 3})))
    assert kept.events == () and kept.history.scale_watch == ScaleWatch(replicas=3)
    # 60 messages at 10 a replica: 6 replicas, written; the watch says 6.
    document = _snapshot(replicas=3, watch={"replicas": 3})
    document["metrics"][0]["items"][0]["value"] = "60"  # type: ignore[index]
    written = decide_snapshot(parse_snapshot(document))
    assert written.rescale and written.history.scale_watch == ScaleWatch(
        replicas=written.new_replicas)


def test_a_snapshot_without_a_scale_watch_starts_watching() -> None:
    decision = decide_snapshot(parse_snapshot(_snapshot(replicas=4, watch=None)))
    assert decision.events == ()
    assert decision.history.scale_watch == ScaleWatch(replicas=4)
