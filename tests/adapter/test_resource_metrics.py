"""metrics.k8s.io, the pure parts: the PromQL of `resourceRules` (prometheus-adapter.md §9 and
§13.6, byte for byte), samples to PodMetrics/NodeMetrics (§9's assembly rules), quantities,
window durations, field selectors and routes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapter.api.routes import ResourceMetricsRoute, RouteRejection, parse_route
from adapter.api.tables import IncludeObjectError, metrics_table, parse_include_object
from adapter.api.usage import (
    AnswerTimes,
    ContainerUsage,
    NodeRef,
    PodRef,
    PodUsage,
    assemble_node_usage,
    assemble_pod_usage,
    binary_milli_quantity,
    encode_pod_items,
    encode_pod_metrics_list,
    go_duration,
    pod_usage_items,
    render_node_metrics_list,
    render_pod_metrics,
    render_pod_metrics_list,
    usage_milli,
    usage_not_found,
)
from adapter.http.responses import table_version
from adapter.http.usage import usage_labels
from adapter.rules.config import ConfigError, ResourceRules, parse_config
from adapter.rules.defaults import default_config
from adapter.rules.query import build_node_usage_query, build_pod_usage_query
from metricscale.core.fields import FieldSelectorError, parse_field_selector
from metricscale.core.quantity import Format, format_milli

# prometheus-adapter's shipped manifest (deploy/manifests/config-map.yaml, v0.12), whose
# queries prometheus-adapter.md §13.6 gives for pods a, b in `monitoring` and nodes n1, n2.
SHIPPED = """
resourceRules:
  cpu:
    containerQuery: |
      sum by (<<.GroupBy>>) (
        irate (
            container_cpu_usage_seconds_total{<<.LabelMatchers>>,container!="",pod!=""}[4m]
        )
      )
    nodeQuery: |
      sum by (<<.GroupBy>>) (
        irate(
            node_cpu_usage_seconds_total{<<.LabelMatchers>>}[4m]
        )
      )
    resources:
      overrides:
        node: {resource: node}
        namespace: {resource: namespace}
        pod: {resource: pod}
    containerLabel: container
  memory:
    containerQuery: |
      sum by (<<.GroupBy>>) (
        container_memory_working_set_bytes{<<.LabelMatchers>>,container!="",pod!=""}
      )
    nodeQuery: |
      sum by (<<.GroupBy>>) (
        node_memory_working_set_bytes{<<.LabelMatchers>>}
      )
    resources:
      overrides:
        node: {resource: node}
        namespace: {resource: namespace}
        pod: {resource: pod}
    containerLabel: container
  window: 5m
"""


def _shipped() -> ResourceRules:
    rules = parse_config(SHIPPED).resource_rules
    assert rules is not None
    return rules


def test_pod_queries_are_prometheus_adapters_byte_for_byte() -> None:
    rules = _shipped()
    promql = build_pod_usage_query(rule=rules.cpu, labels=usage_labels(rules.cpu),
                                   namespace="monitoring", pods=["a", "b"])
    assert promql == (
        "sum by (pod,container) (\n"
        "  irate (\n"
        '      container_cpu_usage_seconds_total{namespace="monitoring",pod=~"a|b",'
        'container!="",pod!=""}[4m]\n'
        "  )\n"
        ")\n")


def test_node_queries_are_prometheus_adapters_byte_for_byte() -> None:
    rules = _shipped()
    promql = build_node_usage_query(rule=rules.memory, labels=usage_labels(rules.memory),
                                    nodes=["n1", "n2"])
    assert promql == 'sum by (node) (\n  node_memory_working_set_bytes{node=~"n1|n2"}\n)\n'


def test_one_name_is_an_equality_and_names_are_escaped() -> None:
    rules = _shipped()
    labels = usage_labels(rules.memory)
    one = build_pod_usage_query(rule=rules.memory, labels=labels, namespace="a", pods=["web.1"])
    assert 'pod="web.1"' in one
    several = build_pod_usage_query(rule=rules.memory, labels=labels, namespace="a",
                                    pods=["web.1", "web.2"])
    # Upstream joins names unescaped (a `.` would match any character); here they are literal.
    assert r'pod=~"web\\.1|web\\.2"' in several


def test_default_rules_read_cadvisor_with_the_node_label() -> None:
    rules = default_config().resource_rules
    assert rules is not None and rules.window == "5m"
    pods = build_pod_usage_query(rule=rules.cpu, labels=usage_labels(rules.cpu),
                                 namespace="shop", pods=["web-0"])
    assert ('rate(container_cpu_usage_seconds_total{namespace="shop",pod="web-0",'
            'container!="",container!="POD"}[5m])') in pods
    assert "sum by (pod,container)" in pods
    nodes = build_node_usage_query(rule=rules.memory, labels=usage_labels(rules.memory),
                                   nodes=["n1"])
    assert 'container_memory_working_set_bytes{node="n1",id="/"}' in nodes


def test_resource_rules_must_map_pods_nodes_and_namespaces() -> None:
    text = SHIPPED.replace("        node: {resource: node}\n", "", 1)
    with pytest.raises(ConfigError) as raised:
        parse_config(text)
    assert "resourceRules.cpu.resources: unable to convert resource nodes into label" in str(
        raised.value)


# --------------------------------------------------------------------------------------------
# Samples to objects (§9)

T0 = Decimal("1700000000.5")
T1 = Decimal("1700000001")


def _sample(pod: str, container: str, value: str, at: Decimal = T1
            ) -> tuple[dict[str, str], Decimal, str]:
    return {"pod": pod, "container": container}, at, value


def test_pods_missing_cpu_or_memory_are_left_out_and_containers_filled_with_zero() -> None:
    pods = [PodRef("shop", "web-0", {"app": "web"}), PodRef("shop", "web-1", {}),
            PodRef("shop", "web-2", {})]
    cpu = [_sample("web-0", "app", "0.25", T0), _sample("web-0", "sidecar", "0.0123"),
           _sample("web-1", "app", "0.1")]
    memory = [_sample("web-0", "app", "1048576"), _sample("web-2", "app", "5")]
    usages, missing = assemble_pod_usage(pods, cpu=cpu, memory=memory, pod_label="pod",
                                         container_label="container")
    assert [m.name for m in missing] == ["web-1", "web-2"]
    [web0] = usages
    assert web0.timestamp == T0  # the earliest sample
    body = render_pod_metrics_list(usages, window="5m0s",
                                   now=datetime(2026, 1, 1, tzinfo=UTC))
    assert body == {
        "kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1", "metadata": {},
        "items": [{
            "metadata": {"name": "web-0", "namespace": "shop", "labels": {"app": "web"},
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "timestamp": "2023-11-14T22:13:20Z", "window": "5m0s",
            "containers": [
                {"name": "app", "usage": {"cpu": "250m", "memory": "1Mi"}},
                {"name": "sidecar", "usage": {"cpu": "12m", "memory": "0"}}]}]}
    single = render_pod_metrics(web0, window="5m0s", now=datetime(2026, 1, 1, tzinfo=UTC))
    assert single["kind"] == "PodMetrics" and single["apiVersion"] == "metrics.k8s.io/v1beta1"


@pytest.mark.parametrize(("value", "milli"), [
    ("0.0123", 12), ("1", 1000), ("NaN", 0), ("-3", 0), ("+Inf", 0), ("1e3", 1_000_000),
    ("0.0009", 0)])
def test_values_become_truncated_milli_units_and_nan_or_negative_zero(value: str,
                                                                     milli: int) -> None:
    assert usage_milli(value) == milli


def test_nodes_take_the_earlier_sample_and_binary_memory() -> None:
    nodes = [NodeRef("n1", {"zone": "a"}), NodeRef("n2", {})]
    usages, missing = assemble_node_usage(
        nodes, cpu=[({"node": "n1"}, T1, "1.5"), ({"node": "n2"}, T1, "2")],
        memory=[({"node": "n1"}, T0, "1000000")], node_label="node")
    assert [m.name for m in missing] == ["n2"]
    body = render_node_metrics_list(usages, window="30s", now=datetime(2026, 1, 1, tzinfo=UTC))
    assert body["kind"] == "NodeMetricsList"
    [item] = body["items"]
    assert item["metadata"] == {"name": "n1", "labels": {"zone": "a"},
                                "creationTimestamp": "2026-01-01T00:00:00Z"}
    assert item["timestamp"] == "2023-11-14T22:13:20Z"
    # Not a multiple of 1024: BinarySI prints it as a plain number, as Go does.
    assert item["usage"] == {"cpu": "1500m", "memory": "1000000"}


@pytest.mark.parametrize(("milliseconds", "text"), [
    (300_000, "5m0s"), (30_000, "30s"), (90_000, "1m30s"), (3_600_000, "1h0m0s"),
    (1500, "1.5s"), (0, "0s")])
def test_windows_print_as_go_durations(milliseconds: int, text: str) -> None:
    assert go_duration(milliseconds) == text


def test_an_object_without_metrics_is_metrics_servers_not_found() -> None:
    body = usage_not_found("pods", namespace="shop", name="web-0")
    assert body["code"] == 404 and body["reason"] == "NotFound"
    assert body["message"] == 'podmetrics.metrics.k8s.io "shop/web-0" not found'
    assert body["details"] == {"name": "shop/web-0", "group": "metrics.k8s.io",
                               "kind": "podmetrics"}
    node = usage_not_found("nodes", namespace=None, name="n1")
    assert node["message"] == 'nodemetrics.metrics.k8s.io "n1" not found'


# --------------------------------------------------------------------------------------------
# Routes and field selectors


BASE = "/apis/metrics.k8s.io/v1beta1"


@pytest.mark.parametrize(("path", "kind", "namespace", "name"), [
    (f"{BASE}/nodes", "nodes", None, None),
    (f"{BASE}/nodes/n1", "nodes", None, "n1"),
    (f"{BASE}/pods", "pods", None, None),
    (f"{BASE}/namespaces/shop/pods", "pods", "shop", None),
    (f"{BASE}/namespaces/shop/pods/web-0", "pods", "shop", "web-0"),
])
def test_routes(path: str, kind: str, namespace: str | None, name: str | None) -> None:
    route = parse_route(path)
    assert isinstance(route, ResourceMetricsRoute)
    assert (route.kind, route.namespace, route.name) == (kind, namespace, name)


@pytest.mark.parametrize("path", [f"{BASE}/pods/web-0", f"{BASE}/namespaces/shop/nodes",
                                  f"{BASE}/namespaces/shop/pods/a/b", f"{BASE}/services"])
def test_other_paths_are_not_found(path: str) -> None:
    route = parse_route(path)
    assert isinstance(route, RouteRejection) and route.code == 404


def test_unknown_field_labels_and_bad_selectors_are_400() -> None:
    route = parse_route(f"{BASE}/pods", "fieldSelector=spec.hostname%3Dx")
    assert isinstance(route, RouteRejection) and route.code == 400
    assert route.message == ('"spec.hostname" is not a known field selector: only '
                             '"metadata.name", "metadata.namespace", "spec.nodeName", '
                             '"status.phase"')
    nodes = parse_route(f"{BASE}/nodes", "fieldSelector=spec.nodeName%3Dx")
    assert isinstance(nodes, RouteRejection) and nodes.code == 400
    broken = parse_route(f"{BASE}/pods", "fieldSelector=nonsense")
    assert isinstance(broken, RouteRejection)
    assert broken.message == "invalid selector: 'nonsense'; can't understand 'nonsense'"


def test_field_selectors_parse_as_apimachinery_does() -> None:
    selector = parse_field_selector(r"spec.nodeName!=n1,metadata.name==a\,b")
    assert [(r.key, r.value, r.negated) for r in selector.requirements] == [
        ("metadata.name", "a,b", False), ("spec.nodeName", "n1", True)]
    assert selector.matches({"metadata.name": "a,b", "spec.nodeName": "n2"})
    assert not selector.matches({"metadata.name": "a,b", "spec.nodeName": "n1"})
    with pytest.raises(FieldSelectorError, match="invalid escape sequence"):
        parse_field_selector(r"a=b\x")
    with pytest.raises(FieldSelectorError, match="unescaped character"):
        parse_field_selector("a=b=c")
    assert parse_field_selector("").is_empty()


# --------------------------------------------------------------------------------------------
# The fast paths agree with the general ones


@given(st.integers(min_value=0, max_value=10**18))
def test_binary_milli_quantities_are_gos(milli: int) -> None:
    assert binary_milli_quantity(milli) == format_milli(milli, Format.BINARY_SI)


@given(st.decimals(min_value=0, max_value=10**12, allow_nan=False, places=6))
def test_fast_milli_parsing_agrees_with_the_exact_one(value: Decimal) -> None:
    text = str(value)
    exact = int((value * 1000).to_integral_value(rounding="ROUND_DOWN"))
    assert usage_milli(text) == exact


_names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)),
                 min_size=1, max_size=12)


@given(st.lists(st.tuples(_names, st.dictionaries(_names, _names, max_size=3),
                          st.lists(st.tuples(_names, st.integers(0, 10**12),
                                             st.integers(0, 10**15)), min_size=1, max_size=3),
                          st.booleans()),
                max_size=8, unique_by=lambda p: p[0]))
def test_the_direct_encoding_is_json_dumps_of_the_rendered_list(
        pods: list[tuple[str, dict[str, str], list[tuple[str, int, int]], bool]]) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    usages = [PodUsage(PodRef("ns", name, labels,
                              json.dumps(labels, separators=(",", ":")) if keep else None),
                       T0, tuple(ContainerUsage(*c) for c in containers))
              for name, labels, containers, keep in pods]
    expected = json.dumps(render_pod_metrics_list(usages, window="1m0s", now=now),
                          separators=(",", ":")).encode()
    assert encode_pod_metrics_list(usages, window="1m0s", now=now) == expected


_values = st.one_of(st.integers(0, 10**12).map(str),
                    st.decimals(0, 10**6, allow_nan=False, places=4).map(str),
                    st.sampled_from(["NaN", "+Inf", "-1", "1e3", " 2"]))


@given(st.lists(st.tuples(_names, st.booleans(),
                          st.lists(st.tuples(st.sampled_from(["app", "sidecar", ""]),
                                             st.one_of(st.none(), _values),
                                             st.one_of(st.none(), _values),
                                             st.sampled_from([T0, T1])),
                                   max_size=3)),
                max_size=6, unique_by=lambda p: p[0]))
def test_the_fused_list_path_writes_what_assembly_and_encoding_write(
        pods: list[tuple[str, bool, list[tuple[str, str | None, str | None, Decimal]]]]) -> None:
    """pod_usage_items (what a pod list uses) against assemble_pod_usage, then
    encode_pod_metrics_list (what a single pod and the tests use): the same items and the
    same pods left out, for any mix of containers, missing samples and values."""
    # The list path is handed the pods sorted (by namespace, then name) and keeps their order.
    refs = sorted((PodRef("ns", name, {"app": name} if labelled else {})
                   for name, labelled, _ in pods), key=lambda ref: ref.name)
    cpu = [_sample(name, c, v, at) for name, _, cs in pods for c, v, _, at in cs if v is not None]
    memory = [_sample(name, c, v, at) for name, _, cs in pods for c, _, v, at in cs
              if v is not None]
    now = datetime(2026, 1, 1, tzinfo=UTC)
    usages, missing = assemble_pod_usage(refs, cpu=cpu, memory=memory, pod_label="pod",
                                         container_label="container")
    items, left_out = pod_usage_items(refs, cpu=cpu, memory=memory, pod_label="pod",
                                      container_label="container", window="1m0s",
                                      times=AnswerTimes(now))
    assert left_out == missing
    assert encode_pod_items(items) == encode_pod_metrics_list(usages, window="1m0s", now=now)


# --------------------------------------------------------------------------------------------
# kubectl get podmetrics|nodemetrics: the Table


# What metrics-server v0.8.0 answered for one pod of two containers (tests/peers, asked with
# kubectl get's Accept), and the PodMetricsList it serves for the same pod.
MS_POD_LIST = {
    "kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1", "metadata": {},
    "items": [{"metadata": {"name": "web-0", "namespace": "exp",
                            "creationTimestamp": "2026-11-27T15:34:35Z",
                            "labels": {"app": "web"}},
               "timestamp": "2026-11-27T15:34:35Z", "window": "14.932s",
               "containers": [{"name": "side", "usage": {"cpu": "12500u",
                                                         "memory": "100000000"}},
                              {"name": "app", "usage": {"cpu": "250m", "memory": "64Mi"}}]}]}
MS_POD_TABLE = (
    '{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{},"columnDefinitions":['
    '{"name":"Name","type":"string","format":"name","description":"Name of the resource",'
    '"priority":0},{"name":"cpu","type":"string","format":"quantity","description":"",'
    '"priority":0},{"name":"memory","type":"string","format":"quantity","description":"",'
    '"priority":0},{"name":"Window","type":"string","format":"duration","description":"",'
    '"priority":0}],"rows":[{"cells":["web-0","262500u","167108864","14.932s"],"object":{'
    '"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"web-0",'
    '"namespace":"exp","creationTimestamp":"2026-11-27T15:34:35Z","labels":{"app":"web"}}}}]}')


def test_the_table_of_metrics_servers_pods_is_metrics_servers_table_byte_for_byte() -> None:
    table = metrics_table(MS_POD_LIST, version="v1")
    assert json.dumps(table, separators=(",", ":")) == MS_POD_TABLE


def test_a_table_row_object_is_metadata_the_whole_object_or_none() -> None:
    whole = metrics_table(MS_POD_LIST, version="v1beta1", include_object="Object")
    assert whole["apiVersion"] == "meta.k8s.io/v1beta1"
    assert whole["rows"][0]["object"] == {"kind": "PodMetrics",
                                          "apiVersion": "metrics.k8s.io/v1beta1",
                                          **MS_POD_LIST["items"][0]}  # type: ignore[dict-item]
    assert metrics_table(MS_POD_LIST, version="v1",
                         include_object="None")["rows"][0]["object"] is None


def test_a_node_table_shows_its_usage_and_an_empty_list_has_no_columns() -> None:
    node = {"kind": "NodeMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
            "metadata": {"name": "node-a", "creationTimestamp": "2026-11-27T15:34:35Z"},
            "timestamp": "2026-11-27T15:34:35Z", "window": "10s",
            "usage": {"memory": "704389376", "cpu": "363m"}}
    table = metrics_table(node, version="v1")
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "cpu", "memory",
                                                                "Window"]
    assert table["rows"][0]["cells"] == ["node-a", "363m", "704389376", "10s"]
    empty = {"kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1",
             "metadata": {}, "items": []}
    assert metrics_table(empty, version="v1") == {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {},
        "columnDefinitions": None, "rows": None}


@pytest.mark.parametrize(("value", "expected"), [
    (None, "Metadata"), ("", "Metadata"), ("Metadata", "Metadata"), ("Object", "Object"),
    ("None", "None")])
def test_include_object_values(value: str | None, expected: str) -> None:
    assert parse_include_object(value) == expected


def test_an_unknown_include_object_is_refused_in_upstreams_words() -> None:
    with pytest.raises(IncludeObjectError) as refused:
        parse_include_object("object")
    assert str(refused.value) == (
        "Unable to convert to Table as requested: includeObject: Invalid value: \"object\": "
        "must be 'Metadata', 'Object', 'None', or empty")


@pytest.mark.parametrize(("accept", "version"), [
    ("application/json;as=Table;v=v1;g=meta.k8s.io,"
     "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json", "v1"),
    ("application/json;as=Table;v=v1beta1;g=meta.k8s.io", "v1beta1"),
    ("application/json, application/json;as=Table;v=v1;g=meta.k8s.io", None),  # JSON first
    ("application/json;as=Table;v=v2;g=meta.k8s.io,application/json", None),  # no such Table
    ("application/json;as=Table;v=v1;g=meta.k8s.io;q=0,application/json", None),
    ("application/vnd.kubernetes.protobuf, */*", None),
    (None, None),
])
def test_a_table_is_served_when_accept_asks_for_one_before_plain_json(
        accept: str | None, version: str | None) -> None:
    assert table_version(accept) == version
