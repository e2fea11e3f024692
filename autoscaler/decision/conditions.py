"""Status conditions: upstream's types, reasons and messages, and its list-update rules."""

from __future__ import annotations

from datetime import datetime

from autoscaler.model.status import Condition

__all__ = [
    "ABLE_TO_SCALE",
    "ACTIVE",
    "FALLBACK",
    "PAUSED",
    "SCALED_TO_ZERO",
    "SCALING_ACTIVE",
    "SCALING_LIMITED",
    "Messages",
    "condition_status",
    "remove_condition",
    "set_condition",
]

ABLE_TO_SCALE = "AbleToScale"
SCALING_ACTIVE = "ScalingActive"
SCALING_LIMITED = "ScalingLimited"
SCALED_TO_ZERO = "ScaledToZero"
PAUSED = "Paused"  # ours: set only while a pause annotation is present
FALLBACK = "Fallback"  # ours: set only while a metric proposes its fallback
ACTIVE = "Active"  # ours (KEDA's): set only for an autoscaler with spec.idle

TRUE = "True"
FALSE = "False"


class Messages:
    """Condition messages exactly as horizontal.go writes them (format with `.format(...)`)."""

    FAILED_GET_SCALE = "the HPA controller was unable to get the target's current scale: {}"
    SUCCEEDED_GET_SCALE = "the HPA controller was able to get the target's current scale"
    SCALING_DISABLED = "scaling is disabled since the replica count of the target is zero"
    MISSING_SELECTOR = "the HPA target's scale is missing a selector"
    UNABLE_TO_COMPUTE = "the HPA was unable to compute the replica count: {}"
    VALID_METRIC_FOUND = "the HPA was able to successfully calculate a replica count from {}"
    READY_FOR_NEW_SCALE = "recommended size matches current size"
    SCALE_DOWN_STABILIZED = ("recent recommendations were higher than current one, applying the "
                             "highest recent recommendation")
    SCALE_UP_STABILIZED = ("recent recommendations were lower than current one, applying the "
                           "lowest recent recommendation")
    DESIRED_WITHIN_RANGE = "the desired count is within the acceptable range"
    TOO_MANY_REPLICAS = "the desired replica count is more than the maximum replica count"
    TOO_FEW_REPLICAS = "the desired replica count is less than the minimum replica count"
    SCALE_UP_LIMIT = "the desired replica count is increasing faster than the maximum scale rate"
    SCALE_DOWN_LIMIT = "the desired replica count is decreasing faster than the maximum scale rate"
    SUCCEEDED_RESCALE = "the HPA controller was able to update the target scale to {}"
    FAILED_UPDATE_SCALE = "the HPA controller was unable to update the target scale: {}"
    SCALED_TO_ZERO = "the HPA controller scaled the workload to zero"
    NOT_SCALED_TO_ZERO = "the HPA controller did not scale the workload to zero"


def set_condition(conditions: tuple[Condition, ...], *, type: str, status: str, reason: str,
                  message: str, now: datetime) -> tuple[Condition, ...]:
    """setConditionInList: update in place, or append; the transition time moves on a new status."""
    for index, existing in enumerate(conditions):
        if existing.type == type:
            if (existing.status, existing.reason, existing.message) == (status, reason, message):
                return conditions  # the steady state: nothing to replace
            transition = now if existing.status != status else existing.last_transition_time
            updated = Condition(type=type, status=status, reason=reason, message=message,
                                last_transition_time=transition)
            return (*conditions[:index], updated, *conditions[index + 1:])
    return (*conditions, Condition(type=type, status=status, reason=reason, message=message,
                                   last_transition_time=now))


def remove_condition(conditions: tuple[Condition, ...], type: str) -> tuple[Condition, ...]:
    return tuple(c for c in conditions if c.type != type)


def condition_status(conditions: tuple[Condition, ...], type: str) -> str | None:
    """The status of the first condition of that type, or None."""
    for condition in conditions:
        if condition.type == type:
            return condition.status
    return None
