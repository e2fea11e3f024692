"""The metrics APIs' handler: `/apis/...` parsed into a route, answered from one snapshot of
the configuration in use, or forwarded to the delegate adapter; `/api/...` is never ours."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from adapter.api.delegated import delegate_unavailable
from adapter.api.groups import CUSTOM_METRICS_GROUP, EXTERNAL_METRICS_GROUP
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
from adapter.api.tables import IncludeObjectError, metrics_table, parse_include_object
from adapter.api.wire import bad_request, method_not_allowed, route_not_found, status_body
from adapter.http.delegate import DelegateUnavailable
from adapter.http.discovery import group_answer, group_list_answer, resource_list_answer
from adapter.http.handlers import Answer, ApiError
from adapter.http.keys import (
    DELEGATE_KEY,
    ROUTE_LABEL_KEY,
    SNAPSHOT_KEY,
    SNAPSHOTS_KEY,
    USER_KEY,
)
from adapter.http.middleware import Handler
from adapter.http.responses import json_response, require_json, table_version, warning_header
from adapter.http.snapshots import ConfigSnapshot

__all__ = ["api_handler", "api_not_found"]

_ROUTE_MEMO = 1024


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


def api_handler() -> Handler:
    """The handler of `/apis` and everything under it (one route memo per application)."""
    routes = _ParsedRoutes()

    async def api(request: web.Request) -> web.StreamResponse:
        # The one read of the configuration in use: everything below answers from this
        # snapshot, and a reload closes its clients only once no request holds it.
        snapshot = request.app[SNAPSHOTS_KEY].current
        snapshot.requests += 1
        try:
            request[SNAPSHOT_KEY] = snapshot
            return await _api_answer(request, snapshot, routes)
        finally:
            snapshot.requests -= 1

    return api


async def api_not_found(request: web.Request) -> web.StreamResponse:
    request[ROUTE_LABEL_KEY] = "not_found"
    raise ApiError(route_not_found())


async def _api_answer(request: web.Request, snapshot: ConfigSnapshot,
                      routes: _ParsedRoutes) -> web.StreamResponse:
    url = request.rel_url
    request[ROUTE_LABEL_KEY] = "api"
    groups = snapshot.groups
    route = routes.parse(url.raw_path, url.raw_query_string, groups)
    accept = request.headers.get("Accept")
    match route:
        case None:
            raise ApiError(route_not_found())
        case RouteRejection():
            raise ApiError(_rejection(route))
        case _ if request.method != "GET":
            raise ApiError(method_not_allowed())
        case CustomMetricRoute() | ExternalMetricRoute():
            return await _metric_answer(request, snapshot, route, accept)
        case ResourceMetricsRoute():
            return await _resource_metrics_answer(request, snapshot, route, accept)
        case GroupListRoute():
            return await group_list_answer(request, groups=groups, accept=accept)
        case GroupRoute(group=group):
            require_json(accept)
            return group_answer(request, group=group, groups=groups)
        case ResourceListRoute(group=group, version=version):
            require_json(accept)
            return await resource_list_answer(request, group=group, version=version)
        case _:  # pragma: no cover - parse_route returns nothing else
            raise ApiError(route_not_found())


def _rejection(route: RouteRejection) -> dict[str, Any]:
    if route.code == 404:
        return route_not_found()
    return status_body(code=route.code, reason=route.reason, message=route.message)


def _answered(answer: Answer) -> web.StreamResponse:
    return json_response(answer.body, headers=warning_header(answer.warnings))


async def _metric_answer(request: web.Request, snapshot: ConfigSnapshot,
                         route: CustomMetricRoute | ExternalMetricRoute,
                         accept: str | None) -> web.StreamResponse:
    # Before our content negotiation: the delegate negotiates its own answer.
    delegated = _delegated_group(request, snapshot, route)
    if delegated is not None:
        return await _forward(request, group=delegated, metric=route.metric)
    require_json(accept)
    service = snapshot.service
    if isinstance(route, CustomMetricRoute):
        request[ROUTE_LABEL_KEY] = "custom_metric"
        return _answered(await service.custom_metric(route))
    request[ROUTE_LABEL_KEY] = "external_metric"
    return _answered(await service.external_metric(route))


async def _resource_metrics_answer(request: web.Request, snapshot: ConfigSnapshot,
                                   route: ResourceMetricsRoute,
                                   accept: str | None) -> web.StreamResponse:
    """PodMetrics/NodeMetrics as JSON, or as metrics-server's Table when `Accept` asks for
    one (`kubectl get podmetrics`)."""
    table = table_version(accept)
    if table is None:
        require_json(accept)
    request[ROUTE_LABEL_KEY] = "resource_metrics"
    usage = snapshot.usage
    assert usage is not None  # the group is served only with resourceRules
    answer = await usage.answer(route)
    if table is None:
        return _answered(answer)
    try:
        include_object = parse_include_object(request.rel_url.query.get("includeObject"))
    except IncludeObjectError as error:
        raise ApiError(bad_request(str(error))) from None
    body = answer.body if isinstance(answer.body, Mapping) else _decoded(answer.body)
    return json_response(metrics_table(body, version=table, include_object=include_object),
                         headers=warning_header(answer.warnings))


def _decoded(body: bytes) -> Mapping[str, Any]:
    decoded: Mapping[str, Any] = json.loads(body)
    return decoded


def _delegated_group(request: web.Request, snapshot: ConfigSnapshot,
                     route: CustomMetricRoute | ExternalMetricRoute) -> str | None:
    """The group whose delegate answers this request: our rules do not serve its metric."""
    delegate = request.app.get(DELEGATE_KEY)
    if delegate is None:
        return None
    service = snapshot.service
    if isinstance(route, ExternalMetricRoute):
        group, ours = EXTERNAL_METRICS_GROUP, service.serves_external_metric(route)
    else:
        group, ours = CUSTOM_METRICS_GROUP, service.serves_custom_metric(route)
    return group if delegate.delegates(group) and not ours else None


async def _forward(request: web.Request, *, group: str, metric: str) -> web.StreamResponse:
    """The delegate's answer, as it is (status, body, Content-Type, Warning, Retry-After)."""
    request[ROUTE_LABEL_KEY] = "delegated_metric"
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
