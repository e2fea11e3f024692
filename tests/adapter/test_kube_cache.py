"""The adapter's object caches, resource catalog and auth ConfigMap against the fake apiserver."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from adapter.kube.catalog import ClusterCatalog
from adapter.kube.objects import (
    AUTHENTICATION_CONFIGMAP,
    USER_AGENT,
    ObjectCaches,
    authentication_config_informer,
)
from adapter.rules.resources import GroupResource
from metricscale.core.selectors import parse_selector
from metricscale.kube.errors import KubeUnavailable, UnknownResource
from metricscale.kube.http import KubeHTTP, connect, open_kube_http
from metricscale.kube.informer import InformerEvent, ObjectMeta
from metricscale.kube.retry import Backoff
from testbed.fakes.kube_api import DropConnection, FakeKubeAPI, Latency, StallWatch

PODS = GroupResource("pods")
PODS_PATH = r"^/api/v1/pods$"
EVERYTHING = parse_selector("")

# Fast recovery for tests: tiny backoff, short inactivity timeout, no jitter.
FAST = {"backoff": Backoff(initial=0.02, cap=0.05), "inactivity_timeout": 5.0,
        "jitter": lambda: 0.0}


@pytest.fixture
def kube(fake_kube: FakeKubeAPI) -> FakeKubeAPI:
    return fake_kube


@pytest.fixture
def api(kube_session: KubeHTTP) -> KubeHTTP:
    return kube_session


def make_caches(api: KubeHTTP, **options: Any) -> ObjectCaches:
    return ObjectCaches(http=api, catalog=ClusterCatalog(api), sync_timeout=5.0,
                        informer_options={**FAST, **options})


def lists(kube: FakeKubeAPI, path: str = PODS_PATH) -> list[Any]:
    return [r for r in kube.requests_to(path, method="GET") if r.param("watch") is None]


def watches(kube: FakeKubeAPI, path: str = PODS_PATH) -> list[Any]:
    return [r for r in kube.requests_to(path, method="GET") if r.param("watch") is not None]


class Changes:
    """Records cache events; `wait_for` blocks (bounded) until a predicate over them holds."""

    def __init__(self) -> None:
        self.events: list[InformerEvent[ObjectMeta]] = []
        self._changed = asyncio.Event()

    def __call__(self, event: InformerEvent[ObjectMeta]) -> None:
        self.events.append(event)
        self._changed.set()

    def seen(self) -> list[tuple[str, str]]:
        return [(e.kind, e.key.name) for e in self.events]

    async def wait_for(self, predicate: Callable[[list[tuple[str, str]]], bool],
                       seconds: float = 10.0) -> None:
        async with asyncio.timeout(seconds):
            while not predicate(self.seen()):
                self._changed.clear()
                await self._changed.wait()


async def subscribed(caches: ObjectCaches, group_resource: GroupResource) -> Changes:
    await caches.select(group_resource, namespace="default", selector=EVERYTHING)
    informer = caches.informer(group_resource)
    assert informer is not None
    changes = Changes()
    informer.subscribe(changes, replay=False)
    return changes


async def eventually(check: Callable[[], bool], seconds: float = 10.0) -> None:
    """Bounded polling of the fake's own state (it has no notification for it)."""
    for _ in range(int(seconds / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


async def test_cache_fills_from_one_list_and_selects_in_name_order(
        kube: FakeKubeAPI, api: KubeHTTP) -> None:
    for name, app in [("web-b", "web"), ("web-a", "web"), ("db-0", "db")]:
        kube.create_pod(name, labels={"app": app})
    kube.create_pod("web-other-ns", namespace="shop", labels={"app": "web"})
    caches = make_caches(api)
    try:
        web = parse_selector("app=web")
        assert await caches.select(PODS, namespace="default", selector=web) == ["web-a", "web-b"]
        assert await caches.select(PODS, namespace="shop", selector=web) == ["web-other-ns"]
        assert await caches.select(PODS, namespace="default", selector=EVERYTHING) == [
            "db-0", "web-a", "web-b"]
        assert await caches.labels(PODS, namespace="default", name="db-0") == {"app": "db"}
        for _ in range(20):
            await caches.select(PODS, namespace="default", selector=web)
    finally:
        await caches.close()
    assert len(lists(kube)) == 1
    # Pods are watched whole (phase and node for metrics.k8s.io); other kinds metadata-only.
    assert "as=PartialObjectMetadataList" not in (lists(kube)[0].header("Accept") or "")


async def test_other_kinds_are_watched_as_metadata_only(kube: FakeKubeAPI,
                                                        api: KubeHTTP) -> None:
    kube.create_deployment("web", labels={"app": "web"})
    caches = make_caches(api)
    try:
        assert await caches.select(GroupResource("deployments", "apps"), namespace="default",
                                   selector=EVERYTHING) == ["web"]
    finally:
        await caches.close()
    (listing,) = [r for r in kube.requests_to("/deployments$") if r.method == "GET"]
    assert "as=PartialObjectMetadataList" in (listing.header("Accept") or "")


async def test_running_pods_keep_phase_and_node(kube: FakeKubeAPI, api: KubeHTTP) -> None:
    kube.create_pod("web-0", node_name="n1")
    kube.create_pod("web-1", phase="Pending", node_name="n2")
    caches = make_caches(api)
    try:
        running = await caches.running_pods("default")
        assert [(p.name, p.node_name, p.phase) for p in running] == [("web-0", "n1", "Running")]
        assert await caches.running_pod("default", "web-1") is None
        assert await caches.select(PODS, namespace="default", selector=EVERYTHING) == [
            "web-0", "web-1"]  # custom metrics select pods of every phase, as upstream
    finally:
        await caches.close()


async def test_cache_follows_added_modified_deleted(kube: FakeKubeAPI, api: KubeHTTP) -> None:
    kube.create_pod("a", labels={"app": "web"})
    caches = make_caches(api)
    try:
        changes = await subscribed(caches, PODS)
        kube.create_pod("b", labels={"app": "web"})
        kube.store.mutate("", "v1", "pods", "a",
                          lambda obj: obj["metadata"]["labels"].update(app="db"),
                          namespace="default")
        kube.store.delete("", "v1", "pods", "b", namespace="default")
        await changes.wait_for(lambda seen: ("DELETED", "b") in seen)
        assert changes.seen() == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
        web = parse_selector("app=web")
        assert await caches.select(PODS, namespace="default", selector=web) == []
        assert await caches.select(PODS, namespace="default",
                                   selector=parse_selector("app=db")) == ["a"]
    finally:
        await caches.close()
    assert len(lists(kube)) == 1


async def test_a_remembered_selection_is_dropped_when_the_objects_change(
        kube: FakeKubeAPI, api: KubeHTTP) -> None:
    kube.create_pod("a", labels={"app": "web"})
    caches = make_caches(api)
    try:
        changes = await subscribed(caches, PODS)
        web = parse_selector("app=web")
        first = await caches.select(PODS, namespace="default", selector=web)
        first.append("changed by the caller")
        assert await caches.select(PODS, namespace="default", selector=web) == ["a"]
        kube.store.mutate("", "v1", "pods", "a",
                          lambda obj: obj["metadata"]["labels"].update(app="db"),
                          namespace="default")
        await changes.wait_for(lambda seen: ("MODIFIED", "a") in seen)
        assert await caches.select(PODS, namespace="default", selector=web) == []
        kube.create_pod("b", labels={"app": "web"})
        await changes.wait_for(lambda seen: ("ADDED", "b") in seen)
        assert await caches.select(PODS, namespace="default",
                                   selector=parse_selector("app=web")) == ["b"]
    finally:
        await caches.close()


async def test_cache_relists_after_410_and_catches_up(kube: FakeKubeAPI, api: KubeHTTP) -> None:
    kube.create_pod("before")
    caches = make_caches(api, watch_timeout_seconds=1)
    try:
        changes = await subscribed(caches, PODS)
        # Hold the next watch request while history moves on and is compacted away.
        delay = kube.add_fault(PODS_PATH, Latency(1.0), method="GET")
        await eventually(lambda: delay.hits == 1)
        kube.create_pod("during")
        kube.compact()
        await changes.wait_for(lambda seen: ("ADDED", "during") in seen)
        assert await caches.select(PODS, namespace="default", selector=EVERYTHING) == [
            "before", "during"]
    finally:
        await caches.close()
    assert len(lists(kube)) == 2
    assert changes.seen() == [("ADDED", "during")]


async def test_dropped_watch_resumes_from_the_last_version_without_duplicates(
        kube: FakeKubeAPI, api: KubeHTTP) -> None:
    caches = make_caches(api, watch_timeout_seconds=1)
    try:
        changes = await subscribed(caches, PODS)
        kube.create_pod("one")
        await changes.wait_for(lambda seen: ("ADDED", "one") in seen)
        drop = kube.add_fault(PODS_PATH, DropConnection(), method="GET")
        await eventually(lambda: drop.hits == 1)
        kube.create_pod("two")
        await changes.wait_for(lambda seen: ("ADDED", "two") in seen)
    finally:
        await caches.close()
    assert changes.seen() == [("ADDED", "one"), ("ADDED", "two")]
    assert len(lists(kube)) == 1
    versions = [int(r.param("resourceVersion")) for r in watches(kube)]
    assert versions == sorted(versions)


async def test_stalled_watch_is_abandoned_and_resumed(kube: FakeKubeAPI, api: KubeHTTP) -> None:
    kube.add_fault(PODS_PATH, StallWatch(), method="GET")  # the first request: the LIST
    caches = make_caches(api, inactivity_timeout=0.3, list_read_timeout=0.3)
    try:
        await caches.select(PODS, namespace="default", selector=EVERYTHING)
        changes = await subscribed(caches, PODS)
        stall = kube.add_fault(PODS_PATH, StallWatch(), method="GET")
        await eventually(lambda: stall.hits == 1)  # a watch is now stuck on a silent stream
        kube.create_pod("after-stall")
        await changes.wait_for(lambda seen: ("ADDED", "after-stall") in seen)
    finally:
        await caches.close()
    assert changes.seen() == [("ADDED", "after-stall")]
    assert len(lists(kube)) <= 2  # the stalled LIST is retried; no re-list after that


async def test_a_forbidden_resource_is_unavailable_with_a_reason(kube: FakeKubeAPI,
                                                                 api: KubeHTTP) -> None:
    kube.authorizer = lambda attributes: attributes.resource != "pods"
    kube.add_user(token="adapter", username="system:serviceaccount:monitoring:adapter")
    async with open_kube_http(kube.api_client_configuration("adapter"),
                              user_agent=USER_AGENT) as limited:
        caches = ObjectCaches(http=limited, catalog=ClusterCatalog(limited), sync_timeout=0.3,
                              informer_options=FAST)
        try:
            with pytest.raises(KubeUnavailable, match="not allowed to list and watch pods"):
                await caches.select(PODS, namespace="default", selector=EVERYTHING)
        finally:
            await caches.close()


async def test_discovery_includes_crds_with_their_real_scope(kube: FakeKubeAPI,
                                                             api: KubeHTTP) -> None:
    clock = [0.0]
    discovery = ClusterCatalog(api, min_refresh_interval=30, clock=lambda: clock[0])
    await discovery.refresh()
    assert discovery.catalog.find(GroupResource("widgets")) is None
    kube.create_crd(group="example.com", kind="Widget", plural="widgets", scope="Cluster")
    kube.create_crd(group="example.com", kind="Gizmo", plural="gizmos", scope="Namespaced")
    clock[0] += 30  # an unknown resource refreshes discovery once the interval has passed
    widgets = await discovery.find(GroupResource("widget"))
    gizmos = await discovery.find(GroupResource("gizmos", "example.com"))
    assert (widgets.group, widgets.version, widgets.kind, widgets.namespaced) == (
        "example.com", "v1", "Widget", False)
    assert gizmos.namespaced
    deployments = await discovery.find(GroupResource("deployments"))
    assert deployments.group == "apps" and deployments.namespaced
    nodes = await discovery.find(GroupResource("nodes"))
    assert not nodes.namespaced
    with pytest.raises(UnknownResource):
        await discovery.find(GroupResource("nothings"))


async def test_cluster_scoped_custom_objects_are_selected(kube: FakeKubeAPI,
                                                          api: KubeHTTP) -> None:
    kube.create_crd(group="example.com", kind="Widget", plural="widgets", scope="Cluster")
    for name, tier in [("w2", "gold"), ("w1", "gold"), ("w3", "iron")]:
        kube.create("example.com", "v1", "widgets",
                    {"metadata": {"name": name, "labels": {"tier": tier}}})
    caches = make_caches(api)
    try:
        gold = parse_selector("tier=gold")
        assert await caches.select(GroupResource("widgets", "example.com"), namespace=None,
                                   selector=gold) == ["w1", "w2"]
    finally:
        await caches.close()
    assert len(lists(kube, r"^/apis/example.com/v1/widgets$")) == 1


async def test_authentication_configmap_is_watched_by_name(kube: FakeKubeAPI,
                                                           api: KubeHTTP) -> None:
    seen: list[Mapping[str, str] | None] = []
    informer = authentication_config_informer(api, on_change=seen.append, **FAST)
    async with informer:
        assert await informer.wait_synced(5)
        assert seen and seen[0] is not None
        first_ca = seen[0]["requestheader-client-ca-file"]
        kube.rotate_front_proxy_ca()
        await eventually(lambda: len(seen) >= 2)
    assert seen[1] is not None and seen[1]["requestheader-client-ca-file"] != first_ca
    (listed,) = lists(kube, r"^/api/v1/namespaces/kube-system/configmaps$")
    assert listed.param("fieldSelector") == f"metadata.name={AUTHENTICATION_CONFIGMAP}"


async def test_connect_from_a_kubeconfig_over_tls_serves_selections(kube: FakeKubeAPI,
                                                                   kubeconfig: Path) -> None:
    kube.create_pod("p", labels={"app": "web"})
    async with connect(kubeconfig=str(kubeconfig), user_agent=USER_AGENT) as client:
        caches = make_caches(client)
        try:
            assert await caches.select(PODS, namespace="default",
                                       selector=parse_selector("app")) == ["p"]
            assert caches.catalog.catalog.find(GroupResource("pods")) is not None
        finally:
            await caches.close()
