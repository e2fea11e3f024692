"""Response bodies: the contract's JSON examples, reproduced from typed values."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from decimal import ROUND_DOWN, Decimal, localcontext

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapter.api.wire import (
    AGGREGATED_DISCOVERY_CONTENT_TYPES,
    CustomMetricValue,
    ExternalMetricValue,
    NonFiniteSampleError,
    ObjectReference,
    _exact_sample_to_quantity,
    bad_request,
    described_object,
    encode_object_metric_values,
    format_timestamp,
    internal_error,
    method_not_allowed,
    metric_not_found,
    not_acceptable,
    render_aggregated_discovery,
    render_api_group,
    render_api_group_list,
    render_custom_resource_list,
    render_external_metric_value_list,
    render_external_resource_list,
    render_metric_value_list,
    route_not_found,
    sample_to_quantity,
    service_unavailable,
    unauthorized,
)
from adapter.rules.resources import CustomMetricKey, GroupResource, ResourceInfo
from metricscale.core.quantity import parse_quantity
from metricscale.core.selectors import label_selector_json, parse_selector

NOON = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
POD = ResourceInfo("pods", "pod", "Pod", "", "v1", True)
DEPLOYMENT = ResourceInfo("deployments", "deployment", "Deployment", "apps", "v1", True)
NAMESPACE = ResourceInfo("namespaces", "namespace", "Namespace", "", "v1", False)
NODE = ResourceInfo("nodes", "node", "Node", "", "v1", False)


def same_json(rendered: object, example: str) -> None:
    """Compare as parsed JSON, after a real round trip through the encoder."""
    assert json.loads(json.dumps(rendered)) == json.loads(example)


# --- discovery (contract §5) ----------------------------------------------------------------------

CUSTOM_LIST = """{
  "kind": "APIResourceList",
  "apiVersion": "v1",
  "groupVersion": "custom.metrics.k8s.io/v1beta2",
  "resources": [
    {"name": "pods/http_requests", "singularName": "", "namespaced": true, "kind": "MetricValueList", "verbs": ["get"]},
    {"name": "deployments.apps/requests_per_second", "singularName": "", "namespaced": true, "kind": "MetricValueList", "verbs": ["get"]},
    {"name": "namespaces/queue_length", "singularName": "", "namespaced": false, "kind": "MetricValueList", "verbs": ["get"]},
    {"name": "nodes/temperature", "singularName": "", "namespaced": false, "kind": "MetricValueList", "verbs": ["get"]}
  ]
}"""  # noqa: E501
CUSTOM_KEYS = [
    CustomMetricKey(GroupResource("pods"), True, "http_requests"),
    CustomMetricKey(GroupResource("deployments", "apps"), True, "requests_per_second"),
    CustomMetricKey(GroupResource("namespaces"), False, "queue_length"),
    CustomMetricKey(GroupResource("nodes"), False, "temperature"),
]


def test_custom_resource_list_matches_the_contract() -> None:
    same_json(render_custom_resource_list(version="v1beta2", metrics=CUSTOM_KEYS), CUSTOM_LIST)


def test_external_resource_list_matches_the_contract() -> None:
    same_json(render_external_resource_list(metrics=["queue_messages_ready"]), """{
  "kind": "APIResourceList",
  "apiVersion": "v1",
  "groupVersion": "external.metrics.k8s.io/v1beta1",
  "resources": [
    {"name": "queue_messages_ready", "singularName": "", "namespaced": true, "kind": "ExternalMetricValueList", "verbs": ["get"]}
  ]
}""")  # noqa: E501


def test_empty_lists_publish_the_placeholders_never_an_empty_list() -> None:
    custom = render_custom_resource_list(version="v1beta1", metrics=[])
    external = render_external_resource_list(metrics=[])
    assert [(r["name"], r["namespaced"]) for r in custom["resources"]] == [
        ("/custommetrics", False)]
    assert [(r["name"], r["namespaced"]) for r in external["resources"]] == [
        ("externalmetrics", True)]


def test_one_parent_never_has_two_scopes() -> None:
    rendered = render_custom_resource_list(version="v1beta1", metrics=[
        CustomMetricKey(GroupResource("widgets"), True, "a"),
        CustomMetricKey(GroupResource("widgets"), False, "b"),
        CustomMetricKey(GroupResource("widgets"), True, "c"),
    ])
    assert [(r["name"], r["namespaced"]) for r in rendered["resources"]] == [
        ("widgets/a", True), ("widgets/c", True)]


def test_api_group_and_group_list_match_the_contract() -> None:
    same_json(render_api_group(group="custom.metrics.k8s.io", versions=["v1beta2", "v1beta1"]),
              """{"kind":"APIGroup","apiVersion":"v1","name":"custom.metrics.k8s.io",
 "versions":[{"groupVersion":"custom.metrics.k8s.io/v1beta2","version":"v1beta2"},
             {"groupVersion":"custom.metrics.k8s.io/v1beta1","version":"v1beta1"}],
 "preferredVersion":{"groupVersion":"custom.metrics.k8s.io/v1beta2","version":"v1beta2"}}""")
    same_json(render_api_group_list([("custom.metrics.k8s.io", ["v1beta2", "v1beta1"]),
                                     ("external.metrics.k8s.io", ["v1beta1"])]),
              """{"kind":"APIGroupList","apiVersion":"v1","groups":[
  {"name":"custom.metrics.k8s.io",
   "versions":[{"groupVersion":"custom.metrics.k8s.io/v1beta2","version":"v1beta2"},
               {"groupVersion":"custom.metrics.k8s.io/v1beta1","version":"v1beta1"}],
   "preferredVersion":{"groupVersion":"custom.metrics.k8s.io/v1beta2","version":"v1beta2"}},
  {"name":"external.metrics.k8s.io",
   "versions":[{"groupVersion":"external.metrics.k8s.io/v1beta1","version":"v1beta1"}],
   "preferredVersion":{"groupVersion":"external.metrics.k8s.io/v1beta1","version":"v1beta1"}}]}""")


def test_aggregated_discovery_matches_the_contract() -> None:
    keys = [CustomMetricKey(GroupResource("pods"), True, "http_requests"),
            CustomMetricKey(GroupResource("namespaces"), False, "queue_length")]
    custom = {version: render_custom_resource_list(version=version, metrics=keys)
              for version in ("v1beta2", "v1beta1")}
    external = render_external_resource_list(metrics=["queue_messages_ready"])
    rendered = render_aggregated_discovery([
        ("custom.metrics.k8s.io", [("v1beta2", custom["v1beta2"]),
                                   ("v1beta1", custom["v1beta1"])]),
        ("external.metrics.k8s.io", [("v1beta1", external)]),
    ])
    custom_resources = """[
            {
              "resource": "pods",
              "responseKind": {"group": "", "version": "", "kind": ""},
              "scope": "Namespaced",
              "singularResource": "",
              "verbs": [],
              "subresources": [
                {"subresource": "http_requests", "responseKind": {"group": "", "version": "", "kind": "MetricValueList"}, "verbs": ["get"]}
              ]
            },
            {
              "resource": "namespaces",
              "responseKind": {"group": "", "version": "", "kind": ""},
              "scope": "Cluster",
              "singularResource": "",
              "verbs": [],
              "subresources": [
                {"subresource": "queue_length", "responseKind": {"group": "", "version": "", "kind": "MetricValueList"}, "verbs": ["get"]}
              ]
            }
          ]"""  # noqa: E501
    same_json(rendered, """{
  "kind": "APIGroupDiscoveryList",
  "apiVersion": "apidiscovery.k8s.io/v2",
  "metadata": {},
  "items": [
    {
      "metadata": {"name": "custom.metrics.k8s.io", "creationTimestamp": null},
      "versions": [
        {"version": "v1beta2", "resources": %s, "freshness": "Current"},
        {"version": "v1beta1", "resources": %s, "freshness": "Current"}
      ]
    },
    {
      "metadata": {"name": "external.metrics.k8s.io", "creationTimestamp": null},
      "versions": [
        {
          "version": "v1beta1",
          "resources": [
            {"resource": "queue_messages_ready", "responseKind": {"group": "", "version": "", "kind": "ExternalMetricValueList"},
             "scope": "Namespaced", "singularResource": "", "verbs": ["get"]}
          ],
          "freshness": "Current"
        }
      ]
    }
  ]
}""" % (custom_resources, custom_resources))  # noqa: E501, UP031
    assert AGGREGATED_DISCOVERY_CONTENT_TYPES["v2"] == \
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


def test_aggregated_discovery_v2beta1_differs_only_in_api_version() -> None:
    rendered = render_aggregated_discovery([], version="v2beta1")
    assert rendered["apiVersion"] == "apidiscovery.k8s.io/v2beta1"


# --- metric values (contract §8.3, §9) -----------------------------------------------------------


def pod_value(name: str, value: str, *, selector: str = "") -> CustomMetricValue:
    return CustomMetricValue(
        described_object=described_object(POD, name=name, namespace="shop"),
        metric="http_requests", timestamp=NOON, value=value, window_seconds=60,
        selector=label_selector_json(parse_selector(selector)) if selector else None)


def test_v1beta1_metric_value_list_matches_the_contract() -> None:
    rendered = render_metric_value_list(version="v1beta1", items=[
        pod_value("web-7c9d5-abcde", sample_to_quantity("1.5")),
        pod_value("web-7c9d5-fghij", sample_to_quantity("2")),
    ])
    same_json(rendered, """{
  "kind": "MetricValueList",
  "apiVersion": "custom.metrics.k8s.io/v1beta1",
  "metadata": {},
  "items": [
    {
      "describedObject": {"kind": "Pod", "namespace": "shop", "name": "web-7c9d5-abcde", "apiVersion": "v1"},
      "metricName": "http_requests",
      "timestamp": "2024-05-01T12:00:00Z",
      "window": 60,
      "value": "1500m",
      "selector": null
    },
    {
      "describedObject": {"kind": "Pod", "namespace": "shop", "name": "web-7c9d5-fghij", "apiVersion": "v1"},
      "metricName": "http_requests",
      "timestamp": "2024-05-01T12:00:00Z",
      "window": 60,
      "value": "2",
      "selector": null
    }
  ]
}""")  # noqa: E501


def test_v1beta2_metric_value_list_echoes_the_metric_selector() -> None:
    rendered = render_metric_value_list(version="v1beta2", items=[
        pod_value("web-7c9d5-abcde", sample_to_quantity("1.5"), selector="verb=GET")])
    same_json(rendered, """{
  "kind": "MetricValueList",
  "apiVersion": "custom.metrics.k8s.io/v1beta2",
  "metadata": {},
  "items": [
    {
      "describedObject": {"kind": "Pod", "namespace": "shop", "name": "web-7c9d5-abcde", "apiVersion": "v1"},
      "metric": {"name": "http_requests", "selector": {"matchLabels": {"verb": "GET"}}},
      "timestamp": "2024-05-01T12:00:00Z",
      "windowSeconds": 60,
      "value": "1500m"
    }
  ]
}""")  # noqa: E501


def test_object_namespace_and_cluster_scoped_items_match_the_contract() -> None:
    deployment = CustomMetricValue(described_object(DEPLOYMENT, name="web", namespace="shop"),
                                   "requests_per_second", NOON, sample_to_quantity("250"))
    same_json(render_metric_value_list(version="v1beta2", items=[deployment]),
              """{"kind":"MetricValueList","apiVersion":"custom.metrics.k8s.io/v1beta2","metadata":{},
 "items":[{"describedObject":{"kind":"Deployment","namespace":"shop","name":"web","apiVersion":"apps/v1"},
           "metric":{"name":"requests_per_second","selector":null},
           "timestamp":"2024-05-01T12:00:00Z","value":"250"}]}""")
    namespace = CustomMetricValue(described_object(NAMESPACE, name="shop", namespace="shop"),
                                  "queue_length", NOON, sample_to_quantity("42"))
    same_json(render_metric_value_list(version="v1beta1", items=[namespace]),
              """{"kind":"MetricValueList","apiVersion":"custom.metrics.k8s.io/v1beta1","metadata":{},
 "items":[{"describedObject":{"kind":"Namespace","name":"shop","apiVersion":"v1"},
           "metricName":"queue_length","timestamp":"2024-05-01T12:00:00Z","value":"42","selector":null}]}""")
    nodes = [CustomMetricValue(described_object(NODE, name=name, namespace="ignored"),
                               "temperature", NOON, sample_to_quantity(value))
             for name, value in (("node-1", "61.5"), ("node-2", "58"))]
    same_json(render_metric_value_list(version="v1beta2", items=nodes),
              """{"kind":"MetricValueList","apiVersion":"custom.metrics.k8s.io/v1beta2","metadata":{},
 "items":[{"describedObject":{"kind":"Node","name":"node-1","apiVersion":"v1"},
           "metric":{"name":"temperature","selector":null},"timestamp":"2024-05-01T12:00:00Z","value":"61500m"},
          {"describedObject":{"kind":"Node","name":"node-2","apiVersion":"v1"},
           "metric":{"name":"temperature","selector":null},"timestamp":"2024-05-01T12:00:00Z","value":"58"}]}""")


def test_empty_metric_value_list_has_an_empty_items_array() -> None:
    assert render_metric_value_list(version="v1beta1", items=[])["items"] == []


def test_external_metric_value_list_matches_the_contract() -> None:
    rendered = render_external_metric_value_list([
        ExternalMetricValue("queue_messages_ready", {"queue": "orders", "vhost": "/"},
                            Decimal("1714564800.25"), sample_to_quantity("1200"), 60),
        ExternalMetricValue("queue_messages_ready", {"queue": "orders-retry", "vhost": "/"},
                            NOON, sample_to_quantity("35")),
    ])
    same_json(rendered, """{
  "kind": "ExternalMetricValueList",
  "apiVersion": "external.metrics.k8s.io/v1beta1",
  "metadata": {},
  "items": [
    {
      "metricName": "queue_messages_ready",
      "metricLabels": {"queue": "orders", "vhost": "/"},
      "timestamp": "2024-05-01T12:00:00Z",
      "window": 60,
      "value": "1200"
    },
    {
      "metricName": "queue_messages_ready",
      "metricLabels": {"queue": "orders-retry", "vhost": "/"},
      "timestamp": "2024-05-01T12:00:00Z",
      "value": "35"
    }
  ]
}""")


def test_external_item_without_labels_sends_an_empty_object() -> None:
    (item,) = render_external_metric_value_list(
        [ExternalMetricValue("m", {}, NOON, "1")])["items"]
    assert item["metricLabels"] == {}


def test_object_reference_omits_empty_fields_in_go_order() -> None:
    assert list(ObjectReference("Pod", "a", "v1", "ns").to_json()) == [
        "kind", "namespace", "name", "apiVersion"]
    assert ObjectReference("Node", "n", "v1").to_json() == {"kind": "Node", "name": "n",
                                                            "apiVersion": "v1"}


# --- quantities and timestamps --------------------------------------------------------------------


@pytest.mark.parametrize(("sample", "quantity"), [
    ("0.5", "500m"), ("1.5", "1500m"), ("0.1", "100m"), ("0.066", "66m"), ("1", "1"),
    ("10", "10"), ("2000", "2k"), ("1234.567", "1234567m"), ("1200000", "1200k"),
    ("3000000", "3M"), ("-0.25", "-250m"), ("1048576", "1048576"),
    ("0.57", "570m"),
    ("1.001", "1001m"),  # float64 would give 1000m (int64(1.001 * 1000) is 1000)
    ("0.30000000000000004", "300m"),
    ("0.0005", "0"),  # below a milli-unit, as upstream's int64(v*1000)
    ("-0.0015", "-1m"),  # truncation toward zero
    ("1e+06", "1M"), ("1.5e-3", "1m"), ("2.5E2", "250"),
    ("NaN", "0"), ("-0", "0"),
    ("1e30", "9223372036854775807"),
])
def test_sample_values_become_canonical_quantities(sample: str, quantity: str) -> None:
    assert sample_to_quantity(sample) == quantity


@pytest.mark.parametrize("sample", ["+Inf", "-Inf", "Inf"])
def test_infinite_samples_raise_for_the_caller_to_skip(sample: str) -> None:
    with pytest.raises(NonFiniteSampleError):
        sample_to_quantity(sample)


def test_garbage_sample_is_an_error() -> None:
    with pytest.raises(ValueError, match="not a sample value"):
        sample_to_quantity("twelve")


@pytest.mark.parametrize(("moment", "text"), [
    (NOON, "2024-05-01T12:00:00Z"),
    (NOON + timedelta(microseconds=999_999), "2024-05-01T12:00:00Z"),
    (datetime(2024, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2))), "2024-05-01T12:00:00Z"),
    (1714564800.9, "2024-05-01T12:00:00Z"),
    (Decimal("1714564800.123"), "2024-05-01T12:00:00Z"),
    ("1714564800", "2024-05-01T12:00:00Z"),
])
def test_timestamps_are_rfc3339_utc_seconds(moment: datetime | float | Decimal | str,
                                            text: str) -> None:
    assert format_timestamp(moment) == text


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError):
        format_timestamp(datetime(2024, 5, 1))


# --- Status bodies (contract §8.4, §10.2) ---------------------------------------------------------


@pytest.mark.parametrize(("body", "example"), [
    (metric_not_found(metric="http_requests", resource="pods"),
     '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server '
     'could not find the metric http_requests for pods","reason":"NotFound","code":404}'),
    (metric_not_found(metric="http_requests", resource="pods", object_name="web-0",
                      selector="verb=GET"),
     '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server '
     'could not find the metric http_requests for pods web-0 with selector verb=GET",'
     '"reason":"NotFound","code":404}'),
    (metric_not_found(metric="m", resource="deployments.apps", object_name="web",
                      why="no series matched"),
     '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server '
     'could not find the metric m for deployments.apps web: no series matched",'
     '"reason":"NotFound","code":404}'),
    (route_not_found(),
     '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server '
     'could not find the requested resource","reason":"NotFound","details":{},"code":404}'),
    (bad_request("unable to parse requirement: found '', expected: identifier"),
     '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"unable to '
     "parse requirement: found '', expected: identifier\",\"reason\":\"BadRequest\",\"code\":400}"),
    (unauthorized(),
     '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized",'
     '"reason":"Unauthorized","code":401}'),
    (method_not_allowed(),
     '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server '
     'does not allow this method on the requested resource","reason":"MethodNotAllowed",'
     '"details":{},"code":405}'),
    (not_acceptable(),
     '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"only the '
     'following media types are accepted: application/json","reason":"NotAcceptable",'
     '"code":406}'),
    (internal_error(),
     '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Internal '
     'error occurred: unable to fetch metrics","reason":"InternalError","details":{"causes":'
     '[{"message":"unable to fetch metrics"}]},"code":500}'),
    (service_unavailable(message="discovery has not completed yet", retry_after_seconds=5),
     '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"discovery '
     'has not completed yet","reason":"ServiceUnavailable","details":{"retryAfterSeconds":5},'
     '"code":503}'),
])
def test_status_bodies_match_the_contract(body: dict[str, object], example: str) -> None:
    same_json(body, example)
    assert list(body) == list(json.loads(example))  # Go's field order too


@given(st.decimals(allow_nan=False, allow_infinity=False))
def test_sample_quantities_parse_back_to_the_value_truncated_to_milli(value: Decimal) -> None:
    largest = Decimal(2**63 - 1)
    clamped = max(min(value, largest), -largest)
    with localcontext() as context:
        context.prec = 60
        expected = clamped.quantize(Decimal("0.001"), rounding=ROUND_DOWN)
    assert parse_quantity(sample_to_quantity(str(value))) == expected


@given(st.decimals(allow_nan=False, allow_infinity=False))
def test_plain_decimal_samples_take_the_fast_path_to_the_same_quantity(value: Decimal) -> None:
    # Prometheus writes values with Go's FormatFloat 'f' (never an exponent): the fast path
    # reads that text as integer milli-units and must agree with the exact Decimal path.
    text = format(value, "f")
    assert sample_to_quantity(text) == _exact_sample_to_quantity(text)


@pytest.mark.parametrize("text", ["-0.0009", "0.999", "999999999999999999.9999",
                                  "1000000000000000000", "100000000000000000", "12.", "-0",
                                  "+1.5", " 1.5", "1500.000"])
def test_plain_decimal_edges_agree_with_the_exact_path(text: str) -> None:
    assert sample_to_quantity(text) == _exact_sample_to_quantity(text)


_OBJECT_NAMES = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@given(names=st.lists(_OBJECT_NAMES, max_size=4), namespace=st.one_of(st.none(), _OBJECT_NAMES),
       metric=_OBJECT_NAMES, version=st.sampled_from(["v1beta1", "v1beta2"]),
       info=st.sampled_from([POD, DEPLOYMENT, NAMESPACE, NODE]),
       selector=st.sampled_from([None, "", "verb=GET", "a in (x,y),!b"]),
       seconds=st.lists(st.integers(0, 2**33), min_size=1, max_size=2),
       quantities=st.lists(st.sampled_from(["0", "1500m", "-2k", "\u00e9"]), min_size=1))
def test_encoded_metric_value_lists_are_the_bytes_json_dumps_makes(
        names: list[str], namespace: str | None, metric: str, version: str, info: ResourceInfo,
        selector: str | None, seconds: list[int], quantities: list[str]) -> None:
    selector_json = None if selector is None else label_selector_json(parse_selector(selector))
    values = [(name, datetime.fromtimestamp(seconds[i % len(seconds)], tz=UTC),
               quantities[i % len(quantities)]) for i, name in enumerate(names)]
    items = [CustomMetricValue(described_object=described_object(info, name=name,
                                                                 namespace=namespace),
                               metric=metric, timestamp=moment, value=value,
                               selector=selector_json)
             for name, moment, value in values]
    expected = json.dumps(render_metric_value_list(version=version, items=items),
                          separators=(",", ":")).encode()
    assert encode_object_metric_values(version=version, info=info, namespace=namespace,
                                       metric=metric, selector=selector_json,
                                       values=values) == expected
