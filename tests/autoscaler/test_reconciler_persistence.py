"""autoscaler.decision.persistence: the compact persisted history, when it must be rewritten, how a
new leader reads it back, dry run, and the REFERENCE/TARGETS columns."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.decision import behavior as rules
from autoscaler.decision.persistence import (
    DRY_RUN_ANNOTATION,
    HISTORY_ANNOTATION,
    compact_history,
    format_reference,
    format_targets,
    history_from_annotations,
    history_from_status,
    history_horizon,
    is_dry_run,
    needs_persisting,
    render_history_annotation,
    render_persisted_history,
    restore_history,
)
from autoscaler.decision.settings import Settings
from autoscaler.model.fields import ModelError
from autoscaler.model.history import (
    History,
    MetricFailure,
    Recommendation,
    ScaleEvent,
    parse_history,
)
from autoscaler.model.objects import Autoscaler, parse_autoscaler
from autoscaler.model.spec import AutoscalerSpec

T0 = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=5)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def recs(*pairs: tuple[float, int]) -> History:
    return History(recommendations=tuple(Recommendation(at(s), r) for s, r in pairs))


# ------------------------------------------------------------------------------- compaction


def test_compaction_keeps_the_newest_recommendation_per_value_within_the_horizon() -> None:
    history = recs((0, 5), (15, 5), (30, 6), (45, 5), (-400, 9))
    compact = compact_history(history, now=at(60), horizon=WINDOW)
    assert compact.recommendations == (Recommendation(at(30), 6), Recommendation(at(45), 5))


def test_compaction_of_a_first_sync_history_is_a_first_sync_history() -> None:
    assert compact_history(History(), now=T0, horizon=WINDOW) == History()


def test_horizon_is_the_longest_window_of_the_autoscaler_capped_at_an_hour() -> None:
    def spec(behavior: dict[str, object] | None) -> AutoscalerSpec:
        raw = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
               "metadata": {"name": "a", "namespace": "n"},
               "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "d"},
                        "maxReplicas": 3, **({"behavior": behavior} if behavior else {})}}
        return parse_autoscaler(raw).spec

    defaults = Settings()
    assert history_horizon(spec(None), defaults) == WINDOW
    assert history_horizon(spec({"scaleUp": {"stabilizationWindowSeconds": 900}}),
                           defaults) == timedelta(seconds=900)
    assert history_horizon(spec(None), Settings(
        downscale_stabilization_window=timedelta(hours=3))) == timedelta(hours=1)


# ------------------------------------------------------------------------ when to write it


def test_a_first_history_is_written() -> None:
    assert needs_persisting(None, recs((0, 3)), now=at(0), horizon=WINDOW)


def test_nothing_to_write_before_the_first_sync() -> None:
    assert not needs_persisting(None, History(), now=at(0), horizon=WINDOW)


def test_the_same_recommendation_again_needs_no_write() -> None:
    persisted = recs((0, 3))
    current = recs((0, 3), (15, 3), (30, 3))
    assert not needs_persisting(persisted, current, now=at(30), horizon=WINDOW)


def test_a_new_recommendation_value_is_written() -> None:
    persisted = recs((0, 3))
    assert needs_persisting(persisted, recs((0, 3), (15, 4)), now=at(15), horizon=WINDOW)


def test_returning_to_an_older_value_is_written() -> None:
    persisted = recs((0, 3), (15, 4))
    assert needs_persisting(persisted, recs((0, 3), (15, 4), (30, 3)), now=at(30),
                            horizon=WINDOW)


def test_values_aging_out_of_the_window_need_no_write() -> None:
    persisted = recs((0, 7), (15, 3))
    current = recs((15, 3), (400, 3))
    assert not needs_persisting(persisted, current, now=at(400), horizon=WINDOW)


def test_a_new_scale_event_is_written() -> None:
    persisted = recs((0, 3))
    current = History(recommendations=persisted.recommendations,
                      scale_up_events=(ScaleEvent(at(1), 2),))
    assert needs_persisting(persisted, current, now=at(1), horizon=WINDOW)


def _fallback_spec(**fallback: int) -> AutoscalerSpec:
    metric = {"type": "External", "external": {
        "metric": {"name": "q"}, "target": {"type": "AverageValue", "averageValue": "1"},
        "fallback": {"replicas": 5, **fallback}}}
    return parse_autoscaler({
        "apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
        "metadata": {"name": "a", "namespace": "n"},
        "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "d"}, "maxReplicas": 9,
                 "metrics": [metric]}}).spec


def failing(count: int, *, since: float = 0) -> History:
    return recs((0, 5))._replace(metric_failures=(MetricFailure(0, count, at(since)),))


@pytest.mark.parametrize(("persisted", "current", "fallback", "now", "written"), [
    (1, 2, {"failureThreshold": 3}, 30, True),    # below the threshold: each read counts
    (2, 3, {"failureThreshold": 3}, 45, True),    # reaching it changes the decision
    (3, 4, {"failureThreshold": 3}, 60, False),   # past it, more failures decide nothing new
    (3, 40, {"failureThreshold": 3}, 600, False),
    (1, 2, {"failureThreshold": 9, "failureDurationSeconds": 60}, 30, True),
    (1, 5, {"failureThreshold": 9, "failureDurationSeconds": 60}, 60, False),  # timed out
])
def test_failed_reads_are_written_until_more_of_them_decide_nothing_new(
        persisted: int, current: int, fallback: dict[str, int], now: float,
        written: bool) -> None:
    spec = _fallback_spec(**fallback)
    assert needs_persisting(failing(persisted), failing(current), now=at(now), horizon=WINDOW,
                            spec=spec) is written
    # without the spec (or for another outage) the counts are compared exactly
    assert needs_persisting(failing(persisted), failing(current), now=at(now), horizon=WINDOW)
    assert needs_persisting(failing(persisted), failing(current, since=15), now=at(now),
                            horizon=WINDOW, spec=spec)


def test_a_failure_that_starts_or_ends_is_written() -> None:
    spec = _fallback_spec(failureThreshold=1)
    assert needs_persisting(recs((0, 5)), failing(1), now=at(0), horizon=WINDOW, spec=spec)
    assert needs_persisting(failing(7), recs((0, 5)), now=at(0), horizon=WINDOW, spec=spec)


# ---------------------------------------------------------------------------- reading back


def test_without_a_persisted_history_the_new_leader_starts_as_upstream_does() -> None:
    assert restore_history(None, now=at(0)) == History()
    assert restore_history(History(recommendations=()), now=at(0)).recommendations is None


def test_of_recommendations_made_at_one_instant_the_later_one_is_the_last() -> None:
    """A first sync records the current size, then the recommendation, both at `now`."""
    first_sync = recs((0, 2), (0, 6))
    assert compact_history(first_sync, now=at(0), horizon=WINDOW) == first_sync
    assert not needs_persisting(first_sync, recs((0, 2), (0, 6), (15, 6)), now=at(15),
                                horizon=WINDOW)
    restored = restore_history(first_sync, now=at(30))
    assert restored.recommendations is not None
    assert restored.recommendations[-1] == Recommendation(at(30), 6)


def test_the_last_persisted_recommendation_counts_as_made_at_takeover() -> None:
    events = (ScaleEvent(at(5), 1),)
    persisted = History(recommendations=(Recommendation(at(0), 6), Recommendation(at(20), 4)),
                        scale_down_events=events)
    restored = restore_history(persisted, now=at(100))
    assert restored.recommendations == (Recommendation(at(0), 6), Recommendation(at(20), 4),
                                        Recommendation(at(100), 4))
    assert restored.scale_down_events == events


# Load comes in runs: a size recommended for a while, then another.
RUNS = st.lists(st.tuples(st.integers(min_value=1, max_value=8),
                          st.integers(min_value=1, max_value=12)), min_size=2, max_size=8)


@settings(max_examples=300, deadline=None)
@given(runs=RUNS, failover=st.integers(min_value=1, max_value=95),
       takeover_delay=st.integers(min_value=0, max_value=4))
def test_a_new_leader_never_scales_down_sooner_than_the_old_one_would_have(
        runs: list[tuple[int, int]], failover: int, takeover_delay: int) -> None:
    """Run one controller through a sequence of syncs (15 s apart), persisting as the
    reconciler does; at `failover` a second controller reads the history back (a few syncs
    later) and both see the same metrics from then on: the second's stabilized size is never
    below the first's, so it never scales down earlier."""
    desired = [value for value, length in runs for _ in range(length)]
    sync = 15
    failover = min(failover, len(desired) - 1)
    window = timedelta(seconds=120)
    memory = History(recommendations=None)
    persisted: History | None = None
    for step, value in enumerate(desired[:failover]):
        now = at(step * sync)
        memory = History(rules.record_initial_recommendation(memory.recommendations,
                                                             current_replicas=value, now=now))
        memory = History(rules.stabilize_recommendation(memory.recommendations or (),
                                                        desired=value, window=window,
                                                        now=now).recommendations)
        if needs_persisting(persisted, memory, now=now, horizon=window):
            persisted = parse_history(render_persisted_history(memory, now=now, horizon=window))
    old_leader = memory
    new_leader: History | None = None
    for step in range(failover + takeover_delay, len(desired)):
        now = at(step * sync)
        if new_leader is None:
            new_leader = restore_history(persisted, now=now)
            new_leader = History(rules.record_initial_recommendation(
                new_leader.recommendations, current_replicas=desired[step], now=now))
        old = rules.stabilize_recommendation(old_leader.recommendations or (),
                                             desired=desired[step], window=window, now=now)
        new = rules.stabilize_recommendation(new_leader.recommendations or (),
                                             desired=desired[step], window=window, now=now)
        assert new.replicas >= old.replicas
        old_leader = History(old.recommendations)
        new_leader = History(new.recommendations)


@settings(max_examples=300, deadline=None)
@given(runs=RUNS, failover=st.integers(min_value=1, max_value=95),
       takeover_delay=st.integers(min_value=0, max_value=4),
       up_window=st.sampled_from([0, 30, 60]), down_window=st.sampled_from([0, 60, 120]))
def test_with_behavior_a_new_leader_moves_no_sooner_in_either_direction(
        runs: list[tuple[int, int]], failover: int, takeover_delay: int, up_window: int,
        down_window: int) -> None:
    desired = [value for value, length in runs for _ in range(length)]
    sync = 15
    failover = min(failover, len(desired) - 1)
    horizon = timedelta(seconds=max(up_window, down_window))

    def stabilize(history: History, step: int) -> rules.Stabilized:
        return rules.stabilize_recommendation_with_behaviors(
            history.recommendations or (), desired=desired[step],
            current=desired[step - 1] if step else desired[0],
            up_window_seconds=up_window, down_window_seconds=down_window, now=at(step * sync))

    memory = History()
    persisted: History | None = None
    for step in range(failover):
        now = at(step * sync)
        memory = History(rules.record_initial_recommendation(
            memory.recommendations, current_replicas=desired[step], now=now))
        memory = History(stabilize(memory, step).recommendations)
        if needs_persisting(persisted, memory, now=now, horizon=horizon):
            persisted = parse_history(render_persisted_history(memory, now=now, horizon=horizon))
    old_leader, new_leader = memory, None
    for step in range(failover + takeover_delay, len(desired)):
        if new_leader is None:
            new_leader = restore_history(persisted, now=at(step * sync))
        current = desired[step - 1]
        old, new = stabilize(old_leader, step), stabilize(new_leader, step)
        if new.replicas < current:
            assert new.replicas >= old.replicas
        if new.replicas > current:
            assert new.replicas <= old.replicas
        old_leader, new_leader = History(old.recommendations), History(new.recommendations)


# --------------------------------------------------------------------- status and annotation


def test_history_round_trips_through_the_status_and_the_annotation() -> None:
    history = History(recommendations=(Recommendation(at(0.5), 3),),
                      scale_up_events=(ScaleEvent(at(1), 2, outdated=True),))
    status = {"desiredReplicas": 3,
              "history": render_persisted_history(history, now=at(2), horizon=WINDOW)}
    assert history_from_status(status) == history
    annotation = render_history_annotation(history, now=at(2), horizon=WINDOW)
    assert json.loads(annotation)["recommendations"] == [
        {"timestamp": "2026-11-21T10:00:00.500000Z", "replicas": 3}]
    assert history_from_annotations({HISTORY_ANNOTATION: annotation}) == history


def test_absent_history_reads_as_none() -> None:
    assert history_from_status(None) is None
    assert history_from_status({"desiredReplicas": 1}) is None
    assert history_from_annotations({"other": "x"}) is None


def test_malformed_history_is_a_model_error_naming_the_field() -> None:
    with pytest.raises(ModelError, match=r"status\.history\.recommendations\[0\]\.timestamp"):
        history_from_status({"history": {"recommendations": [{"replicas": 1}]}})
    with pytest.raises(ModelError, match=r"metricscale\.dev/history"):
        history_from_annotations({HISTORY_ANNOTATION: "{not json"})


# ---------------------------------------------------------------------------------- dry run


@pytest.mark.parametrize(("annotations", "globally", "expected"), [
    (None, False, False), ({DRY_RUN_ANNOTATION: "true"}, False, True),
    ({DRY_RUN_ANNOTATION: "True"}, False, True), ({DRY_RUN_ANNOTATION: "false"}, False, False),
    ({}, True, True), ({DRY_RUN_ANNOTATION: "false"}, True, True)])
def test_dry_run_is_the_global_flag_or_the_annotation(
        annotations: dict[str, str] | None, globally: bool, expected: bool) -> None:
    assert is_dry_run(annotations, globally=globally) is expected


# ------------------------------------------------------------------------------ the columns


def hpa(metrics: list[dict[str, object]], current: list[dict[str, object]]) -> Autoscaler:
    return parse_autoscaler({
        "apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
        "metadata": {"name": "a", "namespace": "n"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                    "name": "web"},
                 "maxReplicas": 3, "metrics": metrics},
        "status": {"desiredReplicas": 1, "currentMetrics": current}})


CPU = {"type": "Resource", "resource": {"name": "cpu", "target": {
    "type": "Utilization", "averageUtilization": 80}}}
CPU_NOW = {"type": "Resource", "resource": {"name": "cpu", "current": {
    "averageUtilization": 52, "averageValue": "520m"}}}
PODS = {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {
    "type": "AverageValue", "averageValue": "10000m"}}}
PODS_NOW = {"type": "Pods", "pods": {"metric": {"name": "qps"}, "current": {
    "averageValue": "12500m"}}}
EXTERNAL_AVG = {"type": "External", "external": {"metric": {"name": "queue"}, "target": {
    "type": "AverageValue", "averageValue": "30"}}}
OBJECT = {"type": "Object", "object": {
    "describedObject": {"kind": "Ingress", "name": "main"}, "metric": {"name": "rps"},
    "target": {"type": "Value", "value": "2k"}}}
MEMORY = {"type": "Resource", "resource": {"name": "memory", "target": {
    "type": "AverageValue", "averageValue": "1024Mi"}}}


@pytest.mark.parametrize(("metrics", "current", "expected"), [
    ([], [], "cpu: <unknown>/80%"),  # the API server's default metric
    ([CPU], [CPU_NOW], "cpu: 52%/80%"),
    ([CPU], [], "cpu: <unknown>/80%"),
    ([CPU], [{"type": ""}], "cpu: <unknown>/80%"),
    ([PODS], [PODS_NOW], "12500m/10"),
    ([EXTERNAL_AVG], [], "<unknown>/30 (avg)"),
    ([OBJECT], [], "<unknown>/2k"),
    ([MEMORY], [], "memory: <unknown>/1Gi"),
    ([CPU, PODS, OBJECT, MEMORY], [CPU_NOW, PODS_NOW],
     "cpu: 52%/80%, 12500m/10 + 2 more..."),
])
def test_targets_column_reads_as_kubectl_get_hpa(
        metrics: list[dict[str, object]], current: list[dict[str, object]],
        expected: str) -> None:
    autoscaler = hpa(metrics, current)
    assert format_targets(autoscaler.spec, autoscaler.status) == expected


def test_reference_column_is_kind_slash_name() -> None:
    assert format_reference(hpa([], []).spec) == "Deployment/web"
