"""The adapter's object caches, resource catalog and auth ConfigMap against the session's real
kube-apiserver.

The caches reach it through a fault proxy (testbed.faultproxy) that records every request,
with its Accept header here, and injects what the real server cannot be made to do on demand:
a 410 for the watch's version, a dropped connection, a held request, a stalled watch. Objects
live in the test's `namespace`; the caches watch the whole cluster as the adapter does, so what
a test counts is limited to its own namespace (other tests' objects come and go meanwhile).
CRDs are in groups of the module's own (`Names`) and deleted afterwards; the authentication
ConfigMap of kube-system is written back as it was.

Where the real server differs from the fake these tests were first written against, the
comment at the place says how.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from urllib.parse import parse_qs

import pytest
from aiohttp import web

from adapter.kube.catalog import ClusterCatalog
from adapter.kube.objects import (
    AUTHENTICATION_CONFIGMAP,
    USER_AGENT,
    ObjectCaches,
    authentication_config_informer,
)
from adapter.rules.resources import GroupResource
from metricscale import pki
from metricscale.core.selectors import parse_selector
from metricscale.kube.errors import KubeUnavailable, UnknownResource
from metricscale.kube.http import KubeHTTP, connect, open_kube_http
from metricscale.kube.informer import InformerEvent, InformerOptions, ObjectMeta
from metricscale.kube.retry import Backoff
from testbed.controlplane import ControlPlane, KubeError, Kubelet
from testbed.faultproxy import (
    DropConnection,
    FaultProxy,
    Latency,
    RecordedRequest,
    ServerError,
    StallWatch,
)
from tests.adapter.cluster import (
    AUTH_CONFIGMAP_PATH,
    Names,
    Objects,
    authentication_configmap_restored,
    pod_manifest,
    set_request_header_cas,
)
from tests.autoscaler.test_kube_io import paused_deployment
from tests.cluster.support import until

PODS = GroupResource("pods")
PODS_PATH = r"^/api/v1/pods$"  # recorded requests are matched on their path alone
# Faults are matched on the path with its query: a watch of every pod, or a LIST of them.
PODS_WATCH = r"^/api/v1/pods\?(.*&)?watch=true"
PODS_LIST = r"^/api/v1/pods\?(?!(.*&)?watch=)"
EVERYTHING = parse_selector("")
# Guards against a hang on a busy machine, not measures.
WAIT = 60.0

# Fast recovery for tests: tiny backoff, short inactivity timeout, no jitter.
FAST: InformerOptions = {"backoff": Backoff(initial=0.02, cap=0.05), "inactivity_timeout": 5.0,
        "jitter": lambda: 0.0}


class AcceptRecordingProxy(FaultProxy):
    """The fault proxy, also recording each request's Accept header (path, query, Accept)."""

    def __init__(self, cluster: ControlPlane) -> None:
        super().__init__(cluster)
        self.accepts: list[tuple[str, str, str]] = []

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            self.accepts.append((request.path, request.query_string,
                                 request.headers.get("Accept", "")))
        return await super()._handle(request)

    def accept_of(self, path: str) -> list[str]:
        """The Accept header of each LIST of `path` (its first page, as `lists`)."""
        with self._lock:
            return [accept for p, query, accept in self.accepts
                    if p == path and "watch=" not in query and "continue=" not in query]


@pytest.fixture
def proxy(control_plane: ControlPlane) -> Iterator[AcceptRecordingProxy]:
    started = AcceptRecordingProxy(control_plane)
    with started:
        yield started


@pytest.fixture
async def api(control_plane: ControlPlane,
              proxy: AcceptRecordingProxy) -> AsyncIterator[KubeHTTP]:
    """The admin's token, through the proxy."""
    configuration = control_plane.api_client_configuration(server=proxy.server)
    async with open_kube_http(configuration, user_agent=USER_AGENT) as http:
        yield http


def make_caches(api: KubeHTTP, **options: Any) -> ObjectCaches:
    return ObjectCaches(http=api, catalog=ClusterCatalog(api), sync_timeout=WAIT,
                        informer_options=cast(InformerOptions, {**FAST, **options}))


def lists(proxy: FaultProxy, path: str = PODS_PATH) -> list[RecordedRequest]:
    """The LISTs of `path`: their first pages. The cluster is shared: another module may have
    left more than a page of pods (test_api_custom makes 2,000), whose list is then paged."""
    return [r for r in proxy.requests_to(path, method="GET")
            if "watch=" not in r.query and "continue=" not in r.query]


def watches(proxy: FaultProxy, path: str = PODS_PATH) -> list[RecordedRequest]:
    return [r for r in proxy.requests_to(path, method="GET") if "watch=" in r.query]


class Changes:
    """Records the cache's events in one namespace (the cluster's others are other tests');
    `wait_for` blocks (bounded) until a predicate over them holds."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.events: list[InformerEvent[ObjectMeta]] = []
        self._changed = asyncio.Event()

    def __call__(self, event: InformerEvent[ObjectMeta]) -> None:
        if event.key.namespace != self.namespace:
            return
        self.events.append(event)
        self._changed.set()

    def seen(self) -> list[tuple[str, str]]:
        return [(e.kind, e.key.name) for e in self.events]

    async def wait_for(self, predicate: Callable[[list[tuple[str, str]]], bool],
                       seconds: float = WAIT) -> None:
        async with asyncio.timeout(seconds):
            while not predicate(self.seen()):
                self._changed.clear()
                await self._changed.wait()


async def subscribed(caches: ObjectCaches, group_resource: GroupResource,
                     namespace: str) -> Changes:
    await caches.select(group_resource, namespace=namespace, selector=EVERYTHING)
    informer = caches.informer(group_resource)
    assert informer is not None
    changes = Changes(namespace)
    informer.subscribe(changes, replay=False)
    return changes


async def eventually(check: Callable[[], object], seconds: float = WAIT) -> None:
    """Bounded polling of state that sends no notification (the proxy's fault counts, which
    its own thread updates; the cluster's objects)."""
    await until(check, what="the condition", within=seconds)


async def in_cluster(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A blocking control-plane call off the event loop the informers run on."""
    return await asyncio.to_thread(call, *args, **kwargs)


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


async def relabel(cluster: ControlPlane, namespace: str, name: str, **labels: str) -> None:
    await in_cluster(cluster.request, "PATCH", pod_path(namespace, name),
                     {"metadata": {"labels": labels}},
                     content_type="application/merge-patch+json")


async def test_cache_fills_from_one_list_and_selects_in_name_order(
        control_plane: ControlPlane, namespace: str, proxy: AcceptRecordingProxy,
        api: KubeHTTP) -> None:
    shop = f"{namespace}-shop"
    shop_namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": shop}}
    control_plane.apply(shop_namespace)
    try:
        for name, app in [("web-b", "web"), ("web-a", "web"), ("db-0", "db")]:
            control_plane.apply(pod_manifest(name, namespace, labels={"app": app}))
        control_plane.apply(pod_manifest("web-other-ns", shop, labels={"app": "web"}))
        caches = make_caches(api)
        try:
            web = parse_selector("app=web")
            assert await caches.select(PODS, namespace=namespace, selector=web) == [
                "web-a", "web-b"]
            assert await caches.select(PODS, namespace=shop, selector=web) == ["web-other-ns"]
            assert await caches.select(PODS, namespace=namespace, selector=EVERYTHING) == [
                "db-0", "web-a", "web-b"]
            assert await caches.labels(PODS, namespace=namespace, name="db-0") == {
                "app": "db"}
            for _ in range(20):
                await caches.select(PODS, namespace=namespace, selector=web)
        finally:
            await caches.close()
    finally:
        control_plane.delete(shop_namespace)
    assert len(lists(proxy)) == 1
    # Pods are watched whole (phase and node for metrics.k8s.io); other kinds metadata-only.
    (accept,) = proxy.accept_of("/api/v1/pods")
    assert "as=PartialObjectMetadataList" not in accept


async def test_other_kinds_are_watched_as_metadata_only(
        control_plane: ControlPlane, namespace: str, proxy: AcceptRecordingProxy,
        api: KubeHTTP) -> None:
    # Paused: the deployment controller makes no ReplicaSet and no pod of it.
    control_plane.apply(paused_deployment(namespace, "web", replicas=1))
    caches = make_caches(api)
    try:
        assert await caches.select(GroupResource("deployments", "apps"), namespace=namespace,
                                   selector=EVERYTHING) == ["web"]
    finally:
        await caches.close()
    (accept,) = proxy.accept_of("/apis/apps/v1/deployments")
    assert "as=PartialObjectMetadataList" in accept


async def test_running_pods_keep_phase_and_node(control_plane: ControlPlane, kubelet: Kubelet,
                                                namespace: str, api: KubeHTTP) -> None:
    # On the real cluster a pod is Running once a kubelet says so: the kubelet stand-in's
    # nodes (a pod bound to a node that does not exist is the pod GC's to delete). Its
    # annotation keeps web-1's containers from starting: it stays Pending on node-b.
    control_plane.apply(pod_manifest("web-0", namespace, node="node-a"))
    control_plane.apply(pod_manifest("web-1", namespace, node="node-b",
                                     annotations={"testbed.metricscale.io/phase": "Pending"}))
    caches = make_caches(api)
    try:
        await eventually(lambda: control_plane.get(pod_path(namespace, "web-1")).get(
            "status", {}).get("phase") == "Pending")

        async def running() -> list[tuple[str, str, str]]:
            return [(p.name, p.node_name, p.phase) for p in await caches.running_pods(namespace)]

        async def web_0_running() -> bool:
            return await running() == [("web-0", "node-a", "Running")]

        await until(web_0_running, what="web-0 Running in the cache", within=WAIT)
        assert await caches.running_pod(namespace, "web-1") is None
        assert await caches.select(PODS, namespace=namespace, selector=EVERYTHING) == [
            "web-0", "web-1"]  # custom metrics select pods of every phase, as upstream
    finally:
        await caches.close()


async def test_cache_follows_added_modified_deleted(control_plane: ControlPlane,
                                                    namespace: str, proxy: AcceptRecordingProxy,
                                                    api: KubeHTTP) -> None:
    # Never scheduled: nothing but the test writes these pods, and an unbound pod is deleted
    # at once (no kubelet to wait for), as the fake deleted it.
    control_plane.apply(pod_manifest("a", namespace, labels={"app": "web"}))
    caches = make_caches(api)
    try:
        changes = await subscribed(caches, PODS, namespace)
        await in_cluster(control_plane.apply, pod_manifest("b", namespace, labels={"app": "web"}))
        await relabel(control_plane, namespace, "a", app="db")
        await in_cluster(control_plane.request, "DELETE", pod_path(namespace, "b"))
        await changes.wait_for(lambda seen: ("DELETED", "b") in seen)
        assert changes.seen() == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
        web = parse_selector("app=web")
        assert await caches.select(PODS, namespace=namespace, selector=web) == []
        assert await caches.select(PODS, namespace=namespace,
                                   selector=parse_selector("app=db")) == ["a"]
    finally:
        await caches.close()
    assert len(lists(proxy)) == 1


async def test_a_remembered_selection_is_dropped_when_the_objects_change(
        control_plane: ControlPlane, namespace: str, api: KubeHTTP) -> None:
    control_plane.apply(pod_manifest("a", namespace, labels={"app": "web"}))
    caches = make_caches(api)
    try:
        changes = await subscribed(caches, PODS, namespace)
        web = parse_selector("app=web")
        first = await caches.select(PODS, namespace=namespace, selector=web)
        first.append("changed by the caller")
        assert await caches.select(PODS, namespace=namespace, selector=web) == ["a"]
        await relabel(control_plane, namespace, "a", app="db")
        await changes.wait_for(lambda seen: ("MODIFIED", "a") in seen)
        assert await caches.select(PODS, namespace=namespace, selector=web) == []
        await in_cluster(control_plane.apply, pod_manifest("b", namespace, labels={"app": "web"}))
        await changes.wait_for(lambda seen: ("ADDED", "b") in seen)
        assert await caches.select(PODS, namespace=namespace,
                                   selector=parse_selector("app=web")) == ["b"]
    finally:
        await caches.close()


async def test_cache_relists_after_410_and_catches_up(
        control_plane: ControlPlane, namespace: str, proxy: AcceptRecordingProxy,
        api: KubeHTTP) -> None:
    control_plane.apply(pod_manifest("before", namespace))
    caches = make_caches(api, watch_timeout_seconds=1)
    try:
        changes = await subscribed(caches, PODS, namespace)
        # The real server's history cannot be compacted on demand (the fake's was, under a
        # held watch): the proxy answers the next watch 410 instead, and holds the re-list
        # that follows while the test creates a pod, which the re-list then brings.
        held = proxy.add_fault(PODS_LIST, Latency(1.0), method="GET")
        gone = proxy.add_fault(PODS_WATCH, ServerError(410, "too old resource version"),
                               method="GET")
        await eventually(lambda: held.hits == 1)
        await in_cluster(control_plane.apply, pod_manifest("during", namespace))
        await changes.wait_for(lambda seen: ("ADDED", "during") in seen)
        assert await caches.select(PODS, namespace=namespace, selector=EVERYTHING) == [
            "before", "during"]
    finally:
        await caches.close()
    assert gone.hits == 1
    assert len(lists(proxy)) == 2
    assert changes.seen() == [("ADDED", "during")]


async def test_dropped_watch_resumes_from_the_last_version_without_duplicates(
        control_plane: ControlPlane, namespace: str, proxy: AcceptRecordingProxy,
        api: KubeHTTP) -> None:
    caches = make_caches(api, watch_timeout_seconds=1)
    try:
        changes = await subscribed(caches, PODS, namespace)
        await in_cluster(control_plane.apply, pod_manifest("one", namespace))
        await changes.wait_for(lambda seen: ("ADDED", "one") in seen)
        drop = proxy.add_fault(PODS_WATCH, DropConnection(), method="GET")
        await eventually(lambda: drop.hits == 1)
        await in_cluster(control_plane.apply, pod_manifest("two", namespace))
        await changes.wait_for(lambda seen: ("ADDED", "two") in seen)
    finally:
        await caches.close()
    assert changes.seen() == [("ADDED", "one"), ("ADDED", "two")]
    assert len(lists(proxy)) == 1
    versions = [int(parse_qs(r.query)["resourceVersion"][0]) for r in watches(proxy)]
    assert versions == sorted(versions)


async def test_stalled_watch_is_abandoned_and_resumed(
        control_plane: ControlPlane, namespace: str, proxy: AcceptRecordingProxy,
        api: KubeHTTP) -> None:
    proxy.add_fault(PODS_LIST, StallWatch(), method="GET")  # the first LIST: silent
    # The read timeouts leave a real LIST of every pod of the cluster time to answer on a busy
    # machine (the fake's answered within 0.3 s); a quiet watch ends as often, and resumes.
    caches = make_caches(api, inactivity_timeout=0.5, list_read_timeout=2.0)
    try:
        await caches.select(PODS, namespace=namespace, selector=EVERYTHING)
        changes = await subscribed(caches, PODS, namespace)
        stall = proxy.add_fault(PODS_WATCH, StallWatch(), method="GET")
        await eventually(lambda: stall.hits == 1)  # a watch is now stuck on a silent stream
        await in_cluster(control_plane.apply, pod_manifest("after-stall", namespace))
        await changes.wait_for(lambda seen: ("ADDED", "after-stall") in seen)
    finally:
        await caches.close()
    assert changes.seen() == [("ADDED", "after-stall")]
    assert len(lists(proxy)) <= 2  # the stalled LIST is retried; no re-list after that


async def test_a_forbidden_resource_is_unavailable_with_a_reason(
        control_plane: ControlPlane, namespace: str, proxy: AcceptRecordingProxy) -> None:
    # The fake's authorizer said no to pods; on the real server, a service account RBAC
    # grants nothing (discovery is every authenticated user's) is refused them with a 403.
    token = await in_cluster(control_plane.service_account_token, namespace, "no-pods")
    configuration = control_plane.api_client_configuration(token=token, server=proxy.server)
    async with open_kube_http(configuration, user_agent=USER_AGENT) as limited:
        caches = ObjectCaches(http=limited, catalog=ClusterCatalog(limited), sync_timeout=3.0,
                              informer_options=FAST)
        try:
            with pytest.raises(KubeUnavailable, match="not allowed to list and watch pods"):
                await caches.select(PODS, namespace=namespace, selector=EVERYTHING)
        finally:
            await caches.close()
    assert {r.status for r in lists(proxy)} == {403}


@contextlib.asynccontextmanager
async def custom_resources(control_plane: ControlPlane, *specs: tuple[str, str, str]
                           ) -> AsyncIterator[str]:
    """CRDs (kind, plural, scope) in a group of the module's own, served; deleted after."""
    group = f"{Names.unique('kube-cache').prefix}.example.com"
    crds = []
    try:
        async with Objects(control_plane) as objects:
            for kind, plural, scope in specs:
                crds.append(await objects.crd(group=group, kind=kind, plural=plural,
                                              scope=scope))

        def served() -> bool:  # discovery and the REST endpoint lag Established a little
            try:
                listed = control_plane.get(f"/apis/{group}/v1")
            except KubeError:
                return False
            names = {r.get("name") for r in listed.get("resources") or []}
            return all(plural in names for _, plural, _ in specs)

        await eventually(lambda: served())
        yield group
    finally:
        for crd in crds:
            control_plane.delete(crd)


async def test_discovery_includes_crds_with_their_real_scope(control_plane: ControlPlane,
                                                             api: KubeHTTP) -> None:
    clock = [0.0]
    discovery = ClusterCatalog(api, min_refresh_interval=30, clock=lambda: clock[0])
    await discovery.refresh()
    # Kinds no other module's CRDs have: a singular name is looked up in every group.
    assert discovery.catalog.find(GroupResource("kubecachewidget")) is None
    async with custom_resources(control_plane,
                                ("KubeCacheWidget", "kubecachewidgets", "Cluster"),
                                ("KubeCacheGizmo", "kubecachegizmos", "Namespaced")) as group:
        clock[0] += 30  # an unknown resource refreshes discovery once the interval has passed
        widgets = await discovery.find(GroupResource("kubecachewidget"))
        gizmos = await discovery.find(GroupResource("kubecachegizmos", group))
        assert (widgets.group, widgets.version, widgets.kind, widgets.namespaced) == (
            group, "v1", "KubeCacheWidget", False)
        assert gizmos.namespaced
    deployments = await discovery.find(GroupResource("deployments"))
    assert deployments.group == "apps" and deployments.namespaced
    nodes = await discovery.find(GroupResource("nodes"))
    assert not nodes.namespaced
    with pytest.raises(UnknownResource):
        await discovery.find(GroupResource("nothings"))


async def test_cluster_scoped_custom_objects_are_selected(
        control_plane: ControlPlane, proxy: AcceptRecordingProxy, api: KubeHTTP) -> None:
    async with custom_resources(control_plane, ("Widget", "widgets", "Cluster")) as group:
        for name, tier in [("w2", "gold"), ("w1", "gold"), ("w3", "iron")]:
            control_plane.apply({"apiVersion": f"{group}/v1", "kind": "Widget",
                                 "metadata": {"name": name, "labels": {"tier": tier}}})
        caches = make_caches(api)
        try:
            gold = parse_selector("tier=gold")
            assert await caches.select(GroupResource("widgets", group), namespace=None,
                                       selector=gold) == ["w1", "w2"]
        finally:
            await caches.close()
        assert len(lists(proxy, rf"^/apis/{group}/v1/widgets$")) == 1


async def test_authentication_configmap_is_watched_by_name(
        control_plane: ControlPlane, proxy: AcceptRecordingProxy, api: KubeHTTP) -> None:
    # The real kube-system/extension-apiserver-authentication, rotated as an operator would
    # (the fake rotated its own CA): kube-apiserver may write its own CA back in after the
    # test's write, a change of its own, so the rotation is looked for among the changes.
    now = datetime.now(UTC) - timedelta(minutes=5)
    rotated = pki.generate_ca(common_name="kube-cache-front-proxy", now=now,
                              validity=timedelta(days=1)).certificate_pem.decode()
    seen: list[Mapping[str, str] | None] = []
    with authentication_configmap_restored(control_plane):
        informer = authentication_config_informer(api, on_change=seen.append, **FAST)
        async with informer:
            assert await informer.wait_synced(WAIT)
            assert seen and seen[0] is not None
            first_ca = seen[0]["requestheader-client-ca-file"]
            assert rotated not in first_ca
            await in_cluster(set_request_header_cas, control_plane, [rotated.encode()])
            await eventually(lambda: any(
                data is not None and rotated in data["requestheader-client-ca-file"]
                for data in seen[1:]))
    assert None not in seen
    (listed,) = lists(proxy, r"^/api/v1/namespaces/kube-system/configmaps$")
    assert parse_qs(listed.query)["fieldSelector"] == [
        f"metadata.name={AUTHENTICATION_CONFIGMAP}"]
    assert control_plane.get(AUTH_CONFIGMAP_PATH)["data"]


async def test_connect_from_a_kubeconfig_over_tls_serves_selections(
        control_plane: ControlPlane, namespace: str) -> None:
    # The control plane's own kubeconfig: the admin's client certificate, straight to
    # kube-apiserver over TLS (the proxy takes tokens only).
    control_plane.apply(pod_manifest("p", namespace, labels={"app": "web"}))
    async with connect(kubeconfig=str(control_plane.kubeconfig), user_agent=USER_AGENT) as client:
        caches = make_caches(client)
        try:
            assert await caches.select(PODS, namespace=namespace,
                                       selector=parse_selector("app")) == ["p"]
            assert caches.catalog.catalog.find(GroupResource("pods")) is not None
        finally:
            await caches.close()
