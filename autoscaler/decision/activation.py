"""Activation and cooldown (KEDA's, around upstream's decision): when a target leaves its idle
size and when it returns to it.

Part of the decision: with `spec.idle`, the idle size is left only when a metric is active
(above its activationThreshold, 0 by default) and returned to only after every metric has been
inactive for `idle.cooldownSeconds`; between 1 and N the decision is upstream's. The Active
condition says which metrics are active; the time they all went quiet is kept in
`history.inactiveSince`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from decimal import Decimal

from autoscaler.decision.conditions import ACTIVE, FALSE, TRUE, set_condition
from autoscaler.decision.outcome import Draft, Limit
from autoscaler.decision.phrases import phrase_replicas
from autoscaler.decision.replicas import (
    CalculationError,
    external_metric_values,
    object_metric_value,
)
from autoscaler.decision.settings import Settings
from autoscaler.model.metrics import MetricInput
from autoscaler.model.objects import Autoscaler
from autoscaler.model.spec import AutoscalerSpec, MetricSpec, MetricTarget
from autoscaler.model.status import MetricStatus

__all__ = ["apply_activation", "idle_level"]


def idle_level(spec: AutoscalerSpec, settings: Settings) -> int | None:
    """Where the target rests while no metric is active; None without `spec.idle`, and for an
    idle size of 0 without --scale-to-zero (the controller-wide switch, as upstream's gate)."""
    if spec.idle is None or (spec.idle.replicas == 0 and not settings.scale_to_zero):
        return None
    return spec.idle.replicas


def _activation_value(metric: MetricSpec, status: MetricStatus | None,
                      data: MetricInput | None) -> Decimal | None:
    """What KEDA compares with the activation threshold: an External metric's total and an
    Object metric's value as the metrics API returned them (they exist with no pod running);
    for the pods' metrics, their current average (or utilization) as the status reports it."""
    try:
        if metric.type == "External" and data is not None:
            values, _ = external_metric_values(data)
            return Decimal(sum(values)) / 1000
        if metric.type == "Object" and data is not None:
            value, _ = object_metric_value(data)
            return Decimal(value) / 1000
    except CalculationError:
        return None
    return _current_value(status, _target_of(metric)) if status is not None else None


def _current_value(status: MetricStatus, target: MetricTarget | None) -> Decimal | None:
    """The metric's current value in its target's terms (Value, AverageValue, Utilization)."""
    source = (status.resource or status.container_resource or status.pods or status.object
              or status.external)
    if source is None or target is None:
        return None
    current = source.current
    if target.type == "Utilization":
        utilization = current.average_utilization
        return Decimal(utilization) if utilization is not None else None
    quantity = current.value if target.type == "Value" else current.average_value
    return quantity.value if quantity is not None else None


def _active_metrics(spec: AutoscalerSpec, statuses: Sequence[MetricStatus],
                    metrics: Sequence[MetricInput]) -> list[str]:
    """`metric INDEX (VALUE > THRESHOLD)` for each metric above its activation threshold."""
    active = []
    for index, metric in enumerate(spec.metrics):
        value = _activation_value(metric, statuses[index] if index < len(statuses) else None,
                                  metrics[index] if index < len(metrics) else None)
        threshold = metric.activation_threshold.value \
            if metric.activation_threshold is not None else Decimal(0)
        if value is not None and value > threshold:
            active.append(f"metric {index} ({value} > {threshold})")
    return active


def _target_of(metric: MetricSpec) -> MetricTarget | None:
    for source in (metric.resource, metric.container_resource, metric.pods, metric.object,
                   metric.external):
        if source is not None:
            return source.target
    return None


def apply_activation(draft: Draft, *, statuses: Sequence[MetricStatus],
                     autoscaler: Autoscaler, metrics: Sequence[MetricInput], desired: int,
                     reason: str, settings: Settings, now: datetime) -> tuple[int, str]:
    """KEDA's activation and cooldown around upstream's decision: the idle size is left only
    when a metric is active (above its activationThreshold, 0 by default), and returned to only
    after every metric has been inactive for idle.cooldownSeconds; between 1 and N the
    decision is upstream's. `statuses` are the metrics' statuses this sync."""
    spec = autoscaler.spec
    assert spec.idle is not None
    level = idle_level(spec, settings)
    if level is None:
        draft.conditions = set_condition(
            draft.conditions, type=ACTIVE, status=FALSE, reason="IdleNeedsScaleToZero",
            message="idle.replicas 0 needs the controller's --scale-to-zero flag; activation "
                    "and cooldown are off", now=now)
        return desired, reason
    active = _active_metrics(spec, statuses, metrics)
    # Active, the target runs at least minReplicas, and at least one pod above its idle size.
    floor = max(1, min(max(draft.min_replicas, level + 1), draft.max_replicas))
    if active:
        draft.history = draft.history._replace(inactive_since=None)
        draft.conditions = set_condition(draft.conditions, type=ACTIVE, status=TRUE,
                                         reason="ScalerActive",
                                         message="active: " + ", ".join(active), now=now)
        if desired < floor:
            draft.limits.append(Limit("Activation", desired, floor, "a metric is active: the "
                                      f"target runs at least {phrase_replicas(floor)}"))
            desired = floor
        if draft.current <= level:
            reason = "activated: " + ", ".join(active)
            draft.explanation.append(f"Activation: {', '.join(active)}, so the target "
                                     f"leaves its idle size {level} for {desired}.")
        return desired, reason
    since = draft.history.inactive_since or now
    draft.history = draft.history._replace(inactive_since=since)
    cooldown = timedelta(seconds=spec.idle.cooldown_seconds)
    if draft.current <= level:
        draft.conditions = set_condition(
            draft.conditions, type=ACTIVE, status=FALSE, reason="ScalerNotActive",
            message=f"no metric is above its activation threshold: idle at {level}", now=now)
        if desired != draft.current:
            draft.limits.append(Limit("Idle", desired, draft.current, "no metric is active"))
        draft.explanation.append(f"No metric is active: the target stays at its idle size "
                                 f"{level}.")
        return draft.current, reason
    if now - since >= cooldown:
        draft.conditions = set_condition(
            draft.conditions, type=ACTIVE, status=FALSE, reason="ScalerNotActive",
            message=f"no metric has been active for {spec.idle.cooldown_seconds} s: idle at "
                    f"{level}", now=now)
        draft.limits.append(Limit("Cooldown", desired, level, f"no metric active since "
                                  f"{since.isoformat()}"))
        draft.explanation.append(f"No metric has been active for the "
                                 f"{spec.idle.cooldown_seconds} s cooldown: the target goes to "
                                 f"its idle size {level}.")
        return level, f"no metric active for {spec.idle.cooldown_seconds} s (cooldown)"
    remaining = int((cooldown - (now - since)).total_seconds())
    draft.conditions = set_condition(
        draft.conditions, type=ACTIVE, status=FALSE, reason="ScalerNotActive",
        message=f"no metric is above its activation threshold; idle in {remaining} s unless "
                "one becomes active", now=now)
    if desired < floor:
        draft.limits.append(Limit("Activation", desired, floor, "below the active floor until "
                                  "the cooldown ends"))
        desired = floor
    return desired, reason
