"""The informer over built-in and custom-object collections against the shared fake apiserver."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from metricscale.kube.http import KubeHTTP
from metricscale.kube.informer import (
    Informer,
    InformerEvent,
    PathSource,
    collection_path,
    project_raw,
)
from metricscale.kube.retry import Backoff
from testbed.fakes.kube_api import FakeKubeAPI, TooManyRequests

FAST: dict[str, Any] = {"backoff": Backoff(initial=0.01, cap=0.02), "jitter": lambda: 0.0}


async def test_deployment_watch_keeps_raw_dicts_and_sees_changes(
        fake_kube: FakeKubeAPI, kube_session: KubeHTTP) -> None:
    fake_kube.create_deployment("web", namespace="shop", replicas=2)
    informer: Informer[Mapping[str, Any]] = Informer(
        PathSource(kube_session, collection_path(group="apps", version="v1",
                                                 plural="deployments")),
        project=project_raw, watch_timeout_seconds=1, **FAST)
    changed = asyncio.Event()
    events: list[InformerEvent[Mapping[str, Any]]] = []

    def record(event: InformerEvent[Mapping[str, Any]]) -> None:
        events.append(event)
        if event.kind == "MODIFIED":
            changed.set()

    informer.subscribe(record)
    async with informer:
        assert await informer.wait_synced(5)
        fake_kube.store.mutate("apps", "v1", "deployments", "web",
                               lambda obj: obj["spec"].update(replicas=5), namespace="shop")
        await asyncio.wait_for(changed.wait(), 10)
    modified = events[-1]
    assert isinstance(modified.new, dict) and modified.new["spec"]["replicas"] == 5
    assert isinstance(modified.old, dict) and modified.old["spec"]["replicas"] == 2


async def test_namespaced_pods_relist_after_compaction(
        fake_kube: FakeKubeAPI, kube_session: KubeHTTP) -> None:
    fake_kube.create_pod("a", labels={"app": "web"})
    fake_kube.create_pod("skip", labels={"app": "db"})
    informer: Informer[Mapping[str, Any]] = Informer(
        PathSource(kube_session, collection_path(group="", version="v1", plural="pods",
                                                 namespace="default")),
        project=project_raw, label_selector="app=web", **FAST)
    await informer.list_once()
    fake_kube.create_pod("b", labels={"app": "web"})
    fake_kube.compact()  # the watch from the list's version is now 410 (an ERROR event)
    await informer.step()
    assert informer.resource_version is None
    await informer.step()
    assert sorted(key.name for key, _ in informer.items()) == ["a", "b"]


async def test_custom_objects_watch_through_429_with_retry_after(
        fake_kube: FakeKubeAPI, kube_session: KubeHTTP) -> None:
    fake_kube.create_crd(group="example.com", kind="Widget", plural="widgets")
    fake_kube.create("example.com", "v1", "widgets", {"metadata": {"name": "w"}},
                     namespace="default")
    delays: list[float] = []

    async def no_wait(seconds: float) -> None:
        delays.append(seconds)

    informer: Informer[Mapping[str, Any]] = Informer(
        PathSource(kube_session, collection_path(group="example.com", version="v1",
                                                 plural="widgets", namespace="default")),
        project=project_raw, sleep=no_wait, **FAST)
    fake_kube.add_fault(r"/widgets$", TooManyRequests(retry_after=4), method="GET")
    await informer.step()
    assert not informer.has_synced and delays == [4.0]
    await informer.step()
    assert informer.get("default", "w") is not None
