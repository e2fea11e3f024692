"""What the autoscaler's HTTP-shell tests share: the Autoscaler objects and metric specs they
build, a rule for per-pod gauges, a short leader election and a poll helper. They run on the
real control plane (tests/autoscaler/real_cluster_support.py); the controller's logic on the
injected clock (tests/autoscaler/simulation.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from autoscaler.controller.leader import LeaderElectionConfig

NS = "shop"
GROUP, VERSION, PLURAL = "metricscale.dev", "v1alpha1", "autoscalers"


def pods_metric(name: str, average: str) -> dict[str, Any]:
    return {"type": "Pods", "pods": {"metric": {"name": name},
                                     "target": {"type": "AverageValue", "averageValue": average}}}


def cpu_metric(utilization: int) -> dict[str, Any]:
    return {"type": "Resource", "resource": {"name": "cpu", "target": {
        "type": "Utilization", "averageUtilization": utilization}}}


def autoscaler(name: str, *, target: str, metrics: list[dict[str, Any]], min_replicas: int = 1,
               max_replicas: int = 10, behavior: dict[str, Any] | None = None,
               annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                               "name": target},
                            "minReplicas": min_replicas, "maxReplicas": max_replicas,
                            "metrics": metrics}
    if behavior is not None:
        spec["behavior"] = behavior
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Autoscaler",
            "metadata": {"name": name, "namespace": NS, "annotations": dict(annotations or {})},
            "spec": spec}


async def until(check: Callable[[], object], *, what: str, within: float = 120.0) -> float:
    """Poll `check`; returns the monotonic time it first held. `within` is a guard against a
    hang, not a measure (the test's own timeout is 900 s)."""
    deadline = time.monotonic() + within
    while True:
        if check():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s: {what}")
        await asyncio.sleep(0.02)


def pods_rule(*, series_query: str, prefix: str, job: str) -> str:
    """One prometheus-adapter rule serving per-pod gauges of `job` as Pods metrics (the name
    without `prefix`), its metricsQuery pinned to the job (the e2e modules share a Prometheus).
    `series_query` is the inside of the seriesQuery's braces before the job."""
    return f"""\
- seriesQuery: '{{{series_query},job="{job}",namespace!="",pod!=""}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  name: {{matches: "^{prefix}(.*)$", as: "${{1}}"}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>,job="{job}"}}) by (<<.GroupBy>>)'
"""


def election(*, enabled: bool) -> LeaderElectionConfig:
    # The shortest timings the elector accepts (client-go's rules): a takeover within ~2 s.
    return LeaderElectionConfig(enabled=enabled, lease_duration=timedelta(seconds=2),
                                renew_deadline=timedelta(seconds=1.5),
                                retry_period=timedelta(seconds=1),
                                resource_name="metricscale-autoscaler",
                                resource_namespace="metricscale")
