"""A reconcile that runs before the watch has delivered the previous reconcile's status write
decides from that write, not from the older cached status: a transition is reported once.

(An annotation change enqueues an immediate sync; the periodic sync can come due while it
runs, and on a busy machine both run before the watch brings the first one's status back.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from autoscaler.controller.reconciler import Reconciler
from autoscaler.controller.watching import AutoscalerKey, project_pod
from autoscaler.decision.settings import Settings
from testbed.fakes.kube_objects import Container, pod
from tests.autoscaler.controller_support import MemoryCaches, MemoryKube, MemoryMetrics

T0 = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)
NS = "shop"
QPS = {"type": "Pods", "pods": {"metric": {"name": "qps"},
                                "target": {"type": "AverageValue", "averageValue": "10"}}}


def paused_autoscaler() -> dict[str, Any]:
    return {"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
            "metadata": {"name": "web", "namespace": NS, "uid": "uid-web", "generation": 1,
                         "resourceVersion": "7",
                         "annotations": {"metricscale.dev/paused-scale-in": "true"}},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": "web"},
                     "minReplicas": 1, "maxReplicas": 10, "metrics": [QPS],
                     "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}}}


async def test_back_to_back_syncs_before_the_watch_catches_up_report_a_pause_once() -> None:
    caches = MemoryCaches()
    kube = MemoryKube(caches, lagging_watch=True)
    metrics = MemoryMetrics()
    caches.put(paused_autoscaler())
    kube.set_scale(NS, "web", replicas=4, selector="app=web")
    for index in range(4):
        caches.add_pod(project_pod(pod(f"web-{index}", namespace=NS,
                                       now=T0 - timedelta(hours=1), labels={"app": "web"},
                                       containers=(Container(cpu_request="500m"),))))
    metrics.pod_values["qps"] = {f"web-{i}": "5" for i in range(4)}  # asks for 2: held
    reconciler = Reconciler(kube=kube, metrics=metrics, watching=caches, settings=Settings())
    key = AutoscalerKey("Autoscaler", NS, "web")

    await reconciler.reconcile_once(key, T0)
    await reconciler.reconcile_once(key, T0 + timedelta(milliseconds=27))

    paused = [e.reason for e in kube.events if e.reason.endswith("Paused")]
    assert paused == ["ScaleInPaused"], [e.reason for e in kube.events]
    assert kube.count("write_status") == 1  # the second sync found nothing new to write


async def test_once_the_watch_brings_a_newer_version_the_cache_is_the_truth_again() -> None:
    caches = MemoryCaches()
    kube = MemoryKube(caches, lagging_watch=True)
    metrics = MemoryMetrics()
    caches.put(paused_autoscaler())
    kube.set_scale(NS, "web", replicas=4, selector="app=web")
    for index in range(4):
        caches.add_pod(project_pod(pod(f"web-{index}", namespace=NS,
                                       now=T0 - timedelta(hours=1), labels={"app": "web"},
                                       containers=(Container(cpu_request="500m"),))))
    metrics.pod_values["qps"] = {f"web-{i}": "5" for i in range(4)}
    reconciler = Reconciler(kube=kube, metrics=metrics, watching=caches, settings=Settings())
    key = AutoscalerKey("Autoscaler", NS, "web")
    await reconciler.reconcile_once(key, T0)
    (_, _, written), = kube.status_writes
    # The watch delivers the write, then the user's removal of the annotation.
    resumed = paused_autoscaler()
    resumed["metadata"].update(resourceVersion="9", annotations={})
    resumed["status"] = dict(written)
    caches.put(resumed)
    await reconciler.reconcile_once(key, T0 + timedelta(seconds=15))
    assert [e.reason for e in kube.events] == ["ScaleInPaused", "Resumed", "SuccessfulRescale"]
