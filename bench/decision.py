"""Benchmark: the median time of one autoscaler decision for 1,000 pods and 3 metrics.

Run: `.venv/bin/python bench/decision.py [--pods N] [--runs N]`. The inputs are parsed once
(as the controller keeps them parsed in its caches); what is timed is `decide()` followed by
`complete()` for a successful scale write: pod grouping, requests, the three metrics (cpu
utilization, a Pods metric, an External metric), stabilization, limits, conditions, status.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from autoscaler.decision.decide import SCALE_WRITE_SUCCEEDED, complete, decide
from autoscaler.decision.snapshot import Snapshot, parse_snapshot

NOW = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)


def _ts(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


def build_snapshot(pods: int) -> dict[str, Any]:
    """An autoscaler over `pods` pods with cpu, Pods and External metrics, as wire objects."""
    started = _ts(NOW - timedelta(hours=2))
    ready_since = _ts(NOW - timedelta(hours=2) + timedelta(seconds=20))
    pod_items = []
    usage_items = []
    custom_items = []
    for i in range(pods):
        name = f"web-7d9f8b6c5-{i:05d}"
        pod_items.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "shop",
                         "labels": {"app": "web", "pod-template-hash": "7d9f8b6c5"}},
            "spec": {"containers": [
                {"name": "web", "image": "registry.example.com/web:1",
                 "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}}},
                {"name": "proxy", "image": "registry.example.com/proxy:1",
                 "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}}]},
            "status": {"phase": "Running", "startTime": started,
                       "conditions": [{"type": "Ready", "status": "True",
                                       "lastTransitionTime": ready_since}]},
        })
        usage_items.append({
            "metadata": {"name": name, "namespace": "shop"},
            "timestamp": _ts(NOW - timedelta(seconds=5)), "window": "15s",
            "containers": [{"name": "web", "usage": {"cpu": f"{200 + i % 90}m",
                                                     "memory": "200Mi"}},
                           {"name": "proxy", "usage": {"cpu": "20m", "memory": "30Mi"}}]})
        custom_items.append({
            "describedObject": {"kind": "Pod", "namespace": "shop", "name": name,
                                "apiVersion": "/v1"},
            "metric": {"name": "http_requests_per_second"},
            "timestamp": _ts(NOW - timedelta(seconds=3)), "windowSeconds": 60,
            "value": f"{9000 + (i * 37) % 4000}m"})
    return {
        "apiVersion": "metricscale.dev/v1alpha1", "kind": "DecisionSnapshot", "now": _ts(NOW),
        "autoscaler": {
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "minReplicas": 10, "maxReplicas": 5000,
                "metrics": [
                    {"type": "Resource", "resource": {"name": "cpu", "target": {
                        "type": "Utilization", "averageUtilization": 60}}},
                    {"type": "Pods", "pods": {"metric": {"name": "http_requests_per_second"},
                                              "target": {"type": "AverageValue",
                                                         "averageValue": "10"}}},
                    {"type": "External", "external": {
                        "metric": {"name": "queue_depth",
                                   "selector": {"matchLabels": {"queue": "web"}}},
                        "target": {"type": "Value", "value": "50k"}}},
                ],
            },
            "status": {"currentReplicas": pods, "desiredReplicas": pods},
        },
        "scale": {"apiVersion": "autoscaling/v1", "kind": "Scale",
                  "metadata": {"name": "web", "namespace": "shop"},
                  "spec": {"replicas": pods},
                  "status": {"replicas": pods, "selector": "app=web"}},
        "pods": {"apiVersion": "v1", "kind": "PodList", "items": pod_items},
        "metrics": [
            {"kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1",
             "items": usage_items},
            {"kind": "MetricValueList", "apiVersion": "custom.metrics.k8s.io/v1beta2",
             "items": custom_items},
            {"kind": "ExternalMetricValueList", "apiVersion": "external.metrics.k8s.io/v1beta1",
             "items": [{"metricName": "queue_depth", "metricLabels": {"queue": "web"},
                        "timestamp": _ts(NOW), "value": "42k"}]},
        ],
        "history": {"recommendations": [
            {"timestamp": _ts(NOW - timedelta(seconds=s)), "replicas": pods}
            for s in range(15, 300, 15)]},
    }


def one_decision(snapshot: Snapshot) -> int:
    decision = decide(autoscaler=snapshot.autoscaler, scale=snapshot.scale, pods=snapshot.pods,
                      metrics=snapshot.metrics, history=snapshot.history, now=snapshot.now,
                      settings=snapshot.settings)
    decision = complete(decision, write_result=SCALE_WRITE_SUCCEEDED,
                        settings=snapshot.settings, now=snapshot.now)
    return decision.desired_replicas


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    snapshot = parse_snapshot(build_snapshot(args.pods))
    desired = one_decision(snapshot)
    for _ in range(20):  # warm up
        one_decision(snapshot)
    timings = []
    for _ in range(args.runs):
        start = time.perf_counter()
        one_decision(snapshot)
        timings.append(time.perf_counter() - start)
    median_ms = statistics.median(timings) * 1000
    print(f"one decision, {args.pods} pods, 3 metrics: median {median_ms:.3f} ms "
          f"(p90 {statistics.quantiles(timings, n=10)[-1] * 1000:.3f} ms, "
          f"{args.runs} runs; desired {desired} of {args.pods})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
