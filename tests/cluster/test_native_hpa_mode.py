"""`metricscale autoscaler --enable-native-hpa` on a control plane whose kube-controller-manager
runs without its own HPA controller (the only way the two may share a cluster): our controller
acts on a native autoscaling/v2 HorizontalPodAutoscaler, writes its scale and its status."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import PrometheusServer
from testbed.install import Installation
from testbed.load import Load
from tests.cluster.support import deployment, native_hpa_installation, until


@pytest.fixture(scope="module")
def native(prometheus: PrometheusServer) -> Iterator[Installation]:
    with native_hpa_installation(prometheus, name="native") as installed:
        yield installed


async def test_a_native_hpa_is_scaled_by_our_controller(native: Installation,
                                                        exporter: Exporter) -> None:
    cluster = native.cluster
    namespace = "native"
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    cluster.apply(deployment(namespace, name="api"))
    assert native.kubelet is not None
    with Load(cluster, native.kubelet, namespace=namespace, selector={"app": "api"},
              exporter=exporter, metric="calls_in_flight", metric_total=35):
        cluster.apply({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                       "metadata": {"name": "api", "namespace": namespace},
                       "spec": {"scaleTargetRef": {"apiVersion": "apps/v1",
                                                   "kind": "Deployment", "name": "api"},
                                "minReplicas": 1, "maxReplicas": 8,
                                "metrics": [{"type": "Pods", "pods": {
                                    "metric": {"name": "calls_in_flight"},
                                    "target": {"type": "AverageValue",
                                               "averageValue": "10"}}}]}})

        def hpa() -> dict[str, Any]:
            return dict(cluster.get(f"/apis/autoscaling/v2/namespaces/{namespace}/"
                                    "horizontalpodautoscalers/api"))

        # 35 in flight at 10 a pod: 4 pods; only our controller runs here.
        await until(lambda: (hpa().get("status") or {}).get("desiredReplicas") == 4
                    and (hpa().get("status") or {}).get("currentReplicas") == 4,
                    what="the HPA's status at 4 replicas")
        events = cluster.get(f"/api/v1/namespaces/{namespace}/events")["items"]
        rescales = [e for e in events if e.get("reason") == "SuccessfulRescale"]
        assert rescales and all(e["involvedObject"]["kind"] == "HorizontalPodAutoscaler"
                                for e in rescales)
        described = cluster.kubectl("describe", "hpa", "api", "-n", namespace).stdout
        assert "calls_in_flight" in described and "ValidMetricFound" in described, described
