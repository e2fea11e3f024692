"""Stabilization and rate limits: upstream's normalization of the desired replica count.

Two paths, as in horizontal.go: without `spec.behavior` the legacy downscale stabilization and
the scale-up limit max(factor x current, minimum); with it, both stabilization windows, the
Pods/Percent policies over their periods and the scale events they count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from autoscaler.decision.conditions import Messages
from autoscaler.decision.replicas import INT32_MAX, INT32_MIN, go_float_to_int32
from autoscaler.model.history import Recommendation, ScaleEvent
from autoscaler.model.spec import Behavior, ScalingRules

__all__ = [
    "Normalized",
    "Stabilized",
    "calculate_scale_down_limit",
    "calculate_scale_up_limit",
    "convert_desired_replicas_with_behavior_rate",
    "convert_desired_replicas_with_rules",
    "longest_policy_period",
    "mark_scale_events_outdated",
    "record_initial_recommendation",
    "replicas_change_per_period",
    "scale_up_limit",
    "stabilize_recommendation",
    "stabilize_recommendation_with_behaviors",
    "store_scale_event",
]


class Stabilized(NamedTuple):
    """A stabilized recommendation, the AbleToScale reason/message for it, and the new log."""

    replicas: int
    reason: str
    message: str
    recommendations: tuple[Recommendation, ...]


class Normalized(NamedTuple):
    """A rate-limited replica count and the ScalingLimited reason/message for it."""

    replicas: int
    reason: str
    message: str


def record_initial_recommendation(recommendations: tuple[Recommendation, ...] | None, *,
                                  current_replicas: int,
                                  now: datetime) -> tuple[Recommendation, ...]:
    """The first sync remembers the current size, so the first scale-down waits a window."""
    if recommendations is None:
        return (Recommendation(timestamp=now, replicas=current_replicas),)
    return recommendations


# --------------------------------------------------------------------------------------------
# Without behavior


def stabilize_recommendation(recommendations: tuple[Recommendation, ...], *, desired: int,
                             window: timedelta, now: datetime) -> Stabilized:
    """stabilizeRecommendation: the max over the window; the new value replaces the last old one."""
    highest = desired
    old_index = -1
    cutoff = now - window
    for index, rec in enumerate(recommendations):
        if rec.timestamp < cutoff:
            old_index = index
        elif rec.replicas > highest:
            highest = rec.replicas
    new = Recommendation(timestamp=now, replicas=desired)
    if old_index >= 0:
        updated = (*recommendations[:old_index], new, *recommendations[old_index + 1:])
    else:
        updated = (*recommendations, new)
    if highest != desired:
        return Stabilized(highest, "ScaleDownStabilized", Messages.SCALE_DOWN_STABILIZED, updated)
    return Stabilized(highest, "ReadyForNewScale", Messages.READY_FOR_NEW_SCALE, updated)


def scale_up_limit(current_replicas: int, *, factor: float, minimum: float) -> int:
    """calculateScaleUpLimit: int32(math.Max(factor*current, minimum))."""
    return go_float_to_int32(max(factor * float(current_replicas), minimum))


def convert_desired_replicas_with_rules(*, current_replicas: int, desired_replicas: int,
                                        min_replicas: int, max_replicas: int, factor: float,
                                        minimum: float) -> Normalized:
    """convertDesiredReplicasWithRules: [min, min(max, scale-up limit)]."""
    limit = scale_up_limit(current_replicas, factor=factor, minimum=minimum)
    if max_replicas > limit:
        maximum, reason, message = limit, "ScaleUpLimit", Messages.SCALE_UP_LIMIT
    else:
        maximum, reason, message = max_replicas, "TooManyReplicas", Messages.TOO_MANY_REPLICAS
    if desired_replicas < min_replicas:
        return Normalized(min_replicas, "TooFewReplicas", Messages.TOO_FEW_REPLICAS)
    if desired_replicas > maximum:
        return Normalized(maximum, reason, message)
    return Normalized(desired_replicas, "DesiredWithinRange", Messages.DESIRED_WITHIN_RANGE)


# --------------------------------------------------------------------------------------------
# With behavior


def stabilize_recommendation_with_behaviors(
        recommendations: tuple[Recommendation, ...], *, desired: int, current: int,
        up_window_seconds: int, down_window_seconds: int, now: datetime) -> Stabilized:
    """stabilizeRecommendationWithBehaviors: clamp current into [min over up, max over down]."""
    up_recommendation = desired
    down_recommendation = desired
    up_cutoff = now - timedelta(seconds=up_window_seconds)
    down_cutoff = now - timedelta(seconds=down_window_seconds)
    old_index = -1
    for index, rec in enumerate(recommendations):
        if rec.timestamp > up_cutoff:
            up_recommendation = min(rec.replicas, up_recommendation)
        if rec.timestamp > down_cutoff:
            down_recommendation = max(rec.replicas, down_recommendation)
        if rec.timestamp < up_cutoff and rec.timestamp < down_cutoff:
            old_index = index
    recommendation = current
    if recommendation < up_recommendation:
        recommendation = up_recommendation
    if recommendation > down_recommendation:
        recommendation = down_recommendation
    new = Recommendation(timestamp=now, replicas=desired)
    if old_index >= 0:
        updated = (*recommendations[:old_index], new, *recommendations[old_index + 1:])
    else:
        updated = (*recommendations, new)
    if recommendation == desired:
        return Stabilized(recommendation, "ReadyForNewScale", Messages.READY_FOR_NEW_SCALE,
                          updated)
    if desired >= current:
        return Stabilized(recommendation, "ScaleUpStabilized", Messages.SCALE_UP_STABILIZED,
                          updated)
    return Stabilized(recommendation, "ScaleDownStabilized", Messages.SCALE_DOWN_STABILIZED,
                      updated)


def replicas_change_per_period(period_seconds: int, events: Sequence[ScaleEvent], *,
                               now: datetime) -> int:
    """getReplicasChangePerPeriod: the change of the events strictly inside the period."""
    cutoff = now - timedelta(seconds=period_seconds)
    total = 0
    for event in events:
        if event.timestamp > cutoff:
            total += event.replica_change
    return total


def calculate_scale_up_limit(current_replicas: int, *, up_events: Sequence[ScaleEvent],
                             down_events: Sequence[ScaleEvent], rules: ScalingRules,
                             now: datetime) -> int:
    """calculateScaleUpLimitWithScalingRules: the most replicas the policies allow now."""
    if rules.select_policy == "Disabled":
        return current_replicas
    pick_min = rules.select_policy == "Min"
    result = INT32_MAX if pick_min else INT32_MIN
    for policy in rules.policies or ():
        added = replicas_change_per_period(policy.period_seconds, up_events, now=now)
        deleted = replicas_change_per_period(policy.period_seconds, down_events, now=now)
        period_start = current_replicas - added + deleted
        if policy.type == "Pods":
            proposed = period_start + policy.value
        elif policy.type == "Percent":
            # rounded up, or a small percentage could never add a replica
            proposed = go_float_to_int32(float(math.ceil(
                float(period_start) * (1 + float(policy.value) / 100))))
        else:
            proposed = 0  # upstream's zero value for an unknown policy type
        result = min(result, proposed) if pick_min else max(result, proposed)
    return result


def calculate_scale_down_limit(current_replicas: int, *, up_events: Sequence[ScaleEvent],
                               down_events: Sequence[ScaleEvent], rules: ScalingRules,
                               now: datetime) -> int:
    """calculateScaleDownLimitWithBehaviors: the fewest replicas the policies allow now."""
    if rules.select_policy == "Disabled":
        return current_replicas
    pick_min_change = rules.select_policy == "Min"
    result = INT32_MIN if pick_min_change else INT32_MAX
    for policy in rules.policies or ():
        added = replicas_change_per_period(policy.period_seconds, up_events, now=now)
        deleted = replicas_change_per_period(policy.period_seconds, down_events, now=now)
        period_start = current_replicas - added + deleted
        if policy.type == "Pods":
            proposed = period_start - policy.value
        elif policy.type == "Percent":
            # truncated toward zero, as Go's int32() conversion does
            proposed = go_float_to_int32(float(period_start) * (1 - float(policy.value) / 100))
        else:
            proposed = 0
        result = max(result, proposed) if pick_min_change else min(result, proposed)
    return result


def convert_desired_replicas_with_behavior_rate(
        *, current_replicas: int, desired_replicas: int, min_replicas: int, max_replicas: int,
        behavior: Behavior, up_events: Sequence[ScaleEvent], down_events: Sequence[ScaleEvent],
        now: datetime) -> Normalized:
    """convertDesiredReplicasWithBehaviorRate: the policies' limits, then min and max."""
    if desired_replicas > current_replicas:
        rules = behavior.scale_up or ScalingRules()
        limit = calculate_scale_up_limit(current_replicas, up_events=up_events,
                                         down_events=down_events, rules=rules, now=now)
        # no further scale-up until old scale-up events leave their periods
        limit = max(limit, current_replicas)
        if max_replicas > limit:
            maximum, reason, message = limit, "ScaleUpLimit", Messages.SCALE_UP_LIMIT
        else:
            maximum, reason, message = max_replicas, "TooManyReplicas", Messages.TOO_MANY_REPLICAS
        if desired_replicas > maximum:
            return Normalized(maximum, reason, message)
    elif desired_replicas < current_replicas:
        rules = behavior.scale_down or ScalingRules()
        limit = calculate_scale_down_limit(current_replicas, up_events=up_events,
                                           down_events=down_events, rules=rules, now=now)
        limit = min(limit, current_replicas)
        if min_replicas < limit:
            minimum, reason, message = limit, "ScaleDownLimit", Messages.SCALE_DOWN_LIMIT
        else:
            minimum, reason, message = min_replicas, "TooFewReplicas", Messages.TOO_FEW_REPLICAS
        if desired_replicas < minimum:
            return Normalized(minimum, reason, message)
    return Normalized(desired_replicas, "DesiredWithinRange", Messages.DESIRED_WITHIN_RANGE)


# --------------------------------------------------------------------------------------------
# Scale events


def longest_policy_period(rules: ScalingRules | None) -> int:
    longest = 0
    for policy in (rules.policies if rules is not None else None) or ():
        longest = max(longest, policy.period_seconds)
    return longest


def mark_scale_events_outdated(events: Sequence[ScaleEvent], *, longest_period: int,
                               now: datetime) -> tuple[ScaleEvent, ...]:
    """markScaleEventsOutdated: events older than every policy's period may be overwritten."""
    cutoff = now - timedelta(seconds=longest_period)
    return tuple(e._replace(outdated=True) if e.timestamp < cutoff else e for e in events)


def _store(events: Sequence[ScaleEvent], *, change: int, rules: ScalingRules | None,
           now: datetime) -> tuple[ScaleEvent, ...]:
    marked = mark_scale_events_outdated(events, longest_period=longest_policy_period(rules),
                                        now=now)
    new = ScaleEvent(timestamp=now, replica_change=change, outdated=False)
    for index in range(len(marked) - 1, -1, -1):
        if marked[index].outdated:
            return (*marked[:index], new, *marked[index + 1:])
    return (*marked, new)


def store_scale_event(behavior: Behavior | None, *, up_events: tuple[ScaleEvent, ...],
                      down_events: tuple[ScaleEvent, ...], previous_replicas: int,
                      new_replicas: int,
                      now: datetime) -> tuple[tuple[ScaleEvent, ...], tuple[ScaleEvent, ...]]:
    """storeScaleEvent: after a successful rescale, only when the autoscaler has a behavior."""
    if behavior is None:
        return up_events, down_events
    if new_replicas > previous_replicas:
        return _store(up_events, change=new_replicas - previous_replicas,
                      rules=behavior.scale_up, now=now), down_events
    return up_events, _store(down_events, change=previous_replicas - new_replicas,
                             rules=behavior.scale_down, now=now)
