"""A list+watch cache over the shared KubeHTTP: raw dicts, caller projections, resumable watches.

The loop is client-go's reflector in miniature: LIST (paged) once, then WATCH from the list's
resourceVersion with bookmarks, resume from the last seen resourceVersion after any disconnect,
and LIST again only when the server says that version is gone (410). Both programs use it: the
adapter for metadata-only object caches, the autoscaler to enqueue work on changes.

Responses are read here, line by line, from `KubeHTTP.stream`: every object stays a raw dict
(no model deserialization, no client-side validation of half-filled objects), and error
statuses (HTTP or a watch `ERROR` event) become `metricscale.kube.errors` classes in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Generic, Literal, NamedTuple, NoReturn, Protocol, TypedDict, TypeVar, cast
from urllib.parse import quote

import aiohttp
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from metricscale.kube.errors import (
    Gone,
    KubeError,
    UnexpectedResponse,
    error_from_response,
    error_from_status,
)
from metricscale.kube.http import JSON, KubeHTTP
from metricscale.kube.retry import Backoff
from metricscale.tasks import start_guarded_task

__all__ = [
    "METADATA_LIST_ACCEPT",
    "METADATA_WATCH_ACCEPT",
    "EventKind",
    "Informer",
    "InformerCollector",
    "InformerEvent",
    "InformerFailed",
    "InformerOptions",
    "ListWatchSource",
    "ObjectKey",
    "ObjectMeta",
    "PathSource",
    "RequestOptions",
    "WatchEnd",
    "WatchResult",
    "collection_path",
    "object_key",
    "project_metadata",
    "project_raw",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

EventKind = Literal["ADDED", "MODIFIED", "DELETED"]

# What client-go's metadata client asks for: the apiserver then sends only each object's
# metadata (PartialObjectMetadata), and the trailing plain JSON keeps servers that do not know
# the `as=` parameter (fakes, old aggregated servers) answering with whole objects.
METADATA_LIST_ACCEPT = (
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json")
METADATA_WATCH_ACCEPT = (
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json")

_DEFAULT_BACKOFF = Backoff()
# client-go treats a watch that ends within a second without a single event as a failure.
_SHORT_WATCH_SECONDS = 1.0
# kube-apiserver's watch cache sends a bookmark about once a minute on every watch that asked for
# them (and one shortly before timeoutSeconds ends), so a watch silent for longer than this plus
# a margin for a busy server is stalled, not quiet.
BOOKMARK_INTERVAL_SECONDS = 60.0
_STALL_MARGIN_SECONDS = 15.0
DEFAULT_STALL_TIMEOUT = BOOKMARK_INTERVAL_SECONDS + _STALL_MARGIN_SECONDS


# ---------------------------------------------------------------------------------------------
# Values


class InformerOptions(TypedDict, total=False):
    """How every Informer of a program lists, watches and retries (Informer's keyword
    arguments of the same names; what is not given keeps its default). Tests shorten them."""

    page_size: int
    watch_timeout_seconds: int
    inactivity_timeout: float | None
    stall_timeout: float | None
    connect_timeout: float
    read_grace: float
    list_read_timeout: float
    backoff: Backoff
    clock: Callable[[], float]
    sleep: Callable[[float], Awaitable[None]]
    jitter: Callable[[], float]


class ObjectKey(NamedTuple):
    """Where an object lives: namespace ("" for cluster-scoped objects) and name."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True)
class InformerEvent(Generic[T]):
    """A change to the cache: `old` is None for ADDED, `new` is None for DELETED."""

    kind: EventKind
    key: ObjectKey
    old: T | None
    new: T | None


@dataclass(frozen=True)
class ObjectMeta:
    """The projection the adapter keeps per object: no spec, no status."""

    namespace: str
    name: str
    labels: Mapping[str, str]


def object_key(obj: Mapping[str, Any]) -> ObjectKey:
    """The store key of a raw object; raises UnexpectedResponse when it has no name."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        raise UnexpectedResponse("object without metadata")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise UnexpectedResponse("object without metadata.name")
    namespace = metadata.get("namespace") or ""
    if not isinstance(namespace, str):
        raise UnexpectedResponse("object with a non-string metadata.namespace")
    return ObjectKey(namespace, name)


def project_metadata(obj: Mapping[str, Any]) -> ObjectMeta:
    """Name, namespace and labels of a raw object (full object or PartialObjectMetadata)."""
    key = object_key(obj)
    raw_labels = obj["metadata"].get("labels") or {}
    if not isinstance(raw_labels, Mapping):
        raw_labels = {}
    labels = {str(k): str(v) for k, v in raw_labels.items()}
    return ObjectMeta(namespace=key.namespace, name=key.name, labels=labels)


def project_raw(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """Keep the whole raw object (for consumers that read spec/status)."""
    return obj


def collection_path(*, group: str, version: str, plural: str, namespace: str | None = None) -> str:
    """The REST path of a collection: `/api/v1/pods`, `/apis/apps/v1/namespaces/ns/deployments`."""
    root = f"/api/{version}" if group == "" else f"/apis/{group}/{version}"
    if namespace:
        return f"{root}/namespaces/{quote(namespace, safe='')}/{plural}"
    return f"{root}/{plural}"


# ---------------------------------------------------------------------------------------------
# Errors (the Kubernetes ones are metricscale.kube.errors')


class InformerFailed(Exception):
    """The informer's background task ended (a bug or a stop); its cache no longer follows."""


# ---------------------------------------------------------------------------------------------
# Sources: how a LIST or WATCH request is opened


@dataclass(frozen=True)
class RequestOptions:
    """One LIST page or one WATCH request, independent of the API flavour that sends it."""

    watch: bool
    request_timeout: aiohttp.ClientTimeout
    label_selector: str | None = None
    field_selector: str | None = None
    resource_version: str | None = None
    timeout_seconds: int | None = None
    limit: int | None = None
    continue_token: str | None = None


class ListWatchSource(Protocol):
    """Opens a LIST or WATCH request: the unread response (status not yet checked), released
    when the `async with` ends."""

    @property
    def description(self) -> str: ...

    def open(self, options: RequestOptions,
             ) -> AbstractAsyncContextManager[aiohttp.ClientResponse]: ...


class PathSource:
    """Any collection by its REST path, over the shared KubeHTTP (arbitrary group/version).

    With `metadata_only` the server is asked for PartialObjectMetadata, as client-go's metadata
    informers do, so a pod cache never transfers pod specs.
    """

    def __init__(self, http: KubeHTTP, path: str, *, metadata_only: bool = False) -> None:
        self._http = http
        self._path = path
        self._metadata_only = metadata_only

    @property
    def description(self) -> str:
        return self._path

    def open(self, options: RequestOptions,
             ) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        query: list[tuple[str, str]] = []
        if options.label_selector:
            query.append(("labelSelector", options.label_selector))
        if options.field_selector:
            query.append(("fieldSelector", options.field_selector))
        if options.resource_version is not None:
            query.append(("resourceVersion", options.resource_version))
        if options.watch:
            query += [("watch", "true"), ("allowWatchBookmarks", "true")]
            if options.timeout_seconds is not None:
                query.append(("timeoutSeconds", str(options.timeout_seconds)))
            accept = METADATA_WATCH_ACCEPT if self._metadata_only else JSON
        else:
            if options.limit is not None:
                query.append(("limit", str(options.limit)))
            if options.continue_token:
                query.append(("continue", options.continue_token))
            accept = METADATA_LIST_ACCEPT if self._metadata_only else JSON
        return self._http.stream(self._path, query=query, accept=accept,
                                 client_timeout=options.request_timeout)


# ---------------------------------------------------------------------------------------------
# The informer


class WatchEnd(enum.Enum):
    """Why one watch connection ended without an error."""

    CLOSED = "closed"          # the server ended the stream (timeoutSeconds reached)
    STALLED = "stalled"        # neither an event nor a bookmark for the stall timeout
    INACTIVE = "inactive"      # nothing arrived for the inactivity timeout: likely half-open


@dataclass(frozen=True)
class WatchResult:
    end: WatchEnd
    events: int
    bookmarks: int
    seconds: float


class Informer(Generic[T]):
    """A cache of one collection, kept current by list+watch, holding `project(obj)` per object.

    Drive it with `start()`/`stop()` (or `async with`), or step it in tests with `list_once()`
    and `watch_once()`. Reads (`get`, `items`, `values`) are plain in-memory lookups.
    """

    def __init__(
        self,
        source: ListWatchSource,
        *,
        project: Callable[[Mapping[str, Any]], T],
        name: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        watch_timeout_seconds: int = 300,
        inactivity_timeout: float | None = 120.0,
        stall_timeout: float | None = DEFAULT_STALL_TIMEOUT,
        connect_timeout: float = 10.0,
        read_grace: float = 30.0,
        list_read_timeout: float = 60.0,
        backoff: Backoff = _DEFAULT_BACKOFF,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._source = source
        self._project = project
        self.name = name or source.description
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._page_size = page_size
        self._watch_timeout_seconds = watch_timeout_seconds
        self._inactivity_timeout = inactivity_timeout
        self._stall_timeout = stall_timeout
        self._connect_timeout = connect_timeout
        self._read_grace = read_grace
        self._list_read_timeout = list_read_timeout
        self._backoff = backoff
        self._clock = clock
        self._sleep = sleep
        self._jitter = jitter

        self._store: dict[str, dict[str, T]] = {}
        self._count = 0
        self._resource_version: str | None = None
        self._synced = False
        self._settled = asyncio.Event()
        self._listeners: list[Callable[[InformerEvent[T]], None]] = []
        self._failures = 0
        self._last_error: str | None = None
        self._last_failure: BaseException | None = None
        self._task: asyncio.Task[Any] | None = None
        self._failure: BaseException | None = None
        self._stopped = False
        self.lists = 0
        self.watches = 0
        self._last_activity: float | None = None
        self.restarts: dict[str, int] = {}

    # -- state ---------------------------------------------------------------------------

    @property
    def resource_version(self) -> str | None:
        """The last resourceVersion seen (list, event or bookmark); None means LIST next."""
        return self._resource_version

    @property
    def has_synced(self) -> bool:
        """True once a first LIST has filled the cache (stays true across re-lists)."""
        return self._synced

    @property
    def last_error(self) -> str | None:
        """The last LIST/WATCH failure, for diagnostics; cleared by the next success."""
        return self._last_error

    @property
    def last_failure(self) -> BaseException | None:
        """The exception of the last LIST/WATCH failure; cleared by the next success."""
        return self._last_failure

    @property
    def stall_timeout(self) -> float | None:
        """How long a watch may stay silent (no event, no bookmark) before it is restarted."""
        return self._stall_timeout

    def last_event_age(self) -> float | None:
        """Seconds since the last LIST, event or bookmark; None before the first LIST."""
        if self._last_activity is None:
            return None
        return max(0.0, self._clock() - self._last_activity)

    def stale_reason(self) -> str | None:
        """Why the cache cannot be trusted to follow the cluster now, or None.

        Stale means: not synced yet, the loop has died, or nothing (LIST, event, bookmark) has
        arrived for longer than the stall timeout while a watch should have been open.
        """
        if self._failure is not None:
            return f"failed: {self._failure!r}"
        if not self._synced:
            return f"not synced ({self._last_error or 'waiting'})"
        age = self.last_event_age()
        if self._stall_timeout is not None and age is not None and age > self._stall_timeout:
            detail = f"; {self._last_error}" if self._last_error else ""
            return f"no event or bookmark for {age:.0f}s{detail}"
        return None

    def _restarted(self, reason: str) -> None:
        self.restarts[reason] = self.restarts.get(reason, 0) + 1

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def __len__(self) -> int:
        return self._count

    def get(self, namespace: str, name: str) -> T | None:
        return self._store.get(namespace, {}).get(name)

    def items(self, namespace: str | None = None) -> list[tuple[ObjectKey, T]]:
        """A snapshot of (key, projection) pairs, of one namespace or of all ("" = cluster)."""
        if namespace is not None:
            return [(ObjectKey(namespace, n), v) for n, v in self._store.get(namespace, {}).items()]
        return [(ObjectKey(ns, n), v) for ns, objs in self._store.items() for n, v in objs.items()]

    def values(self, namespace: str | None = None) -> list[T]:
        if namespace is not None:
            return list(self._store.get(namespace, {}).values())
        return [v for objs in self._store.values() for v in objs.values()]

    def subscribe(self, callback: Callable[[InformerEvent[T]], None], *,
                  replay: bool = True) -> Callable[[], None]:
        """Call `callback` on every change; with `replay`, first with ADDED for what is cached.

        Callbacks run synchronously inside the watch loop: they should only enqueue work. An
        exception in one is logged and does not stop the cache. Returns an unsubscribe function.
        """
        self._listeners.append(callback)
        if replay:
            for key, value in self.items():
                self._call(callback, InformerEvent("ADDED", key, None, value))

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(callback)

        return unsubscribe

    # A bounded wait is this method's contract, so it takes the bound itself.
    async def wait_synced(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait up to `timeout` seconds for the first LIST; False on timeout.

        Raises InformerFailed if the background task has died or the informer was stopped.
        """
        self._raise_if_dead()
        if self._synced:
            return True
        try:
            async with asyncio.timeout(timeout):
                await self._settled.wait()
        except TimeoutError:
            return self._synced
        self._raise_if_dead()
        return self._synced

    def _raise_if_dead(self) -> None:
        if self._failure is not None:
            message = f"informer {self.name} failed: {self._failure!r}"
            raise InformerFailed(message) from self._failure
        if self._stopped:
            raise InformerFailed(f"informer {self.name} is stopped")

    # -- lifecycle -----------------------------------------------------------------------

    def start(self, *, on_failure: Callable[[BaseException], None] | None = None) -> None:
        """Run the list+watch loop as a guarded background task (idempotent while running)."""
        if self._stopped:
            raise InformerFailed(f"informer {self.name} is stopped")
        if self._task is not None:
            return

        def failed(exc: BaseException) -> None:
            self._failure = exc
            self._settled.set()
            if on_failure is not None:
                on_failure(exc)

        self._task = start_guarded_task(self.run(), name=f"informer {self.name}", on_failure=failed)

    async def stop(self) -> None:
        """Cancel the loop and wait for it; the cache keeps its last contents."""
        self._stopped = True
        self._settled.set()
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> Informer[T]:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def run(self) -> NoReturn:
        """The loop: a few lines around `step`."""
        while True:
            await self.step()

    async def step(self) -> None:
        """One LIST (when there is no resourceVersion) or one WATCH connection, errors handled.

        410 clears the resourceVersion so the next step re-lists; 429, 5xx, other statuses and
        transport errors wait a jittered, capped backoff (at least Retry-After) and the next step
        resumes from the same resourceVersion. Anything else is a bug and propagates.
        """
        try:
            if self._resource_version is None:
                await self.list_once()
                self._succeeded()
                return
            result = await self.watch_once()
        except Gone as exc:
            logger.info("informer %s: resourceVersion expired (%s); re-listing", self.name, exc)
            self._restarted("gone")
            had_version = self._resource_version is not None
            self._resource_version = None
            if not had_version:  # the LIST itself expired (a stale continue token): do not spin
                await self._fail(exc, retry_after=exc.retry_after)
            return
        except KubeError as exc:
            if self._resource_version is not None:
                self._restarted("error")
            await self._fail(exc, retry_after=exc.retry_after)
            return
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            if self._resource_version is not None:
                self._restarted("error")
            await self._fail(exc, retry_after=None)
            return
        self._restarted(result.end.value)
        if result.end is WatchEnd.STALLED:
            # Events may be stuck behind the stall: LIST, which needs no watch, to catch up.
            self._resource_version = None
        if result.events == 0 and result.bookmarks == 0 and result.seconds < _SHORT_WATCH_SECONDS:
            await self._fail(UnexpectedResponse("the watch ended at once without events"),
                             retry_after=None)
            return
        self._succeeded()

    def _succeeded(self) -> None:
        self._failures = 0
        self._last_error = None
        self._last_failure = None

    async def _fail(self, exc: BaseException, *, retry_after: float | None) -> None:
        self._failures += 1
        self._last_failure = exc
        self._last_error = (exc.describe() if isinstance(exc, KubeError)
                            else str(exc) or type(exc).__name__)
        delay = self._backoff.delay(self._failures, jitter=self._jitter(), retry_after=retry_after)
        phase = "list" if self._resource_version is None else "watch"
        logger.warning("informer %s: %s failed (%s); retrying in %.1fs", self.name, phase,
                       self._last_error, delay)
        await self._sleep(delay)

    # -- one LIST ------------------------------------------------------------------------

    async def list_once(self) -> None:
        """LIST every page, replace the cache, fire the differences, and keep the list's RV."""
        fresh: dict[str, dict[str, T]] = {}
        token: str | None = None
        timeout = aiohttp.ClientTimeout(sock_connect=self._connect_timeout,
                                        sock_read=self._list_read_timeout)
        self.lists += 1
        while True:
            page = await self._read_json(RequestOptions(
                watch=False, request_timeout=timeout, label_selector=self._label_selector,
                field_selector=self._field_selector, limit=self._page_size or None,
                continue_token=token))
            items = page.get("items") or []
            if not isinstance(items, list):
                raise UnexpectedResponse("a list whose items is not an array")
            for item in items:
                if not isinstance(item, Mapping):
                    raise UnexpectedResponse("a list item that is not an object")
                key = object_key(item)
                fresh.setdefault(key.namespace, {})[key.name] = self._project(item)
            metadata = page.get("metadata") or {}
            if not isinstance(metadata, Mapping):
                raise UnexpectedResponse("a list whose metadata is not an object")
            token = metadata.get("continue") or None
            if token is None:
                version = metadata.get("resourceVersion")
                break
        if not isinstance(version, str) or not version:
            raise UnexpectedResponse("a list without metadata.resourceVersion")
        self._replace(fresh)
        self._resource_version = version
        self._last_activity = self._clock()
        logger.info("informer %s: listed %d objects at resourceVersion %s", self.name,
                    self._count, version)
        if not self._synced:
            self._synced = True
            self._settled.set()

    async def _read_json(self, options: RequestOptions) -> Mapping[str, Any]:
        async with self._source.open(options) as response:
            await _raise_for_status(response)
            body = await response.read()
        try:
            parsed = json.loads(body)
        except ValueError:
            raise UnexpectedResponse("a list response that is not JSON") from None
        if not isinstance(parsed, Mapping):
            raise UnexpectedResponse("a list response that is not an object")
        return cast(Mapping[str, Any], parsed)

    def _replace(self, fresh: dict[str, dict[str, T]]) -> None:
        old, self._store = self._store, fresh
        self._count = sum(len(objs) for objs in fresh.values())
        if not self._listeners:
            return
        for ns, objs in fresh.items():
            before = old.get(ns, {})
            for name, value in objs.items():
                if name not in before:
                    self._emit(InformerEvent("ADDED", ObjectKey(ns, name), None, value))
                elif before[name] != value:
                    self._emit(InformerEvent("MODIFIED", ObjectKey(ns, name), before[name], value))
        for ns, objs in old.items():
            after = fresh.get(ns, {})
            for name, value in objs.items():
                if name not in after:
                    self._emit(InformerEvent("DELETED", ObjectKey(ns, name), value, None))

    # -- one WATCH -----------------------------------------------------------------------

    async def watch_once(self) -> WatchResult:
        """One WATCH connection from the current RV, applied to the cache until it ends.

        Returns how it ended normally; raises a KubeError (Gone for 410, whether sent as HTTP or
        as an ERROR event; UnexpectedResponse for what the API never sends), or a transport
        error.
        """
        if self._resource_version is None:
            raise RuntimeError(f"informer {self.name}: watch_once needs a LIST first")
        # Spread reconnects of many informers, as client-go does (timeout in [t, 2t)).
        server_timeout = int(self._watch_timeout_seconds * (1 + self._jitter()))
        options = RequestOptions(
            watch=True, label_selector=self._label_selector, field_selector=self._field_selector,
            resource_version=self._resource_version, timeout_seconds=server_timeout,
            request_timeout=aiohttp.ClientTimeout(sock_connect=self._connect_timeout,
                                                  sock_read=server_timeout + self._read_grace))
        started = self._clock()
        self.watches += 1
        events = bookmarks = 0
        end: WatchEnd | None = None
        limits = [t for t in (self._inactivity_timeout, self._stall_timeout) if t is not None]
        read_limit = min(limits) if limits else None
        stalls = (self._stall_timeout is not None
                  and (self._inactivity_timeout is None
                       or self._stall_timeout <= self._inactivity_timeout))
        async with self._source.open(options) as response:
            await _raise_for_status(response)
            try:
                while end is None:
                    try:
                        async with asyncio.timeout(read_limit):
                            line = await response.content.readline()
                    except TimeoutError:  # ours, or aiohttp's sock_read: either way, reconnect
                        end = WatchEnd.STALLED if stalls else WatchEnd.INACTIVE
                        logger.warning("informer %s: watch sent neither an event nor a bookmark "
                                       "for %.0fs; resuming from %s", self.name,
                                       read_limit or 0.0, self._resource_version)
                        break
                    if not line:
                        end = WatchEnd.CLOSED
                        # A clean end at timeoutSeconds shows the server is serving this watch,
                        # even when it was too short for a bookmark.
                        self._last_activity = self._clock()
                        break
                    if not line.strip():
                        continue
                    applied = self._apply_line(line)
                    self._last_activity = self._clock()
                    if applied:
                        events += 1
                    else:
                        bookmarks += 1
            finally:
                if end is not WatchEnd.CLOSED:
                    response.close()  # a half-read or silent stream must not go back to the pool
        return WatchResult(end=end, events=events, bookmarks=bookmarks,
                           seconds=self._clock() - started)

    def _apply_line(self, line: bytes) -> bool:
        """Apply one watch line; True for an object event, False for a bookmark or unknown type."""
        try:
            event = json.loads(line)
        except ValueError:
            raise UnexpectedResponse("a watch line that is not JSON") from None
        if not isinstance(event, Mapping):
            raise UnexpectedResponse("a watch line that is not an object")
        kind = event.get("type")
        obj = event.get("object")
        if kind is None and (event.get("kind") == "Status" or "code" in event):
            raise error_from_status(event)  # a bare Status line instead of an event
        if kind == "ERROR":
            raise error_from_status(obj)
        if not isinstance(obj, Mapping):
            raise UnexpectedResponse("a watch event without an object")
        metadata = obj.get("metadata")
        version = metadata.get("resourceVersion") if isinstance(metadata, Mapping) else None
        if kind == "BOOKMARK":
            if isinstance(version, str) and version:
                self._resource_version = version
            return False
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            logger.warning("informer %s: ignoring a watch event of type %r", self.name, kind)
            return False
        key = object_key(obj)
        bucket = self._store.get(key.namespace)
        known = bucket is not None and key.name in bucket
        if kind == "DELETED":
            if bucket is not None and known:
                previous = bucket.pop(key.name)
                self._count -= 1
                if not bucket:
                    del self._store[key.namespace]
                self._emit(InformerEvent("DELETED", key, previous, None))
        else:
            value = self._project(obj)
            if bucket is None:
                bucket = self._store[key.namespace] = {}
            before = bucket.get(key.name)
            bucket[key.name] = value
            if not known:
                self._count += 1
                self._emit(InformerEvent("ADDED", key, None, value))
            elif before != value:
                # An ADDED for a key we hold (a replay) is a modification, or nothing at all.
                self._emit(InformerEvent("MODIFIED", key, before, value))
        if isinstance(version, str) and version:
            self._resource_version = version
        return True

    def _emit(self, event: InformerEvent[T]) -> None:
        for callback in list(self._listeners):
            self._call(callback, event)

    def _call(self, callback: Callable[[InformerEvent[T]], None], event: InformerEvent[T]) -> None:
        try:
            callback(event)
        except Exception:
            logger.exception("informer %s: a listener failed on %s %s", self.name, event.kind,
                             event.key)


class InformerCollector(Collector):
    """Per-cache freshness series, read from the informers at scrape time."""

    def __init__(self, informers: Callable[[], Iterable[Informer[Any]]]) -> None:
        self._informers = informers

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        age = GaugeMetricFamily(
            "metricscale_cache_last_event_age_seconds",
            "Seconds since a cache last received a LIST, watch event or bookmark.",
            labels=["cache"])
        synced = GaugeMetricFamily(
            "metricscale_cache_synced", "1 once a cache has listed its collection.",
            labels=["cache"])
        stale = GaugeMetricFamily(
            "metricscale_cache_stale",
            "1 while a cache has heard nothing for longer than its stall timeout.",
            labels=["cache"])
        restarts = CounterMetricFamily(
            "metricscale_cache_watch_restarts",
            "Watch restarts, by reason (closed, stalled, inactive, error, gone).",
            labels=["cache", "reason"])
        for informer in self._informers():
            value = informer.last_event_age()
            if value is not None:
                age.add_metric([informer.name], value)
            synced.add_metric([informer.name], 1.0 if informer.has_synced else 0.0)
            stale.add_metric([informer.name], 1.0 if informer.stale_reason() else 0.0)
            for reason, count in sorted(informer.restarts.items()):
                restarts.add_metric([informer.name, reason], float(count))
        yield from (age, synced, stale, restarts)


async def _raise_for_status(response: aiohttp.ClientResponse) -> None:
    """Raise the KubeError of a response that is not a success (its body read for the Status)."""
    if 200 <= response.status < 300:
        return
    try:
        body = await response.read()
    except (aiohttp.ClientError, TimeoutError):
        body = b""
    raise error_from_response(response.status, headers=response.headers, body=body,
                              verb=response.method)
