"""The autoscaler on the real control plane: it watches, holds its Lease, writes the scale, its
status and Events; `metricscale explain --live` and `metricscale replay --live` read the same
cluster and agree with it."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from testbed.binaries import CHECKOUT
from testbed.controlplane import ControlPlane, Kubelet
from testbed.fakes.exporter import Exporter
from testbed.install import NAMESPACE, Installation
from testbed.load import Load
from tests.cluster.support import deployment, until


def orders_autoscaler(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
            "metadata": {"name": "web", "namespace": namespace},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": "web"},
                     "minReplicas": 1, "maxReplicas": 6,
                     "metrics": [{"type": "Pods", "pods": {
                         "metric": {"name": "orders_pending"},
                         "target": {"type": "AverageValue", "averageValue": "10"}}}]}}


def replicas(cluster: ControlPlane, namespace: str) -> int:
    deployment = cluster.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/web")
    return int(deployment["spec"]["replicas"])


def status(cluster: ControlPlane, namespace: str) -> dict[str, Any]:
    obj = cluster.get(f"/apis/metricscale.dev/v1alpha1/namespaces/{namespace}/autoscalers/web")
    return dict(obj.get("status") or {})


def metricscale(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metricscale", *args], cwd=CHECKOUT,
                          capture_output=True, text=True, timeout=300, check=False)


async def test_the_autoscaler_scales_and_explain_and_replay_agree(
        installation: Installation, kubelet: Kubelet, exporter: Exporter,
        namespace: str) -> None:
    cluster = installation.cluster
    cluster.apply(deployment(namespace))
    with Load(cluster, kubelet, namespace=namespace, selector={"app": "web"},
              exporter=exporter, metric="orders_pending", metric_total=25):
        cluster.apply(orders_autoscaler(namespace))
        # 25 pending over pods at 10 each: 3 pods.
        await until(lambda: replicas(cluster, namespace) == 3, what="web at 3 replicas")
        await until(lambda: status(cluster, namespace).get("desiredReplicas") == 3
                    and status(cluster, namespace).get("currentReplicas") == 3,
                    what="the status names the 3 replicas")

        # Events, as kubectl describe shows them, from our controller.
        described = cluster.kubectl("describe", "msa", "web", "-n", namespace).stdout
        assert "SuccessfulRescale" in described and "New size: 3" in described, described

        # The Lease of the leader, in the installation's namespace.
        lease = cluster.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/"
                            "metricscale-autoscaler")
        assert lease["spec"]["holderIdentity"]

        # explain --live captures the same inputs and decides the same.
        explained = metricscale("explain", "--live", f"{namespace}/web",
                                f"--kubeconfig={cluster.kubeconfig}",
                                f"--lease-namespace={NAMESPACE}")
        assert explained.returncode == 0, explained.stderr
        decision = json.loads(explained.stdout)
        assert decision["desiredReplicas"] == 3, explained.stdout[:2000]

        # replay --live reads the spec from the cluster and the history from Prometheus.
        rules = installation.workdir / "adapter-config.yaml"
        replayed = metricscale("replay", "--live", f"{namespace}/web",
                               f"--kubeconfig={cluster.kubeconfig}",
                               f"--lease-namespace={NAMESPACE}",
                               f"--prometheus-url={installation.prometheus_url}",
                               f"--config={rules}", "--last=1m", "--initial-replicas=3",
                               "-o", "json")
        assert replayed.returncode == 0, replayed.stderr
        steps = json.loads(replayed.stdout)["steps"]
        assert steps, replayed.stdout
        # The replayed decisions on the recorded history end where the controller is.
        assert steps[-1]["decidedReplicas"] == 3, json.dumps(steps[-3:])
