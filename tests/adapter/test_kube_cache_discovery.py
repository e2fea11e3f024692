"""The cluster catalog over the shared discovery client, and connecting, against a scripted API
server (no cluster needed)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry

from adapter.kube.catalog import ClusterCatalog, DiscoveredResources
from adapter.kube.objects import USER_AGENT
from adapter.rules.resources import GroupResource, ResourceInfo
from metricscale.kube.config import Configuration
from metricscale.kube.discovery import parse_aggregated_discovery
from metricscale.kube.errors import KubeConfigError, KubeUnavailable, UnknownResource
from metricscale.kube.http import KubeHTTP, connect, open_kube_http

ALL_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def resource(name: str, kind: str, *, namespaced: bool = True, singular: str = "",
             verbs: list[str] | None = None) -> dict[str, Any]:
    return {"name": name, "singularName": singular, "namespaced": namespaced, "kind": kind,
            "verbs": ALL_VERBS if verbs is None else verbs}


CORE = {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
    resource("pods", "Pod", singular="pod"),
    resource("pods/log", "Pod", verbs=["get"]),
    resource("nodes", "Node", namespaced=False, singular="node"),
    resource("bindings", "Binding", verbs=["create"]),
]}
APPS = {"kind": "APIResourceList", "groupVersion": "apps/v1", "resources": [
    resource("deployments", "Deployment", singular="deployment"),
    resource("deployments/scale", "Scale", verbs=["get", "patch", "update"]),
]}
WIDGETS_V1 = {"kind": "APIResourceList", "groupVersion": "example.com/v1", "resources": [
    resource("widgets", "Widget", namespaced=False, singular="widget")]}
WIDGETS_V1BETA1 = {"kind": "APIResourceList", "groupVersion": "example.com/v1beta1",
                   "resources": [resource("widgets", "Widget", namespaced=True,
                                          singular="widget"),
                                 resource("gadgets", "Gadget", singular="gadget")]}


def group(name: str, *versions: str, preferred: str) -> dict[str, Any]:
    return {"name": name, "versions": [{"groupVersion": f"{name}/{v}", "version": v}
                                       for v in versions],
            "preferredVersion": {"groupVersion": f"{name}/{preferred}", "version": preferred}}


LEGACY = {
    "/api": {"kind": "APIVersions", "versions": ["v1"]},
    "/api/v1": CORE,
    "/apis": {"kind": "APIGroupList", "groups": [
        group("apps", "v1", preferred="v1"),
        group("example.com", "v1beta1", "v1", preferred="v1")]},
    "/apis/apps/v1": APPS,
    "/apis/example.com/v1": WIDGETS_V1,
    "/apis/example.com/v1beta1": WIDGETS_V1BETA1,
}


def aggregated_resource(name: str, kind: str, group: str, version: str, scope: str,
                        singular: str) -> dict[str, Any]:
    return {"resource": name, "responseKind": {"group": group, "version": version, "kind": kind},
            "scope": scope, "singularResource": singular, "verbs": ALL_VERBS,
            "subresources": [{"subresource": "status", "verbs": ["get", "patch"]}]}


AGGREGATED = {
    "/api": {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "items": [
        {"metadata": {"name": ""}, "versions": [{"version": "v1", "resources": [
            aggregated_resource("pods", "Pod", "", "v1", "Namespaced", "pod"),
            aggregated_resource("namespaces", "Namespace", "", "v1", "Cluster", "namespace"),
        ]}]}]},
    "/apis": {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "items": [
        {"metadata": {"name": "example.com"}, "versions": [
            {"version": "v1", "resources": [
                aggregated_resource("widgets", "Widget", "example.com", "v1", "Cluster",
                                    "widget")]},
            {"version": "v1beta1", "resources": [
                aggregated_resource("widgets", "Widget", "example.com", "v1beta1",
                                    "Namespaced", "widget")]}]}]},
}


@dataclass
class Scripted:
    documents: dict[str, dict[str, Any]]
    aggregated: dict[str, dict[str, Any]] = field(default_factory=dict)
    failing: bool = False
    failing_paths: set[str] = field(default_factory=set)  # 503, as an unavailable APIService
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        accept = request.headers.get("Accept", "")
        self.seen.append((request.path, accept, request.headers.get("Authorization")))
        if self.failing or request.path in self.failing_paths:
            return web.json_response({"kind": "Status", "code": 503}, status=503)
        if "as=APIGroupDiscoveryList" in accept and request.path in self.aggregated:
            return web.json_response(self.aggregated[request.path])
        document = self.documents.get(request.path)
        if document is None:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        return web.json_response(document)


@contextlib.asynccontextmanager
async def scripted_api(aiohttp_server: Any, script: Scripted) -> AsyncIterator[KubeHTTP]:
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", script.handle)
    server = await aiohttp_server(app)
    async with open_kube_http(Configuration(host=f"http://127.0.0.1:{server.port}"),
                              user_agent=USER_AGENT) as api:
        yield api


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_legacy_documents_make_a_catalog_without_subresources_and_with_listability() -> None:
    found = DiscoveredResources.from_resource_lists([CORE, APPS])
    names = [str(info.group_resource) for info in found.catalog.entries]
    assert names == ["pods", "nodes", "bindings", "deployments.apps"]
    assert GroupResource("bindings") not in found.listable
    assert GroupResource("deployments", "apps") in found.listable


def test_aggregated_discovery_becomes_resource_lists_in_preference_order() -> None:
    lists = parse_aggregated_discovery([AGGREGATED["/api"], AGGREGATED["/apis"]])
    assert [doc["groupVersion"] for doc in lists] == ["v1", "example.com/v1",
                                                      "example.com/v1beta1"]
    found = DiscoveredResources.from_resource_lists(lists)
    widgets = found.catalog.find(GroupResource("widget"))
    assert widgets == ResourceInfo("widgets", "widget", "Widget", "example.com", "v1", False)
    assert found.catalog.find(GroupResource("namespaces")) is not None


async def test_legacy_discovery_walks_every_group_version_preferred_first(
        aiohttp_server: Any) -> None:
    script = Scripted(dict(LEGACY))
    async with scripted_api(aiohttp_server, script) as api:
        discovery = ClusterCatalog(api)
        assert not discovery.discovered
        await discovery.refresh()
    catalog = discovery.catalog
    assert discovery.discovered
    widgets = catalog.find(GroupResource("widgets", "example.com"))
    assert widgets is not None and (widgets.version, widgets.namespaced) == ("v1", False)
    gadgets = catalog.find(GroupResource("gadgets"))
    assert gadgets is not None and gadgets.version == "v1beta1"
    assert catalog.find(GroupResource("pods/log")) is None
    assert sorted(path for path, _, _ in script.seen) == sorted(LEGACY)


async def test_aggregated_discovery_takes_two_requests(aiohttp_server: Any) -> None:
    script = Scripted(dict(LEGACY), aggregated=AGGREGATED)
    async with scripted_api(aiohttp_server, script) as api:
        discovery = ClusterCatalog(api)
        await discovery.refresh()
    assert [path for path, _, _ in script.seen] == ["/api", "/apis"]
    widgets = discovery.catalog.find(GroupResource("widgets"))
    assert widgets is not None and not widgets.namespaced


async def test_unknown_resource_refreshes_at_most_once_per_interval(aiohttp_server: Any) -> None:
    documents = dict(LEGACY)
    documents["/apis"] = {"kind": "APIGroupList", "groups": [group("apps", "v1",
                                                                   preferred="v1")]}
    script = Scripted(documents)
    clock = Clock()
    async with scripted_api(aiohttp_server, script) as api:
        discovery = ClusterCatalog(api, min_refresh_interval=30, clock=clock)
        await discovery.refresh()
        assert discovery.passes == 1
        # A CRD appears; lookups within the interval do not hammer discovery.
        documents["/apis"] = LEGACY["/apis"]
        with pytest.raises(UnknownResource):
            await discovery.find(GroupResource("widgets"))
        assert discovery.passes == 1
        clock.now += 30
        info = await discovery.find(GroupResource("widgets"))
        assert discovery.passes == 2
        assert info.group_resource == GroupResource("widgets", "example.com")
        with pytest.raises(UnknownResource):
            await discovery.find(GroupResource("nothings"))
        assert discovery.passes == 2


async def test_a_failed_pass_keeps_the_last_good_catalog(aiohttp_server: Any) -> None:
    script = Scripted(dict(LEGACY))
    clock = Clock()
    async with scripted_api(aiohttp_server, script) as api:
        discovery = ClusterCatalog(api, clock=clock)
        good = await discovery.refresh()
        clock.now += 5
        script.failing = True
        with pytest.raises(KubeUnavailable):
            await discovery.refresh()
    assert discovery.resources is good
    assert discovery.age() == 5


def failed_gauge(registry: CollectorRegistry) -> dict[str, float]:
    return {sample.labels["group_version"]: sample.value
            for metric in registry.collect() for sample in metric.samples
            if sample.name == "metricscale_kube_discovery_failed_group_versions"}


async def test_an_unavailable_group_version_is_skipped_and_the_rest_used(
        aiohttp_server: Any) -> None:
    script = Scripted(dict(LEGACY), failing_paths={"/apis/example.com/v1beta1"})
    registry = CollectorRegistry()
    async with scripted_api(aiohttp_server, script) as api:
        discovery = ClusterCatalog(api, registry=registry)
        await discovery.refresh()
    assert discovery.discovered
    assert discovery.catalog.find(GroupResource("deployments", "apps")) is not None
    assert discovery.catalog.find(GroupResource("widgets", "example.com")) is not None
    assert discovery.catalog.find(GroupResource("gadgets")) is None  # never read
    assert discovery.failed_group_versions == ("example.com/v1beta1",)
    assert failed_gauge(registry) == {"example.com/v1beta1": 1.0}


async def test_a_group_version_that_fails_later_keeps_its_resources_from_the_last_pass(
        aiohttp_server: Any) -> None:
    script = Scripted(dict(LEGACY))
    registry = CollectorRegistry()
    async with scripted_api(aiohttp_server, script) as api:
        discovery = ClusterCatalog(api, registry=registry)
        await discovery.refresh()
        script.failing_paths = {"/apis/example.com/v1beta1"}
        await discovery.refresh()
        gadgets = discovery.catalog.find(GroupResource("gadgets"))
        assert gadgets is not None and gadgets.version == "v1beta1"
        widgets = discovery.catalog.find(GroupResource("widgets"))
        assert widgets is not None and widgets.version == "v1"  # preference order kept
        assert failed_gauge(registry) == {"example.com/v1beta1": 1.0}
        script.failing_paths = set()
        await discovery.refresh()
    assert discovery.failed_group_versions == ()
    assert failed_gauge(registry) == {}


async def test_without_the_core_group_version_the_pass_fails(aiohttp_server: Any) -> None:
    script = Scripted(dict(LEGACY), failing_paths={"/api/v1"})
    async with scripted_api(aiohttp_server, script) as api:
        discovery = ClusterCatalog(api)
        with pytest.raises(KubeUnavailable, match="core group version"):
            await discovery.refresh()
    assert not discovery.discovered  # the built-in catalog still answers


async def test_a_stale_aggregated_group_version_is_skipped_as_failed(
        aiohttp_server: Any) -> None:
    aggregated = {path: dict(document) for path, document in AGGREGATED.items()}
    (example,) = aggregated["/apis"]["items"]
    aggregated["/apis"]["items"] = [{**example, "versions": [
        {**example["versions"][0], "freshness": "Stale"}, example["versions"][1]]}]
    script = Scripted(dict(LEGACY), aggregated=aggregated)
    async with scripted_api(aiohttp_server, script) as api:
        discovery = ClusterCatalog(api)
        await discovery.refresh()
    widgets = discovery.catalog.find(GroupResource("widgets"))
    assert widgets is not None and (widgets.version, widgets.namespaced) == ("v1beta1", True)
    assert discovery.failed_group_versions == ("example.com/v1",)


async def test_builtin_catalog_answers_before_the_first_pass(aiohttp_server: Any) -> None:
    script = Scripted({}, failing=True)
    async with scripted_api(aiohttp_server, script) as api:
        discovery = ClusterCatalog(api)
        info = await discovery.find(GroupResource("deployments"))
    assert info.group_resource == GroupResource("deployments", "apps")
    assert not discovery.discovered


async def test_connect_uses_the_kubeconfig_without_touching_the_global_default(
        aiohttp_server: Any, tmp_path: Path) -> None:
    script = Scripted(dict(LEGACY))
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", script.handle)
    server = await aiohttp_server(app)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.port}"}}],
        "users": [{"name": "u", "user": {"token": "sekret"}}],
        "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u"}}]}))
    default_host = Configuration.get_default_copy().host
    async with connect(kubeconfig=str(kubeconfig), user_agent=USER_AGENT) as api:
        await ClusterCatalog(api).refresh()
    assert script.seen[0][2] == "Bearer sekret"
    assert Configuration.get_default_copy().host == default_host


async def test_connect_outside_a_cluster_without_kubeconfig_is_a_config_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(KubeConfigError):
        async with connect(kubeconfig=None, user_agent=USER_AGENT):
            pass


async def test_the_loop_waits_an_interval_after_each_attempt(aiohttp_server: Any) -> None:
    script = Scripted(dict(LEGACY))
    clock = Clock()
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.now += seconds
        if len(waits) == 3:
            raise asyncio.CancelledError

    async with scripted_api(aiohttp_server, script) as api:
        discovery = ClusterCatalog(api, refresh_interval=60, clock=clock, sleep=sleep)
        await discovery.refresh()  # the composition root's first pass
        clock.now += 10
        script.failing = True
        with pytest.raises(asyncio.CancelledError):
            await discovery.run()
    assert waits == [50, 60, 60]  # failures do not make it spin
    assert discovery.passes == 3
