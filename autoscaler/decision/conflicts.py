"""Conflicting writers: a target's replicas that changed between two syncs and were not ours.

Part of the decision: `decide` compares the replicas it reads with those the last sync left
the target at (`history.scaleWatch`, persisted with the rest of the history, so a new leader
and `metricscale explain` see what the controller saw) and reports what changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from autoscaler.decision.conditions import remove_condition, set_condition
from autoscaler.decision.events import Event
from autoscaler.model.history import ScaleWatch
from autoscaler.model.status import Condition

__all__ = [
    "CONFLICT_CONDITION",
    "CONFLICT_WINDOW",
    "EXTERNAL_CHANGE_REASON",
    "ConflictObservation",
    "conflict_conditions",
    "observe_replicas",
]

CONFLICT_CONDITION = "ScalingConflict"
CONFLICT_REASON = "ExternalScaleChanges"
EXTERNAL_CHANGE_REASON = "ExternalScaleChange"
RESOLVED_REASON = "ScalingConflictResolved"
CONFLICT_WINDOW = timedelta(minutes=10)
CONFLICT_MESSAGE = (
    "another writer keeps changing the target's replicas (at least twice within {minutes} "
    "minutes), fighting this autoscaler; remove spec.replicas from the workload's manifest "
    "(see the README, \"Conflicting writers\")")


@dataclass(frozen=True)
class ConflictObservation:
    watch: ScaleWatch  # the observed replicas, as kept unless this sync writes others
    events: tuple[Event, ...]
    changed_from: int | None = None  # the replicas we had left, when someone changed them


def observe_replicas(watch: ScaleWatch | None, *, observed: int, now: datetime,
                     window: timedelta = CONFLICT_WINDOW) -> ConflictObservation:
    """Compare the replicas read now with those the last sync left; raise or clear the
    conflict (two external changes within `window`; cleared after a window without one)."""
    if watch is None:  # the first sync that reads the scale: nothing to compare with
        return ConflictObservation(ScaleWatch(replicas=observed), ())
    if observed == watch.replicas and not watch.external_changes and not watch.conflicting:
        return ConflictObservation(watch, ())  # the steady state: nothing to note
    events: list[Event] = []
    changes = tuple(t for t in watch.external_changes if now - t < window)
    changed_from = None
    if observed != watch.replicas:
        changed_from = watch.replicas
        events.append(Event(
            "Warning", EXTERNAL_CHANGE_REASON,
            f"the target's replicas changed from {watch.replicas} to {observed} since the last "
            "sync; metricscale did not write them"))
        changes = (*changes, now)
    conflicting = watch.conflicting
    if len(changes) >= 2:
        conflicting = True
    elif conflicting and not changes:
        conflicting = False
        minutes = int(window.total_seconds() // 60)
        events.append(Event(
            "Normal", RESOLVED_REASON,
            f"no external change of the target's replicas for {minutes} minutes"))
    return ConflictObservation(
        ScaleWatch(replicas=observed, external_changes=changes, conflicting=conflicting),
        tuple(events), changed_from)


def conflict_conditions(conditions: tuple[Condition, ...], *, conflicting: bool,
                        now: datetime, window: timedelta = CONFLICT_WINDOW
                        ) -> tuple[Condition, ...]:
    """The conditions with ScalingConflict set (its transition time kept) or absent."""
    if not conflicting:
        if any(c.type == CONFLICT_CONDITION for c in conditions):
            return remove_condition(conditions, CONFLICT_CONDITION)
        return conditions
    minutes = int(window.total_seconds() // 60)
    return set_condition(conditions, type=CONFLICT_CONDITION, status="True",
                         reason=CONFLICT_REASON,
                         message=CONFLICT_MESSAGE.format(minutes=minutes), now=now)
