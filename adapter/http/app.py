"""The adapter's aiohttp application: AppKeys, lifecycle contexts, middlewares and routes.

`create_app` builds the whole server as a value: every client and background task is opened in
a `cleanup_ctx` inside the running loop and closed in reverse order. Requests pass one
middleware that does, outermost first: request metrics, error mapping (every failure becomes a
`Status` body, never a traceback), and the authentication/authorization seam, which runs
before routing (an unauthorized caller gets 401/403 even for a path that would be 404), as the
generic Kubernetes API server does. The composition root hands in the delegated authenticator and
authorizer (adapter.security); the seam itself is adapter.auth.seam.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import platform
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from adapter.api.delegated import delegate_unavailable, merge_resource_lists
from adapter.api.groups import (
    CUSTOM_METRICS_GROUP,
    EXTERNAL_METRICS_GROUP,
    RESOURCE_METRICS_GROUP,
)
from adapter.api.routes import (
    CustomMetricRoute,
    ExternalMetricRoute,
    GroupListRoute,
    GroupRoute,
    ResourceListRoute,
    ResourceMetricsRoute,
    Route,
    RouteRejection,
    parse_route,
)
from adapter.api.usage import render_resource_metrics_resource_list
from adapter.api.wire import (
    AGGREGATED_DISCOVERY_CONTENT_TYPES,
    bad_request,
    internal_error,
    method_not_allowed,
    not_acceptable,
    render_aggregated_discovery,
    render_api_group,
    render_api_group_list,
    render_custom_resource_list,
    render_external_resource_list,
    route_not_found,
    status_body,
    unauthorized,
)
from adapter.auth.attributes import (
    RequestAttributesError,
    RequestPathError,
    check_request_attributes,
    decode_request_path,
    request_attributes,
)
from adapter.auth.authentication import (
    AuthenticationFailure,
)
from adapter.auth.authorization import (
    Decision,
)
from adapter.auth.seam import (
    ALLOW_ALL_AUTHENTICATOR,
    ALLOW_ALL_AUTHORIZER,
    ALLOW_ALL_USER,
    AuthCheckUnavailable,
    Authenticator,
    Authorizer,
    IncomingRequest,
)
from adapter.auth.status import (
    AUTHENTICATION_FAILED_CAUSE,
    AUTHORIZATION_FAILED_CAUSE,
    forbidden_status,
)
from adapter.auth.users import (
    UserInfo,
)
from adapter.http.delegate import DelegateClient, DelegateUnavailable
from adapter.http.handlers import Answer, ApiError
from adapter.http.reloading import ConfigReloader, ReloadMetrics
from adapter.http.snapshots import ConfigSnapshot, LiveConfig, SnapshotMetrics, SnapshotOpener
from adapter.kube.catalog import ClusterCatalog
from adapter.kube.objects import USER_AGENT, ObjectCaches
from adapter.rules.config import AdapterConfig
from adapter.security.tls import peer_certificate_der
from adapter.settings import AdapterSettings
from metricscale import __version__
from metricscale.kube.errors import KubeError
from metricscale.kube.http import KubeHTTP, connect
from metricscale.kube.informer import Informer, InformerCollector
from metricscale.tasks import start_guarded_task

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
    "negotiate_json",
]

logger = logging.getLogger(__name__)

JSON_CONTENT_TYPE = "application/json"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
NOSNIFF: Mapping[str, str] = MappingProxyType({"X-Content-Type-Options": "nosniff"})
# How long the first metric discovery pass waits for the cluster's resource discovery, so that
# overrides naming CRDs are normalised against the real cluster rather than the built-in list.
_FIRST_KUBE_DISCOVERY_WAIT = 5.0
_API_PREFIXES = ("/apis", "/api")


# --------------------------------------------------------------------------------------------
# Health checks


@dataclass
class HealthChecks:
    """Named checks per endpoint (`healthz`, `livez`, `readyz`); others may add their own.

    A check may also say why it passes in a degraded way (`note`): `?verbose` shows it after
    `[+]name ok: `. A failing check's reason is withheld, as kube-apiserver does.
    """

    checks: dict[str, list[tuple[str, Callable[[], bool]]]] = field(default_factory=lambda: {
        "healthz": [], "livez": [], "readyz": []})
    notes: dict[str, Callable[[], str | None]] = field(default_factory=dict)

    def add(self, endpoints: Sequence[str], name: str, check: Callable[[], bool], *,
            note: Callable[[], str | None] | None = None) -> None:
        for endpoint in endpoints:
            self.checks[endpoint].append((name, check))
        if note is not None:
            self.notes[name] = note

    def note(self, name: str) -> str | None:
        """What a passing check has to say (None: nothing), safe to show to anyone."""
        note = self.notes.get(name)
        if note is None:
            return None
        try:
            return note()
        except Exception:
            logger.exception("health check note %s raised", name)
            return None

    def run(self, endpoint: str) -> list[tuple[str, bool]]:
        results = []
        for name, check in self.checks[endpoint]:
            try:
                ok = bool(check())
            except Exception:
                logger.exception("health check %s raised", name)
                ok = False
            results.append((name, ok))
        return results


@dataclass(frozen=True)
class _RequestMetrics:
    requests: Counter
    duration: Histogram

    @classmethod
    def register(cls, registry: CollectorRegistry) -> _RequestMetrics:
        return cls(
            requests=Counter("metricscale_http_requests_total",
                             "Requests served, by route, method and HTTP status code.",
                             ["route", "method", "code"], registry=registry),
            duration=Histogram("metricscale_http_request_duration_seconds",
                               "Time to answer a request, by route.", ["route"],
                               registry=registry,
                               buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5, 1, 2.5, 5, 10, 30)))


class _ParsedRoutes:
    """`parse_route`'s answers, kept by path and query for the groups they were parsed
    against: an autoscaler asks the same few paths again and again, and the parse (selectors,
    name checks, unescaping) is a pure function of them. A route is immutable; the memo is
    emptied when the groups served change (a reload) or when it holds `_ROUTE_MEMO` paths."""

    __slots__ = ("_groups", "_routes")

    def __init__(self) -> None:
        self._groups: Mapping[str, tuple[str, ...]] | None = None
        self._routes: dict[tuple[str, str], Route | None] = {}

    def parse(self, raw_path: str, raw_query: str,
              groups: Mapping[str, tuple[str, ...]]) -> Route | None:
        key = (raw_path, raw_query)
        if groups is self._groups:
            try:
                return self._routes[key]
            except KeyError:
                pass
        else:
            self._groups, self._routes = groups, {}
        route = parse_route(raw_path, raw_query, groups=groups)
        if len(self._routes) >= _ROUTE_MEMO:
            self._routes = {}
        self._routes[key] = route
        return route


_ROUTE_MEMO = 1024


# --------------------------------------------------------------------------------------------
# Application keys

SETTINGS_KEY = web.AppKey("settings", AdapterSettings)
# The configuration at start; the one in use is SNAPSHOTS_KEY's (the rule file is reloaded).
CONFIG_KEY = web.AppKey("config", AdapterConfig)
CLOCK_KEY: web.AppKey[Callable[[], float]] = web.AppKey("clock")
METRICS_REGISTRY_KEY = web.AppKey("metrics_registry", CollectorRegistry)
HEALTH_KEY = web.AppKey("health", HealthChecks)
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
REQUEST_METRICS_KEY = web.AppKey("request_metrics", _RequestMetrics)
ROUTES_KEY = web.AppKey("routes", _ParsedRoutes)

USER_KEY = web.RequestKey("user", UserInfo)
_SNAPSHOT = web.RequestKey("snapshot", ConfigSnapshot)
_ROUTE_LABEL = web.RequestKey("route", str)


# --------------------------------------------------------------------------------------------
# Responses


def _json(body: Mapping[str, Any] | bytes, *, status: int = 200,
          headers: Mapping[str, str] | None = None,
          content_type: str = JSON_CONTENT_TYPE) -> web.Response:
    """A JSON response; `body` as a value, or already encoded (the metric value lists)."""
    encoded = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
    response = web.Response(body=encoded, status=status, headers=headers)
    # Set after construction so aiohttp does not append its own charset parameter.
    response.headers["Content-Type"] = content_type
    return response


def _status(body: Mapping[str, Any], *, headers: Mapping[str, str] | None = None,
            ) -> web.Response:
    return _json(body, status=int(body["code"]), headers={**NOSNIFF, **(headers or {})})


def _text(text: str, *, status: int = 200) -> web.Response:
    response = web.Response(text=text, status=status, headers=NOSNIFF)
    response.headers["Content-Type"] = TEXT_CONTENT_TYPE
    return response


def _warning_header(warnings: Sequence[str]) -> dict[str, str]:
    """RFC 7234 `Warning: 299 - "text"`, as kube-apiserver sends them (kubectl prints them)."""
    if not warnings:
        return {}
    quoted = []
    for text in warnings:
        clean = "".join(char if char.isprintable() and ord(char) < 128 else "?"
                        for char in text)
        quoted.append('299 - "' + clean.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return {"Warning": ", ".join(quoted)}


_ZERO_QUALITY = frozenset({"0", "0.0", "0.00", "0.000"})


def _media_ranges(accept: str) -> Iterator[tuple[str, dict[str, str]]]:
    """Each media range of `Accept` (lower-cased) with its parameters; `q=0` ranges left out."""
    for media_range in accept.split(","):
        media, *parameters = (part.strip() for part in media_range.split(";"))
        params = {}
        for parameter in parameters:
            key, _, value = parameter.partition("=")
            params[key.strip().lower()] = value.strip()
        if params.get("q", "1") not in _ZERO_QUALITY:
            yield media.lower(), params


def _plain_json_fits(media: str, params: Mapping[str, str]) -> bool:
    # `as`, `g` and `v` ask for another kind of document (a Table, a discovery list).
    return media in ("*/*", "application/*") or (
        media == "application/json" and not {"as", "g", "v"} & params.keys())


def negotiate_json(accept: str | None) -> bool:
    """Whether plain JSON satisfies `Accept` (absent, `application/json`, `application/*`,
    `*/*`). `application/json;as=Table;…` asks for another kind and does not count."""
    if not accept or not accept.strip():
        return True
    return any(_plain_json_fits(media, params) for media, params in _media_ranges(accept))


def _aggregated_discovery_version(accept: str | None) -> str | None:
    """`v2`/`v2beta1` if `Accept` asks for aggregated discovery first, else None."""
    if not accept:
        return None
    for media, params in _media_ranges(accept):
        if (media == "application/json" and params.get("g") == "apidiscovery.k8s.io"
                and params.get("as") == "APIGroupDiscoveryList"
                and params.get("v") in AGGREGATED_DISCOVERY_CONTENT_TYPES):
            return params["v"]
        if _plain_json_fits(media, params):
            return None
    return None


# --------------------------------------------------------------------------------------------
# Middlewares

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _RequestSeries:
    """The request series' children, looked up once per label set and kept: a `labels()`
    call costs a lock, a tuple and a dict lookup on every request. As many entries as the
    registry keeps children anyway."""

    __slots__ = ("_counts", "_durations", "_metrics")

    def __init__(self, metrics: _RequestMetrics) -> None:
        self._metrics = metrics
        self._counts: dict[tuple[str, str, int], Any] = {}
        self._durations: dict[str, Any] = {}

    def observe(self, route: str, method: str, code: int, seconds: float) -> None:
        count = self._counts.get((route, method, code))
        if count is None:
            count = self._counts[route, method, code] = self._metrics.requests.labels(
                route, method, str(code))
        count.inc()
        duration = self._durations.get(route)
        if duration is None:
            duration = self._durations[route] = self._metrics.duration.labels(route)
        duration.observe(seconds)


def _in_api(path: str) -> bool:
    return any(path == prefix or path.startswith(prefix + "/") for prefix in _API_PREFIXES)


def _middleware(*, metrics: _RequestMetrics, authenticator: Authenticator,
                authorizer: Authorizer) -> Middleware:
    """The one middleware every request passes: request metrics, then error mapping (every
    failure becomes a `Status` body, never a traceback), then authentication, path checks and
    authorization, all before the route runs. One coroutine instead of three nested ones;
    with `--insecure-disable-auth` (the allow-all pair) neither the `IncomingRequest` nor the
    request's attributes are built: only the checks that can refuse a request still run."""
    series = _RequestSeries(metrics)
    open_authentication = authenticator is ALLOW_ALL_AUTHENTICATOR
    open_authorization = authorizer is ALLOW_ALL_AUTHORIZER

    def checked_path(request: web.Request) -> web.Response | None:
        """The path checks, and the attributes' own failure, for the allow-all authorizer:
        a refusal, or None (nothing else can refuse the request)."""
        url = request.rel_url
        try:
            path = decode_request_path(url.raw_path)
        except RequestPathError as error:
            return _status(bad_request(str(error)))
        try:
            check_request_attributes(method=request.method, path=path)
        except RequestAttributesError as error:
            logger.warning("cannot authorize %s: %s", url.raw_path, error)
            return _status(internal_error(AUTHORIZATION_FAILED_CAUSE))
        return None

    async def guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Authentication, then path checks, then authorization: all before the route runs."""
        url = request.rel_url
        user: UserInfo
        if open_authentication:
            user = ALLOW_ALL_USER
        else:
            transport = request.transport
            ssl_object = (transport.get_extra_info("ssl_object") if transport is not None
                          else None)
            incoming = IncomingRequest(
                method=request.method, raw_path=url.raw_path, raw_query=url.raw_query_string,
                headers=tuple((str(k), str(v)) for k, v in request.headers.items()),
                peer_certificate_der=peer_certificate_der(ssl_object))
            try:
                authenticated = await authenticator.authenticate(incoming)
            except AuthCheckUnavailable as error:
                logger.warning("authentication could not be completed: %s", error)
                return _status(internal_error(AUTHENTICATION_FAILED_CAUSE))
            if isinstance(authenticated, AuthenticationFailure):
                logger.info("401 for %s %s: %s", request.method, url.raw_path,
                            "; ".join(authenticated.errors))
                return _status(unauthorized())
            user = authenticated.user
        if open_authorization:
            refusal = checked_path(request)
            if refusal is not None:
                return refusal
        else:
            try:
                path = decode_request_path(url.raw_path)
            except RequestPathError as error:
                return _status(bad_request(str(error)))
            try:
                attributes = request_attributes(method=request.method, path=path,
                                                query=tuple(url.query.items()))
            except RequestAttributesError as error:
                logger.warning("cannot authorize %s: %s", url.raw_path, error)
                return _status(internal_error(AUTHORIZATION_FAILED_CAUSE))
            try:
                decision = await authorizer.authorize(user, attributes)
            except AuthCheckUnavailable as error:
                logger.warning("authorization could not be completed: %s", error)
                return _status(internal_error(AUTHORIZATION_FAILED_CAUSE))
            if decision.error:
                logger.warning("authorization failed for %s: %s", url.raw_path, decision.error)
                return _status(internal_error(AUTHORIZATION_FAILED_CAUSE))
            if decision.decision is not Decision.ALLOW:
                return _status(forbidden_status(user=user, attributes=attributes,
                                                reason=decision.reason))
        request[USER_KEY] = user
        return await handler(request)

    open_auth = open_authentication and open_authorization

    @web.middleware
    async def serve(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        code = 500
        response: web.StreamResponse
        try:
            try:
                if open_auth:
                    refusal = checked_path(request)
                    if refusal is None:
                        request[USER_KEY] = ALLOW_ALL_USER
                        response = await handler(request)
                    else:
                        response = refusal
                else:
                    response = await guarded(request, handler)
            except ApiError as error:
                response = _status(error.body, headers=_warning_header(error.warnings))
            except web.HTTPNotFound:
                request[_ROUTE_LABEL] = "not_found"
                if _in_api(request.rel_url.raw_path):
                    response = _status(route_not_found())
                else:
                    response = _text("404 page not found\n", status=404)
            except web.HTTPMethodNotAllowed:
                if _in_api(request.rel_url.raw_path):
                    response = _status(method_not_allowed())
                else:
                    response = _text("405 method not allowed\n", status=405)
            except web.HTTPException:
                raise
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("unexpected error answering %s %s", request.method,
                                 request.rel_url.raw_path)
                response = _status(internal_error(
                    "an unexpected error occurred; see the adapter's log"))
            code = response.status
            return response
        except web.HTTPException as exc:
            code = exc.status
            raise
        finally:
            route = request.get(_ROUTE_LABEL, "other")
            series.observe(route, request.method, code, time.perf_counter() - started)
            # A failing /readyz is expected while starting and stopping; it has its own log line.
            if code >= 500 and route != "health":
                logger.warning("%s %s -> %d", request.method, request.rel_url.raw_path, code)
            elif logger.isEnabledFor(logging.DEBUG):
                logger.debug("%s %s -> %d", request.method, request.rel_url.raw_path, code)

    return serve


# --------------------------------------------------------------------------------------------
# Handlers: health, version, metrics, OpenAPI


def _health_handler(endpoint: str) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        request[_ROUTE_LABEL] = "health"
        health = request.app[HEALTH_KEY]
        single = request.match_info.get("check")
        results = health.run(endpoint)
        if single is not None:
            single_ok = dict(results).get(single)
            if single_ok is None:
                return _text("404 page not found\n", status=404)
            if single_ok:
                return _text("ok")
            return _text(f"internal server error: {single} check failed\n", status=500)
        excluded = {value for key, value in request.rel_url.query.items() if key == "exclude"}
        lines = []
        failed = False
        for name, ok in results:
            if name in excluded:
                lines.append(f"[+]{name} excluded: ok\n")
                excluded.discard(name)
            elif ok:
                note = health.note(name)
                lines.append(f"[+]{name} ok: {note}\n" if note else f"[+]{name} ok\n")
            else:
                lines.append(f"[-]{name} failed: reason withheld\n")
                failed = True
        if excluded:
            names = ",".join(json.dumps(name) for name in sorted(excluded))
            lines.append(f"warn: some health checks cannot be excluded: no matches for {names}\n")
        if failed:
            logger.info("%s failed: %s", endpoint,
                        ", ".join(name for name, ok in results if not ok))
            return _text("".join(lines) + f"{endpoint} check failed\n", status=500)
        if "verbose" not in request.rel_url.query:
            return _text("ok")
        return _text("".join(lines) + f"{endpoint} check passed\n")

    return handle


async def _version(request: web.Request) -> web.StreamResponse:
    request[_ROUTE_LABEL] = "version"
    major, minor, *_ = [*__version__.split("."), "0", "0"]
    return _json({
        "major": major, "minor": minor, "gitVersion": f"v{__version__}", "gitCommit": "",
        "gitTreeState": "", "buildDate": "",
        "goVersion": f"python{platform.python_version()}",
        "compiler": sys.implementation.name,
        "platform": f"{platform.system().lower()}/{platform.machine()}"})


async def _metrics(request: web.Request) -> web.StreamResponse:
    request[_ROUTE_LABEL] = "metrics"
    body = generate_latest(request.app[METRICS_REGISTRY_KEY])
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


async def _openapi_v2(request: web.Request) -> web.StreamResponse:
    request[_ROUTE_LABEL] = "openapi"
    # A minimal valid Swagger 2.0 document (contract §6); /openapi/v3 is a 404, after which the
    # aggregator converts this one.
    return _json({"swagger": "2.0",
                  "info": {"title": "metricscale-adapter", "version": __version__},
                  "paths": {}})


# --------------------------------------------------------------------------------------------
# Handlers: the API groups


def _resource_list(snapshot: ConfigSnapshot, *, group: str, version: str) -> dict[str, Any]:
    if group == RESOURCE_METRICS_GROUP:
        return render_resource_metrics_resource_list()
    registry = snapshot.discovery.registry
    if group == EXTERNAL_METRICS_GROUP:
        return render_external_resource_list(metrics=registry.external_metrics())
    return render_custom_resource_list(version=version, metrics=registry.custom_metrics())


async def _discovery_list(request: web.Request, *, group: str,
                          version: str) -> dict[str, Any]:
    """Our APIResourceList, merged with the delegate's when this group is delegated (ours
    first; a delegate that does not answer leaves ours alone)."""
    ours = _resource_list(request[_SNAPSHOT], group=group, version=version)
    delegate = request.app.get(DELEGATE_KEY)
    if delegate is None or not delegate.delegates(group):
        return ours
    theirs = await delegate.resource_list(group, version, user=request[USER_KEY])
    return merge_resource_lists(ours, theirs, fold_case=group == EXTERNAL_METRICS_GROUP)


def _delegated_group(request: web.Request, route: CustomMetricRoute | ExternalMetricRoute,
                     ) -> str | None:
    """The group whose delegate answers this request: our rules do not serve its metric."""
    delegate = request.app.get(DELEGATE_KEY)
    if delegate is None:
        return None
    service = request[_SNAPSHOT].service
    if isinstance(route, ExternalMetricRoute):
        group, ours = EXTERNAL_METRICS_GROUP, service.serves_external_metric(route)
    else:
        group, ours = CUSTOM_METRICS_GROUP, service.serves_custom_metric(route)
    return group if delegate.delegates(group) and not ours else None


async def _forward(request: web.Request, *, group: str, metric: str) -> web.StreamResponse:
    """The delegate's answer, as it is (status, body, Content-Type, Warning, Retry-After)."""
    request[_ROUTE_LABEL] = "delegated_metric"
    url = request.rel_url
    try:
        answer = await request.app[DELEGATE_KEY].forward(
            group, raw_path=url.raw_path, raw_query=url.raw_query_string,
            user=request[USER_KEY], headers=tuple(request.headers.items()))
    except DelegateUnavailable as error:
        raise ApiError(delegate_unavailable(group=group, metric=metric,
                                            why=error.why)) from None
    response = web.Response(body=answer.body, status=answer.status)
    if answer.content_type is not None:
        response.headers["Content-Type"] = answer.content_type
    for name, value in answer.headers:
        response.headers.add(name, value)
    return response


def _rejection(route: RouteRejection) -> dict[str, Any]:
    if route.code == 404:
        return route_not_found()
    return status_body(code=route.code, reason=route.reason, message=route.message)


async def _api(request: web.Request) -> web.StreamResponse:
    # The one read of the configuration in use: everything below answers from this snapshot,
    # and a reload closes its clients only once no request holds it.
    snapshot = request.app[SNAPSHOTS_KEY].current
    snapshot.requests += 1
    try:
        request[_SNAPSHOT] = snapshot
        return await _api_answer(request, snapshot)
    finally:
        snapshot.requests -= 1


async def _api_answer(request: web.Request, snapshot: ConfigSnapshot) -> web.StreamResponse:
    url = request.rel_url
    request[_ROUTE_LABEL] = "api"
    groups = snapshot.groups
    route = request.app[ROUTES_KEY].parse(url.raw_path, url.raw_query_string, groups)
    if route is None:
        raise ApiError(route_not_found())
    if isinstance(route, RouteRejection):
        raise ApiError(_rejection(route))
    if request.method != "GET":
        raise ApiError(method_not_allowed())
    accept = request.headers.get("Accept")
    if isinstance(route, GroupListRoute):
        request[_ROUTE_LABEL] = "discovery"
        aggregated = _aggregated_discovery_version(accept)
        if aggregated is not None:
            pairs = [(group, version) for group, versions in groups.items()
                     for version in versions]
            lists = dict(zip(pairs, await asyncio.gather(
                *(_discovery_list(request, group=group, version=version)
                  for group, version in pairs)), strict=True))
            document = render_aggregated_discovery(
                [(group, [(version, lists[group, version]) for version in versions])
                 for group, versions in groups.items()],
                version=aggregated)
            return _json(document, headers={"Vary": "Accept"},
                         content_type=AGGREGATED_DISCOVERY_CONTENT_TYPES[aggregated])
        _require_json(accept)
        return _json(render_api_group_list(tuple(groups.items())),
                     headers={"Vary": "Accept"})
    if isinstance(route, CustomMetricRoute | ExternalMetricRoute):
        # Before our content negotiation: the delegate negotiates its own answer.
        delegated = _delegated_group(request, route)
        if delegated is not None:
            return await _forward(request, group=delegated, metric=route.metric)
    _require_json(accept)
    if isinstance(route, GroupRoute):
        request[_ROUTE_LABEL] = "discovery"
        versions = groups[route.group]
        return _json(render_api_group(group=route.group, versions=versions))
    if isinstance(route, ResourceListRoute):
        request[_ROUTE_LABEL] = "discovery"
        return _json(await _discovery_list(request, group=route.group, version=route.version))
    service = snapshot.service
    answer: Answer
    if isinstance(route, CustomMetricRoute):
        request[_ROUTE_LABEL] = "custom_metric"
        answer = await service.custom_metric(route)
    elif isinstance(route, ExternalMetricRoute):
        request[_ROUTE_LABEL] = "external_metric"
        answer = await service.external_metric(route)
    elif isinstance(route, ResourceMetricsRoute):
        request[_ROUTE_LABEL] = "resource_metrics"
        usage = snapshot.usage
        assert usage is not None  # the group is served only with resourceRules
        answer = await usage.answer(route)
    else:  # pragma: no cover - parse_route returns nothing else
        raise ApiError(route_not_found())
    return _json(answer.body, headers=_warning_header(answer.warnings))


def _require_json(accept: str | None) -> None:
    if not negotiate_json(accept):
        raise ApiError(not_acceptable())


async def _api_not_found(request: web.Request) -> web.StreamResponse:
    request[_ROUTE_LABEL] = "not_found"
    raise ApiError(route_not_found())


# --------------------------------------------------------------------------------------------
# Lifecycle contexts


async def _kube_context(app: web.Application) -> AsyncIterator[None]:
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


async def _delegate_context(app: web.Application) -> AsyncIterator[None]:
    delegate = DelegateClient(app[SETTINGS_KEY].delegation, registry=app[METRICS_REGISTRY_KEY])
    await delegate.start()  # DelegateConfigError: the files of --delegate-* are unusable
    app[DELEGATE_KEY] = delegate
    try:
        yield
    finally:
        await delegate.close()


async def _snapshots_context(app: web.Application) -> AsyncIterator[None]:
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


def _register_health(app: web.Application) -> HealthChecks:
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
    `on_caches_filled` when an object cache (pods, nodes, ...) has first filled.
    """
    registry = metrics_registry or CollectorRegistry(auto_describe=True)
    if metrics_registry is None:
        ProcessCollector(registry=registry)
    request_metrics = _RequestMetrics.register(registry)
    app = web.Application(middlewares=[_middleware(
        metrics=request_metrics, authenticator=authenticator, authorizer=authorizer)])
    app[SETTINGS_KEY] = settings
    app[CONFIG_KEY] = config
    app[CLOCK_KEY] = clock
    app[METRICS_REGISTRY_KEY] = registry
    app[REQUEST_METRICS_KEY] = request_metrics
    app[ROUTES_KEY] = _ParsedRoutes()
    app[AUTHENTICATOR_KEY] = authenticator
    app[AUTHORIZER_KEY] = authorizer
    app[FATAL_KEY] = on_fatal
    app[CACHES_FILLED_KEY] = on_caches_filled
    app[SHUTTING_DOWN_KEY] = asyncio.Event()
    app[HEALTH_KEY] = _register_health(app)

    if settings.delegation.enabled:
        app.cleanup_ctx.append(_delegate_context)
    app.cleanup_ctx.append(_kube_context)
    app.cleanup_ctx.append(_snapshots_context)

    router = app.router
    for endpoint in ("healthz", "livez", "readyz"):
        handler = _health_handler(endpoint)
        router.add_get(f"/{endpoint}", handler, allow_head=False)
        router.add_get(f"/{endpoint}/{{check}}", handler, allow_head=False)
    router.add_get("/version", _version, allow_head=False)
    router.add_get("/version/", _version, allow_head=False)
    router.add_get("/metrics", _metrics, allow_head=False)
    router.add_get("/openapi/v2", _openapi_v2, allow_head=False)
    router.add_route("*", "/apis", _api)
    router.add_route("*", "/apis/{tail:.*}", _api)
    router.add_route("*", "/api", _api_not_found)
    router.add_route("*", "/api/{tail:.*}", _api_not_found)
    return app


def mark_shutting_down(app: web.Application) -> None:
    """From now on /readyz fails, so endpoints drop this pod before it stops serving."""
    app[SHUTTING_DOWN_KEY].set()
