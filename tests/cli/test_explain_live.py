"""`metricscale explain --live NAMESPACE/NAME` against the fake API server: it captures the same
inputs a reconcile reads, with the persisted history, and explains the controller's decision."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path

import pytest

from cli.main import main
from testbed.fakes.kube_api import FakeKubeAPI
from tests.autoscaler.fake_cluster import (
    GROUP,
    NS,
    PLURAL,
    VERSION,
    MetricsBackend,
    Workload,
    autoscaler,
    controller,
    pods_metric,
    replicas_of,
    status_of,
    until,
)

# Every test here runs against the fake API server with the Autoscaler CRD.
pytestmark = pytest.mark.usefixtures("autoscaler_api")


def current_average(fake: FakeKubeAPI) -> str | None:
    """The Pods metric's current average in the controller's status."""
    for item in status_of(fake, "web").get("currentMetrics") or []:
        if item.get("type") == "Pods":
            return str(item["pods"]["current"].get("averageValue"))
    return None


async def test_explain_live_captures_the_inputs_and_history_and_agrees_with_the_controller(
        fake_kube: FakeKubeAPI, metrics_backend: MetricsBackend, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = fake_kube.write_kubeconfig(tmp_path / "kubeconfig")
    saved = tmp_path / "snapshot.json"
    async with Workload(fake_kube, "web", replicas=2, total=Decimal(60),
                        publish=metrics_backend.publisher("http_requests")) as web:
        fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
            "web", target="web", metrics=[pods_metric("http_requests", "10")], max_replicas=6))
        async with controller(fake_kube):
            # Settled, and reconciled once settled: six pods at 10 each, and a reconcile that
            # read them (the scale-up to 6 was decided from two pods at 30; explain run on the
            # heels of that one would read other inputs than it did). Nothing changes after the
            # controller stops, so explain reads what its last reconcile read.
            await until(lambda: replicas_of(fake_kube, "web") == 6 and len(web.pods()) == 6
                        and status_of(fake_kube, "web").get("currentReplicas") == 6
                        and current_average(fake_kube) == "10",
                        what=f"the controller settled at 6, have {status_of(fake_kube, 'web')}")
        status = status_of(fake_kube, "web")
        capsys.readouterr()
        code = await asyncio.to_thread(main, [
            "explain", "--live", "shop/web", "--kubeconfig", str(kubeconfig),
            "--save-snapshot", str(saved)])
    out = capsys.readouterr().out
    assert code == 0
    decision = json.loads(out)
    # The controller's last decision, and explain's from the same inputs.
    assert decision["desiredReplicas"] == status["desiredReplicas"] == 6
    assert decision["scaleUpdated"] is False
    # The controller runs with --leader-elect=false and published its settings all the same.
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
        fake_kube: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = fake_kube.write_kubeconfig(tmp_path / "kubeconfig")
    code = await asyncio.to_thread(main, ["explain", "--live", "shop/missing", "--kubeconfig",
                                          str(kubeconfig)])
    assert code == 2
    assert 'cannot read Autoscaler shop/missing: autoscalers.metricscale.dev "missing" not ' \
           'found' in capsys.readouterr().err
    assert await asyncio.to_thread(main, ["explain", "--live", "no-slash"]) == 2


async def test_explain_live_without_published_settings_says_defaults_are_assumed(
        fake_kube: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = fake_kube.write_kubeconfig(tmp_path / "kubeconfig")
    fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
        "web", target="web", metrics=[pods_metric("http_requests", "10")], max_replicas=6))
    await asyncio.to_thread(main, ["explain", "--live", "shop/web", "--kubeconfig",
                                   str(kubeconfig), "-o", "text"])
    assert "no settings published by the controller; upstream defaults are assumed" in \
        capsys.readouterr().out
    await asyncio.to_thread(main, ["explain", "--live", "shop/web", "--kubeconfig",
                                   str(kubeconfig),
                                   "--horizontal-pod-autoscaler-downscale-stabilization", "20s"])
    assert json.loads(capsys.readouterr().out)["settingsSource"] == "flags"


async def test_explain_live_redoes_the_owner_based_pod_selection_with_the_replica_sets(
        fake_kube: FakeKubeAPI, metrics_backend: MetricsBackend, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """KEP-5325: the capture holds the namespace's ReplicaSets, so explain picks web's own pods
    out of the selector's (a Job's pod sharing the labels is left out) as the controller does."""
    kubeconfig = fake_kube.write_kubeconfig(tmp_path / "kubeconfig")
    saved = tmp_path / "snapshot.json"
    labels = {"app": "web"}
    deployment = fake_kube.create_deployment("web", namespace=NS, replicas=2, labels=labels)
    fake_kube.create("apps", "v1", "replicasets", {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web-1", "namespace": NS, "labels": labels,
                     "annotations": {"deployment.kubernetes.io/revision": "1"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                          "name": "web", "controller": True,
                                          "uid": deployment["metadata"].get("uid", "")}]},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                 "template": deployment["spec"]["template"]}})
    for pod in ("web-1-a", "web-1-b"):
        fake_kube.create_pod(pod, namespace=NS, labels=labels,
                             owner={"kind": "ReplicaSet", "name": "web-1"})
    fake_kube.create_pod("migrate-x", namespace=NS, labels=labels,
                         owner={"apiVersion": "batch/v1", "kind": "Job", "name": "migrate"})
    obj = autoscaler("web", target="web", metrics=[pods_metric("rps", "10")], max_replicas=10)
    obj["spec"]["podSelectionStrategy"] = "OwnerReferences"
    fake_kube.create(GROUP, VERSION, PLURAL, obj)
    # web's pods at the target, the Job's busy: counted, (10 + 10 + 70) / 3 = 30 a pod.
    metrics_backend.publisher("rps")({"web-1-a": Decimal(10), "web-1-b": Decimal(10),
                                      "migrate-x": Decimal(70)})
    capsys.readouterr()
    code = await asyncio.to_thread(main, [
        "explain", "--live", f"{NS}/web", "--kubeconfig", str(kubeconfig),
        "--save-snapshot", str(saved)])
    decision = json.loads(capsys.readouterr().out)
    assert code == 0
    assert decision["ignoredPods"] == 1
    assert decision["desiredReplicas"] == 2  # the Job's load is left out: the size holds
    assert any(line.startswith("Pod selection (OwnerReferences, KEP-5325): 2 of the "
                               "selector's 3 pods count: 1 not owned by Deployment/web")
               for line in decision["explanation"])
    snapshot = json.loads(saved.read_text())
    assert [rs["metadata"]["name"] for rs in snapshot["replicaSets"]] == ["web-1"]
