"""The autoscaling/v2 status: current metrics and conditions; their parse and rendering."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from autoscaler.model.fields import (
    Quantity,
    read_int,
    read_list,
    read_object,
    read_optional_quantity,
    read_str,
)
from autoscaler.model.spec import (
    METRIC_SOURCE_KEYS,
    CrossVersionObjectReference,
    MetricIdentifier,
    parse_identifier,
    parse_reference,
    render_identifier,
    render_reference,
)
from autoscaler.model.times import (
    format_time,
    read_optional_time,
)

__all__ = [
    "AutoscalerStatus",
    "Condition",
    "ContainerResourceMetricStatus",
    "ExternalMetricStatus",
    "MetricStatus",
    "MetricValueStatus",
    "ObjectMetricStatus",
    "PodsMetricStatus",
    "ResourceMetricStatus",
    "parse_status",
    "render_metric_status",
    "render_status",
]


# The status values are NamedTuples, not frozen dataclasses: every decision makes several per
# metric, and a frozen dataclass sets each field through object.__setattr__.
class MetricValueStatus(NamedTuple):
    value: Quantity | None = None
    average_value: Quantity | None = None
    average_utilization: int | None = None


class ResourceMetricStatus(NamedTuple):
    name: str
    current: MetricValueStatus


class ContainerResourceMetricStatus(NamedTuple):
    name: str
    container: str
    current: MetricValueStatus


class PodsMetricStatus(NamedTuple):
    metric: MetricIdentifier
    current: MetricValueStatus


class ObjectMetricStatus(NamedTuple):
    metric: MetricIdentifier
    current: MetricValueStatus
    described_object: CrossVersionObjectReference


class ExternalMetricStatus(NamedTuple):
    metric: MetricIdentifier
    current: MetricValueStatus


class MetricStatus(NamedTuple):
    """One entry of status.currentMetrics; `type == ""` is the empty entry of a failed metric."""

    type: str = ""
    resource: ResourceMetricStatus | None = None
    container_resource: ContainerResourceMetricStatus | None = None
    pods: PodsMetricStatus | None = None
    object: ObjectMetricStatus | None = None
    external: ExternalMetricStatus | None = None


class Condition(NamedTuple):
    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None


class AutoscalerStatus(NamedTuple):
    current_replicas: int = 0
    desired_replicas: int = 0
    last_scale_time: datetime | None = None
    current_metrics: tuple[MetricStatus, ...] = ()
    conditions: tuple[Condition, ...] = ()
    observed_generation: int | None = None


def _parse_value_status(raw: Any, path: str) -> MetricValueStatus:
    obj = read_object(raw if raw is not None else {}, path)
    return MetricValueStatus(
        value=read_optional_quantity(obj, "value", path),
        average_value=read_optional_quantity(obj, "averageValue", path),
        average_utilization=read_int(obj, "averageUtilization", path),
    )


def _parse_metric_status(raw: Any, path: str) -> MetricStatus:
    obj = read_object(raw, path)
    kind = read_str(obj, "type", path)
    key = METRIC_SOURCE_KEYS.get(kind)
    if key is None or obj.get(key) is None:
        return MetricStatus(type=kind)
    where = f"{path}.{key}"
    src = read_object(obj[key], where)
    current = _parse_value_status(src.get("current"), f"{where}.current")
    if kind == "Resource":
        return MetricStatus(type=kind, resource=ResourceMetricStatus(
            name=read_str(src, "name", where), current=current))
    if kind == "ContainerResource":
        return MetricStatus(type=kind, container_resource=ContainerResourceMetricStatus(
            name=read_str(src, "name", where), container=read_str(src, "container", where),
            current=current))
    metric = parse_identifier(src.get("metric") or {"name": "?"}, f"{where}.metric")
    if kind == "Pods":
        return MetricStatus(type=kind, pods=PodsMetricStatus(metric=metric, current=current))
    if kind == "Object":
        return MetricStatus(type=kind, object=ObjectMetricStatus(
            metric=metric, current=current,
            described_object=parse_reference(src.get("describedObject"),
                                              f"{where}.describedObject")))
    return MetricStatus(type=kind, external=ExternalMetricStatus(metric=metric, current=current))


def parse_status(raw: Any, path: str) -> AutoscalerStatus:
    if raw is None:
        return AutoscalerStatus()
    obj = read_object(raw, path)
    conditions = []
    for i, item in enumerate(read_list(obj, "conditions", path) or []):
        where = f"{path}.conditions[{i}]"
        cond = read_object(item, where)
        conditions.append(Condition(
            type=read_str(cond, "type", where, required=True),
            status=read_str(cond, "status", where),
            reason=read_str(cond, "reason", where),
            message=read_str(cond, "message", where),
            last_transition_time=read_optional_time(cond, "lastTransitionTime", where),
        ))
    return AutoscalerStatus(
        current_replicas=read_int(obj, "currentReplicas", path) or 0,
        desired_replicas=read_int(obj, "desiredReplicas", path) or 0,
        last_scale_time=read_optional_time(obj, "lastScaleTime", path),
        current_metrics=tuple(
            _parse_metric_status(item, f"{path}.currentMetrics[{i}]")
            for i, item in enumerate(read_list(obj, "currentMetrics", path) or [])),
        conditions=tuple(conditions),
        observed_generation=read_int(obj, "observedGeneration", path, bits=64),
    )


def _render_value_status(current: MetricValueStatus) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if current.value is not None:
        out["value"] = current.value.text
    if current.average_value is not None:
        out["averageValue"] = current.average_value.text
    if current.average_utilization is not None:
        out["averageUtilization"] = current.average_utilization
    return out


def render_metric_status(status: MetricStatus) -> dict[str, Any]:
    """One status.currentMetrics entry in Go's field order (`{"type": ""}` when empty)."""
    out: dict[str, Any] = {"type": status.type}
    if status.object is not None:
        out["object"] = {"metric": render_identifier(status.object.metric),
                         "current": _render_value_status(status.object.current),
                         "describedObject": render_reference(status.object.described_object)}
    if status.pods is not None:
        out["pods"] = {"metric": render_identifier(status.pods.metric),
                       "current": _render_value_status(status.pods.current)}
    if status.resource is not None:
        out["resource"] = {"name": status.resource.name,
                           "current": _render_value_status(status.resource.current)}
    if status.container_resource is not None:
        out["containerResource"] = {
            "name": status.container_resource.name,
            "current": _render_value_status(status.container_resource.current),
            "container": status.container_resource.container}
    if status.external is not None:
        out["external"] = {"metric": render_identifier(status.external.metric),
                           "current": _render_value_status(status.external.current)}
    return out


def _render_condition(condition: Condition) -> dict[str, Any]:
    out: dict[str, Any] = {"type": condition.type, "status": condition.status}
    # metav1.Time marshals a zero (absent) time as null
    out["lastTransitionTime"] = (None if condition.last_transition_time is None
                                 else format_time(condition.last_transition_time))
    if condition.reason:
        out["reason"] = condition.reason
    if condition.message:
        out["message"] = condition.message
    return out


def render_status(status: AutoscalerStatus) -> dict[str, Any]:
    """status in the wire format, fields in Go's order, empty ones left out as Go does."""
    out: dict[str, Any] = {}
    if status.observed_generation is not None:
        out["observedGeneration"] = status.observed_generation
    if status.last_scale_time is not None:
        out["lastScaleTime"] = format_time(status.last_scale_time)
    if status.current_replicas:
        out["currentReplicas"] = status.current_replicas
    out["desiredReplicas"] = status.desired_replicas
    if status.current_metrics:
        out["currentMetrics"] = [render_metric_status(m) for m in status.current_metrics]
    if status.conditions:
        out["conditions"] = [_render_condition(c) for c in status.conditions]
    return out
