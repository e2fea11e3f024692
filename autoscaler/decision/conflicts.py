"""Conflicting writers: a target's replicas that changed between two syncs and were not ours."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from autoscaler.decision.conditions import remove_condition, set_condition
from autoscaler.decision.decide import Event
from autoscaler.model.status import Condition

__all__ = [
    "CONFLICT_CONDITION",
    "CONFLICT_WINDOW",
    "ConflictMemory",
    "ConflictObservation",
    "apply_conflict_condition",
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
class ConflictMemory:
    """What one autoscaler remembers between syncs; a new leader starts from the default."""

    expected_replicas: int | None = None  # what we left the target at (wrote or kept)
    changes: tuple[datetime, ...] = ()  # external changes seen within the window, oldest first
    conflicting: bool = False


@dataclass(frozen=True)
class ConflictObservation:
    memory: ConflictMemory
    events: tuple[Event, ...]


def observe_replicas(memory: ConflictMemory, *, observed: int, now: datetime,
                     window: timedelta = CONFLICT_WINDOW) -> ConflictObservation:
    """Compare the replicas read now with those we left; raise or clear the conflict."""
    events: list[Event] = []
    changes = tuple(t for t in memory.changes if now - t < window)
    expected = memory.expected_replicas
    if expected is not None and observed != expected:
        events.append(Event(
            "Warning", EXTERNAL_CHANGE_REASON,
            f"the target's replicas changed from {expected} to {observed} since the last sync; "
            "metricscale did not write them"))
        changes = (*changes, now)
    conflicting = memory.conflicting
    if len(changes) >= 2:
        conflicting = True
    elif conflicting and not changes:
        conflicting = False
        minutes = int(window.total_seconds() // 60)
        events.append(Event(
            "Normal", RESOLVED_REASON,
            f"no external change of the target's replicas for {minutes} minutes"))
    return ConflictObservation(
        memory=replace(memory, changes=changes, conflicting=conflicting), events=tuple(events))


def apply_conflict_condition(conditions: tuple[Condition, ...], *,
                             previous: tuple[Condition, ...], conflicting: bool, now: datetime,
                             window: timedelta = CONFLICT_WINDOW) -> tuple[Condition, ...]:
    """The conditions with ScalingConflict set (kept from `previous`) or absent."""
    base = remove_condition(conditions, CONFLICT_CONDITION)
    if not conflicting:
        return base
    kept = tuple(c for c in previous if c.type == CONFLICT_CONDITION)[:1]
    minutes = int(window.total_seconds() // 60)
    return set_condition((*base, *kept), type=CONFLICT_CONDITION, status="True",
                         reason=CONFLICT_REASON,
                         message=CONFLICT_MESSAGE.format(minutes=minutes), now=now)
