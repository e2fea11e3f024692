"""The discovery snapshot: keys, scope, last-writer-wins, shapes instead of series, counts."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from adapter.rules.config import AdapterConfig, parse_config
from adapter.rules.registry import (
    MetricRegistry,
    SeriesShape,
    build_registry,
    empty_registry,
    series_shapes,
)
from adapter.rules.resources import GroupResource, ResourceCatalog, ResourceInfo

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
CATALOG = ResourceCatalog.from_resources([
    ResourceInfo("pods", "pod", "Pod", "", "v1", True),
    ResourceInfo("services", "service", "Service", "", "v1", True),
    ResourceInfo("namespaces", "namespace", "Namespace", "", "v1", False),
    ResourceInfo("nodes", "node", "Node", "", "v1", False),
    ResourceInfo("persistentvolumes", "persistentvolume", "PersistentVolume", "", "v1", False),
    ResourceInfo("storageclasses", "storageclass", "StorageClass", "storage.k8s.io", "v1",
                 False),
    ResourceInfo("clusterwidgets", "clusterwidget", "ClusterWidget", "example.com", "v1",
                 False),
    ResourceInfo("widgets", "widget", "Widget", "example.com", "v1alpha1", True),
])


def config_with(resources: str, *, name: str = "", external: bool = False) -> AdapterConfig:
    section = "externalRules" if external else "rules"
    return parse_config(f"""
{section}:
- seriesQuery: q
  resources: {resources}
  name: {{matches: '{name}', as: ''}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
""")


def build(config: AdapterConfig, series: Sequence[tuple[str, Sequence[str]]],
          query: str = "q") -> MetricRegistry:
    shapes = [SeriesShape(name, frozenset(labels)) for name, labels in series]
    all_series = {q: [] for q in config.series_queries()} | {query: shapes}
    return build_registry(config=config, series=all_series, catalog=CATALOG, now=NOW)


def listing(registry: MetricRegistry) -> list[tuple[str, bool]]:
    return [(key.api_name, key.namespaced) for key in registry.custom_metrics()]


TEMPLATE = "{template: <<.Resource>>}"


@pytest.mark.parametrize(("labels", "expected"), [
    (["pod", "namespace"], [("namespaces/m", False), ("pods/m", True)]),
    (["node"], [("nodes/m", False)]),
    (["node", "instance"], [("nodes/m", False)]),
    (["persistentvolume", "namespace"], [("namespaces/m", False),
                                         ("persistentvolumes/m", False)]),
    # Upstream forces these namespaced; the catalog knows better.
    (["storageclass", "instance"], [("storageclasses.storage.k8s.io/m", False)]),
    (["clusterwidget"], [("clusterwidgets.example.com/m", False)]),
    (["widget", "namespace"], [("namespaces/m", False), ("widgets.example.com/m", True)]),
    (["instance", "le"], []),
])
def test_scope_follows_upstream_except_where_the_catalog_knows_better(
        labels: list[str], expected: list[tuple[str, bool]]) -> None:
    assert listing(build(config_with(TEMPLATE), [("m", labels)])) == expected


def test_a_cluster_scoped_crd_is_found_through_its_root_scoped_url() -> None:
    registry = build(config_with(TEMPLATE), [("m", ["clusterwidget"])])
    resolved = registry.resolve_custom(resource=GroupResource("clusterwidgets", "example.com"),
                                       namespace=None, metric="m")
    assert resolved is not None and resolved.info.kind == "ClusterWidget"


def test_the_hpas_namespaced_url_for_a_cluster_scoped_kind_finds_the_object() -> None:
    registry = build(config_with(TEMPLATE), [("m", ["node"])])
    resolved = registry.resolve_custom(resource=GroupResource("nodes"), namespace="shop",
                                       metric="m")
    assert resolved is not None and resolved.namespace is None


def test_a_namespaced_resource_is_not_found_through_a_root_scoped_url() -> None:
    registry = build(config_with(TEMPLATE), [("m", ["pod", "namespace"])])
    assert registry.resolve_custom(resource=GroupResource("pods"), namespace=None,
                                   metric="m") is None
    assert registry.resolve_custom(resource=GroupResource("pods"), namespace="a",
                                   metric="m") is not None


@pytest.mark.parametrize("written", ["pods", "pod", "Pods", "POD", "Pod"])
def test_resources_are_normalised_as_the_rest_mapper_does(written: str) -> None:
    registry = build(config_with(TEMPLATE), [("m", ["pod", "namespace"])])
    assert registry.resolve_custom(resource=GroupResource(written), namespace="a",
                                   metric="m") is not None


def test_unknown_resources_and_metrics_are_not_found() -> None:
    registry = build(config_with(TEMPLATE), [("m", ["pod", "namespace"])])
    assert registry.resolve_custom(resource=GroupResource("foos", "bar"), namespace="a",
                                   metric="m") is None
    assert registry.resolve_custom(resource=GroupResource("pods"), namespace="a",
                                   metric="M") is None


def test_a_label_shaped_like_the_template_but_unknown_does_not_set_the_namespaced_flag() -> None:
    # `nodes` plus a label the template matches but the catalog lacks: still cluster-scoped.
    registry = build(config_with("{template: 'kube_<<.Resource>>'}"),
                     [("m", ["kube_node", "kube_gizmo"])])
    assert listing(registry) == [("nodes/m", False)]


def test_overrides_for_resources_the_cluster_lacks_are_dropped_and_reported() -> None:
    registry = build(config_with("{overrides: {pod: {resource: pod}, "
                                 "brand: {group: cheese.io, resource: brand}}}"),
                     [("m", ["pod", "brand"])])
    assert listing(registry) == [("pods/m", True)]
    assert registry.stats.override_problems == (
        "rules[0]: unable to normalize group-resource brand.cheese.io of override 'brand': "
        "the cluster has no such resource; the label is ignored",)


def test_later_rules_win_for_the_same_key() -> None:
    config = parse_config("""
rules:
- seriesQuery: q
  resources: {template: <<.Resource>>}
  name: {matches: '^(.*)_total$', as: '$1'}
  metricsQuery: first
- seriesQuery: q
  resources: {template: <<.Resource>>}
  name: {matches: '^(.*)_count$', as: '$1'}
  metricsQuery: second
""")
    registry = build(config, [("a_total", ["pod", "namespace"]), ("a_count", ["pod", "namespace"])])
    resolved = registry.resolve_custom(resource=GroupResource("pods"), namespace="x", metric="a")
    assert resolved is not None
    assert (resolved.entry.series, resolved.entry.rule.metrics_query) == ("a_count", "second")


def test_filters_and_name_matches_drop_series() -> None:
    config = parse_config("""
rules:
- seriesQuery: q
  seriesFilters: [{isNot: '_seconds_total'}]
  resources: {template: <<.Resource>>}
  name: {matches: '^(.*)_total$'}
  metricsQuery: x
""")
    registry = build(config, [("a_total", ["pod"]), ("b_seconds_total_total", ["pod"]),
                              ("gauge", ["pod"])])
    assert [k.metric for k in registry.custom_metrics()] == ["a"]
    (rule,) = registry.stats.rules
    assert (rule.series_names, rule.matched_names, rule.metrics) == (3, 1, 1)


def test_series_that_cannot_be_queried_or_named_are_skipped_and_counted() -> None:
    config = parse_config("""
rules:
- seriesQuery: q
  resources: {template: <<.Resource>>}
  name: {matches: '^(.*)_total$', as: '$1_per_second'}
  metricsQuery: x
- seriesQuery: q
  resources: {template: <<.Resource>>}
  metricsQuery: x
""")
    registry = build(config, [("ok_total", ["pod"]), ('bad"name', ["pod"])])
    assert [k.metric for k in registry.custom_metrics()] == ["ok_total"]
    assert registry.stats.skipped_series_names == 2  # "" from $1_per_second, and bad"name


def test_external_registry_is_keyed_by_lower_cased_name_and_ignores_labels() -> None:
    registry = build(config_with("{namespaced: false}", external=True),
                     [("Queue_Depth", ["queue"]), ("other", [])])
    assert registry.external_metrics() == ("Queue_Depth", "other")
    entry = registry.resolve_external("queue_depth")
    assert entry is not None and entry.series == "Queue_Depth"
    assert registry.resolve_external("missing") is None
    assert registry.custom_metrics() == ()


def test_series_shapes_dedupe_series_and_share_label_sets() -> None:
    interned: dict[frozenset[str], frozenset[str]] = {}
    first = series_shapes([{"__name__": "a", "pod": "1", "ns": "x"},
                           {"__name__": "a", "pod": "2", "ns": "y"},
                           {"__name__": "b", "ns": "z", "pod": "3"}], interned=interned)
    second = series_shapes([{"__name__": "c", "pod": "9", "ns": "q"}], interned=interned)
    assert [s.name for s in first] == ["a", "b"]
    assert first[0].label_names == frozenset({"pod", "ns"})
    assert first[0].label_names is first[1].label_names is second[0].label_names


def test_stats_count_metrics_shapes_and_label_sets() -> None:
    registry = build(config_with(TEMPLATE), [("m", ["pod", "namespace"]), ("n", ["pod",
                                                                                "namespace"]),
                                             ("o", ["node"])])
    stats = registry.stats
    assert (stats.custom_metrics, stats.series_shapes, stats.label_sets) == (5, 3, 2)


def test_every_series_query_needs_a_result() -> None:
    with pytest.raises(ValueError, match="no series result"):
        build_registry(config=config_with(TEMPLATE), series={}, catalog=CATALOG, now=NOW)


def test_empty_registry_before_the_first_pass() -> None:
    registry = empty_registry(CATALOG)
    assert registry.built_at is None and registry.custom_metrics() == ()


def test_building_ten_thousand_series_of_one_shape_does_one_mapping() -> None:
    shapes = series_shapes({"__name__": f"metric_{i % 10}", "pod": str(i), "namespace": "x"}
                           for i in range(10_000))
    assert len(shapes) == 10
    registry = build_registry(config=config_with(TEMPLATE), series={"q": shapes},
                              catalog=CATALOG, now=NOW)
    assert registry.stats.custom_metrics == 20
