"""What a user types to check the metrics, on the real control plane through the real aggregator:
`kubectl get --raw` on the three metric groups and `kubectl top`."""

from __future__ import annotations

import json
from typing import Any

from testbed.controlplane import ControlPlane, Kubelet
from testbed.fakes.exporter import Exporter
from testbed.install import Installation
from testbed.load import Load
from tests.cluster.support import deployment, until


def raw(cluster: ControlPlane, path: str) -> Any:
    result = cluster.kubectl("get", "--raw", path, check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def items(answer: Any) -> list[dict[str, Any]]:
    return list((answer or {}).get("items") or [])


async def test_get_raw_answers_on_all_three_groups(installation: Installation, kubelet: Kubelet,
                                                   exporter: Exporter, namespace: str) -> None:
    cluster = installation.cluster
    cluster.apply(deployment(namespace, replicas=2, cpu_request="500m"))
    exporter.set("queue_depth", {"namespace": namespace, "queue": "mail"}, 7, type="gauge")
    with Load(cluster, kubelet, namespace=namespace, selector={"app": "web"}, cpu="0.4",
              exporter=exporter, metric="sessions", metric_total=30):
        custom = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/sessions"
        await until(lambda: len(items(raw(cluster, custom))) == 2, what="sessions of 2 pods")
        answer = raw(cluster, custom)
        assert answer["kind"] == "MetricValueList"
        assert sorted(i["value"] for i in answer["items"]) == ["15", "15"]
        assert {i["describedObject"]["kind"] for i in answer["items"]} == {"Pod"}

        external = (f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/"
                    "queue_depth?labelSelector=queue%3Dmail")
        await until(lambda: len(items(raw(cluster, external))) == 1, what="queue_depth")
        (value,) = items(raw(cluster, external))
        assert value["metricName"] == "queue_depth" and value["value"] == "7"
        assert value["metricLabels"] == {"queue": "mail"}

        resource = f"/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods"
        await until(lambda: len(items(raw(cluster, resource))) == 2, what="PodMetrics")
        pods = items(raw(cluster, resource))
        assert {p["containers"][0]["name"] for p in pods} == {"app"}
        assert {p["window"] for p in pods} == {"30s"}


async def test_kubectl_top_pods_containers_and_nodes(installation: Installation,
                                                     kubelet: Kubelet, namespace: str) -> None:
    cluster = installation.cluster
    cluster.apply(deployment(namespace, replicas=3, cpu_request="500m"))
    with Load(cluster, kubelet, namespace=namespace, selector={"app": "web"}, cpu="0.6"):
        def top() -> list[list[str]]:
            result = cluster.kubectl("top", "pods", "-n", namespace, "--no-headers",
                                     check=False)
            return [line.split() for line in result.stdout.splitlines()] \
                if result.returncode == 0 else []

        # 0.6 cores over 3 pods: 200m each once the rate window holds only the load.
        await until(lambda: len(top()) == 3 and all(row[1] == "200m" for row in top()),
                    what="kubectl top pods shows 200m for each of the 3 pods")
        containers = cluster.kubectl("top", "pods", "-n", namespace, "--containers",
                                     "--no-headers").stdout.splitlines()
        assert len(containers) == 3 and all(line.split()[1] == "app" for line in containers)
        nodes = cluster.kubectl("top", "nodes", "--no-headers").stdout.splitlines()
        assert sorted(line.split()[0] for line in nodes) == ["node-a", "node-b"]
