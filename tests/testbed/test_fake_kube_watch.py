"""Fake kube-apiserver: WATCH semantics (events, replay, initial ADDED, selectors, bookmarks,
timeoutSeconds, 410 after compaction, too-large resourceVersions)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.kube_http import KubeHTTPClient

PODS = "/api/v1/namespaces/demo/pods"


async def _take(events: AsyncIterator[dict[str, Any]], count: int,
                *, within: float = 5.0) -> list[dict[str, Any]]:
    taken: list[dict[str, Any]] = []
    async with asyncio.timeout(within):
        async for event in events:
            taken.append(event)
            if len(taken) == count:
                break
    return taken


def _summary(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"].get("name", "")) for e in events]


async def test_watch_from_a_list_sees_added_modified_deleted(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    listing = (await kube_http.get(PODS)).json
    stream = kube_http.watch(PODS, {"resourceVersion": listing["metadata"]["resourceVersion"]})
    reader = asyncio.ensure_future(_take(stream, 3))
    await asyncio.sleep(0)  # let the watch connect; events are replayed from history anyway
    fake_kube.create_pod("a", namespace="demo")
    fake_kube.store.mutate("", "v1", "pods", "a", lambda p: p["metadata"].update(
        labels={"x": "y"}), namespace="demo")
    fake_kube.store.delete("", "v1", "pods", "a", namespace="demo")
    events = await reader
    assert _summary(events) == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and len(set(versions)) == 3
    assert events[0]["object"]["kind"] == "Pod" and events[0]["object"]["apiVersion"] == "v1"
    await stream.aclose()


async def test_watch_replays_history_after_the_resource_version(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    first = fake_kube.create_pod("a", namespace="demo")
    fake_kube.create_pod("b", namespace="demo")
    fake_kube.store.delete("", "v1", "pods", "a", namespace="demo")
    stream = kube_http.watch(PODS, {"resourceVersion": first["metadata"]["resourceVersion"]})
    assert _summary(await _take(stream, 2)) == [("ADDED", "b"), ("DELETED", "a")]
    await stream.aclose()


async def test_watch_without_resource_version_starts_with_synthetic_added(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    fake_kube.create_pod("a", namespace="demo")
    fake_kube.create_pod("b", namespace="demo")
    fake_kube.create_pod("c", namespace="elsewhere")
    stream = kube_http.watch(PODS)
    assert _summary(await _take(stream, 2)) == [("ADDED", "a"), ("ADDED", "b")]
    await stream.aclose()


async def test_watch_from_a_compacted_version_gets_an_expired_error_event(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    old = fake_kube.create_pod("a", namespace="demo")["metadata"]["resourceVersion"]
    fake_kube.create_pod("b", namespace="demo")
    compacted = fake_kube.compact()
    events = [e async for e in kube_http.watch(PODS, {"resourceVersion": old})]
    # As the watch cache does: HTTP 200, one ERROR event carrying the 410 Status, then EOF.
    assert events == [{"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": f"too old resource version: {old} ({compacted})", "reason": "Expired",
        "code": 410}}]
    recent = [e async for e in kube_http.watch(PODS, {"resourceVersion": str(compacted),
                                                      "timeoutSeconds": "1"})]
    assert recent == []


async def test_compaction_to_a_given_version(fake_kube: FakeKubeAPI,
                                             kube_http: KubeHTTPClient) -> None:
    first = int(fake_kube.create_pod("a", namespace="demo")["metadata"]["resourceVersion"])
    second = fake_kube.create_pod("b", namespace="demo")["metadata"]["resourceVersion"]
    assert fake_kube.compact(first) == first
    stream = kube_http.watch(PODS, {"resourceVersion": str(first)})
    assert _summary(await _take(stream, 1)) == [("ADDED", "b")]
    await stream.aclose()
    expired = [e async for e in kube_http.watch(PODS, {"resourceVersion": str(first - 1)})]
    assert expired[0]["object"]["code"] == 410
    assert second


async def test_bookmarks_carry_only_the_kind_and_resource_version(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    fake_kube.watch_settings.bookmark_interval = 0.05
    rv = str(fake_kube.resource_version)
    stream = kube_http.watch(PODS, {"resourceVersion": rv, "allowWatchBookmarks": "true",
                                    "timeoutSeconds": "30"})
    events = await _take(stream, 2)
    await stream.aclose()
    assert [e["type"] for e in events] == ["BOOKMARK", "BOOKMARK"]
    assert events[0]["object"] == {"kind": "Pod", "apiVersion": "v1", "metadata": {
        "resourceVersion": rv, "creationTimestamp": None}}


async def test_no_bookmarks_unless_asked(fake_kube: FakeKubeAPI,
                                         kube_http: KubeHTTPClient) -> None:
    fake_kube.watch_settings.bookmark_interval = 0.01
    events = [e async for e in kube_http.watch(PODS, {
        "resourceVersion": str(fake_kube.resource_version), "timeoutSeconds": "1"})]
    assert events == []


async def test_timeout_seconds_ends_the_stream(fake_kube: FakeKubeAPI,
                                               kube_http: KubeHTTPClient) -> None:
    started = time.monotonic()
    events = [e async for e in kube_http.watch(PODS, {
        "resourceVersion": str(fake_kube.resource_version), "timeoutSeconds": "1"})]
    elapsed = time.monotonic() - started
    # The stream ended by itself (the test's own timeout guards a stream that never ends),
    # and not before its timeoutSeconds.
    assert events == [] and elapsed >= 0.9


async def test_selector_transitions_become_added_and_deleted(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    fake_kube.create_pod("a", namespace="demo", labels={"app": "db"})
    rv = str(fake_kube.resource_version)
    stream = kube_http.watch(PODS, {"resourceVersion": rv, "labelSelector": "app=web"})
    reader = asyncio.ensure_future(_take(stream, 3))
    await asyncio.sleep(0)

    def relabel(app: str) -> None:
        fake_kube.store.mutate("", "v1", "pods", "a",
                               lambda p: p["metadata"]["labels"].update(app=app),
                               namespace="demo")

    relabel("web")   # enters the selection
    fake_kube.store.mutate("", "v1", "pods", "a",
                           lambda p: p["metadata"]["labels"].update(v="2"), namespace="demo")
    relabel("db")    # leaves it
    events = await reader
    await stream.aclose()
    assert _summary(events) == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    assert events[2]["object"]["metadata"]["labels"]["app"] == "web"  # the last matching state


async def test_watch_from_a_version_not_reached_yet_opens_and_skips_up_to_it(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    # cacher.Watch (apiserver/pkg/storage/cacher): the watch opens at once and its watcher
    # sends only events newer than the requested version, without a 504.
    future = fake_kube.resource_version + 2
    stream = kube_http.watch(PODS, {"resourceVersion": str(future)})
    reader = asyncio.create_task(_take(stream, 1))
    # The fake subscribes a watch in the same step as it logs the request (no await between):
    # once logged, the watch is open, at a version the server has not reached yet.
    deadline = time.monotonic() + 30
    while not fake_kube.requests_to(f"^{PODS}$", method="GET"):
        assert time.monotonic() < deadline, "the watch request never arrived"
        await asyncio.sleep(0.01)
    assert fake_kube.resource_version < future
    for name in ("a", "b", "c"):  # resource versions future-1, future, future+1
        fake_kube.create_pod(name, namespace="demo")
    events = await reader
    await stream.aclose()
    assert _summary(events) == [("ADDED", "c")]
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) == future + 1


async def test_send_initial_events_ends_with_an_annotated_bookmark(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    fake_kube.create_pod("a", namespace="demo")
    stream = kube_http.watch(PODS, {"sendInitialEvents": "true", "allowWatchBookmarks": "true",
                                    "resourceVersionMatch": "NotOlderThan"})
    events = await _take(stream, 2)
    await stream.aclose()
    assert events[0]["type"] == "ADDED"
    assert events[1]["type"] == "BOOKMARK"
    assert events[1]["object"]["metadata"]["annotations"] == {
        "k8s.io/initial-events-end": "true"}


async def test_a_watcher_that_hangs_up_ends_its_watch_without_an_error_log(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient,
        caplog: pytest.LogCaptureFixture) -> None:
    # As when the demo stops the autoscaler while its Deployment controller still writes.
    fake_kube.create_pod("a", namespace="demo")
    stream = kube_http.watch(PODS)
    assert _summary(await _take(stream, 1)) == [("ADDED", "a")]
    await stream.aclose()  # the client hangs up
    labels = 0
    while fake_kube.rest._watch_queues:  # events keep coming until the watch sees it is over
        labels += 1
        fake_kube.store.mutate("", "v1", "pods", "a", lambda p, n=labels: p["metadata"].update(
            labels={"n": str(n)}), namespace="demo")
        await asyncio.sleep(0)  # a turn of the loop for the server, not a wait
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
