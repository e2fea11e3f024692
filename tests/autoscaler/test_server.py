"""`metricscale autoscaler`'s server against the session's real kube-apiserver, with a metrics API
of the test's own behind the real aggregator: what it asks the API server in a steady state over
HTTP (the scale and one read per metric a reconcile, nothing else), and its /metrics, /healthz
and /readyz. (The controller's decisions: tests/autoscaler/test_controller_*.py, on the
injected clock.)

The controller runs in-process, watching only the test's namespace, and talks to kube-apiserver
through the fault proxy, which records its requests (no fault is injected). The scale target is
a real Deployment: kube-controller-manager's deployment and ReplicaSet controllers make its pods
and the kubelet stand-in runs them. The metric APIServices may belong to other modules: each
test gives them back as they were, and its backend is told apart by a resource only it lists
(as tests/autoscaler/test_metrics_client.py does). The backend answers the aggregator on the
test's event loop, so the test's blocking cluster calls run in threads while it is registered.
The test's namespace is fenced off from the installed autoscaler (which watches every namespace
and would reconcile the test's Autoscaler too: tests.autoscaler.real_cluster_support)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web

from autoscaler.controller.leader import LeaderElectionConfig
from autoscaler.decision.settings import Settings
from autoscaler.server import AutoscalerServer, Options, serve_autoscaler
from testbed.controlplane import ControlPlane, Kubelet
from testbed.faultproxy import FaultProxy, RecordedRequest
from tests.autoscaler.autoscaler_objects import (
    GROUP,
    PLURAL,
    VERSION,
    autoscaler,
    cpu_metric,
    pods_metric,
)
from tests.autoscaler.real_cluster_support import (
    WITHIN,
    condition,
    discovered,
    fenced_from,
    install_crd,
    metric_apiservices_given_back,
    routed,
    serving_context,
    until,
)
from tests.cluster.support import deployment

SERVICE = "metrics-backend"
# Every metric APIService another module may own: given back after each test.
SERVED = [("custom.metrics.k8s.io", "v1beta2"), ("metrics.k8s.io", "v1beta1")]
def _quantity(value: Decimal) -> str:
    milli = int(value * 1000)
    return f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m"


class MetricsBackend:
    """custom.metrics.k8s.io/v1beta2 pods metrics and metrics.k8s.io/v1beta1 PodMetrics over
    HTTPS: `totals[metric]` spread evenly over the pods the selector picks (read from the
    cluster), and `cpu` cores a pod."""

    def __init__(self, cluster: ControlPlane) -> None:
        self.cluster = cluster
        self.totals: dict[str, Decimal] = {}
        self.cpu: Decimal | None = None
        self.port = 0

    @property
    def marker(self) -> str:
        """The resource only this backend lists: the aggregator routes to it once it shows."""
        return f"probe-{self.port}"

    async def _pods(self, request: web.Request, namespace: str) -> list[str]:
        selector = quote(request.query.get("labelSelector", ""))
        found = await asyncio.to_thread(
            self.cluster.get, f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")
        return sorted(p["metadata"]["name"] for p in found.get("items") or []
                      if not p["metadata"].get("deletionTimestamp"))

    async def _discovery(self, request: web.Request) -> web.Response:
        group, version = request.match_info["group"], request.match_info["version"]
        resources = [{"name": self.marker, "singularName": "", "namespaced": False,
                      "kind": "Probe", "verbs": ["get"]}]
        resources += ([{"name": "pods", "singularName": "", "namespaced": True,
                        "kind": "PodMetrics", "verbs": ["get", "list"]}]
                      if group == "metrics.k8s.io" else
                      [{"name": f"pods/{metric}", "singularName": "", "namespaced": True,
                        "kind": "MetricValueList", "verbs": ["get"]} for metric in self.totals])
        return web.json_response({"kind": "APIResourceList", "apiVersion": "v1",
                                  "groupVersion": f"{group}/{version}",
                                  "resources": resources})

    async def _custom(self, request: web.Request) -> web.Response:
        namespace, metric = request.match_info["namespace"], request.match_info["metric"]
        pods = await self._pods(request, namespace)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        total = self.totals.get(metric)
        items = [{"describedObject": {"kind": "Pod", "namespace": namespace, "name": pod,
                                      "apiVersion": "/v1"},
                  "metric": {"name": metric}, "timestamp": now, "windowSeconds": 60,
                  "value": _quantity(total / len(pods))}
                 for pod in pods if total is not None]
        return web.json_response({"kind": "MetricValueList",
                                  "apiVersion": "custom.metrics.k8s.io/v1beta2",
                                  "metadata": {}, "items": items})

    async def _resource(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        pods = await self._pods(request, namespace)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        items = [{"metadata": {"name": pod, "namespace": namespace}, "timestamp": now,
                  "window": "30s",
                  "containers": [{"name": "app", "usage": {"cpu": _quantity(cpu)}}]}
                 for pod in pods if (cpu := self.cpu) is not None]
        return web.json_response({"kind": "PodMetricsList",
                                  "apiVersion": "metrics.k8s.io/v1beta1", "metadata": {},
                                  "items": items})

    async def _other(self, request: web.Request) -> web.Response:
        return web.json_response({}, status=404)  # the aggregator's OpenAPI, and anything else

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/apis/{group}/{version}", self._discovery)
        app.router.add_get(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/{name}/{metric}",
            self._custom)
        app.router.add_get("/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods",
                           self._resource)
        app.router.add_route("*", "/{tail:.*}", self._other)
        return app


@pytest.fixture
def given_back(control_plane: ControlPlane) -> Iterator[None]:
    with metric_apiservices_given_back(control_plane):
        yield


@pytest.fixture
def fenced(control_plane: ControlPlane, namespace: str) -> Iterator[None]:
    install_crd(control_plane)
    with fenced_from(control_plane, namespace):
        yield


@pytest.fixture
async def backend(control_plane: ControlPlane, namespace: str, fenced: None, given_back: None,
                  tmp_path: Path) -> AsyncIterator[MetricsBackend]:
    """The test's backend behind the aggregator for SERVED (the other custom metrics version
    unregistered, so that only v1beta2 is discovered), once the aggregator answers from it."""
    context, ca_pem = serving_context(tmp_path, service=SERVICE, namespace=namespace)
    server = MetricsBackend(control_plane)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
    server.port = int(runner.addresses[0][1])
    try:
        cluster = control_plane
        await asyncio.to_thread(cluster.delete, {
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": "v1beta1.custom.metrics.k8s.io"}})
        await until(lambda: not discovered(cluster, "custom.metrics.k8s.io", "v1beta1"),
                    what="v1beta1.custom.metrics.k8s.io gone from discovery")
        for group, version in SERVED:
            await asyncio.to_thread(
                cluster.register_apiservice, group, version, port=server.port,
                ca_pem=ca_pem, namespace=namespace,
                service=SERVICE, priority=(100, 200))
        for group, version in SERVED:
            await until(lambda group=group, version=version: routed(  # type: ignore[misc]
                cluster, group, version, server.marker),
                what=f"the aggregator answering {group}/{version} from the test's backend")
        yield server
    finally:
        await runner.cleanup()


async def web_deployment(cluster: ControlPlane, namespace: str, *, replicas: int) -> None:
    """Deployment `web` (app=web, 500m of CPU a pod), once its pods are Ready."""
    await asyncio.to_thread(cluster.apply, deployment(namespace, replicas=replicas,
                                                      cpu_request="500m"))
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/web"

    def ready() -> bool:
        status = cluster.get(path).get("status") or {}
        return bool(status.get("readyReplicas") == replicas == status.get("replicas"))

    await until(ready, what=f"{replicas} ready pods of {namespace}/web")


async def create_autoscaler(cluster: ControlPlane, namespace: str, obj: dict[str, Any]) -> None:
    obj["metadata"]["namespace"] = namespace
    await asyncio.to_thread(cluster.request, "POST",
                            f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}", obj)


def replicas_of(cluster: ControlPlane, namespace: str, name: str) -> int:
    found = cluster.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
    return int(found["spec"].get("replicas", 0))


@contextlib.asynccontextmanager
async def controller(cluster: ControlPlane, proxy: FaultProxy, namespace: str, *,
                     sync: float = 0.25) -> AsyncIterator[AutoscalerServer]:
    """One controller replica watching only `namespace`, through the fault proxy."""
    options = Options(
        settings=Settings(sync_period=timedelta(seconds=sync),
                          downscale_stabilization_window=timedelta(seconds=300)),
        leader_election=LeaderElectionConfig(enabled=False), concurrent_syncs=3,
        namespace=namespace, identity="replica-a", lease_namespace=namespace,
        reporting_instance="replica-a", metrics_bind_address="127.0.0.1:0",
        informer_options={"watch_timeout_seconds": 30})
    configuration = cluster.api_client_configuration(server=proxy.server)
    async with serve_autoscaler(configuration, options) as server:
        yield server
        assert server.fatal is None, f"the controller failed: {server.fatal!r}"


def is_other(request: RecordedRequest, namespace: str) -> bool:
    """Neither a watch, nor discovery of the API groups, nor a read of the scale or a metric."""
    return not (request.path.endswith("/deployments/web/scale")
                or request.path.startswith((
                    f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/",
                    f"/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/",
                    "/apis/coordination"))
                or "watch=true" in request.query.lower()
                or request.path in ("/apis", "/api"))


async def test_steady_state_costs_a_scale_get_and_one_metrics_get_per_metric(
        control_plane: ControlPlane, kubelet: Kubelet, namespace: str,
        fault_proxy: FaultProxy, backend: MetricsBackend) -> None:
    cluster = control_plane
    backend.totals["http_requests"] = Decimal(20)
    backend.cpu = Decimal("0.2")
    await web_deployment(cluster, namespace, replicas=2)
    await create_autoscaler(cluster, namespace, autoscaler(
        "web", target="web", metrics=[pods_metric("http_requests", "10"), cpu_metric(80)],
        min_replicas=2))
    async with controller(cluster, fault_proxy, namespace, sync=0.1) as server:
        assert server.controller is not None
        reconciler = server.controller
        await until(lambda: condition(cluster, namespace, "web", "ScalingActive") is not None,
                    what="a first decision")
        # Settled: three reconciles in a row asked nothing else. On the real cluster the pods
        # have just become Ready, and for about one metric window (30 s) every reconcile posts
        # an Event before one status write ends it (the CPU samples of a newly Ready pod are
        # not used until a window after its readiness), which the fake's pods never showed.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WITHIN
        while True:
            mark, start = len(fault_proxy.recorded), reconciler.reconciled
            await until(lambda start=start: reconciler.reconciled >= start + 3,  # type: ignore[misc]
                        what="three reconciles")
            if not any(is_other(r, namespace) for r in fault_proxy.recorded[mark:]):
                break
            assert loop.time() < deadline, "never settled"
        mark, start = len(fault_proxy.recorded), reconciler.reconciled
        await until(lambda: reconciler.reconciled >= start + 10, what="ten steady reconciles")
        done = reconciler.reconciled - start
        seen = list(fault_proxy.recorded[mark:])
    by_kind: dict[str, int] = {"scale": 0, "custom": 0, "resource": 0}
    other: list[tuple[str, str]] = []
    for request in seen:
        if request.path.endswith("/deployments/web/scale"):
            by_kind["scale"] += 1
        elif request.path.startswith(f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/"
                                     f"{namespace}/"):
            by_kind["custom"] += 1
        elif request.path.startswith(f"/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/"):
            by_kind["resource"] += 1
        elif is_other(request, namespace):
            other.append((request.method, request.path))
    assert other == []  # no status writes, no events, nothing else
    assert all(request.method == "GET" for request in seen if not is_other(request, namespace))
    for kind in ("scale", "custom", "resource"):
        assert abs(by_kind[kind] - done) <= 1, by_kind


async def test_metrics_health_and_readiness_endpoints(
        control_plane: ControlPlane, kubelet: Kubelet, namespace: str,
        fault_proxy: FaultProxy, backend: MetricsBackend) -> None:
    names = ('metricscale_autoscaler_reconciles_total{result="ok"}',
             "metricscale_autoscaler_reconcile_duration_seconds_count",
             'metricscale_autoscaler_decisions_total{outcome="scale_up"} 1.0',
             "metricscale_autoscaler_api_request_duration_seconds_count",
             "metricscale_autoscaler_leader 1.0")
    cluster = control_plane
    backend.totals["http_requests"] = Decimal(40)
    await web_deployment(cluster, namespace, replicas=2)
    await create_autoscaler(cluster, namespace, autoscaler(
        "web", target="web", metrics=[pods_metric("http_requests", "10")]))
    async with controller(cluster, fault_proxy, namespace) as server, \
            aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{server.port}"
        await until(lambda: replicas_of(cluster, namespace, "web") == 4, what="a scale-up")
        async with http.get(f"{base}/healthz") as response:
            assert response.status == 200
        async with http.get(f"{base}/readyz") as response:
            assert response.status == 200
        # The scale is written first; the decision is counted after the events and the status
        # write, and the reconcile once it returns: read /metrics until they are (bounded by
        # the test's timeout alone).
        while True:
            async with http.get(f"{base}/metrics") as response:
                text = await response.text()
            if all(name in text for name in names):
                break
            await asyncio.sleep(0.05)
    for name in names:
        assert name in text, name
