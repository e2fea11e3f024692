"""autoscaler.controller.watching: the pod index answers exactly as a lister with a selector would,
the selector registry never misses an autoscaler sharing pods, projections never kill a cache, and
the informers follow the fake API server (lists, watches, 410 after compaction)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

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
from metricscale.kube.informer import InformerEvent, PathSource
from testbed.fakes.kube_api import FakeKubeAPI, Latency
from tests.autoscaler.controller_support import eventually

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


# ---------------------------------------------------------------------- against the fake API

CRD_PATH = "manifests/autoscaler/crd.yaml"


def install_crd(kube: FakeKubeAPI) -> None:
    import pathlib

    import yaml

    root = pathlib.Path(__file__).resolve().parents[2]
    kube.create("apiextensions.k8s.io", "v1", "customresourcedefinitions",
                yaml.safe_load((root / CRD_PATH).read_text().split("\n---\n")[0]))


def autoscaler_object(name: str, namespace: str, target: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": target},
                     "maxReplicas": 5, **spec}}


@pytest.fixture
async def watching(fake_kube: FakeKubeAPI, kube_session: Any) -> AsyncIterator[Watching]:
    install_crd(fake_kube)
    watch = Watching(lambda path: PathSource(kube_session, path), native_hpa=True,
                     informer_options={"watch_timeout_seconds": 30})
    watch.start()
    try:
        assert await watch.wait_synced(10)
        yield watch
    finally:
        await watch.stop()


async def test_caches_fill_from_lists_and_follow_watches(fake_kube: FakeKubeAPI,
                                                         watching: Watching) -> None:
    events: list[InformerEvent[AutoscalerEntry]] = []
    watching.subscribe(events.append)
    fake_kube.create_pod("web-1", namespace="shop", labels={"app": "web"})
    fake_kube.create("metricscale.dev", "v1alpha1", "autoscalers",
                     autoscaler_object("web", "shop", "web"))
    fake_kube.create("autoscaling", "v2", "horizontalpodautoscalers", {
        "metadata": {"name": "db", "namespace": "shop"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                    "name": "db"}, "maxReplicas": 3}})
    await eventually(lambda: len(watching.keys()) == 2 and watching.select_pods("shop", "app=web"))
    assert sorted(watching.keys()) == [AutoscalerKey("Autoscaler", "shop", "web"),
                                       AutoscalerKey("HorizontalPodAutoscaler", "shop", "db")]
    (pod,) = watching.select_pods("shop", "app=web")
    assert pod.name == "web-1" and pod.containers[0].requests["cpu"].milli == 100
    entry = watching.get(AutoscalerKey("Autoscaler", "shop", "web"))
    assert entry is not None and entry.autoscaler is not None
    assert entry.autoscaler.spec.min_replicas == 1  # the CRD's default, applied by the server
    assert {e.kind for e in events} == {"ADDED"}


async def test_a_paged_list_across_namespaces_sharing_a_prefix_fills_every_pod(
        fake_kube: FakeKubeAPI, kube_session: Any) -> None:
    # "a" and "a-b": in key order (etcd's, `namespace/name`) "a-b/..." sorts before "a/...".
    # A page boundary inside "a" must not lose the pods of "a-b".
    install_crd(fake_kube)
    for namespace in ("a", "a-b", "b"):
        for index in range(3):
            fake_kube.create_pod(f"p{index}", namespace=namespace, labels={"app": "web"})
    watch = Watching(lambda path: PathSource(kube_session, path),
                     informer_options={"page_size": 2, "watch_timeout_seconds": 30})
    watch.start()
    try:
        assert await watch.wait_synced(10)
        assert {ns: len(watch.select_pods(ns, "app=web")) for ns in ("a", "a-b", "b")} == {
            "a": 3, "a-b": 3, "b": 3}
        pages = fake_kube.requests_to("^/api/v1/pods$")
        assert len([r for r in pages if r.param("watch") is None]) == 5
    finally:
        await watch.stop()


async def test_a_watch_cut_by_compaction_relists_and_keeps_following(
        fake_kube: FakeKubeAPI, kube_session: Any) -> None:
    watch = Watching(lambda path: PathSource(kube_session, path),
                     informer_options={"watch_timeout_seconds": 1})
    install_crd(fake_kube)
    fake_kube.create_pod("a", namespace="shop", labels={"app": "web"})
    watch.start()
    try:
        assert await watch.wait_synced(10)
        assert watch.pod_informer.lists == 1
        # The server ends the watch within 2 s; the reconnect is held back while a pod is
        # created and the history compacted past the cache's resourceVersion: 410, re-list.
        delayed = fake_kube.add_fault("^/api/v1/pods$", Latency(0.5), method="GET")
        await eventually(lambda: delayed.hits == 1, within=5)
        fake_kube.create_pod("b", namespace="shop", labels={"app": "web"})
        fake_kube.compact()
        await eventually(lambda: len(watch.select_pods("shop", "app=web")) == 2, within=10)
        assert watch.pod_informer.lists == 2
        fake_kube.store.delete("", "v1", "pods", "a", namespace="shop")
        await eventually(lambda: [p.name for p in watch.select_pods("shop", "app=web")] == ["b"])
    finally:
        await watch.stop()
