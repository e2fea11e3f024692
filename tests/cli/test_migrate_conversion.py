"""autoscaler.model.migration: HPA -> Autoscaler carries the spec field for field (the CRD
accepts it, our extras stay at upstream's defaults), Autoscaler -> HPA reports every extra it
cannot carry, and a field the Autoscaler cannot say stops the conversion naming it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from autoscaler.model.migration import (
    ConversionError,
    autoscaler_from_hpa,
    hpa_from_autoscaler,
)
from autoscaler.model.objects import parse_autoscaler
from autoscaler.model.validation import validate_spec

BEHAVIOR = {
    "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15},
                             {"type": "Percent", "value": 100, "periodSeconds": 15}]},
    "scaleDown": {"stabilizationWindowSeconds": 120, "selectPolicy": "Min",
                  "policies": [{"type": "Percent", "value": 50, "periodSeconds": 60}],
                  "tolerance": "50m"},
}
METRICS = [
    {"type": "Resource", "resource": {"name": "cpu", "target": {
        "type": "Utilization", "averageUtilization": 60}}},
    {"type": "ContainerResource", "containerResource": {"name": "memory", "container": "app",
                                                        "target": {"type": "AverageValue",
                                                                   "averageValue": "512Mi"}}},
    {"type": "Pods", "pods": {"metric": {"name": "jobs_in_flight"},
                              "target": {"type": "AverageValue", "averageValue": "10"}}},
    {"type": "Object", "object": {
        "describedObject": {"apiVersion": "v1", "kind": "Service", "name": "front"},
        "metric": {"name": "requests_per_second",
                   "selector": {"matchLabels": {"verb": "GET"}}},
        "target": {"type": "Value", "value": "2k"}}},
    {"type": "External", "external": {
        "metric": {"name": "queue_depth", "selector": {"matchExpressions": [
            {"key": "queue", "operator": "In", "values": ["orders"]}]}},
        "target": {"type": "AverageValue", "averageValue": "30"}}},
]


def hpa(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                               "name": "web"},
                            "minReplicas": 2, "maxReplicas": 20, "metrics": METRICS,
                            "behavior": BEHAVIOR}
    body.update(spec)
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1",
                         "resourceVersion": "42", "labels": {"team": "a"},
                         "annotations": {
                             "kubectl.kubernetes.io/last-applied-configuration": "{}",
                             "metricscale.dev/history": '{"recommendations":[]}',
                             "owner": "team-a"}},
            "spec": body,
            "status": {"currentReplicas": 5, "desiredReplicas": 5}}


def test_an_hpa_becomes_an_autoscaler_with_the_same_spec_and_no_extras() -> None:
    source = hpa()
    converted = autoscaler_from_hpa(source)
    manifest = converted.manifest
    assert manifest["apiVersion"] == "metricscale.dev/v1alpha1"
    assert manifest["kind"] == "Autoscaler"
    assert manifest["spec"] == source["spec"]
    assert manifest["metadata"] == {"name": "web", "namespace": "shop",
                                    "labels": {"team": "a"}, "annotations": {"owner": "team-a"}}
    validate_spec(manifest["spec"], strict=True)  # what the CRD accepts, nothing pruned
    parsed = parse_autoscaler(manifest)
    assert parsed.spec.pod_selection_strategy == "LabelSelector"
    assert parsed.spec.idle is None
    assert all(m.fallback is None and m.activation_threshold is None
               for m in parsed.spec.metrics)
    assert parsed.spec.behavior is not None and parsed.spec.behavior.sync_period_seconds is None
    assert converted.dropped == ()
    assert converted.key == "shop/web"


def test_the_conversion_never_changes_its_input() -> None:
    source = hpa()
    before = copy.deepcopy(source)
    autoscaler_from_hpa(source)
    hpa_from_autoscaler(autoscaler_from_hpa(source).manifest)
    assert source == before


def test_an_hpa_without_a_scale_down_window_is_noted_as_following_the_controllers_flag() -> None:
    converted = autoscaler_from_hpa(hpa(behavior=None))
    assert any("--horizontal-pod-autoscaler-downscale-stabilization" in n
               for n in converted.notes)
    assert not any("downscale-stabilization" in n for n in autoscaler_from_hpa(hpa()).notes)


def test_an_hpa_field_the_autoscaler_does_not_know_stops_the_conversion_naming_it() -> None:
    with pytest.raises(ConversionError, match=r"spec\.behavior\.scaleUp\.futureField"):
        autoscaler_from_hpa(hpa(behavior={"scaleUp": {"futureField": 1}}))


def test_only_an_hpa_is_converted_to_an_autoscaler() -> None:
    with pytest.raises(ConversionError, match="expected an autoscaling/v2"):
        autoscaler_from_hpa({**hpa(), "apiVersion": "metricscale.dev/v1alpha1",
                             "kind": "Autoscaler"})


def test_the_round_trip_hpa_to_autoscaler_to_hpa_is_the_identity_on_spec() -> None:
    back = hpa_from_autoscaler(autoscaler_from_hpa(hpa()).manifest)
    assert back.manifest["spec"] == hpa()["spec"]
    assert back.dropped == ()


def ours(**extra: Any) -> dict[str, Any]:
    manifest = autoscaler_from_hpa(hpa()).manifest
    manifest["spec"]["metrics"][4]["external"]["fallback"] = {"replicas": 6,
                                                              "failureThreshold": 3}
    manifest["spec"]["metrics"][2]["pods"]["activationThreshold"] = "5"
    manifest["spec"]["idle"] = {"replicas": 0, "cooldownSeconds": 300}
    manifest["spec"]["podSelectionStrategy"] = "OwnerReferences"
    manifest["spec"]["behavior"]["syncPeriodSeconds"] = 60
    manifest["metadata"]["annotations"] = {"metricscale.dev/paused-scale-in": "true"}
    manifest["status"] = {"history": {"recommendations": []}}
    manifest.update(extra)
    return manifest


def test_every_extra_without_an_hpa_equivalent_is_reported_and_left_out() -> None:
    converted = hpa_from_autoscaler(ours())
    spec = converted.manifest["spec"]
    assert spec == hpa()["spec"]
    assert converted.manifest["kind"] == "HorizontalPodAutoscaler"
    assert "annotations" not in converted.manifest["metadata"]
    reported = [line.split(":", 1)[0] for line in converted.dropped]
    assert reported == ["spec.metrics[2].pods.activationThreshold",
                        "spec.metrics[4].external.fallback", "spec.idle",
                        "spec.podSelectionStrategy", "spec.behavior.syncPeriodSeconds",
                        "metadata.annotations[metricscale.dev/paused-scale-in]"]
    assert "proposes 6 replicas" in converted.dropped[1]
    assert any("status.history" in n for n in converted.notes)


def test_label_selector_pod_selection_is_upstreams_and_drops_nothing() -> None:
    manifest = autoscaler_from_hpa(hpa()).manifest
    manifest["spec"]["podSelectionStrategy"] = "LabelSelector"
    converted = hpa_from_autoscaler(manifest)
    assert "podSelectionStrategy" not in converted.manifest["spec"]
    assert converted.dropped == ()


def test_a_behavior_holding_only_a_sync_period_goes_away_entirely() -> None:
    manifest = autoscaler_from_hpa(hpa(behavior=None)).manifest
    manifest["spec"]["behavior"] = {"syncPeriodSeconds": 30}
    converted = hpa_from_autoscaler(manifest)
    assert "behavior" not in converted.manifest["spec"]
    assert [d.split(":")[0] for d in converted.dropped] == ["spec.behavior.syncPeriodSeconds"]


def test_an_object_without_a_name_is_refused() -> None:
    with pytest.raises(ConversionError, match=r"metadata\.name"):
        autoscaler_from_hpa({**hpa(), "metadata": {"namespace": "shop"}})
