"""Metric values, one input per spec.metrics entry, parsed from the metrics APIs' lists."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from autoscaler.model.fields import (
    INT64_MAX,
    INT64_MIN,
    ModelError,
    Quantity,
    join_path,
    parse_quantity_value,
    read_int,
    read_list,
    read_object,
    read_str,
    read_string_map,
)
from autoscaler.model.times import (
    GO_ZERO_TIME,
    parse_time,
    read_optional_time,
)
from metricscale.core.durations import DurationError, parse_go_timedelta
from metricscale.core.quantity import (
    QuantityError,
)

__all__ = [
    "ContainerUsage",
    "ExternalMetricValue",
    "ExternalMetricValueList",
    "MetricFetchError",
    "MetricInput",
    "MetricValue",
    "MetricValueList",
    "PodMetrics",
    "PodMetricsList",
    "empty_metric_list",
    "parse_metric_input",
]


@dataclass(frozen=True)
class ContainerUsage:
    name: str
    usage: Mapping[str, Quantity]


@dataclass(frozen=True)
class PodMetrics:
    """metrics.k8s.io/v1beta1 PodMetrics (usage summed once per resource, at parse time)."""

    name: str
    timestamp: datetime
    window: timedelta
    containers: tuple[ContainerUsage, ...] = ()
    namespace: str = ""
    # Derived: the pod's usage per resource, for resources every container reports.
    usage_totals: Mapping[str, int] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        totals: dict[str, int] = {}
        if self.containers:
            names = set(self.containers[0].usage)
            for container in self.containers[1:]:
                names &= set(container.usage)
            for resource in names:
                totals[resource] = sum(c.usage[resource].milli for c in self.containers)
        object.__setattr__(self, "usage_totals", totals)


@dataclass(frozen=True)
class PodMetricsList:
    items: tuple[PodMetrics, ...]


_ONE_MINUTE = timedelta(minutes=1)
_WINDOWS: dict[int, timedelta] = {}  # the few windows adapters report, made once


class MetricValue(NamedTuple):
    """custom.metrics.k8s.io MetricValue (v1beta2, or v1beta1's metricName). A NamedTuple: a
    Pods metric's answer holds one per pod, and every decision reads one."""

    described_kind: str
    described_name: str
    metric_name: str
    timestamp: datetime
    value: Quantity
    window_seconds: int | None = None
    described_namespace: str = ""
    described_api_version: str = ""

    @property
    def window(self) -> timedelta:
        """The sample window, one minute when the adapter gives none (as upstream assumes)."""
        seconds = self.window_seconds
        if seconds is None:
            return _ONE_MINUTE
        found = _WINDOWS.get(seconds)
        if found is None:
            found = timedelta(seconds=seconds)
            if len(_WINDOWS) < 64:
                _WINDOWS[seconds] = found
        return found


@dataclass(frozen=True)
class MetricValueList:
    items: tuple[MetricValue, ...]


@dataclass(frozen=True)
class ExternalMetricValue:
    """external.metrics.k8s.io/v1beta1 ExternalMetricValue."""

    metric_name: str
    timestamp: datetime
    value: Quantity
    metric_labels: Mapping[str, str] = field(default_factory=dict)
    window_seconds: int | None = None


@dataclass(frozen=True)
class ExternalMetricValueList:
    items: tuple[ExternalMetricValue, ...]


@dataclass(frozen=True)
class MetricFetchError:
    """The metrics API call for this metric failed; text as the client reported it."""

    message: str


MetricInput = PodMetricsList | MetricValueList | ExternalMetricValueList | MetricFetchError | None


def _parse_pod_metrics(raw: Mapping[str, Any], path: str) -> PodMetricsList:
    # Per answer: pods of one answer share timestamps and windows (see _parse_custom_metrics).
    times: dict[str, datetime] = {}
    windows: dict[str, timedelta] = {}
    quantities: dict[str, Quantity] = {}
    items = []
    for i, item in enumerate(read_list(raw, "items", path) or []):
        where = f"{path}.items[{i}]"
        obj = read_object(item, where)
        meta = read_object(obj.get("metadata") or {}, f"{where}.metadata")
        window_raw = obj.get("window")
        window = timedelta(0)
        if window_raw is not None:
            if not isinstance(window_raw, str):
                raise ModelError(f"{where}.window", "must be a duration string such as \"30s\"")
            cached_window = windows.get(window_raw)
            if cached_window is None:
                try:
                    cached_window = windows[window_raw] = parse_go_timedelta(window_raw)
                except DurationError as err:
                    raise ModelError(f"{where}.window", err.go_message) from None
            window = cached_window
        containers = []
        for j, c in enumerate(read_list(obj, "containers", where) or []):
            cw = f"{where}.containers[{j}]"
            cobj = read_object(c, cw)
            containers.append(ContainerUsage(name=read_str(cobj, "name", cw),
                                             usage=_usage(cobj, cw, quantities)))
        stamp = obj.get("timestamp")
        timestamp = (_cached_time(times, stamp) if type(stamp) is str else None) \
            or read_optional_time(obj, "timestamp", where)
        items.append(PodMetrics(
            name=read_str(meta, "name", f"{where}.metadata", required=True),
            namespace=read_str(meta, "namespace", f"{where}.metadata"),
            timestamp=timestamp or GO_ZERO_TIME,
            window=window,
            containers=tuple(containers),
        ))
    return PodMetricsList(items=tuple(items))


def _usage(obj: Mapping[str, Any], path: str,
           quantities: dict[str, Quantity]) -> dict[str, Quantity]:
    """A container's `usage` (a ResourceList), each distinct quantity string parsed once."""
    raw = obj.get("usage")
    if raw is None:
        return {}
    where = join_path(path, "usage")
    mapping = read_object(raw, where)
    usage: dict[str, Quantity] = {}
    for name, value in mapping.items():
        quantity = _cached_quantity(quantities, value) if type(value) is str else None
        usage[str(name)] = quantity or parse_quantity_value(value, f"{where}.{name}")
    return usage


def _cached_time(cache: dict[str, datetime], raw: str) -> datetime | None:
    """parse_time for a string, once per distinct string of one list (the items of an answer
    usually share one timestamp); None when it does not parse (the careful path says why)."""
    found = cache.get(raw)
    if found is None:
        try:
            found = parse_time(raw, "")
        except ModelError:
            return None
        cache[raw] = found
    return found


def _cached_quantity(cache: dict[str, Quantity], raw: str) -> Quantity | None:
    """Quantity.parse, once per distinct string of one list; None when it does not parse."""
    found = cache.get(raw)
    if found is None:
        try:
            found = Quantity.parse(raw)
        except QuantityError:
            return None
        cache[raw] = found
    return found


def _fast_str(obj: Mapping[str, Any], key: str) -> str | None:
    """What `read_str` returns for a well-formed field, or None to take the careful path."""
    raw = obj.get(key)
    if raw is None:
        return ""
    return raw if type(raw) is str else None


def _fast_metric_value(item: object, times: dict[str, datetime],
                       quantities: dict[str, Quantity]) -> MetricValue | None:
    """A v1beta2 MetricValue of the usual shape, read without building field paths; None for
    anything else (v1beta1, a missing field, a wrong type), which `_metric_value` then reads
    or rejects naming the field. Both give equal values for what this one accepts."""
    if type(item) is not dict:
        return None
    described = item.get("describedObject")
    metric = item.get("metric")
    stamp = item.get("timestamp")
    raw_value = item.get("value")
    window = item.get("windowSeconds")
    if (type(described) is not dict or type(metric) is not dict or type(stamp) is not str
            or type(raw_value) is not str):
        return None
    if window is not None and (type(window) is not int
                               or not INT64_MIN <= window <= INT64_MAX):
        return None
    kind = _fast_str(described, "kind")
    name = _fast_str(described, "name")
    namespace = _fast_str(described, "namespace")
    api_version = _fast_str(described, "apiVersion")
    metric_name = _fast_str(metric, "name")
    if kind is None or name is None or namespace is None or api_version is None \
            or metric_name is None:
        return None
    timestamp = _cached_time(times, stamp)
    value = _cached_quantity(quantities, raw_value)
    if timestamp is None or value is None:
        return None
    return MetricValue(described_kind=kind, described_name=name,
                       described_namespace=namespace, described_api_version=api_version,
                       metric_name=metric_name, timestamp=timestamp, window_seconds=window,
                       value=value)


def _metric_value(item: object, where: str) -> MetricValue:
    obj = read_object(item, where)
    described = read_object(obj.get("describedObject") or {}, f"{where}.describedObject")
    metric = obj.get("metric")
    if metric is not None:
        name = read_str(read_object(metric, f"{where}.metric"), "name", f"{where}.metric")
    else:
        name = read_str(obj, "metricName", where)
    value_raw = obj.get("value")
    if value_raw is None:
        raise ModelError(f"{where}.value", "is required")
    return MetricValue(
        described_kind=read_str(described, "kind", f"{where}.describedObject"),
        described_name=read_str(described, "name", f"{where}.describedObject"),
        described_namespace=read_str(described, "namespace", f"{where}.describedObject"),
        described_api_version=read_str(described, "apiVersion", f"{where}.describedObject"),
        metric_name=name,
        timestamp=read_optional_time(obj, "timestamp", where) or GO_ZERO_TIME,
        window_seconds=read_int(obj, "windowSeconds", where, bits=64),
        value=parse_quantity_value(value_raw, f"{where}.value"),
    )


def _parse_custom_metrics(raw: Mapping[str, Any], path: str) -> MetricValueList:
    # Per answer, not global: the items of one answer repeat their timestamp (and often
    # values), which is the largest pure cost of a steady reconcile.
    times: dict[str, datetime] = {}
    quantities: dict[str, Quantity] = {}
    items = []
    for i, item in enumerate(read_list(raw, "items", path) or []):
        value = _fast_metric_value(item, times, quantities)
        items.append(value if value is not None else _metric_value(item, f"{path}.items[{i}]"))
    return MetricValueList(items=tuple(items))


def _parse_external_metrics(raw: Mapping[str, Any], path: str) -> ExternalMetricValueList:
    items = []
    for i, item in enumerate(read_list(raw, "items", path) or []):
        where = f"{path}.items[{i}]"
        obj = read_object(item, where)
        value_raw = obj.get("value")
        if value_raw is None:
            raise ModelError(f"{where}.value", "is required")
        items.append(ExternalMetricValue(
            metric_name=read_str(obj, "metricName", where),
            metric_labels=read_string_map(obj, "metricLabels", where),
            timestamp=read_optional_time(obj, "timestamp", where) or GO_ZERO_TIME,
            window_seconds=read_int(obj, "window", where, bits=64),
            value=parse_quantity_value(value_raw, f"{where}.value"),
        ))
    return ExternalMetricValueList(items=tuple(items))


_LIST_KINDS: dict[str, Callable[[Mapping[str, Any], str], MetricInput]] = {
    "PodMetricsList": _parse_pod_metrics,
    "MetricValueList": _parse_custom_metrics,
    "ExternalMetricValueList": _parse_external_metrics,
}


def parse_metric_input(raw: Any, path: str, *, metric_type: str = "") -> MetricInput:
    """One `metrics[i]` entry: a metrics API list, `{"error": "..."}`, or null.

    A list without `kind` is read as the list the metric's type asks for.
    """
    if raw is None:
        return None
    obj = read_object(raw, path)
    if "error" in obj:
        return MetricFetchError(message=read_str(obj, "error", path, required=True))
    kind = read_str(obj, "kind", path)
    if not kind:
        kind = {"Resource": "PodMetricsList", "ContainerResource": "PodMetricsList",
                "Pods": "MetricValueList", "Object": "MetricValueList",
                "External": "ExternalMetricValueList"}.get(metric_type, "")
    parser = _LIST_KINDS.get(kind)
    if parser is None:
        raise ModelError(join_path(path, "kind"), "must be PodMetricsList, MetricValueList or "
                                              f"ExternalMetricValueList, not {kind or '(none)'}")
    return parser(obj, path)


def empty_metric_list(metric_type: str) -> MetricInput:
    """The list a metric type reads, with no items (None for a type that reads no list of
    several, such as Object)."""
    if metric_type in {"Resource", "ContainerResource"}:
        return PodMetricsList(items=())
    if metric_type == "Pods":
        return MetricValueList(items=())
    if metric_type == "External":
        return ExternalMetricValueList(items=())
    return None
