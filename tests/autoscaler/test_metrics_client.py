"""The metrics client through the fake API server's aggregator to a real HTTPS metrics backend."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from autoscaler.kube.metrics_api import MetricsClient, MetricsError
from autoscaler.kube.operations import KubeClient
from metricscale import pki
from metricscale.kube.http import open_kube_http
from testbed.fakes.kube_api import FakeKubeAPI

SERVICE = ("ops", "metrics-backend")


class Backend:
    """A metrics API server behind an APIService: answers from a table, records what arrives."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[int, Any]] = {}
        self.received: list[tuple[str, list[tuple[str, str]]]] = []
        self.port = 0

    async def handle(self, request: web.Request) -> web.Response:
        parts = request.path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "apis":  # discovery (and availability checks)
            return web.json_response({"kind": "APIResourceList", "apiVersion": "v1",
                                      "groupVersion": f"{parts[1]}/{parts[2]}", "resources": []})
        self.received.append((request.path, list(request.query.items())))
        status, body = self.answers.get(request.path, (404, {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "the server could not find the requested resource", "reason": "NotFound",
            "code": 404}))
        return web.json_response(body, status=status)


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[tuple[Backend, bytes]]:
    now = datetime.now(UTC) - timedelta(minutes=1)
    ca = pki.generate_ca(common_name="metrics-backend-ca", now=now, validity=timedelta(days=1))
    serving = pki.issue_serving_certificate(
        ca, common_name="metrics-backend", dns_names=["metrics-backend.ops.svc"], now=now,
        validity=timedelta(days=1))
    cert = pki.write_certificate(tmp_path / "tls.crt", serving.certificate)
    key = pki.write_private_key(tmp_path / "tls.key", serving.private_key)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = Backend()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    server.port = runner.addresses[0][1]
    try:
        yield server, pki.certificate_pem(ca.certificate)
    finally:
        await runner.cleanup()


async def register(fake_kube: FakeKubeAPI, backend: tuple[Backend, bytes],
                   *services: tuple[str, str, int]) -> None:
    """APIServices (group, version, versionPriority) for the backend; wait until Available."""
    server, ca_pem = backend
    fake_kube.set_service_endpoint(*SERVICE, "127.0.0.1", server.port)
    for group, version, priority in services:
        fake_kube.create_apiservice(group=group, version=version, service_namespace=SERVICE[0],
                                    service_name=SERVICE[1], ca_bundle=ca_pem,
                                    version_priority=priority)
    for group, version, _ in services:
        await fake_kube.wait_for_apiservice(f"{version}.{group}")


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
async def metrics(fake_kube: FakeKubeAPI) -> AsyncIterator[MetricsClient]:
    async with open_kube_http(fake_kube.api_client_configuration()) as http:
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
        fake_kube: FakeKubeAPI, backend: tuple[Backend, bytes], metrics: MetricsClient) -> None:
    await register(fake_kube, backend, *CUSTOM_BOTH)
    server = backend[0]
    path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop/pods/*/http_requests"
    server.answers[path] = (200, metric_value_list("v1beta2", ["web-1", "web-2"]))
    body = await metrics.get_pods_metric(
        namespace="shop", metric_name="http_requests", pod_selector="app=web,tier=front",
        metric_selector={"matchLabels": {"verb": "GET"}})
    assert [i["describedObject"]["name"] for i in body["items"]] == ["web-1", "web-2"]
    expected = (path, [("labelSelector", "app=web,tier=front"),
                       ("metricLabelSelector", "verb=GET")])
    assert server.received == [expected]
    [seen] = fake_kube.requests_to("^/apis/custom.metrics.k8s.io/v1beta2/namespaces")
    assert (seen.path, list(seen.query)) == expected


async def test_v1beta1_only_adapter_is_asked_in_v1beta1_and_decoded_to_v1beta2(
        fake_kube: FakeKubeAPI, backend: tuple[Backend, bytes], metrics: MetricsClient) -> None:
    await register(fake_kube, backend, ("custom.metrics.k8s.io", "v1beta1", 100))
    server = backend[0]
    path = "/apis/custom.metrics.k8s.io/v1beta1/namespaces/shop/pods/*/http_requests"
    server.answers[path] = (200, metric_value_list("v1beta1", ["web-1"]))
    body = await metrics.get_pods_metric(namespace="shop", metric_name="http_requests",
                                         pod_selector="app=web", metric_selector=None)
    assert server.received == [(path, [("labelSelector", "app=web")])]
    assert body["apiVersion"] == "custom.metrics.k8s.io/v1beta2"
    assert body["items"][0]["metric"] == {"name": "http_requests"}
    assert body["items"][0]["windowSeconds"] == 60


async def test_object_metric_path_has_the_group_qualified_resource(
        fake_kube: FakeKubeAPI, backend: tuple[Backend, bytes], metrics: MetricsClient) -> None:
    await register(fake_kube, backend, *CUSTOM_BOTH)
    server = backend[0]
    path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop/deployments.apps/web/rps"
    server.answers[path] = (200, metric_value_list("v1beta2", ["web"]))
    await metrics.get_object_metric(
        namespace="shop", metric_name="rps",
        described_object={"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
        metric_selector=None)
    assert server.received == [(path, [])]


async def test_namespace_metric_uses_the_metrics_pseudo_resource(
        fake_kube: FakeKubeAPI, backend: tuple[Backend, bytes], metrics: MetricsClient) -> None:
    await register(fake_kube, backend, *CUSTOM_BOTH)
    server = backend[0]
    path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop/metrics/queue_length"
    server.answers[path] = (200, metric_value_list("v1beta2", ["shop"]))
    await metrics.get_object_metric(
        namespace="shop", metric_name="queue_length",
        described_object={"apiVersion": "v1", "kind": "Namespace", "name": "shop"},
        metric_selector={"matchExpressions": [{"key": "queue", "operator": "In",
                                               "values": ["b", "a"]}]})
    assert server.received == [(path, [("metricLabelSelector", "queue in (a,b)")])]


async def test_external_metric_is_lower_cased_with_its_selector(
        fake_kube: FakeKubeAPI, backend: tuple[Backend, bytes], metrics: MetricsClient) -> None:
    await register(fake_kube, backend, ("external.metrics.k8s.io", "v1beta1", 100))
    server = backend[0]
    path = "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/queue_messages_ready"
    server.answers[path] = (200, {
        "kind": "ExternalMetricValueList", "apiVersion": "external.metrics.k8s.io/v1beta1",
        "metadata": {}, "items": [{"metricName": "queue_messages_ready",
                                   "metricLabels": {"queue": "orders"},
                                   "timestamp": "2024-05-01T12:00:00Z", "value": "1200"}]})
    body = await metrics.get_external_metric(
        namespace="shop", metric_name="Queue_Messages_Ready",
        metric_selector={"matchLabels": {"queue": "orders"}})
    assert body["items"][0]["value"] == "1200"
    assert server.received == [(path, [("labelSelector", "queue=orders")])]


async def test_resource_metrics_list_pod_metrics_by_selector(
        fake_kube: FakeKubeAPI, backend: tuple[Backend, bytes], metrics: MetricsClient) -> None:
    await register(fake_kube, backend, ("metrics.k8s.io", "v1beta1", 100))
    server = backend[0]
    path = "/apis/metrics.k8s.io/v1beta1/namespaces/shop/pods"
    server.answers[path] = (200, {
        "kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1", "metadata": {},
        "items": [{"metadata": {"name": "web-1", "namespace": "shop"},
                   "timestamp": "2024-05-01T12:00:00Z", "window": "30s",
                   "containers": [{"name": "app", "usage": {"cpu": "250m",
                                                            "memory": "64Mi"}}]}]})
    body = await metrics.get_resource_metrics(namespace="shop", pod_selector="app in (web)")
    assert body["items"][0]["containers"][0]["usage"]["cpu"] == "250m"
    assert server.received == [(path, [("labelSelector", "app in (web)")])]


async def test_adapter_status_errors_reach_the_caller_with_upstreams_prefix(
        fake_kube: FakeKubeAPI, backend: tuple[Backend, bytes], metrics: MetricsClient) -> None:
    await register(fake_kube, backend, *CUSTOM_BOTH)
    with pytest.raises(MetricsError) as caught:
        await metrics.get_pods_metric(namespace="shop", metric_name="nope",
                                      pod_selector="app=web", metric_selector=None)
    assert str(caught.value) == ("unable to fetch metrics from custom metrics API: the server "
                                 "could not find the requested resource")


async def test_unreachable_adapter_reads_like_the_hpas_familiar_error(
        fake_kube: FakeKubeAPI, backend: tuple[Backend, bytes], metrics: MetricsClient) -> None:
    await register(fake_kube, backend, *CUSTOM_BOTH)
    fake_kube.remove_service_endpoint(*SERVICE)
    with pytest.raises(MetricsError) as caught:
        await metrics.get_pods_metric(namespace="shop", metric_name="http_requests",
                                      pod_selector="app=web", metric_selector=None)
    assert str(caught.value) == (
        "unable to fetch metrics from custom metrics API: the server is currently unable to "
        "handle the request (get pods.custom.metrics.k8s.io *)")
    # Not retried, as upstream's HPA does not: the next sync period is the retry.
    assert len(fake_kube.requests_to("^/apis/custom.metrics.k8s.io/v1beta2/namespaces")) == 1


async def test_no_custom_metrics_api_registered(fake_kube: FakeKubeAPI,
                                                metrics: MetricsClient) -> None:
    with pytest.raises(MetricsError) as caught:
        await metrics.get_pods_metric(namespace="shop", metric_name="http_requests",
                                      pod_selector="app=web", metric_selector=None)
    assert str(caught.value) == ("unable to fetch metrics from custom metrics API: no custom "
                                 "metrics API (custom.metrics.k8s.io) registered")
