"""The metrics client through the real kube-apiserver's aggregator to an HTTPS metrics backend
of the test's own (an APIService through an ExternalName Service for localhost, as
testbed.controlplane registers them).

The cluster is the session's: the metric APIServices may belong to other modules, so each test
gives them back as they were (`apiservice_given_back`), and its own are told apart by a
resource only its backend lists. The client's requests go through the fault proxy, which
records them (no fault is injected)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from autoscaler.kube.metrics_api import MetricsClient, MetricsError
from autoscaler.kube.operations import KubeClient
from metricscale.kube.http import open_kube_http
from testbed.controlplane import ControlPlane
from testbed.faultproxy import FaultProxy
from testbed.processes import free_port
from tests.autoscaler.real_cluster_support import (
    METRIC_APISERVICES,
    discovered,
    metric_apiservices_given_back,
    routed,
    serving_context,
    until,
)

SERVICE = "metrics-backend"
GROUPS = METRIC_APISERVICES


class Backend:
    """A metrics API server behind an APIService: answers from a table, records what arrives."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[int, Any]] = {}
        self.received: list[tuple[str, list[tuple[str, str]]]] = []
        self.port = 0

    @property
    def marker(self) -> str:
        """The resource only this backend lists: the aggregator routes to it once it shows."""
        return f"probe-{self.port}"

    async def handle(self, request: web.Request) -> web.Response:
        parts = request.path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "apis":  # discovery (and availability checks)
            return web.json_response({
                "kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{parts[1]}/{parts[2]}",
                "resources": [{"name": self.marker, "singularName": "", "namespaced": False,
                               "kind": "Probe", "verbs": ["get"]}]})
        if parts[0] != "apis" or len(parts) < 3:  # the aggregator's OpenAPI and discovery
            return web.json_response({}, status=404)
        self.received.append((request.path, list(request.query.items())))
        status, body = self.answers.get(request.path, (404, {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "the server could not find the requested resource", "reason": "NotFound",
            "code": 404}))
        return web.json_response(body, status=status)


@pytest.fixture
def given_back(control_plane: ControlPlane) -> Iterator[None]:
    with metric_apiservices_given_back(control_plane):
        yield


@pytest.fixture
async def backend(tmp_path: Path, namespace: str) -> AsyncIterator[tuple[Backend, bytes]]:
    context, ca_pem = serving_context(tmp_path, service=SERVICE, namespace=namespace)
    server = Backend()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    server.port = runner.addresses[0][1]
    try:
        yield server, ca_pem
    finally:
        await runner.cleanup()


async def register(cluster: ControlPlane, namespace: str, backend: tuple[Backend, bytes],
                   *services: tuple[str, str, int], port: int | None = None) -> None:
    """APIServices (group, version, versionPriority) for the backend, the other versions of
    their groups removed; returns once the aggregator answers from the backend (with `port`:
    the APIServices name that port instead, and it returns at once)."""
    server, ca_pem = backend
    wanted = {(group, version) for group, version, _ in services}
    for group, version in GROUPS:
        if (group, version) not in wanted and group in {g for g, _ in wanted}:
            await unregister(cluster, group, version)
    for group, version, priority in services:
        await asyncio.to_thread(
            cluster.register_apiservice, group, version, port=port or server.port,
            ca_pem=ca_pem, namespace=namespace, service=SERVICE, priority=(100, priority))
    if port is not None:
        return
    for group, version, _ in services:
        await until(lambda group=group, version=version: routed(  # type: ignore[misc]
            cluster, group, version, server.marker),
            what=f"the aggregator answering {group}/{version} from the test's backend")


async def unregister(cluster: ControlPlane, group: str, version: str) -> None:
    """No APIService for group/version, and the aggregator's discovery without it."""
    await asyncio.to_thread(cluster.delete, {
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": f"{version}.{group}"}})

    await until(lambda: not discovered(cluster, group, version),
                what=f"{version}.{group} gone from discovery")


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
async def metrics(control_plane: ControlPlane, fault_proxy: FaultProxy,
                  given_back: None) -> AsyncIterator[MetricsClient]:
    configuration = control_plane.api_client_configuration(server=fault_proxy.server)
    async with open_kube_http(configuration) as http:
        kube = KubeClient(http, registry=CollectorRegistry(), reporting_instance="a",
                          sleep=Sleeps())
        yield MetricsClient(kube)


def metric_value_list(version: str, names: list[str]) -> dict[str, Any]:
    if version == "v1beta2":
        items = [{"describedObject": {"kind": "Pod", "namespace": "shop", "name": n,
                                      "apiVersion": "v1"},
                  "metric": {"name": "http_requests", "selector": None},
                  "timestamp": "2024-05-01T12:00:00Z", "windowSeconds": 60, "value": "1500m"}
                 for n in names]
    else:
        items = [{"describedObject": {"kind": "Pod", "namespace": "shop", "name": n,
                                      "apiVersion": "v1"},
                  "metricName": "http_requests", "timestamp": "2024-05-01T12:00:00Z",
                  "window": 60, "value": "1500m", "selector": None} for n in names]
    return {"kind": "MetricValueList", "apiVersion": f"custom.metrics.k8s.io/{version}",
            "metadata": {}, "items": items}


CUSTOM_BOTH = [("custom.metrics.k8s.io", "v1beta2", 200), ("custom.metrics.k8s.io", "v1beta1", 100)]


async def test_pods_metric_goes_to_v1beta2_with_exact_path_and_parameters(
        control_plane: ControlPlane, namespace: str, fault_proxy: FaultProxy,
        backend: tuple[Backend, bytes], metrics: MetricsClient) -> None:
    await register(control_plane, namespace, backend, *CUSTOM_BOTH)
    server = backend[0]
    path = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/http_requests"
    server.answers[path] = (200, metric_value_list("v1beta2", ["web-1", "web-2"]))
    body = await metrics.get_pods_metric(
        namespace=namespace, metric_name="http_requests", pod_selector="app=web,tier=front",
        metric_selector={"matchLabels": {"verb": "GET"}})
    assert [i["describedObject"]["name"] for i in body["items"]] == ["web-1", "web-2"]
    expected = (path, [("labelSelector", "app=web,tier=front"),
                       ("metricLabelSelector", "verb=GET")])
    assert server.received == [expected]
    [seen] = fault_proxy.requests_to("^/apis/custom.metrics.k8s.io/v1beta2/namespaces")
    assert seen.path == expected[0]


async def test_v1beta1_only_adapter_is_asked_in_v1beta1_and_decoded_to_v1beta2(
        control_plane: ControlPlane, namespace: str, fault_proxy: FaultProxy,
        backend: tuple[Backend, bytes], metrics: MetricsClient) -> None:
    await register(control_plane, namespace, backend, ("custom.metrics.k8s.io", "v1beta1", 100))
    server = backend[0]
    path = f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/*/http_requests"
    server.answers[path] = (200, metric_value_list("v1beta1", ["web-1"]))
    body = await metrics.get_pods_metric(namespace=namespace, metric_name="http_requests",
                                         pod_selector="app=web", metric_selector=None)
    assert server.received == [(path, [("labelSelector", "app=web")])]
    assert body["apiVersion"] == "custom.metrics.k8s.io/v1beta2"
    assert body["items"][0]["metric"] == {"name": "http_requests"}
    assert body["items"][0]["windowSeconds"] == 60


async def test_object_metric_path_has_the_group_qualified_resource(
        control_plane: ControlPlane, namespace: str, fault_proxy: FaultProxy,
        backend: tuple[Backend, bytes], metrics: MetricsClient) -> None:
    await register(control_plane, namespace, backend, *CUSTOM_BOTH)
    server = backend[0]
    path = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/deployments.apps/web/rps"
    server.answers[path] = (200, metric_value_list("v1beta2", ["web"]))
    await metrics.get_object_metric(
        namespace=namespace, metric_name="rps",
        described_object={"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
        metric_selector=None)
    assert server.received == [(path, [])]


async def test_namespace_metric_uses_the_metrics_pseudo_resource(
        control_plane: ControlPlane, namespace: str, fault_proxy: FaultProxy,
        backend: tuple[Backend, bytes], metrics: MetricsClient) -> None:
    await register(control_plane, namespace, backend, *CUSTOM_BOTH)
    server = backend[0]
    path = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/metrics/queue_length"
    server.answers[path] = (200, metric_value_list("v1beta2", [namespace]))
    await metrics.get_object_metric(
        namespace=namespace, metric_name="queue_length",
        described_object={"apiVersion": "v1", "kind": "Namespace", "name": namespace},
        metric_selector={"matchExpressions": [{"key": "queue", "operator": "In",
                                               "values": ["b", "a"]}]})
    assert server.received == [(path, [("metricLabelSelector", "queue in (a,b)")])]


async def test_external_metric_is_lower_cased_with_its_selector(
        control_plane: ControlPlane, namespace: str, fault_proxy: FaultProxy,
        backend: tuple[Backend, bytes], metrics: MetricsClient) -> None:
    await register(control_plane, namespace, backend, ("external.metrics.k8s.io", "v1beta1", 100))
    server = backend[0]
    path = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/queue_messages_ready"
    server.answers[path] = (200, {
        "kind": "ExternalMetricValueList", "apiVersion": "external.metrics.k8s.io/v1beta1",
        "metadata": {}, "items": [{"metricName": "queue_messages_ready",
                                   "metricLabels": {"queue": "orders"},
                                   "timestamp": "2024-05-01T12:00:00Z", "value": "1200"}]})
    body = await metrics.get_external_metric(
        namespace=namespace, metric_name="Queue_Messages_Ready",
        metric_selector={"matchLabels": {"queue": "orders"}})
    assert body["items"][0]["value"] == "1200"
    assert server.received == [(path, [("labelSelector", "queue=orders")])]


async def test_resource_metrics_list_pod_metrics_by_selector(
        control_plane: ControlPlane, namespace: str, fault_proxy: FaultProxy,
        backend: tuple[Backend, bytes], metrics: MetricsClient) -> None:
    await register(control_plane, namespace, backend, ("metrics.k8s.io", "v1beta1", 100))
    server = backend[0]
    path = f"/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods"
    server.answers[path] = (200, {
        "kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1", "metadata": {},
        "items": [{"metadata": {"name": "web-1", "namespace": "shop"},
                   "timestamp": "2024-05-01T12:00:00Z", "window": "30s",
                   "containers": [{"name": "app", "usage": {"cpu": "250m",
                                                            "memory": "64Mi"}}]}]})
    body = await metrics.get_resource_metrics(namespace=namespace, pod_selector="app in (web)")
    assert body["items"][0]["containers"][0]["usage"]["cpu"] == "250m"
    assert server.received == [(path, [("labelSelector", "app in (web)")])]


async def test_adapter_status_errors_reach_the_caller_with_upstreams_prefix(
        control_plane: ControlPlane, namespace: str, fault_proxy: FaultProxy,
        backend: tuple[Backend, bytes], metrics: MetricsClient) -> None:
    await register(control_plane, namespace, backend, *CUSTOM_BOTH)
    with pytest.raises(MetricsError) as caught:
        await metrics.get_pods_metric(namespace=namespace, metric_name="nope",
                                      pod_selector="app=web", metric_selector=None)
    assert str(caught.value) == ("unable to fetch metrics from custom metrics API: the server "
                                 "could not find the requested resource")


async def test_unreachable_adapter_reads_like_the_hpas_familiar_error(
        control_plane: ControlPlane, namespace: str, fault_proxy: FaultProxy,
        backend: tuple[Backend, bytes], metrics: MetricsClient) -> None:
    # The APIServices name a port nothing listens on.
    await register(control_plane, namespace, backend, *CUSTOM_BOTH, port=free_port())
    await until(lambda: not control_plane.apiservice_available(
        "custom.metrics.k8s.io", "v1beta2")[0], what="the APIService unavailable")
    with pytest.raises(MetricsError) as caught:
        await metrics.get_pods_metric(namespace=namespace, metric_name="http_requests",
                                      pod_selector="app=web", metric_selector=None)
    assert str(caught.value) == (
        "unable to fetch metrics from custom metrics API: the server is currently unable to "
        "handle the request (get pods.custom.metrics.k8s.io *)")
    # Not retried, as upstream's HPA does not: the next sync period is the retry.
    assert len(fault_proxy.requests_to("^/apis/custom.metrics.k8s.io/v1beta2/namespaces")) == 1


async def test_no_custom_metrics_api_registered(control_plane: ControlPlane, namespace: str,
                                                metrics: MetricsClient) -> None:
    for group, version in GROUPS[:2]:
        await unregister(control_plane, group, version)
    with pytest.raises(MetricsError) as caught:
        await metrics.get_pods_metric(namespace=namespace, metric_name="http_requests",
                                      pod_selector="app=web", metric_selector=None)
    assert str(caught.value) == ("unable to fetch metrics from custom metrics API: no custom "
                                 "metrics API (custom.metrics.k8s.io) registered")
