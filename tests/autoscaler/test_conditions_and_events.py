"""Conditions, events and the status on every path, byte for byte as upstream writes them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from autoscaler.decision.conditions import remove_condition, set_condition
from autoscaler.decision.decide import (
    SCALE_WRITE_SUCCEEDED,
    ScaleWriteResult,
    complete,
    decide,
)
from autoscaler.decision.settings import Settings
from autoscaler.decision.snapshot import parse_snapshot
from autoscaler.model.status import Condition, MetricStatus, render_status
from tests.autoscaler import builders as b
from tests.autoscaler.reconcile_support import STATUS_OK, conditions, ok_with, scenario

T, F = "True", "False"
ONE = "1.0"
GOT_SCALE = ("AbleToScale", T, "SucceededGetScale")


def events(decision: Any) -> list[tuple[str, str, str]]:
    return [(e.type, e.reason, e.message) for e in decision.events]


def messages(decision: Any) -> dict[str, str]:
    return {c.type: c.message for c in decision.status.conditions}


# --------------------------------------------------------------------------------------------
# set_condition


def test_a_new_condition_is_appended_with_now_as_transition_time() -> None:
    result = set_condition((), type="AbleToScale", status=T, reason="R", message="m", now=b.NOW)
    assert result == (Condition("AbleToScale", T, "R", "m", b.NOW),)


def test_transition_time_moves_only_when_the_status_changes() -> None:
    before = b.NOW - timedelta(hours=1)
    existing = (Condition("AbleToScale", T, "Old", "old", before),
                Condition("ScalingActive", T, "ValidMetricFound", "x", before))
    same = set_condition(existing, type="AbleToScale", status=T, reason="New", message="new",
                         now=b.NOW)
    flipped = set_condition(existing, type="ScalingActive", status=F, reason="Bad", message="b",
                            now=b.NOW)
    assert same[0] == Condition("AbleToScale", T, "New", "new", before)
    assert flipped[1] == Condition("ScalingActive", F, "Bad", "b", b.NOW)
    assert [c.type for c in flipped] == ["AbleToScale", "ScalingActive"]  # order kept


def test_remove_condition_drops_every_condition_of_the_type() -> None:
    conds = (Condition("ScaledToZero", T), Condition("AbleToScale", T))
    assert remove_condition(conds, "ScaledToZero") == (Condition("AbleToScale", T),)


def test_existing_conditions_keep_their_place_and_transition_times() -> None:
    old_time = b.ago(3600)
    initial = [{"type": "ScalingLimited", "status": "False", "reason": "DesiredWithinRange",
                "message": "the desired count is within the acceptable range",
                "lastTransitionTime": old_time},
               {"type": "AbleToScale", "status": "False", "reason": "FailedGetScale",
                "message": "x", "lastTransitionTime": old_time}]
    decision = scenario(min_replicas=2, max_replicas=6, spec_replicas=3, cpu_target=30,
                        levels=(300, 500, 700), requests=[ONE] * 3, initial_conditions=initial)
    assert conditions(decision) == [("ScalingLimited", F, "DesiredWithinRange"),
                                    ("AbleToScale", T, "SucceededRescale"),
                                    ("ScalingActive", T, "ValidMetricFound")]
    times = {c.type: c.last_transition_time for c in decision.status.conditions}
    assert times["ScalingLimited"] == b.NOW - timedelta(hours=1)  # status unchanged
    assert times["AbleToScale"] == b.NOW  # False -> True
    assert times["ScalingActive"] == b.NOW  # new


# --------------------------------------------------------------------------------------------
# The normal path: every message


def test_a_scale_up_writes_upstreams_status_conditions_and_event() -> None:
    decision = scenario(min_replicas=2, max_replicas=6, spec_replicas=3, cpu_target=30,
                        levels=(300, 500, 700), requests=[ONE] * 3)
    assert messages(decision) == {
        "AbleToScale": "the HPA controller was able to update the target scale to 5",
        "ScalingActive": "the HPA was able to successfully calculate a replica count from cpu "
                         "resource utilization (percentage of request)",
        "ScalingLimited": "the desired count is within the acceptable range",
    }
    assert events(decision) == [
        ("Normal", "SuccessfulRescale",
         "New size: 5; reason: cpu resource utilization (percentage of request) above target")]
    status = render_status(decision.status)
    assert status["lastScaleTime"] == "2026-11-21T10:00:00Z"
    assert (status["currentReplicas"], status["desiredReplicas"]) == (3, 5)
    assert status["currentMetrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "current": {"averageValue": "500m", "averageUtilization": 50}}}]


@pytest.mark.parametrize(("metric", "name"), [
    (b.pods_metric("15.0"), "pods metric qps"),
    (b.object_value("15.0"), "Deployment metric qps"),
    (b.object_average("5.0"),
     "external metric qps(&LabelSelector{MatchLabels:map[string]string{},"
     "MatchExpressions:[]LabelSelectorRequirement{},})"),
    (b.external_value("6666m", selector={"matchLabels": {"label": "value"}}),
     "external metric qps(&LabelSelector{MatchLabels:map[string]string{label: value,},"
     "MatchExpressions:[]LabelSelectorRequirement{},})"),
    (b.external_average("2222m", selector={"matchExpressions": [
        {"key": "queue", "operator": "In", "values": ["a", "b"]}]}),
     "external metric qps(&LabelSelector{MatchLabels:map[string]string{},MatchExpressions:"
     "[]LabelSelectorRequirement{LabelSelectorRequirement{Key:queue,Operator:In,Values:[a b],},"
     "},})"),
    ({"type": "Resource", "resource": {"name": "cpu", "target": {
        "type": "AverageValue", "averageValue": "300m"}}}, "cpu resource"),
])
def test_metric_names_in_messages_are_upstreams(metric: dict[str, Any], name: str) -> None:
    decision = scenario(min_replicas=1, max_replicas=10, spec_replicas=3, metrics=[metric],
                        levels=(20000, 10000, 30000), requests=[ONE] * 3)
    assert decision.rescale
    assert messages(decision)["ScalingActive"] == \
        f"the HPA was able to successfully calculate a replica count from {name}"
    assert decision.events[-1].message.endswith(f"reason: {name} above target")


def test_memory_status_values_are_binary_si() -> None:
    metric = {"type": "Resource", "resource": {"name": "memory", "target": {
        "type": "Utilization", "averageUtilization": 50}}}
    pods = [b.pod(i, requests=("512Mi",), resource="memory") for i in range(2)]
    usage = b.pod_metrics([[300 * 2**20 * 1000]] * 2, resource="memory")
    # usage given in milli-bytes: rewrite as whole bytes for the wire
    for item in usage["items"]:
        item["containers"][0]["usage"]["memory"] = "300Mi"
    snap = parse_snapshot(b.snapshot(autoscaler=b.hpa(metrics=[metric], current=2),
                                     scale_object=b.scale(2), pods=pods, metrics=[usage]))
    decision = decide(autoscaler=snap.autoscaler, scale=snap.scale, pods=snap.pods,
                      metrics=snap.metrics, history=snap.history, now=snap.now,
                      settings=snap.settings)
    current = decision.status.current_metrics[0].resource
    assert current is not None and current.current.average_value is not None
    assert current.current.average_value.text == "300Mi"
    assert current.current.average_utilization == 58


# --------------------------------------------------------------------------------------------
# Failures


def test_failed_get_scale_sets_able_to_scale_false_and_keeps_the_rest() -> None:
    decision = scenario(min_replicas=1, max_replicas=100, spec_replicas=3, cpu_target=10,
                        scale_error="something went wrong")
    assert conditions(decision) == [("AbleToScale", F, "FailedGetScale")]
    assert messages(decision)["AbleToScale"] == \
        "the HPA controller was unable to get the target's current scale: something went wrong"
    assert events(decision) == [("Warning", "FailedGetScale", "something went wrong")]
    assert decision.status.desired_replicas == 3 and not decision.rescale
    assert decision.history.recommendations is None  # nothing recorded before the scale is read
    assert decision.error == ("failed to query scale subresource for "
                              "ReplicationController/test-namespace/test-rc: something went wrong")


def test_an_unparsable_target_api_version_fails_to_get_the_scale() -> None:
    raw = b.hpa(metrics=[b.cpu_utilization(50)])
    raw["spec"]["scaleTargetRef"]["apiVersion"] = "apps/v1/extra"
    snap = parse_snapshot(b.snapshot(autoscaler=raw, scale_object=b.scale(3)))
    decision = decide(autoscaler=snap.autoscaler, scale=snap.scale, pods=snap.pods,
                      metrics=snap.metrics, history=snap.history, now=snap.now,
                      settings=snap.settings)
    assert events(decision) == [("Warning", "FailedGetScale",
                                 "unexpected GroupVersion string: apps/v1/extra")]


@pytest.mark.parametrize(("selector", "event", "message"), [
    (None, ("Warning", "SelectorRequired", "selector is required"),
     "the HPA target's scale is missing a selector"),
    ("cheddar cheese", ("Warning", "InvalidSelector",
                        "couldn't convert selector into a corresponding internal selector object:"
                        " unable to parse requirement: found 'cheese', expected: in, notin, =, ==,"
                        " !=, gt, lt"), None),
])
def test_selector_problems_stop_scaling_with_invalid_selector(
        selector: str | None, event: tuple[str, str, str], message: str | None) -> None:
    decision = scenario(min_replicas=1, max_replicas=100, spec_replicas=3, cpu_target=10,
                        levels=(100, 200, 300), requests=["0.1"] * 3, selector=selector)
    assert conditions(decision) == [GOT_SCALE, ("ScalingActive", F, "InvalidSelector")]
    assert messages(decision)["ScalingActive"] == (message or event[2])
    assert events(decision) == [event, ("Warning", "FailedComputeMetricsReplicas", event[2])]
    assert decision.status.desired_replicas == 3 and decision.status.current_metrics == ()


def test_pods_selected_by_another_autoscaler_are_ambiguous() -> None:
    overlap = scenario(min_replicas=2, max_replicas=6, spec_replicas=3, cpu_target=30,
                       levels=(300, 500, 700), requests=[ONE] * 3,
                       other_selectors={"test-hpa-2": "name=test-pod"})
    disjoint = scenario(min_replicas=2, max_replicas=6, spec_replicas=3, cpu_target=30,
                        levels=(300, 500, 700), requests=[ONE] * 3,
                        other_selectors={"test-hpa-2": "cheddar=cheese"})
    assert conditions(overlap) == [GOT_SCALE, ("ScalingActive", F, "AmbiguousSelector")]
    assert messages(overlap)["ScalingActive"] == (
        "pods by selector name=test-pod are controlled by more than one HPA (e.g. "
        "[test-namespace/test-hpa test-namespace/test-hpa-2])")
    assert overlap.desired_replicas == 3
    assert disjoint.desired_replicas == 5


FAILED_METRICS = [
    ("FailedGetResourceMetric", None,
     "failed to get cpu utilization: unable to get metrics for resource cpu: unable to fetch "
     "metrics from resource metrics API: something went wrong",
     "failed to get cpu resource metric value: "),
    ("FailedGetPodsMetric", b.pods_metric("15.0"),
     "unable to get metric qps: unable to fetch metrics from custom metrics API: something went "
     "wrong", "failed to get pods metric value: "),
    ("FailedGetObjectMetric", b.object_value("15.0"),
     "unable to get metric qps on Deployment test-namespace/some-deployment: unable to fetch "
     "metrics from custom metrics API: something went wrong",
     "failed to get object metric value: "),
    ("FailedGetExternalMetric", b.external_value("300m"),
     "unable to get external metric test-namespace/qps/&LabelSelector{MatchLabels:map[string]"
     "string{},MatchExpressions:[]LabelSelectorRequirement{},}: unable to fetch metrics from "
     "external metrics API: something went wrong",
     "failed to get qps external metric value: failed to get external metric qps: "),
]


@pytest.mark.parametrize(("reason", "metric", "message", "wrap"), FAILED_METRICS,
                         ids=[f[0] for f in FAILED_METRICS])
def test_a_failing_metrics_api_gives_upstreams_reason_and_messages(
        reason: str, metric: dict[str, Any] | None, message: str, wrap: str) -> None:
    decision = scenario(min_replicas=1, max_replicas=100, spec_replicas=3,
                        cpu_target=10 if metric is None else 0,
                        metrics=[metric] if metric is not None else [], requests=["0.1"] * 3,
                        metric_inputs=[{"error": "something went wrong"}])
    assert conditions(decision) == [GOT_SCALE, ("ScalingActive", F, reason)]
    assert messages(decision)["ScalingActive"] == \
        f"the HPA was unable to compute the replica count: {message}"
    assert events(decision) == [
        ("Warning", reason, message),
        ("Warning", "FailedComputeMetricsReplicas",
         f"invalid metrics (1 invalid out of 1), first error is: {wrap}{message}")]
    assert decision.status.desired_replicas == 3 and not decision.rescale
    assert decision.status.current_metrics == (MetricStatus(),)
    assert render_status(decision.status)["currentMetrics"] == [{"type": ""}]


def test_an_unknown_metric_type_is_invalid_metric_source_type() -> None:
    decision = scenario(min_replicas=2, max_replicas=6, spec_replicas=3,
                        metrics=[{"type": "CheddarCheese"}], levels=(20000,))
    assert conditions(decision) == [GOT_SCALE, ("ScalingActive", F, "InvalidMetricSourceType")]
    assert events(decision)[0] == ("Warning", "InvalidMetricSourceType",
                                   'unknown metric source type "CheddarCheese"')
    assert messages(decision)["ScalingActive"] == ("the HPA was unable to compute the replica "
                                                   'count: unknown metric source type '
                                                   '"CheddarCheese"')


def test_a_failing_metric_blocks_a_scale_down() -> None:
    decision = scenario(min_replicas=2, max_replicas=6, spec_replicas=5, cpu_target=50,
                        metrics=[{"type": "CheddarCheese"}], levels=(100, 300, 500, 250, 250),
                        requests=[ONE] * 5, recommendations=[])
    assert decision.desired_replicas == 5 and not decision.rescale
    assert conditions(decision) == [GOT_SCALE, ("ScalingActive", F, "InvalidMetricSourceType")]
    assert [(lim.rule, lim.from_replicas, lim.to_replicas) for lim in decision.limits] == \
        [("FailingMetricBlocksScaleDown", 3, 5)]
    external_fails = scenario(min_replicas=2, max_replicas=6, spec_replicas=5, cpu_target=50,
                              metrics=[b.external_value("1000m")],
                              levels=(100, 300, 500, 250, 250), requests=[ONE] * 5,
                              recommendations=[],
                              metric_inputs=[b.pod_metrics(b.controller_levels(
                                  100, 300, 500, 250, 250)), {"error": "something went wrong"}])
    assert conditions(external_fails) == [GOT_SCALE,
                                          ("ScalingActive", F, "FailedGetExternalMetric")]


def test_a_failing_metric_does_not_block_a_scale_up() -> None:
    invalid_type = scenario(min_replicas=2, max_replicas=6, spec_replicas=3, cpu_target=30,
                            metrics=[{"type": "CheddarCheese"}], levels=(300, 400, 500),
                            requests=[ONE] * 3)
    failing_external = scenario(
        min_replicas=2, max_replicas=6, spec_replicas=3, cpu_target=30,
        metrics=[b.external_value("100m")], requests=[ONE] * 3,
        metric_inputs=[b.pod_metrics(b.controller_levels(300, 400, 500)),
                       {"error": "something went wrong"}])
    for decision in (invalid_type, failing_external):
        assert decision.desired_replicas == 4
        assert conditions(decision) == STATUS_OK
        assert decision.error is not None and decision.error.startswith(
            "invalid metrics (1 invalid out of 2), first error is: ")
    assert invalid_type.events[0].reason == "InvalidMetricSourceType"
    assert [e.reason for e in failing_external.events] == ["FailedGetExternalMetric",
                                                           "SuccessfulRescale"]


@pytest.mark.parametrize(("metric", "message"), [
    ({"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}},
     "invalid resource metric source: neither an average utilization target nor an average "
     "value (usage) target was set"),
    ({"type": "Object", "object": {"describedObject": {"kind": "Deployment", "name": "d"},
                                   "metric": {"name": "qps"},
                                   "target": {"type": "AverageValue", "value": "1"}}},
     "invalid object metric source: neither a value target nor an average value target was set"),
    ({"type": "External", "external": {"metric": {"name": "qps"}, "target": {"type": "Value"}}},
     "invalid external metric source: neither a value target nor an average value target was "
     "set"),
])
def test_targets_without_a_usable_value_are_rejected_as_upstream_does(metric: dict[str, Any],
                                                                      message: str) -> None:
    decision = scenario(min_replicas=1, max_replicas=5, spec_replicas=3, metrics=[metric],
                        requests=[ONE] * 3, metric_inputs=[None])
    assert decision.events[0].message == message
    assert messages(decision)["ScalingActive"].endswith(message)


def test_an_invalid_metric_selector_fails_that_metric() -> None:
    metric = b.pods_metric("15.0")
    metric["pods"]["metric"]["selector"] = {"matchExpressions": [
        {"key": "a", "operator": "Between", "values": ["1"]}]}
    decision = scenario(min_replicas=1, max_replicas=5, spec_replicas=3, metrics=[metric],
                        levels=(1, 2, 3), requests=[ONE] * 3)
    assert events(decision)[0] == ("Warning", "FailedGetPodsMetric",
                                   '"Between" is not a valid label selector operator')


def test_a_control_character_in_a_metric_selector_value_is_escaped_as_go_quotes_it() -> None:
    metric = b.pods_metric("15.0")
    metric["pods"]["metric"]["selector"] = {"matchLabels": {"app": "web\x01"}}
    decision = scenario(min_replicas=1, max_replicas=5, spec_replicas=3, metrics=[metric],
                        levels=(1, 2, 3), requests=[ONE] * 3)
    reason, message = events(decision)[0][1:]
    assert reason == "FailedGetPodsMetric"
    assert message.startswith('values[0][app]: Invalid value: "web\\x01": a valid label must ')


def test_an_unknown_metric_type_with_unprintable_runes_is_escaped_as_go_quotes_it() -> None:
    decision = scenario(min_replicas=2, max_replicas=6, spec_replicas=3,
                        metrics=[{"type": "Cheddar\x01\u200b"}], levels=(20000,))
    assert events(decision)[0] == ("Warning", "InvalidMetricSourceType",
                                   'unknown metric source type "Cheddar\\x01\\u200b"')


# --------------------------------------------------------------------------------------------
# After the write


def test_a_failed_scale_write_keeps_the_old_desired_replicas() -> None:
    decision = scenario(min_replicas=1, max_replicas=5, spec_replicas=3, cpu_target=100,
                        levels=(150, 150, 150), requests=["0.1"] * 3,
                        write_error="something went wrong")
    assert conditions(decision) == ok_with(("AbleToScale", F, "FailedUpdateScale"))
    assert messages(decision)["AbleToScale"] == \
        "the HPA controller was unable to update the target scale: something went wrong"
    assert events(decision) == [
        ("Warning", "FailedRescale", "New size: 5; reason: cpu resource utilization (percentage "
                                     "of request) above target; error: something went wrong")]
    assert decision.status.desired_replicas == 3 and decision.status.last_scale_time is None
    assert decision.desired_replicas == 3 and not decision.scale_updated
    assert decision.error == ("failed to rescale ReplicationController/test-namespace/test-rc: "
                              "something went wrong")


def test_decide_then_complete_separates_the_plan_from_the_write() -> None:
    snap = parse_snapshot(b.snapshot(
        autoscaler=b.hpa(metrics=[b.cpu_utilization(30)], behavior={}),
        scale_object=b.scale(3),
        pods=b.controller_pods([ONE] * 3),
        metrics=[b.pod_metrics(b.controller_levels(300, 500, 700), timestamp=b.ts(b.NOW))]))
    plan = decide(autoscaler=snap.autoscaler, scale=snap.scale, pods=snap.pods,
                  metrics=snap.metrics, history=snap.history, now=snap.now,
                  settings=snap.settings)
    assert plan.rescale and plan.awaiting_write and plan.new_replicas == 5
    assert not plan.scale_updated
    done = complete(plan, write_result=SCALE_WRITE_SUCCEEDED, settings=snap.settings,
                    now=snap.now)
    failed = complete(plan, write_result=ScaleWriteResult("conflict"), settings=snap.settings,
                      now=snap.now)
    assert done.scale_updated and not done.awaiting_write
    assert [(e.replica_change, e.outdated) for e in done.history.scale_up_events] == [(2, False)]
    assert failed.history.scale_up_events == ()  # only a successful rescale is remembered
    assert [e.reason for e in done.events] == ["SuccessfulRescale"]
    assert [e.reason for e in failed.events] == ["FailedRescale"]
    assert complete(done, write_result=ScaleWriteResult("late"), settings=snap.settings,
                    now=snap.now) is done


def test_scale_events_are_stored_only_with_a_behavior() -> None:
    legacy = scenario(min_replicas=2, max_replicas=6, spec_replicas=3, cpu_target=30,
                      levels=(300, 500, 700), requests=[ONE] * 3)
    assert legacy.history.scale_up_events == () and legacy.history.scale_down_events == ()


def test_above_max_with_a_behavior_stores_a_scale_down_event() -> None:
    decision = scenario(min_replicas=3, max_replicas=5, spec_replicas=10, cpu_target=90,
                        requests=[], behavior={})
    assert [(e.replica_change, e.timestamp) for e in decision.history.scale_down_events] == \
        [(5, b.NOW)]


def test_default_settings_are_upstreams() -> None:
    settings = Settings()
    assert (settings.sync_period, settings.tolerance, settings.cpu_initialization_period,
            settings.initial_readiness_delay, settings.downscale_stabilization_window,
            settings.scale_up_limit_factor, settings.scale_up_limit_minimum,
            settings.scale_to_zero) == (timedelta(seconds=15), 0.1, timedelta(minutes=5),
                                        timedelta(seconds=30), timedelta(minutes=5), 2.0, 4.0,
                                        False)
    assert Settings(tolerance=0).tolerance == 0.1  # zero means unset upstream
