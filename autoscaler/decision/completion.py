"""The completion of a decision: the write of the target's scale, planned, then applied.

What follows the replica computation in upstream's reconcileAutoscaler (horizontal.go): when
the size changes, `plan_write` makes the decision that awaits the write of
`scale.spec.replicas`; the caller writes it (or, in a dry run, does not) and hands the outcome
to `complete`, which applies upstream's after-write rules (SucceededRescale or
FailedUpdateScale, the SuccessfulRescale/FailedRescale events, storeScaleEvent, lastScaleTime,
then setCurrentReplicasAndMetricsInStatus's status), or their dry-run form.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from autoscaler.decision import behavior as rules
from autoscaler.decision.conditions import (
    ABLE_TO_SCALE,
    FALSE,
    SCALED_TO_ZERO,
    TRUE,
    Messages,
    remove_condition,
    set_condition,
)
from autoscaler.decision.events import Event
from autoscaler.decision.outcome import Decision, Draft, PendingWrite, readable_text
from autoscaler.decision.settings import Settings
from autoscaler.model.objects import Autoscaler
from autoscaler.model.status import AutoscalerStatus, Condition

__all__ = [
    "DRY_RUN_CONDITION_REASON",
    "DRY_RUN_EVENT_REASON",
    "SCALE_WRITE_DRY_RUN",
    "SCALE_WRITE_SUCCEEDED",
    "ScaleWriteResult",
    "complete",
    "plan_write",
]


@dataclass(frozen=True)
class ScaleWriteResult:
    """The outcome of writing scale.spec.replicas: written (no `error`), failed (`error`), or
    not made because the autoscaler runs dry (`dry_run`)."""

    error: str | None = None
    dry_run: bool = False

    @property
    def succeeded(self) -> bool:
        return self.error is None and not self.dry_run


SCALE_WRITE_SUCCEEDED = ScaleWriteResult()
SCALE_WRITE_DRY_RUN = ScaleWriteResult(dry_run=True)
DRY_RUN_EVENT_REASON = "DryRunRescale"
DRY_RUN_CONDITION_REASON = "DryRun"


def plan_write(draft: Draft, *, autoscaler: Autoscaler, desired: int,
               reason: str) -> Decision:
    """A decision that awaits the write of `desired` (complete() applies its outcome)."""
    draft.explanation.append(f"Decision: scale {draft.reference} from {draft.current} to "
                             f"{desired} ({readable_text(reason, draft.details)}).")
    spec = autoscaler.spec
    pending = PendingWrite(
        old_status=draft.old, conditions=draft.conditions,
        metric_statuses=draft.metric_statuses, current_replicas=draft.current,
        new_replicas=desired, min_replicas=draft.min_replicas, reason=reason,
        history=draft.history,
        has_object_or_external=spec.has_object_or_external,
        reference=draft.reference, error=draft.error, behavior=spec.behavior)
    # The status as this reconcile sees it before the write; complete() finishes it.
    planned = draft.status(desired_replicas=desired)
    return Decision(
        desired_replicas=desired, rescale=True, new_replicas=desired, rescale_reason=reason,
        scale_updated=False, status=planned, previous_status=draft.old,
        events=tuple(draft.events), metrics=draft.details, limits=tuple(draft.limits),
        history=draft.history, explanation=tuple(draft.explanation), error=draft.error,
        pending=pending, ignored_pods=draft.ignored_pods)


def complete(decision: Decision, *, write_result: ScaleWriteResult, settings: Settings,
             now: datetime) -> Decision:
    """Apply the outcome of writing `decision.new_replicas` to the target's scale: written,
    failed, or not made in a dry run (SCALE_WRITE_DRY_RUN).

    Without a pending write (no rescale, or already completed) the decision is returned as is.
    `now` and `settings` must be the ones `decide` was called with.
    """
    if decision.pending is None:
        return decision
    if write_result.error is not None:
        return _write_failed(decision, decision.pending, error=write_result.error, now=now)
    return _written(decision, decision.pending, write_result, settings=settings, now=now)


def _write_failed(decision: Decision, pending: PendingWrite, *, error: str,
                  now: datetime) -> Decision:
    """FailedUpdateScale: the size and status.desiredReplicas stay as they were."""
    old = pending.old_status
    events = (*decision.events,
              Event("Warning", "FailedRescale",
                    f"New size: {pending.new_replicas}; reason: {pending.reason}; "
                    f"error: {error}"))
    conditions = set_condition(pending.conditions, type=ABLE_TO_SCALE, status=FALSE,
                               reason="FailedUpdateScale",
                               message=Messages.FAILED_UPDATE_SCALE.format(error), now=now)
    status = AutoscalerStatus(current_replicas=pending.current_replicas,
                              desired_replicas=old.desired_replicas,
                              last_scale_time=old.last_scale_time,
                              current_metrics=pending.metric_statuses, conditions=conditions)
    explanation = (*decision.explanation,
                   f"Writing the new size failed ({error}): the size stays "
                   f"{pending.current_replicas} and status.desiredReplicas keeps its old value.")
    return replace(
        decision, desired_replicas=pending.current_replicas, scale_updated=False,
        status=status, events=events, history=pending.history, explanation=explanation,
        error=f"failed to rescale {pending.reference}: {error}", pending=None)


def _written(decision: Decision, pending: PendingWrite, result: ScaleWriteResult, *,
             settings: Settings, now: datetime) -> Decision:
    """SucceededRescale (the scale event remembered, lastScaleTime now), or its dry-run form."""
    conditions = pending.conditions
    events = list(decision.events)
    explanation = list(decision.explanation)
    history = pending.history
    old = pending.old_status
    new_size = f"New size: {pending.new_replicas}; reason: {pending.reason}"
    if result.dry_run:
        # What the write would have done, without its consequences: no scale event is
        # remembered and lastScaleTime stays; the condition and the event say so.
        conditions = set_condition(
            conditions, type=ABLE_TO_SCALE, status=TRUE, reason=DRY_RUN_CONDITION_REASON,
            message=f"dry run: the HPA controller would have updated the target scale to "
                    f"{pending.new_replicas}", now=now)
        events.append(Event("Normal", DRY_RUN_EVENT_REASON,
                            f"{new_size}; dry run: the target was not scaled"))
        explanation.append("Dry run: the target's scale was not written.")
        last_scale_time = old.last_scale_time
    else:
        conditions = set_condition(
            conditions, type=ABLE_TO_SCALE, status=TRUE, reason="SucceededRescale",
            message=Messages.SUCCEEDED_RESCALE.format(pending.new_replicas), now=now)
        events.append(Event("Normal", "SuccessfulRescale", new_size))
        up, down = rules.store_scale_event(
            pending.behavior,
            up_events=history.scale_up_events, down_events=history.scale_down_events,
            previous_replicas=pending.current_replicas, new_replicas=pending.new_replicas,
            now=now)
        watch = history.scale_watch
        history = history._replace(
            scale_up_events=up, scale_down_events=down,
            scale_watch=None if watch is None else watch._replace(replicas=pending.new_replicas))
        last_scale_time = now
    conditions = _scaled_to_zero(conditions, pending, settings=settings, now=now)
    status = AutoscalerStatus(current_replicas=pending.current_replicas,
                              desired_replicas=pending.new_replicas,
                              last_scale_time=last_scale_time,
                              current_metrics=pending.metric_statuses, conditions=conditions)
    return replace(
        decision, desired_replicas=pending.new_replicas, scale_updated=result.succeeded,
        status=status, events=tuple(events),
        history=history, explanation=tuple(explanation), pending=None)


def _scaled_to_zero(conditions: tuple[Condition, ...], pending: PendingWrite, *,
                    settings: Settings, now: datetime) -> tuple[Condition, ...]:
    """The ScaledToZero condition with --scale-to-zero (upstream's HPAScaleToZero gate)."""
    if not settings.scale_to_zero:
        return remove_condition(conditions, SCALED_TO_ZERO)
    if pending.current_replicas > 0 and pending.new_replicas == 0 \
            and pending.min_replicas == 0 and pending.has_object_or_external:
        return set_condition(conditions, type=SCALED_TO_ZERO, status=TRUE,
                             reason="ScaledToZero", message=Messages.SCALED_TO_ZERO, now=now)
    return set_condition(conditions, type=SCALED_TO_ZERO, status=FALSE,
                         reason="NotScaledToZero", message=Messages.NOT_SCALED_TO_ZERO,
                         now=now)
