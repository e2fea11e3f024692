"""The metrics client over a recording transport: exact paths, parameters, versions and errors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from autoscaler.kube.metrics_api import MetricsClient, MetricsError, choose_custom_metrics_version
from metricscale.kube.discovery import ResourceMapping
from metricscale.kube.errors import ErrorContext, KindNotFound, NotFound, ServerError


def group(preferred: str, *versions: str) -> dict[str, Any]:
    return {"name": "custom.metrics.k8s.io",
            "versions": [{"groupVersion": f"custom.metrics.k8s.io/{v}", "version": v}
                         for v in versions],
            "preferredVersion": {"groupVersion": f"custom.metrics.k8s.io/{preferred}",
                                 "version": preferred}}


def v1beta2_list(*names: str) -> dict[str, Any]:
    return {"kind": "MetricValueList", "apiVersion": "custom.metrics.k8s.io/v1beta2",
            "metadata": {}, "items": [
                {"describedObject": {"kind": "Pod", "namespace": "shop", "name": n,
                                     "apiVersion": "v1"},
                 "metric": {"name": "http_requests"}, "timestamp": "2024-05-01T12:00:00Z",
                 "windowSeconds": 60, "value": "1500m"} for n in names]}


class Recorder:
    """A MetricsTransport that answers from a table and records every request."""

    def __init__(self, groups: list[dict[str, Any]] | None = None) -> None:
        self.groups = groups if groups is not None else [group("v1beta2", "v1beta2", "v1beta1")]
        self.answers: dict[str, Any] = {}
        self.requests: list[tuple[str, list[tuple[str, str]], ErrorContext | None]] = []
        self.discoveries = 0
        self.kinds = {("apps", "Deployment"): ResourceMapping(
            "apps", "v1", "deployments", "Deployment", namespaced=True, has_scale=True)}

    async def get_json(self, path: str, *, query: Sequence[tuple[str, str]] = (),
                       operation: str, resource: str,
                       context: ErrorContext | None = None) -> Any:
        self.requests.append((path, list(query), context))
        answer = self.answers.get(path)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def server_groups(self) -> list[Mapping[str, Any]]:
        self.discoveries += 1
        return list(self.groups)

    async def resolve_kind(self, *, group: str, kind: str) -> list[ResourceMapping]:
        if (group, kind) not in self.kinds:
            raise KindNotFound(f'no matches for kind "{kind}" in group "{group}"')
        return [self.kinds[(group, kind)]]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


PODS = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop/pods/*/http_requests"


async def test_pods_metric_sends_both_selectors_in_go_string_form() -> None:
    transport = Recorder()
    transport.answers[PODS] = v1beta2_list("web-1")
    client = MetricsClient(transport)
    body = await client.get_pods_metric(
        namespace="shop", metric_name="http_requests", pod_selector="tier in (b,a),app=web",
        metric_selector={"matchLabels": {"verb": "GET"},
                         "matchExpressions": [{"key": "code", "operator": "NotIn",
                                               "values": ["500", "404"]}]})
    assert body == v1beta2_list("web-1")
    assert transport.requests == [(PODS, [
        ("labelSelector", "app=web,tier in (a,b)"),
        ("metricLabelSelector", "code notin (404,500),verb=GET"),
    ], ErrorContext("custom.metrics.k8s.io", "pods", "*"))]


@pytest.mark.parametrize("metric_selector", [None, {}], ids=["nil", "empty"])
async def test_empty_selectors_send_no_parameter(metric_selector: dict[str, Any] | None) -> None:
    transport = Recorder()
    transport.answers[PODS] = v1beta2_list("web-1")
    await MetricsClient(transport).get_pods_metric(
        namespace="shop", metric_name="http_requests", pod_selector="",
        metric_selector=metric_selector)
    assert transport.requests[0][1] == []


async def test_v1beta1_only_discovery_uses_v1beta1_and_converts_the_body() -> None:
    transport = Recorder([group("v1beta1", "v1beta1")])
    path = "/apis/custom.metrics.k8s.io/v1beta1/namespaces/shop/pods/*/http_requests"
    transport.answers[path] = {
        "kind": "MetricValueList", "apiVersion": "custom.metrics.k8s.io/v1beta1", "metadata": {},
        "items": [{"describedObject": {"kind": "Pod", "namespace": "shop", "name": "web-1",
                                       "apiVersion": "v1"},
                   "metricName": "http_requests", "timestamp": "2024-05-01T12:00:00Z",
                   "window": 60, "value": "1500m", "selector": {"matchLabels": {"verb": "GET"}}},
                  {"describedObject": {"kind": "Pod", "namespace": "shop", "name": "web-2",
                                       "apiVersion": "v1"},
                   "metricName": "http_requests", "timestamp": "2024-05-01T12:00:00Z",
                   "value": "2", "selector": None}]}
    body = await MetricsClient(transport).get_pods_metric(
        namespace="shop", metric_name="http_requests", pod_selector="app=web",
        metric_selector=None)
    assert transport.requests[0][0] == path
    assert body == {"kind": "MetricValueList", "apiVersion": "custom.metrics.k8s.io/v1beta2",
                    "metadata": {}, "items": [
        {"describedObject": {"kind": "Pod", "namespace": "shop", "name": "web-1",
                             "apiVersion": "v1"},
         "metric": {"name": "http_requests", "selector": {"matchLabels": {"verb": "GET"}}},
         "timestamp": "2024-05-01T12:00:00Z", "windowSeconds": 60, "value": "1500m"},
        {"describedObject": {"kind": "Pod", "namespace": "shop", "name": "web-2",
                             "apiVersion": "v1"},
         "metric": {"name": "http_requests"}, "timestamp": "2024-05-01T12:00:00Z",
         "value": "2"}]}


@pytest.mark.parametrize(("groups", "version"), [
    ([group("v1beta2", "v1beta2", "v1beta1")], "v1beta2"),
    ([group("v1beta1", "v1beta2", "v1beta1")], "v1beta1"),
    ([group("v2", "v2", "v1beta1", "v1beta2")], "v1beta1"),
])
def test_version_choice_prefers_the_servers_preferred_known_version(
        groups: list[dict[str, Any]], version: str) -> None:
    assert choose_custom_metrics_version(groups) == version


@pytest.mark.parametrize(("groups", "message"), [
    ([], "unable to fetch metrics from custom metrics API: no custom metrics API "
         "(custom.metrics.k8s.io) registered"),
    ([group("v3", "v3")], "unable to fetch metrics from custom metrics API: no known available "
                          "metric versions found"),
])
def test_version_choice_errors_have_upstreams_text(groups: list[dict[str, Any]],
                                                   message: str) -> None:
    with pytest.raises(MetricsError) as caught:
        choose_custom_metrics_version(groups)
    assert str(caught.value) == message


async def test_version_is_cached_for_one_sync_period_then_rediscovered() -> None:
    transport, clock = Recorder(), Clock()
    transport.answers[PODS] = v1beta2_list("web-1")
    client = MetricsClient(transport, version_ttl=15.0, clock=clock)
    for _ in range(3):
        await client.get_pods_metric(namespace="shop", metric_name="http_requests",
                                     pod_selector="app=web", metric_selector=None)
    assert transport.discoveries == 1
    clock.now += 15.0
    transport.groups = [group("v1beta1", "v1beta1")]
    assert await client.custom_metrics_version() == "v1beta1"
    assert transport.discoveries == 2


async def test_object_metric_path_uses_the_rest_mapped_group_resource() -> None:
    transport = Recorder()
    path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop/deployments.apps/web/rps"
    transport.answers[path] = v1beta2_list("web")
    await MetricsClient(transport).get_object_metric(
        namespace="shop", metric_name="rps",
        described_object={"apiVersion": "apps/v1beta1", "kind": "Deployment", "name": "web"},
        metric_selector={"matchLabels": {"verb": "GET"}})
    assert transport.requests == [(path, [("metricLabelSelector", "verb=GET")],
                                   ErrorContext("custom.metrics.k8s.io", "deployments.apps",
                                                "web"))]


async def test_namespace_object_metric_is_the_namespace_metrics_path() -> None:
    transport = Recorder()
    path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop/metrics/queue_length"
    transport.answers[path] = v1beta2_list("shop")
    await MetricsClient(transport).get_object_metric(
        namespace="shop", metric_name="queue_length",
        described_object={"apiVersion": "v1", "kind": "Namespace", "name": "elsewhere"},
        metric_selector=None)
    assert transport.requests[0][:2] == (path, [])


async def test_object_metric_needs_exactly_one_item() -> None:
    transport = Recorder()
    path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop/deployments.apps/web/rps"
    transport.answers[path] = v1beta2_list("a", "b")
    with pytest.raises(MetricsError) as caught:
        await MetricsClient(transport).get_object_metric(
            namespace="shop", metric_name="rps",
            described_object={"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            metric_selector=None)
    assert str(caught.value) == ("unable to fetch metrics from custom metrics API: the custom "
                                 "metrics API server returned 2 results when we asked for "
                                 "exactly one")


async def test_object_metric_of_an_unknown_kind_names_the_group_kind() -> None:
    with pytest.raises(MetricsError) as caught:
        await MetricsClient(Recorder()).get_object_metric(
            namespace="shop", metric_name="rps",
            described_object={"apiVersion": "example.com/v1", "kind": "Queue", "name": "q"},
            metric_selector=None)
    assert str(caught.value) == (
        "unable to fetch metrics from custom metrics API: unable to map kind Queue.example.com "
        'to resource: no matches for kind "Queue" in group "example.com"')


async def test_external_metric_name_is_lower_cased_and_selector_is_label_selector() -> None:
    transport = Recorder()
    path = "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/queue_messages_ready"
    transport.answers[path] = {"kind": "ExternalMetricValueList",
                               "apiVersion": "external.metrics.k8s.io/v1beta1", "metadata": {},
                               "items": [{"metricName": "queue_messages_ready",
                                          "metricLabels": {}, "timestamp": "t", "value": "3"}]}
    body = await MetricsClient(transport).get_external_metric(
        namespace="shop", metric_name="Queue_Messages_Ready",
        metric_selector={"matchLabels": {"queue": "orders"}})
    assert body["items"][0]["value"] == "3"
    assert transport.requests == [(path, [("labelSelector", "queue=orders")],
                                   ErrorContext("external.metrics.k8s.io",
                                                "queue_messages_ready"))]


async def test_resource_metrics_list_pods_by_the_scale_selector() -> None:
    transport = Recorder()
    path = "/apis/metrics.k8s.io/v1beta1/namespaces/shop/pods"
    transport.answers[path] = {"kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1",
                               "metadata": {}, "items": [{"metadata": {"name": "web-1"}}]}
    body = await MetricsClient(transport).get_resource_metrics(namespace="shop",
                                                               pod_selector="app=web")
    assert body["kind"] == "PodMetricsList"
    assert transport.requests[0][:2] == (path, [("labelSelector", "app=web")])


@pytest.mark.parametrize(("call", "message"), [
    ("resource", "no metrics returned from resource metrics API"),
    ("pods", "no metrics returned from custom metrics API"),
    ("external", "no metrics returned from external metrics API"),
])
async def test_empty_lists_are_upstreams_errors(call: str, message: str) -> None:
    transport = Recorder()
    transport.answers["/apis/metrics.k8s.io/v1beta1/namespaces/shop/pods"] = {"items": []}
    transport.answers[PODS] = v1beta2_list()
    transport.answers["/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/qps"] = {
        "items": []}
    client = MetricsClient(transport)
    with pytest.raises(MetricsError) as caught:
        if call == "resource":
            await client.get_resource_metrics(namespace="shop", pod_selector="app=web")
        elif call == "pods":
            await client.get_pods_metric(namespace="shop", metric_name="http_requests",
                                         pod_selector="app=web", metric_selector=None)
        else:
            await client.get_external_metric(namespace="shop", metric_name="qps",
                                             metric_selector=None)
    assert str(caught.value) == message


async def test_api_errors_are_wrapped_with_upstreams_prefix() -> None:
    transport = Recorder()
    transport.answers[PODS] = NotFound(
        "the server could not find the metric http_requests for pods", status=404)
    transport.answers["/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/qps"] = \
        ServerError("Internal error occurred: unable to fetch metrics", status=500)
    client = MetricsClient(transport)
    with pytest.raises(MetricsError) as pods:
        await client.get_pods_metric(namespace="shop", metric_name="http_requests",
                                     pod_selector="app=web", metric_selector=None)
    assert str(pods.value) == ("unable to fetch metrics from custom metrics API: the server "
                               "could not find the metric http_requests for pods")
    assert isinstance(pods.value.cause, NotFound)
    with pytest.raises(MetricsError) as external:
        await client.get_external_metric(namespace="shop", metric_name="qps",
                                         metric_selector=None)
    assert str(external.value) == ("unable to fetch metrics from external metrics API: "
                                   "Internal error occurred: unable to fetch metrics")


async def test_invalid_metric_selector_fails_before_any_request() -> None:
    transport = Recorder()
    with pytest.raises(MetricsError, match="is not a valid label selector operator"):
        await MetricsClient(transport).get_external_metric(
            namespace="shop", metric_name="qps",
            metric_selector={"matchExpressions": [{"key": "a", "operator": "Near"}]})
    assert transport.requests == []


async def test_a_body_that_is_not_a_metric_value_list_is_an_error() -> None:
    transport = Recorder()
    transport.answers[PODS] = {"kind": "Status", "apiVersion": "v1"}
    with pytest.raises(MetricsError, match="didn't return MetricValueList"):
        await MetricsClient(transport).get_pods_metric(
            namespace="shop", metric_name="http_requests", pod_selector="app=web",
            metric_selector=None)


async def test_metric_names_are_escaped_like_go_paths() -> None:
    transport = Recorder()
    path = ("/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop/pods/*/"
            "pubsub.googleapis.com%7Csubscription:rate")
    transport.answers[path] = v1beta2_list("web-1")
    await MetricsClient(transport).get_pods_metric(
        namespace="shop", metric_name="pubsub.googleapis.com|subscription:rate",
        pod_selector="app=web", metric_selector=None)
    assert transport.requests[0][0] == path
