"""Answering one metric request: registry lookup, object selection, PromQL, samples to items.

The flow of a custom metric request (prometheus-adapter's, with the differences the README
lists): resolve the metric in the discovery snapshot (404 with upstream's texts), select the
described objects from the watch-fed cache for `*` (the `labelSelector` filters; nothing is
LISTed per request), build the query exactly as upstream, ask Prometheus, and match samples
back to objects by the resource label.

Empty answers say why. Where upstream answers `items: []` (which makes the HPA fail with
"no metrics returned"), a `404 NotFound` Status is sent whose message ends in the reason: no
objects selected, no series matched, or the query dropped the resource label. A list that
lacks some of the selected objects is a 200 with a `Warning` header naming how many and why.
Item timestamps are the sample timestamps Prometheus returns (the evaluation time of the
instant query), for custom metrics too, where upstream writes the adapter's clock.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Protocol

from adapter.api.routes import CustomMetricRoute, ExternalMetricRoute
from adapter.api.wire import (
    ExternalMetricValue,
    NonFiniteSampleError,
    bad_request,
    encode_object_metric_values,
    internal_error,
    metric_not_found,
    not_found,
    render_external_metric_value_list,
    sample_to_quantity,
    service_unavailable,
)
from adapter.kube.objects import KubeCacheFailed, ResourceNotListable
from adapter.prometheus.client import (
    PrometheusError,
    PrometheusUnavailable,
    QueryResult,
    Scalar,
    UnexpectedResultType,
    Vector,
    VectorSample,
)
from adapter.rules.config import DiscoveryRule
from adapter.rules.query import (
    BuiltQuery,
    QueryError,
    RuleQueryError,
    UnsupportedSelectorError,
    build_custom_query,
    build_external_query,
    match_samples,
)
from adapter.rules.registry import MetricRegistry
from adapter.rules.resources import NAMESPACES, GroupResource, ResourceInfo
from metricscale.core.selectors import Selector, SelectorError, label_selector_json
from metricscale.kube.errors import KubeUnavailable, UnknownResource

__all__ = [
    "Answer",
    "ApiError",
    "BackendRouter",
    "MetricsService",
    "ObjectSelector",
    "QueryBackend",
    "explain_missing",
]

logger = logging.getLogger(__name__)

# What a 503 asks the client to wait before retrying.
_RETRY_AFTER_SECONDS = 5


class ApiError(Exception):
    """An answer that is a `Status` body; `body["code"]` is the HTTP status."""

    def __init__(self, body: Mapping[str, Any], *, warnings: Sequence[str] = ()) -> None:
        super().__init__(str(body.get("message", "")))
        self.body = dict(body)
        self.warnings = tuple(warnings)  # `Warning` headers that say why

    @property
    def code(self) -> int:
        return int(self.body["code"])


@dataclass(frozen=True)
class Answer:
    """A successful answer: the JSON body (or its encoded bytes), and `Warning` header texts."""

    body: Mapping[str, Any] | bytes
    warnings: tuple[str, ...] = field(default=())


class ObjectSelector(Protocol):
    """Object names from the watch-fed caches (adapter.kube.objects.ObjectCaches has this shape)."""

    async def select(self, group_resource: GroupResource, *, namespace: str | None,
                     selector: Selector) -> list[str]: ...


class QueryBackend(Protocol):
    """Instant queries (adapter.prometheus.client.PrometheusClient has this shape)."""

    async def query(self, promql: str, *, at: float | Decimal) -> QueryResult: ...


class BackendRouter(Protocol):
    """The client of a rule's backend for a request (adapter.prometheus.backends has it)."""

    def client_for(self, backend: str, *, namespace: str | None,
                   tenants: frozenset[str] | None) -> QueryBackend | None: ...


# --------------------------------------------------------------------------------------------
# Why an answer is empty (pure)


def explain_missing(*, rule: DiscoveryRule, resource_label: str, samples: int, unlabelled: int,
                    matched_other_names: int, non_finite: int = 0) -> str:
    """Why the objects asked for got no value, in words a user can act on."""
    if samples == 0:
        return f"no series matched the query of {rule.path}"
    if unlabelled == samples:
        return (f"the query of {rule.path} returned {samples} series without the label "
                f"{resource_label!r} that names the objects (keep it in `by (...)`)")
    if non_finite and matched_other_names == 0:
        return f"the query of {rule.path} returned a value that is not a finite number"
    return (f"the query of {rule.path} returned no series for these objects "
            f"({samples} series for other values of {resource_label!r})")


def _no_objects_reason(info: ResourceInfo, *, namespace: str | None, selector: Selector) -> str:
    where = f" in namespace {namespace}" if namespace else ""
    if selector.is_empty():
        return f"no {info.resource} exist{where}"
    return f"no {info.resource}{where} match the label selector {str(selector)!r}"


_EPOCH = datetime.fromtimestamp(0, tz=UTC)


@functools.lru_cache(maxsize=64)
def _whole_second(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def _timestamp(sample_time: Decimal) -> datetime:
    # Every sample of an instant query carries the same evaluation time: convert it once.
    return _whole_second(int(sample_time))


# --------------------------------------------------------------------------------------------
# The service


class MetricsService:
    """Answers custom and external metric requests from the snapshot in use."""

    def __init__(self, *, registry: Callable[[], MetricRegistry], objects: ObjectSelector,
                 backends: BackendRouter, clock: Callable[[], float]) -> None:
        self._registry = registry
        self._objects = objects
        self._backends = backends
        self._clock = clock

    def _snapshot(self) -> MetricRegistry:
        registry = self._registry()
        if registry.built_at is None:
            raise ApiError(service_unavailable(
                message="metric discovery has not completed yet; retry shortly",
                retry_after_seconds=_RETRY_AFTER_SECONDS))
        return registry

    # -- ours or a delegate's ------------------------------------------------------------

    def serves_custom_metric(self, route: CustomMetricRoute) -> bool:
        """Whether our rules serve this resource/metric pair (then we answer, even when the
        answer is empty or an error: our metrics win a name clash). Before the first
        discovery pass nothing is known: True, so that the 503 is ours and nothing that may
        be ours is sent elsewhere."""
        registry = self._registry()
        if registry.built_at is None:
            return True
        return registry.resolve_custom(resource=route.resource, namespace=route.namespace,
                                       metric=route.metric) is not None

    def serves_external_metric(self, route: ExternalMetricRoute) -> bool:
        """Whether our rules serve this external metric name (see `serves_custom_metric`)."""
        registry = self._registry()
        if registry.built_at is None:
            return True
        return registry.resolve_external(route.metric) is not None

    # -- custom metrics ------------------------------------------------------------------

    async def custom_metric(self, route: CustomMetricRoute) -> Answer:
        registry = self._snapshot()
        written = str(route.resource)
        # A namespace's own metric keeps the namespace as the object, as upstream.
        object_name = route.name
        resolved = registry.resolve_custom(resource=route.resource, namespace=route.namespace,
                                           metric=route.metric)
        if resolved is None:
            why = None
            if registry.catalog.find(route.resource) is None:
                why = f"the cluster has no resource type {written!r}"
            raise ApiError(metric_not_found(
                metric=route.metric, resource=written, object_name=object_name,
                selector=_selector_text(route.metric_selector), why=why))
        entry, info, namespace = resolved.entry, resolved.info, resolved.namespace
        backend = self._backends.client_for(entry.rule.backend, namespace=route.namespace,
                                            tenants=entry.tenants)
        if backend is None:
            raise ApiError(metric_not_found(
                metric=route.metric, resource=written, object_name=object_name,
                selector=_selector_text(route.metric_selector),
                why=_no_tenant_reason(entry.rule, route.namespace)))
        if object_name is not None:
            names = [object_name]
        else:
            names = await self._select(info, namespace=namespace, selector=route.label_selector)
            if not names:
                raise ApiError(metric_not_found(
                    metric=route.metric, resource=written,
                    why=_no_objects_reason(info, namespace=namespace,
                                           selector=route.label_selector)))
        query_namespace = None if route.namespace_metric else namespace
        try:
            built = build_custom_query(
                rule=entry.rule, mapper=entry.mapper, series=entry.series,
                resource=NAMESPACES if route.namespace_metric else info.group_resource,
                namespace=query_namespace, names=names, metric_selector=route.metric_selector)
        except QueryError as error:
            raise _query_error(error, entry.rule) from None
        result = await self._query(backend, built.promql, rule=entry.rule)
        if not isinstance(result, Vector):
            logger.warning("%s: the query returned a scalar, a custom metric needs a vector "
                           "with the label %r: %s", entry.rule.path, built.resource_label,
                           built.promql)
            raise ApiError(internal_error("unable to fetch metrics: the query of "
                                          f"{entry.rule.path} returned a scalar"))
        return self._custom_items(route, built=built, samples=result.samples, names=names,
                                  info=info, namespace=namespace, rule=entry.rule)

    async def _select(self, info: ResourceInfo, *, namespace: str | None,
                      selector: Selector) -> list[str]:
        try:
            return await self._objects.select(info.group_resource, namespace=namespace,
                                              selector=selector)
        except UnknownResource as error:
            raise ApiError(not_found(str(error))) from None
        except ResourceNotListable as error:
            raise ApiError(bad_request(f"objects cannot be selected by label: {error}")) \
                from None
        except KubeUnavailable as error:
            logger.warning("cannot select %s: %s", info.group_resource, error)
            raise ApiError(service_unavailable(
                message=f"unable to list matching resources: {error}",
                retry_after_seconds=_RETRY_AFTER_SECONDS)) from None
        except KubeCacheFailed as error:
            logger.error("cannot select %s: %s", info.group_resource, error)
            raise ApiError(internal_error("unable to list matching resources")) from None

    def _custom_items(self, route: CustomMetricRoute, *, built: BuiltQuery,
                      samples: Sequence[VectorSample], names: Sequence[str], info: ResourceInfo,
                      namespace: str | None, rule: DiscoveryRule) -> Answer:
        matched = match_samples(((s.labels, s) for s in samples),
                                resource_label=built.resource_label)
        selector_json = _selector_json(route.metric_selector)
        values: list[tuple[str, datetime, str]] = []
        non_finite = 0
        by_name = matched.by_name
        raw_time: Decimal | None = None  # the samples share one time object: convert it once
        moment = _EPOCH
        for name in names:
            sample = by_name.get(name)
            if sample is None:
                continue
            try:
                value = sample_to_quantity(sample.value)
            except NonFiniteSampleError:
                non_finite += 1
                continue
            if sample.timestamp is not raw_time:
                raw_time, moment = sample.timestamp, _timestamp(sample.timestamp)
            values.append((name, moment, value))
        body = encode_object_metric_values(version=route.version, info=info,
                                           namespace=namespace, metric=route.metric,
                                           selector=selector_json, values=values)
        missing = len(names) - len(values)
        if missing == 0:
            return Answer(body)
        wanted = set(names)
        other = sum(1 for name in by_name if name not in wanted)
        why = explain_missing(rule=rule, resource_label=built.resource_label,
                              samples=matched.total, unlabelled=matched.unlabelled,
                              matched_other_names=other, non_finite=non_finite)
        logger.info("%s/%s: %d of %d objects without a value (%s); query: %s",
                    route.resource, route.metric, missing, len(names), why, built.promql)
        if not values:
            raise ApiError(metric_not_found(
                metric=route.metric, resource=str(route.resource), object_name=route.name,
                selector=_selector_text(route.metric_selector), why=why))
        warning = (f"{missing} of {len(names)} selected {info.resource} have no value for "
                   f"{route.metric}: {why}")
        return Answer(body, warnings=(warning,))

    # -- external metrics ----------------------------------------------------------------

    async def external_metric(self, route: ExternalMetricRoute) -> Answer:
        registry = self._snapshot()
        entry = registry.resolve_external(route.metric)
        if entry is None:
            raise ApiError(not_found(f"the server could not find the metric {route.metric}"))
        backend = self._backends.client_for(entry.rule.backend, namespace=route.namespace,
                                            tenants=entry.tenants)
        if backend is None:
            raise ApiError(not_found(f"the server could not find the metric {route.metric}: "
                                     f"{_no_tenant_reason(entry.rule, route.namespace)}"))
        try:
            promql = build_external_query(rule=entry.rule, mapper=entry.mapper,
                                          series=entry.series, namespace=route.namespace,
                                          metric_selector=route.selector)
        except QueryError as error:
            raise _query_error(error, entry.rule) from None
        result = await self._query(backend, promql, rule=entry.rule)
        items: list[ExternalMetricValue] = []
        non_finite = 0
        samples: Sequence[tuple[Mapping[str, str], Decimal, str]]
        if isinstance(result, Scalar):
            samples = (({}, result.timestamp, result.value),)
        else:
            samples = [(s.labels, s.timestamp, s.value) for s in result.samples]
        for labels, timestamp, raw in samples:
            try:
                value = sample_to_quantity(raw)
            except NonFiniteSampleError:
                non_finite += 1
                continue
            items.append(ExternalMetricValue(metric=entry.metric, labels=labels,
                                             timestamp=_timestamp(timestamp), value=value))
        if not items:
            why = (f"the query of {entry.rule.path} returned only values that are not finite "
                   "numbers" if non_finite else
                   f"no series matched the query of {entry.rule.path}")
            logger.info("external %s: empty answer (%s); query: %s", route.metric, why, promql)
            raise ApiError(not_found(
                f"the server could not find the metric {route.metric}: {why}"))
        warnings: tuple[str, ...] = ()
        if non_finite:
            warnings = (f"{non_finite} series of {route.metric} have values that are not "
                        "finite numbers and were left out",)
        return Answer(render_external_metric_value_list(items), warnings=warnings)

    # -- Prometheus ----------------------------------------------------------------------

    async def _query(self, backend: QueryBackend, promql: str, *,
                     rule: DiscoveryRule) -> QueryResult:
        try:
            return await backend.query(promql, at=self._clock())
        except PrometheusUnavailable as error:
            logger.warning("%s: Prometheus unavailable: %s (%s)", rule.path, error, error.detail)
            raise ApiError(service_unavailable(
                message=f"unable to fetch metrics: {error}",
                retry_after_seconds=_RETRY_AFTER_SECONDS)) from None
        except UnexpectedResultType as error:
            logger.warning("%s: %s: %s", rule.path, error, promql)
            raise ApiError(internal_error(f"unable to fetch metrics: {error}")) from None
        except PrometheusError as error:
            logger.warning("%s: the query failed: %s (%s); query: %s", rule.path, error,
                           error.detail, promql)
            raise ApiError(internal_error("unable to fetch metrics")) from None


def _no_tenant_reason(rule: DiscoveryRule, namespace: str | None) -> str:
    where = f"namespace {namespace}" if namespace else "cluster-scoped requests"
    return (f"the tenant of {where} on backend {rule.backend!r} ({rule.path}) has no such "
            "metric")


def _query_error(error: QueryError, rule: DiscoveryRule) -> ApiError:
    if isinstance(error, UnsupportedSelectorError):
        return ApiError(bad_request(str(error)))
    if isinstance(error, RuleQueryError):
        logger.warning("%s cannot build a query: %s", rule.path, error)
        return ApiError(internal_error(f"unable to fetch metrics: {rule.path} cannot build a "
                                       f"query for this request: {error}"))
    logger.warning("%s: %s", rule.path, error)
    return ApiError(internal_error("unable to fetch metrics"))


def _selector_text(selector: Selector) -> str | None:
    return None if selector.is_empty() else str(selector)


def _selector_json(selector: Selector) -> dict[str, Any] | None:
    if selector.is_empty():
        return None
    try:
        return label_selector_json(selector)
    except SelectorError as error:
        raise ApiError(bad_request(str(error))) from None
