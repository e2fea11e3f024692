"""The adapter's only Kubernetes I/O: API client, resource discovery, object caches, auth config.

Everything the request path needs is served from memory: the resource catalog (refreshed
periodically, and on demand, rate-limited, when an unknown resource is asked for), and one
metadata-only informer per group-resource (started on first use) for label selection. No
request ever causes a LIST.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias, cast

import aiohttp
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CollectorRegistry, Gauge

from adapter.rules.resources import GroupResource, ResourceCatalog, ResourceInfo, builtin_catalog
from metricscale.core.selectors import Selector
from metricscale.kube.informer import (
    Informer,
    InformerFailed,
    ObjectMeta,
    PathSource,
    collection_path,
    project_metadata,
    start_guarded_task,
)

__all__ = [
    "AUTHENTICATION_CONFIGMAP",
    "AUTHENTICATION_NAMESPACE",
    "DiscoveredResources",
    "Discovery",
    "KubeCacheFailed",
    "KubeClient",
    "KubeConfigError",
    "KubeError",
    "KubeUnavailable",
    "ObjectCaches",
    "RawAnswer",
    "ResourceNotListable",
    "UnknownResource",
    "authentication_config_informer",
    "connect",
    "parse_aggregated_discovery",
    "post_json",
    "resolve_kubeconfig",
]

logger = logging.getLogger(__name__)

AUTHENTICATION_NAMESPACE = "kube-system"
AUTHENTICATION_CONFIGMAP = "extension-apiserver-authentication"

# kubectl's Accept for /api and /apis: aggregated discovery (v2, then v2beta1), else legacy.
_AGGREGATED_ACCEPT = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,"
    "application/json")
_DISCOVERY_CONCURRENCY = 8

# The client the rest of the adapter holds (and passes back in) without importing the library.
KubeClient: TypeAlias = ApiClient


# ---------------------------------------------------------------------------------------------
# Errors (the server maps each class once)


class KubeError(Exception):
    """Base. Messages are safe to show: they name resources, never credentials."""


class KubeConfigError(KubeError):
    """No usable Kubernetes connection settings (bad kubeconfig, not in a cluster)."""


class KubeUnavailable(KubeError):
    """The Kubernetes API cannot answer now (discovery failed, a cache is not synced): 503."""


class KubeCacheFailed(KubeError):
    """An object cache's background task died: a bug, logged when it happened: 500."""


class UnknownResource(KubeError):
    """The cluster serves no such resource (after a refresh of discovery): 404."""


class ResourceNotListable(KubeError):
    """The resource exists but cannot be listed and watched, so objects cannot be selected."""


# ---------------------------------------------------------------------------------------------
# Connection


def resolve_kubeconfig(kubeconfig: str | None, lister_kubeconfig: str | None) -> str | None:
    """`--kubeconfig`, or prometheus-adapter's `--lister-kubeconfig` meaning the same."""
    if kubeconfig and lister_kubeconfig and kubeconfig != lister_kubeconfig:
        raise KubeConfigError("--kubeconfig and --lister-kubeconfig name different files; "
                              "give one of them")
    return kubeconfig or lister_kubeconfig or None


@contextlib.asynccontextmanager
async def connect(*, kubeconfig: str | None, context: str | None = None,
                  on_failure: Callable[[BaseException], None] | None = None,
                  ) -> AsyncIterator[ApiClient]:
    """An ApiClient from a kubeconfig file, else the in-cluster service account; closed on exit.

    Always an explicit Configuration (never the library's global default). In-cluster tokens
    are re-read by the library's own hook; exec/gcp kubeconfig credentials are refreshed by a
    guarded background task.
    """
    configuration = Configuration()
    loader: Any = None
    try:
        if kubeconfig:
            loader = await kube_config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration,
                persist_config=False)
        else:
            kube_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration)
    except (ConfigException, OSError, ValueError) as exc:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
        raise KubeConfigError(f"cannot use {where}: {exc}") from None
    refresher: asyncio.Task[Any] | None = None
    api = ApiClient(configuration=configuration)
    try:
        if loader is not None and (getattr(loader, "provider", None) == "gcp"
                                   or "exec" in (getattr(loader, "_user", None) or {})):
            refresher = start_guarded_task(
                kube_config.refresh_token(loader, client_configuration=configuration),
                name="kubeconfig token refresh", on_failure=on_failure)
        yield api
    finally:
        if refresher is not None:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
        await api.close()


async def _get_json(api: ApiClient, path: str, *, accept: str = "application/json",
                    request_timeout: float = 30.0) -> Mapping[str, Any]:
    """GET a JSON document; errors become KubeUnavailable (or UnknownResource for 404)."""
    try:
        data = await api.call_api(
            path, "GET", header_params={"Accept": accept}, response_types_map={200: "object"},
            auth_settings=["BearerToken"], _return_http_data_only=True,
            _request_timeout=aiohttp.ClientTimeout(total=request_timeout))
    except ApiException as exc:
        if exc.status == 404:
            raise UnknownResource(f"{path} is not served") from None
        raise KubeUnavailable(f"the Kubernetes API answered {exc.status} for {path}") from None
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        raise KubeUnavailable(
            f"the Kubernetes API cannot be reached ({type(exc).__name__})") from None
    if not isinstance(data, Mapping):
        raise KubeUnavailable(f"the Kubernetes API sent a non-object for {path}")
    return cast(Mapping[str, Any], data)


@dataclass(frozen=True)
class RawAnswer:
    """An API server's answer to a POST, whatever its status, read whole."""

    status: int
    headers: Mapping[str, str]  # case-insensitive (Retry-After)
    body: bytes  # may hold a secret (a TokenReview answer holds the token): never log it


async def post_json(api: KubeClient, path: str, *, body: Mapping[str, Any],
                    request_timeout: float) -> RawAnswer:
    """POST a JSON object and return the raw answer; KubeUnavailable when none arrives.

    The body is read here rather than by the client library, whose debug log would print it.
    Statuses are the caller's to judge: review retries read 429, 5xx and Retry-After.
    """
    try:
        response = await api.call_api(
            path, "POST", body=dict(body),
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            auth_settings=["BearerToken"], _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(total=request_timeout))
        if not isinstance(response, aiohttp.ClientResponse):
            raise KubeError("the client returned no raw response")
        try:
            answer = RawAnswer(status=response.status,
                               headers=CIMultiDictProxy(CIMultiDict(response.headers)),
                               body=await response.read())
        finally:
            response.release()
    except (aiohttp.ClientError, TimeoutError, OSError) as error:
        # The exception text may name the URL, never the body: safe to show.
        raise KubeUnavailable(f"{type(error).__name__}: {error}") from None
    return answer


# ---------------------------------------------------------------------------------------------
# Discovery


@dataclass(frozen=True)
class DiscoveredResources:
    """One discovery pass: the catalog, plus which group-resources can be listed and watched."""

    catalog: ResourceCatalog
    listable: frozenset[GroupResource]

    @classmethod
    def from_resource_lists(cls, documents: Iterable[Mapping[str, Any]]) -> DiscoveredResources:
        documents = list(documents)
        listable: set[GroupResource] = set()
        for document in documents:
            group = str(document.get("groupVersion", "")).rpartition("/")[0]
            for resource in document.get("resources") or ():
                name = str(resource.get("name", ""))
                verbs = resource.get("verbs") or ()
                if name and "/" not in name and "list" in verbs and "watch" in verbs:
                    listable.add(GroupResource(name, group))
        return cls(ResourceCatalog.from_discovery(documents), frozenset(listable))


def _preferred_first(group: Mapping[str, Any]) -> list[str]:
    versions = [str(v.get("groupVersion", "")) for v in group.get("versions") or ()
                if isinstance(v, Mapping)]
    preferred = group.get("preferredVersion")
    first = str(preferred.get("groupVersion", "")) if isinstance(preferred, Mapping) else ""
    if first in versions:
        versions.remove(first)
        versions.insert(0, first)
    return [v for v in versions if v]


def parse_aggregated_discovery(documents: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`APIGroupDiscoveryList` documents (v2/v2beta1) as legacy `APIResourceList` dicts.

    Versions come in the server's preference order (first is preferred); subresources and
    resources without a kind are left out, as in legacy discovery. A version marked `Stale`
    (its aggregated server did not answer the aggregator) is left out too, as client-go does.
    """
    return [document for _, document in _aggregated_versions(documents) if document is not None]


def _aggregated_versions(documents: Iterable[Mapping[str, Any]],
                         ) -> list[tuple[str, dict[str, Any] | None]]:
    """(group version, its APIResourceList, or None when the aggregator marks it Stale)."""
    out: list[tuple[str, dict[str, Any] | None]] = []
    for document in documents:
        for group in document.get("items") or ():
            group_name = str((group.get("metadata") or {}).get("name", ""))
            for version in group.get("versions") or ():
                version_name = str(version.get("version", ""))
                group_version = f"{group_name}/{version_name}" if group_name else version_name
                if version.get("freshness") == "Stale":
                    out.append((group_version, None))
                    continue
                resources = []
                for resource in version.get("resources") or ():
                    kind = (resource.get("responseKind") or {}).get("kind", "")
                    resources.append({
                        "name": resource.get("resource", ""),
                        "singularName": resource.get("singularResource", ""),
                        "kind": kind,
                        "namespaced": resource.get("scope") == "Namespaced",
                        "verbs": list(resource.get("verbs") or ()),
                    })
                out.append((group_version,
                            {"groupVersion": group_version, "resources": resources}))
    return out


# The core group: a pass that cannot read it (nor keep it from the last pass) fails whole.
_CORE_GROUP_VERSION = "v1"


class Discovery:
    """The cluster's resources as an immutable value, swapped atomically on each refresh.

    Until the first successful pass the built-in catalog answers. A failed pass keeps the last
    good value. On-demand refreshes (an unknown resource was asked for) are rate-limited to one
    per `min_refresh_interval` seconds and shared by concurrent callers.

    One group version that fails (a 503 from an unavailable APIService, a timeout, a version
    aggregated discovery marks `Stale`) does not fail the pass: as client-go's partial
    `ErrGroupDiscoveryFailed`, the rest is used. Its resources are kept from the last good pass
    if that pass had them (a flapping APIService does not drop them for an interval), else it
    is left out until a pass reads it. The failed versions are logged and exported as
    `metricscale_kube_discovery_failed_group_versions`. Only the core `v1` is required.
    """

    def __init__(self, api: ApiClient, *, refresh_interval: float = 600.0,
                 min_refresh_interval: float = 30.0, request_timeout: float = 30.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 registry: CollectorRegistry | None = None) -> None:
        self._api = api
        self._refresh_interval = refresh_interval
        self._min_refresh_interval = min_refresh_interval
        self._request_timeout = request_timeout
        self._clock = clock
        self._sleep = sleep
        builtin = builtin_catalog()
        self._current = DiscoveredResources(
            builtin, frozenset(info.group_resource for info in builtin.entries))
        self._discovered = False
        self._last_attempt: float | None = None
        self._last_success: float | None = None
        self._refreshing: asyncio.Task[DiscoveredResources] | None = None
        self._task: asyncio.Task[Any] | None = None
        self.passes = 0
        self.failed_group_versions: tuple[str, ...] = ()  # of the last pass that succeeded
        self._documents: dict[str, Mapping[str, Any]] = {}  # last good, by group version
        self._gauges: tuple[Gauge, Gauge] | None = None
        self._failed_gauge: Gauge | None = None
        if registry is not None:
            self._gauges = (
                Gauge("metricscale_kube_discovery_resources",
                      "Resources in the last good discovery of the cluster.", registry=registry),
                Gauge("metricscale_kube_discovery_last_success_timestamp_seconds",
                      "When the cluster's resources were last discovered (Unix time).",
                      registry=registry))
            self._failed_gauge = Gauge(
                "metricscale_kube_discovery_failed_group_versions",
                "Group versions the last discovery pass could not read (1 each); their "
                "resources are kept from an earlier pass when one had them.",
                ["group_version"], registry=registry)

    @property
    def resources(self) -> DiscoveredResources:
        return self._current

    @property
    def catalog(self) -> ResourceCatalog:
        return self._current.catalog

    @property
    def discovered(self) -> bool:
        """True once a pass against the cluster succeeded (else the built-in catalog answers)."""
        return self._discovered

    def age(self) -> float | None:
        """Seconds since the last successful pass (by the injected clock), or None."""
        return None if self._last_success is None else self._clock() - self._last_success

    async def refresh(self) -> DiscoveredResources:
        """One discovery pass now (shared with a pass already running). Raises KubeUnavailable."""
        task = self._refreshing
        if task is None or task.done():
            task = self._refreshing = asyncio.create_task(self._refresh(), name="kube discovery")
            task.add_done_callback(self._refreshed)
        # shield: a request that gives up must not abort the pass others wait for.
        return await asyncio.shield(task)

    def _refreshed(self, task: asyncio.Task[DiscoveredResources]) -> None:
        if self._refreshing is task:
            self._refreshing = None
        if not task.cancelled():
            task.exception()  # retrieved: a pass nobody awaited any more is not a lost error

    async def _refresh(self) -> DiscoveredResources:
        self._last_attempt = self._clock()
        self.passes += 1
        fetched = await self._fetch()
        documents: dict[str, Mapping[str, Any]] = {}  # in preference order
        failed: list[str] = []
        for group_version, document in fetched:
            if document is None:
                failed.append(group_version)
                document = self._documents.get(group_version)
            if document is not None:
                documents.setdefault(group_version, document)
        if failed and _CORE_GROUP_VERSION in failed and _CORE_GROUP_VERSION not in documents:
            raise KubeUnavailable("the core group version v1 could not be discovered")
        fresh = DiscoveredResources.from_resource_lists(documents.values())
        if not fresh.catalog.entries:
            raise KubeUnavailable("the cluster's discovery listed no resources")
        self._report_failures(failed, kept=[gv for gv in failed if gv in documents])
        self._documents = documents
        self._current = fresh
        self._discovered = True
        self._last_success = self._clock()
        if self._gauges is not None:
            self._gauges[0].set(len(fresh.catalog))
            self._gauges[1].set_to_current_time()
        logger.info("discovered %d resources (%d listable)", len(fresh.catalog),
                    len(fresh.listable))
        return fresh

    def _report_failures(self, failed: list[str], *, kept: list[str]) -> None:
        self.failed_group_versions = tuple(failed)
        if self._failed_gauge is not None:
            self._failed_gauge.clear()
            for group_version in failed:
                self._failed_gauge.labels(group_version).set(1)
        if failed:
            logger.warning("discovery could not read %d group versions (%s); the rest is used%s",
                           len(failed), ", ".join(failed),
                           f", and {', '.join(kept)} kept from the last pass" if kept else "")

    async def _fetch(self) -> list[tuple[str, Mapping[str, Any] | None]]:
        """(group version, its APIResourceList or None when it could not be read), in
        preference order; group versions that are gone (404) are left out."""
        timeout = self._request_timeout
        core = await _get_json(self._api, "/api", accept=_AGGREGATED_ACCEPT,
                                request_timeout=timeout)
        groups = await _get_json(self._api, "/apis", accept=_AGGREGATED_ACCEPT,
                                request_timeout=timeout)
        aggregated = [d.get("kind") == "APIGroupDiscoveryList" for d in (core, groups)]
        if all(aggregated):
            return list(_aggregated_versions([core, groups]))
        if any(aggregated):  # a proxy that mixes the two: ask both in the legacy form
            core = await _get_json(self._api, "/api", request_timeout=timeout)
            groups = await _get_json(self._api, "/apis", request_timeout=timeout)
        group_versions = [v for v in core.get("versions") or () if isinstance(v, str)]
        for group in groups.get("groups") or ():
            if isinstance(group, Mapping):
                group_versions += _preferred_first(group)
        limit = asyncio.Semaphore(_DISCOVERY_CONCURRENCY)

        async def one(group_version: str) -> tuple[str, Mapping[str, Any] | None] | None:
            path = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
            async with limit:
                try:
                    return group_version, await _get_json(self._api, path,
                                                          request_timeout=timeout)
                except UnknownResource:  # a group version that went away mid-pass
                    return None
                except KubeUnavailable as error:
                    logger.debug("discovery of %s failed: %s", group_version, error)
                    return group_version, None

        fetched = await asyncio.gather(*(one(gv) for gv in group_versions))
        return [entry for entry in fetched if entry is not None]

    async def find(self, requested: GroupResource) -> ResourceInfo:
        """The catalog entry for `pods`, `Pod`, `deployments.apps`...; refreshes (rate-limited)
        when unknown. Raises UnknownResource."""
        info = self.catalog.find(requested)
        if info is not None:
            return info
        now = self._clock()
        if self._last_attempt is None or now - self._last_attempt >= self._min_refresh_interval:
            try:
                await self.refresh()
            except KubeError as exc:
                logger.warning("discovery for an unknown resource failed: %s", exc)
            info = self.catalog.find(requested)
            if info is not None:
                return info
        raise UnknownResource(f"the server doesn't have a resource type {str(requested)!r}")

    async def run(self) -> None:
        """Refresh every `refresh_interval` after the last attempt (at once if there was none);
        a failure is logged and the last value kept."""
        while True:
            if self._last_attempt is not None:
                wait = self._refresh_interval - (self._clock() - self._last_attempt)
                if wait > 0:
                    await self._sleep(wait)
            try:
                await self.refresh()
            except KubeError as exc:
                logger.warning("discovery of the cluster's resources failed: %s", exc)

    def start(self, *, on_failure: Callable[[BaseException], None] | None = None) -> None:
        if self._task is None:
            self._task = start_guarded_task(self.run(), name="kube discovery loop",
                                            on_failure=on_failure)

    async def stop(self) -> None:
        tasks = [t for t in (self._task, self._refreshing) if t is not None]
        self._task = self._refreshing = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


# ---------------------------------------------------------------------------------------------
# Object caches


# How many (namespace, selector) answers one object cache keeps between changes.
_SELECTIONS_KEPT = 256


@dataclass
class _Cache:
    informer: Informer[ObjectMeta]
    info: ResourceInfo
    # Answers by (namespace bucket, selector), all dropped on any change to the cache: an HPA
    # asks the same question every sync, and the objects seldom change in between.
    selections: dict[tuple[str, Selector], list[str]] = field(default_factory=dict)


@dataclass
class ObjectCaches:
    """Per group-resource metadata-only informers, started lazily; selection from memory.

    `informer_options` go to every Informer (timeouts, backoff, clock; tests shorten them).
    """

    api: ApiClient
    discovery: Discovery
    sync_timeout: float = 10.0
    on_failure: Callable[[BaseException], None] | None = None
    informer_options: Mapping[str, Any] = field(default_factory=dict)
    _caches: dict[GroupResource, _Cache] = field(default_factory=dict, init=False)
    _closed: bool = field(default=False, init=False)

    async def select(self, group_resource: GroupResource, *, namespace: str | None,
                     selector: Selector) -> list[str]:
        """Names of the objects in `namespace` (None for cluster-scoped resources) whose labels
        `selector` matches, sorted (a new list: the caller may keep or change it).

        Raises UnknownResource, ResourceNotListable, KubeUnavailable (not synced in
        `sync_timeout`), KubeCacheFailed.
        """
        cache = await self._cache_for(group_resource)
        if cache.info.namespaced and not namespace:
            raise ValueError(f"{cache.info.group_resource} is namespaced: give a namespace")
        bucket = (namespace or "") if cache.info.namespaced else ""
        key = (bucket, selector)
        names = cache.selections.get(key)
        if names is None:
            matches = selector.matches
            names = sorted(meta.name for meta in cache.informer.values(bucket)
                           if matches(meta.labels))
            if len(cache.selections) >= _SELECTIONS_KEPT:
                cache.selections.clear()
            cache.selections[key] = names
        return list(names)

    async def labels(self, group_resource: GroupResource, *, namespace: str | None,
                     name: str) -> Mapping[str, str] | None:
        """One object's labels from the cache, or None when it does not exist."""
        cache = await self._cache_for(group_resource)
        bucket = (namespace or "") if cache.info.namespaced else ""
        meta = cache.informer.get(bucket, name)
        return None if meta is None else meta.labels

    def informer(self, group_resource: GroupResource) -> Informer[ObjectMeta] | None:
        """The running informer of a normalised group-resource (diagnostics, tests)."""
        cache = self._caches.get(group_resource)
        return None if cache is None else cache.informer

    async def _cache_for(self, requested: GroupResource) -> _Cache:
        if self._closed:
            raise KubeCacheFailed("the object caches are closed")
        info = await self.discovery.find(requested)
        key = info.group_resource
        cache = self._caches.get(key)
        if cache is None:
            if key not in self.discovery.resources.listable:
                raise ResourceNotListable(f"{key} cannot be listed and watched, so its objects "
                                          "cannot be selected")
            path = collection_path(group=info.group, version=info.version, plural=info.resource)
            informer = Informer(PathSource(self.api, path, metadata_only=True),
                                project=project_metadata, name=str(key),
                                **dict(self.informer_options))
            cache = self._caches[key] = _Cache(informer, info)
            informer.subscribe(lambda event: cache.selections.clear(), replay=False)
            informer.start(on_failure=self.on_failure)
            logger.info("started the object cache of %s", key)
        try:
            synced = await cache.informer.wait_synced(self.sync_timeout)
        except InformerFailed:
            raise KubeCacheFailed(f"the object cache of {key} failed") from None
        if not synced:
            why = cache.informer.last_error or "no answer yet"
            if why.startswith("403"):
                raise KubeUnavailable(f"the adapter is not allowed to list and watch {key}")
            raise KubeUnavailable(f"the object cache of {key} is not filled yet ({why})")
        return cache

    async def close(self) -> None:
        self._closed = True
        caches, self._caches = list(self._caches.values()), {}
        for cache in caches:
            await cache.informer.stop()


# ---------------------------------------------------------------------------------------------
# The authentication ConfigMap


def _configmap_data(obj: Mapping[str, Any]) -> Mapping[str, str]:
    data = obj.get("data") or {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, Mapping) else {}


def authentication_config_informer(
        api: ApiClient, *, on_change: Callable[[Mapping[str, str] | None], None],
        **informer_options: Any) -> Informer[Mapping[str, str]]:
    """An informer (not started) on kube-system/extension-apiserver-authentication's data.

    `on_change` gets the ConfigMap's `data` on every change, and None when it is deleted. The
    field selector keeps the request inside the resourceNames-restricted Role that ships for it.
    """
    informer: Informer[Mapping[str, str]] = Informer(
        PathSource(api, collection_path(group="", version="v1", plural="configmaps",
                                        namespace=AUTHENTICATION_NAMESPACE)),
        project=_configmap_data, name=f"{AUTHENTICATION_NAMESPACE}/{AUTHENTICATION_CONFIGMAP}",
        field_selector=f"metadata.name={AUTHENTICATION_CONFIGMAP}", **informer_options)
    informer.subscribe(lambda event: on_change(event.new))
    return informer
