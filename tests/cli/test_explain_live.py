"""`metricscale explain --live NAMESPACE/NAME` against the session's real control plane, with
metricscale installed (tests/cluster/conftest.py's `installation`: the CRD, the adapter over the
session's Prometheus, and the autoscaler as the controller): it captures the same inputs a
reconcile reads, with the persisted history, and explains the controller's decision."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from testbed.controlplane import ControlPlane, Kubelet
from testbed.fakes.exporter import Exporter
from testbed.install import NAMESPACE, Installation
from testbed.load import Load
from tests.cluster.support import deployment, until
from tests.cluster.test_upstream_hpa_twins import served

GROUP, VERSION, PLURAL = "metricscale.dev", "v1alpha1", "autoscalers"


def pods_metric(name: str, average: str) -> dict[str, Any]:
    return {"type": "Pods", "pods": {"metric": {"name": name},
                                     "target": {"type": "AverageValue", "averageValue": average}}}


def autoscaler(namespace: str, name: str, *, target: str, metrics: list[dict[str, Any]],
               max_replicas: int) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Autoscaler",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": target},
                     "minReplicas": 1, "maxReplicas": max_replicas, "metrics": metrics}}


def status_of(cluster: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    obj = cluster.get(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}")
    return dict(obj.get("status") or {})


def replicas_of(cluster: ControlPlane, namespace: str, name: str) -> int:
    obj = cluster.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
    return int(obj["spec"].get("replicas", 0))


def current_average(status: dict[str, Any]) -> str | None:
    """The Pods metric's current average in the controller's status."""
    for item in status.get("currentMetrics") or []:
        if item.get("type") == "Pods":
            return str(item["pods"]["current"].get("averageValue"))
    return None


def running(cluster: ControlPlane, namespace: str, selector: str) -> list[str]:
    """The Running pods of `selector` (the kubelet stand-in runs them once scheduled)."""
    pods = cluster.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")
    return sorted(p["metadata"]["name"] for p in pods["items"]
                  if (p.get("status") or {}).get("phase") == "Running")


async def test_explain_live_captures_the_inputs_and_history_and_agrees_with_the_controller(
        installation: Installation, kubelet: Kubelet, exporter: Exporter, namespace: str,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = installation.cluster
    saved = tmp_path / "snapshot.json"
    cluster.apply(deployment(namespace, replicas=2))
    # 60 requests spread over web's Ready pods, served by the adapter as a Pods metric.
    with Load(cluster, kubelet, namespace=namespace, selector={"app": "web"},
              exporter=exporter, metric="http_requests", metric_total=60) as web:
        cluster.apply(autoscaler(namespace, "web", target="web",
                                 metrics=[pods_metric("http_requests", "10")], max_replicas=6))
        # Settled, and reconciled once settled: six pods at 10 each, and a reconcile that read
        # them (the scale-up to 6 was decided from two pods at 30; explain run on the heels of
        # that one would read other inputs than it did).
        def settled() -> bool:
            status = status_of(cluster, namespace, "web")
            return (replicas_of(cluster, namespace, "web") == 6 and len(web.ready_pods()) == 6
                    and status.get("currentReplicas") == 6 and current_average(status) == "10")

        await until(settled, what="the controller settled at 6")
        # Unlike the fake's in-process controller, the installed one is not stopped first: it
        # keeps reconciling, and once settled each reconcile reads the same inputs as the last.
        status = status_of(cluster, namespace, "web")
        capsys.readouterr()
        code = await asyncio.to_thread(main, [
            "explain", "--live", f"{namespace}/web", "--kubeconfig", str(cluster.kubeconfig),
            "--lease-namespace", NAMESPACE, "--save-snapshot", str(saved)])
    out = capsys.readouterr().out
    assert code == 0
    decision = json.loads(out)
    # The controller's last decision, and explain's from the same inputs.
    assert decision["desiredReplicas"] == status["desiredReplicas"] == 6
    assert decision["scaleUpdated"] is False
    # The installed controller, the leader, published its settings on its Lease.
    assert decision["settingsSource"] == "controller"
    assert [m["current"] for m in decision["metrics"]] == ["10"] == [
        m["pods"]["current"]["averageValue"] for m in status["currentMetrics"]]
    snapshot = json.loads(saved.read_text())
    assert snapshot["kind"] == "DecisionSnapshot"
    assert snapshot["scale"]["spec"]["replicas"] == 6
    assert len(snapshot["pods"]["items"]) == 6
    assert snapshot["metrics"][0]["kind"] == "MetricValueList"
    # The persisted history, read back as a new leader would: the last recommendation counts
    # as made now.
    recommendations = snapshot["history"]["recommendations"]
    assert recommendations[-1] == {"timestamp": snapshot["now"], "replicas": 6}


async def test_explain_live_names_what_it_could_not_read(
        installation: Installation, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = installation.cluster.kubeconfig
    code = await asyncio.to_thread(main, ["explain", "--live", f"{namespace}/missing",
                                          "--kubeconfig", str(kubeconfig)])
    assert code == 2
    assert f'cannot read Autoscaler {namespace}/missing: autoscalers.metricscale.dev ' \
           '"missing" not found' in capsys.readouterr().err
    assert await asyncio.to_thread(main, ["explain", "--live", "no-slash"]) == 2


async def test_explain_live_without_published_settings_says_defaults_are_assumed(
        installation: Installation, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = installation.cluster
    cluster.apply(autoscaler(namespace, "web", target="web",
                             metrics=[pods_metric("http_requests", "10")], max_replicas=6))
    # The session's installed controller publishes its settings on its Lease in the
    # installation's namespace; the test's own namespace has no Lease, as a cluster without a
    # controller has none.
    lease = ["--lease-namespace", namespace]
    await asyncio.to_thread(main, ["explain", "--live", f"{namespace}/web", "--kubeconfig",
                                   str(cluster.kubeconfig), *lease, "-o", "text"])
    assert "no settings published by the controller; upstream defaults are assumed" in \
        capsys.readouterr().out
    await asyncio.to_thread(main, ["explain", "--live", f"{namespace}/web", "--kubeconfig",
                                   str(cluster.kubeconfig), *lease,
                                   "--horizontal-pod-autoscaler-downscale-stabilization", "20s"])
    assert json.loads(capsys.readouterr().out)["settingsSource"] == "flags"


async def test_explain_live_redoes_the_owner_based_pod_selection_with_the_replica_sets(
        installation: Installation, kubelet: Kubelet, exporter: Exporter, namespace: str,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """KEP-5325: the capture holds the namespace's ReplicaSets, so explain picks web's own pods
    out of the selector's (a Job's pod sharing the labels is left out) as the controller does."""
    cluster = installation.cluster
    saved = tmp_path / "snapshot.json"
    labels = {"app": "web"}
    # The real deployment controller makes web's ReplicaSet (named by its template's hash, not
    # web-1 as the fake's test wrote it) and its two pods.
    cluster.apply(deployment(namespace, replicas=2))
    # A Job, and a pod it controls carrying web's labels. No job controller runs in the test
    # bed (testbed.controlplane.CONTROLLERS), so the Job makes no pod of its own; the owner must
    # exist all the same, or the garbage collector deletes the pod.
    container = {"name": "migrate", "image": "registry.invalid/migrate:1"}
    job = cluster.apply({"apiVersion": "batch/v1", "kind": "Job",
                         "metadata": {"name": "migrate", "namespace": namespace},
                         "spec": {"template": {"metadata": {"labels": labels}, "spec": {
                             "restartPolicy": "Never", "containers": [container]}}}})
    cluster.apply({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "migrate-x", "namespace": namespace, "labels": labels,
                                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                                     "name": "migrate", "controller": True,
                                                     "uid": job["metadata"]["uid"]}]},
                   "spec": {"restartPolicy": "Never", "containers": [container]}})
    await until(lambda: len(running(cluster, namespace, "app=web")) == 3,
                what="web's two pods and the Job's running")
    web_pods = [p for p in running(cluster, namespace, "app=web") if p != "migrate-x"]
    # web's pods at the target, the Job's busy: counted, (10 + 10 + 70) / 3 = 30 a pod.
    for pod, value in [*((p, 10) for p in web_pods), ("migrate-x", 70)]:
        exporter.set("rps", {"namespace": namespace, "pod": pod}, Decimal(value), type="gauge")
    await until(lambda: served(
        cluster, f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/rps", 3),
        what="rps served for the three pods")
    obj = autoscaler(namespace, "web", target="web", metrics=[pods_metric("rps", "10")],
                     max_replicas=10)
    obj["spec"]["podSelectionStrategy"] = "OwnerReferences"
    cluster.apply(obj)
    capsys.readouterr()
    code = await asyncio.to_thread(main, [
        "explain", "--live", f"{namespace}/web", "--kubeconfig", str(cluster.kubeconfig),
        "--save-snapshot", str(saved)])
    decision = json.loads(capsys.readouterr().out)
    assert code == 0
    assert decision["ignoredPods"] == 1
    assert decision["desiredReplicas"] == 2  # the Job's load is left out: the size holds
    assert any(line.startswith("Pod selection (OwnerReferences, KEP-5325): 2 of the "
                               "selector's 3 pods count: 1 not owned by Deployment/web")
               for line in decision["explanation"])
    snapshot = json.loads(saved.read_text())
    replica_sets = cluster.get(f"/apis/apps/v1/namespaces/{namespace}/replicasets")["items"]
    assert [rs["metadata"]["name"] for rs in snapshot["replicaSets"]] == [
        rs["metadata"]["name"] for rs in replica_sets] and len(replica_sets) == 1
