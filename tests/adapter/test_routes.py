"""Request paths: every route shape of contract §8.1 and §9, and the 400/404 shape errors."""

from __future__ import annotations

import urllib.parse

import pytest

from adapter.api.routes import (
    CustomMetricRoute,
    ExternalMetricRoute,
    GroupListRoute,
    GroupRoute,
    ResourceListRoute,
    Route,
    RouteRejection,
    parse_route,
)
from adapter.rules.resources import GroupResource
from metricscale.core.selectors import Selector, parse_selector

CUSTOM = "/apis/custom.metrics.k8s.io/v1beta2"
EXTERNAL = "/apis/external.metrics.k8s.io/v1beta1"
NOT_FOUND = RouteRejection(404, "NotFound", "the server could not find the requested resource")
INVALID_PATH = RouteRejection(400, "BadRequest", "invalid request path")
ALL_NAMESPACES = RouteRejection(
    400, "BadRequest", 'namespace "*" is not supported: request one namespace at a time')


def custom(path: str, query: str = "") -> Route | None:
    return parse_route(CUSTOM + path, query)


@pytest.mark.parametrize(("path", "route"), [
    ("/apis", GroupListRoute()),
    ("/apis/", GroupListRoute()),
    ("/apis/custom.metrics.k8s.io", GroupRoute("custom.metrics.k8s.io")),
    ("/apis/external.metrics.k8s.io/", GroupRoute("external.metrics.k8s.io")),
    ("/apis/custom.metrics.k8s.io/v1beta1", ResourceListRoute("custom.metrics.k8s.io",
                                                              "v1beta1")),
    ("/apis/custom.metrics.k8s.io/v1beta2/", ResourceListRoute("custom.metrics.k8s.io",
                                                               "v1beta2")),
    ("/apis/external.metrics.k8s.io/v1beta1", ResourceListRoute("external.metrics.k8s.io",
                                                                "v1beta1")),
    ("/apis/custom.metrics.k8s.io/v2", NOT_FOUND),
    ("/apis/external.metrics.k8s.io/v1beta2", NOT_FOUND),
    ("/apis/apps/v1", None),
    ("/api/v1", None),
    ("/healthz", None),
    ("relative", None),
])
def test_discovery_paths(path: str, route: Route | None) -> None:
    assert parse_route(path) == route


@pytest.mark.parametrize(("path", "expected"), [
    ("/namespaces/shop/pods/web-0/http_requests",
     CustomMetricRoute("v1beta2", GroupResource("pods"), "shop", "web-0", "http_requests",
                       Selector(), Selector())),
    ("/namespaces/shop/pods/*/http_requests",
     CustomMetricRoute("v1beta2", GroupResource("pods"), "shop", None, "http_requests",
                       Selector(), Selector())),
    ("/namespaces/shop/pods/%2A/http_requests",
     CustomMetricRoute("v1beta2", GroupResource("pods"), "shop", None, "http_requests",
                       Selector(), Selector())),
    ("/nodes/node-1/temperature",
     CustomMetricRoute("v1beta2", GroupResource("nodes"), None, "node-1", "temperature",
                       Selector(), Selector())),
    ("/nodes/*/temperature",
     CustomMetricRoute("v1beta2", GroupResource("nodes"), None, None, "temperature",
                       Selector(), Selector())),
    ("/namespaces/shop/metrics/queue_length",
     CustomMetricRoute("v1beta2", GroupResource("namespaces"), None, "shop", "queue_length",
                       Selector(), Selector(), namespace_metric=True)),
    ("/namespaces/*/metrics/queue_length",
     CustomMetricRoute("v1beta2", GroupResource("namespaces"), None, None, "queue_length",
                       Selector(), Selector(), namespace_metric=True)),
    ("/namespaces/shop/deployments.apps/web/requests_per_second",
     CustomMetricRoute("v1beta2", GroupResource("deployments", "apps"), "shop", "web",
                       "requests_per_second", Selector(), Selector())),
    ("/namespaces/shop/ingresses.networking.k8s.io/web/rps",
     CustomMetricRoute("v1beta2", GroupResource("ingresses", "networking.k8s.io"), "shop",
                       "web", "rps", Selector(), Selector())),
    ("/namespaces/shop/nodes/node-1/temperature",  # the HPA's namespaced form
     CustomMetricRoute("v1beta2", GroupResource("nodes"), "shop", "node-1", "temperature",
                       Selector(), Selector())),
    ("/clusterwidgets.example.com/w/m",
     CustomMetricRoute("v1beta2", GroupResource("clusterwidgets", "example.com"), None, "w",
                       "m", Selector(), Selector())),
    ("/namespaces/shop/pods/web-0/request_count:failure:rate1m",
     CustomMetricRoute("v1beta2", GroupResource("pods"), "shop", "web-0",
                       "request_count:failure:rate1m", Selector(), Selector())),
    ("/namespaces/shop/pods/web-0/a%7Cb.C-d",
     CustomMetricRoute("v1beta2", GroupResource("pods"), "shop", "web-0", "a|b.C-d",
                       Selector(), Selector())),
])
def test_custom_metric_route_shapes(path: str, expected: CustomMetricRoute) -> None:
    assert custom(path) == expected


@pytest.mark.parametrize(("path", "rejection"), [
    ("/blah", NOT_FOUND),
    ("/nodes/foo", NOT_FOUND),
    ("/namespaces/ns/pods/bar", NOT_FOUND),
    ("/namespaces/ns", NOT_FOUND),
    ("/namespaces/ns/metrics", INVALID_PATH),
    ("/namespaces/*/m", INVALID_PATH),
    ("/namespaces/*/pods/*/m", ALL_NAMESPACES),
    ("/namespaces/%2A/pods/x/m", ALL_NAMESPACES),
    ("/a/b/c/d", NOT_FOUND),
    ("/namespaces/a/b/c/d/e", NOT_FOUND),
    ("/namespaces/shop/pods/web-0/", NOT_FOUND),
    ("/namespaces/shop/pods//m", NOT_FOUND),
    ("/namespaces/shop/pods/a%2Fb/m", NOT_FOUND),
    ("/namespaces/shop/pods/web-0/a%2Fb", NOT_FOUND),
    ("/namespaces/shop/pods/web-0/a%25b", NOT_FOUND),
    ("/namespaces/shop/pods/web-0/a%3Fb", NOT_FOUND),
    ("/namespaces/shop/pods/web-0/..", NOT_FOUND),
    ("/namespaces/shop/pods/web-0/.", NOT_FOUND),
    ("/namespaces/%2E%2E/pods/web-0/m", NOT_FOUND),
    ("/namespaces/shop/pods/web-0/bad%zzescape", INVALID_PATH),
    ("/namespaces/shop/pods/web-0/%ff", INVALID_PATH),
    ("/.apps/x/m", NOT_FOUND),
])
def test_custom_shape_errors(path: str, rejection: RouteRejection) -> None:
    assert custom(path) == rejection


def test_selectors_are_parsed_from_the_query_string() -> None:
    route = custom("/namespaces/shop/pods/*/http_requests",
                   "labelSelector=app%3Dweb%2Ctier+in+%28cache%2Cweb%29"
                   "&metricLabelSelector=verb%3DGET&pretty=true")
    assert isinstance(route, CustomMetricRoute)
    assert route.label_selector == parse_selector("app=web,tier in (cache,web)")
    assert route.metric_selector == parse_selector("verb=GET")


def test_label_selector_is_ignored_for_named_objects() -> None:
    route = custom("/namespaces/shop/pods/web-0/m", "labelSelector=%21%21%21")
    assert isinstance(route, CustomMetricRoute) and route.label_selector == Selector()


def test_first_occurrence_of_a_parameter_wins() -> None:
    route = custom("/nodes/*/m", "labelSelector=a%3D1&labelSelector=b%3D2")
    assert isinstance(route, CustomMetricRoute)
    assert str(route.label_selector) == "a=1"


@pytest.mark.parametrize(("query", "message"), [
    ("labelSelector=a%3D%3D%3Db", "unable to parse requirement: found '=', expected: "
                                  "identifier"),
    ("metricLabelSelector=a+b", "unable to parse requirement: found 'b', expected: in, notin, "
                                "=, ==, !=, gt, lt"),
])
def test_bad_selectors_are_bad_requests_with_the_parser_text(query: str, message: str) -> None:
    assert custom("/namespaces/shop/pods/*/m", query) == RouteRejection(400, "BadRequest",
                                                                        message)


@pytest.mark.parametrize(("path", "query", "expected"), [
    (f"{EXTERNAL}/namespaces/default/queue_consumer_lag", "labelSelector=topic%3Dorders",
     ExternalMetricRoute("default", "queue_consumer_lag", parse_selector("topic=orders"))),
    (f"{EXTERNAL}/namespaces/default/pubsub.googleapis.com%7Csubscription%7Cnum", "",
     ExternalMetricRoute("default", "pubsub.googleapis.com|subscription|num", Selector())),
    (f"{EXTERNAL}/queue_consumer_lag", "", NOT_FOUND),
    (f"{EXTERNAL}/namespaces/default", "", NOT_FOUND),
    (f"{EXTERNAL}/namespaces/default/a/b", "", NOT_FOUND),
    (f"{EXTERNAL}/namespaces/*/m", "", ALL_NAMESPACES),
    (f"{EXTERNAL}/namespaces/default/a%2Fb", "", NOT_FOUND),
    (f"{EXTERNAL}/namespaces/default/m", "labelSelector=%3D",
     RouteRejection(400, "BadRequest", "found '=', expected: !, identifier, or "
                                       "'end of string'")),
])
def test_external_route(path: str, query: str, expected: Route) -> None:
    assert parse_route(path, query) == expected


def test_query_string_on_the_path_is_ignored() -> None:
    assert parse_route(CUSTOM + "?x=1") == ResourceListRoute("custom.metrics.k8s.io", "v1beta2")


@pytest.mark.parametrize(("resource", "name", "found"), [
    ("widgets.example.com", "[", False),  # custom resources: DNS-1123 subdomains
    ("widgets.example.com", "web.1", True),
    ("services", "web.1", False),  # DNS-1035 labels
    ("roles.rbac.authorization.k8s.io", "system:controller:x", True),  # path segments
    ("pods", "\ufffd", False),
])
def test_object_names_follow_their_kinds_rule(resource: str, name: str, found: bool) -> None:
    quoted = urllib.parse.quote(name, safe="")
    route = parse_route(f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop/{resource}/"
                        f"{quoted}/requests")
    if found:
        assert isinstance(route, CustomMetricRoute) and route.name == name
    else:
        assert isinstance(route, RouteRejection) and route.code == 404


def test_a_namespace_metric_is_served_only_under_metrics_as_the_readme_routes_table_says() -> None:
    assert custom("/namespaces/demo/http_requests_per_second") == INVALID_PATH
    assert custom("/namespaces/demo/metrics/http_requests_per_second") == CustomMetricRoute(
        "v1beta2", GroupResource("namespaces"), None, "demo", "http_requests_per_second",
        Selector(), Selector(), namespace_metric=True)
