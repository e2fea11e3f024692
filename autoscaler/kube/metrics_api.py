"""The metrics APIs client: resource, custom and external metrics via the API server, as the HPA.

Paths, parameters, version choice and error texts follow upstream's HPA metrics client
(`pkg/controller/podautoscaler/metrics/client.go`) and the clients it uses
(`k8s.io/metrics/pkg/client/{custom_metrics,external_metrics}`):

* resource: `GET /apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods?labelSelector=`;
* custom, Pods: `GET /apis/custom.metrics.k8s.io/{v}/namespaces/{ns}/pods/*/{metric}` with
  `labelSelector` (the scale's selector) and `metricLabelSelector`;
* custom, Object: `.../namespaces/{ns}/{resource[.group]}/{name}/{metric}`, the resource from
  discovery for describedObject's group and kind; a Namespace is
  `.../namespaces/{ns}/metrics/{metric}`;
* external: `GET /apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/{lower-cased metric}`.

Empty selectors send no parameter. The custom metrics version is discovery's preferred one among
v1beta2 and v1beta1, cached and forgotten every sync period; bodies of either version come back
in the v1beta2 shape. Results are the wire dicts the pure decision snapshots; failures are
MetricsError with upstream's text.
"""

from __future__ import annotations

import asyncio
import copy
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast
from urllib.parse import quote

from metricscale.core.selectors import (
    LabelSelector,
    SelectorError,
    parse_selector,
    selector_from_label_selector,
)
from metricscale.kube.discovery import ResourceMapping, parse_group_version
from metricscale.kube.errors import ErrorContext, InvalidGroupVersion, KubeError

__all__ = [
    "CUSTOM_METRICS_GROUP",
    "EXTERNAL_METRICS_GROUP",
    "RESOURCE_METRICS_GROUP",
    "MetricsClient",
    "MetricsError",
    "MetricsTransport",
    "choose_custom_metrics_version",
    "to_v1beta2_metric_value_list",
]

RESOURCE_METRICS_GROUP = "metrics.k8s.io"
CUSTOM_METRICS_GROUP = "custom.metrics.k8s.io"
EXTERNAL_METRICS_GROUP = "external.metrics.k8s.io"
# custom_metrics.MetricVersions, in upstream's order of preference.
_CUSTOM_VERSIONS = ("v1beta2", "v1beta1")
_V1BETA2 = f"{CUSTOM_METRICS_GROUP}/v1beta2"
_V1BETA1 = f"{CUSTOM_METRICS_GROUP}/v1beta1"

_SELECTOR_CACHE_LIMIT = 50_000  # distinct selectors; more means churn, so start again



class MetricsTransport(Protocol):
    """The raw Kubernetes access the metrics client needs (KubeClient has it)."""

    async def get_json(self, path: str, *, query: Sequence[tuple[str, str]] = (),
                       operation: str, resource: str,
                       context: ErrorContext | None = None) -> Any: ...

    async def server_groups(self) -> list[Mapping[str, Any]]: ...

    async def resolve_kind(self, *, group: str, kind: str) -> list[ResourceMapping]: ...


_PREFIXES = {"resource": "unable to fetch metrics from resource metrics API: ",
             "custom": "unable to fetch metrics from custom metrics API: ",
             "external": "unable to fetch metrics from external metrics API: "}


class MetricsError(Exception):
    """A metrics API request failed; `str(err)` is upstream's text, ready for events and conditions.

    `api` is "resource", "custom" or "external"; `detail` is the text without the client's
    "unable to fetch metrics from ... API: " prefix (the decision adds its own words around
    it); `empty` means the API answered, with no metrics; `cause` is the API error, if any.
    """

    def __init__(self, detail: str, *, api: str, cause: Exception | None = None,
                 prefixed: bool = True, empty: bool = False) -> None:
        message = f"{_PREFIXES[api]}{detail}" if prefixed else detail
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.api = api
        self.cause = cause
        self.empty = empty

    @classmethod
    def no_metrics(cls, api: str) -> MetricsError:
        """The API answered an empty list (upstream's own words, without the prefix)."""
        return cls(f"no metrics returned from {api} metrics API", api=api,
                   prefixed=False, empty=True)


# Characters no path escaping changes: names of namespaces and metrics are made of them.
_PLAIN_SEGMENT = re.compile(r"[A-Za-z0-9_.~-]*")


def _segment(text: str) -> str:
    # Go's URL path escaping (what client-go sends): keep :@&=+$,; and escape the rest.
    if _PLAIN_SEGMENT.fullmatch(text):
        return text
    return quote(text, safe="$&+,:;=@")


def _query(**params: str) -> list[tuple[str, str]]:
    # url.Values.Encode sorts by key and ListOptions omits empty strings.
    return [(key, value) for key, value in sorted(params.items()) if value]


def _selector_param(label_selector: LabelSelector | None) -> str:
    """LabelSelectorAsSelector(selector).String(); nil and {} both give "" (no parameter)."""
    return str(selector_from_label_selector(label_selector))


def _canonical_selector(selector: str) -> str:
    """labels.Parse(selector).String(), which is what the HPA sends as labelSelector."""
    try:
        return str(parse_selector(selector))
    except SelectorError:
        # Upstream stops before asking for metrics; send it as given and let the server answer.
        return selector


def choose_custom_metrics_version(groups: Sequence[Mapping[str, Any]]) -> str:
    """The custom metrics version upstream's discovery picks: preferred if known, else the first
    known one listed; raises MetricsError with upstream's text when there is none."""
    group = next((g for g in groups if g.get("name") == CUSTOM_METRICS_GROUP), None)
    if group is None:
        raise MetricsError(f"no custom metrics API ({CUSTOM_METRICS_GROUP}) "
                           "registered", api="custom")
    preferred = group.get("preferredVersion")
    if isinstance(preferred, Mapping):
        group_version = str(preferred.get("groupVersion") or "")
        if group_version in (_V1BETA2, _V1BETA1):
            return group_version.rsplit("/", 1)[1]
    versions = group.get("versions")
    for entry in versions if isinstance(versions, list) else []:
        if isinstance(entry, Mapping) and entry.get("groupVersion") in (_V1BETA2, _V1BETA1):
            return str(entry["groupVersion"]).rsplit("/", 1)[1]
    raise MetricsError("no known available metric versions found", api="custom")


def to_v1beta2_metric_value_list(body: object) -> dict[str, Any]:
    """Decode a custom.metrics.k8s.io MetricValueList of either version into the v1beta2 shape."""
    if not isinstance(body, Mapping):
        raise ValueError("the custom metrics API server didn't return MetricValueList, the type "
                         f"is {type(body).__name__}")
    kind, api_version = body.get("kind"), body.get("apiVersion")
    if kind != "MetricValueList" or api_version not in (_V1BETA2, _V1BETA1):
        raise ValueError("the custom metrics API server didn't return MetricValueList, the type "
                         f"is {api_version}, Kind={kind}")
    items = body.get("items")
    if items is None:
        items = []
    if not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items):
        raise ValueError("the custom metrics API server returned a malformed MetricValueList")
    if api_version == _V1BETA2:
        return cast(dict[str, Any], dict(body))
    converted: list[dict[str, Any]] = []
    for item in items:
        metric: dict[str, Any] = {"name": item.get("metricName", "")}
        if item.get("selector") is not None:
            metric["selector"] = copy.deepcopy(item["selector"])
        value: dict[str, Any] = {
            "describedObject": copy.deepcopy(item.get("describedObject", {})),
            "metric": metric,
            "timestamp": item.get("timestamp"),
        }
        if item.get("window") is not None:
            value["windowSeconds"] = item["window"]
        value["value"] = item.get("value")
        converted.append(value)
    return {"kind": "MetricValueList", "apiVersion": _V1BETA2,
            "metadata": copy.deepcopy(body.get("metadata") or {}), "items": converted}


def _items(body: object) -> list[Any]:
    items = body.get("items") if isinstance(body, Mapping) else None
    return items if isinstance(items, list) else []


class MetricsClient:
    """Upstream's restMetricsClient over a MetricsTransport; one request per call (plus a
    discovery request for the custom metrics version once per `version_ttl`)."""

    def __init__(
        self,
        transport: MetricsTransport,
        *,
        version_ttl: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._transport = transport
        self._version_ttl = version_ttl
        self._clock = clock
        self._version: str | None = None
        self._version_at = 0.0
        self._version_lock = asyncio.Lock()
        # labelSelector parameters by scale selector: a selector changes rarely, and parsing
        # it anew for every metrics request was a visible part of a steady reconcile.
        self._selectors: dict[str, str] = {}

    def _label_selector(self, pod_selector: str) -> str:
        found = self._selectors.get(pod_selector)
        if found is None:
            if len(self._selectors) >= _SELECTOR_CACHE_LIMIT:
                self._selectors.clear()
            found = self._selectors[pod_selector] = _canonical_selector(pod_selector)
        return found

    def invalidate(self) -> None:
        """Forget the custom metrics version (upstream's PeriodicallyInvalidate does this)."""
        self._version = None

    async def custom_metrics_version(self) -> str:
        """The custom.metrics.k8s.io version to use, from discovery (cached for `version_ttl`)."""
        if self._version is not None and self._clock() - self._version_at < self._version_ttl:
            return self._version
        async with self._version_lock:
            if self._version is not None and self._clock() - self._version_at < self._version_ttl:
                return self._version
            try:
                groups = await self._transport.server_groups()
            except KubeError as exc:
                raise MetricsError(str(exc), api="custom", cause=exc) from exc
            self._version = choose_custom_metrics_version(groups)
            self._version_at = self._clock()
            return self._version

    async def get_resource_metrics(self, *, namespace: str, pod_selector: str) -> dict[str, Any]:
        """metrics.k8s.io/v1beta1 PodMetricsList of the pods the scale's selector picks."""
        path = f"/apis/{RESOURCE_METRICS_GROUP}/v1beta1/namespaces/{_segment(namespace)}/pods"
        try:
            body = await self._transport.get_json(
                path, query=_query(labelSelector=self._label_selector(pod_selector)),
                operation="resource_metrics", resource=f"pods.{RESOURCE_METRICS_GROUP}",
                context=ErrorContext(RESOURCE_METRICS_GROUP, "pods"))
        except KubeError as exc:
            raise MetricsError(str(exc), api="resource", cause=exc) from exc
        if not isinstance(body, Mapping):
            raise MetricsError("unexpected response", api="resource")
        if not _items(body):
            raise MetricsError.no_metrics("resource")
        return dict(body)

    async def get_pods_metric(
        self,
        *,
        namespace: str,
        metric_name: str,
        pod_selector: str,
        metric_selector: LabelSelector | None,
    ) -> dict[str, Any]:
        """custom.metrics.k8s.io MetricValueList (v1beta2 shape) for a Pods metric."""
        try:
            metric_labels = _selector_param(metric_selector)
        except SelectorError as exc:
            raise MetricsError(str(exc), api="custom", cause=exc, prefixed=False) from exc
        version = await self.custom_metrics_version()
        path = (f"/apis/{CUSTOM_METRICS_GROUP}/{version}/namespaces/{_segment(namespace)}"
                f"/pods/*/{_segment(metric_name)}")
        body = await self._custom_get(
            path, query=_query(labelSelector=self._label_selector(pod_selector),
                               metricLabelSelector=metric_labels),
            context=ErrorContext(CUSTOM_METRICS_GROUP, "pods", "*"))
        if not body["items"]:
            raise MetricsError.no_metrics("custom")
        return body

    async def get_object_metric(
        self,
        *,
        namespace: str,
        metric_name: str,
        described_object: Mapping[str, Any],
        metric_selector: LabelSelector | None,
    ) -> dict[str, Any]:
        """custom.metrics.k8s.io MetricValueList (v1beta2 shape, exactly one item) for an
        Object metric; `described_object` is the spec's {apiVersion, kind, name}."""
        try:
            metric_labels = _selector_param(metric_selector)
        except SelectorError as exc:
            raise MetricsError(str(exc), api="custom", cause=exc, prefixed=False) from exc
        kind = str(described_object.get("kind") or "")
        name = str(described_object.get("name") or "")
        try:
            group, _ = parse_group_version(str(described_object.get("apiVersion") or ""))
        except InvalidGroupVersion:
            group = ""  # schema.FromAPIVersionAndKind keeps only the kind of a bad apiVersion
        version = await self.custom_metrics_version()
        base = f"/apis/{CUSTOM_METRICS_GROUP}/{version}/namespaces/{_segment(namespace)}"
        if kind == "Namespace" and group == "":
            # The namespace itself; its name is ignored so a reference cannot leave the namespace.
            path = f"{base}/metrics/{_segment(metric_name)}"
            context = ErrorContext(CUSTOM_METRICS_GROUP, "metrics", metric_name)
        else:
            resource = await self._qualified_resource(group, kind)
            path = f"{base}/{_segment(resource)}/{_segment(name)}/{_segment(metric_name)}"
            context = ErrorContext(CUSTOM_METRICS_GROUP, resource, name)
        body = await self._custom_get(path, query=_query(metricLabelSelector=metric_labels),
                                      context=context)
        if len(body["items"]) != 1:
            raise MetricsError(
                f"the custom metrics API server returned {len(body['items'])} "
                "results when we asked for exactly one", api="custom")
        return body

    async def get_external_metric(
        self,
        *,
        namespace: str,
        metric_name: str,
        metric_selector: LabelSelector | None,
    ) -> dict[str, Any]:
        """external.metrics.k8s.io/v1beta1 ExternalMetricValueList for an External metric."""
        try:
            metric_labels = _selector_param(metric_selector)
        except SelectorError as exc:
            raise MetricsError(str(exc), api="external", cause=exc, prefixed=False) from exc
        # client-go puts the metric in the resource slot, which it lower-cases.
        resource = metric_name.lower()
        path = (f"/apis/{EXTERNAL_METRICS_GROUP}/v1beta1/namespaces/{_segment(namespace)}/"
                f"{_segment(resource)}")
        try:
            body = await self._transport.get_json(
                path, query=_query(labelSelector=metric_labels), operation="external_metrics",
                resource=EXTERNAL_METRICS_GROUP,
                context=ErrorContext(EXTERNAL_METRICS_GROUP, resource))
        except KubeError as exc:
            raise MetricsError(str(exc), api="external", cause=exc) from exc
        if not isinstance(body, Mapping):
            raise MetricsError("unexpected response", api="external")
        if not _items(body):
            raise MetricsError.no_metrics("external")
        return dict(body)

    async def _qualified_resource(self, group: str, kind: str) -> str:
        """qualResourceForKind: the RESTMapper's resource for group/kind, as `resource.group`."""
        group_kind = f"{kind}.{group}" if group else kind
        try:
            mappings = await self._transport.resolve_kind(group=group, kind=kind)
        except KubeError as exc:
            raise MetricsError(
                f"unable to map kind {group_kind} to resource: {exc}",
                api="custom", cause=exc) from exc
        return mappings[0].group_resource

    async def _custom_get(self, path: str, *, query: list[tuple[str, str]],
                          context: ErrorContext) -> dict[str, Any]:
        try:
            body = await self._transport.get_json(
                path, query=query, operation="custom_metrics", resource=CUSTOM_METRICS_GROUP,
                context=context)
        except KubeError as exc:
            raise MetricsError(str(exc), api="custom", cause=exc) from exc
        try:
            return to_v1beta2_metric_value_list(body)
        except ValueError as exc:
            raise MetricsError(str(exc), api="custom", cause=exc) from exc
