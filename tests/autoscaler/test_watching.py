"""autoscaler.controller.watching: the pod index answers exactly as a lister with a selector would,
the selector registry never misses an autoscaler sharing pods, projections never kill a cache, and
the informers follow the session's real kube-apiserver (lists, watches, 410 after compaction).

The informers talk to kube-apiserver through the fault proxy, which records their requests and
stands in for what the server cannot be made to do on demand (a 410 on a re-watch: its watch
cache still holds a history etcd compaction would have removed). The cluster is shared: the
Autoscaler CRD is the shipped one, objects live in the test's namespace (or, for the one test
that lists across namespaces, in namespaces named for this module), and the test's namespace is
fenced off from the controllers that would write to its objects (tests.autoscaler.
real_cluster_support)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.controller.watching import (
    AutoscalerEntry,
    AutoscalerKey,
    PodIndex,
    SelectorCache,
    SelectorRegistry,
    Watching,
    project_autoscaler,
    project_pod,
)
from autoscaler.model.pods import Pod
from metricscale.kube.http import KubeHTTP, open_kube_http
from metricscale.kube.informer import InformerEvent, PathSource, RequestOptions
from testbed.controlplane import ControlPlane
from testbed.faultproxy import FaultProxy, Latency, ServerError
from tests.adapter.cluster import Names
from tests.autoscaler.controller_support import eventually
from tests.autoscaler.real_cluster_support import fenced_from, install_crd

KEYS = ["app", "tier", "track"]
VALUES = ["a", "b", "c"]
NAMESPACES = ["n1", "n2"]

labels_strategy = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3)
pods_strategy = st.lists(st.tuples(st.sampled_from(NAMESPACES), labels_strategy), max_size=25)


def requirement() -> st.SearchStrategy[str]:
    key = st.sampled_from(KEYS)
    value = st.sampled_from(VALUES)
    return st.one_of(
        st.builds(lambda k, v: f"{k}={v}", key, value),
        st.builds(lambda k, v: f"{k}=={v}", key, value),
        st.builds(lambda k, v: f"{k}!={v}", key, value),
        st.builds(lambda k, vs: f"{k} in ({','.join(vs)})", key,
                  st.lists(value, min_size=1, max_size=2, unique=True)),
        st.builds(lambda k, vs: f"{k} notin ({','.join(vs)})", key,
                  st.lists(value, min_size=1, max_size=2, unique=True)),
        key, st.builds(lambda k: f"!{k}", key))


selector_strategy = st.lists(requirement(), min_size=1, max_size=3).map(",".join)


def make_pods(specs: list[tuple[str, dict[str, str]]]) -> list[Pod]:
    return [Pod(name=f"pod-{i}", namespace=ns, labels=labels)
            for i, (ns, labels) in enumerate(specs)]


@settings(max_examples=300, deadline=None)
@given(specs=pods_strategy, selector=selector_strategy, namespace=st.sampled_from(NAMESPACES),
       removed=st.sets(st.integers(min_value=0, max_value=24)))
def test_pod_index_selects_exactly_what_a_lister_would(
        specs: list[tuple[str, dict[str, str]]], selector: str, namespace: str,
        removed: set[int]) -> None:
    pods = make_pods(specs)
    index = PodIndex()
    for pod in pods:
        index.add(pod)
    for i in removed:
        if i < len(pods):
            index.remove(pods[i])
    kept = [pod for i, pod in enumerate(pods) if i not in removed]
    parsed = SelectorCache().parse(selector)
    # A lister: every pod of the namespace whose labels satisfy every requirement.
    expected = sorted((p for p in kept if p.namespace == namespace and parsed.matches(p.labels)),
                      key=lambda p: p.name)
    assert index.select(namespace, parsed) == expected


def test_pod_index_follows_label_changes_from_informer_events() -> None:
    index = PodIndex()
    before = Pod(name="p", namespace="n", labels={"app": "a"})
    after = Pod(name="p", namespace="n", labels={"app": "b"})
    index.on_event(InformerEvent("ADDED", ("n", "p"), None, before))  # type: ignore[arg-type]
    index.on_event(InformerEvent("MODIFIED", ("n", "p"), before, after))  # type: ignore[arg-type]
    cache = SelectorCache()
    assert index.select("n", cache.parse("app=a")) == []
    assert index.select("n", cache.parse("app=b")) == [after]
    index.on_event(InformerEvent("DELETED", ("n", "p"), after, None))  # type: ignore[arg-type]
    assert index.select("n", cache.parse("app=b")) == []
    assert len(index) == 0


@settings(max_examples=300, deadline=None)
@given(specs=pods_strategy,
       selectors=st.lists(st.tuples(st.sampled_from(NAMESPACES), selector_strategy),
                          min_size=1, max_size=8),
       me=st.integers(min_value=0, max_value=7))
def test_selector_registry_never_misses_an_autoscaler_that_shares_a_pod(
        specs: list[tuple[str, dict[str, str]]], selectors: list[tuple[str, str]],
        me: int) -> None:
    pods = make_pods(specs)
    index = PodIndex()
    for pod in pods:
        index.add(pod)
    cache = SelectorCache()
    registry = SelectorRegistry(index, cache)
    keys = [AutoscalerKey("Autoscaler", ns, f"hpa-{i}") for i, (ns, _) in enumerate(selectors)]
    for key, (_, text) in zip(keys, selectors, strict=True):
        registry.update(key, text)
    mine = keys[me % len(keys)]
    my_pods = index.select(mine.namespace, cache.parse(registry.selector_of(mine) or ""))
    found = registry.others_for(mine, my_pods)
    for other, (ns, text) in zip(keys, selectors, strict=True):
        if other == mine or ns != mine.namespace:
            assert other.name not in found
            continue
        if any(cache.parse(text).matches(pod.labels) for pod in my_pods):
            assert found[other.name] == text


def test_selector_registry_forgets_removed_and_changed_selectors() -> None:
    index = PodIndex()
    index.add(Pod(name="p", namespace="n", labels={"app": "web"}))
    registry = SelectorRegistry(index, SelectorCache())
    me, other = AutoscalerKey("Autoscaler", "n", "me"), AutoscalerKey("Autoscaler", "n", "x")
    registry.update(me, "app=web")
    registry.update(other, "app=web")
    pods = index.select("n", SelectorCache().parse("app=web"))
    assert registry.others_for(me, pods) == {"x": "app=web"}
    registry.update(other, "app=db")
    assert registry.others_for(me, pods) == {}
    registry.update(other, "app=web")
    registry.remove(other)
    assert registry.others_for(me, pods) == {}
    assert len(registry) == 1


def test_an_unreadable_pod_keeps_its_labels_and_does_not_raise() -> None:
    raw = {"metadata": {"name": "p", "namespace": "n", "labels": {"app": "web"}},
           "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "lots"}}}]}}
    pod = project_pod(raw)
    assert (pod.name, pod.namespace, dict(pod.labels), pod.containers) == (
        "p", "n", {"app": "web"}, ())


def test_an_autoscaler_that_does_not_parse_is_cached_with_the_reason() -> None:
    entry = project_autoscaler({"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
                                "metadata": {"name": "a", "namespace": "n", "generation": 2,
                                             "annotations": {"x": "y"}},
                                "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "d"},
                                         "maxReplicas": "many"}})
    assert entry.key == AutoscalerKey("Autoscaler", "n", "a")
    assert entry.autoscaler is None
    assert entry.error is not None and "spec.maxReplicas" in entry.error
    assert (entry.generation, entry.annotations) == (2, {"x": "y"})


def test_list_items_without_kind_are_read_as_the_collection_kind() -> None:
    raw = {"metadata": {"name": "a", "namespace": "n"},
           "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "d"}, "maxReplicas": 2}}
    entry = project_autoscaler(raw)
    assert entry.autoscaler is not None and entry.autoscaler.kind == "Autoscaler"
    hpa = project_autoscaler(raw, kind="HorizontalPodAutoscaler")
    assert hpa.key == AutoscalerKey("HorizontalPodAutoscaler", "n", "a")
    assert hpa.autoscaler is not None and hpa.autoscaler.api_version == "autoscaling/v2"


# ---------------------------------------------------------------------- against the real API

SYNC_WITHIN = 120  # a guard against a hang, not a measure: a busy machine decides how long


def autoscaler_object(name: str, namespace: str, target: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": target},
                     "maxReplicas": 5, **spec}}


def pod_object(name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """A pod no scheduler binds (it stays Pending), one container asking for 100m of CPU."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"schedulerName": "metricscale-tests-unscheduled",
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "app", "image": "registry.invalid/app:1",
                                     "resources": {"requests": {"cpu": "100m"}}}]}}


def create(cluster: ControlPlane, obj: dict[str, Any], collection: str) -> None:
    cluster.request("POST", collection, obj)


def create_pod(cluster: ControlPlane, name: str, namespace: str,
               labels: dict[str, str]) -> None:
    create(cluster, pod_object(name, namespace, labels), f"/api/v1/namespaces/{namespace}/pods")


class Selected:
    """A source whose LISTs and WATCHes carry `selector` (the product's caches of a whole
    cluster ask for everything; the session's cluster holds other modules' objects too)."""

    def __init__(self, inner: PathSource, selector: str) -> None:
        self.inner = inner
        self.selector = selector

    @property
    def description(self) -> str:
        return self.inner.description

    def open(self, options: RequestOptions,
             ) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        return self.inner.open(dataclasses.replace(options, label_selector=self.selector))


@pytest.fixture
def crd(control_plane: ControlPlane) -> None:
    install_crd(control_plane)


@pytest.fixture
def fenced(control_plane: ControlPlane, namespace: str) -> Iterator[None]:
    with fenced_from(control_plane, namespace):
        yield


@pytest.fixture
async def proxied(control_plane: ControlPlane, fault_proxy: FaultProxy
                  ) -> AsyncIterator[KubeHTTP]:
    """The admin's token, through the fault proxy."""
    configuration = control_plane.api_client_configuration(server=fault_proxy.server)
    async with open_kube_http(configuration) as http:
        yield http


@pytest.fixture
async def watching(crd: None, fenced: None, namespace: str,
                   proxied: KubeHTTP) -> AsyncIterator[Watching]:
    watch = Watching(lambda path: PathSource(proxied, path), native_hpa=True,
                     namespace=namespace, informer_options={"watch_timeout_seconds": 30})
    watch.start()
    try:
        assert await watch.wait_synced(SYNC_WITHIN)
        yield watch
    finally:
        await watch.stop()


async def test_caches_fill_from_lists_and_follow_watches(
        control_plane: ControlPlane, namespace: str, watching: Watching) -> None:
    events: list[InformerEvent[AutoscalerEntry]] = []
    watching.subscribe(events.append)
    create_pod(control_plane, "web-1", namespace, {"app": "web"})
    create(control_plane, autoscaler_object("web", namespace, "web"),
           f"/apis/metricscale.dev/v1alpha1/namespaces/{namespace}/autoscalers")
    create(control_plane, {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "db", "namespace": namespace},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                    "name": "db"}, "maxReplicas": 3}},
        f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers")
    await eventually(lambda: len(watching.keys()) == 2
                     and watching.select_pods(namespace, "app=web"), within=SYNC_WITHIN)
    assert sorted(watching.keys()) == [
        AutoscalerKey("Autoscaler", namespace, "web"),
        AutoscalerKey("HorizontalPodAutoscaler", namespace, "db")]
    (pod,) = watching.select_pods(namespace, "app=web")
    assert pod.name == "web-1" and pod.containers[0].requests["cpu"].milli == 100
    entry = watching.get(AutoscalerKey("Autoscaler", namespace, "web"))
    assert entry is not None and entry.autoscaler is not None
    assert entry.autoscaler.spec.min_replicas == 1  # the CRD's default, applied by the server
    # Only ADDED: the HPA controller and an installed autoscaler, which would write the two
    # objects' status (MODIFIED), are fenced off from the namespace.
    assert {e.kind for e in events} == {"ADDED"}


async def test_a_paged_list_across_namespaces_sharing_a_prefix_fills_every_pod(
        control_plane: ControlPlane, crd: None, proxied: KubeHTTP,
        fault_proxy: FaultProxy) -> None:
    # "a" and "a-b": in key order (etcd's, `namespace/name`) "a-b/..." sorts before "a/...".
    # A page boundary inside "a" must not lose the pods of "a-b" (pages of 2 over the
    # namespaces' 3 pods each: every namespace's pods span a boundary).
    names = Names.unique("watching")
    namespaces = {short: names.namespace(short) for short in ("a", "a-b", "b")}
    mine = {"metricscale-test": names.prefix}
    try:
        for namespace in namespaces.values():
            control_plane.apply({"apiVersion": "v1", "kind": "Namespace",
                                 "metadata": {"name": namespace}})
            for index in range(3):
                create_pod(control_plane, f"p{index}", namespace, {"app": "web", **mine})
        # The session's cluster holds other modules' pods too: the caches ask for this test's
        # alone, so that the pages are of its pods only (the product's ask for every pod).
        selector = f"metricscale-test={names.prefix}"
        watch = Watching(lambda path: Selected(PathSource(proxied, path), selector),
                         informer_options={"page_size": 2, "watch_timeout_seconds": 30})
        watch.start()
        try:
            assert await watch.wait_synced(SYNC_WITHIN)
            assert {short: len(watch.select_pods(namespace, "app=web"))
                    for short, namespace in namespaces.items()} == {"a": 3, "a-b": 3, "b": 3}
            pages = [parse_qs(r.query) for r in fault_proxy.requests_to("^/api/v1/pods$")
                     if "watch" not in parse_qs(r.query)]
            assert len(pages) == math.ceil(9 / 2)
            assert all(page["limit"] == ["2"] for page in pages)
            assert ["continue" in page for page in pages] == [False, True, True, True, True]
        finally:
            await watch.stop()
    finally:
        for namespace in namespaces.values():
            control_plane.delete({"apiVersion": "v1", "kind": "Namespace",
                                  "metadata": {"name": namespace}})


async def test_a_watch_cut_by_compaction_relists_and_keeps_following(
        control_plane: ControlPlane, crd: None, fenced: None, namespace: str,
        proxied: KubeHTTP, fault_proxy: FaultProxy) -> None:
    watch = Watching(lambda path: PathSource(proxied, path), namespace=namespace,
                     informer_options={"watch_timeout_seconds": 1})
    create_pod(control_plane, "a", namespace, {"app": "web"})
    watch.start()
    try:
        assert await watch.wait_synced(SYNC_WITHIN)
        assert watch.pod_informer.lists == 1
        # The server ends the watch within 1 s. kube-apiserver's watch cache keeps a history
        # that etcd compaction does not shorten, so the 410 its re-watch would get after a
        # compaction comes from the fault proxy; the re-list after it is held back while a pod
        # is created, which only that re-list can then bring.
        pods = rf"^/api/v1/namespaces/{namespace}/pods\?"
        gone = fault_proxy.add_fault(
            pods + ".*watch=true", ServerError(410, "too old resource version: 1 (2)"),
            method="GET")
        held = fault_proxy.add_fault(pods + "(?!.*watch=true)", Latency(2.0), method="GET")
        await eventually(lambda: held.hits == 1, within=SYNC_WITHIN)
        create_pod(control_plane, "b", namespace, {"app": "web"})
        await eventually(lambda: len(watch.select_pods(namespace, "app=web")) == 2,
                         within=SYNC_WITHIN)
        assert gone.hits == 1 and watch.pod_informer.lists == 2
        control_plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/a")
        await eventually(lambda: [p.name for p in watch.select_pods(namespace, "app=web")]
                         == ["b"], within=SYNC_WITHIN)
    finally:
        await watch.stop()
