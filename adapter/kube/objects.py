"""The adapter's object caches: informers for label selection, and the ConfigMap.

One informer per group-resource (started on first use) answers which objects a label selector
picks, from memory: no request ever causes a LIST. They watch metadata only, except pods: the
pod cache watches whole pods and keeps each one's labels, phase and node, because
`metrics.k8s.io` serves running pods only and selects them by `spec.nodeName`; one pod watch
serves both the custom and the resource metrics. The authentication ConfigMap of kube-system is
followed by an informer of its own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Unpack

from adapter.kube.catalog import ClusterCatalog
from adapter.rules.resources import NODES, PODS, GroupResource, ResourceInfo
from metricscale import __version__
from metricscale.core.selectors import Selector
from metricscale.kube.errors import Forbidden, KubeError, KubeUnavailable
from metricscale.kube.http import KubeHTTP
from metricscale.kube.informer import (
    Informer,
    InformerFailed,
    InformerOptions,
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
    "PodMeta",
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


@dataclass(frozen=True)
class PodMeta(ObjectMeta):
    """A pod as the caches keep it: its metadata, phase and node."""

    phase: str = ""
    node_name: str = ""
    # The labels as compact JSON, made once per change: a PodMetricsList of 1,000 pods would
    # otherwise spend most of its time encoding them again on every request.
    labels_json: str = "{}"


def project_pod(obj: Mapping[str, Any]) -> PodMeta:
    meta = project_metadata(obj)
    spec = obj.get("spec")
    status = obj.get("status")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    phase = status.get("phase") if isinstance(status, Mapping) else None
    return PodMeta(namespace=meta.namespace, name=meta.name, labels=meta.labels,
                   phase=phase if isinstance(phase, str) else "",
                   node_name=node if isinstance(node, str) else "",
                   labels_json=json.dumps(meta.labels, separators=(",", ":")))



# How many (namespace, selector) answers one object cache keeps between changes.
_SELECTIONS_KEPT = 256


@dataclass
class _Cache:
    informer: Informer[ObjectMeta]
    info: ResourceInfo
    # Answers by (namespace bucket, selector), all dropped on any change to the cache: an HPA
    # asks the same question every sync, and the objects seldom change in between.
    selections: dict[tuple[str, Selector], list[str]] = field(default_factory=dict)
    filled: bool = False  # synced once: on_filled was called


@dataclass
class ObjectCaches:
    """Per group-resource metadata-only informers, started lazily; selection from memory.

    `informer_options` go to every Informer (timeouts, backoff, clock; tests shorten them).
    """

    http: KubeHTTP
    catalog: ClusterCatalog
    sync_timeout: float = 10.0
    on_failure: Callable[[BaseException], None] | None = None
    informer_options: InformerOptions = field(default_factory=InformerOptions)
    # Called once a cache has first filled (the server moves what it holds out of the
    # collector's generations then: thousands of pods a full collection need not walk).
    on_filled: Callable[[], None] = lambda: None
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

    async def running_pods(self, namespace: str | None) -> list[PodMeta]:
        """Running pods of `namespace` (None: of every namespace), from the pod cache."""
        cache = await self._cache_for(PODS)
        return [meta for meta in cache.informer.values(namespace)
                if isinstance(meta, PodMeta) and meta.phase == "Running"]

    async def running_pod(self, namespace: str, name: str) -> PodMeta | None:
        cache = await self._cache_for(PODS)
        meta = cache.informer.get(namespace, name)
        return meta if isinstance(meta, PodMeta) and meta.phase == "Running" else None

    async def nodes(self) -> list[ObjectMeta]:
        cache = await self._cache_for(NODES)
        return cache.informer.values("")

    async def node(self, name: str) -> ObjectMeta | None:
        cache = await self._cache_for(NODES)
        return cache.informer.get("", name)

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
            whole = key == PODS
            informer: Informer[ObjectMeta] = Informer(
                PathSource(self.http, path, metadata_only=not whole),
                project=project_pod if whole else project_metadata, name=str(key),
                **self.informer_options)
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
        if not cache.filled:
            cache.filled = True
            self.on_filled()
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
        **informer_options: Unpack[InformerOptions]) -> Informer[Mapping[str, str]]:
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
