"""A tenant backend without `tenants:` follows the namespaces: one tenant per namespace the
adapter sees (plus the header's default), added and dropped at the next discovery pass without
a reload, with a real Prometheus behind a proxy that records each request's X-Scope-OrgID."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from adapter.http.app import SNAPSHOTS_KEY
from adapter.prometheus.backends import BackendClients, RelistTarget
from adapter.prometheus.relisting import Relister, Relisting, RelistMetrics
from adapter.prometheus.tenancy import NamespaceTenants
from adapter.rules.config import parse_config
from adapter.rules.resources import NAMESPACES, builtin_catalog
from adapter.settings import PrometheusSettings
from metricscale.core.selectors import Selector
from metricscale.kube.errors import KubeUnavailable
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus_fixtures import PrometheusFactory
from tests.adapter.cluster import ModuleCluster, Names, pod_manifest
from tests.adapter.harness import RunningAdapter, running_adapter, wait_for_series
from tests.adapter.test_backends import (
    CUSTOM,
    POD_RULE,
    recording_proxy,
    serving,
    value_of,
)

NAMES = Names.unique("tenants")
SHOP, BANK, OTHER = (NAMES.namespace(n) for n in ("shop", "bank", "other"))
# kube-apiserver's own namespaces; the cluster is shared, so the tests look at these and their
# own (other tests' namespaces come and go, and get tenants too).
SEEDED = {"default", "kube-system", "kube-public", "kube-node-lease"}
WATCHED = SEEDED | {SHOP, BANK, OTHER}


def ours(tenants: set[str | None]) -> set[str | None]:
    """The tenants of the namespaces this module looks at, and the default."""
    return {t for t in tenants if t == "platform" or (t or "").removeprefix("team-") in WATCHED}


def following_config(proxy_url: str) -> str:
    return ("backends:\n- name: mimir\n  url: " + proxy_url + "\n"
            "  headers:\n    X-Scope-OrgID: {value: \"team-<<.Namespace>>\", "
            "default: platform}\nrules:"
            + POD_RULE.format(name="tenant_requests", backend="backend: mimir"))


def namespace_with_a_pod(cluster: ModuleCluster, name: str) -> str:
    namespace = cluster.namespace(name)
    cluster.control_plane.apply(pod_manifest("web-0", namespace))
    return namespace


@contextlib.asynccontextmanager
async def adapter_with_namespaces(tmp_path: Path, config: str, prometheus_url: str, *,
                                  cluster: ModuleCluster) -> AsyncIterator[RunningAdapter]:
    for name in ("shop", "bank"):
        namespace_with_a_pod(cluster, name)
    async with running_adapter(workdir=tmp_path / "adapter", config_text=config,
                               prometheus_url=prometheus_url,
                               kubeconfig=cluster.adapter_kubeconfig()) as adapter:
        yield adapter


async def namespaces_seen(adapter: RunningAdapter, *, until: set[str] | None = None,
                          without: str | None = None) -> list[str]:
    """The adapter's namespace cache, once it has `until` in it, or not `without` (a deleted
    namespace is gone once kube-apiserver has finalized it)."""
    while True:
        names = await adapter.object_caches.select(NAMESPACES, namespace=None,
                                                   selector=Selector.everything())
        if (until is None or until <= set(names)) and (without is None or without not in names):
            return list(names)
        await asyncio.sleep(0.02)


def series_tenants(seen: list[tuple[str, str | None]]) -> set[str | None]:
    return {tenant for path, tenant in seen if path.endswith("/series")}


@pytest.mark.prometheus
async def test_without_tenants_discovery_follows_the_namespaces(
        prometheus_factory: PrometheusFactory, tmp_path: Path, cluster: ModuleCluster) -> None:
    seen: list[tuple[str, str | None]] = []
    with Exporter() as exporter:
        for namespace in (SHOP, BANK, OTHER):
            exporter.set("tenant_requests", {"namespace": namespace, "pod": "web-0"}, 2)
        prometheus = serving(prometheus_factory, exporter)
        await wait_for_series(prometheus, "tenant_requests", 3)
        async with recording_proxy(prometheus.url, seen) as proxy_url, \
                adapter_with_namespaces(tmp_path, following_config(proxy_url),
                                        prometheus.url, cluster=cluster) as adapter:
            snapshot = adapter.app[SNAPSHOTS_KEY].current
            backends = snapshot.backends
            # Every namespace's tenant (the template over its name), and the default.
            expected = {f"team-{name}" for name in SEEDED | {SHOP, BANK}} | {"platform"}
            assert ours(series_tenants(seen)) == expected
            assert ours(backends.tenants("mimir")) == expected
            seen.clear()
            reply = await adapter.get(f"{CUSTOM}/namespaces/{SHOP}/pods/web-0/tenant_requests")
            assert value_of(reply.json()) == "2"
            assert seen == [("/api/v1/query", f"team-{SHOP}")]
            # A namespace the adapter has not seen: no tenant, nothing asked.
            seen.clear()
            other = await adapter.get(f"{CUSTOM}/namespaces/{OTHER}/pods/web-0/tenant_requests")
            assert other.status == 404, other
            assert seen == []

            # A new namespace: its tenant is added, and discovered, at the next pass.
            kept = {r.tenant: r for r in snapshot.discovery.relisters}
            shop_client = backends.client_for("mimir", namespace=SHOP, tenants=None)
            namespace_with_a_pod(cluster, "other")
            await namespaces_seen(adapter, until={OTHER})
            seen.clear()
            assert await adapter.relister.step() is True
            assert f"team-{OTHER}" in series_tenants(seen)
            assert ours(backends.tenants("mimir")) == expected | {f"team-{OTHER}"}
            seen.clear()
            other = await adapter.get(f"{CUSTOM}/namespaces/{OTHER}/pods/web-0/tenant_requests")
            assert value_of(other.json()) == "2"
            assert seen == [("/api/v1/query", f"team-{OTHER}")]
            # The other tenants keep their relisters and clients.
            now = {r.tenant: r for r in snapshot.discovery.relisters}
            # (the other modules' namespaces come and go on the shared cluster)
            assert all(now[tenant] is relister for tenant, relister in kept.items()
                       if ours({tenant}))
            assert backends.client_for("mimir", namespace=SHOP, tenants=None) is shop_client

            # A deleted namespace: its tenant is dropped at the next pass; its client retired.
            cluster.control_plane.delete({"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": BANK}})
            await namespaces_seen(adapter, without=BANK)
            seen.clear()
            retiring = backends.retiring
            assert await adapter.relister.step() is True
            assert f"team-{BANK}" not in series_tenants(seen)
            assert ours(backends.tenants("mimir")) == \
                expected - {f"team-{BANK}"} | {f"team-{OTHER}"}
            assert f"team-{BANK}" not in {r.tenant for r in snapshot.discovery.relisters}
            assert backends.retiring >= retiring + 1  # (others' namespaces may go too)
            seen.clear()
            bank = await adapter.get(f"{CUSTOM}/namespaces/{BANK}/pods/web-0/tenant_requests")
            assert bank.status == 404, bank
            assert seen == []
            # No reload happened, and the adapter stayed ready throughout.
            assert adapter.app[SNAPSHOTS_KEY].current is snapshot
            assert (await adapter.get("/readyz")).status == 200
            shop = await adapter.get(f"{CUSTOM}/namespaces/{SHOP}/pods/web-0/tenant_requests")
            assert value_of(shop.json()) == "2"


# --------------------------------------------------------------------------------------------
# The tenant pass on its own (no request is sent: the relisters are never stepped)


class Namespaces:
    def __init__(self, *names: str) -> None:
        self.names: list[str] = list(names)
        self.down = False

    async def __call__(self) -> list[str]:
        if self.down:
            raise KubeUnavailable("the namespace cache is not filled yet")
        return list(self.names)


@contextlib.asynccontextmanager
async def tenant_pass(namespaces: Namespaces, *, limit: int,
                      ) -> AsyncIterator[tuple[BackendClients, Relisting]]:
    config = parse_config("backends:\n- name: mimir\n  url: http://127.0.0.1:9\n"
                          "  headers:\n    X-Scope-OrgID: {value: \"<<.Namespace>>\", "
                          "default: platform}\nrules:"
                          + POD_RULE.format(name="tenant_requests", backend="backend: mimir"))
    registry = CollectorRegistry()
    metrics = RelistMetrics.register(registry)
    async with BackendClients(config=config, flags=PrometheusSettings(url="http://127.0.0.1:9"),
                              registry=registry) as backends:
        def relister(target: RelistTarget) -> Relister:
            return Relister(config=config, lister=target.client, catalog=builtin_catalog,
                            interval=Decimal(60), max_age=Decimal(600), metrics=metrics,
                            clock=lambda: 0.0, backend=target.backend, tenant=target.tenant)

        tenants = NamespaceTenants(clients=backends, backends=["mimir"], namespaces=namespaces,
                                   relister=relister, interval=60.0, limit=limit)
        discovery = Relisting(config=config, catalog=builtin_catalog, metrics=metrics,
                              clock=lambda: 0.0, tenants=tenants)
        yield backends, discovery


async def test_the_tenant_pass_keeps_at_most_its_limit_and_the_tenants_it_has_first(
        caplog: pytest.LogCaptureFixture) -> None:
    namespaces = Namespaces("d", "c", "b")
    async with tenant_pass(namespaces, limit=2) as (backends, discovery):
        assert not discovery.has_succeeded  # the namespaces have not been read yet
        with caplog.at_level(logging.WARNING):
            assert await discovery.sync_tenants(passed=True)
        assert backends.tenants("mimir") == {"b", "c", "platform"}
        assert "the namespaces have 3 tenants; discovering 2 of them" in caplog.text
        assert {r.tenant for r in discovery.relisters} == {"b", "c"}
        # "a" sorts first, but the tenants already discovered stay.
        namespaces.names = ["a", "b", "c"]
        assert await discovery.sync_tenants(passed=True)
        assert backends.tenants("mimir") == {"b", "c", "platform"}
        # "c" goes: its client is retired, its relister dropped, "a" takes the room.
        namespaces.names = ["a", "b"]
        assert await discovery.sync_tenants(passed=True)
        assert backends.tenants("mimir") == {"a", "b", "platform"}
        assert {r.tenant for r in discovery.relisters} == {"a", "b"}
        assert backends.retiring == 1
        # The namespaces cannot be read: nothing changes, the pass says why.
        namespaces.down = True
        assert not await discovery.sync_tenants(passed=True)
        assert backends.tenants("mimir") == {"a", "b", "platform"}
        assert discovery.failures == ["tenants of the namespaces: cannot list the namespaces: "
                                      "the namespace cache is not filled yet"]
        # The namespace named like the default does not take the default away when it goes.
        namespaces.down = False
        namespaces.names = ["platform"]
        assert await discovery.sync_tenants(passed=True)
        namespaces.names = []
        assert await discovery.sync_tenants(passed=True)
        assert backends.tenants("mimir") == {"platform"}
    assert backends.retiring == 0  # closed with the rest
