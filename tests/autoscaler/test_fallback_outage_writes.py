"""A steady metrics outage writes nothing: once a metric falls back, every further sync of the
same outage leaves the status (and a native HPA's history annotation) alone, as in any steady
state; the failed reads go on being counted in the controller's memory and its /metrics.

The reconciler runs against the in-memory doubles of the Kubernetes and metrics APIs, with the
clock handed in (no sleeps)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from autoscaler.controller.reconciler import Reconciler
from autoscaler.controller.stats import ControllerMetrics
from autoscaler.controller.watching import AutoscalerKey, project_pod
from autoscaler.decision.persistence import HISTORY_ANNOTATION
from autoscaler.decision.settings import Settings
from autoscaler.kube.metrics_api import MetricsError
from autoscaler.model.history import parse_history
from testbed.fakes.kube_objects import Container, pod
from tests.autoscaler.controller_support import MemoryCaches, MemoryKube, MemoryMetrics

T0 = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)
NS = "shop"
SYNC = timedelta(seconds=15)
THRESHOLD = 3
FALLBACK_QPS = {"type": "Pods", "pods": {
    "metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "10"},
    "fallback": {"replicas": 5, "failureThreshold": THRESHOLD}}}
KINDS = {"Autoscaler": "metricscale.dev/v1alpha1", "HorizontalPodAutoscaler": "autoscaling/v2"}


def autoscaler(kind: str) -> dict[str, Any]:
    return {"apiVersion": KINDS[kind], "kind": kind,
            "metadata": {"name": "web", "namespace": NS, "uid": "uid-web", "generation": 1,
                         "annotations": {}},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": "web"},
                     "minReplicas": 1, "maxReplicas": 10, "metrics": [FALLBACK_QPS]}}


class Outage:
    """Deployment `web` at 2 pods, an autoscaler on it, and the custom metrics API down."""

    def __init__(self, kind: str) -> None:
        self.key = AutoscalerKey(kind, NS, "web")
        self.caches = MemoryCaches()
        self.kube = MemoryKube(self.caches)
        self.metrics = MemoryMetrics()
        self.registry = CollectorRegistry()
        self.caches.put(autoscaler(kind))
        self.kube.set_scale(NS, "web", replicas=2, selector="app=web")
        for index in range(2):
            self.caches.add_pod(project_pod(pod(
                f"web-{index}", namespace=NS, now=T0 - timedelta(hours=1),
                labels={"app": "web"}, containers=(Container(cpu_request="500m"),))))
        self.metrics.errors["qps"] = MetricsError(
            "the server is currently unable to handle the request", api="custom")
        self.reconciler = Reconciler(kube=self.kube, metrics=self.metrics,
                                     watching=self.caches, settings=Settings(),
                                     controller_metrics=ControllerMetrics(self.registry))
        self.syncs = 0

    async def sync(self) -> None:
        result = await self.reconciler.reconcile_once(self.key, T0 + self.syncs * SYNC)
        assert not result.failed
        self.syncs += 1

    def writes(self) -> list[str]:
        return [call for call in self.kube.calls
                if call in ("write_status", "patch_annotations", "update_scale")]

    def persisted_failures(self) -> list[tuple[int, int, str]]:
        entry = self.caches.get(self.key)
        assert entry is not None
        if self.key.kind == "HorizontalPodAutoscaler":
            raw = entry.annotations[HISTORY_ANNOTATION]
            history = parse_history(json.loads(raw))
        else:
            history = parse_history(entry.status["history"])
        return [(f.metric, f.failures, f.since.isoformat()) for f in history.metric_failures]

    def fallback_condition(self) -> tuple[str, str, str]:
        entry = self.caches.get(self.key)
        assert entry is not None
        (found,) = [(c["status"], c["reason"], c["message"])
                    for c in entry.status.get("conditions", []) if c["type"] == "Fallback"]
        return found


@pytest.mark.parametrize("kind", list(KINDS))
async def test_a_steady_outage_makes_no_status_write(kind: str) -> None:
    outage = Outage(kind)
    for _ in range(THRESHOLD):  # the failed reads before the fallback, each one written
        await outage.sync()
    # The fallback's 5, at most doubling per sync without spec.behavior: 2 -> 4 -> 5.
    await outage.sync()
    assert outage.kube.replicas(NS, "web") == 5
    # The sync after the last rescale records the new size (status.currentReplicas) once.
    await outage.sync()
    outage.kube.calls.clear()
    outage.kube.events.clear()

    for _ in range(40):  # 40 more failed reads of the same outage
        await outage.sync()

    assert outage.writes() == []
    # Upstream records a Warning for every failed metric read (the API server aggregates
    # them); nothing else is sent.
    assert [c for c in outage.kube.calls if c != "create_event"] == ["get_scale"] * 40
    assert {e.reason for e in outage.kube.events} == {"FailedGetPodsMetric"}
    assert outage.fallback_condition() == (
        "True", "FallbackActive",
        "metric 0 failed 3 or more reads in a row and proposes 5 replicas (fallback static)")
    # What is persisted still decides as the memory does: the same outage, past its threshold.
    [(metric, failures, since)] = outage.persisted_failures()
    assert (metric, since) == (0, T0.isoformat()) and failures >= THRESHOLD
    # The count goes on in memory (what a decision and `explain` see) and on /metrics.
    history = outage.reconciler.history_of(outage.key)
    assert history is not None and history.metric_failures[0].failures == outage.syncs
    assert outage.registry.get_sample_value(
        "metricscale_autoscaler_metric_read_failures",
        {"namespace": NS, "autoscaler": "web", "metric": "0"}) == outage.syncs


async def test_each_failed_read_before_the_threshold_is_written() -> None:
    outage = Outage("Autoscaler")
    counts = []
    for _ in range(THRESHOLD - 1):
        await outage.sync()
        counts.append(outage.persisted_failures()[0][1])
    assert counts == [1, 2]  # a new leader must know how close the fallback is


async def test_a_new_leader_takes_the_outage_over_and_writes_nothing_either() -> None:
    outage = Outage("Autoscaler")
    for _ in range(THRESHOLD + 5):
        await outage.sync()
    # Another replica takes over: it reads the persisted history back.
    outage.reconciler = Reconciler(kube=outage.kube, metrics=outage.metrics,
                                   watching=outage.caches, settings=Settings())
    await outage.sync()  # the new leader's first sync records its recommendation once
    outage.kube.calls.clear()
    for _ in range(10):
        await outage.sync()
    assert outage.writes() == []
    assert outage.kube.replicas(NS, "web") == 5
    history = outage.reconciler.history_of(outage.key)
    assert history is not None and history.metric_failures[0].since == T0
