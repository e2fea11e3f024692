"""Conflicting writers: a target's replicas that changed between two syncs and were not ours.

Part of the decision: `decide` compares the replicas it reads with those the last sync left
the target at (`history.scaleWatch`, persisted with the rest of the history, so a new leader
and `metricscale explain` see what the controller saw) and reports what changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from autoscaler.decision.conditions import TRUE, condition_status, remove_condition, set_condition
from autoscaler.decision.events import Event
from autoscaler.decision.outcome import Draft
from autoscaler.model.history import ScaleWatch
from autoscaler.model.status import Condition

__all__ = [
    "CONFLICT_CONDITION",
    "CONFLICT_WINDOW",
    "EXTERNAL_CHANGE_REASON",
    "ConflictObservation",
    "conflict_conditions",
    "observe_replicas",
    "report_scale_changes",
]

CONFLICT_CONDITION = "ScalingConflict"
CONFLICT_REASON = "ExternalScaleChanges"
EXTERNAL_CHANGE_REASON = "ExternalScaleChange"
RESOLVED_REASON = "ScalingConflictResolved"
CONFLICT_WINDOW = timedelta(minutes=10)
CONFLICT_MESSAGE = (
    "another writer keeps changing the target's replicas (at least twice within {minutes} "
    "minutes), fighting this autoscaler; remove spec.replicas from the workload's manifest "
    "(see docs/reference/autoscaler.md, \"Conflicting writers\")")


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


def report_scale_changes(draft: Draft, *, observed: int, now: datetime) -> None:
    """Conflict detection: another writer changed the replicas this autoscaler left the target
    at (an event each time; the ScalingConflict condition after a second change within the
    window, until a window passes without one). It changes no replica count."""
    watch = draft.history.scale_watch
    seen = observe_replicas(watch, observed=observed, now=now)
    if seen.watch is watch and not seen.events and not seen.watch.conflicting \
            and not any(c.type == CONFLICT_CONDITION for c in draft.conditions):
        return  # the steady state: the size we left, no conflict to keep or lift
    if seen.watch is not watch:
        draft.history = draft.history._replace(scale_watch=seen.watch)
    draft.events.extend(seen.events)
    if seen.changed_from is not None:
        draft.explanation.append(
            f"Since the last sync the target's replicas changed from {seen.changed_from} to "
            f"{observed}, and this autoscaler did not write them: another writer did (a "
            "`kubectl apply` or `scale`, a GitOps tool, a second autoscaler).")
    was = condition_status(draft.conditions, CONFLICT_CONDITION) == TRUE
    draft.conditions = conflict_conditions(draft.conditions, conflicting=seen.watch.conflicting,
                                           now=now)
    minutes = int(CONFLICT_WINDOW.total_seconds() // 60)
    if seen.watch.conflicting:
        draft.explanation.append(
            f"ScalingConflict: another writer changed the replicas at least twice within "
            f"{minutes} minutes; the condition stays until {minutes} minutes pass without a "
            "change.")
    elif was:
        draft.explanation.append(f"No external change for {minutes} minutes: the "
                                 "ScalingConflict condition is lifted.")
