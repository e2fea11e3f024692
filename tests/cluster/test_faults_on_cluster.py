"""Faults a real kube-apiserver cannot be made to produce on demand, injected by the fault
proxy in front of it: the product's Kubernetes client and informers against them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from metricscale.kube.http import open_kube_http
from metricscale.kube.informer import (
    Informer,
    InformerEvent,
    PathSource,
    collection_path,
    project_raw,
)
from metricscale.kube.requests import KubeRequests
from metricscale.kube.retry import Backoff, RetryPolicy
from testbed.controlplane import ControlPlane
from testbed.faultproxy import FaultProxy, ServerError, StallWatch, TooManyRequests
from tests.cluster.support import deployment

FAST: dict[str, Any] = {"backoff": Backoff(initial=0.01, cap=0.02), "jitter": lambda: 0.0}
STALL = 0.8


async def test_429_and_503_are_retried_until_the_real_answer(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str) -> None:
    control_plane.apply(deployment(namespace, replicas=2))
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/web"
    fault_proxy.add_fault(path + "$", TooManyRequests(retry_after=1), method="GET")
    fault_proxy.add_fault(path + "$", ServerError(503), method="GET")
    configuration = control_plane.api_client_configuration(server=fault_proxy.server)
    async with open_kube_http(configuration, user_agent="metricscale-tests") as http:
        requests = KubeRequests(http, retry=RetryPolicy(attempts=3, initial=0.01, cap=0.02))
        answer = await requests.call("GET", path, operation="get", resource="deployments")
    assert answer["spec"]["replicas"] == 2
    assert [r.status for r in fault_proxy.requests_to(path + "$")] == [429, 503, 200]


async def test_a_stalled_rewatch_is_restarted_and_the_change_arrives(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str) -> None:
    control_plane.apply(deployment(namespace, replicas=2))
    configuration = control_plane.api_client_configuration(server=fault_proxy.server)
    async with open_kube_http(configuration, user_agent="metricscale-tests") as http:
        informer: Informer[Mapping[str, Any]] = Informer(
            PathSource(http, collection_path(group="apps", version="v1", plural="deployments",
                                             namespace=namespace)),
            project=project_raw, watch_timeout_seconds=1, stall_timeout=STALL, **FAST)
        changed = asyncio.Event()

        def record(event: InformerEvent[Mapping[str, Any]]) -> None:
            if event.kind == "MODIFIED" and (event.new or {}).get("spec", {}).get(
                    "replicas") == 5:
                changed.set()

        informer.subscribe(record)
        async with informer:
            assert await informer.wait_synced(30)
            stall = fault_proxy.add_fault(r"/deployments\?.*watch", StallWatch(), method="GET")
            # The running watch ends within its 1 s; the change is made once the re-watch that
            # replaces it is the stalled one, so only the stall's restart can bring it.
            deadline = time.monotonic() + 60
            while stall.hits == 0:
                assert time.monotonic() < deadline, "the informer never watched again"
                await asyncio.sleep(0.05)
            control_plane.request(
                "PATCH", f"/apis/apps/v1/namespaces/{namespace}/deployments/web",
                {"spec": {"replicas": 5}}, content_type="application/merge-patch+json")
            started = time.monotonic()
            await changed.wait()
            assert stall.hits == 1
            assert time.monotonic() - started > 0  # the change came after the stall began
        # At least the stalled one (a quiet 1 s watch of a real server may pass for stalled too:
        # kube-apiserver sends bookmarks about once a minute, not every 0.8 s).
        assert informer.restarts.get("stalled", 0) >= 1
