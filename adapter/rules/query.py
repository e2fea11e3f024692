"""The PromQL a request turns into: prometheus-adapter's `Build`/`BuildExternal`, escaped safely.

`.LabelMatchers` is built in upstream's order: the metric selector's requirements (sorted by
key, values sorted), then `<namespace label>="<ns>"`, then the resource matcher (`=` for one
name, `=~` for several). Every value is written as a PromQL double-quoted string with Go's
`%q` escaping, and every value that lands inside a regex matcher is regex-escaped first, so
no selector value, object name or namespace can change what the query means. (Upstream joins
names into the regex unescaped, which makes a `.` in a name a wildcard.) Selector keys must be
Prometheus label names; anything else is a `UnsupportedSelectorError` (a 400 for the caller).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from adapter.rules.config import DiscoveryRule, ResourceRule
from adapter.rules.resources import (
    NAMESPACES,
    NODES,
    PODS,
    GroupResource,
    NoLabelForResourceError,
    ResourceMapper,
    is_promql_label_name,
)
from adapter.rules.templating import GoStruct, Template, TemplateExecutionError
from metricscale.core.selectors import Operator, Requirement, Selector, quote_go_string

__all__ = [
    "BuiltQuery",
    "Matcher",
    "QueryError",
    "RuleQueryError",
    "SampleMatch",
    "UnsupportedSelectorError",
    "UsageLabels",
    "build_custom_query",
    "build_external_query",
    "build_node_usage_query",
    "build_pod_usage_query",
    "escape_regex",
    "match_samples",
    "selector_matchers",
]


class QueryError(Exception):
    """The query cannot be built."""


class UnsupportedSelectorError(QueryError):
    """The request's selector has no exact PromQL form (the client's mistake: 400)."""


class RuleQueryError(QueryError):
    """The rule cannot build a query for this request (a configuration problem: 500)."""


_REGEX_META = re.compile(r"[\\.+*?()|\[\]{}^$]")


def escape_regex(text: str) -> str:
    """Go's `regexp.QuoteMeta`: every RE2 metacharacter backslash-escaped."""
    if _REGEX_META.search(text) is None:
        return text
    return _REGEX_META.sub(r"\\\g<0>", text)


def _alternation(values: Sequence[str]) -> str:
    """Values as a regex that matches exactly one of them, literally."""
    # Object names seldom hold a metacharacter: one search over all of them is much cheaper
    # than one substitution per name (a 2,000-pod request).
    if _REGEX_META.search("".join(values)) is None:
        return "|".join(values)
    return "|".join(map(escape_regex, values))


def _string_body(text: str) -> str:
    """`text` escaped for the inside of a PromQL double-quoted string (no quotes)."""
    return quote_go_string(text)[1:-1]


@dataclass(frozen=True)
class Matcher:
    """One label matcher. For `=~`/`!~` the value is the (already escaped) regex."""

    label: str
    operator: str  # "=", "!=", "=~", "!~"
    value: str

    def render(self) -> str:
        return f"{self.label}{self.operator}{quote_go_string(self.value)}"




def _requirement_matcher(requirement: Requirement) -> Matcher:
    """prometheus-adapter's `selectMatcher`/`selectTargetValue` table (prometheus-adapter.md §7)."""
    key, op, values = requirement.key, requirement.operator, requirement.sorted_values()
    if not is_promql_label_name(key):
        raise UnsupportedSelectorError(
            f"label selector key {quote_go_string(key)} is not a valid Prometheus label name")
    if op in (Operator.GREATER_THAN, Operator.LESS_THAN):
        raise UnsupportedSelectorError(
            f"label selector requirement {quote_go_string(str(requirement))}: operator not "
            "supported by prometheus")
    if op is Operator.EXISTS:
        return Matcher(key, "!=", "")
    if op is Operator.DOES_NOT_EXIST:
        return Matcher(key, "=", "")
    if not values:
        raise UnsupportedSelectorError(
            f"label selector requirement {quote_go_string(str(requirement))}: operator "
            "requires values")
    if op in (Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.NOT_EQUALS) and len(values) == 1:
        return Matcher(key, "!=" if op is Operator.NOT_EQUALS else "=", values[0])
    # `in`/`notin`, even with one value, are regex matchers upstream: keep the operator, but
    # escape the values so they match literally.
    negate = op in (Operator.NOT_EQUALS, Operator.NOT_IN)
    return Matcher(key, "!~" if negate else "=~", _alternation(values))


def _values_by_name(values: Sequence[str]) -> str:
    """A `.LabelValuesByName` entry: values joined by `|`, escaped to sit inside "…".

    With several values the entry is only usable in a regex matcher, so each value is also
    regex-escaped; a single value is left usable with `=` as well.
    """
    if len(values) == 1:
        return _string_body(values[0])
    return _string_body(_alternation(values))


def selector_matchers(selector: Selector) -> tuple[tuple[Matcher, str], ...]:
    """The matchers (and `.LabelValuesByName` entries) for a metric selector, in key order."""
    return tuple((_requirement_matcher(r), _values_by_name(r.sorted_values()))
                 for r in selector.requirements)


@dataclass(frozen=True)
class BuiltQuery:
    """The rendered PromQL and the label whose value names the object in each sample."""

    promql: str
    resource_label: str
    matchers: tuple[Matcher, ...]


def _checked_label(label: str, what: str) -> str:
    if not is_promql_label_name(label):
        raise RuleQueryError(f"the rule maps {what} to {quote_go_string(label)}, which is not a "
                             "valid Prometheus label name")
    return label


def _label_for(mapper: ResourceMapper, resource: GroupResource) -> str:
    try:
        return _checked_label(mapper.label_for_resource(resource), str(resource))
    except NoLabelForResourceError as error:
        raise RuleQueryError(str(error)) from None


def _render(template: Template, *, series: str, matchers: Sequence[Matcher],
            values_by_name: Mapping[str, str], group_by: Sequence[str],
            label_matchers: str | None = None) -> str:
    """`label_matchers`: the matchers already rendered, when the caller has them."""
    if label_matchers is None:
        label_matchers = ",".join(m.render() for m in matchers)
    data = GoStruct("naming.queryTemplateArgs", {
        "Series": series,
        "LabelMatchers": label_matchers,
        "LabelValuesByName": dict(values_by_name),
        "GroupBy": ",".join(group_by),
        "GroupBySlice": list(group_by),
    })
    try:
        promql = template.render(data)
    except TemplateExecutionError as error:
        raise RuleQueryError(str(error)) from None
    if not promql:
        raise RuleQueryError("empty query produced by metrics query template")
    return promql


def _build(*, template: Template, mapper: ResourceMapper, series: str, resource: GroupResource,
           namespace: str | None, names: Sequence[str], metric_selector: Selector) -> BuiltQuery:
    if not names:
        raise QueryError("no object names to query for")
    parts = list(selector_matchers(metric_selector))
    if namespace:
        namespace_label = _label_for(mapper, NAMESPACES)
        parts.append((Matcher(namespace_label, "=", namespace), _string_body(namespace)))
    resource_label = _label_for(mapper, resource)
    matchers = [matcher for matcher, _ in parts]
    values_by_name = {matcher.label: value for matcher, value in parts}
    # One name is an `=` matcher; several are one alternation, escaped once and used twice.
    rendered = [matcher.render() for matcher in matchers]
    rendered.append("")  # the resource's matcher, below
    if len(names) == 1:
        matchers.append(Matcher(resource_label, "=", names[0]))
        values_by_name[resource_label] = _string_body(names[0])
        rendered[-1] = matchers[-1].render()
    else:
        alternation = _alternation(names)
        body = _string_body(alternation)  # quoted once: the longest text of the query
        matchers.append(Matcher(resource_label, "=~", alternation))
        values_by_name[resource_label] = body
        rendered[-1] = f'{resource_label}=~"{body}"'
    group_by = [resource_label]
    promql = _render(template, series=series, matchers=matchers,
                     values_by_name=values_by_name, group_by=group_by,
                     label_matchers=",".join(rendered))
    return BuiltQuery(promql, resource_label, tuple(matchers))


def build_custom_query(*, rule: DiscoveryRule, mapper: ResourceMapper, series: str,
                       resource: GroupResource, namespace: str | None, names: Sequence[str],
                       metric_selector: Selector) -> BuiltQuery:
    """The query for a custom metric of `names` (objects of `resource`, normalised).

    `namespace` is None for cluster-scoped objects and for a namespace's own metrics (then
    `resource` is namespaces and `names` holds the namespace).
    """
    return _build(template=rule.metrics_template, mapper=mapper, series=series,
                  resource=resource, namespace=namespace, names=names,
                  metric_selector=metric_selector)


def build_external_query(*, rule: DiscoveryRule, mapper: ResourceMapper, series: str,
                         namespace: str | None, metric_selector: Selector) -> str:
    """`BuildExternal`: selector matchers, then the namespace unless `namespaced: false`.

    `.GroupBy` is empty and `.GroupBySlice` is `[]`, as upstream.
    """
    parts = list(selector_matchers(metric_selector))
    if rule.namespaced and namespace:
        namespace_label = _label_for(mapper, NAMESPACES)
        parts.append((Matcher(namespace_label, "=", namespace), _string_body(namespace)))
    return _render(rule.metrics_template, series=series, matchers=[m for m, _ in parts],
                   values_by_name={m.label: v for m, v in parts}, group_by=())


@dataclass(frozen=True)
class UsageLabels:
    """The labels a resource rule (`resourceRules.cpu`/`.memory`) maps pods, nodes, namespaces
    and containers to, resolved once from its `resources` and `containerLabel`."""

    pod: str
    node: str
    namespace: str
    container: str

    @classmethod
    def of(cls, rule: ResourceRule, mapper: ResourceMapper) -> UsageLabels:
        """Raises RuleQueryError when a resource has no label (checked at start-up)."""
        container = rule.container_label
        if container:
            _checked_label(container, "containers")
        return cls(pod=_label_for(mapper, PODS), node=_label_for(mapper, NODES),
                   namespace=_label_for(mapper, NAMESPACES), container=container)


def build_pod_usage_query(*, rule: ResourceRule, labels: UsageLabels, namespace: str,
                          pods: Sequence[str]) -> str:
    """`containerQuery` for `pods` of one namespace: `<ns>="…",<pod>(=|=~)"…"`, grouped by
    pod and container (prometheus-adapter.md §9)."""
    if not pods:
        raise QueryError("no pods to query for")
    parts = [(Matcher(labels.namespace, "=", namespace), _string_body(namespace)),
             _names_matcher(labels.pod, pods)]
    group_by = [labels.pod, labels.container] if labels.container else [labels.pod]
    return _render(rule.container_template, series="", matchers=[m for m, _ in parts],
                   values_by_name={m.label: v for m, v in parts}, group_by=group_by)


def build_node_usage_query(*, rule: ResourceRule, labels: UsageLabels,
                           nodes: Sequence[str]) -> str:
    """`nodeQuery` for `nodes`: `<node>(=|=~)"…"`, grouped by node; no namespace matcher."""
    if not nodes:
        raise QueryError("no nodes to query for")
    matcher, value = _names_matcher(labels.node, nodes)
    return _render(rule.node_template, series="", matchers=[matcher],
                   values_by_name={matcher.label: value}, group_by=[labels.node])


def _names_matcher(label: str, names: Sequence[str]) -> tuple[Matcher, str]:
    if len(names) == 1:
        return Matcher(label, "=", names[0]), _string_body(names[0])
    alternation = _alternation(names)
    return Matcher(label, "=~", alternation), _string_body(alternation)


T = TypeVar("T")


@dataclass(frozen=True)
class SampleMatch(Generic[T]):
    """Samples keyed by object name; how many samples lacked the resource label."""

    by_name: Mapping[str, T]
    unlabelled: int
    total: int


def match_samples(samples: Iterable[tuple[Mapping[str, str], T]], *,
                  resource_label: str) -> SampleMatch[T]:
    """`MatchValuesToNames`: key each sample by its resource label; the last one wins.

    Samples without the label are counted rather than filed under "" as upstream does, so an
    empty answer can say that the query dropped the label.
    """
    by_name: dict[str, T] = {}
    unlabelled = 0
    total = 0
    for labels, value in samples:
        total += 1
        name = labels.get(resource_label)
        if name is None:
            unlabelled += 1
            continue
        by_name[name] = value
    return SampleMatch(by_name, unlabelled, total)
