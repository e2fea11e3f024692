"""Several Prometheus backends: each rule is discovered on and queried from its own backend, a
backend that goes away fails only its own metrics, and a tenant backend sends each request's
tenant (from its namespace) in its header."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import PrometheusServer
from testbed.fakes.prometheus_fixtures import PrometheusFactory
from tests.adapter.cluster import ModuleCluster, Names, pod_manifest
from tests.adapter.harness import RunningAdapter, running_adapter, wait_for_series

pytestmark = [pytest.mark.prometheus]

NAMES = Names.unique("backends")
SHOP, BANK, OTHER = (NAMES.namespace(n) for n in ("shop", "bank", "other"))
CUSTOM = "/apis/custom.metrics.k8s.io/v1beta2"
EXTERNAL = "/apis/external.metrics.k8s.io/v1beta1"
POD_RULE = """
- seriesQuery: '{name}{{namespace!="",pod!=""}}'
  {backend}
  resources: {{overrides: {{namespace: {{resource: namespace}}, pod: {{resource: pod}}}}}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
"""


def two_backends_config(beta_url: str) -> str:
    return ("backends:\n- name: beta\n  url: " + beta_url + "\nrules:"
            + POD_RULE.format(name="alpha_requests", backend="")
            + POD_RULE.format(name="alpha_late", backend="")
            + POD_RULE.format(name="beta_requests", backend="backend: beta")
            + """externalRules:
- seriesQuery: 'beta_queue'
  backend: beta
  resources: {overrides: {namespace: {resource: namespace}}}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (queue)'
""")


def serving(prometheus_factory: PrometheusFactory, exporter: Exporter) -> PrometheusServer:
    server = prometheus_factory()
    server.add_target(exporter)
    return server


@pytest.fixture(scope="module")
def pods(cluster: ModuleCluster) -> ModuleCluster:
    """Pod web-0 in each of the module's namespaces shop, bank and other."""
    for namespace in ("shop", "bank", "other"):
        cluster.control_plane.apply(pod_manifest("web-0", cluster.namespace(namespace)))
    return cluster


@contextlib.asynccontextmanager
async def adapter_for(tmp_path: Path, config: str, prometheus_url: str, *,
                      cluster: ModuleCluster) -> AsyncIterator[RunningAdapter]:
    async with running_adapter(workdir=tmp_path / "adapter", config_text=config,
                               prometheus_url=prometheus_url,
                               kubeconfig=cluster.adapter_kubeconfig()) as adapter:
        yield adapter


def value_of(reply_json: dict[str, object]) -> object:
    items = reply_json["items"]
    assert isinstance(items, list) and len(items) == 1, items
    return items[0]["value"]


# --------------------------------------------------------------------------------------------
# Two backends


async def test_each_rule_is_discovered_and_queried_on_its_own_backend(
        prometheus_factory: PrometheusFactory, tmp_path: Path, pods: ModuleCluster) -> None:
    with Exporter() as alpha_exporter, Exporter() as beta_exporter:
        alpha_exporter.set("alpha_requests", {"namespace": SHOP, "pod": "web-0"}, 3)
        beta_exporter.set("beta_requests", {"namespace": SHOP, "pod": "web-0"}, 7)
        beta_exporter.set("beta_queue", {"namespace": SHOP, "queue": "q"}, 11)
        alpha = serving(prometheus_factory, alpha_exporter)
        beta = serving(prometheus_factory, beta_exporter)
        await wait_for_series(alpha, "alpha_requests", 1)
        await wait_for_series(beta, '{__name__=~"beta_.*"}', 2)
        async with adapter_for(tmp_path, two_backends_config(beta.url), alpha.url,
                               cluster=pods) as adapter:
            listing = (await adapter.get(CUSTOM)).json()
            names = {resource["name"] for resource in listing["resources"]}
            assert {"pods/alpha_requests", "pods/beta_requests"} <= names
            alpha_reply = await adapter.get(f"{CUSTOM}/namespaces/{SHOP}/pods/web-0/alpha_requests")
            assert value_of(alpha_reply.json()) == "3"
            beta_reply = await adapter.get(f"{CUSTOM}/namespaces/{SHOP}/pods/web-0/beta_requests")
            assert value_of(beta_reply.json()) == "7"
            queue = await adapter.get(f"{EXTERNAL}/namespaces/{SHOP}/beta_queue")
            assert value_of(queue.json()) == "11"
            text = (await adapter.get("/metrics")).text
            assert ('metricscale_prometheus_request_duration_seconds_count{backend="beta",'
                    'endpoint="query"}') in text
            assert ('metricscale_prometheus_request_duration_seconds_count{backend="default",'
                    'endpoint="series"}') in text


@pytest.mark.shipped_interpreter
async def test_a_stopped_backend_fails_only_its_own_metrics(
        prometheus_factory: PrometheusFactory, tmp_path: Path, pods: ModuleCluster) -> None:
    with Exporter() as alpha_exporter, Exporter() as beta_exporter:
        alpha_exporter.set("alpha_requests", {"namespace": SHOP, "pod": "web-0"}, 3)
        beta_exporter.set("beta_requests", {"namespace": SHOP, "pod": "web-0"}, 7)
        beta_exporter.set("beta_queue", {"namespace": SHOP, "queue": "q"}, 11)
        alpha = serving(prometheus_factory, alpha_exporter)
        beta = serving(prometheus_factory, beta_exporter)
        await wait_for_series(alpha, "alpha_requests", 1)
        await wait_for_series(beta, '{__name__=~"beta_.*"}', 2)
        async with adapter_for(tmp_path, two_backends_config(beta.url), alpha.url,
                               cluster=pods) as adapter:
            beta.stop()
            down = await adapter.get(f"{CUSTOM}/namespaces/{SHOP}/pods/web-0/beta_requests")
            assert down.status == 503, down
            assert str(beta.port) not in down.text
            assert (await adapter.get(f"{EXTERNAL}/namespaces/{SHOP}/beta_queue")).status == 503
            up = await adapter.get(f"{CUSTOM}/namespaces/{SHOP}/pods/web-0/alpha_requests")
            assert value_of(up.json()) == "3"
            # Discovery on the other backend goes on; the stopped one keeps its snapshot.
            alpha_exporter.set("alpha_late", {"namespace": SHOP, "pod": "web-0"}, 5)
            await wait_for_series(alpha, "alpha_late", 1)
            assert await adapter.relister.step() is False
            names = {resource["name"] for resource in
                     (await adapter.get(CUSTOM)).json()["resources"]}
            assert {"pods/alpha_late", "pods/beta_requests"} <= names
            late = await adapter.get(f"{CUSTOM}/namespaces/{SHOP}/pods/web-0/alpha_late")
            assert value_of(late.json()) == "5"
            assert (await adapter.get("/readyz")).status == 200
            # /metrics tells the backends' discovery apart: beta's pass failed, its snapshot
            # ages; default's passed.
            text = (await adapter.get("/metrics")).text
            assert 'metricscale_discovery_passes_total{backend="beta",result="failure"} 1.0' \
                in text
            assert 'metricscale_discovery_passes_total{backend="default",result="success"} 2.0' \
                in text
            ages = {line.split("{", 1)[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith("metricscale_discovery_age_seconds{")}
            assert set(ages) == {'backend="beta"', 'backend="default"'}
            assert ages['backend="beta"'] > ages['backend="default"']
            assert 'metricscale_discovery_last_success_timestamp_seconds{backend="beta"}' in text


# --------------------------------------------------------------------------------------------
# Tenants


@contextlib.asynccontextmanager
async def forwarding_proxy(upstream: str, record: Callable[[web.Request], None],
                           ) -> AsyncIterator[str]:
    """An HTTP proxy in front of Prometheus that calls `record` with each request it forwards."""
    async with aiohttp.ClientSession() as session:
        async def forward(request: web.Request) -> web.StreamResponse:
            record(request)
            headers = {key: value for key, value in request.headers.items()
                       if key.lower() in ("content-type", "accept")}
            async with session.request(request.method, upstream + request.path_qs,
                                       data=await request.read(), headers=headers) as reply:
                body = await reply.read()
                return web.Response(body=body, status=reply.status,
                                    content_type=reply.content_type)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()


def recording_proxy(upstream: str, seen: list[tuple[str, str | None]],
                    ) -> contextlib.AbstractAsyncContextManager[str]:
    """An HTTP proxy in front of Prometheus that records (path, X-Scope-OrgID) per request."""
    return forwarding_proxy(upstream, lambda request: seen.append(
        (request.path, request.headers.get("X-Scope-OrgID"))))


def tenant_config(proxy_url: str) -> str:
    return ("backends:\n- name: mimir\n  url: " + proxy_url + "\n"
            "  headers:\n    X-Scope-OrgID: {value: \"<<.Namespace>>\", default: platform}\n"
            f"  tenants: [{SHOP}, {BANK}]\nrules:"
            + POD_RULE.format(name="tenant_requests", backend="backend: mimir")
            + """- seriesQuery: 'tenant_node_load{node!=""}'
  backend: mimir
  resources: {overrides: {node: {resource: node}}}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
""")


async def test_a_tenant_header_carries_each_requests_namespace_or_the_default(
        prometheus_factory: PrometheusFactory, tmp_path: Path, pods: ModuleCluster) -> None:
    seen: list[tuple[str, str | None]] = []
    with Exporter() as exporter:
        for namespace in (SHOP, BANK, OTHER):
            exporter.set("tenant_requests", {"namespace": namespace, "pod": "web-0"}, 2)
        exporter.set("tenant_node_load", {"node": "n1"}, 4)
        prometheus = serving(prometheus_factory, exporter)
        await wait_for_series(prometheus, '{__name__=~"tenant_.*"}', 4)
        async with recording_proxy(prometheus.url, seen) as proxy_url, \
                adapter_for(tmp_path, tenant_config(proxy_url), prometheus.url,
                            cluster=pods) as adapter:
            assert {tenant for path, tenant in seen if path.endswith("/series")} == {
                SHOP, BANK, "platform"}
            for namespace in (SHOP, BANK):
                seen.clear()
                reply = await adapter.get(
                    f"{CUSTOM}/namespaces/{namespace}/pods/web-0/tenant_requests")
                assert value_of(reply.json()) == "2"
                assert seen == [("/api/v1/query", namespace)]
            seen.clear()
            node = await adapter.get(f"{CUSTOM}/nodes/n1/tenant_node_load")
            assert value_of(node.json()) == "4"
            assert seen == [("/api/v1/query", "platform")]
            # A namespace whose tenant is not listed: its tenant has no metric, nothing is asked.
            seen.clear()
            other = await adapter.get(f"{CUSTOM}/namespaces/{OTHER}/pods/web-0/tenant_requests")
            assert other.status == 404
            assert seen == []
