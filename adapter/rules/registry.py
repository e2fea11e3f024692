"""The discovery snapshot: which custom and external metrics exist, and how to query each.

`build_registry` turns one discovery pass (the `/api/v1/series` answers, one per distinct
`seriesQuery`) plus the rules and the cluster's `ResourceCatalog` into an immutable
`MetricRegistry`; the server swaps snapshots atomically. Memory follows metric names and
label-name sets, not series: `series_shapes` folds a series list into distinct
(name, label names) pairs that share their frozensets.

Registration follows prometheus-adapter: per rule in order, per series in order, the later
writer of a key wins; custom keys are (group-resource, namespaced, metric), external keys the
lower-cased metric name. The namespaced flag is upstream's (§4 of prometheus-adapter.md) with
one deliberate change: a resource the catalog knows to be cluster-scoped (a cluster-scoped CRD,
storageclasses, …) is registered as cluster-scoped, not forced to namespaced.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import NamedTuple, TypeVar

from adapter.rules.config import AdapterConfig, DiscoveryRule
from adapter.rules.naming import passes_filters
from adapter.rules.resources import (
    NAMESPACES,
    NODES,
    PERSISTENT_VOLUMES,
    CustomMetricKey,
    GroupResource,
    ResourceCatalog,
    ResourceInfo,
    ResourceMapper,
)

__all__ = [
    "CustomMetricEntry",
    "ExternalMetricEntry",
    "MetricRegistry",
    "RegistryStats",
    "ResolvedCustomMetric",
    "RuleStats",
    "SeriesShape",
    "build_registry",
    "empty_registry",
    "merge_registries",
    "series_shapes",
]

logger = logging.getLogger(__name__)

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class SeriesShape(NamedTuple):
    """What discovery keeps of a series: its name and its label names (without `__name__`)."""

    name: str
    label_names: frozenset[str]


def series_shapes(series: Iterable[Mapping[str, str]],
                  *, interned: dict[frozenset[str], frozenset[str]] | None = None,
                  ) -> list[SeriesShape]:
    """Distinct shapes of a `/api/v1/series` result, in first-seen order.

    `interned` may be shared across the calls of one pass so equal label sets of different
    series queries are one object.
    """
    pool = {} if interned is None else interned
    seen: dict[SeriesShape, None] = {}
    for labels in series:
        name = labels.get("__name__", "")
        names = frozenset(key for key in labels if key != "__name__")
        names = pool.setdefault(names, names)
        seen.setdefault(SeriesShape(name, names), None)
    return list(seen)


@dataclass(frozen=True)
class CustomMetricEntry:
    key: CustomMetricKey
    series: str
    rule: DiscoveryRule
    mapper: ResourceMapper
    # The tenants of a per-namespace backend whose discovery found it; None: every namespace.
    tenants: frozenset[str] | None = None


@dataclass(frozen=True)
class ExternalMetricEntry:
    metric: str  # as the rule names it (case kept)
    series: str
    rule: DiscoveryRule
    mapper: ResourceMapper
    tenants: frozenset[str] | None = None


@dataclass(frozen=True)
class ResolvedCustomMetric:
    """A request's metric after normalisation: the entry, the object kind, the namespace used."""

    entry: CustomMetricEntry
    info: ResourceInfo
    namespace: str | None


@dataclass(frozen=True)
class RuleStats:
    rule: str  # "rules[0]"
    series_names: int  # distinct series names the rule's series query returned
    matched_names: int  # of those, how many passed the filters and got an API name
    metrics: int  # registry keys this rule wrote (before later rules overwrote any)


@dataclass(frozen=True)
class RegistryStats:
    custom_metrics: int = 0
    external_metrics: int = 0
    series_shapes: int = 0
    label_sets: int = 0
    skipped_series_names: int = 0  # not valid PromQL metric names, or an empty API name
    rules: tuple[RuleStats, ...] = ()
    override_problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class MetricRegistry:
    """One immutable discovery snapshot."""

    custom: Mapping[CustomMetricKey, CustomMetricEntry]
    external: Mapping[str, ExternalMetricEntry]
    catalog: ResourceCatalog
    built_at: datetime | None
    stats: RegistryStats = field(default_factory=RegistryStats)

    def custom_metrics(self) -> tuple[CustomMetricKey, ...]:
        """Every custom metric, sorted by resource then metric (for discovery documents)."""
        return tuple(sorted(self.custom))

    def external_metrics(self) -> tuple[str, ...]:
        """Every external metric name as its rule spells it, sorted."""
        return tuple(sorted(entry.metric for entry in self.external.values()))

    def resolve_custom(self, *, resource: GroupResource, namespace: str | None,
                       metric: str) -> ResolvedCustomMetric | None:
        """Look a request up: normalise the resource as written (`pod`, `deployment.apps`),
        key by the URL's scope, and treat the HPA's namespaced URL for a cluster-scoped kind
        (`namespaces/x/nodes/n/m`) as the cluster-scoped object. None means 404.
        """
        info = self.catalog.find(resource)
        if info is None:
            return None
        if namespace is not None and not info.namespaced:
            namespace = None
        key = CustomMetricKey(info.group_resource, namespace is not None, metric)
        entry = self.custom.get(key)
        if entry is None:
            return None
        return ResolvedCustomMetric(entry, info, namespace)

    def resolve_external(self, metric: str) -> ExternalMetricEntry | None:
        """Case-insensitive: client-go lower-cases external metric names in URLs."""
        return self.external.get(metric.lower())


def empty_registry(catalog: ResourceCatalog) -> MetricRegistry:
    """The snapshot before the first discovery pass."""
    return MetricRegistry({}, {}, catalog, None)


class _RuleNames:
    """Per-rule memo of series name → API name (None: filtered out or unnamed)."""

    def __init__(self, rule: DiscoveryRule) -> None:
        self.rule = rule
        self.filters = rule.filters
        self.names: dict[str, str | None] = {}
        self.skipped = 0

    def api_name(self, series_name: str) -> str | None:
        if series_name in self.names:
            return self.names[series_name]
        name: str | None = None
        if passes_filters(self.filters, series_name):
            if not _METRIC_NAME.fullmatch(series_name):
                # Its name could not be written into a query; upstream would list it and then
                # fail every request.
                self.skipped += 1
                logger.warning("%s: skipping series %r: not a valid PromQL metric name",
                               self.rule.path, series_name)
            else:
                name = self.rule.name.api_name(series_name)
                if name == "":
                    self.skipped += 1
                    logger.warning("%s: series %r gives an empty metric name (as: %r)",
                                   self.rule.path, series_name, self.rule.name.as_template)
                    name = None
        self.names[series_name] = name
        return name


_CLUSTER_BY_UPSTREAM = (NAMESPACES, NODES, PERSISTENT_VOLUMES)


def build_registry(*, config: AdapterConfig, series: Mapping[str, Iterable[SeriesShape]],
                   catalog: ResourceCatalog, now: datetime,
                   backend: str | None = None, tenant: str | None = None) -> MetricRegistry:
    """Build a snapshot. `series` maps every `config.series_queries()` entry to its shapes.

    With `backend`, only the rules bound to that backend count (and only their series queries
    need an answer): one backend's part of the snapshot, merged by `merge_registries`. With
    `tenant`, the entries are served only in the namespaces of that tenant.
    """
    tenants = None if tenant is None else frozenset({tenant})
    queries = config.series_queries() if backend is None else config.series_queries_for(backend)
    missing = [query for query in queries if query not in series]
    if missing:
        raise ValueError(f"no series result for series queries {missing!r}")
    materialized = {query: list(shapes) for query, shapes in series.items()}
    custom: dict[CustomMetricKey, CustomMetricEntry] = {}
    external: dict[str, ExternalMetricEntry] = {}
    rule_stats: list[RuleStats] = []
    problems: list[str] = []
    skipped = 0
    for rule in config.rules:
        if backend is not None and rule.backend != backend:
            continue
        mapper = ResourceMapper.build(template=rule.resources.label_template,
                                      overrides=rule.resources.overrides, catalog=catalog)
        problems.extend(f"{rule.path}: {problem}" for problem in mapper.problems)
        names = _RuleNames(rule)
        label_cache: dict[str, GroupResource | None] = {}
        resources_cache: dict[frozenset[str], tuple[tuple[GroupResource, ...], bool]] = {}
        written = 0
        for shape in materialized[rule.series_query]:
            metric = names.api_name(shape.name)
            if metric is None:
                continue
            mapped = resources_cache.get(shape.label_names)
            if mapped is None:
                mapped = mapper.resources_for_labels(shape.label_names, label_cache)
                resources_cache[shape.label_names] = mapped
            resources, flag = mapped
            for resource in resources:
                namespaced = flag and resource not in _CLUSTER_BY_UPSTREAM
                info = catalog.info(resource)
                if info is not None and not info.namespaced:
                    namespaced = False
                key = CustomMetricKey(resource, namespaced, metric)
                custom[key] = CustomMetricEntry(key, shape.name, rule, mapper, tenants)
                written += 1
        skipped += names.skipped
        rule_stats.append(_rule_stats(rule, names=names, written=written))
    for rule in config.external_rules:
        if backend is not None and rule.backend != backend:
            continue
        mapper = ResourceMapper.build(template=rule.resources.label_template,
                                      overrides=rule.resources.overrides, catalog=catalog)
        problems.extend(f"{rule.path}: {problem}" for problem in mapper.problems)
        names = _RuleNames(rule)
        written = 0
        for shape in materialized[rule.series_query]:
            metric = names.api_name(shape.name)
            if metric is None:
                continue
            external[metric.lower()] = ExternalMetricEntry(metric, shape.name, rule, mapper,
                                                           tenants)
            written += 1
        skipped += names.skipped
        rule_stats.append(_rule_stats(rule, names=names, written=written))
    all_shapes = {shape for shapes in materialized.values() for shape in shapes}
    stats = RegistryStats(
        custom_metrics=len(custom), external_metrics=len(external),
        series_shapes=len(all_shapes),
        label_sets=len({shape.label_names for shape in all_shapes}),
        skipped_series_names=skipped, rules=tuple(rule_stats),
        override_problems=tuple(dict.fromkeys(problems)))
    return MetricRegistry(custom, external, catalog, now, stats)


_Entry = TypeVar("_Entry", CustomMetricEntry, ExternalMetricEntry)


def _with_tenants_of(earlier: _Entry | None, later: _Entry) -> _Entry:
    """`later`, also served to the tenants that found `earlier` on the same backend."""
    if (earlier is None or earlier.tenants is None or later.tenants is None
            or earlier.rule is not later.rule):
        return later
    return replace(later, tenants=earlier.tenants | later.tenants)


def merge_registries(parts: Sequence[MetricRegistry], *,
                     catalog: ResourceCatalog) -> MetricRegistry:
    """One snapshot from each backend's: every metric of every part (a later part wins a key
    two backends both have, as a later rule does). `built_at` is the oldest part's, or None
    while no part has been built; a part not built yet simply adds nothing.
    """
    built = [part for part in parts if part.built_at is not None]
    if len(built) == 1 and len(parts) == 1:
        return built[0]
    custom: dict[CustomMetricKey, CustomMetricEntry] = {}
    external: dict[str, ExternalMetricEntry] = {}
    for part in built:
        for key, entry in part.custom.items():
            custom[key] = _with_tenants_of(custom.get(key), entry)
        for name, external_entry in part.external.items():
            external[name] = _with_tenants_of(external.get(name), external_entry)
    stats = RegistryStats(
        custom_metrics=len(custom), external_metrics=len(external),
        series_shapes=sum(part.stats.series_shapes for part in built),
        label_sets=sum(part.stats.label_sets for part in built),
        skipped_series_names=sum(part.stats.skipped_series_names for part in built),
        rules=tuple(rule for part in built for rule in part.stats.rules),
        override_problems=tuple(dict.fromkeys(
            problem for part in built for problem in part.stats.override_problems)))
    built_at = min((part.built_at for part in built if part.built_at is not None), default=None)
    return MetricRegistry(custom, external, catalog, built_at, stats)


def _rule_stats(rule: DiscoveryRule, *, names: _RuleNames, written: int) -> RuleStats:
    matched = sum(1 for name in names.names.values() if name is not None)
    return RuleStats(rule.path, len(names.names), matched, written)
