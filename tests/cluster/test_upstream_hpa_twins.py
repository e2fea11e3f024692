"""Upstream's HPA controller as a live oracle: twin Deployments under the same load, one scaled
by a native autoscaling/v2 HorizontalPodAutoscaler (kube-controller-manager's own controller,
reading our adapter through the aggregator), the other by a metricscale Autoscaler with the same
spec. Their replica sequences must match step for step, each step within one sync period of
its twin's, and upstream's HPA must accept every answer our adapter gives.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest

from testbed.controlplane import ControlPlane, Kubelet
from testbed.fakes.exporter import Exporter
from testbed.install import Installation
from testbed.load import Load
from testbed.watching import ValueWatch, deployment_replicas

SYNC_SECONDS = 5.0
# What separates the twins' reactions besides their sync phases: a scrape (1 s) and the
# adapter's answer, on a machine other tests keep busy.
PIPELINE_SLACK = 3.0

BEHAVIOR = {
    "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                "policies": [{"type": "Pods", "value": 2, "periodSeconds": 10}]},
    "scaleDown": {"stabilizationWindowSeconds": 20, "selectPolicy": "Max",
                  "policies": [{"type": "Percent", "value": 50, "periodSeconds": 10}]},
}


# CPU reaches the controllers through a rate over a window (30 s here), so after a load step the
# measured utilization ramps for a window, and a controller samples the ramp at its own sync
# phase: with room for several pods a step, two correct controllers may take different
# intermediate sizes. One pod a period leaves each step a single possible size.
ONE_AT_A_TIME = {
    "scaleUp": {"stabilizationWindowSeconds": 0,
                "policies": [{"type": "Pods", "value": 1, "periodSeconds": 10}]},
    "scaleDown": {"stabilizationWindowSeconds": 20,
                  "policies": [{"type": "Pods", "value": 1, "periodSeconds": 10}]},
}


def deployment(name: str, namespace: str, *, replicas: int) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{
                                      "name": "app", "image": "registry.invalid/app:1",
                                      "resources": {"requests": {"cpu": "500m",
                                                                 "memory": "64Mi"}}}]}}}}


def scaler_spec(target: str, metrics: list[dict[str, Any]],
                behavior: dict[str, Any], *, max_replicas: int = 10) -> dict[str, Any]:
    return {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "minReplicas": 1, "maxReplicas": max_replicas, "metrics": metrics,
            "behavior": behavior}


async def until(check: Callable[[], bool], *, what: str, within: float = 240,
                diagnose: Callable[[], str] = lambda: "") -> None:
    """Waits for a condition (the bound only keeps a broken run from hanging)."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within:.0f} s: {what}\n{diagnose()}")
        await asyncio.sleep(0.25)


def describe(cluster: ControlPlane, namespace: str, *, pods: bool = False) -> str:
    hpa = cluster.kubectl("-n", namespace, "describe", "hpa", "upstream", check=False)
    ours = cluster.kubectl("-n", namespace, "describe", "msa", "ours", check=False)
    raw = cluster.kubectl("get", "--raw",
                          f"/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods",
                          check=False)
    text = f"{hpa.stdout}{hpa.stderr}\n{ours.stdout}{ours.stderr}\n{raw.stdout}{raw.stderr}"
    if pods:
        listed = cluster.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        text += "\n" + "\n".join(
            f"{p['metadata']['name']} created {p['metadata']['creationTimestamp']} ready "
            + ",".join(c["lastTransitionTime"] for c in p["status"].get("conditions", [])
                       if c["type"] == "Ready") for p in listed)
    return text


def served(cluster: ControlPlane, path: str, count: int) -> bool:
    result = cluster.kubectl("get", "--raw", path, check=False)
    if result.returncode != 0:
        return False
    return len(json.loads(result.stdout).get("items", [])) == count


def past_initial_window(cluster: ControlPlane, namespace: str, *, window: float) -> bool:
    """Every pod's newest sample was taken a full window after the pod became Ready: before
    that, upstream discards a new pod's CPU sample (its cpu initialization period), and with
    every pod that new it has no sample left and reports FailedGetResourceMetric."""
    metrics = cluster.get(f"/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods")
    stamps = {m["metadata"]["name"]: parse_time(m["timestamp"]) for m in metrics["items"]}
    for pod in cluster.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        ready = [c for c in pod["status"].get("conditions", []) if c["type"] == "Ready"]
        name = pod["metadata"]["name"]
        if not ready or name not in stamps:
            return False
        if stamps[name] < parse_time(ready[0]["lastTransitionTime"]) + window:
            return False
    return True


def parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def compare(replicas: ValueWatch, upstream: str, ours: str,
            diagnose: Callable[[], str] = lambda: "") -> None:
    theirs, mine = replicas.sequence(upstream), replicas.sequence(ours)
    counts = ([n for _, n in theirs], [n for _, n in mine])
    assert counts[0] == counts[1], f"upstream's HPA went {counts[0]}, ours went {counts[1]}"
    offsets = [round(b - a, 1) for (a, _), (b, _) in zip(theirs[1:], mine[1:], strict=True)]
    late = [o for o in offsets if abs(o) > SYNC_SECONDS + PIPELINE_SLACK]
    assert not late, (f"steps {counts[0]}: ours trailed or led upstream's by {offsets} s, "
                      f"more than one sync period ({SYNC_SECONDS:.0f} s)\n{theirs}\n{mine}\n"
                      f"{diagnose()}")


def failed_metric_events(cluster: ControlPlane, namespace: str) -> list[str]:
    events = cluster.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return [f"{e['reason']}: {e.get('message', '')}" for e in events
            if str(e.get("reason", "")).startswith("FailedGet")
            or e.get("reason") == "FailedComputeMetricsReplicas"]


@pytest.fixture
async def twins(installation: Installation, namespace: str) -> Any:
    cluster = installation.cluster
    for name in ("upstream", "ours"):
        cluster.apply(deployment(name, namespace, replicas=2))
    with deployment_replicas(cluster, namespace) as replicas:
        yield cluster, replicas


def create_scalers(cluster: ControlPlane, namespace: str, metrics: list[dict[str, Any]], *,
                   behavior: dict[str, Any] = BEHAVIOR, max_replicas: int = 10) -> None:
    cluster.apply({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                   "metadata": {"name": "upstream", "namespace": namespace},
                   "spec": scaler_spec("upstream", metrics, behavior,
                                       max_replicas=max_replicas)})
    cluster.apply({"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
                   "metadata": {"name": "ours", "namespace": namespace},
                   "spec": scaler_spec("ours", metrics, behavior, max_replicas=max_replicas)})


async def run_profile(replicas: ValueWatch, loads: list[Load],
                      steps: list[tuple[dict[str, Any], int]]) -> None:
    cluster = loads[0].cluster
    namespace = loads[0].namespace
    for load_settings, expected in steps:
        for load in loads:
            load.set(**load_settings)
        for name in ("upstream", "ours"):
            await until(lambda name=name, expected=expected:  # type: ignore[misc]
                        replicas.now(name) == expected,
                        what=f"{name} at {expected} replicas under {load_settings}",
                        diagnose=lambda name=name: (  # type: ignore[misc]
                            f"sequence {replicas.sequence(name)}\n"
                            f"{describe(cluster, namespace)}"))


async def test_a_pods_and_an_external_metric_scale_both_twins_alike(
        twins: tuple[ControlPlane, ValueWatch], kubelet: Kubelet, exporter: Exporter,
        namespace: str) -> None:
    cluster, replicas = twins
    exporter.set("queue_depth", {"namespace": namespace, "queue": "orders"}, 30, type="gauge")
    with Load(cluster, kubelet, namespace=namespace, selector={"app": "upstream"},
              exporter=exporter, metric="jobs_in_flight", metric_total=20) as upstream, \
            Load(cluster, kubelet, namespace=namespace, selector={"app": "ours"},
                 exporter=exporter, metric="jobs_in_flight", metric_total=20) as ours:
        base = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/"
        await until(lambda: served(cluster, base + "jobs_in_flight", 4),
                    what="jobs_in_flight served for the four pods")
        external = (f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/queue_depth"
                    "?labelSelector=queue%3Dorders")
        await until(lambda: served(cluster, external, 1), what="queue_depth served")
        create_scalers(cluster, namespace, [
            {"type": "Pods", "pods": {"metric": {"name": "jobs_in_flight"},
                                      "target": {"type": "AverageValue", "averageValue": "10"}}},
            {"type": "External", "external": {
                "metric": {"name": "queue_depth", "selector": {"matchLabels": {"queue": "orders"}}},
                "target": {"type": "AverageValue", "averageValue": "20"}}},
        ])
        # 20 in flight over 2 pods: on target. Then 70: 7 pods, two at a time. Then 15: down to
        # 2 (the queue, 30 at 20 a pod, holds at least 2), 50% a period after the window.
        await run_profile(replicas, [upstream, ours], [
            ({"metric_total": 20}, 2), ({"metric_total": 70}, 7), ({"metric_total": 15}, 2)])
    compare(replicas, "upstream", "ours", lambda: describe(cluster, namespace, pods=True))
    assert failed_metric_events(cluster, namespace) == []


async def test_cpu_utilization_through_metrics_k8s_io_scales_both_twins_alike(
        twins: tuple[ControlPlane, ValueWatch], kubelet: Kubelet, namespace: str) -> None:
    cluster, replicas = twins
    with Load(cluster, kubelet, namespace=namespace, selector={"app": "upstream"},
              cpu="0.5") as upstream, \
            Load(cluster, kubelet, namespace=namespace, selector={"app": "ours"},
                 cpu="0.5") as ours:
        path = f"/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods"
        await until(lambda: served(cluster, path, 4), what="the four pods in metrics.k8s.io")
        await until(lambda: past_initial_window(cluster, namespace, window=30),
                    what="samples taken a window after the pods became Ready")
        create_scalers(cluster, namespace, [
            {"type": "Resource", "resource": {"name": "cpu", "target": {
                "type": "Utilization", "averageUtilization": 50}}}], behavior=ONE_AT_A_TIME,
            max_replicas=6)
        # 0.5 cores on 2 pods of 500m: 50%, the centre of the tolerance. 2 cores: up one pod a
        # period to the maximum, 6, above the tolerance at every size on the way: a new pod
        # reads as using nothing until a window after it became Ready (upstream's CPU
        # initialization), so with 1.5 cores 5 pods came to hover at the edge of the tolerance
        # while the older pods' rates fell, and the twins stepped to 6 up to 20 s apart (a CI
        # run). 0.4 cores: down to 2 (one a period once the window has passed).
        await run_profile(replicas, [upstream, ours], [
            ({"cpu": Decimal("0.5")}, 2), ({"cpu": Decimal("2")}, 6),
            ({"cpu": Decimal("0.4")}, 2)])
    compare(replicas, "upstream", "ours", lambda: describe(cluster, namespace, pods=True))
    assert failed_metric_events(cluster, namespace) == []
