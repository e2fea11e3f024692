"""The autoscaling/v2 spec, shared by HorizontalPodAutoscaler and Autoscaler: its types, its parse
with the API server's defaults applied, and its rendering."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from autoscaler.model.fields import (
    ModelError,
    Quantity,
    kind_name,
    parse_label_selector,
    read_int,
    read_list,
    read_object,
    read_optional_object,
    read_optional_quantity,
    read_str,
)
from metricscale.core.selectors import (
    LabelSelector,
    render_label_selector,
)

__all__ = [
    "FALLBACK_BEHAVIORS",
    "LABEL_SELECTOR",
    "METRIC_SOURCE_KEYS",
    "OWNER_REFERENCES",
    "POD_SELECTION_STRATEGIES",
    "AutoscalerSpec",
    "Behavior",
    "ContainerResourceMetricSource",
    "CrossVersionObjectReference",
    "ExternalMetricSource",
    "Idle",
    "MetricFallback",
    "MetricIdentifier",
    "MetricSpec",
    "MetricTarget",
    "ObjectMetricSource",
    "PodsMetricSource",
    "ResourceMetricSource",
    "ScalingPolicy",
    "ScalingRules",
    "parse_identifier",
    "parse_pod_selection_strategy",
    "parse_reference",
    "parse_spec",
    "render_identifier",
    "render_reference",
    "render_spec",
]


# KEP-5325's spec.podSelectionStrategy: which of the selector's pods a decision counts.
LABEL_SELECTOR = "LabelSelector"
OWNER_REFERENCES = "OwnerReferences"
POD_SELECTION_STRATEGIES = (LABEL_SELECTOR, OWNER_REFERENCES)


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


FALLBACK_BEHAVIORS = ("static", "currentReplicas", "currentReplicasIfHigher",
                      "currentReplicasIfLower")


@dataclass(frozen=True)
class MetricFallback:
    """`<source>.fallback` (ours, on every metric type): KEP-5679's fields, KEDA's behaviors."""

    replicas: int
    failure_threshold: int = 3
    failure_duration_seconds: int | None = None
    behavior: str = "static"


@dataclass(frozen=True)
class MetricSpec:
    """One entry of spec.metrics; `type` may be anything (unknown types are decided upon)."""

    type: str
    resource: ResourceMetricSource | None = None
    container_resource: ContainerResourceMetricSource | None = None
    pods: PodsMetricSource | None = None
    object: ObjectMetricSource | None = None
    external: ExternalMetricSource | None = None
    fallback: MetricFallback | None = None
    # Ours (KEDA's activationThreshold): the metric counts as active above this value.
    activation_threshold: Quantity | None = None


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
    sync_period_seconds: int | None = None  # KEP-6003 (ours until upstream has it)


@dataclass(frozen=True)
class Idle:
    """`spec.idle` (ours; KEDA's idleReplicaCount and cooldownPeriod): where the target rests
    while no metric is active, and how long every metric must have been inactive first."""

    replicas: int = 0
    cooldown_seconds: int = 300


@dataclass(frozen=True)
class AutoscalerSpec:
    scale_target_ref: CrossVersionObjectReference
    max_replicas: int
    min_replicas: int | None = None
    metrics: tuple[MetricSpec, ...] = ()
    behavior: Behavior | None = None
    idle: Idle | None = None
    pod_selection_strategy: str = LABEL_SELECTOR  # KEP-5325 (ours until upstream has it)

    @functools.cached_property
    def has_object_or_external(self) -> bool:
        """Whether a metric is Object or External (scale to zero needs one); asked by every
        decision, so computed once per (immutable) spec."""
        return any(m.type in ("Object", "External") for m in self.metrics)


def parse_pod_selection_strategy(spec: Mapping[str, Any], path: str = "spec") -> str:
    """`spec.podSelectionStrategy`, defaulted to LabelSelector (upstream's behaviour)."""
    strategy = read_str(spec, "podSelectionStrategy", path) or LABEL_SELECTOR
    if strategy not in POD_SELECTION_STRATEGIES:
        raise ModelError(f"{path}.podSelectionStrategy",
                         f"must be one of {', '.join(POD_SELECTION_STRATEGIES)}")
    return strategy


def parse_reference(raw: Any, path: str) -> CrossVersionObjectReference:
    obj = read_object(raw, path)
    return CrossVersionObjectReference(
        kind=read_str(obj, "kind", path, required=True),
        name=read_str(obj, "name", path, required=True),
        api_version=read_str(obj, "apiVersion", path),
    )


def parse_identifier(raw: Any, path: str) -> MetricIdentifier:
    obj = read_object(raw, path)
    selector_raw = obj.get("selector")
    selector = None if selector_raw is None else parse_label_selector(selector_raw,
                                                                       f"{path}.selector")
    return MetricIdentifier(name=read_str(obj, "name", path, required=True), selector=selector)


def _parse_target(raw: Any, path: str) -> MetricTarget:
    obj = read_object(raw, path)
    return MetricTarget(
        type=read_str(obj, "type", path),
        value=read_optional_quantity(obj, "value", path),
        average_value=read_optional_quantity(obj, "averageValue", path),
        average_utilization=read_int(obj, "averageUtilization", path),
    )


METRIC_SOURCE_KEYS = {
    "Resource": "resource",
    "ContainerResource": "containerResource",
    "Pods": "pods",
    "Object": "object",
    "External": "external",
}


def _parse_fallback(raw: Any, path: str) -> MetricFallback | None:
    if raw is None:
        return None
    obj = read_object(raw, path)
    replicas = read_int(obj, "replicas", path, required=True)
    assert replicas is not None
    if replicas < 0:
        raise ModelError(f"{path}.replicas", "must be 0 or more")
    threshold = read_int(obj, "failureThreshold", path)
    if threshold is not None and threshold < 1:
        raise ModelError(f"{path}.failureThreshold", "must be 1 or more")
    duration = read_int(obj, "failureDurationSeconds", path)
    if duration is not None and duration < 1:
        raise ModelError(f"{path}.failureDurationSeconds", "must be 1 or more")
    behavior = read_str(obj, "behavior", path) or "static"
    if behavior not in FALLBACK_BEHAVIORS:
        raise ModelError(f"{path}.behavior", f"must be one of {', '.join(FALLBACK_BEHAVIORS)}")
    return MetricFallback(replicas=replicas, failure_threshold=threshold or 3,
                          failure_duration_seconds=duration, behavior=behavior)


def _parse_metric_spec(raw: Any, path: str) -> MetricSpec:
    obj = read_object(raw, path)
    kind = read_str(obj, "type", path)
    key = METRIC_SOURCE_KEYS.get(kind)
    if key is None:
        return MetricSpec(type=kind)  # decided upon as upstream does: InvalidMetricSourceType
    where = f"{path}.{key}"
    source = obj.get(key)
    if source is None:
        raise ModelError(where, f"is required for a metric of type {kind}")
    src = read_object(source, where)
    spec = _parse_metric_source(kind, src, where)
    fallback = _parse_fallback(src.get("fallback"), f"{where}.fallback")
    if fallback is not None:
        spec = replace(spec, fallback=fallback)
    threshold = read_optional_quantity(src, "activationThreshold", where)
    if threshold is not None:
        spec = replace(spec, activation_threshold=threshold)
    return spec


def _parse_metric_source(kind: str, src: Mapping[str, Any], where: str) -> MetricSpec:
    target = _parse_target(src.get("target") if src.get("target") is not None else {},
                           f"{where}.target")
    if kind == "Resource":
        return MetricSpec(type=kind, resource=ResourceMetricSource(
            name=read_str(src, "name", where, required=True), target=target))
    if kind == "ContainerResource":
        return MetricSpec(type=kind, container_resource=ContainerResourceMetricSource(
            name=read_str(src, "name", where, required=True),
            container=read_str(src, "container", where, required=True), target=target))
    if kind == "Pods":
        if target.average_value is None:
            # upstream dereferences it unconditionally; the API server requires it
            raise ModelError(f"{where}.target.averageValue", "is required for a Pods metric")
        return MetricSpec(type=kind, pods=PodsMetricSource(
            metric=parse_identifier(src.get("metric"), f"{where}.metric"), target=target))
    if kind == "Object":
        return MetricSpec(type=kind, object=ObjectMetricSource(
            described_object=parse_reference(src.get("describedObject"),
                                              f"{where}.describedObject"),
            metric=parse_identifier(src.get("metric"), f"{where}.metric"), target=target))
    return MetricSpec(type=kind, external=ExternalMetricSource(
        metric=parse_identifier(src.get("metric"), f"{where}.metric"), target=target))


def _parse_rules(raw: Any, path: str) -> ScalingRules | None:
    if raw is None:
        return None
    obj = read_object(raw, path)
    policies_raw = read_list(obj, "policies", path)
    policies: tuple[ScalingPolicy, ...] | None = None
    if policies_raw is not None:
        parsed = []
        for i, item in enumerate(policies_raw):
            where = f"{path}.policies[{i}]"
            policy = read_object(item, where)
            parsed.append(ScalingPolicy(
                type=read_str(policy, "type", where, required=True),
                value=read_int(policy, "value", where, required=True) or 0,
                period_seconds=read_int(policy, "periodSeconds", where, required=True) or 0,
            ))
        policies = tuple(parsed)
    select = obj.get("selectPolicy")
    if select is not None and not isinstance(select, str):
        raise ModelError(f"{path}.selectPolicy", f"must be a string, not {kind_name(select)}")
    return ScalingRules(
        stabilization_window_seconds=read_int(obj, "stabilizationWindowSeconds", path),
        select_policy=select,
        policies=policies,
        tolerance=read_optional_quantity(obj, "tolerance", path),
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


def parse_spec(raw: Any, path: str) -> AutoscalerSpec:
    obj = read_object(raw, path)
    metrics = tuple(_parse_metric_spec(item, f"{path}.metrics[{i}]")
                    for i, item in enumerate(read_list(obj, "metrics", path) or []))
    if not metrics:
        # SetDefaults_HorizontalPodAutoscaler: cpu at 80% of requests
        metrics = (MetricSpec(type="Resource", resource=ResourceMetricSource(
            name="cpu", target=MetricTarget(type="Utilization", average_utilization=80))),)
    behavior_raw = read_optional_object(obj, "behavior", path)
    behavior = None
    if behavior_raw is not None:
        sync_period = read_int(behavior_raw, "syncPeriodSeconds", f"{path}.behavior")
        if sync_period is not None and not 1 <= sync_period <= 3600:
            raise ModelError(f"{path}.behavior.syncPeriodSeconds",
                             "must be between 1 and 3600")
        behavior = Behavior(
            scale_up=_default_rules(_parse_rules(behavior_raw.get("scaleUp"),
                                                 f"{path}.behavior.scaleUp"), _DEFAULT_SCALE_UP),
            scale_down=_default_rules(_parse_rules(behavior_raw.get("scaleDown"),
                                                   f"{path}.behavior.scaleDown"),
                                      _DEFAULT_SCALE_DOWN),
            sync_period_seconds=sync_period,
        )
    min_replicas = read_int(obj, "minReplicas", path)
    idle = None
    idle_raw = read_optional_object(obj, "idle", path)
    if idle_raw is not None:
        where = f"{path}.idle"
        replicas = read_int(idle_raw, "replicas", where) or 0
        cooldown = read_int(idle_raw, "cooldownSeconds", where)
        if replicas < 0:
            raise ModelError(f"{where}.replicas", "must be 0 or more")
        if cooldown is not None and cooldown < 0:
            raise ModelError(f"{where}.cooldownSeconds", "must be 0 or more")
        idle = Idle(replicas=replicas, cooldown_seconds=300 if cooldown is None else cooldown)
    return AutoscalerSpec(
        scale_target_ref=parse_reference(obj.get("scaleTargetRef"), f"{path}.scaleTargetRef"),
        min_replicas=1 if min_replicas is None else min_replicas,
        max_replicas=read_int(obj, "maxReplicas", path, required=True) or 0,
        metrics=metrics,
        behavior=behavior,
        idle=idle,
        pod_selection_strategy=parse_pod_selection_strategy(obj, path),
    )


def render_reference(ref: CrossVersionObjectReference) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": ref.kind, "name": ref.name}
    if ref.api_version:
        out["apiVersion"] = ref.api_version
    return out


def render_identifier(metric: MetricIdentifier) -> dict[str, Any]:
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
        out["object"] = {"describedObject": render_reference(metric.object.described_object),
                         "metric": render_identifier(metric.object.metric),
                         "target": _render_target(metric.object.target)}
    if metric.pods is not None:
        out["pods"] = {"metric": render_identifier(metric.pods.metric),
                       "target": _render_target(metric.pods.target)}
    if metric.resource is not None:
        out["resource"] = {"name": metric.resource.name,
                           "target": _render_target(metric.resource.target)}
    if metric.container_resource is not None:
        out["containerResource"] = {"name": metric.container_resource.name,
                                    "target": _render_target(metric.container_resource.target),
                                    "container": metric.container_resource.container}
    if metric.external is not None:
        out["external"] = {"metric": render_identifier(metric.external.metric),
                           "target": _render_target(metric.external.target)}
    if metric.fallback is not None:
        key = METRIC_SOURCE_KEYS.get(metric.type)
        if key is not None and key in out:
            fallback: dict[str, Any] = {"replicas": metric.fallback.replicas,
                                        "failureThreshold": metric.fallback.failure_threshold,
                                        "behavior": metric.fallback.behavior}
            if metric.fallback.failure_duration_seconds is not None:
                fallback["failureDurationSeconds"] = metric.fallback.failure_duration_seconds
            out[key]["fallback"] = fallback
    if metric.activation_threshold is not None:
        key = METRIC_SOURCE_KEYS.get(metric.type)
        if key is not None and key in out:
            out[key]["activationThreshold"] = metric.activation_threshold.text
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
    out: dict[str, Any] = {"scaleTargetRef": render_reference(spec.scale_target_ref)}
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
        if spec.behavior.sync_period_seconds is not None:
            behavior["syncPeriodSeconds"] = spec.behavior.sync_period_seconds
        out["behavior"] = behavior
    if spec.idle is not None:
        out["idle"] = {"replicas": spec.idle.replicas,
                       "cooldownSeconds": spec.idle.cooldown_seconds}
    if spec.pod_selection_strategy != LABEL_SELECTOR:
        out["podSelectionStrategy"] = spec.pod_selection_strategy
    return out
