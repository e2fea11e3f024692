"""prometheus-adapter as a differential oracle (issue 22).

The real prometheus-adapter v0.12.0 (tests/peers) and `metricscale adapter` run on the same
configuration, against the same Prometheus and the same objects in a real control plane, and
are asked the same requests directly over HTTPS as kube-apiserver's aggregator asks them (the
front-proxy client certificate, `X-Remote-User`/`X-Remote-Group`; both delegate authentication
and authorization to kube-apiserver under their own manifests' RBAC). Four pairs run: on
prometheus-adapter's `config-gen` rules, on metricscale's default rules, on the rule forms of
prometheus-adapter's documentation, and on rules that discover nothing
(tests/differential/world.py).

Their answers (status, media type, `Warning` headers, body, and the PromQL each sent to
Prometheus) must be the same but for what legitimately varies (timestamps, the order of sets)
and for the deliberate differences in `DIFFERENCES` below, the one table of them: an answer
that differs in any other way fails, and so does a row whose witness no longer shows it.
docs/differences-prometheus-adapter.md is the same table in Markdown (a test keeps it so).

Requests: every discovered metric in every URL shape (tests/differential/paths.py), then
Hypothesis-generated selectors, names, paths, and objects with values; `ORACLE_EXAMPLES=500`
searches deeper than the suite's 25 examples per property. Configurations: prometheus-adapter
is started on each of `CONFIG_CASES` and must accept or refuse it as our loader does.
"""

from __future__ import annotations

import itertools
import os
import re
import urllib.parse
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapter.rules.config import ConfigError, parse_config
from tests.differential import paths
from tests.differential import reconcilers as r
from tests.differential.comparison import (
    Context,
    Difference,
    Request,
    Witness,
    describe,
    normalize,
    sorted_alternatives,
)
from tests.differential.conftest import Oracle
from tests.differential.harness import Exchange, PromQuery, upstream_accepts
from tests.differential.world import CLUSTER_SCOPED_RESOURCES, DUPLICATE_LABEL_RULES

# --------------------------------------------------------------------------------------------
# The reconcilers: each undoes one declared difference, and only where an answer shows it


def _post_queries(_: Context, upstream: Exchange, ours: Exchange
                  ) -> tuple[Exchange, Exchange] | None:
    if not ours.queries or any(q.method != "POST" for q in ours.queries):
        return None
    if any(q.method != "GET" for q in upstream.queries):
        return None
    return upstream, r.map_queries(ours, lambda q: replace(q, method="GET"))


def _core_api_version(_: Context, upstream: Exchange, ours: Exchange
                      ) -> tuple[Exchange, Exchange] | None:
    def fix(item: dict[str, Any]) -> dict[str, Any]:
        described = item.get("describedObject")
        if isinstance(described, dict) and described.get("apiVersion") == "/v1":
            described["apiVersion"] = "v1"
        return item

    return r.map_items(upstream, fix), ours


_REGEX_META = re.compile(r"[\\.+*?()|\[\]{}^$]")


def _regex_values(context: Context) -> list[str]:
    """The selector values the request puts into regex matchers (upstream's, unescaped)."""
    values: list[str] = []
    for parameter in ("metricLabelSelector", "labelSelector"):
        selector = context.request.query(parameter) or ""
        for group in re.findall(r"\b(?:in|notin)\s*\(([^)]*)\)", selector):
            values.extend(v.strip() for v in group.split(","))
        # `k!=v` is compared with upstream's answer to `k notin (v)`, a regex there
        values.extend(m.group(2) for m in _NOT_EQUAL.finditer(selector))
    return values


def _plain(promql: str) -> str:
    """A query with regex escapes undone and alternatives in one order."""
    return sorted_alternatives(r.promql_unescape_regex(promql))


def _regex_escaping(context: Context, upstream: Exchange, ours: Exchange
                    ) -> tuple[Exchange, Exchange] | None:
    wanted = {q.promql for q in upstream.queries}

    def unescape(query: PromQuery) -> PromQuery:
        plain = _plain(query.promql)
        return replace(query, promql=plain) if plain in wanted else query

    unescaped = r.map_queries(ours, unescape)
    same_queries = sorted(q.promql for q in unescaped.queries) == sorted(wanted)
    if (same_queries and (upstream.status, upstream.body) != (ours.status, ours.body)
            and any(_REGEX_META.search(value) for value in _regex_values(context))):
        # Upstream's unescaped `.` in a selector value matched other series: its answer is
        # another query's. The query is the same but for the escaping; ours is the answer.
        return replace(upstream, body=ours.body, status=ours.status,
                       warnings=ours.warnings), unescaped
    return upstream, unescaped


def _says_more(said: str, says: str) -> bool:
    return said != says and says.startswith(said.rstrip())


def _error_messages_say_more(_: Context, upstream: Exchange, ours: Exchange
                             ) -> tuple[Exchange, Exchange] | None:
    theirs, mine = r.status(upstream), r.status(ours)
    if theirs is None or mine is None or upstream.status != ours.status:
        return None
    body = dict(mine)
    said, says = str(theirs.get("message", "")), str(mine.get("message", ""))
    if _says_more(said, says):
        body["message"] = said
    their_causes = (theirs.get("details") or {}).get("causes") or []
    my_causes = (mine.get("details") or {}).get("causes") or []
    if len(their_causes) == len(my_causes) and their_causes:
        causes = [{**mine_, "message": theirs_.get("message")}
                  if _says_more(str(theirs_.get("message", "")), str(mine_.get("message", "")))
                  else mine_ for theirs_, mine_ in zip(their_causes, my_causes, strict=True)]
        body["details"] = {**(mine.get("details") or {}), "causes": causes}
    return upstream, r.with_body(ours, body)


def _empty_answers_are_404(context: Context, upstream: Exchange, ours: Exchange
                           ) -> tuple[Exchange, Exchange] | None:
    found = r.items(upstream)
    if upstream.status != 200 or found != [] or not r.is_not_found_metric(ours):
        return None
    if context.request.group not in ("custom.metrics.k8s.io", "external.metrics.k8s.io"):
        return None
    return upstream, replace(ours, status=200, content_type=upstream.content_type,
                             body=upstream.body, warnings=upstream.warnings)


def _warnings_say_why(_: Context, upstream: Exchange, ours: Exchange
                      ) -> tuple[Exchange, Exchange] | None:
    if upstream.warnings or not ours.warnings:
        return None
    if not all(re.fullmatch(r'299 - ".+"', w) for w in ours.warnings):
        return None
    return upstream, replace(ours, warnings=())


_CUSTOM_GROUP = "custom.metrics.k8s.io"
_EXTERNAL_GROUP = "external.metrics.k8s.io"
_RESOURCE_GROUP = "metrics.k8s.io"


def _groups(body: Any) -> list[dict[str, Any]] | None:
    if isinstance(body, dict) and body.get("kind") == "APIGroupList":
        return [dict(g) for g in body.get("groups", [])]
    return None


def _apis_document_fields(_: Context, upstream: Exchange, ours: Exchange
                          ) -> tuple[Exchange, Exchange] | None:
    def trimmed(body: Any) -> Any:
        if not isinstance(body, dict) or body.get("kind") not in ("APIGroupList", "APIGroup"):
            return body
        body = dict(body)
        if "apiVersion" not in body:
            body["apiVersion"] = "v1"
        if body["kind"] == "APIGroup":
            body.pop("serverAddressByClientCIDRs", None)
        else:
            body["groups"] = [{k: v for k, v in g.items() if k != "serverAddressByClientCIDRs"}
                              for g in body.get("groups", [])]
        return body

    return r.with_body(upstream, trimmed(upstream.body)), ours


def _custom_versions(_: Context, upstream: Exchange, ours: Exchange
                     ) -> tuple[Exchange, Exchange] | None:
    def as_upstream(group: dict[str, Any]) -> dict[str, Any]:
        if group.get("name") != _CUSTOM_GROUP:
            return group
        v1beta1 = {"groupVersion": f"{_CUSTOM_GROUP}/v1beta1", "version": "v1beta1"}
        return {**group, "versions": [v1beta1], "preferredVersion": v1beta1}

    body = ours.body
    if isinstance(body, dict) and body.get("kind") == "APIGroup":
        return upstream, r.with_body(ours, as_upstream(body))
    groups = _groups(body)
    if groups is None:
        return None
    return upstream, r.with_body(ours, {**body, "groups": [as_upstream(g) for g in groups]})


_PLACEHOLDERS = {"/custommetrics", "externalmetrics"}


def _groups_always_served(context: Context, upstream: Exchange, ours: Exchange
                          ) -> tuple[Exchange, Exchange] | None:
    theirs = _groups(upstream.body)
    mine = _groups(ours.body)
    if theirs is not None and mine is not None:
        served = {g.get("name") for g in theirs}
        return upstream, r.with_body(ours, {**ours.body, "groups": [
            g for g in mine if g.get("name") in served]})
    resources, placeholder = r.api_resource_list(upstream), r.api_resource_list(ours)
    if resources == [] and placeholder is not None and \
            {str(p.get("name")) for p in placeholder} <= _PLACEHOLDERS:
        return upstream, r.with_resources(ours, [])
    # a group upstream does not serve at all: its paths are the generic server's 404
    if (upstream.status == 404 and isinstance(upstream.body, dict) and "paths" in upstream.body
            and context.request.group in (_CUSTOM_GROUP, _EXTERNAL_GROUP)):
        return upstream, upstream
    return None


def _cluster_scoped_resource(path: str) -> tuple[str, bool] | None:
    """(resource, asked with a namespace) when `path` asks for a custom metric of one of the
    world's cluster-scoped resources that prometheus-adapter takes for namespaced, or of
    nodes or persistentvolumes by the namespaced URL the HPA builds for them."""
    parts = path.split("?", 1)[0].split("/")
    if len(parts) < 6 or parts[2] != _CUSTOM_GROUP:
        return None
    rest = parts[4:]
    namespaced = rest[0] == "namespaces" and len(rest) == 5
    written = (rest[2] if namespaced else rest[0]).lower()
    resource = _CLUSTER_SCOPED_SPELLINGS.get(written)
    if resource is None:
        return None
    if resource in CLUSTER_SCOPED_RESOURCES or namespaced:
        return resource, namespaced
    return None


# How a URL may write a cluster-scoped resource (both servers resolve these, case aside).
_SINGULARS = {"widgets": "widget", "storageclasses": "storageclass", "nodes": "node",
              "persistentvolumes": "persistentvolume", "namespaces": "namespace"}
_CLUSTER_SCOPED_SPELLINGS = {
    spelling: full
    for full in (*CLUSTER_SCOPED_RESOURCES, "nodes", "persistentvolumes", "namespaces")
    for plural, _, group in [full.partition(".")]
    for name in (plural, _SINGULARS[plural])
    for spelling in ((name, f"{name}.{group}") if group else (name,))}


def _real_scope(context: Context, upstream: Exchange, ours: Exchange
                ) -> tuple[Exchange, Exchange] | None:
    listed = r.api_resource_list(upstream)
    if listed is not None:
        def scoped(resource: dict[str, Any]) -> dict[str, Any]:
            if str(resource.get("name", "")).split("/")[0] in CLUSTER_SCOPED_RESOURCES:
                return {**resource, "namespaced": False}
            return resource
        return r.with_resources(upstream, [scoped(x) for x in listed]), ours
    asked = _cluster_scoped_resource(context.request.path)
    if asked is None:
        return None
    _, namespaced = asked
    if (r.is_not_found_metric(upstream)
            or r.message(upstream).endswith("unable to list matching resources")):
        # upstream registered the metric as namespaced: the root-scoped path does not exist
        # for it, it cannot list a cluster-scoped resource in a namespace, and it asks for a
        # namespace label that a cluster-scoped object's series need not have
        return ours, ours
    if not namespaced:
        return None
    namespace = context.request.path.split("/")[5]

    def unscoped(item: dict[str, Any]) -> dict[str, Any]:
        described = item.get("describedObject")
        if isinstance(described, dict):
            described.pop("namespace", None)
        return item

    def without_namespace(query: PromQuery) -> PromQuery:
        return replace(query, promql=query.promql.replace(f'namespace="{namespace}",', ""))

    return r.map_queries(r.map_items(upstream, unscoped), without_namespace), ours


def _unnamed_metrics(_: Context, upstream: Exchange, ours: Exchange
                     ) -> tuple[Exchange, Exchange] | None:
    listed = r.api_resource_list(upstream)
    if listed is None:
        return None
    named = [x for x in listed if str(x.get("name", "")).rsplit("/", 1)[-1]]
    return r.with_resources(upstream, named), ours


_LABEL_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)(=~|=)"')


def _deterministic_labels(_: Context, upstream: Exchange, ours: Exchange
                          ) -> tuple[Exchange, Exchange] | None:
    if len(upstream.queries) != 1 or len(ours.queries) != 1:
        return None
    theirs, mine = upstream.queries[0].promql, ours.queries[0].promql
    for label in {m.group(1) for m in _LABEL_MATCHER.finditer(theirs)}:
        for other in {m.group(1) for m in _LABEL_MATCHER.finditer(mine)}:
            if other >= label:
                continue
            swapped = re.sub(rf"\b{label}\b", other, theirs)
            if _plain(swapped) == _plain(mine):
                return ours, ours
    return None


_NOT_EQUAL = re.compile(r"([A-Za-z0-9_./-]+)\s*!=\s*([A-Za-z0-9_.-]*)")


def _not_equal_selector(context: Context, upstream: Exchange, ours: Exchange
                        ) -> tuple[Exchange, Exchange] | None:
    selector = context.request.query("metricLabelSelector")
    if selector is None or "!=" not in selector:
        return None
    if upstream.status != 500 or "is not a valid label selector operator" not in \
            r.message(upstream):
        return None
    rewritten = _NOT_EQUAL.sub(r"\1 notin (\2)", selector)
    again = context.ask_upstream(r.path_with_query(context.request.path,
                                                   metricLabelSelector=rewritten))
    pairs = [(m.group(1), m.group(2)) for m in _NOT_EQUAL.finditer(selector)]
    wanted = {q.promql for q in ours.queries}

    def as_not_equal(query: PromQuery) -> PromQuery:
        # `k notin (v)` is `k!~"v"`: each `!=` of the selector is one of those, but not
        # every one of those need be a `!=` (the selector may also say `k notin (v)`)
        spots = [m for key, value in pairs
                 for m in re.finditer(rf'\b{re.escape(key)}!~"{re.escape(value)}"',
                                      query.promql)]
        for chosen in itertools.combinations(spots, len(pairs)):
            promql = query.promql
            for spot in sorted(chosen, key=lambda m: m.start(), reverse=True):
                promql = promql[:spot.start()] + spot.group().replace("!~", "!=", 1) + \
                    promql[spot.end():]
            if _plain(promql) in {_plain(w) for w in wanted}:
                return replace(query, promql=promql)
        return query

    return r.map_queries(again, as_not_equal), ours


_PROMETHEUS_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _unusable_selector_keys_or_operators(selector: str) -> bool:
    if "<" in selector or ">" in selector:
        return True
    keys = re.findall(r"(?:^|,)\s*!?\s*([^\s,=!<>()]+)", selector)
    return any(not _PROMETHEUS_LABEL.fullmatch(key) for key in keys)


def _bad_selectors_are_400(context: Context, upstream: Exchange, ours: Exchange
                           ) -> tuple[Exchange, Exchange] | None:
    mine = r.status(ours)
    if ours.status != 400 or mine is None or mine.get("reason") != "BadRequest":
        return None
    name = "labelSelector" if context.request.group == _EXTERNAL_GROUP else "metricLabelSelector"
    selector = context.request.query(name)
    if selector is None or upstream.status not in (404, 500):
        return None
    parse_error = upstream.status == 500 and r.message(upstream) == r.message(ours)
    if parse_error or _unusable_selector_keys_or_operators(selector):
        return ours, ours
    return None


def _values(exchange: Exchange) -> set[str]:
    return {value for query in exchange.queries for value in query.values}


def _exact_values(context: Context, upstream: Exchange, ours: Exchange
                  ) -> tuple[Exchange, Exchange] | None:
    theirs, mine = r.items(upstream), r.items(ours)
    if theirs is None or mine is None or len(theirs) != len(mine):
        return None
    samples = _values(upstream) | _values(ours)
    nan_is_zero = context.request.group != _EXTERNAL_GROUP
    changed = False
    fixed = []
    for their_item, my_item in zip(theirs, mine, strict=True):
        said, says = their_item.get("value"), my_item.get("value")
        if said != says and any(
                r.quantity(r.go_milli(s, nan_is_zero=nan_is_zero)) == said
                and r.exact_milli(s) is not None and r.quantity(r.exact_milli(s) or 0) == says
                for s in samples):
            their_item = {**their_item, "value": says}
            changed = True
        fixed.append(their_item)
    if not changed:
        return None
    return r.with_body(upstream, {**upstream.body, "items": fixed}), ours


_INDEFINITE = r.quantity(r.GO_INT64_INDEFINITE)


_INFINITE = ("+inf", "-inf", "inf")


def _non_finite_values(_: Context, upstream: Exchange, ours: Exchange
                       ) -> tuple[Exchange, Exchange] | None:
    infinite = [dict(labels) for query in (*upstream.queries, *ours.queries)
                for labels, value in query.samples if value.lower() in _INFINITE]
    if not infinite:
        return None

    def of_an_infinite_sample(item: dict[str, Any]) -> dict[str, Any] | None:
        if item.get("value") != _INDEFINITE:
            return item
        if "metricLabels" in item:  # external: the item carries the sample's labels
            labels = item.get("metricLabels") or {}
            return None if any(labels == sample for sample in infinite) else item
        described = item.get("describedObject") or {}
        name = described.get("name")
        return None if any(name in sample.values() for sample in infinite) else item

    return r.map_items(upstream, of_an_infinite_sample), ours


def _external_names_ignore_case(context: Context, upstream: Exchange, ours: Exchange
                                ) -> tuple[Exchange, Exchange] | None:
    if context.request.group != _EXTERNAL_GROUP or not r.is_not_found_metric(upstream):
        return None
    base, _, query = context.request.path.partition("?")
    asked = urllib.parse.unquote(base.rsplit("/", 1)[-1])
    listed = paths.listed(context.ask_upstream(_EXT).body)
    registered = [name for name, _ in listed if name.lower() == asked.lower() and name != asked]
    if len(registered) != 1:
        return None
    again = context.ask_upstream(base.rsplit("/", 1)[0] + "/" + registered[0]
                                 + (f"?{query}" if query else ""))
    return again, ours


_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _can_exist(resource: str, name: str) -> bool:
    """Whether an object of `resource` (as a URL writes it) can be called `name`, by the
    validation kube-apiserver applies to its kind."""
    kind = resource.split(".", 1)[0].lower()
    if kind in ("namespaces", "namespace", "ns"):
        return _DNS1123_LABEL.fullmatch(name) is not None
    if kind in ("services", "service", "svc"):
        return _DNS1035_LABEL.fullmatch(name) is not None
    return len(name) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(name) is not None


def _impossible_names(path: str) -> bool:
    """A metrics path naming a namespace or object that cannot exist."""
    parts = [urllib.parse.unquote(p) for p in path.split("?", 1)[0].split("/")]
    if len(parts) < 5 or parts[2] not in (_CUSTOM_GROUP, _EXTERNAL_GROUP, _RESOURCE_GROUP):
        return False
    rest = parts[4:]
    if parts[2] == _RESOURCE_GROUP:
        if rest[0] == "namespaces" and len(rest) >= 2 and not _can_exist("namespaces", rest[1]):
            return True
        rest = rest[2:] if rest[0] == "namespaces" else rest
        return len(rest) == 2 and not _can_exist(rest[0], rest[1])
    if rest[0] == "namespaces" and len(rest) >= 2 and rest[1] != "*":
        if not _can_exist("namespaces", rest[1]):
            return True
        rest = rest[2:]
    if parts[2] == _CUSTOM_GROUP and len(rest) == 3 and rest[1] != "*":
        return not _can_exist(rest[0], rest[1])
    return False


def _names_checked_first(context: Context, _: Exchange, ours: Exchange
                         ) -> tuple[Exchange, Exchange] | None:
    mine = r.status(ours)
    if (ours.status != 404 or mine is None or ours.queries
            or mine.get("message") != "the server could not find the requested resource"):
        return None
    if not _impossible_names(context.request.path):
        return None
    return ours, ours


_AMBIGUOUS_PATH_REFUSALS = {
    "dot segments are not allowed in the request path",
    "encoded slashes are not allowed in the request path",
    "malformed percent-encoding in the request path",
    "NUL is not allowed in the request path",
    "the request path is not UTF-8",
}


def _ambiguous_paths_refused(context: Context, _: Exchange, ours: Exchange
                             ) -> tuple[Exchange, Exchange] | None:
    mine = r.status(ours)
    if ours.status != 400 or mine is None or mine.get("message") not in _AMBIGUOUS_PATH_REFUSALS:
        return None
    raw = context.request.path.split("?", 1)[0]
    segments = raw.split("/")
    if "." in segments or ".." in segments or re.search(r"%(2[fF]|00|(?![0-9a-fA-F]{2}))", raw):
        return ours, ours
    return None


def _all_namespaces_refused(context: Context, _: Exchange, ours: Exchange
                            ) -> tuple[Exchange, Exchange] | None:
    mine = r.status(ours)
    if (ours.status != 400 or mine is None or mine.get("message")
            != 'namespace "*" is not supported: request one namespace at a time'):
        return None
    parts = [urllib.parse.unquote(p) for p in context.request.path.split("?", 1)[0].split("/")]
    namespace_metric = len(parts) == 8 and parts[6] == "metrics"  # served by both
    if len(parts) > 6 and parts[4] == "namespaces" and parts[5] == "*" and not namespace_metric:
        return ours, ours
    return None


_EXTERNAL_NOT_FOUND = re.compile(r"(the server could not find the metric \S+) for ?\S*")


def _external_not_found_message(context: Context, upstream: Exchange, ours: Exchange
                                ) -> tuple[Exchange, Exchange] | None:
    if context.request.group != _EXTERNAL_GROUP:
        return None
    if not (r.is_not_found_metric(upstream) and r.is_not_found_metric(ours)):
        return None
    found = _EXTERNAL_NOT_FOUND.fullmatch(r.message(upstream))
    if found is None or not r.message(ours).startswith(found.group(1)):
        return None
    return upstream, r.with_body(ours, {**ours.body, "message": r.message(upstream)})


def _lookup_before_listing(_: Context, upstream: Exchange, ours: Exchange
                           ) -> tuple[Exchange, Exchange] | None:
    if not (upstream.status == 500
            and r.message(upstream).endswith("unable to list matching resources")):
        return None
    return (ours, ours) if r.is_not_found_metric(ours) else None


def _selector_error_wording(_: Context, upstream: Exchange, ours: Exchange
                            ) -> tuple[Exchange, Exchange] | None:
    theirs = r.status(upstream)
    if theirs is None or "a qualified name must consist of" not in r.message(upstream):
        return None
    said = r.message(upstream).replace("a qualified name must consist of",
                                       "a valid label key must consist of")
    return r.with_body(upstream, {**theirs, "message": said}), ours


def _metrics_is_no_resource(context: Context, upstream: Exchange, ours: Exchange
                            ) -> tuple[Exchange, Exchange] | None:
    parts = context.request.path.split("?", 1)[0].split("/")
    if not (len(parts) == 9 and parts[2] == _CUSTOM_GROUP and parts[4] == "namespaces"
            and parts[6] == "metrics"):
        return None
    if (r.is_not_found_metric(upstream) and r.is_not_found_metric(ours)
            and "the cluster has no resource type 'metrics'" in r.message(ours)):
        return ours, ours
    return None


def _aggregated_discovery_lists_every_group(_: Context, upstream: Exchange, ours: Exchange
                                            ) -> tuple[Exchange, Exchange] | None:
    theirs, mine = upstream.body, ours.body
    if not (isinstance(theirs, dict) and isinstance(mine, dict)
            and theirs.get("kind") == mine.get("kind") == "APIGroupDiscoveryList"):
        return None
    served = {(item.get("metadata") or {}).get("name") for item in theirs.get("items", [])}
    kept = [item for item in mine.get("items", [])
            if (item.get("metadata") or {}).get("name") in served]
    return upstream, r.with_body(ours, {**mine, "items": kept})


_JSON = "application/json"


def _json_only(context: Context, upstream: Exchange, ours: Exchange
               ) -> tuple[Exchange, Exchange] | None:
    if context.request.accept == _JSON:
        return None
    if upstream.content_type != _JSON:
        if ours.status == 406:  # the Accept rules JSON out
            return ours, ours
        if ours.content_type == _JSON:
            # the same answer in the one encoding we write: compare it with upstream's JSON
            return context.ask_upstream(context.request.path), ours
        return None
    theirs, mine = r.status(upstream), r.status(ours)
    if (upstream.status == ours.status == 406 and theirs is not None and mine is not None
            and theirs.get("reason") == mine.get("reason") == "NotAcceptable"):
        return ours, ours
    return None


def _external_labels_never_null(context: Context, upstream: Exchange, ours: Exchange
                                ) -> tuple[Exchange, Exchange] | None:
    if context.request.group != _EXTERNAL_GROUP:
        return None

    def empty(item: dict[str, Any]) -> dict[str, Any]:
        if item.get("metricLabels") is None:
            item["metricLabels"] = {}
        return item

    return r.map_items(upstream, empty), ours


def _not_found_is_a_status(_: Context, upstream: Exchange, ours: Exchange
                           ) -> tuple[Exchange, Exchange] | None:
    mine = r.status(ours)
    if (upstream.status == 404 and isinstance(upstream.body, dict) and "paths" in upstream.body
            and ours.status == 404 and mine is not None and mine.get("reason") == "NotFound"):
        return ours, ours
    return None


# --------------------------------------------------------------------------------------------
# THE TABLE: every deliberate difference from prometheus-adapter v0.12.0, in the order the
# reconcilers are applied. docs/differences-prometheus-adapter.md is this table in Markdown.

_V2 = "/apis/custom.metrics.k8s.io/v1beta2"
_EXT = "/apis/external.metrics.k8s.io/v1beta1"

DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        "post-queries",
        "Instant queries go to Prometheus by `POST` with a form body; prometheus-adapter sends "
        "`GET` unless `--prometheus-verb=POST`.",
        "A `*` request puts every selected object's name into one regex; in a URL that meets "
        "proxy and server limits (prometheus-adapter #668: HTTP 414 at ~150 pods). "
        "`--prometheus-verb=GET` restores upstream's verb.",
        _post_queries,
        witnesses=(Witness("docs", f"{_V2}/namespaces/{{ns}}/pods/web-1/rss_bytes"),)),
    Difference(
        "regex-escaping",
        "Object names and selector values that land in a regex matcher (`pod=~\"a|b\"`, "
        "`k in (a,b)`, even `k in (a)`, and `.LabelValuesByName` when it joins several) are "
        "regex-escaped, `pod=~\"cache\\\\.v1|cachexv1\"`; prometheus-adapter joins them raw, "
        "so a `.` matches any character. For object names the answers are the same (samples "
        "are matched back to objects by exact name); for a selector value such as "
        "`pod in (cache.v1)` upstream's answer also counts the series of `cachexv1`.",
        "A name or value selects its own series only; nothing a caller writes can change what "
        "a query means.",
        _regex_escaping,
        witnesses=(Witness("docs", f"{_V2}/namespaces/{{ns}}/pods/*/rss_bytes?labelSelector="
                                   "app%3Dcache"),)),
    Difference(
        "core-api-version",
        "`describedObject.apiVersion` of a core object is `v1`; prometheus-adapter writes `/v1` "
        "(the empty group, a slash, the version).",
        "`v1` is how Kubernetes writes the core group's version; clients parse both alike.",
        _core_api_version,
        witnesses=(Witness("docs", f"{_V2}/namespaces/{{ns}}/pods/db-0/rss_bytes"),)),
    Difference(
        "apis-document-fields",
        "`/apis` (APIGroupList) and `/apis/<group>` (APIGroup) carry `apiVersion: v1` and no "
        "`serverAddressByClientCIDRs`; prometheus-adapter omits the former from `/apis` and "
        "fills the latter with its own port (`:<secure-port>`).",
        "Clients reach the adapter through kube-apiserver, which answers `/apis` itself; the "
        "adapter's own listening address means nothing to them.",
        _apis_document_fields,
        witnesses=(Witness("docs", "/apis"),)),
    Difference(
        "custom-versions",
        "`/apis/custom.metrics.k8s.io` and its entry in `/apis` list `v1beta2` (preferred) and "
        "`v1beta1`; prometheus-adapter lists only `v1beta1`, though it serves both.",
        "Both versions are served, so the group document lists both, preferring the one the "
        "HPA uses.",
        _custom_versions,
        witnesses=(Witness("docs", "/apis/custom.metrics.k8s.io"),)),
    Difference(
        "groups-always-served",
        "`custom.metrics.k8s.io` and `external.metrics.k8s.io` are served even when the "
        "configuration has no rules for them, and a discovery list without metrics holds one "
        "placeholder (`/custommetrics`, `externalmetrics`); prometheus-adapter does not serve a "
        "group without rules (404) and lists no placeholder (`resources: []`).",
        "The manifests register all three APIServices: a group that is not served makes its "
        "APIService `FailedDiscoveryCheck`, kubectl warn on every command and namespace "
        "deletion stall; client-go ≥ 0.26 takes an empty list for a discovery failure.",
        _groups_always_served,
        witnesses=(Witness("defaults", _EXT), Witness("config-gen", "/apis"),
                   Witness("nothing", "/apis/custom.metrics.k8s.io/v1beta1"))),
    Difference(
        "real-scope",
        "Cluster-scoped resources (CRDs, storage classes, ...) are listed and served as "
        "cluster-scoped, from the cluster's discovery: `<resource>/<name>/<metric>` answers, "
        "and the HPA's namespaced URL for a cluster-scoped kind (also nodes and "
        "persistentvolumes) is answered for the cluster-scoped object, with no namespace "
        "matcher. prometheus-adapter registers every resource but namespaces, nodes and "
        "persistentvolumes as namespaced: the root-scoped URL is a 404 (its issue #327), a "
        "namespaced `*` fails to list (500), and a namespaced name queries a namespace label.",
        "A cluster-scoped object has no namespace; serving it where the API puts it is what "
        "makes metrics of cluster-scoped CRDs usable at all.",
        _real_scope,
        witnesses=(Witness("config-gen", "/apis/custom.metrics.k8s.io/v1beta1"),
                   Witness("docs", f"{_V2}/widgets.oracle.metricscale.io/w-1/"
                                   "oracle_widget_power"))),
    Difference(
        "unnamed-metrics",
        "A series whose `name.as` expands to an empty name (`as: \"$1_per_second\"`, where Go "
        "reads the group `1_per_second`) is skipped; prometheus-adapter lists `pods/`, "
        "`namespaces/`, ... (a metric with an empty name).",
        "No request can name an empty metric; the entry only hides the configuration mistake "
        "(`${1}_per_second` was meant).",
        _unnamed_metrics,
        witnesses=(Witness("docs", "/apis/custom.metrics.k8s.io/v1beta1"),)),
    Difference(
        "deterministic-labels",
        "When several `overrides` labels name one resource, the lexically smallest is the one "
        "queried; prometheus-adapter picks one in Go's map order, anew at each start (its "
        "issue #398).",
        "The same configuration must query the same label on every start and every replica.",
        _deterministic_labels,
        witnesses=tuple(Witness("docs", f"{_V2}/namespaces/{{ns}}/pods/web-1/oracle_dup_{i:02d}")
                        for i in range(1, DUPLICATE_LABEL_RULES + 1)),
        any_witness=True),  # upstream picks `pod` for each rule half the time
    Difference(
        "not-equal-selector",
        "A `metricLabelSelector` with `!=` is served (`k!=\"v\"`) and echoed in "
        "`metric.selector` as `NotIn`; prometheus-adapter answers 500 (`\"!=\" is not a valid "
        "label selector operator`). The answer is the one upstream gives for `k notin (v)`, "
        "but for `notin`'s regex reading of a `.`.",
        "`k!=v` is a valid label selector and has an exact PromQL form.",
        _not_equal_selector,
        witnesses=(Witness("config-gen", f"{_V2}/namespaces/{{ns}}/pods/*/oracle_queue_length"
                                         "?metricLabelSelector=verb%21%3DPOST"),)),
    Difference(
        "bad-selectors-400",
        "A `metricLabelSelector` (custom) or `labelSelector` (external) that does not parse, "
        "uses `<`/`>`, or has a key that is not a Prometheus label name is a 400 BadRequest; "
        "prometheus-adapter answers 500 (parse errors), 404 (`<`/`>` on custom metrics) or "
        "500 (the invalid PromQL it sends).",
        "The caller's mistake is a client error, said as such, and no invalid PromQL is sent.",
        _bad_selectors_are_400,
        witnesses=(Witness("config-gen", f"{_V2}/namespaces/{{ns}}/pods/*/oracle_queue_length"
                                         "?metricLabelSelector=%3D%3D%3D"),
                   Witness("config-gen", f"{_V2}/namespaces/{{ns}}/pods/*/oracle_queue_length"
                                         "?metricLabelSelector=verb%3E1"),
                   Witness("docs", f"{_EXT}/namespaces/{{ns}}/queue_consumer_lag"
                                   "?labelSelector=app.kubernetes.io%2Fname%3Dx"))),
    Difference(
        "external-names-ignore-case",
        "External metric names match without regard to case; prometheus-adapter matches them "
        "exactly.",
        "The HPA lower-cases external metric names in its URLs (kubernetes#72996), so with "
        "upstream a metric with capitals cannot be used from an HPA.",
        _external_names_ignore_case,
        witnesses=(Witness("docs", f"{_EXT}/namespaces/{{ns}}/oraclequeuedepth"),)),
    Difference(
        "external-labels-never-null",
        "An external metric computed as a scalar (`scalar(...)`) has `metricLabels: {}`; "
        "prometheus-adapter writes `null` there (and `{}` for a vector sample without labels).",
        "The field is a map: Go clients such as the HPA read `null` and `{}` alike, and clients "
        "in other languages need no null check.",
        _external_labels_never_null,
        witnesses=(Witness("docs", f"{_EXT}/namespaces/{{ns}}/oracle_external_scalar"),)),
    Difference(
        "exact-values",
        "Sample values become quantities from their exact decimal text, truncated to a "
        "thousandth: `1.001` is `1001m`; prometheus-adapter computes `int64(v*1000)` in floating "
        "point, which gives `1` for `1.001` (and `1.003`, `2.01`, ...; not for `0.57`, which is "
        "`570m` in both). `NaN` is `0` in external answers too, where prometheus-adapter has no "
        "guard and writes `-9223372036854775808m`, Go's `int64` of NaN (it writes `0` for "
        "custom metrics, as we do).",
        "The value Prometheus wrote is the value served; a NaN is no measurement of "
        "minus nine quintillion.",
        _exact_values,
        witnesses=(Witness("docs", f"{_V2}/namespaces/{{ns}}/pods/web-1/rss_bytes"),
                   Witness("docs", f"{_EXT}/namespaces/{{ns}}/oracle_external_special"))),
    Difference(
        "non-finite-values",
        "`+Inf`/`-Inf` samples are left out of custom and external answers; prometheus-adapter "
        "serves them as `-9223372036854775808m` (Go's `int64` of an infinity).",
        "That number is no measurement; an HPA acting on it would scale to its minimum.",
        _non_finite_values,
        witnesses=(Witness("docs", f"{_V2}/namespaces/{{ns}}/pods/web-2/oracle_special_value"),
                   Witness("docs", f"{_EXT}/namespaces/{{ns}}/oracle_external_special"))),
    Difference(
        "warnings-say-why",
        "A list that leaves out some selected objects, and a resource-metrics 404 for an object "
        "without metrics, carry a `Warning` header saying how many and why; prometheus-adapter "
        "leaves them out silently.",
        "kubectl prints warnings; without one, a missing pod looks like a bug of the caller.",
        _warnings_say_why,
        witnesses=(Witness("docs", f"{_V2}/namespaces/{{ns}}/pods/*/oracle_special_value"),
                   Witness("config-gen", "/apis/metrics.k8s.io/v1beta1/nodes/node-a"))),
    Difference(
        "empty-answers-404",
        "Where prometheus-adapter answers 200 with `items: []` (no series matched, or none for "
        "the selected objects), a 404 NotFound says so and why: `the server could not find the "
        "metric m for pods: no series matched the query of rules[3]`.",
        "The HPA turns `items: []` into \"no metrics returned\" with no hint why; the 404's "
        "message reaches its events and conditions.",
        _empty_answers_are_404,
        witnesses=(Witness("config-gen", f"{_V2}/namespaces/{{ns}}/pods/*/oracle_queue_length"
                                         "?metricLabelSelector=verb%3DPUT"),)),
    Difference(
        "error-messages-say-more",
        "Error messages start with prometheus-adapter's words and go on to say what is wrong "
        "(the object and selector asked for, the rule, the reason): `the server could not find "
        "the metric m for pods web-1`, `...: no series matched the query of rules[3]`, "
        "`unable to fetch metrics: externalRules[2] cannot build a query ...`.",
        "The message is all an HPA's user sees; it should say what to fix. The status code and "
        "reason are upstream's.",
        _error_messages_say_more,
        witnesses=(Witness("config-gen", f"{_V2}/namespaces/{{ns}}/pods/missing-object/"
                                         "oracle_queue_length"),
                   Witness("docs", f"{_EXT}/namespaces/{{ns}}/oracle_unmapped_lag"))),
    Difference(
        "names-checked-first",
        "A namespace or object name that cannot exist (not valid for its kind: a DNS-1123 "
        "label for namespaces, a DNS-1035 label for services, a DNS-1123 subdomain for the "
        "rest, custom resources included) is a 404 `the server could not find the requested "
        "resource` before any query is built; prometheus-adapter puts it into a query as it "
        "is.",
        "No object can have such a name, so no answer can be right; refusing it first is what "
        "makes every name safe to write into PromQL.",
        _names_checked_first,
        witnesses=(Witness("config-gen", f"{_V2}/namespaces/{{ns}}/pods/Web-1/"
                                         "oracle_queue_length"),)),
    Difference(
        "ambiguous-paths-refused",
        "A request path with a `.` or `..` segment, an encoded slash (`%2F`), an encoded NUL or "
        "a malformed escape is a 400 BadRequest; prometheus-adapter decodes it and serves "
        "whatever the decoded path names.",
        "Authorization and routing must read the path the same way; a path two layers could "
        "read two ways is refused rather than authorized as one thing and served as another.",
        _ambiguous_paths_refused,
        witnesses=(Witness("config-gen", f"{_V2}/namespaces/{{ns}}/pods/./oracle_queue_length"),)),
    Difference(
        "lookup-before-listing",
        "A `*` request looks the metric up before it selects objects: a resource the cluster "
        "does not have (`po`, a typo, a CRD not installed) or a metric not served for the "
        "resource is a 404 NotFound (`... the cluster has no resource type 'po'`); "
        "prometheus-adapter lists the objects first, and when that fails (unknown resource, "
        "a cluster-scoped resource listed in a namespace) answers 500 `unable to list matching "
        "resources`.",
        "Nothing failed on the server's side: what was asked for does not exist, and the "
        "answer says so.",
        _lookup_before_listing,
        witnesses=(Witness("config-gen", f"{_V2}/namespaces/{{ns}}/po/*/oracle_queue_length"),
                   Witness("config-gen", f"{_V2}/namespaces/{{ns}}/nosuchthings/*/"
                                         "oracle_queue_length"))),
    Difference(
        "selector-error-wording",
        "A label key that does not parse is reported in the words of current Kubernetes "
        "(`a valid label key must consist of ...`, as kube-apiserver v1.36 says it); "
        "prometheus-adapter v0.12, built on apimachinery 0.30, says `a qualified name must "
        "consist of ...`.",
        "The message is Kubernetes' own; it follows the release the cluster runs.",
        _selector_error_wording,
        witnesses=(Witness("docs", f"{_EXT}/namespaces/{{ns}}/queue_consumer_lag"
                                   "?labelSelector=%2F%2F"),)),
    Difference(
        "metrics-is-no-resource",
        "`namespaces/<ns>/metrics/<name>/<metric>` is a 404 saying the cluster has no resource "
        "type `metrics`; prometheus-adapter's router reads it as the namespace's metric "
        "`<name>` (`the server could not find the metric * for namespaces`). Both are 404 "
        "NotFound.",
        "A five-segment path names an object of a resource, and there is no resource "
        "`metrics`.",
        _metrics_is_no_resource,
        witnesses=(Witness("config-gen", f"{_V2}/namespaces/{{ns}}/metrics/*/"
                                         "oracle_queue_length"),)),
    Difference(
        "all-namespaces-refused",
        "`namespaces/*/<resource>/...` (custom) and `namespaces/*/<metric>` (external) are a 400 "
        "BadRequest `namespace \"*\" is not supported: request one namespace at a time`; "
        "prometheus-adapter takes `*` for a namespace of that name (a 404, or `items: []`), "
        "or, for an external rule with `namespaced: false`, for no namespace at all. "
        "(`namespaces/*/metrics/<metric>`, the namespaces' own metrics, is served by both.)",
        "`*` is no namespace; both readings are guesses, and an HPA always asks in its own "
        "namespace.",
        _all_namespaces_refused,
        witnesses=(Witness("docs", f"{_EXT}/namespaces/*/queue_depth"),
                   Witness("config-gen", f"{_V2}/namespaces/*/pods/*/oracle_queue_length"))),
    Difference(
        "external-not-found-message",
        "An unknown external metric is `the server could not find the metric m`; "
        "prometheus-adapter appends ` for namespaces` in namespace `default` and ` for ` "
        "(nothing after) in any other namespace.",
        "Upstream's suffix names no resource an external metric could have.",
        _external_not_found_message,
        witnesses=(Witness("docs", f"{_EXT}/namespaces/{{ns}}/missing"),
                   Witness("docs", f"{_EXT}/namespaces/default/missing"))),
    Difference(
        "aggregated-discovery-lists-every-group",
        "`/apis` asked for aggregated discovery (`APIGroupDiscoveryList`, as kube-apiserver's "
        "aggregator asks) lists `custom.metrics.k8s.io` and `external.metrics.k8s.io` with "
        "their metrics, beside `metrics.k8s.io`; prometheus-adapter's lists only "
        "`metrics.k8s.io` (custom-metrics-apiserver installs the other two outside the generic "
        "server's aggregated discovery, so the aggregator falls back to each version's "
        "`/apis/<group>/<version>`).",
        "The document the aggregator asks for first should be complete.",
        _aggregated_discovery_lists_every_group,
        witnesses=(Witness("docs", "/apis", accept=paths.AGGREGATED_DISCOVERY),)),
    Difference(
        "json-only",
        "Answers are JSON: with the HPA's `Accept: application/vnd.kubernetes.protobuf, */*` "
        "the answer is JSON (prometheus-adapter answers protobuf), and an `Accept` that rules "
        "JSON out (`application/vnd.kubernetes.protobuf` alone, `application/yaml`) is a 406 "
        "NotAcceptable naming `application/json` (prometheus-adapter serves protobuf and YAML; "
        "its 406 lists them).",
        "Every client of these APIs (the HPA through client-go, kubectl, KEDA) takes JSON; the "
        "values are the same either way.",
        _json_only,
        witnesses=(Witness("docs", f"{_V2}/namespaces/{{ns}}/pods/*/rss_bytes",
                           accept=paths.HPA_ACCEPT),
                   Witness("docs", f"{_V2}/namespaces/{{ns}}/pods/*/rss_bytes",
                           accept="application/yaml"))),
    Difference(
        "not-found-is-a-status",
        "A path no route serves is a 404 NotFound `Status` (`the server could not find the "
        "requested resource`), as kube-apiserver answers; prometheus-adapter's generic server "
        "answers a 404 whose body lists its own paths.",
        "Clients expect a Status from an API server; the list of paths helps no client.",
        _not_found_is_a_status,
        witnesses=(Witness("docs", "/apis/unknown.example.com/v1"),)),
    Difference(
        "rules-that-cannot-work",
        "A rule without `seriesQuery` or `metricsQuery`, and an `overrides` key that is not a "
        "Prometheus label name, are configuration errors; prometheus-adapter starts, then fails "
        "every discovery pass or every request of that rule.",
        "A configuration that cannot work should be refused where it is read, with its rule and "
        "line.",
        configs=("no-metrics-query", "no-series-query", "override-key-not-a-label")),
    Difference(
        "missing-resources",
        "An override naming a resource the cluster does not have (a CRD not installed yet) is "
        "ignored and reported; prometheus-adapter exits at start (`unable to normalize "
        "group-resource`).",
        "One rule for a CRD that is not there yet must not take every other metric down; the "
        "resource is picked up when it appears.",
        configs=("override-of-a-missing-resource",)),
    Difference(
        "regex-features",
        "Three RE2 features with no exact equivalent here are refused with a clear message: "
        "`\\p{...}` classes, the `(?U)` flag and negated POSIX classes `[[:^alpha:]]`; "
        "prometheus-adapter accepts them. (Syntax RE2 itself refuses, such as lookarounds, both "
        "refuse.)",
        "A pattern that cannot be given its RE2 meaning must not be given another one.",
        configs=("unicode-class-in-matches", "ungreedy-flag-in-filter",
                 "negated-posix-class-in-filter")),
    Difference(
        "template-actions",
        "`define`, `template`, `block`, `break`, `continue`, `call` and `js` in a template are "
        "refused when the configuration is read; prometheus-adapter accepts them.",
        "No known configuration uses them; what is refused cannot be executed wrongly.",
        configs=("define-in-metrics-query", "block-in-metrics-query", "js-in-metrics-query")),
)


# --------------------------------------------------------------------------------------------
# The tests

pytestmark = [pytest.mark.prometheus]

PAIRS = ("config-gen", "defaults", "docs", "nothing")


def _requests_for(oracle: Oracle, name: str) -> list[Request]:
    """Every request the pair is asked: discovery, every listed metric in every shape, the
    external metrics, resource metrics, and the odd paths."""
    pair, world = oracle.pairs[name], oracle.world
    custom: set[tuple[str, bool]] = set()
    external: set[str] = set()
    for server in pair.servers:
        custom |= set(paths.listed(server.get_json("/apis/custom.metrics.k8s.io/v1beta1")))
        external |= {n for n, _ in paths.listed(server.get_json(_EXT))}
    custom = {(name, scope) for name, scope in custom if name not in _PLACEHOLDERS}
    external -= _PLACEHOLDERS
    return [*paths.discovery_requests(name), *paths.custom_requests(name, world, custom),
            *paths.external_requests(name, world, external),
            *paths.resource_metrics_requests(name, world),
            *paths.odd_requests(name, world, "oracle_queue_length")]


def _check(oracle: Oracle, requests: Iterable[Request]) -> Counter[str]:
    """Compares every request; fails listing the answers that differ in undeclared ways."""
    observed: Counter[str] = Counter()
    failures = []
    count = 0
    for request in requests:
        count += 1
        outcome = oracle.compare(request, DIFFERENCES)
        observed.update(outcome.observed)
        if not outcome.same:
            failures.append(describe(outcome))
    assert not failures, (
        f"{len(failures)} of {count} answers differ from prometheus-adapter's in a way the "
        f"table DIFFERENCES does not declare:\n\n" + "\n\n".join(failures[:8]))
    return observed


@pytest.mark.parametrize("pair", PAIRS)
def test_every_rule_form_answers_as_prometheus_adapter_does(oracle: Oracle, pair: str) -> None:
    _check(oracle, _requests_for(oracle, pair))


def _fill(oracle: Oracle, witness: Witness) -> Request:
    path = witness.path.replace("{ns2}", oracle.world.other_namespace).replace(
        "{ns}", oracle.world.namespace)
    return Request(witness.pair, path, witness.method, witness.accept)


@pytest.mark.parametrize("difference", [d for d in DIFFERENCES if d.witnesses],
                         ids=lambda d: d.id)
def test_each_declared_difference_shows_in_its_witness(oracle: Oracle,
                                                       difference: Difference) -> None:
    outcomes = [oracle.compare(_fill(oracle, w), DIFFERENCES) for w in difference.witnesses]
    for outcome in outcomes:
        assert outcome.same, describe(outcome)
    showing = [difference.id in o.observed for o in outcomes]
    assert any(showing) if difference.any_witness else all(showing), (
        f"a witness of {difference.id} does not show it (remove it from the table, or find "
        "requests that show it):\n\n" + "\n\n".join(
            describe(o) for o, shows in zip(outcomes, showing, strict=True) if not shows))


# --------------------------------------------------------------------------------------------
# Generated requests on top: selectors, names and paths, then objects and values

# ORACLE_EXAMPLES=500 for a deeper search than the suite's (the servers are shared anyway).
_EXAMPLES = int(os.environ.get("ORACLE_EXAMPLES", "25"))
_HYPOTHESIS = settings(max_examples=_EXAMPLES, deadline=None,
                       suppress_health_check=[HealthCheck.too_slow])

_KEYS = ("verb", "pod", "service", "namespace", "app", "tier", "le", "name", "topic",
         "app.kubernetes.io/name", "k8s-app", "Verb")
_VALUES = ("GET", "POST", "web-1", "cache.v1", "db-0", "web", "cache", "back", "orders", "t1",
           "", "x.y", "A_1", "9")


@st.composite
def _requirement(draw: st.DrawFn) -> str:
    key = draw(st.sampled_from(_KEYS))
    values = draw(st.lists(st.sampled_from(_VALUES), min_size=1, max_size=3, unique=True))
    form = draw(st.sampled_from(("=", "==", "!=", "in", "notin", "exists", "!", ">", "<")))
    if form in ("=", "==", "!="):
        return f"{key}{form}{values[0]}"
    if form in ("in", "notin"):
        return f"{key} {form} ({','.join(values)})"
    if form == "exists":
        return key
    if form == "!":
        return f"!{key}"
    return f"{key}{form}{draw(st.integers(min_value=0, max_value=9))}"


_selectors = st.one_of(
    st.lists(_requirement(), min_size=1, max_size=3).map(",".join),
    st.text(alphabet="a=!,()<> .-_/x", max_size=12))

# (pair, path with {ns}, the query parameter the selector goes into)
_SELECTOR_TARGETS = (
    ("config-gen", f"{_V2}/namespaces/{{ns}}/pods/*/oracle_queue_length", "metricLabelSelector"),
    ("defaults", f"{_V2}/namespaces/{{ns}}/pods/web-1/oracle_queue_length",
     "metricLabelSelector"),
    ("config-gen", f"{_V2}/namespaces/{{ns}}/services/*/oracle_http_requests",
     "metricLabelSelector"),
    ("defaults", f"{_V2}/namespaces/{{ns}}/metrics/oracle_queue_length", "metricLabelSelector"),
    ("docs", "/apis/custom.metrics.k8s.io/v1beta1/namespaces/{ns}/pods/*/"
             "http_requests_per_second", "metricLabelSelector"),
    ("docs", f"{_V2}/nodes/*/oracle_node_temperature_celsius", "metricLabelSelector"),
    ("docs", f"{_EXT}/namespaces/{{ns}}/queue_consumer_lag", "labelSelector"),
    ("docs", f"{_EXT}/namespaces/{{ns}}/queue_depth", "labelSelector"),
    ("config-gen", f"{_V2}/namespaces/{{ns}}/pods/*/oracle_queue_length", "labelSelector"),
    ("docs", f"{_V2}/namespaces/{{ns}}/pods/*/rss_bytes", "labelSelector"),
    ("defaults", "/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods", "labelSelector"),
    ("defaults", "/apis/metrics.k8s.io/v1beta1/nodes", "labelSelector"),
    ("defaults", f"{_V2}/namespaces/*/metrics/oracle_queue_length", "labelSelector"),
)


@_HYPOTHESIS
@given(target=st.sampled_from(_SELECTOR_TARGETS), selector=_selectors)
def test_generated_selectors_answer_as_prometheus_adapter_does(
        oracle: Oracle, target: tuple[str, str, str], selector: str) -> None:
    pair, path, parameter = target
    query = urllib.parse.urlencode({parameter: selector})
    _check(oracle, [_fill(oracle, Witness(pair, f"{path}?{query}"))])


# JSON, the HPA's, kubectl's (JSON first, protobuf too) and one that rules JSON out
_ACCEPTS = st.sampled_from(("application/json", paths.HPA_ACCEPT,
                            "application/json, application/vnd.kubernetes.protobuf",
                            "application/yaml"))

_RESOURCES = ("pods", "pod", "po", "Pods", "POD", "services", "svc", "deployments.apps",
              "deployment.apps", "deploy", "deployments", "nodes", "node", "namespaces",
              "jobs.batch", "widgets.oracle.metricscale.io", "widget", "storageclasses",
              "sc", "persistentvolumes", "pv", "gadgets", "unknowns", "pods.apps", "metrics")
_NAMES = st.one_of(
    st.sampled_from(("*", "web-1", "cache.v1", "cachexv1", "db-0", "web", "node-a", "w-1",
                     "g-1", "oracle-fast", "oracle-pv-1", "missing", "Web-1", "web_1", ".",
                     "..", "%2A", "a%2Fb", "x" * 300, "é", "web-1 ")),
    st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=1, max_size=12))
_METRICS = ("oracle_queue_length", "http_requests_per_second", "rss_bytes", "oracle_dup_03",
            "cpu_usage", "oracle_node_temperature_celsius", "oracle_widget_power",
            "oracle_special_value", "Oracle_Queue_Length", "queue_consumer_lag")


def _segment(text: str) -> str:
    if text in ("*", "%2A", "a%2Fb"):
        return text  # already as the client writes it
    return urllib.parse.quote(text, safe="")


@_HYPOTHESIS
@given(pair=st.sampled_from(PAIRS), version=st.sampled_from(("v1beta1", "v1beta2")),
       namespace=st.sampled_from(("{ns}", "{ns2}", "*", "default", "Missing", "none-such",
                                  None)),
       resource=st.sampled_from(_RESOURCES), name=_NAMES, metric=st.sampled_from(_METRICS),
       accept=_ACCEPTS)
def test_generated_paths_answer_as_prometheus_adapter_does(
        oracle: Oracle, pair: str, version: str, namespace: str | None, resource: str,
        name: str, metric: str, accept: str) -> None:
    base = f"/apis/custom.metrics.k8s.io/{version}"
    if namespace is not None:
        base += f"/namespaces/{namespace}"
    path = f"{base}/{_segment(resource)}/{_segment(name)}/{_segment(metric)}"
    _check(oracle, [_fill(oracle, Witness(pair, path, accept=accept))])


@_HYPOTHESIS
@given(namespace=st.sampled_from(("{ns}", "{ns2}", "*", "default", "Missing")),
       name=_NAMES, external=st.sampled_from(("queue_consumer_lag", "queue_depth",
                                              "OracleQueueDepth", "oraclequeuedepth",
                                              "QUEUE_DEPTH", "oracle_external_raw", "missing")),
       pods=st.booleans(), accept=_ACCEPTS)
def test_generated_external_and_resource_paths_answer_as_prometheus_adapter_does(
        oracle: Oracle, namespace: str, name: str, external: str, pods: bool,
        accept: str) -> None:
    resource = "/apis/metrics.k8s.io/v1beta1"
    requests = [
        Witness("docs", f"{_EXT}/namespaces/{namespace}/{_segment(external)}", accept=accept),
        Witness("defaults", f"{resource}/namespaces/{namespace}/pods/{_segment(name)}"
                if pods else f"{resource}/nodes/{_segment(name)}", accept=accept),
    ]
    _check(oracle, [_fill(oracle, w) for w in requests])


_DECIMAL_TEXTS = st.one_of(
    st.sampled_from(("1.001", "0.57", "2.01", "0.001", "0.0009", "-1.001", "1E+3", "1.5E+6",
                     "123456.789", "NaN", "Infinity", "-Infinity", "0", "-0", "1000000000")),
    st.decimals(min_value=-10**9, max_value=10**9, allow_nan=False, allow_infinity=False,
                places=4).map(str),
    st.floats(min_value=-1e9, max_value=1e9, allow_nan=False).map(repr))
_DNS_LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?", fullmatch=True)
_POD_NAMES = st.lists(_DNS_LABEL, min_size=1, max_size=2).map(".".join)


@settings(max_examples=max(5, _EXAMPLES // 5), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(pods=st.dictionaries(_POD_NAMES, st.tuples(st.sampled_from("ab"), _DECIMAL_TEXTS),
                            min_size=1, max_size=4))
def test_generated_objects_and_values_answer_as_prometheus_adapter_does(
        oracle: Oracle, pods: dict[str, tuple[str, str]]) -> None:
    """Pods of generated names and labels, each with a gauge of a generated value, in a
    namespace of their own: every way to ask for them, by config-gen's template rule."""
    namespace = oracle.new_namespace()
    try:
        for name, (app, value) in pods.items():
            oracle.cluster.apply({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"app": app, "oracle-world": oracle.world.token}},
                "spec": {"containers": [{"name": "app", "image": "oracle"}]}})
            labels = {"namespace": namespace, "pod": name}
            oracle.exporter.set("oracle_generated", labels, Decimal(value), type="gauge")
            oracle.exporter.set("oracle_generated_present", labels, 1, type="gauge")
        oracle.wait_for_pods("config-gen", namespace, "oracle_generated_present", len(pods))
        base = f"{_V2}/namespaces/{namespace}/pods"
        requests = [
            f"{base}/*/oracle_generated", f"{base}/*/oracle_generated?labelSelector=app%3Da",
            f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/*/oracle_generated",
            f"{_V2}/namespaces/{namespace}/metrics/oracle_generated",
            *(f"{base}/{urllib.parse.quote(name)}/oracle_generated" for name in pods),
            f"/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods",
        ]
        _check(oracle, [Request("config-gen", path) for path in requests])
    finally:
        for name in pods:
            for metric in ("oracle_generated", "oracle_generated_present"):
                oracle.exporter.remove(metric, {"namespace": namespace, "pod": name})
        oracle.cluster.delete({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": namespace}})


# --------------------------------------------------------------------------------------------
# Configurations both must accept, both must refuse, or that a difference of the table says
# they judge apart (prometheus-adapter started on each; ours is its configuration loader)

_OVERRIDES = "{overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}"
_QUERY = "'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'"


def _rule(*, series: str = "'oracle_queue_length'", resources: str = _OVERRIDES,
          query: str | None = _QUERY, extra: str = "") -> str:
    lines = ["rules:", f"- seriesQuery: {series}" if series else "- resources: " + resources]
    if series:
        lines.append(f"  resources: {resources}")
    if query is not None:
        lines.append(f"  metricsQuery: {query}")
    return "\n".join(lines) + "\n" + extra


CONFIG_CASES: dict[str, str] = {
    # accepted by both
    "a-plain-rule": _rule(),
    "group-template": _rule(resources="{template: 'kube_<<.Group>>_<<.Resource>>'}"),
    "name-with-as": _rule(extra="  name: {matches: '^(.*)_length$', as: '${1}_len'}\n"),
    "filters": _rule(extra="  seriesFilters: [{is: '_length'}, {isNot: '^x'}]\n"),
    "raw-template-fields": _rule(query="'max(<<.Series>>{<<.LabelMatchers>>}) by "
                                       "(<<index .GroupBySlice 0>>)'"),
    "external-rule-namespaced-false": "externalRules:\n- seriesQuery: 'queue_depth'\n"
                                      "  resources: {namespaced: false}\n"
                                      "  metricsQuery: 'sum(<<.Series>>)'\n",
    # refused by both
    "misspelt-metrics-query": _rule(query=None, extra="  metricQuery: 'count(x)'\n"),
    "trailing-comma-after-a-flow-mapping":
        "rules:\n- seriesQuery: 'x'\n  resources:\n    overrides:\n"
        "      namespace: {resource: \"namespace\"},\n  metricsQuery: 'x'\n",
    "rules-as-a-map": "rules: {default: false}\n",
    "is-and-isnot-in-one-filter": _rule(extra="  seriesFilters: [{is: a, isNot: b}]\n"),
    "empty-filter": _rule(extra="  seriesFilters: [{}]\n"),
    "two-groups-without-as": _rule(extra="  name: {matches: '^(.*)_(.*)$'}\n"),
    "template-without-resource": _rule(resources="{template: 'kube_<<.Group>>'}"),
    "lookahead-in-matches": _rule(extra="  name: {matches: '^(?=oracle).*$'}\n"),
    "unclosed-action": _rule(query="'sum(<<.Series)'"),
    # judged apart: each is a configuration of a difference in the table
    "no-metrics-query": _rule(query=None),
    "no-series-query": _rule(series=""),
    "override-key-not-a-label": _rule(
        resources="{overrides: {app.kubernetes.io/name: {resource: pod}}}"),
    "override-of-a-missing-resource": _rule(
        resources="{overrides: {brand: {group: cheese.io, resource: brand}}}"),
    "unicode-class-in-matches": _rule(extra="  name: {matches: '^(\\p{L}+)_length$'}\n"),
    "ungreedy-flag-in-filter": _rule(extra="  seriesFilters: [{is: '(?U)queue.+'}]\n"),
    "negated-posix-class-in-filter": _rule(extra="  seriesFilters: [{isNot: '[[:^alpha:]]'}]\n"),
    "define-in-metrics-query": _rule(query="'<<define \"x\">>y<<end>>sum(<<.Series>>)'"),
    "block-in-metrics-query": _rule(query="'<<block \"x\" .>>sum(<<.Series>>)<<end>>'"),
    "js-in-metrics-query": _rule(query="'sum(<<js .Series>>)'"),
}


@pytest.fixture(scope="module")
def upstream_verdicts(oracle: Oracle) -> dict[str, tuple[bool, str]]:
    return upstream_accepts(CONFIG_CASES, prometheus=oracle.prometheus.url,
                            workdir=oracle.workdir, credentials=oracle.credentials)


def _ours_accepts(text: str) -> tuple[bool, str]:
    try:
        parse_config(text)
    except ConfigError as error:
        return False, str(error)
    return True, ""


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_configurations_are_accepted_and_refused_alike(
        upstream_verdicts: dict[str, tuple[bool, str]], case: str) -> None:
    theirs, their_log = upstream_verdicts[case]
    ours, our_error = _ours_accepts(CONFIG_CASES[case])
    declared = [d.id for d in DIFFERENCES if case in d.configs]
    said = {True: "accepts", False: "refuses"}
    if theirs == ours:
        assert not declared, (f"{case}: both {said[ours]} it, but the table says "
                              f"{declared} shows here")
    else:
        assert declared, (f"{case}: prometheus-adapter {said[theirs]} it and metricscale "
                          f"{said[ours]} it, which DIFFERENCES does not declare\n"
                          f"prometheus-adapter: {their_log}\nmetricscale: {our_error}")


def test_every_configuration_of_the_table_is_a_case() -> None:
    named = {case for d in DIFFERENCES for case in d.configs}
    assert named <= set(CONFIG_CASES), named - set(CONFIG_CASES)
    assert all(d.witnesses or d.configs for d in DIFFERENCES), \
        [d.id for d in DIFFERENCES if not (d.witnesses or d.configs)]


# --------------------------------------------------------------------------------------------
# The table in Markdown: docs/differences-prometheus-adapter.md

DOC = Path(__file__).resolve().parents[2] / "docs" / "differences-prometheus-adapter.md"

_DOC_HEAD = """\
# Differences from prometheus-adapter

metricscale's adapter reads prometheus-adapter's configuration unchanged and answers as
prometheus-adapter v0.12.0 does, except in the ways below. Each is deliberate, and each is
observed: `tests/differential/test_prometheus_adapter_oracle.py` runs the real
prometheus-adapter and metricscale on the same configurations (prometheus-adapter's
`config-gen` rules, metricscale's default rules, and the rule forms of prometheus-adapter's
documentation), against the same Prometheus and the same objects in a real control plane,
asks both the same requests as kube-apiserver's aggregator would, and fails on any difference
in status, body, `Warning` headers or the PromQL sent that is not in this table, and on any
row of this table that its witness request (or configuration) no longer shows. This file is
that test's table, and a test keeps the two the same.

Normalised away, because they vary legitimately: timestamps, the order of items, discovery
entries, containers and queries, and the order of the names in a regex matcher.

| id | difference | reason |
|---|---|---|
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_differences_markdown(differences: Iterable[Difference]) -> str:
    rows = "".join(f"| `{d.id}` | {_cell(d.description)} | {_cell(d.reason)} |\n"
                   for d in differences)
    return _DOC_HEAD + rows


def test_the_markdown_table_is_the_table() -> None:
    expected = render_differences_markdown(DIFFERENCES)
    assert DOC.read_text() == expected, (
        f"{DOC} is not the table DIFFERENCES; write it with\n  .venv/bin/python -c "
        "'from tests.differential.test_prometheus_adapter_oracle import write_doc; "
        "write_doc()'")


def write_doc() -> None:
    """Writes docs/differences-prometheus-adapter.md from DIFFERENCES."""
    DOC.write_text(render_differences_markdown(DIFFERENCES))


# --------------------------------------------------------------------------------------------
# The oracle's own arithmetic (no servers)


@pytest.mark.parametrize(("text", "upstream", "exact"), [
    ("1.001", 1000, 1001), ("0.57", 570, 570), ("2.01", 2009, 2010), ("-1.001", -1000, -1001),
    ("7", 7000, 7000), ("1E+3", 1_000_000, 1_000_000), ("0.0009", 0, 0),
])
def test_upstream_milli_units_are_float_arithmetic(text: str, upstream: int, exact: int) -> None:
    assert r.go_milli(text, nan_is_zero=True) == upstream
    assert r.exact_milli(text) == exact


def test_non_finite_values_are_gos_indefinite_integer_upstream() -> None:
    assert r.go_milli("NaN", nan_is_zero=True) == 0
    assert r.go_milli("NaN", nan_is_zero=False) == r.GO_INT64_INDEFINITE
    assert r.go_milli("+Inf", nan_is_zero=True) == r.GO_INT64_INDEFINITE
    assert r.quantity(r.GO_INT64_INDEFINITE) == "-9223372036854775808m"
    assert r.exact_milli("+Inf") is None


@pytest.mark.parametrize(("milli", "text"), [
    (0, "0"), (250, "250m"), (1500, "1500m"), (2000, "2"), (1_500_000_000, "1500k"),
    (1_000_000_000, "1M"), (-3500, "-3500m"), (-3000, "-3"),
])
def test_quantities_are_written_as_go_writes_decimal_si(milli: int, text: str) -> None:
    assert r.quantity(milli) == text


def test_normalising_keeps_what_differs_and_drops_what_varies() -> None:
    first = Exchange(200, "application/json", (), {"items": [
        {"describedObject": {"name": "b"}, "timestamp": "2026-01-01T00:00:01Z"},
        {"describedObject": {"name": "a"}, "timestamp": "2026-01-01T00:00:02Z"}]},
        (PromQuery("GET", 'x{pod=~"b|a"}'),))
    second = Exchange(200, "application/json", (), {"items": [
        {"describedObject": {"name": "a"}, "timestamp": "2026-01-01T00:00:09Z"},
        {"describedObject": {"name": "b"}, "timestamp": "2026-01-01T00:00:09Z"}]},
        (PromQuery("GET", 'x{pod=~"a|b"}'),))
    assert normalize(first) == normalize(second)
    malformed = replace(second, body={"items": [{"timestamp": "yesterday"}]})
    assert normalize(malformed) != normalize(replace(second, body={"items": [
        {"timestamp": "2026-01-01T00:00:09Z"}]}))
