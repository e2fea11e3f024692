"""The adapter's aiohttp application, put together: keys, middlewares, routes, lifecycle.

`create_app` builds the whole server as a value: every client and background task is opened in
a `cleanup_ctx` inside the running loop and closed in reverse order (adapter.http.lifecycle).
Requests pass the middlewares of adapter.http.middleware, one per concern: request metrics,
`Status` errors, then authentication and authorization before routing (the composition root
hands in the delegated authenticator and authorizer of adapter.security; the seam is
adapter.auth.seam). The routes are the endpoints beside the APIs (adapter.http.endpoints) and
the metrics APIs themselves (adapter.http.api).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, ProcessCollector

from adapter.auth.seam import (
    ALLOW_ALL_AUTHENTICATOR,
    ALLOW_ALL_AUTHORIZER,
    Authenticator,
    Authorizer,
)
from adapter.http.api import api_handler, api_not_found
from adapter.http.endpoints import HealthChecks, add_endpoints
from adapter.http.keys import (
    AUTHENTICATOR_KEY,
    AUTHORIZER_KEY,
    CACHES_FILLED_KEY,
    CLOCK_KEY,
    CLUSTER_CATALOG_KEY,
    CONFIG_KEY,
    DELEGATE_KEY,
    FATAL_KEY,
    HEALTH_KEY,
    KUBE_HTTP_KEY,
    METRICS_REGISTRY_KEY,
    OBJECT_CACHES_KEY,
    RELOADER_KEY,
    SETTINGS_KEY,
    SHUTTING_DOWN_KEY,
    SNAPSHOTS_KEY,
    USER_KEY,
)
from adapter.http.lifecycle import (
    delegate_context,
    kube_context,
    register_health,
    snapshots_context,
)
from adapter.http.middleware import (
    RequestMetrics,
    authentication_and_authorization,
    checked_path,
    request_metrics,
    status_errors,
)
from adapter.http.responses import negotiate_json
from adapter.rules.config import AdapterConfig
from adapter.settings import AdapterSettings

__all__ = [
    "CLOCK_KEY",
    "CLUSTER_CATALOG_KEY",
    "CONFIG_KEY",
    "DELEGATE_KEY",
    "HEALTH_KEY",
    "KUBE_HTTP_KEY",
    "METRICS_REGISTRY_KEY",
    "OBJECT_CACHES_KEY",
    "RELOADER_KEY",
    "SETTINGS_KEY",
    "SNAPSHOTS_KEY",
    "USER_KEY",
    "HealthChecks",
    "create_app",
    "mark_shutting_down",
    "negotiate_json",
]

logger = logging.getLogger(__name__)

# The request series' metrics under their former name (tests/monitoring reads it from here).
_RequestMetrics = RequestMetrics


def _log_fatal(error: BaseException) -> None:
    logger.critical("a background task failed; the adapter cannot go on: %r", error)


def create_app(*, settings: AdapterSettings, config: AdapterConfig,
               authenticator: Authenticator = ALLOW_ALL_AUTHENTICATOR,
               authorizer: Authorizer = ALLOW_ALL_AUTHORIZER,
               clock: Callable[[], float] = time.time,
               on_fatal: Callable[[BaseException], None] = _log_fatal,
               metrics_registry: CollectorRegistry | None = None,
               on_caches_filled: Callable[[], None] = lambda: None) -> web.Application:
    """The adapter as an aiohttp Application; nothing is opened until it starts.

    `on_fatal` is called when a background task dies (the server then stops the process);
    `on_caches_filled` when an object cache (pods, nodes, ...) has first filled. With the
    allow-all pair (`--insecure-disable-auth`) no authentication and authorization middleware
    is installed: only the path checks run.
    """
    registry = metrics_registry or CollectorRegistry(auto_describe=True)
    if metrics_registry is None:
        ProcessCollector(registry=registry)
    allow_all = authenticator is ALLOW_ALL_AUTHENTICATOR and authorizer is ALLOW_ALL_AUTHORIZER
    guard = checked_path if allow_all else authentication_and_authorization(
        authenticator=authenticator, authorizer=authorizer)
    app = web.Application(middlewares=[
        request_metrics(RequestMetrics.register(registry)), status_errors, guard])
    app[SETTINGS_KEY] = settings
    app[CONFIG_KEY] = config
    app[CLOCK_KEY] = clock
    app[METRICS_REGISTRY_KEY] = registry
    app[AUTHENTICATOR_KEY] = authenticator
    app[AUTHORIZER_KEY] = authorizer
    app[FATAL_KEY] = on_fatal
    app[CACHES_FILLED_KEY] = on_caches_filled
    app[SHUTTING_DOWN_KEY] = asyncio.Event()
    app[HEALTH_KEY] = register_health(app)

    if settings.delegation.enabled:
        app.cleanup_ctx.append(delegate_context)
    app.cleanup_ctx.append(kube_context)
    app.cleanup_ctx.append(snapshots_context)

    router = app.router
    add_endpoints(router)
    api = api_handler()
    router.add_route("*", "/apis", api)
    router.add_route("*", "/apis/{tail:.*}", api)
    router.add_route("*", "/api", api_not_found)
    router.add_route("*", "/api/{tail:.*}", api_not_found)
    return app


def mark_shutting_down(app: web.Application) -> None:
    """From now on /readyz fails, so endpoints drop this pod before it stops serving."""
    app[SHUTTING_DOWN_KEY].set()
