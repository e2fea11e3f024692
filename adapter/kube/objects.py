"""The adapter's object caches: metadata-only informers for label selection, and the ConfigMap.

One metadata-only informer per group-resource (started on first use) answers which objects a
label selector picks, from memory: no request ever causes a LIST. The authentication ConfigMap
of kube-system is followed by an informer of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from adapter.kube.catalog import ClusterCatalog
from adapter.rules.resources import GroupResource, ResourceInfo
from metricscale import __version__
from metricscale.core.selectors import Selector
from metricscale.kube.errors import Forbidden, KubeError, KubeUnavailable
from metricscale.kube.http import KubeHTTP
from metricscale.kube.informer import (
    Informer,
    InformerFailed,
    ObjectMeta,
    PathSource,
    collection_path,
    project_metadata,
)

__all__ = [
    "AUTHENTICATION_CONFIGMAP",
    "AUTHENTICATION_NAMESPACE",
    "USER_AGENT",
    "KubeCacheFailed",
    "ObjectCaches",
    "ResourceNotListable",
    "authentication_config_informer",
]

logger = logging.getLogger(__name__)

USER_AGENT = f"metricscale-adapter/{__version__}"
AUTHENTICATION_NAMESPACE = "kube-system"
AUTHENTICATION_CONFIGMAP = "extension-apiserver-authentication"


class KubeCacheFailed(KubeError):
    """An object cache's background task died: a bug, logged when it happened: 500."""


class ResourceNotListable(KubeError):
    """The resource exists but cannot be listed and watched, so objects cannot be selected."""


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

    http: KubeHTTP
    catalog: ClusterCatalog
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
        info = await self.catalog.find(requested)
        key = info.group_resource
        cache = self._caches.get(key)
        if cache is None:
            if key not in self.catalog.resources.listable:
                raise ResourceNotListable(f"{key} cannot be listed and watched, so its objects "
                                          "cannot be selected")
            path = collection_path(group=info.group, version=info.version, plural=info.resource)
            informer = Informer(PathSource(self.http, path, metadata_only=True),
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
            if isinstance(cache.informer.last_failure, Forbidden):
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
        http: KubeHTTP, *, on_change: Callable[[Mapping[str, str] | None], None],
        **informer_options: Any) -> Informer[Mapping[str, str]]:
    """An informer (not started) on kube-system/extension-apiserver-authentication's data.

    `on_change` gets the ConfigMap's `data` on every change, and None when it is deleted. The
    field selector keeps the request inside the resourceNames-restricted Role that ships for it.
    """
    informer: Informer[Mapping[str, str]] = Informer(
        PathSource(http, collection_path(group="", version="v1", plural="configmaps",
                                        namespace=AUTHENTICATION_NAMESPACE)),
        project=_configmap_data, name=f"{AUTHENTICATION_NAMESPACE}/{AUTHENTICATION_CONFIGMAP}",
        field_selector=f"metadata.name={AUTHENTICATION_CONFIGMAP}", **informer_options)
    informer.subscribe(lambda event: on_change(event.new))
    return informer
