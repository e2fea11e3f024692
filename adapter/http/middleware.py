"""The middlewares every request passes, one per concern, outermost first.

1. `request_metrics`: the request series (count by route, method and code; duration by route)
   and the log line of a failed request.
2. `status_errors`: every failure becomes a `Status` body (or kube-apiserver's plain-text 404
   and 405 outside the API paths), never a traceback.
3. `authentication_and_authorization`: who is asking (401), whether the path can be read one
   way only (400) and authorized at all (500), whether the caller may (403): all before the
   route runs, so an unauthorized caller gets 401/403 even for a path that would be 404, as
   the generic Kubernetes API server does. With `--insecure-disable-auth` (the allow-all pair)
   it is not installed; `checked_path` is, which only refuses what cannot be read.

The path and attribute checks are `request_attributes_of`, used by both of the last two.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry, Counter, Histogram

from adapter.api.wire import (
    bad_request,
    internal_error,
    method_not_allowed,
    route_not_found,
    unauthorized,
)
from adapter.auth.attributes import (
    RequestAttributes,
    RequestAttributesError,
    RequestPathError,
    check_request_attributes,
    decode_request_path,
    request_attributes,
)
from adapter.auth.authentication import AuthenticationFailure
from adapter.auth.authorization import Decision
from adapter.auth.seam import (
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
from adapter.auth.users import UserInfo
from adapter.http.handlers import ApiError
from adapter.http.keys import ROUTE_LABEL_KEY, USER_KEY
from adapter.http.responses import status_response, text_response, warning_header
from adapter.security.tls import peer_certificate_der

__all__ = [
    "Handler",
    "RequestMetrics",
    "authentication_and_authorization",
    "checked_path",
    "request_attributes_of",
    "request_metrics",
    "status_errors",
]

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_API_PREFIXES = ("/apis", "/api")


# --------------------------------------------------------------------------------------------
# Request metrics


@dataclass(frozen=True)
class RequestMetrics:
    requests: Counter
    duration: Histogram

    @classmethod
    def register(cls, registry: CollectorRegistry) -> RequestMetrics:
        return cls(
            requests=Counter("metricscale_http_requests_total",
                             "Requests served, by route, method and HTTP status code.",
                             ["route", "method", "code"], registry=registry),
            duration=Histogram("metricscale_http_request_duration_seconds",
                               "Time to answer a request, by route.", ["route"],
                               registry=registry,
                               buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5, 1, 2.5, 5, 10, 30)))


class _RequestSeries:
    """The request series' children, looked up once per label set and kept: a `labels()`
    call costs a lock, a tuple and a dict lookup on every request. As many entries as the
    registry keeps children anyway."""

    __slots__ = ("_counts", "_durations", "_metrics")

    def __init__(self, metrics: RequestMetrics) -> None:
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


def request_metrics(metrics: RequestMetrics) -> Middleware:
    """Counts and times every request by the `route` label its handler set ("other" if none);
    a 5xx is logged (a failing /readyz is expected while starting and stopping: not logged)."""
    series = _RequestSeries(metrics)

    @web.middleware
    async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        code = 500
        try:
            response = await handler(request)
            code = response.status
            return response
        except web.HTTPException as exc:
            code = exc.status
            raise
        finally:
            route = request.get(ROUTE_LABEL_KEY, "other")
            series.observe(route, request.method, code, time.perf_counter() - started)
            if code >= 500 and route != "health":
                logger.warning("%s %s -> %d", request.method, request.rel_url.raw_path, code)
            elif logger.isEnabledFor(logging.DEBUG):
                logger.debug("%s %s -> %d", request.method, request.rel_url.raw_path, code)

    return count


# --------------------------------------------------------------------------------------------
# Status errors


def _in_api(path: str) -> bool:
    return any(path == prefix or path.startswith(prefix + "/") for prefix in _API_PREFIXES)


@web.middleware
async def status_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """ApiError as its `Status`; the router's 404 and 405 as kube-apiserver answers them; any
    other failure as a 500 `Status` whose message points at the log."""
    try:
        return await handler(request)
    except ApiError as error:
        return status_response(error.body, headers=warning_header(error.warnings))
    except web.HTTPNotFound:
        request[ROUTE_LABEL_KEY] = "not_found"
        if _in_api(request.rel_url.raw_path):
            return status_response(route_not_found())
        return text_response("404 page not found\n", status=404)
    except web.HTTPMethodNotAllowed:
        if _in_api(request.rel_url.raw_path):
            return status_response(method_not_allowed())
        return text_response("405 method not allowed\n", status=405)
    except (web.HTTPException, asyncio.CancelledError):
        raise
    except Exception:
        logger.exception("unexpected error answering %s %s", request.method,
                         request.rel_url.raw_path)
        return status_response(internal_error(
            "an unexpected error occurred; see the adapter's log"))


# --------------------------------------------------------------------------------------------
# Authentication, path checks and authorization


def request_attributes_of(request: web.Request, *, build: bool) -> RequestAttributes | None:
    """The request's authorization attributes (None unless `build`: then only the checks that
    can refuse it run). Raises ApiError: 400 for a path that could be read two ways, 500 for
    one that cannot be authorized (a verb in the path with nothing after it)."""
    url = request.rel_url
    try:
        path = decode_request_path(url.raw_path)
    except RequestPathError as error:
        raise ApiError(bad_request(str(error))) from None
    try:
        if build:
            return request_attributes(method=request.method, path=path,
                                      query=tuple(url.query.items()))
        check_request_attributes(method=request.method, path=path)
    except RequestAttributesError as error:
        logger.warning("cannot authorize %s: %s", url.raw_path, error)
        raise ApiError(internal_error(AUTHORIZATION_FAILED_CAUSE)) from None
    return None


async def _authenticated(request: web.Request, authenticator: Authenticator) -> UserInfo:
    url = request.rel_url
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    incoming = IncomingRequest(
        method=request.method, raw_path=url.raw_path, raw_query=url.raw_query_string,
        headers=tuple((str(k), str(v)) for k, v in request.headers.items()),
        peer_certificate_der=peer_certificate_der(ssl_object))
    try:
        authenticated = await authenticator.authenticate(incoming)
    except AuthCheckUnavailable as error:
        logger.warning("authentication could not be completed: %s", error)
        raise ApiError(internal_error(AUTHENTICATION_FAILED_CAUSE)) from None
    if isinstance(authenticated, AuthenticationFailure):
        logger.info("401 for %s %s: %s", request.method, url.raw_path,
                    "; ".join(authenticated.errors))
        raise ApiError(unauthorized())
    return authenticated.user


async def _authorize(request: web.Request, authorizer: Authorizer, user: UserInfo,
                     attributes: RequestAttributes) -> None:
    try:
        decision = await authorizer.authorize(user, attributes)
    except AuthCheckUnavailable as error:
        logger.warning("authorization could not be completed: %s", error)
        raise ApiError(internal_error(AUTHORIZATION_FAILED_CAUSE)) from None
    if decision.error:
        logger.warning("authorization failed for %s: %s", request.rel_url.raw_path,
                       decision.error)
        raise ApiError(internal_error(AUTHORIZATION_FAILED_CAUSE))
    if decision.decision is not Decision.ALLOW:
        raise ApiError(forbidden_status(user=user, attributes=attributes,
                                        reason=decision.reason))


def authentication_and_authorization(*, authenticator: Authenticator,
                                     authorizer: Authorizer) -> Middleware:
    """Authentication, then the path checks, then authorization: all before the route runs."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        user = await _authenticated(request, authenticator)
        attributes = request_attributes_of(request, build=True)
        assert attributes is not None
        await _authorize(request, authorizer, user, attributes)
        request[USER_KEY] = user
        return await handler(request)

    return guard


@web.middleware
async def checked_path(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Without authentication and authorization: only the path checks, everyone the
    allow-all user."""
    request_attributes_of(request, build=False)
    request[USER_KEY] = ALLOW_ALL_USER
    return await handler(request)
