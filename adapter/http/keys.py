"""The keys of the application's state and of each request's: what create_app and the lifecycle
contexts store, and what the middlewares and handlers read."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry

from adapter.auth.seam import Authenticator, Authorizer
from adapter.auth.users import UserInfo
from adapter.http.delegate import DelegateClient
from adapter.http.reloading import ConfigReloader
from adapter.http.snapshots import ConfigSnapshot, LiveConfig
from adapter.kube.catalog import ClusterCatalog
from adapter.kube.objects import ObjectCaches
from adapter.rules.config import AdapterConfig
from adapter.settings import AdapterSettings
from metricscale.kube.http import KubeHTTP

if TYPE_CHECKING:  # adapter.http.endpoints reads ROUTE_LABEL_KEY from here
    from adapter.http.endpoints import HealthChecks

__all__ = [
    "AUTHENTICATOR_KEY",
    "AUTHORIZER_KEY",
    "CACHES_FILLED_KEY",
    "CLOCK_KEY",
    "CLUSTER_CATALOG_KEY",
    "CONFIG_KEY",
    "DELEGATE_KEY",
    "FATAL_KEY",
    "HEALTH_KEY",
    "KUBE_HTTP_KEY",
    "METRICS_REGISTRY_KEY",
    "OBJECT_CACHES_KEY",
    "RELOADER_KEY",
    "ROUTE_LABEL_KEY",
    "SETTINGS_KEY",
    "SHUTTING_DOWN_KEY",
    "SNAPSHOTS_KEY",
    "SNAPSHOT_KEY",
    "USER_KEY",
]

SETTINGS_KEY = web.AppKey("settings", AdapterSettings)
# The configuration at start; the one in use is SNAPSHOTS_KEY's (the rule file is reloaded).
CONFIG_KEY = web.AppKey("config", AdapterConfig)
CLOCK_KEY: web.AppKey[Callable[[], float]] = web.AppKey("clock")
METRICS_REGISTRY_KEY = web.AppKey("metrics_registry", CollectorRegistry)
HEALTH_KEY: web.AppKey[HealthChecks] = web.AppKey("health")
AUTHENTICATOR_KEY = web.AppKey("authenticator", Authenticator)
AUTHORIZER_KEY = web.AppKey("authorizer", Authorizer)
FATAL_KEY: web.AppKey[Callable[[BaseException], None]] = web.AppKey("on_fatal")
CACHES_FILLED_KEY: web.AppKey[Callable[[], None]] = web.AppKey("on_caches_filled")
KUBE_HTTP_KEY = web.AppKey("kube_http", KubeHTTP)
CLUSTER_CATALOG_KEY = web.AppKey("cluster_catalog", ClusterCatalog)
OBJECT_CACHES_KEY = web.AppKey("object_caches", ObjectCaches)
# What the rule file makes (clients, discovery, services): a request reads one snapshot.
SNAPSHOTS_KEY = web.AppKey("snapshots", LiveConfig)
RELOADER_KEY = web.AppKey("reloader", ConfigReloader)  # only with --config
DELEGATE_KEY = web.AppKey("delegate", DelegateClient)  # only with --delegate-*-to
SHUTTING_DOWN_KEY = web.AppKey("shutting_down", asyncio.Event)

USER_KEY = web.RequestKey("user", UserInfo)
# The snapshot an API request answers from, and the `route` label of its request series.
SNAPSHOT_KEY = web.RequestKey("snapshot", ConfigSnapshot)
ROUTE_LABEL_KEY = web.RequestKey("route", str)
