"""The cluster's resource catalog: the shared discovery client's answer, as the adapter uses it.

Everything the request path needs is served from memory: the catalog (refreshed periodically,
and on demand, rate-limited, when an unknown resource is asked for) and which resources can be
listed and watched (so the object caches know what they can select). Until the first pass the
built-in catalog answers; a failed pass keeps the last good one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from adapter.rules.resources import GroupResource, ResourceCatalog, ResourceInfo, builtin_catalog
from metricscale.kube.discovery import ResourceDiscovery
from metricscale.kube.errors import KubeError, KubeUnavailable, UnknownResource
from metricscale.kube.http import KubeHTTP
from metricscale.kube.requests import KubeRequests
from metricscale.tasks import start_guarded_task

__all__ = ["ClusterCatalog", "DiscoveredResources"]

logger = logging.getLogger(__name__)


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


class ClusterCatalog:
    """The cluster's resources as an immutable value, swapped atomically on each refresh.

    Until the first successful pass the built-in catalog answers. On-demand refreshes (an
    unknown resource was asked for) are rate-limited to one per `min_refresh_interval` seconds
    and shared by concurrent callers. Group versions a pass could not read are logged by the
    discovery client and exported as `metricscale_kube_discovery_failed_group_versions`.
    """

    def __init__(self, http: KubeHTTP, *, refresh_interval: float = 600.0,
                 min_refresh_interval: float = 30.0, request_timeout: float = 30.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 registry: CollectorRegistry | None = None) -> None:
        self._discovery = ResourceDiscovery(KubeRequests(http), request_timeout=request_timeout,
                                            clock=clock)
        self._refresh_interval = refresh_interval
        self._min_refresh_interval = min_refresh_interval
        self._clock = clock
        self._sleep = sleep
        builtin = builtin_catalog()
        self._current = DiscoveredResources(
            builtin, frozenset(info.group_resource for info in builtin.entries))
        self._built = 0  # the discovery generation self._current was built from
        self._task: asyncio.Task[Any] | None = None
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
        return self._built > 0

    @property
    def passes(self) -> int:
        return self._discovery.passes

    @property
    def failed_group_versions(self) -> tuple[str, ...]:
        """Of the last pass that succeeded."""
        snapshot = self._discovery.snapshot
        return () if snapshot is None else snapshot.failed

    def age(self) -> float | None:
        """Seconds since the last successful pass (by the injected clock), or None."""
        return self._discovery.age()

    async def refresh(self) -> DiscoveredResources:
        """One discovery pass now (shared with a pass already running). Raises KubeError."""
        snapshot = await self._discovery.refresh()
        if self._built != self._discovery.generation:  # the first of the callers that shared it
            fresh = DiscoveredResources.from_resource_lists(snapshot.resource_lists)
            if not fresh.catalog.entries:
                raise KubeUnavailable("the cluster's discovery listed no resources")
            self._current, self._built = fresh, self._discovery.generation
            self._report(fresh, failed=snapshot.failed)
        return self._current

    def _report(self, fresh: DiscoveredResources, *, failed: tuple[str, ...]) -> None:
        if self._gauges is not None:
            self._gauges[0].set(len(fresh.catalog))
            self._gauges[1].set_to_current_time()
        if self._failed_gauge is not None:
            self._failed_gauge.clear()
            for group_version in failed:
                self._failed_gauge.labels(group_version).set(1)
        logger.info("discovered %d resources (%d listable)", len(fresh.catalog),
                    len(fresh.listable))

    async def find(self, requested: GroupResource) -> ResourceInfo:
        """The catalog entry for `pods`, `Pod`, `deployments.apps`...; refreshes (rate-limited)
        when unknown. Raises UnknownResource."""
        info = self.catalog.find(requested)
        if info is not None:
            return info
        last = self._discovery.last_attempt
        if last is None or self._clock() - last >= self._min_refresh_interval:
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
            last = self._discovery.last_attempt
            if last is not None:
                wait = self._refresh_interval - (self._clock() - last)
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
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        await self._discovery.close()
