"""Faults a real kube-apiserver cannot be made to produce on demand, injected by the fault
proxy in front of it: the product's Kubernetes client retries them (a stalled watch:
tests/metricscale/test_informer_stall.py)."""

from __future__ import annotations

from metricscale.kube.http import KubeHTTP
from metricscale.kube.requests import KubeRequests
from metricscale.kube.retry import RetryPolicy
from testbed.controlplane import ControlPlane
from testbed.faultproxy import FaultProxy, ServerError, TooManyRequests
from tests.cluster.support import deployment


async def test_429_and_503_are_retried_until_the_real_answer(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        proxied_kube_http: KubeHTTP) -> None:
    control_plane.apply(deployment(namespace, replicas=2))
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/web"
    fault_proxy.add_fault(path + "$", TooManyRequests(retry_after=1), method="GET")
    fault_proxy.add_fault(path + "$", ServerError(503), method="GET")
    requests = KubeRequests(proxied_kube_http,
                            retry=RetryPolicy(attempts=3, initial=0.01, cap=0.02))
    answer = await requests.call("GET", path, operation="get", resource="deployments")
    assert answer["spec"]["replicas"] == 2
    assert [r.status for r in fault_proxy.requests_to(path + "$")] == [429, 503, 200]
