"""The informer over built-in and custom-object collections against the session's real
kube-apiserver, through the fault proxy in front of it (which records every request and
injects what the real server cannot be made to answer on demand: a 410 for the watch's
version, a 429 with Retry-After).

Objects live in the test's `namespace`; the Widget CRD is in a group of the module's own
(`Names`) and deleted afterwards."""

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
from testbed.controlplane import ControlPlane, KubeError
from testbed.faultproxy import FaultProxy, ServerError, TooManyRequests
from tests.adapter.cluster import Names, pod_manifest
from tests.autoscaler.test_kube_io import established, paused_deployment
from tests.cluster.support import until

FAST: dict[str, Any] = {"backoff": Backoff(initial=0.01, cap=0.02), "jitter": lambda: 0.0}
# Guards against a hang on a busy machine, not measures.
SYNC_SECONDS = 60.0




async def test_deployment_watch_keeps_raw_dicts_and_sees_changes(
        control_plane: ControlPlane, namespace: str, proxied_kube_http: KubeHTTP) -> None:
    # Paused: the deployment controller makes no ReplicaSet and no pod of it.
    control_plane.apply(paused_deployment(namespace, "web", replicas=2))
    informer: Informer[Mapping[str, Any]] = Informer(
        PathSource(proxied_kube_http, collection_path(group="apps", version="v1",
                                                 plural="deployments", namespace=namespace)),
        project=project_raw, watch_timeout_seconds=1, **FAST)
    changed = asyncio.Event()
    events: list[InformerEvent[Mapping[str, Any]]] = []

    def replicas(obj: object) -> object:
        return isinstance(obj, dict) and obj["spec"]["replicas"]

    def record(event: InformerEvent[Mapping[str, Any]]) -> None:
        events.append(event)
        if event.kind == "MODIFIED" and replicas(event.new) == 5:
            changed.set()

    informer.subscribe(record)
    async with informer:
        assert await informer.wait_synced(SYNC_SECONDS)
        await asyncio.to_thread(
            control_plane.request, "PATCH",
            f"/apis/apps/v1/namespaces/{namespace}/deployments/web", {"spec": {"replicas": 5}},
            content_type="application/merge-patch+json")
        await asyncio.wait_for(changed.wait(), SYNC_SECONDS)
    # Unlike the fake, the real deployment controller writes the status too (its own MODIFIED
    # events, before and after): the change is the event whose new spec says 5.
    modified = next(e for e in events if e.kind == "MODIFIED" and replicas(e.new) == 5)
    assert isinstance(modified.new, dict) and modified.new["spec"]["replicas"] == 5
    assert isinstance(modified.old, dict) and modified.old["spec"]["replicas"] == 2


async def test_namespaced_pods_relist_when_the_watch_version_is_gone(
        control_plane: ControlPlane, namespace: str, fault_proxy: FaultProxy,
        proxied_kube_http: KubeHTTP) -> None:
    # Never scheduled: no kubelet writes their status meanwhile.
    control_plane.apply(pod_manifest("a", namespace, labels={"app": "web"}))
    control_plane.apply(pod_manifest("skip", namespace, labels={"app": "db"}))
    informer: Informer[Mapping[str, Any]] = Informer(
        PathSource(proxied_kube_http, collection_path(group="", version="v1", plural="pods",
                                                 namespace=namespace)),
        project=project_raw, label_selector="app=web", **FAST)
    await informer.list_once()
    control_plane.apply(pod_manifest("b", namespace, labels={"app": "web"}))
    # The real server's watch cache holds every version since it started (compaction cannot be
    # forced on demand): the proxy answers the watch from the list's version 410, as an HTTP
    # status. kube-apiserver sends its 410 as an ERROR event inside a 200 watch instead, which
    # the proxy cannot inject; the informer treats both as Gone (the event form:
    # tests/metricscale/test_informer.py, on a scripted stream).
    gone = fault_proxy.add_fault(rf"^/api/v1/namespaces/{namespace}/pods\?.*watch=",
                                 ServerError(410, "too old resource version"), method="GET")
    await informer.step()
    assert gone.hits == 1
    assert informer.resource_version is None
    await informer.step()
    assert sorted(key.name for key, _ in informer.items()) == ["a", "b"]


async def test_custom_objects_watch_through_429_with_retry_after(
        control_plane: ControlPlane, namespace: str, fault_proxy: FaultProxy,
        proxied_kube_http: KubeHTTP) -> None:
    group = f"{Names.unique('informer').prefix}.example.com"
    crd: dict[str, Any] = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"kind": "Widget", "plural": "widgets", "singular": "widget",
                           "listKind": "WidgetList"},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {
                                   "type": "object",
                                   "x-kubernetes-preserve-unknown-fields": True}}}]}}
    control_plane.apply(crd)
    try:
        await until(lambda: established(control_plane, crd["metadata"]["name"]),
                    what="the Widget CRD Established")
        widget = {"apiVersion": f"{group}/v1", "kind": "Widget",
                  "metadata": {"name": "w", "namespace": namespace}}

        def created() -> bool:  # the CRD's REST endpoint may lag its Established condition
            try:
                control_plane.apply(widget)
            except KubeError:
                return False
            return True

        await until(created, what="widget w created")
        delays: list[float] = []

        async def no_wait(seconds: float) -> None:
            delays.append(seconds)

        informer: Informer[Mapping[str, Any]] = Informer(
            PathSource(proxied_kube_http, collection_path(group=group, version="v1",
                                                     plural="widgets", namespace=namespace)),
            project=project_raw, sleep=no_wait, **FAST)
        throttled = fault_proxy.add_fault(rf"/namespaces/{namespace}/widgets(\?|$)",
                                          TooManyRequests(retry_after=4), method="GET")
        await informer.step()
        assert throttled.hits == 1
        assert not informer.has_synced and delays == [4.0]
        await informer.step()
        assert informer.get(namespace, "w") is not None
    finally:
        control_plane.delete(crd)
