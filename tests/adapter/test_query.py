"""The PromQL a request becomes: prometheus-adapter.md §13 byte for byte, §7, and escaping."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapter.api.routes import CustomMetricRoute, ExternalMetricRoute, parse_route
from adapter.rules.config import AdapterConfig, parse_config
from adapter.rules.defaults import default_config
from adapter.rules.query import (
    RuleQueryError,
    UnsupportedSelectorError,
    build_custom_query,
    build_external_query,
    escape_regex,
    match_samples,
)
from adapter.rules.registry import MetricRegistry, SeriesShape, build_registry
from adapter.rules.resources import GroupResource, ResourceCatalog, ResourceMapper
from adapter.rules.templating import parse_template
from metricscale.core.selectors import Operator, Requirement, Selector, parse_selector
from testbed.fakes.tools import require_tool

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)

# What a cluster's discovery says (APIResourceList documents, preferred versions, core first).
DISCOVERY = [
    {"groupVersion": "v1", "resources": [
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod"},
        {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod"},
        {"name": "services", "singularName": "service", "namespaced": True, "kind": "Service"},
        {"name": "namespaces", "singularName": "namespace", "namespaced": False,
         "kind": "Namespace"},
        {"name": "nodes", "singularName": "node", "namespaced": False, "kind": "Node"},
        {"name": "persistentvolumes", "singularName": "persistentvolume", "namespaced": False,
         "kind": "PersistentVolume"},
    ]},
    {"groupVersion": "apps/v1", "resources": [
        {"name": "deployments", "singularName": "deployment", "namespaced": True,
         "kind": "Deployment"},
    ]},
    {"groupVersion": "batch/v1", "resources": [
        {"name": "jobs", "singularName": "job", "namespaced": True, "kind": "Job"},
    ]},
    {"groupVersion": "networking.k8s.io/v1", "resources": [
        {"name": "ingresses", "singularName": "ingress", "namespaced": True, "kind": "Ingress"},
    ]},
    {"groupVersion": "metrics.k8s.io/v1beta1", "resources": [
        {"name": "pods", "singularName": "", "namespaced": True, "kind": "PodMetrics"},
    ]},
]
CATALOG = ResourceCatalog.from_discovery(DISCOVERY)


def registry_for(config: AdapterConfig,
                 series: Mapping[str, Sequence[tuple[str, Sequence[str]]]]) -> MetricRegistry:
    shapes = {query: [SeriesShape(name, frozenset(labels)) for name, labels in found]
              for query, found in series.items()}
    for query in config.series_queries():
        shapes.setdefault(query, [])
    return build_registry(config=config, series=shapes, catalog=CATALOG, now=NOW)


def custom_promql(registry: MetricRegistry, url: str, *, listed: Sequence[str] = ()) -> str:
    """The query for a custom-metrics URL; `listed` are the objects a `*` request selected."""
    path, _, query = url.partition("?")
    route = parse_route("/apis/custom.metrics.k8s.io/v1beta2" + path, query)
    assert isinstance(route, CustomMetricRoute), route
    resolved = registry.resolve_custom(resource=route.resource, namespace=route.namespace,
                                       metric=route.metric)
    assert resolved is not None, f"{url} is not registered"
    names = list(listed) if route.name is None else [route.name]
    return build_custom_query(rule=resolved.entry.rule, mapper=resolved.entry.mapper,
                              series=resolved.entry.series,
                              resource=resolved.info.group_resource,
                              namespace=resolved.namespace, names=names,
                              metric_selector=route.metric_selector).promql


def external_promql(registry: MetricRegistry, url: str) -> str:
    path, _, query = url.partition("?")
    route = parse_route(path, query)
    assert isinstance(route, ExternalMetricRoute), route
    entry = registry.resolve_external(route.metric)
    assert entry is not None
    return build_external_query(rule=entry.rule, mapper=entry.mapper, series=entry.series,
                                namespace=route.namespace, metric_selector=route.selector)


# --- §13.1 per-pod request rate (the config walkthrough) ------------------------------------------

WALKTHROUGH = parse_config("""
rules:
- seriesQuery: 'http_requests_total{kubernetes_namespace!="",kubernetes_pod_name!=""}'
  resources:
    overrides:
      kubernetes_namespace: {resource: "namespace"}
      kubernetes_pod_name: {resource: "pod"}
  name: {matches: "^(.*)_total", as: "${1}_per_second"}
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'
""")
WALKTHROUGH_REGISTRY = registry_for(WALKTHROUGH, {
    'http_requests_total{kubernetes_namespace!="",kubernetes_pod_name!=""}': [
        ("http_requests_total", ("method", "kubernetes_namespace", "kubernetes_pod_name"))],
})


def test_13_1_discovery_lists_pods_namespaced_and_namespaces_cluster_scoped() -> None:
    assert [(str(k.resource), k.namespaced, k.metric)
            for k in WALKTHROUGH_REGISTRY.custom_metrics()] == [
        ("namespaces", False, "http_requests_per_second"),
        ("pods", True, "http_requests_per_second"),
    ]


@pytest.mark.parametrize(("url", "listed", "promql"), [
    ("/namespaces/production/pods/*/http_requests_per_second",
     ["frontend-server-abcd-0123", "frontend-server-abcd-4567"],
     'sum(rate(http_requests_total{kubernetes_namespace="production",'
     'kubernetes_pod_name=~"frontend-server-abcd-0123|frontend-server-abcd-4567"}[2m])) '
     "by (kubernetes_pod_name)"),
    ("/namespaces/production/pods/frontend-server-abcd-0123/http_requests_per_second", [],
     'sum(rate(http_requests_total{kubernetes_namespace="production",'
     'kubernetes_pod_name="frontend-server-abcd-0123"}[2m])) by (kubernetes_pod_name)'),
    ("/namespaces/production/pods/frontend-server-abcd-0123/http_requests_per_second"
     "?metricLabelSelector=method%3DGET", [],
     'sum(rate(http_requests_total{method="GET",kubernetes_namespace="production",'
     'kubernetes_pod_name="frontend-server-abcd-0123"}[2m])) by (kubernetes_pod_name)'),
    ("/namespaces/production/metrics/http_requests_per_second", [],
     'sum(rate(http_requests_total{kubernetes_namespace="production"}[2m])) '
     "by (kubernetes_namespace)"),
])
def test_13_1_walkthrough_queries(url: str, listed: list[str], promql: str) -> None:
    assert custom_promql(WALKTHROUGH_REGISTRY, url, listed=listed) == promql


# --- §13.2 config-gen defaults with --label-prefix=kube_ and a 1m rate ---------------------------

CONTAINERS = '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
PREFIXED = '{kube_namespace!="",__name__!~"^container_.*"}'
PREFIXED_DEFAULTS = parse_config(f"""
rules:
- seriesQuery: '{CONTAINERS}'
  seriesFilters: []
  resources: {{overrides: {{namespace: {{resource: namespace}}, pod: {{resource: pod}}}}}}
  name: {{matches: ^container_(.*)_seconds_total$, as: ''}}
  metricsQuery: sum(rate(<<.Series>>{{<<.LabelMatchers>>,container!="POD"}}[1m])) by (<<.GroupBy>>)
- seriesQuery: '{CONTAINERS}'
  seriesFilters: [{{isNot: ^container_.*_seconds_total$}}]
  resources: {{overrides: {{namespace: {{resource: namespace}}, pod: {{resource: pod}}}}}}
  name: {{matches: ^container_(.*)_total$, as: ''}}
  metricsQuery: sum(rate(<<.Series>>{{<<.LabelMatchers>>,container!="POD"}}[1m])) by (<<.GroupBy>>)
- seriesQuery: '{CONTAINERS}'
  seriesFilters: [{{isNot: ^container_.*_total$}}]
  resources: {{overrides: {{namespace: {{resource: namespace}}, pod: {{resource: pod}}}}}}
  name: {{matches: ^container_(.*)$, as: ''}}
  metricsQuery: sum(<<.Series>>{{<<.LabelMatchers>>,container!="POD"}}) by (<<.GroupBy>>)
- seriesQuery: '{PREFIXED}'
  seriesFilters: [{{isNot: .*_total$}}]
  resources: {{template: kube_<<.Resource>>}}
  name: {{matches: '', as: ''}}
  metricsQuery: sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)
- seriesQuery: '{PREFIXED}'
  seriesFilters: [{{isNot: .*_seconds_total}}]
  resources: {{template: kube_<<.Resource>>}}
  name: {{matches: ^(.*)_total$, as: ''}}
  metricsQuery: sum(rate(<<.Series>>{{<<.LabelMatchers>>}}[1m])) by (<<.GroupBy>>)
- seriesQuery: '{PREFIXED}'
  seriesFilters: []
  resources: {{template: kube_<<.Resource>>}}
  name: {{matches: ^(.*)_seconds_total$, as: ''}}
  metricsQuery: sum(rate(<<.Series>>{{<<.LabelMatchers>>}}[1m])) by (<<.GroupBy>>)
""")
PREFIXED_REGISTRY = registry_for(PREFIXED_DEFAULTS, {
    CONTAINERS: [("container_some_usage", ("namespace", "pod", "container"))],
    PREFIXED: [
        ("ingress_hits_total", ("kube_ingress", "kube_service", "kube_pod", "kube_namespace")),
        ("node_gigawatts", ("kube_node",)),
        ("work_queue_wait_seconds_total", ("kube_namespace", "kube_deployment")),
    ],
})


@pytest.mark.parametrize(("url", "listed", "promql"), [
    ("/namespaces/somens/services/somesvc/ingress_hits", [],
     'sum(rate(ingress_hits_total{kube_namespace="somens",kube_service="somesvc"}[1m])) '
     "by (kube_service)"),
    ("/namespaces/somens/services/somesvc/ingress_hits?metricLabelSelector=param1%3Dvalue1", [],
     'sum(rate(ingress_hits_total{param1="value1",kube_namespace="somens",'
     'kube_service="somesvc"}[1m])) by (kube_service)'),
    ("/nodes/somenode/node_gigawatts", [],
     'sum(node_gigawatts{kube_node="somenode"}) by (kube_node)'),
    ("/namespaces/somens/pods/*/some_usage", ["somepod1", "somepod2"],
     'sum(container_some_usage{namespace="somens",pod=~"somepod1|somepod2",container!="POD"}) '
     "by (pod)"),
    ("/namespaces/somens/deployments.apps/somedep/work_queue_wait", [],
     'sum(rate(work_queue_wait_seconds_total{kube_namespace="somens",'
     'kube_deployment="somedep"}[1m])) by (kube_deployment)'),
])
def test_13_2_prefixed_default_rules(url: str, listed: list[str], promql: str) -> None:
    assert custom_promql(PREFIXED_REGISTRY, url, listed=listed) == promql


# --- §13.3 config-gen defaults, no prefix, 5m ----------------------------------------------------

GENERAL = '{namespace!="",__name__!~"^container_.*"}'
CONFIG_GEN = parse_config(f"""
rules:
- seriesQuery: '{CONTAINERS}'
  seriesFilters: []
  resources: {{overrides: {{namespace: {{resource: namespace}}, pod: {{resource: pod}}}}}}
  name: {{matches: ^container_(.*)_seconds_total$, as: ''}}
  metricsQuery: sum(rate(<<.Series>>{{<<.LabelMatchers>>,container!="POD"}}[5m])) by (<<.GroupBy>>)
- seriesQuery: '{GENERAL}'
  seriesFilters: [{{isNot: .*_seconds_total}}]
  resources: {{template: <<.Resource>>}}
  name: {{matches: ^(.*)_total$, as: ''}}
  metricsQuery: sum(rate(<<.Series>>{{<<.LabelMatchers>>}}[5m])) by (<<.GroupBy>>)
""")
APP_SERIES = ("http_requests_total", ("namespace", "pod", "service", "job", "instance"))
CONFIG_GEN_REGISTRY = registry_for(CONFIG_GEN, {
    CONTAINERS: [("container_cpu_usage_seconds_total", ("namespace", "pod", "container", "id"))],
    GENERAL: [APP_SERIES],
})


def test_13_3_template_maps_pod_service_namespace_and_the_scrape_job_label() -> None:
    assert sorted(k.api_name for k in CONFIG_GEN_REGISTRY.custom_metrics()
                  if k.metric == "http_requests") == [
        "jobs.batch/http_requests", "namespaces/http_requests", "pods/http_requests",
        "services/http_requests"]


@pytest.mark.parametrize(("url", "listed", "promql"), [
    ("/namespaces/default/pods/app-1/http_requests", [],
     'sum(rate(http_requests_total{namespace="default",pod="app-1"}[5m])) by (pod)'),
    ("/namespaces/default/services/app/http_requests", [],
     'sum(rate(http_requests_total{namespace="default",service="app"}[5m])) by (service)'),
    ("/namespaces/default/pods/*/cpu_usage", ["p1", "p2"],
     'sum(rate(container_cpu_usage_seconds_total{namespace="default",pod=~"p1|p2",'
     'container!="POD"}[5m])) by (pod)'),
])
def test_13_3_config_gen_default_queries(url: str, listed: list[str], promql: str) -> None:
    assert custom_promql(CONFIG_GEN_REGISTRY, url, listed=listed) == promql


def test_our_default_rules_do_not_turn_the_job_label_into_batch_jobs() -> None:
    defaults = default_config()
    registry = registry_for(defaults, {GENERAL: [APP_SERIES]})
    assert sorted(k.api_name for k in registry.custom_metrics()
                  if k.metric == "http_requests") == [
        "namespaces/http_requests", "pods/http_requests", "services/http_requests"]
    assert custom_promql(registry, "/namespaces/default/pods/app-1/http_requests") == \
        'sum(rate(http_requests_total{namespace="default",pod="app-1"}[5m])) by (pod)'


# --- §13.4 group-aware template -------------------------------------------------------------------

GROUP_TEMPLATE = parse_config("""
rules:
- seriesQuery: 'up'
  resources: {template: "kube_<<.Group>>_<<.Resource>>"}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
""")


def group_mapper() -> ResourceMapper:
    rule = GROUP_TEMPLATE.rules[0]
    return ResourceMapper.build(template=rule.resources.label_template,
                                overrides=rule.resources.overrides, catalog=CATALOG)


def test_13_4_group_template_maps_deployments_both_ways() -> None:
    mapper = group_mapper()
    assert mapper.label_for_resource(GroupResource("deployments", "apps")) == \
        "kube_apps_deployment"
    assert mapper.resource_for_label("kube_apps_deployment") == GroupResource("deployments",
                                                                              "apps")


def test_13_4_multi_part_groups_render_but_are_never_discovered() -> None:
    mapper = group_mapper()
    ingresses = GroupResource("ingresses", "networking.k8s.io")
    assert mapper.label_for_resource(ingresses) == "kube_networking_k8s_io_ingress"
    assert mapper.resource_for_label("kube_networking_k8s_io_ingress") is None


def test_13_4_core_resources_render_with_an_empty_group_and_are_never_discovered() -> None:
    mapper = group_mapper()
    assert mapper.label_for_resource(GroupResource("pods")) == "kube__pod"
    assert mapper.resource_for_label("kube__pod") is None
    registry = registry_for(GROUP_TEMPLATE, {"up": [
        ("up", ("kube__pod", "kube_networking_k8s_io_ingress", "kube_apps_deployment"))]})
    assert [k.api_name for k in registry.custom_metrics()] == ["deployments.apps/up"]


# --- §13.5 external metrics -----------------------------------------------------------------------

LAG = '{__name__="queue_consumer_lag",name!=""}'


def external_registry(resources: str) -> MetricRegistry:
    config = parse_config(f"""
externalRules:
- seriesQuery: '{LAG}'
  metricsQuery: sum(<<.Series>>{{<<.LabelMatchers>>}}) by (name)
{resources}
""")
    return registry_for(config, {LAG: [("queue_consumer_lag", ("name", "topic", "namespace"))]})


def test_13_5_external_query_adds_the_namespace_after_the_selector() -> None:
    registry = external_registry("  resources:\n    overrides: {namespace: {resource: namespace}}")
    assert external_promql(registry, "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/"
                                     "queue_consumer_lag?labelSelector=topic%3Dorders") == \
        'sum(queue_consumer_lag{topic="orders",namespace="default"}) by (name)'


def test_13_5_namespaced_false_drops_the_namespace_and_sorts_the_selector() -> None:
    registry = external_registry("  resources:\n    overrides: { namespace: {resource: namespace} }"
                                 "\n    namespaced: false")
    assert external_promql(registry, "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/"
                                     "queue_consumer_lag"
                                     "?labelSelector=topic%3Dorders,namespace%3Dqueues") == \
        'sum(queue_consumer_lag{namespace="queues",topic="orders"}) by (name)'


def test_13_5_external_rule_without_resources_cannot_build_a_query() -> None:
    registry = external_registry("")
    with pytest.raises(RuleQueryError, match="no generic resource label form"):
        external_promql(registry, "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/"
                                  "queue_consumer_lag")


def test_external_names_match_whatever_the_case() -> None:
    registry = external_registry("  resources: {namespaced: false}")
    assert registry.resolve_external("QUEUE_Consumer_lag") is not None


# --- §7 selector → matcher table ------------------------------------------------------------------

SELECTOR_RULE = parse_config("""
rules:
- seriesQuery: 'm'
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  metricsQuery: '<<.LabelMatchers>>'
""").rules[0]
SELECTOR_MAPPER = ResourceMapper.build(template=None, overrides=SELECTOR_RULE.resources.overrides,
                                       catalog=CATALOG)


def matchers_for(selector: Selector) -> str:
    return build_custom_query(rule=SELECTOR_RULE, mapper=SELECTOR_MAPPER, series="m",
                              resource=GroupResource("pods"), namespace=None, names=["p"],
                              metric_selector=selector).promql


@pytest.mark.parametrize(("selector", "matchers"), [
    ("k=v", 'k="v",pod="p"'),
    ("k==v", 'k="v",pod="p"'),
    ("k!=v", 'k!="v",pod="p"'),
    ("k in (a)", 'k=~"a",pod="p"'),
    ("k in (b,a)", 'k=~"a|b",pod="p"'),
    ("k notin (a)", 'k!~"a",pod="p"'),
    ("k notin (a,b)", 'k!~"a|b",pod="p"'),
    ("k", 'k!="",pod="p"'),
    ("!k", 'k="",pod="p"'),
    ("b=1,a=2", 'a="2",b="1",pod="p"'),
    ("k in (a.b,c)", 'k=~"a\\\\.b|c",pod="p"'),  # upstream: a.b unescaped, a wildcard
    ("k in (a.b)", 'k=~"a\\\\.b",pod="p"'),
])
def test_7_selector_requirements_become_matchers(selector: str, matchers: str) -> None:
    assert matchers_for(parse_selector(selector)) == matchers


@pytest.mark.parametrize(("selector", "message"), [
    ("k>5", "operator not supported by prometheus"),
    ("k<5", "operator not supported by prometheus"),
    ("app.kubernetes.io/name=web", "is not a valid Prometheus label name"),
    ("a-b=c", "is not a valid Prometheus label name"),
])
def test_selectors_without_a_promql_form_are_the_clients_error(selector: str,
                                                                message: str) -> None:
    with pytest.raises(UnsupportedSelectorError, match=message):
        matchers_for(parse_selector(selector))


def test_label_values_by_name_holds_every_matcher_value() -> None:
    template = parse_template("<<.LabelValuesByName>>", name="metrics-query")
    rule = SELECTOR_RULE.__class__(**{**SELECTOR_RULE.__dict__, "metrics_template": template})
    promql = build_custom_query(rule=rule, mapper=SELECTOR_MAPPER, series="m",
                                resource=GroupResource("pods"), namespace="shop",
                                names=["a.1", "b"], metric_selector=parse_selector("k,v in (x,y)"))
    assert promql.promql == "map[k: namespace:shop pod:a\\\\.1|b v:x|y]"


def test_template_that_renders_nothing_fails_the_request() -> None:
    rule = SELECTOR_RULE.__class__(**{**SELECTOR_RULE.__dict__, "metrics_template":
                                      parse_template("<<if false>>x<<end>>", name="q")})
    with pytest.raises(RuleQueryError, match="empty query produced by metrics query template"):
        build_custom_query(rule=rule, mapper=SELECTOR_MAPPER, series="m",
                           resource=GroupResource("pods"), namespace=None, names=["p"],
                           metric_selector=Selector())


def test_unknown_template_field_fails_the_request_not_the_load() -> None:
    rule = SELECTOR_RULE.__class__(**{**SELECTOR_RULE.__dict__, "metrics_template":
                                      parse_template("<<.LabelMatchersByName>>", name="q")})
    with pytest.raises(RuleQueryError, match="can't evaluate field LabelMatchersByName"):
        build_custom_query(rule=rule, mapper=SELECTOR_MAPPER, series="m",
                           resource=GroupResource("pods"), namespace=None, names=["p"],
                           metric_selector=Selector())


def test_samples_are_matched_to_names_by_the_resource_label() -> None:
    matched = match_samples([({"pod": "a"}, 1), ({"pod": "b"}, 2), ({}, 3), ({"pod": "a"}, 4)],
                            resource_label="pod")
    assert dict(matched.by_name) == {"a": 4, "b": 2}
    assert (matched.unlabelled, matched.total) == (1, 4)


# --- no input can change a query's meaning --------------------------------------------------------

_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
            "\\": "\\", '"': '"', "'": "'"}
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)(=~|!~|!=|=)"((?:[^"\\\n]|\\.)*)"')


def promql_unquote(body: str) -> str:
    """PromQL's double-quoted string decoding, written independently of the adapter."""
    out = []
    index = 0
    while index < len(body):
        char = body[index]
        if char != "\\":
            out.append(char)
            index += 1
            continue
        code = body[index + 1]
        if code in _ESCAPES:
            out.append(_ESCAPES[code])
            index += 2
            continue
        width = {"x": 2, "u": 4, "U": 8}[code]
        out.append(chr(int(body[index + 2:index + 2 + width], 16)))
        index += 2 + width
    return "".join(out)


def decode_matchers(text: str, position: int = 0) -> tuple[list[tuple[str, str, str]], int]:
    """Parse `l1="v",l2=~"r"` from `position` up to a `}` (or the end) into (label, operator,
    decoded value); fail on anything else. Returns the matchers and where they stopped.
    """
    found = []
    while True:
        match = _MATCHER.match(text, position)
        assert match is not None, f"not a matcher at {text[position:]!r}"
        found.append((match.group(1), match.group(2), promql_unquote(match.group(3))))
        position = match.end()
        if position == len(text) or text[position] == "}":
            return found, position
        assert text[position] == ",", text[position:]
        position += 1


def literal_alternatives(regex: str) -> list[str]:
    """The literal strings an escaped alternation matches; fails on any live metacharacter."""
    alternatives, current, index = [], [], 0
    while index < len(regex):
        char = regex[index]
        if char == "\\":
            current.append(regex[index + 1])
            index += 2
            continue
        assert char not in ".+*?()[]{}^$", f"unescaped {char!r} in {regex!r}"
        if char == "|":
            alternatives.append("".join(current))
            current = []
        else:
            current.append(char)
        index += 1
    alternatives.append("".join(current))
    return alternatives


HOSTILE = st.one_of(
    st.sampled_from(['"}', '"} or vector(1) #', ".*", "|", "\\", "\n", "a|b", '\\"', "$x", "}{",
                     "\u2028", "\x00", "é", "(?i).*", "]", "'", "`"]),
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12),
)
LISTING_RULE = parse_config("""
rules:
- seriesQuery: 'm'
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  metricsQuery: 'x{<<.LabelMatchers>>}|<<index .LabelValuesByName "pod">>|'
""").rules[0]


@settings(max_examples=300)
@given(names=st.lists(HOSTILE, min_size=1, max_size=4, unique=True), namespace=HOSTILE,
       values=st.lists(HOSTILE, min_size=1, max_size=3, unique=True))
def test_no_name_or_value_changes_the_matchers(names: list[str], namespace: str,
                                               values: list[str]) -> None:
    # Selector values are validated label values in practice; build the requirement directly
    # so that even an unvalidated one must come out escaped.
    selector = Selector.of([Requirement("k", Operator.IN, tuple(sorted(values))),
                            Requirement("q", Operator.NOT_EQUALS, (values[0],))])
    built = build_custom_query(rule=LISTING_RULE, mapper=SELECTOR_MAPPER, series="m",
                               resource=GroupResource("pods"), namespace=namespace, names=names,
                               metric_selector=selector)
    assert built.promql.startswith("x{") and built.promql.endswith("|")
    decoded, end = decode_matchers(built.promql, 2)
    assert built.promql[end:end + 2] == "}|"
    by_name = built.promql[end + 2:-1]
    in_matcher = decoded[0]
    assert in_matcher[:2] == ("k", "=~")
    assert sorted(literal_alternatives(in_matcher[2])) == sorted(values)
    assert decoded[1] == ("q", "!=", values[0])
    assert decoded[2] == ("namespace", "=", namespace)
    if len(names) == 1:
        assert decoded[3] == ("pod", "=", names[0])
    else:
        assert decoded[3][:2] == ("pod", "=~")
        assert literal_alternatives(decoded[3][2]) == names
    assert len(decoded) == 4
    # `.LabelValuesByName` is escaped to sit inside "…": placed there it decodes exactly.
    placed = promql_unquote(by_name)
    assert (placed if len(names) == 1 else literal_alternatives(placed)) == \
        (names[0] if len(names) == 1 else names)


@given(text=HOSTILE)
def test_escape_regex_leaves_no_live_metacharacter(text: str) -> None:
    assert literal_alternatives(escape_regex(text)) == [text]


@pytest.mark.prometheus  # promtool, from the prometheus package
def test_promtool_parses_queries_built_from_hostile_names(tmp_path: Path) -> None:
    """Syntax check by Prometheus' own parser (promtool, no server): the escapes are PromQL's."""
    promtool = require_tool("promtool", env_var="PROMTOOL")
    hostile = ['"}', '"} or vector(1) #', ".*", "a|b", "\\", "\n", "\u2028", "\x00", "é",
               "\U0001f600", "}{", "'", "`", "\t\v"]
    expressions = []
    for index, name in enumerate(hostile):
        names = [name] if index % 2 else [name, f"{name}-2"]
        selector = Selector.of([Requirement("k", Operator.IN, (name, "x")),
                                Requirement("q", Operator.NOT_EQUALS, (name,))])
        expressions.append(build_custom_query(
            rule=SELECTOR_RULE.__class__(**{**SELECTOR_RULE.__dict__, "metrics_template":
                                            parse_template("sum(m{<<.LabelMatchers>>}) by "
                                                           "(<<.GroupBy>>)", name="q")}),
            mapper=SELECTOR_MAPPER, series="m", resource=GroupResource("pods"),
            namespace=name, names=names, metric_selector=selector).promql)
    rules = {"groups": [{"name": "escaping", "rules": [
        {"record": f"escaping_{i}", "expr": expr} for i, expr in enumerate(expressions)]}]}
    path = tmp_path / "rules.yaml"
    path.write_text(json.dumps(rules, ensure_ascii=False), encoding="utf-8")  # JSON is YAML
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
