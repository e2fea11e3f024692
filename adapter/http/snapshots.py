"""The configuration in use as one value: rules, Prometheus clients, discovery and services.

A `ConfigSnapshot` holds everything a request reads that comes from the rule file. `LiveConfig`
holds the one in use; a request takes `LiveConfig.current` once at its start and answers from
that snapshot to its end, so a reload (adapter.http.reloading) that swaps in a new snapshot with
one assignment never shows a request half of each. Within a snapshot, discovery replaces its
merged metric registry whole, as it always has. A replaced snapshot stops its discovery at once
and closes its clients when the requests that took it have finished (bounded by
`DRAIN_LIMIT_SECONDS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from adapter.api.groups import served_group_versions
from adapter.http.handlers import MetricsService, ObjectSelector
from adapter.http.usage import ResourceMetricsService, UsageObjects
from adapter.prometheus.backends import BackendClients, RelistTarget
from adapter.prometheus.client import PrometheusMetrics
from adapter.prometheus.relisting import Relister, Relisting, RelistMetrics
from adapter.prometheus.tenancy import NamespaceTenants
from adapter.rules.config import DEFAULT_BACKEND, AdapterConfig
from adapter.rules.resources import NAMESPACES, ResourceCatalog
from adapter.settings import AdapterSettings
from metricscale.core.selectors import Selector
from metricscale.tasks import start_guarded_task

__all__ = [
    "DRAIN_LIMIT_SECONDS",
    "ConfigSnapshot",
    "FirstRelistFailed",
    "LiveConfig",
    "SnapshotMetrics",
    "SnapshotObjects",
    "SnapshotOpener",
]

logger = logging.getLogger(__name__)

# How long a replaced snapshot waits for the requests that took it before closing its clients
# (a request waits on Prometheus at most its timeout, 10s by default).
DRAIN_LIMIT_SECONDS = 60.0
_DRAIN_POLL_SECONDS = 0.05


class FirstRelistFailed(Exception):
    """A reloaded configuration's first discovery pass failed on some backend; `str()` names
    each failing backend (and tenant) and why."""


@dataclass(frozen=True)
class SnapshotMetrics:
    """The series every snapshot's clients and discovery write, registered once per process."""

    prometheus: PrometheusMetrics
    discovery: RelistMetrics

    @classmethod
    def register(cls, registry: CollectorRegistry) -> SnapshotMetrics:
        return cls(prometheus=PrometheusMetrics.register(registry),
                   discovery=RelistMetrics.register(registry))


class ConfigSnapshot:
    """One rule file's configuration and what it opened; read-only once built, except for the
    count of requests answering from it."""

    __slots__ = ("_task", "backends", "closed", "config", "discovery", "groups", "requests",
                 "service", "usage")

    def __init__(self, *, config: AdapterConfig, backends: BackendClients,
                 discovery: Relisting, service: MetricsService,
                 usage: ResourceMetricsService | None) -> None:
        self.config = config
        self.backends = backends
        self.discovery = discovery
        self.service = service
        self.usage = usage  # only with resourceRules
        self.groups: Mapping[str, tuple[str, ...]] = served_group_versions(
            resource_metrics=config.resource_rules is not None)
        self.requests = 0  # requests answering from this snapshot now
        self.closed = False
        self._task: asyncio.Task[Any] | None = None

    def start(self, *, on_fatal: Callable[[BaseException], None], passed: bool) -> None:
        """Run discovery in the background (`passed`: its first pass is done)."""
        self._task = start_guarded_task(self.discovery.run(passed=passed),
                                        name="metric discovery", on_failure=on_fatal)

    async def stop_discovery(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self) -> None:
        """Stop discovery and close the clients (idempotent)."""
        await self.stop_discovery()
        if not self.closed:
            self.closed = True
            await self.backends.__aexit__(None, None, None)


class SnapshotObjects(ObjectSelector, UsageObjects, Protocol):
    """The watch-fed object caches both services read (adapter.kube.objects.ObjectCaches)."""


class SnapshotOpener:
    """Builds snapshots: the one at start, and each reloaded configuration's."""

    def __init__(self, *, settings: AdapterSettings, objects: SnapshotObjects,
                 catalog: Callable[[], ResourceCatalog], clock: Callable[[], float],
                 metrics: SnapshotMetrics) -> None:
        if settings.prometheus is None:
            raise ValueError("the adapter needs --prometheus-url")
        self._settings = settings
        self._flags = settings.prometheus
        self._objects = objects
        self._catalog = catalog
        self._clock = clock
        self._metrics = metrics

    async def _namespaces(self) -> list[str]:
        """Every namespace's name, from the adapter's namespace cache (raises KubeError)."""
        return await self._objects.select(NAMESPACES, namespace=None,
                                          selector=Selector.everything())

    async def open(self, config: AdapterConfig, *, first_pass: bool) -> ConfigSnapshot:
        """Open the clients of `config` and build its discovery and services.

        With `first_pass`, also run every relister's first pass, unpublished: the snapshot is
        returned only if all of them succeeded (the same bar as readiness at start), else its
        clients are closed and FirstRelistFailed is raised. Raises PrometheusConfigError
        when a backend's TLS files are unusable.
        """
        settings = self._settings
        backends = BackendClients(config=config, flags=self._flags,
                                  metrics=self._metrics.prometheus)
        await backends.__aenter__()
        try:
            rules_by_backend = config.rules_by_backend()

            def relister(target: RelistTarget) -> Relister:
                return Relister(
                    config=config, lister=target.client, catalog=self._catalog,
                    interval=settings.relist_interval, max_age=settings.max_age,
                    metrics=self._metrics.discovery, clock=self._clock,
                    backend=target.backend, tenant=target.tenant)

            # A backend no rule reads needs no discovery (`default` with every rule elsewhere).
            following = [backend.name for backend in backends.namespace_backends()
                         if rules_by_backend.get(backend.name)]
            tenants = None
            if following:
                tenants = NamespaceTenants(clients=backends, backends=following,
                                           namespaces=self._namespaces, relister=relister,
                                           interval=float(settings.relist_interval))
            discovery = Relisting(config=config, catalog=self._catalog,
                                  metrics=self._metrics.discovery, clock=self._clock,
                                  publish=not first_pass, tenants=tenants)
            for target in backends.relist_targets():
                if target.backend != DEFAULT_BACKEND and not rules_by_backend.get(
                        target.backend):
                    continue
                added = relister(target)
                added.on_swap = discovery.merge
                discovery.add(added)
            service = MetricsService(registry=lambda: discovery.registry,
                                     objects=self._objects, backends=backends,
                                     clock=self._clock)
            usage = None
            if config.resource_rules is not None:
                usage = ResourceMetricsService(rules=config.resource_rules, objects=self._objects,
                                               backends=backends, clock=self._clock)
            if first_pass and not await discovery.step():
                raise FirstRelistFailed("; ".join(discovery.failures))
        except BaseException:
            await backends.__aexit__(None, None, None)
            raise
        return ConfigSnapshot(config=config, backends=backends, discovery=discovery,
                              service=service, usage=usage)


class LiveConfig:
    """The snapshot in use, and the replaced ones still draining."""

    def __init__(self, current: ConfigSnapshot, *,
                 drain_limit: float = DRAIN_LIMIT_SECONDS) -> None:
        self.current = current
        self._drain_limit = drain_limit
        self._retiring: dict[ConfigSnapshot, asyncio.Task[None]] = {}

    def swap(self, new: ConfigSnapshot) -> ConfigSnapshot:
        """Put `new` in use (one assignment) and retire the old one; returns the old one."""
        old, self.current = self.current, new
        new.discovery.publish()
        task = start_guarded_task(self._retire(old), name="retire a replaced configuration",
                                  forever=False)
        self._retiring[old] = task
        task.add_done_callback(lambda _: self._retiring.pop(old, None))
        return old

    @property
    def retiring(self) -> int:
        """Replaced snapshots whose clients are not closed yet."""
        return len(self._retiring)

    async def _retire(self, old: ConfigSnapshot) -> None:
        await old.stop_discovery()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._drain_limit
        # Polled rather than signalled: a request only counts itself in and out, which keeps
        # the request path at one increment and one decrement.
        while old.requests and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(_DRAIN_POLL_SECONDS)
        if old.requests:
            logger.warning("closing the replaced configuration's Prometheus clients with %d "
                           "requests still using them after %.0fs", old.requests,
                           self._drain_limit)
        await old.close()

    async def close(self) -> None:
        """At shutdown (requests have finished): close every snapshot."""
        for old, task in list(self._retiring.items()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await old.close()
        await self.current.close()
