"""Fallback (KEP-5679's fields on every metric type, KEDA's behaviors): after failureThreshold
failed reads in a row (or failureDurationSeconds), a metric proposes its fallback size, which
joins the maximum over metrics and then the usual stabilization and limits; the count lives in
status.history; a Fallback condition and events say so; without a fallback nothing changes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.model.history import parse_history, render_history
from tests.autoscaler import builders as b
from tests.autoscaler.reconcile_support import scenario

DOWN = {"error": "unable to fetch metrics from external metrics API: the server is currently "
                 "unable to handle the request"}


def external(fallback: dict[str, Any] | None = None) -> dict[str, Any]:
    source: dict[str, Any] = {"metric": {"name": "queue_depth"},
                              "target": {"type": "AverageValue", "averageValue": "30"}}
    if fallback is not None:
        source["fallback"] = fallback
    return {"type": "External", "external": source}


def failures(count: int, *, ago: float = 30.0) -> dict[str, Any]:
    return {"recommendations": [], "scaleUpEvents": [], "scaleDownEvents": [],
            "metricFailures": [{"metric": 0, "failures": count, "since": b.ago(ago)}]}


def run(fallback: dict[str, Any] | None, *, history: dict[str, Any] | None = None,
        inputs: list[Any] | None = None, current: int = 3, **extra: Any) -> Any:
    return scenario(min_replicas=2, max_replicas=6, spec_replicas=current,
                    metrics=[external(fallback)], metric_inputs=inputs or [DOWN],
                    history=history or {"recommendations": []}, **extra)


def condition(decision: Any, kind: str = "Fallback") -> tuple[str, str, str] | None:
    return next(((c.status, c.reason, c.message) for c in decision.status.conditions
                 if c.type == kind), None)


def test_without_a_fallback_a_failing_metric_blocks_as_upstream() -> None:
    decision = run(None)
    assert not decision.rescale
    assert condition(decision) is None
    assert decision.history.metric_failures == ()
    assert "metricFailures" not in render_history(decision.history)


def test_the_first_failures_count_and_do_not_fall_back_yet() -> None:
    decision = run({"replicas": 5, "failureThreshold": 2})
    assert not decision.rescale and condition(decision) is None
    [failure] = decision.history.metric_failures
    assert (failure.metric, failure.failures) == (0, 1)
    assert failure.since == b.NOW


def test_at_the_threshold_the_metric_proposes_its_fallback() -> None:
    decision = run({"replicas": 5, "failureThreshold": 2}, history=failures(1))
    assert decision.rescale and decision.new_replicas == 5
    assert condition(decision) == (
        "True", "FallbackActive",
        "metric 0 failed 2 or more reads in a row and proposes 5 replicas (fallback static)")
    assert ("Warning", "FallbackActive",
            "metric 0 failed 2 reads in a row and proposes 5 replicas (fallback static)") in [
        tuple(e) for e in decision.events]
    active = condition(decision, "ScalingActive")
    assert active is not None and active[:2] == ("True", "ValidMetricFound")
    assert active[2].endswith("(fallback)")
    assert decision.history.metric_failures[0].failures == 2
    assert decision.metrics[0].reason == "Fallback"


def test_a_failure_lasting_long_enough_falls_back_before_the_count() -> None:
    decision = run({"replicas": 5, "failureThreshold": 10, "failureDurationSeconds": 60},
                   history=failures(1, ago=61))
    assert decision.rescale and decision.new_replicas == 5
    assert condition(decision) == (
        "True", "FallbackActive", "metric 0 failed every read for 60 s or more and proposes "
                                  "5 replicas (fallback static)")


def test_the_condition_says_the_same_for_as_long_as_the_outage_lasts() -> None:
    """Its message names the threshold reached (or the time failed for), never the running
    count: a message that changed at every sync would rewrite the status at every sync. The
    count goes on in the history, and the explanation says it."""
    fallback = {"replicas": 5, "failureThreshold": 3}
    was = [{"type": "Fallback", "status": "True", "reason": "FallbackActive", "message": "x",
            "lastTransitionTime": b.ago(600)}]
    messages = set()
    for count in (2, 3, 17, 39):  # the 3rd, 4th, 18th and 40th failed read
        decision = run(fallback, history=failures(count, ago=600), current=5,
                       initial_conditions=was)
        messages.add(condition(decision))
        assert decision.history.metric_failures[0].failures == count + 1
        assert any(f"failed {count + 1} reads in a row, since {b.ago(600)}" in line
                   for line in decision.explanation), decision.explanation
    assert messages == {("True", "FallbackActive", "metric 0 failed 3 or more reads in a row "
                                                   "and proposes 5 replicas (fallback static)")}


def test_one_read_and_one_replica_are_said_in_the_singular() -> None:
    decision = scenario(min_replicas=1, max_replicas=6, spec_replicas=2,
                        metrics=[external({"replicas": 1, "failureThreshold": 1})],
                        metric_inputs=[DOWN], history={"recommendations": []})
    assert condition(decision) == (
        "True", "FallbackActive",
        "metric 0 failed 1 or more reads in a row and proposes 1 replica (fallback static)")
    assert ("Warning", "FallbackActive",
            "metric 0 failed 1 read in a row and proposes 1 replica (fallback static)") in [
        tuple(e) for e in decision.events]


@pytest.mark.parametrize(("behavior", "current", "expected"), [
    ("static", 3, 5), ("currentReplicas", 4, 4), ("currentReplicasIfHigher", 4, 5),
    ("currentReplicasIfHigher", 6, 6), ("currentReplicasIfLower", 4, 4),
    ("currentReplicasIfLower", 2, 2)])
def test_kedas_behaviors(behavior: str, current: int, expected: int) -> None:
    decision = run({"replicas": 5, "failureThreshold": 1, "behavior": behavior},
                   current=current)
    assert decision.desired_replicas == expected


def test_the_fallback_is_limited_like_any_proposal() -> None:
    decision = run({"replicas": 50, "failureThreshold": 1})
    assert decision.new_replicas == 6  # maxReplicas
    assert condition(decision, "ScalingLimited")[:2] == ("True", "TooManyReplicas")  # type: ignore[index]


def test_reading_again_ends_the_fallback_and_resets_the_count() -> None:
    was = [{"type": "Fallback", "status": "True", "reason": "FallbackActive", "message": "x",
            "lastTransitionTime": b.ago(60)}]
    decision = run({"replicas": 5, "failureThreshold": 2}, history=failures(4),
                   inputs=[b.external_metrics([90])], initial_conditions=was)
    assert condition(decision) is None
    assert decision.history.metric_failures == ()
    assert ("Normal", "FallbackEnded") in [(e.type, e.reason) for e in decision.events]


def test_a_resource_metric_falls_back_too() -> None:
    metric = {"type": "Resource", "resource": {"name": "cpu", "target": {
        "type": "Utilization", "averageUtilization": 50}, "fallback": {"replicas": 4,
                                                                       "failureThreshold": 1}}}
    decision = scenario(min_replicas=2, max_replicas=6, spec_replicas=3, metrics=[metric],
                        metric_inputs=[DOWN], history={"recommendations": []})
    assert decision.rescale and decision.new_replicas == 4


def test_a_healthy_metric_and_a_fallback_take_the_maximum() -> None:
    metrics = [external({"replicas": 4, "failureThreshold": 1}),
               {"type": "External", "external": {"metric": {"name": "other"}, "target": {
                   "type": "AverageValue", "averageValue": "10"}}}]
    decision = scenario(min_replicas=2, max_replicas=8, spec_replicas=3, metrics=metrics,
                        metric_inputs=[DOWN, b.external_metrics([60000], metric="other")],
                        history={"recommendations": []})
    assert decision.new_replicas == 6  # the healthy metric's 6 beats the fallback's 4


@settings(max_examples=120, deadline=None)
@given(replicas=st.integers(0, 1000), current=st.integers(0, 10),
       behavior=st.sampled_from(["static", "currentReplicas", "currentReplicasIfHigher",
                                 "currentReplicasIfLower"]))
def test_a_fallback_never_leaves_min_and_max(replicas: int, current: int, behavior: str) -> None:
    """Within [minReplicas, maxReplicas] (2 to 6), unless upstream's own rules put the target
    outside without a fallback: a target at 0 that the autoscaler did not scale to zero stays
    there (scaling disabled)."""
    decision = run({"replicas": replicas, "failureThreshold": 1, "behavior": behavior},
                   current=current)
    upstream = run(None, current=current)
    assert 2 <= decision.desired_replicas <= 6 or \
        decision.desired_replicas == upstream.desired_replicas
    if current == 0:
        assert decision.desired_replicas == 0 and not decision.rescale


def test_the_history_round_trips_with_its_failures() -> None:
    decision = run({"replicas": 5, "failureThreshold": 3})
    rendered = render_history(decision.history)
    assert [(f["metric"], f["failures"]) for f in rendered["metricFailures"]] == [(0, 1)]
    assert parse_history(rendered).metric_failures == decision.history.metric_failures
    assert decision.history.metric_failures[0].since - b.NOW == timedelta(0)
