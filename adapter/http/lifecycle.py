"""What the application opens when it starts and closes when it stops (aiohttp `cleanup_ctx`),
in order: the delegate client, the Kubernetes session with the cluster's resource catalog and
the object caches, then the rule file's snapshot and its reload; and the health checks that
read them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from adapter.http.delegate import DelegateClient
from adapter.http.endpoints import HealthChecks
from adapter.http.keys import (
    CACHES_FILLED_KEY,
    CLOCK_KEY,
    CLUSTER_CATALOG_KEY,
    CONFIG_KEY,
    DELEGATE_KEY,
    FATAL_KEY,
    KUBE_HTTP_KEY,
    METRICS_REGISTRY_KEY,
    OBJECT_CACHES_KEY,
    RELOADER_KEY,
    SETTINGS_KEY,
    SHUTTING_DOWN_KEY,
    SNAPSHOTS_KEY,
)
from adapter.http.reloading import ConfigReloader, ReloadMetrics
from adapter.http.snapshots import LiveConfig, SnapshotMetrics, SnapshotOpener
from adapter.kube.catalog import ClusterCatalog
from adapter.kube.objects import USER_AGENT, ObjectCaches
from metricscale.kube.errors import KubeError
from metricscale.kube.http import connect
from metricscale.kube.informer import Informer, InformerCollector
from metricscale.tasks import start_guarded_task

__all__ = ["delegate_context", "kube_context", "register_health", "snapshots_context"]

logger = logging.getLogger(__name__)

# How long the first metric discovery pass waits for the cluster's resource discovery, so that
# overrides naming CRDs are normalised against the real cluster rather than the built-in list.
_FIRST_KUBE_DISCOVERY_WAIT = 5.0


async def kube_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS_KEY]
    on_fatal = app[FATAL_KEY]
    async with connect(kubeconfig=settings.kubeconfig, context=settings.context,
                       user_agent=USER_AGENT,
                       on_failure=on_fatal) as http:
        app[KUBE_HTTP_KEY] = http
        catalog = ClusterCatalog(http, refresh_interval=float(settings.relist_interval),
                                 registry=app[METRICS_REGISTRY_KEY])
        app[CLUSTER_CATALOG_KEY] = catalog
        try:
            async with asyncio.timeout(_FIRST_KUBE_DISCOVERY_WAIT):
                await catalog.refresh()
        except (KubeError, TimeoutError) as error:
            logger.warning("the cluster's resources are not discovered yet (%s); the built-in "
                           "list answers until they are", error or "timed out")
        catalog.start(on_failure=on_fatal)
        caches = ObjectCaches(http, catalog, on_failure=on_fatal,
                              on_filled=app[CACHES_FILLED_KEY])
        app[OBJECT_CACHES_KEY] = caches
        try:
            yield
        finally:
            await caches.close()
            await catalog.stop()


async def delegate_context(app: web.Application) -> AsyncIterator[None]:
    delegate = DelegateClient(app[SETTINGS_KEY].delegation, registry=app[METRICS_REGISTRY_KEY])
    await delegate.start()  # DelegateConfigError: the files of --delegate-* are unusable
    app[DELEGATE_KEY] = delegate
    try:
        yield
    finally:
        await delegate.close()


async def snapshots_context(app: web.Application) -> AsyncIterator[None]:
    """The rule file's snapshot at start, and the watch that swaps in each new version."""
    settings = app[SETTINGS_KEY]
    cluster_catalog = app[CLUSTER_CATALOG_KEY]
    registry = app[METRICS_REGISTRY_KEY]
    opener = SnapshotOpener(settings=settings, objects=app[OBJECT_CACHES_KEY],
                            catalog=lambda: cluster_catalog.catalog, clock=app[CLOCK_KEY],
                            metrics=SnapshotMetrics.register(registry))
    first = await opener.open(app[CONFIG_KEY], first_pass=False)
    live = LiveConfig(first)
    app[SNAPSHOTS_KEY] = live
    first.start(on_fatal=app[FATAL_KEY], passed=False)
    task = None
    if settings.config_file is not None:
        reloader = ConfigReloader(path=settings.config_file, live=live, opener=opener,
                                  metrics=ReloadMetrics.register(registry),
                                  clock=app[CLOCK_KEY], on_fatal=app[FATAL_KEY])
        app[RELOADER_KEY] = reloader
        task = start_guarded_task(reloader.run(), name="configuration reload",
                                  on_failure=app[FATAL_KEY])
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await live.close()


def register_health(app: web.Application) -> HealthChecks:
    """The adapter's own checks: ping, metric discovery, shutdown and the object caches."""
    health = HealthChecks()
    health.add(("healthz", "livez", "readyz"), "ping", lambda: True)
    # Not gated on the cluster's resource discovery: through kube-apiserver that discovery
    # includes this adapter's own APIServices, which stay unavailable until it is ready, and
    # the built-in resource list answers meanwhile.
    # Ready on the last good snapshot when a later pass failed or was held; ?verbose says so.
    health.add(("readyz",), "metric-discovery",
               lambda: SNAPSHOTS_KEY in app
               and app[SNAPSHOTS_KEY].current.discovery.has_succeeded,
               note=lambda: app[SNAPSHOTS_KEY].current.discovery.stale_reason
               if SNAPSHOTS_KEY in app else None)
    health.add(("readyz",), "shutdown", lambda: not app[SHUTTING_DOWN_KEY].is_set())

    def informers() -> list[Informer[Any]]:
        # The object caches start lazily, one per group-resource asked about: read at call time.
        caches = app.get(OBJECT_CACHES_KEY)
        if caches is None:
            return []
        # ObjectCaches has no public listing of its caches (adapter/kube is not ours to edit).
        return [cache.informer for cache in list(caches._caches.values())]

    def informers_fresh() -> bool:
        stale = [(i.name, r) for i in informers() if (r := i.stale_reason()) is not None
                 and i.has_synced]  # a cache still filling answers 503 on its own request
        for name, reason in stale:
            logger.warning("readyz: cache %s is stale: %s", name, reason)
        return not stale

    health.add(("readyz",), "informers", informers_fresh)
    app[METRICS_REGISTRY_KEY].register(InformerCollector(informers))
    return health
