"""Wire-format objects for autoscaler tests, shaped like upstream's test fixtures.

Two fixture styles exist upstream and both are reproduced:
* replica_calculator_test.go: 2 containers per pod, each requesting the pod's `request` and
  each reporting the full `level` (so a pod requests and uses twice the numbers given);
* horizontal_test.go: 2 containers, each requesting half of the pod's request and each
  reporting `level // 2` (integer division, as `cpu/2` on a uint64 does).
Times default to Go's zero time, as upstream's unset `metav1.Time` values are.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from autoscaler.model.times import format_time_precise

NOW = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)
ZERO = "0001-01-01T00:00:00Z"
NAMESPACE = "test-namespace"
POD_PREFIX = "test-pod"
SELECTOR = "name=test-pod"


def ts(value: datetime | str) -> str:
    return value if isinstance(value, str) else format_time_precise(value)


def ago(seconds: float) -> str:
    return ts(NOW - timedelta(seconds=seconds))


def hot() -> str:
    """upstream's hotCPUCreationTime / timeNow(): started just now."""
    return ts(NOW)


def cool() -> str:
    """upstream's coolCPUCreationTime / time3MinsAgo(): started three minutes ago."""
    return ago(180)


def pod(index: int, *, requests: Sequence[str] | None = ("1.0",) * 2, phase: str = "Running",
        ready: str | None = "True", start: str | None = ZERO, ready_since: str | None = None,
        deleted: bool = False, name: str | None = None, resource: str = "cpu",
        labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A v1 Pod with one container per entry of `requests` (None: no request at all)."""
    containers = []
    for number, request in enumerate(requests or (), start=1):
        container: dict[str, Any] = {"name": f"container{number}", "image": "registry.k8s.io/pause"}
        if request is not None:
            container["resources"] = {"requests": {resource: request}}
        containers.append(container)
    metadata: dict[str, Any] = {"name": name or f"{POD_PREFIX}-{index}", "namespace": NAMESPACE,
                                "labels": labels if labels is not None else {"name": POD_PREFIX}}
    if deleted:
        metadata["deletionTimestamp"] = ts(NOW)
    status: dict[str, Any] = {"phase": phase}
    if start is not None:
        status["startTime"] = start
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": ready,
                                 "lastTransitionTime": ready_since or start or ZERO}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": containers}, "status": status}


def pod_list(pods: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"},
            "items": list(pods)}


def pod_metrics(levels: Sequence[Sequence[int]], *, timestamp: str = ZERO, window: str = "1m0s",
                names: Sequence[str] | None = None, resource: str = "cpu") -> dict[str, Any]:
    """metrics.k8s.io PodMetricsList; levels[i][j] is container j+1's usage of pod i (milli)."""
    items = []
    for index, containers in enumerate(levels):
        name = names[index] if names and index < len(names) else f"{POD_PREFIX}-{index}"
        items.append({
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"name": POD_PREFIX}},
            "timestamp": timestamp,
            "window": window,
            "containers": [{"name": f"container{j + 1}", "usage": {resource: f"{value}m"}}
                           for j, value in enumerate(containers)],
        })
    return {"kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1",
            "metadata": {}, "items": items}


def calc_levels(*levels: int) -> list[list[int]]:
    """makePodMetricLevels: both containers report the level."""
    return [[level, level] for level in levels]


def controller_levels(*levels: int) -> list[list[int]]:
    """horizontal_test.go's pod metrics: each container reports cpu/2."""
    return [[level // 2, level // 2] for level in levels]


def controller_pods(requests: Sequence[str], *, ready: Sequence[str] | None = None,
                    start: Sequence[str] | None = None, phase: Sequence[str] | None = None,
                    deleted: Sequence[bool] | None = None) -> list[dict[str, Any]]:
    """horizontal_test.go's pods: the request split over two containers; LTT = start time."""
    pods = []
    for index, request in enumerate(requests):
        half = f"{_milli(request) // 2}m"
        started = start[index] if start else ZERO
        pods.append(pod(index, requests=(half, half),
                        ready=ready[index] if ready else "True", start=started,
                        phase=phase[index] if phase else "Running",
                        deleted=deleted[index] if deleted else False))
    return pods


def _milli(quantity: str) -> int:
    from metricscale.core.quantity import milli_value

    return milli_value(quantity)


def custom_metrics(levels: Sequence[int], *, metric: str = "qps", timestamp: str = ZERO,
                   window_seconds: int | None = None) -> dict[str, Any]:
    """custom.metrics.k8s.io/v1beta2 MetricValueList for pods test-pod-<i>."""
    items = []
    for index, level in enumerate(levels):
        item: dict[str, Any] = {
            "describedObject": {"kind": "Pod", "namespace": NAMESPACE,
                                "name": f"{POD_PREFIX}-{index}", "apiVersion": "/v1"},
            "metric": {"name": metric},
            "timestamp": timestamp,
            "value": f"{level}m",
        }
        if window_seconds is not None:
            item["windowSeconds"] = window_seconds
        items.append(item)
    return {"kind": "MetricValueList", "apiVersion": "custom.metrics.k8s.io/v1beta2",
            "metadata": {}, "items": items}


def object_metric(level: int, *, kind: str = "Deployment", name: str = "some-deployment",
                  metric: str = "qps", timestamp: str = ZERO) -> dict[str, Any]:
    return {"kind": "MetricValueList", "apiVersion": "custom.metrics.k8s.io/v1beta2",
            "metadata": {}, "items": [{
                "describedObject": {"kind": kind, "namespace": NAMESPACE, "name": name,
                                    "apiVersion": "apps/v1"},
                "metric": {"name": metric}, "timestamp": timestamp, "value": f"{level}m"}]}


def external_metrics(levels: Sequence[int], *, metric: str = "qps",
                     timestamp: str = ZERO) -> dict[str, Any]:
    return {"kind": "ExternalMetricValueList", "apiVersion": "external.metrics.k8s.io/v1beta1",
            "metadata": {}, "items": [{"metricName": metric, "metricLabels": {"label": "value"},
                                       "timestamp": timestamp, "value": f"{level}m"}
                                      for level in levels]}


def cpu_utilization(target: int) -> dict[str, Any]:
    return {"type": "Resource",
            "resource": {"name": "cpu", "target": {"type": "Utilization",
                                                   "averageUtilization": target}}}


def pods_metric(average_value: str, metric: str = "qps") -> dict[str, Any]:
    return {"type": "Pods", "pods": {"metric": {"name": metric},
                                     "target": {"type": "AverageValue",
                                                "averageValue": average_value}}}


def object_value(value: str, metric: str = "qps") -> dict[str, Any]:
    return {"type": "Object", "object": {
        "describedObject": {"apiVersion": "apps/v1", "kind": "Deployment",
                            "name": "some-deployment"},
        "metric": {"name": metric}, "target": {"type": "Value", "value": value}}}


def object_average(value: str, metric: str = "qps") -> dict[str, Any]:
    return {"type": "Object", "object": {
        "describedObject": {"apiVersion": "apps/v1", "kind": "Deployment",
                            "name": "some-deployment"},
        "metric": {"name": metric, "selector": {}},
        "target": {"type": "AverageValue", "averageValue": value}}}


def external_value(value: str, metric: str = "qps",
                   selector: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "External", "external": {
        "metric": {"name": metric, "selector": selector if selector is not None else {}},
        "target": {"type": "Value", "value": value}}}


def external_average(value: str, metric: str = "qps",
                     selector: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "External", "external": {
        "metric": {"name": metric, "selector": selector if selector is not None else {}},
        "target": {"type": "AverageValue", "averageValue": value}}}


def rules(*, pods: int = 0, pods_period: int = 0, percent: int = 0, percent_period: int = 0,
          window: int | None = 0, select: str = "Max",
          tolerance: str | None = None) -> dict[str, Any]:
    """generateScalingRules."""
    out: dict[str, Any] = {"selectPolicy": select, "policies": []}
    if window is not None:
        out["stabilizationWindowSeconds"] = window
    if pods:
        out["policies"].append({"type": "Pods", "value": pods, "periodSeconds": pods_period})
    if percent:
        out["policies"].append({"type": "Percent", "value": percent,
                                "periodSeconds": percent_period})
    if tolerance is not None:
        out["tolerance"] = tolerance
    return out


def hpa(*, min_replicas: int | None = 2, max_replicas: int = 6, metrics: Sequence[Any] = (),
        behavior: dict[str, Any] | None = None, current: int = 3, desired: int | None = None,
        conditions: Sequence[dict[str, Any]] = (), last_scale_time: str | None = None,
        kind: str = "HorizontalPodAutoscaler", target_kind: str = "ReplicationController",
        target_api_version: str = "v1") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": target_api_version, "kind": target_kind,
                           "name": "test-rc"},
        "maxReplicas": max_replicas,
        "metrics": list(metrics),
    }
    if min_replicas is not None:
        spec["minReplicas"] = min_replicas
    if behavior is not None:
        spec["behavior"] = behavior
    status: dict[str, Any] = {"currentReplicas": current,
                              "desiredReplicas": current if desired is None else desired}
    if last_scale_time is not None:
        status["lastScaleTime"] = last_scale_time
    if conditions:
        status["conditions"] = list(conditions)
    api_version = "autoscaling/v2" if kind == "HorizontalPodAutoscaler" \
        else "metricscale.dev/v1alpha1"
    return {"apiVersion": api_version, "kind": kind,
            "metadata": {"name": "test-hpa", "namespace": NAMESPACE, "uid": "1234",
                         "resourceVersion": "42", "generation": 1},
            "spec": spec, "status": status}


def scale(spec_replicas: int, status_replicas: int | None = None,
          selector: str | None = SELECTOR) -> dict[str, Any]:
    status: dict[str, Any] = {"replicas": spec_replicas if status_replicas is None
                              else status_replicas}
    if selector is not None:
        status["selector"] = selector
    return {"apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": "test-rc", "namespace": NAMESPACE},
            "spec": {"replicas": spec_replicas}, "status": status}


def snapshot(*, autoscaler: dict[str, Any], scale_object: dict[str, Any],
             pods: Sequence[dict[str, Any]] = (), metrics: Sequence[Any] | None = None,
             history: dict[str, Any] | None = None, settings: dict[str, Any] | None = None,
             now: datetime = NOW) -> dict[str, Any]:
    out: dict[str, Any] = {
        "apiVersion": "metricscale.dev/v1alpha1",
        "kind": "DecisionSnapshot",
        "now": ts(now),
        "autoscaler": autoscaler,
        "scale": scale_object,
        "pods": pod_list(pods),
    }
    if metrics is not None:
        out["metrics"] = list(metrics)
    if history is not None:
        out["history"] = history
    if settings is not None:
        out["settings"] = settings
    return out


# upstream's controller tests run with these (defaultTesting* constants, scaleUpLimitFactor 8)
UPSTREAM_TEST_SETTINGS = {
    "tolerance": 0.1,
    "cpuInitializationPeriodSeconds": 120,
    "initialReadinessDelaySeconds": 10,
    "downscaleStabilizationWindowSeconds": 300,
    "scaleUpLimitFactor": 8.0,
    "scaleUpLimitMinimum": 4,
}

NO_RECOMMENDATIONS: dict[str, Any] = {"recommendations": []}
