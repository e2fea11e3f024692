"""Tenant backends, header by header: with several headers templated over the namespace each
carries its own value (or its own default), and `resourceRules` on a tenant backend send no
query for a namespace whose tenant the backend does not serve (its pods are left out with a
Warning, a single pod is metrics-server's 404). A real Prometheus sits behind a proxy that
records the tenant headers of each request."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from adapter.rules.config import ConfigError, parse_config
from adapter.rules.tenants import backend_tenants, tenant_headers, tenant_of
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus_fixtures import PrometheusFactory
from tests.adapter.harness import wait_for_series
from tests.adapter.test_backends import (
    CUSTOM,
    POD_RULE,
    adapter_for,
    forwarding_proxy,
    serving,
    value_of,
)
from tests.adapter.test_tenant_namespaces import SEEDED, adapter_with_namespaces

RESOURCE = "/apis/metrics.k8s.io/v1beta1"
HEADERS = ("X-Scope-OrgID", "X-Team")
Seen = list[tuple[str, tuple[str | None, ...]]]


def recording_proxy(upstream: str, seen: Seen) -> contextlib.AbstractAsyncContextManager[str]:
    """An HTTP proxy in front of Prometheus that records (path, tenant headers) per request."""
    return forwarding_proxy(upstream, lambda request: seen.append(
        (request.path, tuple(request.headers.get(name) for name in HEADERS))))


RESOURCE_RULES = """resourceRules:
  cpu:
    containerQuery: 'sum(th_cpu{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
    nodeQuery: 'sum(th_node_cpu{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
    resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}, node: {resource: node}}}
    containerLabel: container
    backend: mimir
  memory:
    containerQuery: 'sum(th_memory{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
    nodeQuery: 'sum(th_node_memory{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
    resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}, node: {resource: node}}}
    containerLabel: container
    backend: mimir
  window: 1m
"""  # noqa: E501


def mimir(proxy_url: str, *, headers: str, tenants: str = "") -> str:
    return ("backends:\n- name: mimir\n  url: " + proxy_url + "\n  headers:\n" + headers
            + tenants + "rules:"
            + POD_RULE.format(name="th_requests", backend="backend: mimir")
            + RESOURCE_RULES)


TWO_HEADERS = ('    X-Scope-OrgID: {value: "<<.Namespace>>", default: platform}\n'
               '    X-Team: {value: "team-<<.Namespace>>", default: ops}\n')
ONE_HEADER = '    X-Scope-OrgID: {value: "<<.Namespace>>", default: platform}\n'


def export_pods(exporter: Exporter, namespaces: tuple[str, ...]) -> None:
    for namespace in namespaces:
        pod = {"namespace": namespace, "pod": "web-0"}
        exporter.set("th_requests", pod, 2)
        exporter.set("th_cpu", {**pod, "container": "app"}, 0.5)
        exporter.set("th_memory", {**pod, "container": "app"}, 1048576)


def queries(seen: Seen) -> Seen:
    return [(path, tenant) for path, tenant in seen if path.endswith("/query")]


def test_each_templated_header_renders_its_own_value_and_default() -> None:
    backend = parse_config(mimir("http://m", headers=TWO_HEADERS)).backends[0]
    shop = tenant_of(backend, "shop")
    assert shop is not None and shop != tenant_of(backend, "bank")
    assert tenant_headers(backend, shop) == (("X-Scope-OrgID", "shop"), ("X-Team", "team-shop"))
    default = tenant_of(backend, None)
    assert backend_tenants(backend) == (default,)
    assert tenant_headers(backend, default) == (("X-Scope-OrgID", "platform"),
                                                ("X-Team", "ops"))
    # With one templated header a tenant is named by its value, as before.
    single = parse_config(mimir("http://m", headers=ONE_HEADER)).backends[0]
    assert tenant_of(single, "shop") == "shop"
    assert backend_tenants(single) == ("platform",)


@pytest.mark.prometheus
async def test_several_templated_headers_each_carry_their_own_value(
        prometheus_factory: PrometheusFactory, tmp_path: Path) -> None:
    seen: Seen = []
    with Exporter() as exporter:
        export_pods(exporter, ("shop", "bank", "other"))
        exporter.set("th_node_cpu", {"node": "node-1"}, 1)
        exporter.set("th_node_memory", {"node": "node-1"}, 4096)
        prometheus = serving(prometheus_factory, exporter)
        await wait_for_series(prometheus, '{__name__=~"th_.*"}', 11)
        async with recording_proxy(prometheus.url, seen) as proxy_url, \
                adapter_with_namespaces(tmp_path, mimir(proxy_url, headers=TWO_HEADERS),
                                        prometheus.url) as (kube, adapter):
            # Discovery: one tenant per namespace, each header with its own rendering.
            assert {tenant for path, tenant in seen if path.endswith("/series")} == {
                (name, f"team-{name}") for name in SEEDED | {"shop", "bank"}} | {
                ("platform", "ops")}
            for namespace in ("shop", "bank"):
                seen.clear()
                reply = await adapter.get(
                    f"{CUSTOM}/namespaces/{namespace}/pods/web-0/th_requests")
                assert value_of(reply.json()) == "2"
                assert queries(seen) == [("/api/v1/query", (namespace, f"team-{namespace}"))]
                seen.clear()
                pod = await adapter.get(f"{RESOURCE}/namespaces/{namespace}/pods/web-0")
                assert pod.status == 200, pod
                assert queries(seen) == [("/api/v1/query", (namespace, f"team-{namespace}"))] * 2
            # Cluster-scoped: each header's own default.
            kube.create("", "v1", "nodes", {"apiVersion": "v1", "kind": "Node",
                                            "metadata": {"name": "node-1"}})
            deadline = asyncio.get_running_loop().time() + 10
            while (node := await adapter.get(f"{RESOURCE}/nodes/node-1")).status == 404:
                assert asyncio.get_running_loop().time() < deadline, node
                await asyncio.sleep(0.02)  # until the node cache has it
            assert node.status == 200, node
            seen.clear()
            assert (await adapter.get(f"{RESOURCE}/nodes/node-1")).status == 200
            assert queries(seen) == [("/api/v1/query", ("platform", "ops"))] * 2

            # "other" has pods but no namespace object: its tenant is not discovered, so
            # resource metrics send nothing for it.
            seen.clear()
            listed = await adapter.get(f"{RESOURCE}/pods")
            assert listed.status == 200, listed
            assert {(item["metadata"]["namespace"], item["metadata"]["name"])
                    for item in listed.json()["items"]} == {("shop", "web-0"), ("bank", "web-0")}
            assert "1 of 3 running pods are left out: backend 'mimir' of resourceRules.cpu " \
                "does not serve the tenant of namespace other" in listed.headers["Warning"]
            assert sorted(tenant for _, tenant in queries(seen)) == sorted(
                [("bank", "team-bank")] * 2 + [("shop", "team-shop")] * 2)
            seen.clear()
            other = await adapter.get(f"{RESOURCE}/namespaces/other/pods/web-0")
            assert other.status == 404, other
            assert other.json()["message"] == 'podmetrics.metrics.k8s.io "other/web-0" not found'
            assert "does not serve the tenant of namespace other" in other.headers["Warning"]
            assert seen == []


@pytest.mark.prometheus
async def test_resource_rules_send_nothing_for_a_namespace_whose_tenant_is_not_listed(
        prometheus_factory: PrometheusFactory, tmp_path: Path) -> None:
    seen: Seen = []
    with Exporter() as exporter:
        export_pods(exporter, ("shop", "bank", "other"))
        prometheus = serving(prometheus_factory, exporter)
        await wait_for_series(prometheus, '{__name__=~"th_.*"}', 9)
        async with recording_proxy(prometheus.url, seen) as proxy_url, \
                adapter_for(tmp_path, mimir(proxy_url, headers=ONE_HEADER,
                                            tenants="  tenants: [shop]\n"),
                            prometheus.url) as adapter:
            seen.clear()
            shop = await adapter.get(f"{RESOURCE}/namespaces/shop/pods")
            assert [item["metadata"]["name"] for item in shop.json()["items"]] == ["web-0"]
            assert "Warning" not in shop.headers
            assert queries(seen) == [("/api/v1/query", ("shop", None))] * 2
            seen.clear()
            listed = await adapter.get(f"{RESOURCE}/namespaces/bank/pods")
            assert listed.status == 200, listed
            assert listed.json()["items"] == []
            assert "1 of 1 running pods are left out: backend 'mimir' of resourceRules.cpu " \
                "does not serve the tenant of namespace bank (not in its tenants, or not " \
                "discovered yet)" in listed.headers["Warning"]
            every = await adapter.get(f"{RESOURCE}/pods")
            assert [item["metadata"]["namespace"] for item in every.json()["items"]] == ["shop"]
            assert "2 of 3 running pods are left out" in every.headers["Warning"]
            assert "and 1 more namespaces" in every.headers["Warning"]
            single = await adapter.get(f"{RESOURCE}/namespaces/other/pods/web-0")
            assert single.status == 404, single
            assert single.json()["reason"] == "NotFound"
            # Only the listed tenant's namespace was ever asked about.
            assert {tenant for _, tenant in queries(seen)} == {("shop", None)}


def test_tenants_cannot_be_listed_with_several_templated_headers() -> None:
    with pytest.raises(ConfigError, match="cannot list tenants with several headers"):
        parse_config(mimir("http://m", headers=TWO_HEADERS, tenants="  tenants: [shop]\n"))
