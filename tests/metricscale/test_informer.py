"""The list+watch informer against a scripted local API server: caching, resumption, recovery."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from metricscale.kube.config import Configuration
from metricscale.kube.errors import Forbidden, Gone, KubeError, TooManyRequests, parse_retry_after
from metricscale.kube.http import KubeHTTP
from metricscale.kube.informer import (
    METADATA_LIST_ACCEPT,
    METADATA_WATCH_ACCEPT,
    Informer,
    InformerEvent,
    InformerFailed,
    ObjectKey,
    ObjectMeta,
    PathSource,
    WatchEnd,
    collection_path,
    project_metadata,
    project_raw,
)
from metricscale.kube.retry import Backoff

# ---------------------------------------------------------------------------------------------
# A scripted API server: every LIST and WATCH answer is queued by the test.

Responder = Callable[[web.Request], Awaitable[web.StreamResponse]]


def pod(name: str, rv: str, *, namespace: str = "default", **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": rv,
                         "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "x"}]}}


def status(code: int, reason: str, message: str = "") -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": reason, "message": message}


def page(items: list[dict[str, Any]], rv: str, cont: str | None = None) -> Responder:
    async def respond(request: web.Request) -> web.StreamResponse:
        meta: dict[str, Any] = {"resourceVersion": rv}
        if cont:
            meta["continue"] = cont
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": meta,
                                  "items": items})
    return respond


def error(code: int, reason: str, headers: Mapping[str, str] | None = None) -> Responder:
    async def respond(request: web.Request) -> web.StreamResponse:
        return web.json_response(status(code, reason, "scripted"), status=code,
                                 headers=dict(headers or {}))
    return respond


@dataclass
class Stream:
    """A watch answer: events, then close cleanly, drop the connection, or go silent."""

    events: list[dict[str, Any]]
    then: str = "close"  # "close" | "drop" | "hang"
    server: ScriptedServer | None = None

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for event in self.events:
            await response.write(json.dumps(event).encode() + b"\n")
        if self.then == "drop":
            assert request.transport is not None
            request.transport.close()
            return response
        if self.then == "hang":
            assert self.server is not None
            await self.server.released.wait()
        with contextlib.suppress(ConnectionError):  # the client may be gone by now
            await response.write_eof()
        return response


def ev(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def bookmark(rv: str) -> dict[str, Any]:
    return ev("BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": rv}})


@dataclass
class Seen:
    path: str
    query: dict[str, str]
    accept: str
    authorization: str | None


@dataclass
class ScriptedServer:
    lists: deque[Responder] = field(default_factory=deque)
    watches: deque[Responder] = field(default_factory=deque)
    seen: list[Seen] = field(default_factory=list)
    released: asyncio.Event = field(default_factory=asyncio.Event)

    def watch_requests(self) -> list[Seen]:
        return [s for s in self.seen if s.query.get("watch", "").lower() == "true"]

    def list_requests(self) -> list[Seen]:
        return [s for s in self.seen if s.query.get("watch", "").lower() != "true"]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(Seen(request.path, dict(request.query), request.headers.get("Accept", ""),
                              request.headers.get("Authorization")))
        queue = self.watches if request.query.get("watch", "").lower() == "true" else self.lists
        if not queue:  # nothing scripted: a silent watch, or a server error for a list
            if queue is self.watches:
                return await Stream([], then="hang", server=self)(request)
            return await error(500, "InternalError")(request)
        return await queue.popleft()(request)


@pytest.fixture
async def scripted(aiohttp_server: Any) -> AsyncIterator[tuple[ScriptedServer, KubeHTTP]]:
    script = ScriptedServer()
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", script.handle)
    server = await aiohttp_server(app)
    cfg = Configuration(host=str(server.make_url("")).rstrip("/"))
    cfg.api_key = {"BearerToken": "t0ken"}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    api = KubeHTTP(cfg, user_agent="metricscale-tests")
    api.start()
    try:
        yield script, api
    finally:
        script.released.set()
        await api.close()


class Sleeps:
    """An injected sleep that records the delays and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def pods_informer(api: KubeHTTP, **kwargs: Any) -> Informer[ObjectMeta]:
    kwargs.setdefault("jitter", lambda: 0.0)
    kwargs.setdefault("sleep", Sleeps())
    kwargs.setdefault("inactivity_timeout", 5.0)  # an unscripted watch is silent: fail fast
    return Informer(PathSource(api, "/api/v1/namespaces/default/pods", metadata_only=True),
                    project=project_metadata, **kwargs)


# ---------------------------------------------------------------------------------------------
# LIST


async def test_list_fills_the_cache_across_pages_and_keeps_the_lists_version(scripted: Any) -> None:
    script, api = scripted
    script.lists += [page([pod("a", "5", app="web")], "10", cont="tok"),
                     page([pod("b", "7", app="db")], "11")]
    informer = pods_informer(api, page_size=1)
    await informer.list_once()
    assert informer.has_synced
    assert informer.resource_version == "11"
    assert informer.get("default", "a") == ObjectMeta("default", "a", {"app": "web"})
    assert sorted(k.name for k, _ in informer.items("default")) == ["a", "b"]
    assert len(informer) == 2
    first, second = script.list_requests()
    assert first.query["limit"] == "1" and "continue" not in first.query
    assert second.query["continue"] == "tok"
    assert first.accept == METADATA_LIST_ACCEPT
    assert first.authorization == "Bearer t0ken"


async def test_list_sends_label_and_field_selectors(scripted: Any) -> None:
    script, api = scripted
    script.lists.append(page([], "1"))
    informer = pods_informer(api, label_selector="app in (a,b)", field_selector="metadata.name=x")
    await informer.list_once()
    (seen,) = script.list_requests()
    assert seen.query["labelSelector"] == "app in (a,b)"
    assert seen.query["fieldSelector"] == "metadata.name=x"


async def test_relist_reports_only_the_differences(scripted: Any) -> None:
    script, api = scripted
    script.lists += [page([pod("a", "1"), pod("b", "2"), pod("c", "3")], "3"),
                     page([pod("a", "1"), pod("b", "4", changed="yes"), pod("d", "5")], "5")]
    informer = pods_informer(api)
    await informer.list_once()
    seen: list[tuple[str, str]] = []
    informer.subscribe(lambda e: seen.append((e.kind, e.key.name)), replay=False)
    await informer.list_once()
    assert sorted(seen) == [("ADDED", "d"), ("DELETED", "c"), ("MODIFIED", "b")]


async def test_list_without_resource_version_is_rejected_and_retried(scripted: Any) -> None:
    script, api = scripted
    script.lists += [page([], ""), page([pod("a", "1")], "1")]
    sleeps = Sleeps()
    informer = pods_informer(api, sleep=sleeps)
    await informer.step()
    assert not informer.has_synced and informer.last_error is not None
    assert len(sleeps.delays) == 1
    await informer.step()
    assert informer.has_synced and informer.last_error is None


# ---------------------------------------------------------------------------------------------
# WATCH


async def test_watch_follows_added_modified_deleted_and_bookmarks(scripted: Any) -> None:
    script, api = scripted
    script.lists.append(page([pod("a", "1", app="web")], "1"))
    script.watches.append(Stream([
        ev("ADDED", pod("b", "2", app="db")),
        ev("MODIFIED", pod("a", "3", app="api")),
        bookmark("4"),
        ev("DELETED", pod("b", "5", app="db")),
        bookmark("6"),
    ]))
    informer = pods_informer(api, watch_timeout_seconds=60)
    events: list[InformerEvent[ObjectMeta]] = []
    await informer.list_once()
    informer.subscribe(events.append)
    result = await informer.watch_once()
    assert result.end is WatchEnd.CLOSED
    assert (result.events, result.bookmarks) == (3, 2)
    assert informer.resource_version == "6"
    assert [(e.kind, e.key) for e in events] == [
        ("ADDED", ObjectKey("default", "a")),  # the replay on subscribe
        ("ADDED", ObjectKey("default", "b")),
        ("MODIFIED", ObjectKey("default", "a")),
        ("DELETED", ObjectKey("default", "b")),
    ]
    assert events[2].old == ObjectMeta("default", "a", {"app": "web"})
    assert events[2].new == ObjectMeta("default", "a", {"app": "api"})
    assert [k.name for k, _ in informer.items()] == ["a"]
    (watch,) = script.watch_requests()
    assert watch.query["resourceVersion"] == "1"
    assert watch.query["allowWatchBookmarks"] == "true"
    assert 60 <= int(watch.query["timeoutSeconds"]) < 120
    assert watch.accept == METADATA_WATCH_ACCEPT


async def test_replayed_added_for_a_cached_object_is_not_a_new_event(scripted: Any) -> None:
    script, api = scripted
    script.lists.append(page([pod("a", "1", app="web")], "1"))
    script.watches.append(Stream([ev("ADDED", pod("a", "2", app="web"))]))
    informer = pods_informer(api)
    await informer.list_once()
    events: list[InformerEvent[ObjectMeta]] = []
    informer.subscribe(events.append, replay=False)
    await informer.watch_once()
    assert events == []
    assert informer.resource_version == "2"


async def test_dropped_connection_resumes_from_last_version_without_duplicates(
        scripted: Any) -> None:
    script, api = scripted
    script.lists.append(page([], "1"))
    script.watches += [
        Stream([ev("ADDED", pod("a", "2")), bookmark("3")], then="drop"),
        Stream([ev("ADDED", pod("b", "4"))]),
    ]
    sleeps = Sleeps()
    informer = pods_informer(api, sleep=sleeps)
    events: list[str] = []
    informer.subscribe(lambda e: events.append(f"{e.kind} {e.key}"))
    await informer.step()  # list
    await informer.step()  # watch, dropped: a transport error, backoff
    assert informer.resource_version == "3"
    assert informer.last_error is not None
    assert len(sleeps.delays) == 1
    await informer.step()  # resumed watch
    assert [s.query["resourceVersion"] for s in script.watch_requests()] == ["1", "3"]
    assert len(script.list_requests()) == 1
    assert events == ["ADDED default/a", "ADDED default/b"]


async def test_stalled_watch_hits_the_inactivity_timeout_and_resumes(scripted: Any) -> None:
    script, api = scripted
    script.lists.append(page([], "1"))
    script.watches += [Stream([bookmark("7")], then="hang", server=script),
                       Stream([ev("ADDED", pod("a", "8"))])]
    informer = pods_informer(api, inactivity_timeout=0.05)
    await informer.list_once()
    result = await informer.watch_once()
    assert result.end is WatchEnd.INACTIVE
    assert informer.resource_version == "7"
    await informer.watch_once()
    assert [s.query["resourceVersion"] for s in script.watch_requests()] == ["1", "7"]
    assert informer.get("default", "a") is not None


async def test_410_at_watch_start_relists(scripted: Any) -> None:
    script, api = scripted
    script.lists += [page([pod("a", "1")], "1"), page([pod("b", "9")], "9")]
    script.watches.append(error(410, "Expired"))
    sleeps = Sleeps()
    informer = pods_informer(api, sleep=sleeps)
    await informer.step()
    await informer.step()  # 410: forget the version, no backoff
    assert informer.resource_version is None
    assert sleeps.delays == []
    await informer.step()  # re-list
    assert informer.resource_version == "9"
    assert [k.name for k, _ in informer.items()] == ["b"]
    assert len(script.list_requests()) == 2


async def test_410_error_event_in_the_stream_relists(scripted: Any) -> None:
    script, api = scripted
    script.lists += [page([], "1"), page([], "20")]
    script.watches.append(Stream([ev("ADDED", pod("a", "2")),
                                  ev("ERROR", status(410, "Expired", "too old resource version"))]))
    informer = pods_informer(api)
    await informer.list_once()
    with pytest.raises(Gone):
        await informer.watch_once()
    informer = pods_informer(api)
    script.lists.appendleft(page([], "1"))
    script.watches.append(Stream([ev("ERROR", status(410, "Gone"))]))
    await informer.step()  # list
    await informer.step()  # watch: ERROR 410
    assert informer.resource_version is None
    await informer.step()  # re-list
    assert informer.resource_version == "20"
    assert len(informer) == 0


async def test_bare_status_line_is_an_error(scripted: Any) -> None:
    script, api = scripted
    script.lists.append(page([], "1"))
    script.watches.append(Stream([status(410, "Gone")]))
    informer = pods_informer(api)
    await informer.list_once()
    with pytest.raises(Gone):
        await informer.watch_once()


async def test_429_waits_at_least_retry_after_and_keeps_the_version(scripted: Any) -> None:
    script, api = scripted
    script.lists.append(page([], "1"))
    script.watches += [error(429, "TooManyRequests", {"Retry-After": "7"}),
                       Stream([ev("ADDED", pod("a", "2"))])]
    sleeps = Sleeps()
    informer = pods_informer(api, sleep=sleeps)
    await informer.step()
    await informer.step()
    assert sleeps.delays == [7.0]
    assert informer.resource_version == "1"
    await informer.step()
    assert [s.query["resourceVersion"] for s in script.watch_requests()] == ["1", "1"]


async def test_server_errors_back_off_exponentially_up_to_the_cap(scripted: Any) -> None:
    script, api = scripted
    script.lists += [error(503, "ServiceUnavailable") for _ in range(6)]
    sleeps = Sleeps()
    informer = pods_informer(api, sleep=sleeps, backoff=Backoff(initial=1, factor=2, cap=8),
                             jitter=lambda: 0.999999)
    for _ in range(6):
        await informer.step()
    assert [round(d) for d in sleeps.delays] == [1, 2, 4, 8, 8, 8]
    assert not informer.has_synced
    assert "503" in (informer.last_error or "")


async def test_watch_that_ends_at_once_without_events_backs_off(scripted: Any) -> None:
    script, api = scripted
    script.lists.append(page([], "1"))
    script.watches.append(Stream([]))
    sleeps = Sleeps()
    informer = pods_informer(api, sleep=sleeps)
    await informer.step()
    await informer.step()
    assert len(sleeps.delays) == 1


# ---------------------------------------------------------------------------------------------
# Error statuses without a Status body, a Status body's details, and other collections


def bare(code: int) -> Responder:
    async def respond(request: web.Request) -> web.StreamResponse:
        return web.Response(status=code, text="nope", content_type="text/plain")
    return respond


@pytest.mark.parametrize(("code", "expected"), [(410, Gone), (403, Forbidden)])
async def test_an_error_status_without_a_status_body_maps_by_status(
        scripted: Any, code: int, expected: type[Exception]) -> None:
    script, api = scripted
    script.lists.append(bare(code))
    informer = pods_informer(api)
    with pytest.raises(expected) as caught:
        await informer.list_once()
    assert isinstance(caught.value, KubeError)
    assert caught.value.status == code


async def test_a_status_body_keeps_reason_and_retry_after(scripted: Any) -> None:
    script, api = scripted
    script.lists.append(error(429, "TooManyRequests", {"Retry-After": "3"}))
    informer = pods_informer(api)
    with pytest.raises(TooManyRequests) as caught:
        await informer.list_once()
    assert (caught.value.status, caught.value.reason, caught.value.retry_after) == (
        429, "TooManyRequests", 3.0)


async def test_a_plain_source_yields_raw_dicts(scripted: Any) -> None:
    script, api = scripted
    script.lists.append(page([pod("a", "1", app="web")], "1"))
    script.watches.append(Stream([ev("MODIFIED", pod("a", "2", app="api"))]))
    informer: Informer[Mapping[str, Any]] = Informer(
        PathSource(api, "/api/v1/namespaces/default/pods"), project=project_raw,
        label_selector="app", jitter=lambda: 0.0)
    await informer.list_once()
    await informer.watch_once()
    obj = informer.get("default", "a")
    assert isinstance(obj, dict)
    assert obj["metadata"]["labels"] == {"app": "api"}
    listed, watched = script.seen
    assert listed.path == "/api/v1/namespaces/default/pods"
    assert listed.query["labelSelector"] == "app"
    assert listed.accept == "application/json"
    assert watched.query["watch"].lower() == "true"
    assert watched.query["allowWatchBookmarks"].lower() == "true"
    assert watched.query["resourceVersion"] == "1"


async def test_a_cluster_scoped_custom_collection_lists_and_watches(scripted: Any) -> None:
    script, api = scripted
    thing = {"apiVersion": "example.com/v1", "kind": "Thing",
             "metadata": {"name": "t", "resourceVersion": "3"}}
    script.lists.append(page([thing], "3"))
    script.watches.append(Stream([ev("DELETED", thing | {"metadata": {"name": "t",
                                                                      "resourceVersion": "4"}})]))
    informer = Informer(PathSource(api, collection_path(group="example.com", version="v1",
                                                        plural="things")),
                        project=project_metadata, jitter=lambda: 0.0)
    await informer.list_once()
    assert informer.get("", "t") == ObjectMeta("", "t", {})
    await informer.watch_once()
    assert len(informer) == 0
    assert script.seen[0].path == "/apis/example.com/v1/things"


def test_collection_paths() -> None:
    assert collection_path(group="", version="v1", plural="pods") == "/api/v1/pods"
    assert collection_path(group="", version="v1", plural="pods", namespace="ns") == (
        "/api/v1/namespaces/ns/pods")
    assert collection_path(group="apps", version="v1", plural="deployments", namespace="a") == (
        "/apis/apps/v1/namespaces/a/deployments")


@pytest.mark.parametrize(("header", "seconds"), [
    (None, None), ("5", 5.0), ("0", 0.0), ("-1", None), ("soon", None), ("86400", 300.0)])
def test_retry_after_parsing(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header) == seconds


@pytest.mark.parametrize(("failures", "jitter", "retry_after", "expected"), [
    (1, 0.0, None, 0.25), (1, 1.0, None, 0.5), (3, 0.0, None, 1.0), (20, 1.0, None, 30.0),
    (1, 0.0, 10.0, 10.0), (10, 1.0, 5.0, 30.0)])
def test_backoff_is_capped_jittered_and_honours_retry_after(
        failures: int, jitter: float, retry_after: float | None, expected: float) -> None:
    assert Backoff().delay(failures, jitter=jitter, retry_after=retry_after) == expected


# ---------------------------------------------------------------------------------------------
# Lifecycle: running, syncing, failing loudly, stopping


async def test_running_informer_syncs_then_follows_and_stops_cleanly(scripted: Any) -> None:
    script, api = scripted
    script.lists.append(page([pod("a", "1")], "1"))
    script.watches.append(Stream([ev("ADDED", pod("b", "2"))], then="hang", server=script))
    informer = pods_informer(api)
    added = asyncio.Event()
    informer.subscribe(lambda e: added.set() if e.key.name == "b" else None)
    async with informer:
        assert await informer.wait_synced(5)
        await asyncio.wait_for(added.wait(), 5)
        assert informer.running
    assert not informer.running
    with pytest.raises(InformerFailed):
        await informer.wait_synced(0.01)


async def test_wait_synced_times_out_while_the_list_keeps_failing(scripted: Any) -> None:
    _script, api = scripted  # nothing scripted: every LIST is a 500
    informer = pods_informer(api, sleep=asyncio.sleep, backoff=Backoff(initial=0.01, cap=0.02))
    async with informer:
        assert not await informer.wait_synced(0.1)
        assert "500" in (informer.last_error or "")


async def test_a_bug_in_the_projection_surfaces_instead_of_dying_silently(scripted: Any) -> None:
    script, api = scripted
    script.lists.append(page([pod("a", "1")], "1"))

    def broken(obj: Mapping[str, Any]) -> int:
        raise KeyError("bug")

    failures: list[BaseException] = []
    informer = Informer(PathSource(api, "/api/v1/pods"), project=broken)
    informer.start(on_failure=failures.append)
    with pytest.raises(InformerFailed):
        await informer.wait_synced(5)
    assert isinstance(failures[0], KeyError)
    await informer.stop()


async def test_a_failing_listener_does_not_stop_the_cache(scripted: Any) -> None:
    script, api = scripted
    script.lists.append(page([], "1"))
    script.watches.append(Stream([ev("ADDED", pod("a", "2")), ev("ADDED", pod("b", "3"))]))
    informer = pods_informer(api)
    await informer.list_once()
    seen: list[str] = []

    def flaky(event: InformerEvent[ObjectMeta]) -> None:
        seen.append(event.key.name)
        raise RuntimeError("consumer bug")

    informer.subscribe(flaky)
    await informer.watch_once()
    assert seen == ["a", "b"]
    assert len(informer) == 2
