"""JSON bodies the adapter sends: discovery documents, metric value lists, Status errors.

Every `render_*` function returns plain dicts/lists ready for `json.dumps`, shaped as
aggregation-contract.md §5, §8, §9 and §10 show them (Go field order, `omitempty` honoured).
Quantities are canonical Kubernetes strings; timestamps are RFC 3339 UTC with seconds.
`encode_object_metric_values` is the hot path's shortcut: the same bytes as compact
`json.dumps(render_metric_value_list(...))`, without building a dict per object.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_DOWN, ROUND_FLOOR, Decimal, InvalidOperation, localcontext
from types import MappingProxyType
from typing import Any

from adapter.api.groups import CUSTOM_METRICS_GROUP, EXTERNAL_METRICS_GROUP
from adapter.rules.resources import CustomMetricKey, ResourceInfo
from metricscale.core.quantity import Format, format_quantity

__all__ = [
    "AGGREGATED_DISCOVERY_CONTENT_TYPES",
    "CUSTOM_METRICS_GROUP",
    "EXTERNAL_METRICS_GROUP",
    "CustomMetricValue",
    "ExternalMetricValue",
    "NonFiniteSampleError",
    "ObjectReference",
    "bad_request",
    "described_object",
    "encode_object_metric_values",
    "format_timestamp",
    "internal_error",
    "method_not_allowed",
    "metric_not_found",
    "milli_quantity",
    "not_acceptable",
    "not_found",
    "render_aggregated_discovery",
    "render_api_group",
    "render_api_group_list",
    "render_custom_resource_list",
    "render_external_metric_value_list",
    "render_external_resource_list",
    "render_metric_value_list",
    "route_not_found",
    "sample_to_quantity",
    "service_unavailable",
    "status_body",
    "unauthorized",
]

AGGREGATED_DISCOVERY_CONTENT_TYPES: Mapping[str, str] = MappingProxyType({
    "v2": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
    "v2beta1": "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
})


# --- values ---------------------------------------------------------------------------------------


class NonFiniteSampleError(ValueError):
    """A sample value of +Inf or -Inf: no quantity can carry it."""


_MILLI = Decimal("0.001")
_LARGEST = Decimal(2**63 - 1)
_SI_SUFFIXES = {0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}


def milli_quantity(milli: int) -> str:
    """The canonical DecimalSI string of `milli` thousandths (|value| < 10^21 milli)."""
    if milli % 1000:  # a fraction of a unit: Go writes milli-units
        return f"{milli}m"
    units, exponent = milli // 1000, 0
    if units == 0:
        return "0"
    while units % 1000 == 0:  # whole thousands: the next suffix up
        units //= 1000
        exponent += 3
    return f"{units}{_SI_SUFFIXES[exponent]}"


# sample_to_quantity's answers by value text. A pure function's memo, not a result cache:
# Prometheus gives the same text for the same samples until the next scrape, so most values of
# an HPA's repeated request are seen before. Emptied when full; failures are never kept.
_QUANTITIES: dict[str, str] = {}
_QUANTITIES_LIMIT = 16384


def sample_to_quantity(value: str) -> str:
    """A Prometheus sample value string as a canonical quantity.

    Like upstream (`int64(v*1000)` milli-units) the value is truncated toward zero to a
    thousandth, but from the exact decimal text, so `1.001` is `1001m`, not float's `1`.
    `NaN` is `0`, as upstream writes it for custom metrics (for external ones it has no guard
    and writes Go's int64 of NaN); `±Inf` raises NonFiniteSampleError for the caller to skip.
    """
    quantity = _QUANTITIES.get(value)
    if quantity is None:
        quantity = _sample_to_quantity(value)
        if len(_QUANTITIES) >= _QUANTITIES_LIMIT:
            _QUANTITIES.clear()
        _QUANTITIES[value] = quantity
    return quantity


def _sample_to_quantity(value: str) -> str:
    whole, dot, fraction = value.partition(".")
    negative = whole[:1] == "-"
    if negative:
        whole = whole[1:]
    # str methods rather than a regex: this runs for every sample of every answer.
    if (whole.isdigit() and whole.isascii() and len(whole) <= 18
            and (not dot or (fraction.isdigit() and fraction.isascii()))):
        # milli-units, truncated toward zero as upstream
        milli = int(whole + (fraction[:3] + "00")[:3]) if dot else int(whole) * 1000
        if milli % 1000:  # the common case: a fraction of a unit
            return f"-{milli}m" if negative else f"{milli}m"
        return milli_quantity(-milli if negative else milli)
    return _exact_sample_to_quantity(value)


def _exact_sample_to_quantity(value: str) -> str:
    """sample_to_quantity for any text Decimal reads (exponents, signs, huge values)."""
    text = value.strip()
    lowered = text.lower()
    if lowered == "nan":
        return "0"
    if lowered in ("+inf", "-inf", "inf"):
        raise NonFiniteSampleError(f"sample value {text} is not a finite number")
    try:
        exact = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"not a sample value: {value!r}") from None
    if not exact.is_finite():
        raise NonFiniteSampleError(f"sample value {text} is not a finite number")
    # A quantity holds at most 2^63-1 base units; clamp first so quantize stays in range.
    exact = max(min(exact, _LARGEST), -_LARGEST)
    with localcontext() as context:
        context.prec = 60
        truncated = exact.quantize(_MILLI, rounding=ROUND_DOWN)
    return format_quantity(truncated, Format.DECIMAL_SI)


def format_timestamp(moment: datetime | float | int | Decimal | str) -> str:
    """RFC 3339 UTC with whole seconds (`2024-05-01T12:00:00Z`), fractions truncated.

    Accepts an aware datetime or Unix seconds (a Prometheus sample time such as 1714564800.123).
    """
    if isinstance(moment, datetime):
        if moment.tzinfo is None:
            raise ValueError("timestamps must be timezone-aware")
        when = moment.astimezone(UTC)
    else:
        seconds = int(Decimal(str(moment)).to_integral_value(rounding=ROUND_FLOOR))
        when = datetime.fromtimestamp(seconds, tz=UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


# --- discovery ------------------------------------------------------------------------------------


def _resource(name: str, *, namespaced: bool, kind: str) -> dict[str, Any]:
    return {"name": name, "singularName": "", "namespaced": namespaced, "kind": kind,
            "verbs": ["get"]}


def render_custom_resource_list(*, version: str,
                                metrics: Iterable[CustomMetricKey]) -> dict[str, Any]:
    """`GET /apis/custom.metrics.k8s.io/<version>`: one entry per (resource, metric).

    Entries under one parent resource always share one scope (the aggregator rejects the
    whole version otherwise): the first scope seen for a parent wins. An empty list gets
    custom-metrics-apiserver's placeholder, since clients treat `[]` as a failure.
    """
    resources: list[dict[str, Any]] = []
    scope: dict[str, bool] = {}
    seen: set[str] = set()
    for key in metrics:
        parent = str(key.resource)
        namespaced = scope.setdefault(parent, key.namespaced)
        if namespaced != key.namespaced or key.api_name in seen:
            continue
        seen.add(key.api_name)
        resources.append(_resource(key.api_name, namespaced=namespaced, kind="MetricValueList"))
    if not resources:
        resources.append(_resource("/custommetrics", namespaced=False, kind="MetricValueList"))
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{CUSTOM_METRICS_GROUP}/{version}", "resources": resources}


def render_external_resource_list(*, metrics: Iterable[str]) -> dict[str, Any]:
    """`GET /apis/external.metrics.k8s.io/v1beta1`: one namespaced entry per metric name."""
    resources = [_resource(name, namespaced=True, kind="ExternalMetricValueList")
                 for name in dict.fromkeys(metrics)]
    if not resources:
        resources.append(_resource("externalmetrics", namespaced=True,
                                   kind="ExternalMetricValueList"))
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{EXTERNAL_METRICS_GROUP}/v1beta1", "resources": resources}


def _group(name: str, versions: Sequence[str]) -> dict[str, Any]:
    listed = [{"groupVersion": f"{name}/{version}", "version": version} for version in versions]
    return {"name": name, "versions": listed, "preferredVersion": listed[0]}


def render_api_group(*, group: str, versions: Sequence[str]) -> dict[str, Any]:
    """`GET /apis/<group>`; `versions` in preference order (the first is preferred)."""
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(group, versions)}


def render_api_group_list(groups: Sequence[tuple[str, Sequence[str]]]) -> dict[str, Any]:
    """`GET /apis` (plain): each (group, versions in preference order)."""
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [_group(name, versions) for name, versions in groups]}


def _discovery_resources(resource_list: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What the aggregator derives from an APIResourceList: `a/b` → parent a, subresource b."""
    parents: dict[str, dict[str, Any]] = {}
    out: list[dict[str, Any]] = []
    for entry in resource_list.get("resources", ()):
        name = str(entry["name"])
        scope = "Namespaced" if entry.get("namespaced") else "Cluster"
        parent_name, slash, subresource = name.partition("/")
        if not slash:
            out.append({"resource": name,
                        "responseKind": {"group": "", "version": "", "kind": entry["kind"]},
                        "scope": scope, "singularResource": "",
                        "verbs": list(entry.get("verbs", ()))})
            continue
        parent = parents.get(parent_name)
        if parent is None:
            parent = {"resource": parent_name,
                      "responseKind": {"group": "", "version": "", "kind": ""},
                      "scope": scope, "singularResource": "", "verbs": [], "subresources": []}
            parents[parent_name] = parent
            out.append(parent)
        parent["subresources"].append({
            "subresource": subresource,
            "responseKind": {"group": "", "version": "", "kind": entry["kind"]},
            "verbs": list(entry.get("verbs", ())),
        })
    return out


def render_aggregated_discovery(
        groups: Sequence[tuple[str, Sequence[tuple[str, Mapping[str, Any]]]]],
        *, version: str = "v2") -> dict[str, Any]:
    """`GET /apis` as an `APIGroupDiscoveryList` (send with AGGREGATED_DISCOVERY_CONTENT_TYPES).

    `groups` is [(group, [(version, its APIResourceList), ...in preference order]), ...].
    """
    if version not in AGGREGATED_DISCOVERY_CONTENT_TYPES:
        raise ValueError(f"unknown aggregated discovery version {version!r}")
    items = []
    for name, versions in groups:
        items.append({
            "metadata": {"name": name, "creationTimestamp": None},
            "versions": [{"version": v, "resources": _discovery_resources(document),
                          "freshness": "Current"} for v, document in versions],
        })
    return {"kind": "APIGroupDiscoveryList", "apiVersion": f"apidiscovery.k8s.io/{version}",
            "metadata": {}, "items": items}


# --- metric values --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObjectReference:
    """`describedObject`: a core/v1 ObjectReference (empty fields are omitted)."""

    kind: str
    name: str
    api_version: str
    namespace: str = ""

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": self.kind}
        if self.namespace:
            body["namespace"] = self.namespace
        body["name"] = self.name
        body["apiVersion"] = self.api_version
        return body


def described_object(info: ResourceInfo, *, name: str, namespace: str | None) -> ObjectReference:
    """The reference for an object of a catalog resource (`v1` / `apps/v1`, kind from discovery)."""
    return ObjectReference(info.kind, name, info.api_version,
                           namespace if info.namespaced and namespace else "")


@dataclass(frozen=True)
class CustomMetricValue:
    described_object: ObjectReference
    metric: str
    timestamp: datetime
    value: str  # a canonical quantity (see sample_to_quantity)
    window_seconds: int | None = None
    selector: Mapping[str, Any] | None = None  # LabelSelector JSON, or None (sent as null)


@dataclass(frozen=True)
class ExternalMetricValue:
    metric: str
    labels: Mapping[str, str]
    timestamp: datetime | float | Decimal | str
    value: str
    window_seconds: int | None = None


def render_metric_value_list(*, version: str,
                             items: Iterable[CustomMetricValue]) -> dict[str, Any]:
    """`MetricValueList` in the shape of the URL's version (v1beta1 or v1beta2)."""
    if version not in ("v1beta1", "v1beta2"):
        raise ValueError(f"unknown custom metrics version {version!r}")
    rendered = []
    stamps: dict[datetime, str] = {}  # items usually share one time: format it once
    for item in items:
        body: dict[str, Any] = {"describedObject": item.described_object.to_json()}
        selector = None if item.selector is None else dict(item.selector)
        if version == "v1beta1":
            body["metricName"] = item.metric
        else:
            body["metric"] = {"name": item.metric, "selector": selector}
        stamp = stamps.get(item.timestamp)
        if stamp is None:
            stamp = stamps[item.timestamp] = format_timestamp(item.timestamp)
        body["timestamp"] = stamp
        if item.window_seconds is not None:
            body["window" if version == "v1beta1" else "windowSeconds"] = item.window_seconds
        body["value"] = item.value
        if version == "v1beta1":
            body["selector"] = selector
        rendered.append(body)
    return {"kind": "MetricValueList", "apiVersion": f"{CUSTOM_METRICS_GROUP}/{version}",
            "metadata": {}, "items": rendered}


_compact = json.JSONEncoder(separators=(",", ":")).encode
# json.dumps' own string encoder (ensure_ascii): the bytes match json.dumps exactly.
_string = json.encoder.encode_basestring_ascii


def encode_object_metric_values(*, version: str, info: ResourceInfo, namespace: str | None,
                                metric: str, selector: Mapping[str, Any] | None,
                                values: Iterable[tuple[str, datetime, str]]) -> bytes:
    """Compact JSON of a `MetricValueList` for objects of one resource: (name, time, quantity).

    Byte for byte `json.dumps(render_metric_value_list(...), separators=(",", ":"))` with the
    items `described_object(info, name=..., namespace=...)` would make, but each item is two
    per-request constant pieces around the name and the value: a 100-pod answer costs ~20 µs
    instead of ~140 µs of dicts and encoding.
    """
    if version not in ("v1beta1", "v1beta2"):
        raise ValueError(f"unknown custom metrics version {version!r}")
    reference = described_object(info, name="", namespace=namespace)
    head = '{"describedObject":{"kind":' + _string(reference.kind)
    if reference.namespace:
        head += ',"namespace":' + _string(reference.namespace)
    head += ',"name":'
    after_name = ',"apiVersion":' + _string(reference.api_version) + "}"
    selector_json = _compact(None if selector is None else dict(selector))
    if version == "v1beta1":
        after_name += ',"metricName":' + _string(metric)
        tail = ',"selector":' + selector_json + "}"
    else:
        after_name += ',"metric":{"name":' + _string(metric) + ',"selector":' + selector_json + "}"
        tail = "}"
    middles: dict[datetime, str] = {}  # the answer's samples share one evaluation time
    items = []
    for name, timestamp, value in values:
        middle = middles.get(timestamp)
        if middle is None:
            middle = middles[timestamp] = (after_name + ',"timestamp":'
                                           + _string(format_timestamp(timestamp)) + ',"value":')
        items.append(head + _string(name) + middle + _string(value) + tail)
    return ('{"kind":"MetricValueList","apiVersion":'
            + _string(f"{CUSTOM_METRICS_GROUP}/{version}") + ',"metadata":{},"items":['
            + ",".join(items) + "]}").encode()


def render_external_metric_value_list(items: Iterable[ExternalMetricValue]) -> dict[str, Any]:
    """`ExternalMetricValueList` (`metricLabels` is `{}` rather than null when empty)."""
    rendered = []
    stamps: dict[datetime | float | Decimal | str, str] = {}  # usually one time: format it once
    for item in items:
        stamp = stamps.get(item.timestamp)
        if stamp is None:
            stamp = stamps[item.timestamp] = format_timestamp(item.timestamp)
        body: dict[str, Any] = {"metricName": item.metric, "metricLabels": dict(item.labels),
                                "timestamp": stamp}
        if item.window_seconds is not None:
            body["window"] = item.window_seconds
        body["value"] = item.value
        rendered.append(body)
    return {"kind": "ExternalMetricValueList", "apiVersion": f"{EXTERNAL_METRICS_GROUP}/v1beta1",
            "metadata": {}, "items": rendered}


# --- Status bodies (contract §10.2) -------------------------------------------------------------


def status_body(*, code: int, reason: str, message: str,
                details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A `metav1.Status` failure; the HTTP status must equal `code`."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure"}
    if message:
        body["message"] = message
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = dict(details)
    body["code"] = code
    return body


def metric_not_found(*, metric: str, resource: str, object_name: str | None = None,
                     selector: str | None = None, why: str | None = None) -> dict[str, Any]:
    """404 `the server could not find the metric <m> for <resource>[ <name>][ with selector s]`.

    `resource` is the group-resource as the URL wrote it (`deployments.apps`); `why` is our
    addition after a colon (no series matched, no objects selected, ...).
    """
    message = f"the server could not find the metric {metric} for {resource}"
    if object_name is not None:
        message += f" {object_name}"
        if selector:
            message += f" with selector {selector}"
    if why:
        message += f": {why}"
    return not_found(message)


def not_found(message: str) -> dict[str, Any]:
    return status_body(code=404, reason="NotFound", message=message)


def route_not_found() -> dict[str, Any]:
    return status_body(code=404, reason="NotFound",
                       message="the server could not find the requested resource", details={})


def bad_request(message: str) -> dict[str, Any]:
    return status_body(code=400, reason="BadRequest", message=message)


def unauthorized() -> dict[str, Any]:
    return status_body(code=401, reason="Unauthorized", message="Unauthorized")


def method_not_allowed() -> dict[str, Any]:
    return status_body(code=405, reason="MethodNotAllowed",
                       message="the server does not allow this method on the requested "
                               "resource", details={})


def not_acceptable(media_types: Sequence[str] = ("application/json",)) -> dict[str, Any]:
    return status_body(code=406, reason="NotAcceptable",
                       message="only the following media types are accepted: "
                               + ", ".join(media_types))


def internal_error(cause: str = "unable to fetch metrics") -> dict[str, Any]:
    """500 `Internal error occurred: <cause>`; never put backend details in `cause`."""
    return status_body(code=500, reason="InternalError",
                       message=f"Internal error occurred: {cause}",
                       details={"causes": [{"message": cause}]})


def service_unavailable(*, message: str, retry_after_seconds: int) -> dict[str, Any]:
    return status_body(code=503, reason="ServiceUnavailable", message=message,
                       details={"retryAfterSeconds": retry_after_seconds})
