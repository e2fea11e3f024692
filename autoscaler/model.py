"""The autoscaler's values: autoscaling/v2 spec and status, pods, scale, metric values, history.

Everything a decision looks at is parsed here from the Kubernetes wire format (JSON as the API
server returns it) into frozen dataclasses, and rendered back at the edge. Parse errors name
the field path (`spec.metrics[1].pods.target.averageValue: ...`). Both kinds share one spec:
`autoscaling/v2` HorizontalPodAutoscaler and `metricscale.dev/v1alpha1` Autoscaler.

Label selectors are metricscale.core.selectors': the spec's `LabelSelector` is parsed here into its
typed form, with field paths in the errors.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from autoscaler.decision.settings import parse_duration
from metricscale.core.quantity import (
    Format,
    QuantityError,
    format_milli,
    milli_value,
    parse_quantity,
)
from metricscale.core.selectors import (
    LabelSelector,
    LabelSelectorRequirement,
    Selector,
    render_label_selector,
)

__all__ = [
    "AUTOSCALER_API_VERSION",
    "AUTOSCALER_KIND",
    "GO_ZERO_TIME",
    "HPA_API_VERSION",
    "HPA_KIND",
    "Autoscaler",
    "AutoscalerSpec",
    "AutoscalerStatus",
    "Behavior",
    "Condition",
    "Container",
    "ContainerResourceMetricSource",
    "ContainerResourceMetricStatus",
    "ContainerUsage",
    "CrossVersionObjectReference",
    "ExternalMetricSource",
    "ExternalMetricStatus",
    "ExternalMetricValue",
    "ExternalMetricValueList",
    "History",
    "MetricFetchError",
    "MetricIdentifier",
    "MetricInput",
    "MetricSpec",
    "MetricStatus",
    "MetricTarget",
    "MetricValue",
    "MetricValueList",
    "MetricValueStatus",
    "ModelError",
    "ObjectMeta",
    "ObjectMetricSource",
    "ObjectMetricStatus",
    "Pod",
    "PodMetrics",
    "PodMetricsList",
    "PodReadyCondition",
    "PodsMetricSource",
    "PodsMetricStatus",
    "Quantity",
    "Recommendation",
    "ResourceMetricSource",
    "ResourceMetricStatus",
    "Scale",
    "ScaleError",
    "ScaleEvent",
    "ScalingPolicy",
    "ScalingRules",
    "format_time",
    "format_time_precise",
    "parse_autoscaler",
    "parse_history",
    "parse_metric_input",
    "parse_pod",
    "parse_pods",
    "parse_scale",
    "parse_time",
    "render_autoscaler",
    "render_history",
    "render_metric_status",
    "render_spec",
    "render_status",
]

HPA_API_VERSION = "autoscaling/v2"
HPA_KIND = "HorizontalPodAutoscaler"
AUTOSCALER_API_VERSION = "metricscale.dev/v1alpha1"
AUTOSCALER_KIND = "Autoscaler"

# Go's zero time.Time: a real instant (year 1), not "absent".
GO_ZERO_TIME = datetime(1, 1, 1, tzinfo=UTC)

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


class ModelError(ValueError):
    """Input that does not parse; `path` names the field, `str(err)` is `path: message`."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


# --------------------------------------------------------------------------------------------
# Wire-reading helpers


def _object(raw: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ModelError(path, f"must be an object, not {_kind(raw)}")
    return raw


def _kind(raw: Any) -> str:
    if raw is None:
        return "null"
    if isinstance(raw, bool):
        return "a boolean"
    if isinstance(raw, int | float):
        return "a number"
    if isinstance(raw, str):
        return "a string"
    if isinstance(raw, list | tuple):
        return "a list"
    return "an object" if isinstance(raw, Mapping) else type(raw).__name__


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _opt_object(obj: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any] | None:
    raw = obj.get(key)
    return None if raw is None else _object(raw, _join(path, key))


def _str(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> str:
    raw = obj.get(key)
    if raw is None:
        if required:
            raise ModelError(_join(path, key), "is required")
        return ""
    if not isinstance(raw, str):
        raise ModelError(_join(path, key), f"must be a string, not {_kind(raw)}")
    if required and not raw:
        raise ModelError(_join(path, key), "must not be empty")
    return raw


def _int(obj: Mapping[str, Any], key: str, path: str, *, bits: int = 32,
         required: bool = False) -> int | None:
    raw = obj.get(key)
    where = _join(path, key)
    if raw is None:
        if required:
            raise ModelError(where, "is required")
        return None
    if isinstance(raw, bool) or not isinstance(raw, int):
        if isinstance(raw, float) and raw.is_integer():
            raw = int(raw)
        else:
            raise ModelError(where, f"must be an integer, not {_kind(raw)}")
    low, high = (_INT32_MIN, _INT32_MAX) if bits == 32 else (_INT64_MIN, _INT64_MAX)
    if not low <= raw <= high:
        raise ModelError(where, f"must fit in int{bits}")
    return int(raw)


def _bool(obj: Mapping[str, Any], key: str, path: str) -> bool:
    raw = obj.get(key)
    if raw is None:
        return False
    if not isinstance(raw, bool):
        raise ModelError(_join(path, key), f"must be true or false, not {_kind(raw)}")
    return raw


def _list(obj: Mapping[str, Any], key: str, path: str) -> list[Any] | None:
    raw = obj.get(key)
    if raw is None:
        return None
    if not isinstance(raw, list | tuple):
        raise ModelError(_join(path, key), f"must be a list, not {_kind(raw)}")
    return list(raw)


def _string_map(obj: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
    raw = obj.get(key)
    if raw is None:
        return {}
    mapping = _object(raw, _join(path, key))
    out: dict[str, str] = {}
    for name, value in mapping.items():
        if not isinstance(value, str):
            raise ModelError(f"{_join(path, key)}.{name}", f"must be a string, not {_kind(value)}")
        out[str(name)] = value
    return out


# --------------------------------------------------------------------------------------------
# Times

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)


def parse_time(raw: Any, path: str) -> datetime:
    """An RFC 3339 time (`2026-11-21T10:00:00Z`, fractions and offsets allowed) in UTC."""
    if not isinstance(raw, str):
        raise ModelError(path, f"must be an RFC 3339 time string, not {_kind(raw)}")
    match = _RFC3339.match(raw)
    if match is None:
        raise ModelError(path,
                         f"must be an RFC 3339 time such as 2026-11-21T10:00:00Z, not {raw!r}")
    year, month, day, hour, minute, second = (int(match[i]) for i in range(1, 7))
    fraction = match[7] or ""
    micros = int((fraction[1:] + "000000")[:6]) if fraction else 0
    zone = match[8]
    try:
        value = datetime(year, month, day, hour, minute, second, micros, tzinfo=UTC)
        if zone not in {"Z", "z"}:
            sign = 1 if zone[0] == "+" else -1
            offset = timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
            value -= sign * offset
    except (ValueError, OverflowError) as err:
        raise ModelError(path, f"is not a valid time: {raw!r} ({err})") from None
    return value


def _opt_time(obj: Mapping[str, Any], key: str, path: str) -> datetime | None:
    raw = obj.get(key)
    return None if raw is None else parse_time(raw, _join(path, key))


def format_time(value: datetime) -> str:
    """metav1.Time on the wire: RFC 3339 in UTC, whole seconds."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_time_precise(value: datetime) -> str:
    """RFC 3339 in UTC, with microseconds when there are any (for history timestamps)."""
    utc = value.astimezone(UTC)
    if utc.microsecond:
        return utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------------------------
# Quantities


@dataclass(frozen=True)
class Quantity:
    """A resource.Quantity: its exact value, `MilliValue()`, and the text it came as.

    Equality is by value, as Go's semantic equality compares quantities.
    """

    value: Decimal
    milli: int = field(compare=False)
    text: str = field(compare=False)

    @classmethod
    def parse(cls, text: str) -> Quantity:
        # Fast paths for the shapes metrics APIs answer most ("12", "1500m"): the same values
        # parse_quantity and milli_value give, without the regular expression and Decimal
        # contexts. Short enough that MilliValue cannot saturate.
        if len(text) <= 15 and text.isascii():
            if text.isdigit():
                whole = int(text)
                return cls(value=Decimal(whole), milli=whole * 1000, text=text)
            if text[-1:] == "m" and text[:-1].isdigit():
                milli = int(text[:-1])
                return cls(value=Decimal(milli).scaleb(-3), milli=milli, text=text)
        value = parse_quantity(text)
        # Go's MilliValue saturates instead of overflowing int64 for absurd values; so do we.
        milli = max(_INT64_MIN, min(_INT64_MAX, milli_value(value)))
        return cls(value=value, milli=milli, text=text)

    @classmethod
    def from_milli(cls, milli: int, fmt: Format = Format.DECIMAL_SI) -> Quantity:
        """resource.NewMilliQuantity(milli, fmt)."""
        text = format_milli(milli, fmt)
        return cls(value=Decimal(milli).scaleb(-3), milli=milli, text=text)


def _quantity_value(raw: Any, path: str) -> Quantity:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ModelError(path, f"must be a quantity string such as \"500m\", not {_kind(raw)}")
    # Quantity.UnmarshalJSON also accepts bare JSON numbers.
    text = raw if isinstance(raw, str) else repr(raw)
    try:
        return Quantity.parse(text)
    except QuantityError as err:
        raise ModelError(path, str(err)) from None


def _opt_quantity(obj: Mapping[str, Any], key: str, path: str) -> Quantity | None:
    raw = obj.get(key)
    return None if raw is None else _quantity_value(raw, _join(path, key))


def _resource_list(obj: Mapping[str, Any], key: str, path: str) -> dict[str, Quantity]:
    raw = obj.get(key)
    if raw is None:
        return {}
    mapping = _object(raw, _join(path, key))
    return {str(name): _quantity_value(value, f"{_join(path, key)}.{name}")
            for name, value in mapping.items()}


# --------------------------------------------------------------------------------------------
# Label selectors


def _parse_label_selector(raw: Any, path: str) -> LabelSelector:
    obj = _object(raw, path)
    labels = _string_map(obj, "matchLabels", path)
    expressions = []
    for i, item in enumerate(_list(obj, "matchExpressions", path) or []):
        where = f"{path}.matchExpressions[{i}]"
        expr = _object(item, where)
        values_raw = _list(expr, "values", where)
        values: tuple[str, ...] | None = None
        if values_raw is not None:
            for j, value in enumerate(values_raw):
                if not isinstance(value, str):
                    raise ModelError(f"{where}.values[{j}]",
                                     f"must be a string, not {_kind(value)}")
            values = tuple(values_raw)
        expressions.append(LabelSelectorRequirement(
            key=_str(expr, "key", where), operator=_str(expr, "operator", where), values=values))
    return LabelSelector(match_labels=tuple(labels.items()), match_expressions=tuple(expressions))


# --------------------------------------------------------------------------------------------
# Spec


@dataclass(frozen=True)
class CrossVersionObjectReference:
    kind: str
    name: str
    api_version: str = ""


@dataclass(frozen=True)
class MetricIdentifier:
    name: str
    selector: LabelSelector | None = None


@dataclass(frozen=True)
class MetricTarget:
    type: str
    value: Quantity | None = None
    average_value: Quantity | None = None
    average_utilization: int | None = None


@dataclass(frozen=True)
class ResourceMetricSource:
    name: str
    target: MetricTarget


@dataclass(frozen=True)
class ContainerResourceMetricSource:
    name: str
    container: str
    target: MetricTarget


@dataclass(frozen=True)
class PodsMetricSource:
    metric: MetricIdentifier
    target: MetricTarget


@dataclass(frozen=True)
class ObjectMetricSource:
    described_object: CrossVersionObjectReference
    metric: MetricIdentifier
    target: MetricTarget


@dataclass(frozen=True)
class ExternalMetricSource:
    metric: MetricIdentifier
    target: MetricTarget


@dataclass(frozen=True)
class MetricSpec:
    """One entry of spec.metrics; `type` may be anything (unknown types are decided upon)."""

    type: str
    resource: ResourceMetricSource | None = None
    container_resource: ContainerResourceMetricSource | None = None
    pods: PodsMetricSource | None = None
    object: ObjectMetricSource | None = None
    external: ExternalMetricSource | None = None


@dataclass(frozen=True)
class ScalingPolicy:
    type: str  # Pods or Percent
    value: int
    period_seconds: int


@dataclass(frozen=True)
class ScalingRules:
    """HPAScalingRules; after API defaulting only scale-down's window may still be None."""

    stabilization_window_seconds: int | None = None
    select_policy: str | None = None
    # None: not given; an explicit empty list replaces the defaults, as in Go.
    policies: tuple[ScalingPolicy, ...] | None = None
    tolerance: Quantity | None = None


@dataclass(frozen=True)
class Behavior:
    scale_up: ScalingRules | None = None
    scale_down: ScalingRules | None = None


@dataclass(frozen=True)
class AutoscalerSpec:
    scale_target_ref: CrossVersionObjectReference
    max_replicas: int
    min_replicas: int | None = None
    metrics: tuple[MetricSpec, ...] = ()
    behavior: Behavior | None = None


# --------------------------------------------------------------------------------------------
# Status


@dataclass(frozen=True)
class MetricValueStatus:
    value: Quantity | None = None
    average_value: Quantity | None = None
    average_utilization: int | None = None


@dataclass(frozen=True)
class ResourceMetricStatus:
    name: str
    current: MetricValueStatus


@dataclass(frozen=True)
class ContainerResourceMetricStatus:
    name: str
    container: str
    current: MetricValueStatus


@dataclass(frozen=True)
class PodsMetricStatus:
    metric: MetricIdentifier
    current: MetricValueStatus


@dataclass(frozen=True)
class ObjectMetricStatus:
    metric: MetricIdentifier
    current: MetricValueStatus
    described_object: CrossVersionObjectReference


@dataclass(frozen=True)
class ExternalMetricStatus:
    metric: MetricIdentifier
    current: MetricValueStatus


@dataclass(frozen=True)
class MetricStatus:
    """One entry of status.currentMetrics; `type == ""` is the empty entry of a failed metric."""

    type: str = ""
    resource: ResourceMetricStatus | None = None
    container_resource: ContainerResourceMetricStatus | None = None
    pods: PodsMetricStatus | None = None
    object: ObjectMetricStatus | None = None
    external: ExternalMetricStatus | None = None


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None


@dataclass(frozen=True)
class AutoscalerStatus:
    current_replicas: int = 0
    desired_replicas: int = 0
    last_scale_time: datetime | None = None
    current_metrics: tuple[MetricStatus, ...] = ()
    conditions: tuple[Condition, ...] = ()
    observed_generation: int | None = None


@dataclass(frozen=True)
class ObjectMeta:
    name: str
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int | None = None


@dataclass(frozen=True)
class Autoscaler:
    """An autoscaling/v2 HorizontalPodAutoscaler or a metricscale.dev/v1alpha1 Autoscaler."""

    api_version: str
    kind: str
    metadata: ObjectMeta
    spec: AutoscalerSpec
    status: AutoscalerStatus = AutoscalerStatus()

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"


def _parse_reference(raw: Any, path: str) -> CrossVersionObjectReference:
    obj = _object(raw, path)
    return CrossVersionObjectReference(
        kind=_str(obj, "kind", path, required=True),
        name=_str(obj, "name", path, required=True),
        api_version=_str(obj, "apiVersion", path),
    )


def _parse_identifier(raw: Any, path: str) -> MetricIdentifier:
    obj = _object(raw, path)
    selector_raw = obj.get("selector")
    selector = None if selector_raw is None else _parse_label_selector(selector_raw,
                                                                       f"{path}.selector")
    return MetricIdentifier(name=_str(obj, "name", path, required=True), selector=selector)


def _parse_target(raw: Any, path: str) -> MetricTarget:
    obj = _object(raw, path)
    return MetricTarget(
        type=_str(obj, "type", path),
        value=_opt_quantity(obj, "value", path),
        average_value=_opt_quantity(obj, "averageValue", path),
        average_utilization=_int(obj, "averageUtilization", path),
    )


_SOURCE_KEYS = {
    "Resource": "resource",
    "ContainerResource": "containerResource",
    "Pods": "pods",
    "Object": "object",
    "External": "external",
}


def _parse_metric_spec(raw: Any, path: str) -> MetricSpec:
    obj = _object(raw, path)
    kind = _str(obj, "type", path)
    key = _SOURCE_KEYS.get(kind)
    if key is None:
        return MetricSpec(type=kind)  # decided upon as upstream does: InvalidMetricSourceType
    where = f"{path}.{key}"
    source = obj.get(key)
    if source is None:
        raise ModelError(where, f"is required for a metric of type {kind}")
    src = _object(source, where)
    target = _parse_target(src.get("target") if src.get("target") is not None else {},
                           f"{where}.target")
    if kind == "Resource":
        return MetricSpec(type=kind, resource=ResourceMetricSource(
            name=_str(src, "name", where, required=True), target=target))
    if kind == "ContainerResource":
        return MetricSpec(type=kind, container_resource=ContainerResourceMetricSource(
            name=_str(src, "name", where, required=True),
            container=_str(src, "container", where, required=True), target=target))
    if kind == "Pods":
        if target.average_value is None:
            # upstream dereferences it unconditionally; the API server requires it
            raise ModelError(f"{where}.target.averageValue", "is required for a Pods metric")
        return MetricSpec(type=kind, pods=PodsMetricSource(
            metric=_parse_identifier(src.get("metric"), f"{where}.metric"), target=target))
    if kind == "Object":
        return MetricSpec(type=kind, object=ObjectMetricSource(
            described_object=_parse_reference(src.get("describedObject"),
                                              f"{where}.describedObject"),
            metric=_parse_identifier(src.get("metric"), f"{where}.metric"), target=target))
    return MetricSpec(type=kind, external=ExternalMetricSource(
        metric=_parse_identifier(src.get("metric"), f"{where}.metric"), target=target))


def _parse_rules(raw: Any, path: str) -> ScalingRules | None:
    if raw is None:
        return None
    obj = _object(raw, path)
    policies_raw = _list(obj, "policies", path)
    policies: tuple[ScalingPolicy, ...] | None = None
    if policies_raw is not None:
        parsed = []
        for i, item in enumerate(policies_raw):
            where = f"{path}.policies[{i}]"
            policy = _object(item, where)
            parsed.append(ScalingPolicy(
                type=_str(policy, "type", where, required=True),
                value=_int(policy, "value", where, required=True) or 0,
                period_seconds=_int(policy, "periodSeconds", where, required=True) or 0,
            ))
        policies = tuple(parsed)
    select = obj.get("selectPolicy")
    if select is not None and not isinstance(select, str):
        raise ModelError(f"{path}.selectPolicy", f"must be a string, not {_kind(select)}")
    return ScalingRules(
        stabilization_window_seconds=_int(obj, "stabilizationWindowSeconds", path),
        select_policy=select,
        policies=policies,
        tolerance=_opt_quantity(obj, "tolerance", path),
    )


# API defaults (pkg/apis/autoscaling/v2/defaults.go): applied to a user-supplied behavior only.
_DEFAULT_SCALE_UP = ScalingRules(
    stabilization_window_seconds=0,
    select_policy="Max",
    policies=(ScalingPolicy("Pods", 4, 15), ScalingPolicy("Percent", 100, 15)),
)
_DEFAULT_SCALE_DOWN = ScalingRules(
    # None: the controller's --horizontal-pod-autoscaler-downscale-stabilization applies
    stabilization_window_seconds=None,
    select_policy="Max",
    policies=(ScalingPolicy("Percent", 100, 15),),
)


def _default_rules(given: ScalingRules | None, defaults: ScalingRules) -> ScalingRules:
    """copyHPAScalingRules: every non-nil field of `given` over the defaults."""
    if given is None:
        return defaults
    return ScalingRules(
        stabilization_window_seconds=(given.stabilization_window_seconds
                                      if given.stabilization_window_seconds is not None
                                      else defaults.stabilization_window_seconds),
        select_policy=given.select_policy if given.select_policy is not None
        else defaults.select_policy,
        policies=given.policies if given.policies is not None else defaults.policies,
        tolerance=given.tolerance if given.tolerance is not None else defaults.tolerance,
    )


def _parse_spec(raw: Any, path: str) -> AutoscalerSpec:
    obj = _object(raw, path)
    metrics = tuple(_parse_metric_spec(item, f"{path}.metrics[{i}]")
                    for i, item in enumerate(_list(obj, "metrics", path) or []))
    if not metrics:
        # SetDefaults_HorizontalPodAutoscaler: cpu at 80% of requests
        metrics = (MetricSpec(type="Resource", resource=ResourceMetricSource(
            name="cpu", target=MetricTarget(type="Utilization", average_utilization=80))),)
    behavior_raw = _opt_object(obj, "behavior", path)
    behavior = None
    if behavior_raw is not None:
        behavior = Behavior(
            scale_up=_default_rules(_parse_rules(behavior_raw.get("scaleUp"),
                                                 f"{path}.behavior.scaleUp"), _DEFAULT_SCALE_UP),
            scale_down=_default_rules(_parse_rules(behavior_raw.get("scaleDown"),
                                                   f"{path}.behavior.scaleDown"),
                                      _DEFAULT_SCALE_DOWN),
        )
    min_replicas = _int(obj, "minReplicas", path)
    return AutoscalerSpec(
        scale_target_ref=_parse_reference(obj.get("scaleTargetRef"), f"{path}.scaleTargetRef"),
        min_replicas=1 if min_replicas is None else min_replicas,
        max_replicas=_int(obj, "maxReplicas", path, required=True) or 0,
        metrics=metrics,
        behavior=behavior,
    )


def _parse_value_status(raw: Any, path: str) -> MetricValueStatus:
    obj = _object(raw if raw is not None else {}, path)
    return MetricValueStatus(
        value=_opt_quantity(obj, "value", path),
        average_value=_opt_quantity(obj, "averageValue", path),
        average_utilization=_int(obj, "averageUtilization", path),
    )


def _parse_metric_status(raw: Any, path: str) -> MetricStatus:
    obj = _object(raw, path)
    kind = _str(obj, "type", path)
    key = _SOURCE_KEYS.get(kind)
    if key is None or obj.get(key) is None:
        return MetricStatus(type=kind)
    where = f"{path}.{key}"
    src = _object(obj[key], where)
    current = _parse_value_status(src.get("current"), f"{where}.current")
    if kind == "Resource":
        return MetricStatus(type=kind, resource=ResourceMetricStatus(
            name=_str(src, "name", where), current=current))
    if kind == "ContainerResource":
        return MetricStatus(type=kind, container_resource=ContainerResourceMetricStatus(
            name=_str(src, "name", where), container=_str(src, "container", where),
            current=current))
    metric = _parse_identifier(src.get("metric") or {"name": "?"}, f"{where}.metric")
    if kind == "Pods":
        return MetricStatus(type=kind, pods=PodsMetricStatus(metric=metric, current=current))
    if kind == "Object":
        return MetricStatus(type=kind, object=ObjectMetricStatus(
            metric=metric, current=current,
            described_object=_parse_reference(src.get("describedObject"),
                                              f"{where}.describedObject")))
    return MetricStatus(type=kind, external=ExternalMetricStatus(metric=metric, current=current))


def _parse_status(raw: Any, path: str) -> AutoscalerStatus:
    if raw is None:
        return AutoscalerStatus()
    obj = _object(raw, path)
    conditions = []
    for i, item in enumerate(_list(obj, "conditions", path) or []):
        where = f"{path}.conditions[{i}]"
        cond = _object(item, where)
        conditions.append(Condition(
            type=_str(cond, "type", where, required=True),
            status=_str(cond, "status", where),
            reason=_str(cond, "reason", where),
            message=_str(cond, "message", where),
            last_transition_time=_opt_time(cond, "lastTransitionTime", where),
        ))
    return AutoscalerStatus(
        current_replicas=_int(obj, "currentReplicas", path) or 0,
        desired_replicas=_int(obj, "desiredReplicas", path) or 0,
        last_scale_time=_opt_time(obj, "lastScaleTime", path),
        current_metrics=tuple(_parse_metric_status(item, f"{path}.currentMetrics[{i}]")
                              for i, item in enumerate(_list(obj, "currentMetrics", path) or [])),
        conditions=tuple(conditions),
        observed_generation=_int(obj, "observedGeneration", path, bits=64),
    )


def _parse_meta(raw: Any, path: str) -> ObjectMeta:
    obj = _object(raw if raw is not None else {}, path)
    return ObjectMeta(
        name=_str(obj, "name", path),
        namespace=_str(obj, "namespace", path),
        uid=_str(obj, "uid", path),
        resource_version=_str(obj, "resourceVersion", path),
        generation=_int(obj, "generation", path, bits=64),
    )


def parse_autoscaler(raw: Any, path: str = "") -> Autoscaler:
    """An HPA or Autoscaler object from the wire, with the API server's defaults applied."""
    obj = _object(raw, path or "autoscaler")
    api_version = _str(obj, "apiVersion", path)
    kind = _str(obj, "kind", path)
    accepted = {(HPA_API_VERSION, HPA_KIND), (AUTOSCALER_API_VERSION, AUTOSCALER_KIND)}
    if (api_version, kind) not in accepted:
        raise ModelError(
            _join(path, "kind") if api_version in {HPA_API_VERSION, AUTOSCALER_API_VERSION}
            else _join(path, "apiVersion"),
            f"expected {HPA_API_VERSION} {HPA_KIND} or {AUTOSCALER_API_VERSION} "
            f"{AUTOSCALER_KIND}, got {api_version or '(none)'} {kind or '(none)'}")
    return Autoscaler(
        api_version=api_version,
        kind=kind,
        metadata=_parse_meta(obj.get("metadata"), _join(path, "metadata")),
        spec=_parse_spec(obj.get("spec"), _join(path, "spec")),
        status=_parse_status(obj.get("status"), _join(path, "status")),
    )


# --------------------------------------------------------------------------------------------
# Rendering to the wire


def _render_reference(ref: CrossVersionObjectReference) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": ref.kind, "name": ref.name}
    if ref.api_version:
        out["apiVersion"] = ref.api_version
    return out


def _render_identifier(metric: MetricIdentifier) -> dict[str, Any]:
    out: dict[str, Any] = {"name": metric.name}
    if metric.selector is not None:
        out["selector"] = render_label_selector(metric.selector)
    return out


def _render_target(target: MetricTarget) -> dict[str, Any]:
    out: dict[str, Any] = {"type": target.type}
    if target.value is not None:
        out["value"] = target.value.text
    if target.average_value is not None:
        out["averageValue"] = target.average_value.text
    if target.average_utilization is not None:
        out["averageUtilization"] = target.average_utilization
    return out


def _render_metric_spec(metric: MetricSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"type": metric.type}
    if metric.object is not None:
        out["object"] = {"describedObject": _render_reference(metric.object.described_object),
                         "metric": _render_identifier(metric.object.metric),
                         "target": _render_target(metric.object.target)}
    if metric.pods is not None:
        out["pods"] = {"metric": _render_identifier(metric.pods.metric),
                       "target": _render_target(metric.pods.target)}
    if metric.resource is not None:
        out["resource"] = {"name": metric.resource.name,
                           "target": _render_target(metric.resource.target)}
    if metric.container_resource is not None:
        out["containerResource"] = {"name": metric.container_resource.name,
                                    "target": _render_target(metric.container_resource.target),
                                    "container": metric.container_resource.container}
    if metric.external is not None:
        out["external"] = {"metric": _render_identifier(metric.external.metric),
                           "target": _render_target(metric.external.target)}
    return out


def _render_rules(rules: ScalingRules) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if rules.stabilization_window_seconds is not None:
        out["stabilizationWindowSeconds"] = rules.stabilization_window_seconds
    if rules.select_policy is not None:
        out["selectPolicy"] = rules.select_policy
    if rules.policies is not None:
        out["policies"] = [{"type": p.type, "value": p.value, "periodSeconds": p.period_seconds}
                           for p in rules.policies]
    if rules.tolerance is not None:
        out["tolerance"] = rules.tolerance.text
    return out


def render_spec(spec: AutoscalerSpec) -> dict[str, Any]:
    """spec in the wire format (defaults included, as the API server returns it)."""
    out: dict[str, Any] = {"scaleTargetRef": _render_reference(spec.scale_target_ref)}
    if spec.min_replicas is not None:
        out["minReplicas"] = spec.min_replicas
    out["maxReplicas"] = spec.max_replicas
    out["metrics"] = [_render_metric_spec(m) for m in spec.metrics]
    if spec.behavior is not None:
        behavior: dict[str, Any] = {}
        if spec.behavior.scale_up is not None:
            behavior["scaleUp"] = _render_rules(spec.behavior.scale_up)
        if spec.behavior.scale_down is not None:
            behavior["scaleDown"] = _render_rules(spec.behavior.scale_down)
        out["behavior"] = behavior
    return out


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
        out["object"] = {"metric": _render_identifier(status.object.metric),
                         "current": _render_value_status(status.object.current),
                         "describedObject": _render_reference(status.object.described_object)}
    if status.pods is not None:
        out["pods"] = {"metric": _render_identifier(status.pods.metric),
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
        out["external"] = {"metric": _render_identifier(status.external.metric),
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


def render_autoscaler(autoscaler: Autoscaler) -> dict[str, Any]:
    """The whole object in the wire format."""
    meta: dict[str, Any] = {"name": autoscaler.metadata.name}
    if autoscaler.metadata.namespace:
        meta["namespace"] = autoscaler.metadata.namespace
    if autoscaler.metadata.uid:
        meta["uid"] = autoscaler.metadata.uid
    if autoscaler.metadata.resource_version:
        meta["resourceVersion"] = autoscaler.metadata.resource_version
    if autoscaler.metadata.generation is not None:
        meta["generation"] = autoscaler.metadata.generation
    return {
        "apiVersion": autoscaler.api_version,
        "kind": autoscaler.kind,
        "metadata": meta,
        "spec": render_spec(autoscaler.spec),
        "status": render_status(autoscaler.status),
    }


# --------------------------------------------------------------------------------------------
# Scale


@dataclass(frozen=True)
class Scale:
    """The target's autoscaling/v1 Scale: spec.replicas, status.replicas, status.selector."""

    spec_replicas: int
    status_replicas: int = 0
    selector: str = ""
    name: str = ""
    namespace: str = ""


@dataclass(frozen=True)
class ScaleError:
    """Reading the scale subresource failed (upstream: FailedGetScale); text as the API said."""

    message: str


def parse_scale(raw: Any, path: str = "scale") -> Scale | ScaleError:
    obj = _object(raw, path)
    if "error" in obj:
        return ScaleError(message=_str(obj, "error", path, required=True))
    meta = _object(obj.get("metadata") or {}, f"{path}.metadata")
    spec = _object(obj.get("spec") or {}, f"{path}.spec")
    status = _object(obj.get("status") or {}, f"{path}.status")
    return Scale(
        spec_replicas=_int(spec, "replicas", f"{path}.spec") or 0,
        status_replicas=_int(status, "replicas", f"{path}.status") or 0,
        selector=_str(status, "selector", f"{path}.status"),
        name=_str(meta, "name", f"{path}.metadata"),
        namespace=_str(meta, "namespace", f"{path}.metadata"),
    )


# --------------------------------------------------------------------------------------------
# Pods


@dataclass(frozen=True)
class Container:
    name: str
    requests: Mapping[str, Quantity]
    restartable: bool = False  # an init container with restartPolicy Always (a sidecar)


@dataclass(frozen=True)
class PodReadyCondition:
    status: str
    last_transition_time: datetime


@dataclass(frozen=True)
class Pod:
    """A v1 Pod, reduced to what the HPA looks at (requests summed once, at parse time)."""

    name: str
    namespace: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    phase: str = ""
    deletion_timestamp: datetime | None = None
    start_time: datetime | None = None
    ready: PodReadyCondition | None = None
    containers: tuple[Container, ...] = ()
    init_containers: tuple[Container, ...] = ()
    pod_requests: Mapping[str, Quantity] | None = None  # spec.resources.requests
    overhead: Mapping[str, Quantity] | None = None
    # Derived: sum of MilliValue() over containers and sidecars per resource, and for a
    # resource some of those containers lack, the first container that lacks it.
    request_totals: Mapping[str, int] = field(init=False, compare=False, repr=False)
    request_missing: Mapping[str, str] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        counted = [*self.containers, *(c for c in self.init_containers if c.restartable)]
        totals: dict[str, int] = {}
        missing: dict[str, str] = {}
        names: set[str] = set()
        for container in counted:
            names.update(container.requests)
        for resource in names:
            total = 0
            for container in counted:
                quantity = container.requests.get(resource)
                if quantity is None:
                    missing[resource] = container.name
                    break
                total += quantity.milli
            else:
                totals[resource] = total
        object.__setattr__(self, "request_totals", totals)
        object.__setattr__(self, "request_missing", missing)

    @property
    def counted_containers(self) -> tuple[Container, ...]:
        """Regular containers, then restartable init containers: whose requests count."""
        return (*self.containers, *(c for c in self.init_containers if c.restartable))


def _parse_container(raw: Any, path: str, *, init: bool) -> Container:
    obj = _object(raw, path)
    resources = _object(obj.get("resources") or {}, f"{path}.resources")
    return Container(
        name=_str(obj, "name", path),
        requests=_resource_list(resources, "requests", f"{path}.resources"),
        restartable=init and obj.get("restartPolicy") == "Always",
    )


def parse_pod(raw: Any, path: str) -> Pod:
    obj = _object(raw, path)
    meta = _object(obj.get("metadata") or {}, f"{path}.metadata")
    spec = _object(obj.get("spec") or {}, f"{path}.spec")
    status = _object(obj.get("status") or {}, f"{path}.status")
    ready = None
    for i, item in enumerate(_list(status, "conditions", f"{path}.status") or []):
        where = f"{path}.status.conditions[{i}]"
        cond = _object(item, where)
        if cond.get("type") == "Ready":  # podutil.GetPodCondition: the first one
            transition = _opt_time(cond, "lastTransitionTime", where)
            ready = PodReadyCondition(status=_str(cond, "status", where),
                                      last_transition_time=transition or GO_ZERO_TIME)
            break
    pod_resources = _opt_object(spec, "resources", f"{path}.spec")
    pod_requests = None
    if pod_resources is not None and pod_resources.get("requests") is not None:
        pod_requests = _resource_list(pod_resources, "requests", f"{path}.spec.resources")
    overhead = (_resource_list(spec, "overhead", f"{path}.spec")
                if spec.get("overhead") is not None else None)
    return Pod(
        name=_str(meta, "name", f"{path}.metadata", required=True),
        namespace=_str(meta, "namespace", f"{path}.metadata"),
        labels=_string_map(meta, "labels", f"{path}.metadata"),
        phase=_str(status, "phase", f"{path}.status"),
        deletion_timestamp=_opt_time(meta, "deletionTimestamp", f"{path}.metadata"),
        start_time=_opt_time(status, "startTime", f"{path}.status"),
        ready=ready,
        containers=tuple(_parse_container(c, f"{path}.spec.containers[{i}]", init=False)
                         for i, c in enumerate(_list(spec, "containers", f"{path}.spec") or [])),
        init_containers=tuple(
            _parse_container(c, f"{path}.spec.initContainers[{i}]", init=True)
            for i, c in enumerate(_list(spec, "initContainers", f"{path}.spec") or [])),
        pod_requests=pod_requests,
        overhead=overhead,
    )


def parse_pods(raw: Any, path: str = "pods") -> tuple[Pod, ...]:
    """A v1 PodList, or a plain list of Pods."""
    if isinstance(raw, Mapping):
        items = _list(raw, "items", path)
        base = f"{path}.items"
        if items is None:
            items = []
    elif isinstance(raw, list | tuple):
        items, base = list(raw), path
    else:
        raise ModelError(path, f"must be a PodList or a list of Pods, not {_kind(raw)}")
    return tuple(parse_pod(item, f"{base}[{i}]") for i, item in enumerate(items))


# --------------------------------------------------------------------------------------------
# Metric values, one input per spec.metrics entry


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


@dataclass(frozen=True)
class MetricValue:
    """custom.metrics.k8s.io MetricValue (v1beta2, or v1beta1's metricName)."""

    described_kind: str
    described_name: str
    metric_name: str
    timestamp: datetime
    value: Quantity
    window_seconds: int | None = None
    described_namespace: str = ""
    described_api_version: str = ""
    # Derived: the sample window, one minute when the adapter gives none (as upstream assumes).
    window: timedelta = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        window = (timedelta(minutes=1) if self.window_seconds is None
                  else timedelta(seconds=self.window_seconds))
        object.__setattr__(self, "window", window)


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
    for i, item in enumerate(_list(raw, "items", path) or []):
        where = f"{path}.items[{i}]"
        obj = _object(item, where)
        meta = _object(obj.get("metadata") or {}, f"{where}.metadata")
        window_raw = obj.get("window")
        window = timedelta(0)
        if window_raw is not None:
            if not isinstance(window_raw, str):
                raise ModelError(f"{where}.window", "must be a duration string such as \"30s\"")
            cached_window = windows.get(window_raw)
            if cached_window is None:
                try:
                    cached_window = windows[window_raw] = parse_duration(window_raw)
                except ValueError as err:
                    raise ModelError(f"{where}.window", str(err)) from None
            window = cached_window
        containers = []
        for j, c in enumerate(_list(obj, "containers", where) or []):
            cw = f"{where}.containers[{j}]"
            cobj = _object(c, cw)
            containers.append(ContainerUsage(name=_str(cobj, "name", cw),
                                             usage=_usage(cobj, cw, quantities)))
        stamp = obj.get("timestamp")
        timestamp = (_cached_time(times, stamp) if type(stamp) is str else None) \
            or _opt_time(obj, "timestamp", where)
        items.append(PodMetrics(
            name=_str(meta, "name", f"{where}.metadata", required=True),
            namespace=_str(meta, "namespace", f"{where}.metadata"),
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
    where = _join(path, "usage")
    mapping = _object(raw, where)
    usage: dict[str, Quantity] = {}
    for name, value in mapping.items():
        quantity = _cached_quantity(quantities, value) if type(value) is str else None
        usage[str(name)] = quantity or _quantity_value(value, f"{where}.{name}")
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
    """What `_str` returns for a well-formed field, or None to take the careful path."""
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
                               or not _INT64_MIN <= window <= _INT64_MAX):
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
    obj = _object(item, where)
    described = _object(obj.get("describedObject") or {}, f"{where}.describedObject")
    metric = obj.get("metric")
    if metric is not None:
        name = _str(_object(metric, f"{where}.metric"), "name", f"{where}.metric")
    else:
        name = _str(obj, "metricName", where)
    value_raw = obj.get("value")
    if value_raw is None:
        raise ModelError(f"{where}.value", "is required")
    return MetricValue(
        described_kind=_str(described, "kind", f"{where}.describedObject"),
        described_name=_str(described, "name", f"{where}.describedObject"),
        described_namespace=_str(described, "namespace", f"{where}.describedObject"),
        described_api_version=_str(described, "apiVersion", f"{where}.describedObject"),
        metric_name=name,
        timestamp=_opt_time(obj, "timestamp", where) or GO_ZERO_TIME,
        window_seconds=_int(obj, "windowSeconds", where, bits=64),
        value=_quantity_value(value_raw, f"{where}.value"),
    )


def _parse_custom_metrics(raw: Mapping[str, Any], path: str) -> MetricValueList:
    # Per answer, not global: the items of one answer repeat their timestamp (and often
    # values), which is the largest pure cost of a steady reconcile.
    times: dict[str, datetime] = {}
    quantities: dict[str, Quantity] = {}
    items = []
    for i, item in enumerate(_list(raw, "items", path) or []):
        value = _fast_metric_value(item, times, quantities)
        items.append(value if value is not None else _metric_value(item, f"{path}.items[{i}]"))
    return MetricValueList(items=tuple(items))


def _parse_external_metrics(raw: Mapping[str, Any], path: str) -> ExternalMetricValueList:
    items = []
    for i, item in enumerate(_list(raw, "items", path) or []):
        where = f"{path}.items[{i}]"
        obj = _object(item, where)
        value_raw = obj.get("value")
        if value_raw is None:
            raise ModelError(f"{where}.value", "is required")
        items.append(ExternalMetricValue(
            metric_name=_str(obj, "metricName", where),
            metric_labels=_string_map(obj, "metricLabels", where),
            timestamp=_opt_time(obj, "timestamp", where) or GO_ZERO_TIME,
            window_seconds=_int(obj, "window", where, bits=64),
            value=_quantity_value(value_raw, f"{where}.value"),
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
    obj = _object(raw, path)
    if "error" in obj:
        return MetricFetchError(message=_str(obj, "error", path, required=True))
    kind = _str(obj, "kind", path)
    if not kind:
        kind = {"Resource": "PodMetricsList", "ContainerResource": "PodMetricsList",
                "Pods": "MetricValueList", "Object": "MetricValueList",
                "External": "ExternalMetricValueList"}.get(metric_type, "")
    parser = _LIST_KINDS.get(kind)
    if parser is None:
        raise ModelError(_join(path, "kind"), "must be PodMetricsList, MetricValueList or "
                                              f"ExternalMetricValueList, not {kind or '(none)'}")
    return parser(obj, path)


# --------------------------------------------------------------------------------------------
# The controller's memory for one autoscaler


@dataclass(frozen=True)
class Recommendation:
    timestamp: datetime
    replicas: int


@dataclass(frozen=True)
class ScaleEvent:
    timestamp: datetime
    replica_change: int
    outdated: bool = False


@dataclass(frozen=True)
class History:
    """Recommendations and scale events; `recommendations is None` means a first sync."""

    recommendations: tuple[Recommendation, ...] | None = None
    scale_up_events: tuple[ScaleEvent, ...] = ()
    scale_down_events: tuple[ScaleEvent, ...] = ()


def _parse_events(raw: Mapping[str, Any], key: str, path: str) -> tuple[ScaleEvent, ...]:
    events = []
    for i, item in enumerate(_list(raw, key, path) or []):
        where = f"{path}.{key}[{i}]"
        obj = _object(item, where)
        timestamp = obj.get("timestamp")
        if timestamp is None:
            raise ModelError(f"{where}.timestamp", "is required")
        events.append(ScaleEvent(
            timestamp=parse_time(timestamp, f"{where}.timestamp"),
            replica_change=_int(obj, "replicaChange", where, required=True) or 0,
            outdated=_bool(obj, "outdated", where),
        ))
    return tuple(events)


def parse_history(raw: Any, path: str = "history") -> History:
    if raw is None:
        return History()
    obj = _object(raw, path)
    recommendations: tuple[Recommendation, ...] | None = None
    recs_raw = _list(obj, "recommendations", path)
    if recs_raw is not None:
        recs = []
        for i, item in enumerate(recs_raw):
            where = f"{path}.recommendations[{i}]"
            rec = _object(item, where)
            timestamp = rec.get("timestamp")
            if timestamp is None:
                raise ModelError(f"{where}.timestamp", "is required")
            recs.append(Recommendation(
                timestamp=parse_time(timestamp, f"{where}.timestamp"),
                replicas=_int(rec, "replicas", where, required=True) or 0))
        recommendations = tuple(recs)
    return History(
        recommendations=recommendations,
        scale_up_events=_parse_events(obj, "scaleUpEvents", path),
        scale_down_events=_parse_events(obj, "scaleDownEvents", path),
    )


def render_history(history: History) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if history.recommendations is not None:
        out["recommendations"] = [
            {"timestamp": format_time_precise(r.timestamp), "replicas": r.replicas}
            for r in history.recommendations]
    out["scaleUpEvents"] = [_render_event(e) for e in history.scale_up_events]
    out["scaleDownEvents"] = [_render_event(e) for e in history.scale_down_events]
    return out


def _render_event(event: ScaleEvent) -> dict[str, Any]:
    return {"timestamp": format_time_precise(event.timestamp),
            "replicaChange": event.replica_change, "outdated": event.outdated}


def pods_matching(pods: Iterable[Pod], selector: Selector, namespace: str) -> list[Pod]:
    """The pods a lister would return for this namespace and selector."""
    exact = selector.exact_labels()
    listed = []
    for pod in pods:
        if namespace and pod.namespace and pod.namespace != namespace:
            continue
        labels = pod.labels
        if exact is not None:
            for key, value in exact:
                if labels.get(key) != value:
                    break
            else:
                listed.append(pod)
        elif selector.matches(labels):
            listed.append(pod)
    return listed
