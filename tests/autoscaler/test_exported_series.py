"""The per-autoscaler series: kube-state-metrics' HPA shape under metricscale_autoscaler_."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from autoscaler.controller.exported import AutoscalerSeries
from autoscaler.model.objects import Autoscaler, parse_autoscaler


def _hpa(name: str, **status: Any) -> Autoscaler:
    return parse_autoscaler({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": 2, "maxReplicas": 10,
            "metrics": [
                {"type": "Resource", "resource": {
                    "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}}},
                {"type": "External", "external": {
                    "metric": {"name": "queue_depth"},
                    "target": {"type": "AverageValue", "averageValue": "1500m"}}},
            ]},
        "status": status,
    })


SampleKey = tuple[str, frozenset[tuple[str, str]]]


def _samples(autoscalers: list[tuple[str, Autoscaler]]) -> dict[SampleKey, float]:
    registry = CollectorRegistry()
    registry.register(AutoscalerSeries(lambda: list(autoscalers)))
    text = generate_latest(registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


OBJECT = {"namespace": "shop", "horizontalpodautoscaler": "web",
          "kind": "HorizontalPodAutoscaler"}


def _key(name: str, **labels: str) -> SampleKey:
    return "metricscale_autoscaler_" + name, frozenset({**OBJECT, **labels}.items())


def test_replica_counts_carry_kube_state_metrics_labels() -> None:
    samples = _samples([("HorizontalPodAutoscaler",
                         _hpa("web", currentReplicas=4, desiredReplicas=6))])
    assert samples[_key("spec_min_replicas")] == 2
    assert samples[_key("spec_max_replicas")] == 10
    assert samples[_key("status_current_replicas")] == 4
    assert samples[_key("status_desired_replicas")] == 6


def test_targets_and_current_values_are_named_by_metric_and_target_type() -> None:
    samples = _samples([("HorizontalPodAutoscaler", _hpa(
        "web", currentReplicas=4, desiredReplicas=4, currentMetrics=[
            {"type": "Resource", "resource": {
                "name": "cpu", "current": {"averageUtilization": 75, "averageValue": "300m"}}}]))])
    assert samples[_key("spec_target_metric", metric_name="cpu",
                        metric_target_type="utilization")] == 60
    assert samples[_key("spec_target_metric", metric_name="queue_depth",
                        metric_target_type="average")] == 1.5
    assert samples[_key("status_target_metric", metric_name="cpu",
                        metric_target_type="utilization")] == 75
    assert samples[_key("status_target_metric", metric_name="cpu",
                        metric_target_type="average")] == 0.3


def test_each_condition_has_one_series_per_status_with_one_set() -> None:
    samples = _samples([("HorizontalPodAutoscaler", _hpa("web", conditions=[
        {"type": "ScalingActive", "status": "False", "reason": "FailedGetResourceMetric",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]))])
    found = {status: samples[_key("status_condition", condition="ScalingActive", status=status)]
             for status in ("true", "false", "unknown")}
    assert found == {"true": 0, "false": 1, "unknown": 0}


def test_deleted_autoscalers_leave_no_series_behind() -> None:
    cache = [("HorizontalPodAutoscaler", _hpa("web"))]
    registry = CollectorRegistry()
    registry.register(AutoscalerSeries(lambda: list(cache)))
    assert b'horizontalpodautoscaler="web"' in generate_latest(registry)
    cache.clear()
    assert b'horizontalpodautoscaler="web"' not in generate_latest(registry)
