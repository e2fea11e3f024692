"""Wire parsing and rendering: API defaults, field-path errors, selectors, times, snapshots."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from autoscaler.decision.settings import Settings, SettingsError, parse_settings
from autoscaler.decision.snapshot import (
    SnapshotError,
    decide_snapshot,
    parse_snapshot,
    render_decision,
)
from autoscaler.model.fields import ModelError, Quantity
from autoscaler.model.metrics import MetricValueList, parse_metric_input
from autoscaler.model.objects import parse_autoscaler, render_autoscaler
from autoscaler.model.pods import Pod, Scale, ScaleError, parse_pods, parse_scale, pods_matching
from autoscaler.model.spec import render_spec
from autoscaler.model.times import GO_ZERO_TIME, parse_time
from metricscale.core.durations import format_duration, parse_go_timedelta
from metricscale.core.quantity import Format
from metricscale.core.selectors import (
    LabelSelector,
    LabelSelectorRequirement,
    SelectorError,
    format_label_selector,
    parse_selector,
    selector_from_label_selector,
)
from tests.autoscaler import builders as b


def base_snapshot() -> dict[str, Any]:
    return b.snapshot(autoscaler=b.hpa(metrics=[b.cpu_utilization(50)]),
                      scale_object=b.scale(3), pods=b.controller_pods(["1"] * 3),
                      metrics=[b.pod_metrics(b.controller_levels(500, 500, 500))])


# --------------------------------------------------------------------------------------------
# API defaults


def test_api_defaults_fill_min_replicas_and_a_cpu_metric() -> None:
    raw = b.hpa(min_replicas=None, metrics=[])
    spec = parse_autoscaler(raw).spec
    assert spec.min_replicas == 1
    assert render_spec(spec)["metrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]


def test_behavior_defaults_apply_only_to_a_given_behavior() -> None:
    assert parse_autoscaler(b.hpa()).spec.behavior is None
    spec = parse_autoscaler(b.hpa(behavior={"scaleUp": {"tolerance": "0.05"}})).spec
    assert render_spec(spec)["behavior"] == {
        "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                    "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15},
                                 {"type": "Percent", "value": 100, "periodSeconds": 15}],
                    "tolerance": "0.05"},
        "scaleDown": {"selectPolicy": "Max",
                      "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]},
    }


def test_given_policies_replace_the_default_list() -> None:
    behavior = {"scaleDown": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}}
    spec = parse_autoscaler(b.hpa(behavior=behavior)).spec
    assert spec.behavior is not None and spec.behavior.scale_down is not None
    assert [p.type for p in spec.behavior.scale_down.policies or ()] == ["Pods"]


def test_both_kinds_share_the_spec() -> None:
    hpa = parse_autoscaler(b.hpa(metrics=[b.pods_metric("1")]))
    ours = parse_autoscaler(b.hpa(metrics=[b.pods_metric("1")], kind="Autoscaler"))
    assert hpa.spec == ours.spec
    assert (ours.api_version, ours.kind) == ("metricscale.dev/v1alpha1", "Autoscaler")


def test_rendering_returns_the_wire_object() -> None:
    raw = b.hpa(metrics=[b.external_average("2222m", selector={"matchLabels": {"a": "b"}}),
                         b.object_value("15")],
                conditions=[{"type": "AbleToScale", "status": "True", "reason": "R",
                             "message": "m", "lastTransitionTime": "2026-11-21T09:00:00Z"}],
                last_scale_time="2026-11-21T08:00:00Z")
    rendered = render_autoscaler(parse_autoscaler(raw))
    assert rendered["spec"]["metrics"] == raw["spec"]["metrics"]
    assert rendered["status"] == raw["status"] | {"currentReplicas": 3, "desiredReplicas": 3}
    assert rendered["metadata"]["resourceVersion"] == "42"


# --------------------------------------------------------------------------------------------
# Errors name the field


@pytest.mark.parametrize(("mutate", "path"), [
    (lambda o: o["spec"].pop("maxReplicas"), "autoscaler.spec.maxReplicas"),
    (lambda o: o["spec"].__setitem__("minReplicas", "two"), "autoscaler.spec.minReplicas"),
    (lambda o: o["spec"]["metrics"][0]["resource"]["target"].__setitem__(
        "averageUtilization", 1.5), "autoscaler.spec.metrics[0].resource.target."
                                    "averageUtilization"),
    (lambda o: o["spec"]["metrics"].append({"type": "Pods", "pods": {
        "metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "1x"}}}),
     "autoscaler.spec.metrics[1].pods.target.averageValue"),
    (lambda o: o["spec"]["metrics"].append({"type": "External"}),
     "autoscaler.spec.metrics[1].external"),
    (lambda o: o["spec"]["scaleTargetRef"].pop("name"), "autoscaler.spec.scaleTargetRef.name"),
    (lambda o: o.__setitem__("kind", "Deployment"), "autoscaler.kind"),
    (lambda o: o["status"].__setitem__("lastScaleTime", "yesterday"),
     "autoscaler.status.lastScaleTime"),
])
def test_invalid_autoscalers_are_rejected_naming_the_field(mutate: Any, path: str) -> None:
    raw = base_snapshot()
    mutate(raw["autoscaler"])
    with pytest.raises(SnapshotError) as caught:
        parse_snapshot(raw)
    assert caught.value.path == path
    assert str(caught.value).startswith(f"{path}: ")


@pytest.mark.parametrize(("mutate", "path"), [
    (lambda s: s.pop("now"), "now"),
    (lambda s: s.__setitem__("now", "2026-11-21 10:00"), "now"),
    (lambda s: s.__setitem__("kind", "Snapshot"), "kind"),
    (lambda s: s.__setitem__("surprise", 1), "surprise"),
    (lambda s: s["settings"].__setitem__("tolerance", "lots"), "settings.tolerance"),
    (lambda s: s["settings"].__setitem__("colour", "blue"), "settings.colour"),
    (lambda s: s["scale"]["spec"].__setitem__("replicas", -2**40), "scale.spec.replicas"),
    (lambda s: s["pods"]["items"][1]["spec"]["containers"][0]["resources"]["requests"]
     .__setitem__("cpu", "lots"), "pods.items[1].spec.containers[0].resources.requests.cpu"),
    (lambda s: s["metrics"].append(None), "metrics"),
    (lambda s: s["metrics"].__setitem__(0, b.custom_metrics([1])), "metrics[0].kind"),
    (lambda s: s["metrics"][0]["items"][2].__setitem__("window", 30),
     "metrics[0].items[2].window"),
    (lambda s: s.__setitem__("history", {"recommendations": [{"replicas": 2}]}),
     "history.recommendations[0].timestamp"),
])
def test_invalid_snapshots_are_rejected_naming_the_field(mutate: Any, path: str) -> None:
    raw = base_snapshot()
    raw["settings"] = {}
    mutate(raw)
    with pytest.raises(SnapshotError) as caught:
        parse_snapshot(raw)
    assert caught.value.path == path


def test_a_snapshot_without_metrics_entries_gets_nulls() -> None:
    raw = base_snapshot()
    raw.pop("metrics")
    snap = parse_snapshot(raw)
    assert snap.metrics == (None,)
    decision = decide_snapshot(snap)
    assert decision.metrics[0].error is not None
    assert "no metrics were fetched" in decision.metrics[0].error


def test_render_decision_has_the_documented_keys() -> None:
    out = render_decision(decide_snapshot(parse_snapshot(base_snapshot())))
    assert list(out) == ["desiredReplicas", "scaleUpdated", "status", "events", "metrics",
                         "limits", "history", "explanation"]
    assert {"index", "type", "name", "proposedReplicas", "current", "target", "ratio",
            "error"} <= set(out["metrics"][0])


# --------------------------------------------------------------------------------------------
# Scale, pods and metric values


def test_scale_and_scale_errors() -> None:
    assert parse_scale(b.scale(4, 5)) == Scale(spec_replicas=4, status_replicas=5,
                                               selector="name=test-pod", name="test-rc",
                                               namespace="test-namespace")
    assert parse_scale({"error": "deployments.apps \"x\" not found"}) == \
        ScaleError("deployments.apps \"x\" not found")
    assert parse_scale({"spec": {}, "status": {}}).spec_replicas == 0  # type: ignore[union-attr]


def test_a_pod_list_or_a_plain_list_of_pods() -> None:
    pods = [b.pod(0), b.pod(1)]
    assert parse_pods(b.pod_list(pods)) == parse_pods(pods)


def test_pods_keep_go_zero_time_as_a_real_time() -> None:
    pod = parse_pods([b.pod(0)])[0]
    assert pod.start_time == GO_ZERO_TIME
    assert pod.ready is not None and pod.ready.last_transition_time == GO_ZERO_TIME


def test_custom_metrics_v1beta1_use_metric_name() -> None:
    raw = {"kind": "MetricValueList", "apiVersion": "custom.metrics.k8s.io/v1beta1",
           "items": [{"describedObject": {"kind": "Pod", "name": "p"}, "metricName": "qps",
                      "timestamp": "2026-11-21T10:00:00Z", "windowSeconds": 30,
                      "value": "1500m"}]}
    value = parse_metric_input(raw, "m", metric_type="Pods")
    assert isinstance(value, MetricValueList)
    assert (value.items[0].metric_name, value.items[0].value.milli,
            value.items[0].window_seconds) == ("qps", 1500, 30)


def test_quantities_compare_by_value_and_keep_their_text() -> None:
    assert Quantity.parse("1.5") == Quantity.parse("1500m")
    assert Quantity.parse("1.5").text == "1.5"
    assert Quantity.from_milli(1536 * 1024 * 1000, Format.BINARY_SI).text == "1536Ki"
    assert Quantity.parse("0.1m").milli == 1  # MilliValue rounds up


# --------------------------------------------------------------------------------------------
# Times and durations


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-11-21T10:00:00Z", datetime(2026, 11, 21, 10, tzinfo=UTC)),
    ("2026-11-21T10:00:00.123456789Z", datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=UTC)),
    ("2026-11-21T12:00:00+02:00", datetime(2026, 11, 21, 10, tzinfo=UTC)),
    ("0001-01-01T00:00:00Z", GO_ZERO_TIME),
])
def test_rfc3339_times_parse_to_utc(text: str, expected: datetime) -> None:
    assert parse_time(text, "t") == expected


@pytest.mark.parametrize("text", ["2026-11-21", "2026-11-21T10:00:00", "2026-13-01T00:00:00Z",
                                  "now"])
def test_other_times_are_rejected(text: str) -> None:
    with pytest.raises(ModelError):
        parse_time(text, "t")


@pytest.mark.parametrize(("text", "seconds"), [("15s", 15), ("5m0s", 300), ("1h30m", 5400),
                                               ("500ms", 0.5), ("0", 0)])
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_timedelta(text) == timedelta(seconds=seconds)


def test_durations_format_like_go() -> None:
    assert [format_duration(timedelta(seconds=s)) for s in (15, 300, 3600, 90)] == \
        ["15s", "5m0s", "1h0m0s", "1m30s"]


def test_settings_from_a_snapshot() -> None:
    settings = parse_settings({"tolerance": 0.05, "cpuInitializationPeriodSeconds": 120,
                               "scaleToZero": True})
    assert settings == Settings(tolerance=0.05, cpu_initialization_period=timedelta(minutes=2),
                                scale_to_zero=True)


@pytest.mark.parametrize(("raw", "message"), [
    # the controller's flags refuse these at start: a snapshot cannot claim them either
    ({"syncPeriodSeconds": 3601}, "settings.syncPeriodSeconds: must be at most 3600"),
    ({"downscaleStabilizationWindowSeconds": 1e15},
     "settings.downscaleStabilizationWindowSeconds: must be at most 9223372036"),
    ({"cpuInitializationPeriodSeconds": 1e300},
     "settings.cpuInitializationPeriodSeconds: must be at most 9223372036"),
    ({"scaleUpLimitFactor": 1e308}, "settings.scaleUpLimitFactor: must be at most 1000"),
    ({"scaleUpLimitMinimum": 1e10}, "settings.scaleUpLimitMinimum: must be at most 2147483647"),
])
def test_settings_out_of_the_flags_range_are_refused(raw: dict[str, float], message: str) -> None:
    with pytest.raises(SettingsError) as raised:
        parse_settings(raw)
    assert str(raised.value).startswith(message)


# --------------------------------------------------------------------------------------------
# Selectors


@pytest.mark.parametrize(("text", "labels", "matches"), [
    ("name=test-pod", {"name": "test-pod"}, True),
    ("name==test-pod,tier!=db", {"name": "test-pod", "tier": "web"}, True),
    ("tier in (web, api),!legacy", {"tier": "api"}, True),
    ("tier in (web, api),!legacy", {"tier": "api", "legacy": ""}, False),
    ("tier notin (db)", {}, True),
    ("app", {"app": "x"}, True),
    ("replicas>2", {"replicas": "3"}, True),
    ("replicas<2", {"replicas": "3"}, False),
    ("", {"anything": "x"}, True),
])
def test_label_selectors_parse_and_match_like_labels_parse(text: str, labels: dict[str, str],
                                                           matches: bool) -> None:
    assert parse_selector(text).matches(labels) is matches


@pytest.mark.parametrize(("text", "message"), [
    ("cheddar cheese", "unable to parse requirement: found 'cheese', expected: in, notin, =, ==, "
                       "!=, gt, lt"),
    ("a=b,", "found '', expected: identifier after ','"),
    ("a in b", "unable to parse requirement: found 'b' expected: '('"),
    ("a=b c", "found 'c', expected: ',' or 'end of string'"),
    ("=a", "found '=', expected: !, identifier, or 'end of string'"),
])
def test_unparsable_selectors_give_upstreams_errors(text: str, message: str) -> None:
    with pytest.raises(SelectorError) as caught:
        parse_selector(text)
    assert str(caught.value) == message


def test_label_selector_string_is_gos() -> None:
    selector = LabelSelector(match_labels=(("zone", "b"), ("app", "web")),
                             match_expressions=(LabelSelectorRequirement("tier", "Exists"),))
    assert format_label_selector(selector) == (
        "&LabelSelector{MatchLabels:map[string]string{app: web,zone: b,},MatchExpressions:"
        "[]LabelSelectorRequirement{LabelSelectorRequirement{Key:tier,Operator:Exists,"
        "Values:[],},},}")
    assert format_label_selector(None) == "nil"


def test_selector_from_label_selector() -> None:
    assert selector_from_label_selector(None).matches({}) is False
    assert selector_from_label_selector(LabelSelector()).matches({"a": "b"}) is True
    with pytest.raises(SelectorError) as caught:
        selector_from_label_selector(LabelSelector(match_expressions=(
            LabelSelectorRequirement("a", "In", ()),)))
    assert "values set can't be empty" in str(caught.value)


@pytest.mark.parametrize(("text", "labels", "listed"), [
    # Two requirements on one key: labels.Parse keeps both, and no pod meets both.
    ("app=b,app=a", {"app": "a"}, False),
    ("app=a,app=b", {"app": "a"}, False),
    ("app=a,app=a", {"app": "a"}, True),
    ("app=a,tier=web", {"app": "a", "tier": "web"}, True),
    ("app=a,tier=web", {"app": "a"}, False),
])
def test_pods_matching_requires_every_requirement_even_on_a_repeated_key(
        text: str, labels: dict[str, str], listed: bool) -> None:
    pod = Pod(name="p", namespace="ns", labels=labels)
    selector = parse_selector(text)
    assert (pods_matching([pod], selector, "ns") == [pod]) is listed
    assert selector.matches(labels) is listed


def test_snapshot_pods_outside_the_selector_are_not_counted() -> None:
    raw = base_snapshot()
    stranger = b.pod(9, name="other", labels={"name": "other"})
    raw["pods"]["items"].append(stranger)
    with_stranger = decide_snapshot(parse_snapshot(raw))
    without = decide_snapshot(parse_snapshot(base_snapshot()))
    assert with_stranger.metrics == without.metrics


def test_parsing_does_not_mutate_its_input() -> None:
    raw = base_snapshot()
    before = copy.deepcopy(raw)
    parse_snapshot(raw)
    assert raw == before

