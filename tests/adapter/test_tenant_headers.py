"""Tenant backends, header by header: with several headers templated over the namespace each
carries its own value (or its own default), and `resourceRules` on a tenant backend send no
query for a namespace whose tenant the backend does not serve (its pods are left out with a
Warning, a single pod is metrics-server's 404). A real Prometheus sits behind a proxy that
records the tenant headers of each request; the pods, namespaces and node are real objects of
the session's control plane, each test's in namespaces of its own and labelled so that a list
of every namespace's pods selects only them (the cluster is shared)."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from adapter.rules.config import ConfigError, parse_config
from adapter.rules.tenants import backend_tenants, tenant_headers, tenant_of
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus_fixtures import PrometheusFactory
from tests.adapter.cluster import ModuleCluster, Names, Objects, node_manifest, pod_manifest
from tests.adapter.harness import Reply, RunningAdapter, wait_for_series
from tests.adapter.test_backends import (
    CUSTOM,
    POD_RULE,
    adapter_for,
    forwarding_proxy,
    serving,
    value_of,
)
from tests.adapter.test_tenant_namespaces import SEEDED, namespaces_seen

NAMES = Names.unique("theaders")
# Each test's own namespaces: the first follows the namespaces, the second lists its tenants.
SHOP, BANK, LATE = (NAMES.namespace(n) for n in ("shop", "bank", "late"))
LISTED, UNLISTED, OTHER = (NAMES.namespace(n) for n in ("listed", "unlisted", "other"))
NODE = NAMES.cluster("node-1")
TEST_LABEL = "metricscale.test/pods"
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


def of_test(test: str) -> str:
    """The label selector of one test's pods, for lists of every namespace's pods."""
    return "labelSelector=" + urllib.parse.quote(f"{TEST_LABEL}={test}", safe="")


async def run_pods(cluster: ModuleCluster, namespaces: tuple[str, ...], *, test: str) -> None:
    """The module's namespaces `namespaces` (created), each with pod web-0 running on the
    module's node, labelled for `test`."""
    pods: list[dict[str, Any]] = []
    for name in namespaces:
        namespace = cluster.namespace(name)
        pods.append(pod_manifest("web-0", namespace, labels={TEST_LABEL: test}, node=NODE))
    async with Objects(cluster.control_plane) as objects:
        await objects.run(*pods)


async def running_pod_seen(adapter: RunningAdapter, namespace: str) -> None:
    """Until the adapter's pod cache has web-0 of `namespace` running."""
    while True:
        if await adapter.object_caches.running_pod(namespace, "web-0") is not None:
            return
        await asyncio.sleep(0.02)


async def node_served(adapter: RunningAdapter, name: str) -> Reply:
    """The node's NodeMetrics, once the adapter's node cache has the node (404 until then)."""
    while True:
        reply = await adapter.get(f"{RESOURCE}/nodes/{name}")
        if reply.status != 404:
            return reply
        await asyncio.sleep(0.02)


def ours(tenants: set[tuple[str | None, ...]], *namespaces: str,
         ) -> set[tuple[str | None, ...]]:
    """The tenants of kube-apiserver's namespaces, of `namespaces` and the default (others'
    namespaces come and go, and get tenants too)."""
    watched = SEEDED | set(namespaces)
    return {t for t in tenants if t[0] == "platform" or t[0] in watched}


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
        prometheus_factory: PrometheusFactory, tmp_path: Path, cluster: ModuleCluster) -> None:
    seen: Seen = []
    with Exporter() as exporter:
        export_pods(exporter, (SHOP, BANK, LATE))
        exporter.set("th_node_cpu", {"node": NODE}, 1)
        exporter.set("th_node_memory", {"node": NODE}, 4096)
        prometheus = serving(prometheus_factory, exporter)
        await wait_for_series(prometheus, '{__name__=~"th_.*"}', 11)
        await run_pods(cluster, ("shop", "bank"), test="headers")
        async with recording_proxy(prometheus.url, seen) as proxy_url, \
                adapter_for(tmp_path, mimir(proxy_url, headers=TWO_HEADERS), prometheus.url,
                            cluster=cluster) as adapter:
            # Discovery: one tenant per namespace, each header with its own rendering.
            discovered = {tenant for path, tenant in seen if path.endswith("/series")}
            assert ours(discovered, SHOP, BANK, LATE) == {
                (name, f"team-{name}") for name in SEEDED | {SHOP, BANK}} | {
                ("platform", "ops")}
            for namespace in (SHOP, BANK):
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
            node = node_manifest(NODE)
            cluster.cleanup.add(node)
            cluster.control_plane.apply(node)
            reply = await node_served(adapter, NODE)
            assert reply.status == 200, reply
            seen.clear()
            assert (await adapter.get(f"{RESOURCE}/nodes/{NODE}")).status == 200
            assert queries(seen) == [("/api/v1/query", ("platform", "ops"))] * 2

            # A namespace made after the discovery pass has running pods, but its tenant is
            # not discovered until the next pass: resource metrics send nothing for it.
            await run_pods(cluster, ("late",), test="headers")
            await running_pod_seen(adapter, LATE)
            seen.clear()
            listed = await adapter.get(f"{RESOURCE}/pods?{of_test('headers')}")
            assert listed.status == 200, listed
            assert {(item["metadata"]["namespace"], item["metadata"]["name"])
                    for item in listed.json()["items"]} == {(SHOP, "web-0"), (BANK, "web-0")}
            assert "1 of 3 running pods are left out: backend 'mimir' of resourceRules.cpu " \
                f"does not serve the tenant of namespace {LATE}" in listed.headers["Warning"]
            assert sorted(tenant for _, tenant in queries(seen)) == sorted(
                [(BANK, f"team-{BANK}")] * 2 + [(SHOP, f"team-{SHOP}")] * 2)
            seen.clear()
            late = await adapter.get(f"{RESOURCE}/namespaces/{LATE}/pods/web-0")
            assert late.status == 404, late
            assert late.json()["message"] == f'podmetrics.metrics.k8s.io "{LATE}/web-0" not found'
            assert f"does not serve the tenant of namespace {LATE}" in late.headers["Warning"]
            assert seen == []
            # The next pass discovers its tenant, and then its pod is served under it.
            await namespaces_seen(adapter, until={LATE})
            assert await adapter.relister.step() is True
            seen.clear()
            late = await adapter.get(f"{RESOURCE}/namespaces/{LATE}/pods/web-0")
            assert late.status == 200, late
            assert queries(seen) == [("/api/v1/query", (LATE, f"team-{LATE}"))] * 2


@pytest.mark.prometheus
async def test_resource_rules_send_nothing_for_a_namespace_whose_tenant_is_not_listed(
        prometheus_factory: PrometheusFactory, tmp_path: Path, cluster: ModuleCluster) -> None:
    seen: Seen = []
    with Exporter() as exporter:
        export_pods(exporter, (LISTED, UNLISTED, OTHER))
        prometheus = serving(prometheus_factory, exporter)
        await wait_for_series(prometheus, '{__name__=~"th_.*"}', 9)
        await run_pods(cluster, ("listed", "unlisted", "other"), test="listed")
        async with recording_proxy(prometheus.url, seen) as proxy_url, \
                adapter_for(tmp_path, mimir(proxy_url, headers=ONE_HEADER,
                                            tenants=f"  tenants: [{LISTED}]\n"),
                            prometheus.url, cluster=cluster) as adapter:
            # Only the listed tenant and the default are discovered.
            assert {tenant for path, tenant in seen if path.endswith("/series")} == {
                (LISTED, None), ("platform", None)}
            seen.clear()
            shop = await adapter.get(f"{RESOURCE}/namespaces/{LISTED}/pods")
            assert [item["metadata"]["name"] for item in shop.json()["items"]] == ["web-0"]
            assert "Warning" not in shop.headers
            assert queries(seen) == [("/api/v1/query", (LISTED, None))] * 2
            seen.clear()
            listed = await adapter.get(f"{RESOURCE}/namespaces/{UNLISTED}/pods")
            assert listed.status == 200, listed
            assert listed.json()["items"] == []
            assert "1 of 1 running pods are left out: backend 'mimir' of resourceRules.cpu " \
                f"does not serve the tenant of namespace {UNLISTED} (not in its tenants, or " \
                "not discovered yet)" in listed.headers["Warning"]
            every = await adapter.get(f"{RESOURCE}/pods?{of_test('listed')}")
            assert [item["metadata"]["namespace"] for item in every.json()["items"]] == [LISTED]
            assert "2 of 3 running pods are left out" in every.headers["Warning"]
            assert "and 1 more namespaces" in every.headers["Warning"]
            single = await adapter.get(f"{RESOURCE}/namespaces/{OTHER}/pods/web-0")
            assert single.status == 404, single
            assert single.json()["reason"] == "NotFound"
            # Only the listed tenant's namespace was ever asked about.
            assert {tenant for _, tenant in queries(seen)} == {(LISTED, None)}


def test_tenants_cannot_be_listed_with_several_templated_headers() -> None:
    with pytest.raises(ConfigError, match="cannot list tenants with several headers"):
        parse_config(mimir("http://m", headers=TWO_HEADERS, tenants="  tenants: [shop]\n"))
