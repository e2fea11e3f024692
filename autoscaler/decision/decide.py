"""One reconcile of an autoscaler, as upstream's reconcileAutoscaler (horizontal.go) makes it, as
a pure function: its phases, in upstream's order.

`decide(...)` computes everything up to the write of the target's scale: it reads the scale and
the bounds, asks the metrics for their proposal (proposals.py), stabilizes and limits it, then
plans the write (completion.py) or keeps the size. When it says `rescale`, the decision awaits
that write: the caller writes `new_replicas` (or, in a dry run, does not) and hands the outcome
to `complete(...)`, which applies upstream's after-write rules. `explain` completes with a
successful write. What upstream does not have is beside it: activation and cooldown
(activation.py), fallbacks (fallback.py), pauses (pause.py), conflicting writers
(conflicts.py) and pod selection (pod_selection.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import NamedTuple

from autoscaler.decision import behavior as rules
from autoscaler.decision.activation import apply_activation, idle_level
from autoscaler.decision.completion import (
    DRY_RUN_CONDITION_REASON,
    DRY_RUN_EVENT_REASON,
    SCALE_WRITE_DRY_RUN,
    SCALE_WRITE_SUCCEEDED,
    ScaleWriteResult,
    complete,
    plan_write,
)
from autoscaler.decision.conditions import (
    ABLE_TO_SCALE,
    FALSE,
    SCALED_TO_ZERO,
    SCALING_ACTIVE,
    SCALING_LIMITED,
    TRUE,
    Messages,
    condition_status,
    remove_condition,
    set_condition,
)
from autoscaler.decision.conflicts import report_scale_changes
from autoscaler.decision.events import Event
from autoscaler.decision.fallback import report_fallback
from autoscaler.decision.outcome import Decision, Draft, Limit, MetricDetail, readable_text
from autoscaler.decision.pause import Pause, apply_pause, read_pause, report_pause
from autoscaler.decision.phrases import phrase_replicas
from autoscaler.decision.pod_selection import (
    ReplicaSetOwner,
    report_pod_selection,
    restrict_pod_metrics,
    select_pods,
)
from autoscaler.decision.proposals import (
    MetricsResult,
    approximate_float,
    compute_replicas_for_metrics,
    tolerances_for,
)
from autoscaler.decision.settings import Settings
from autoscaler.model.history import History
from autoscaler.model.metrics import MetricInput
from autoscaler.model.objects import Autoscaler
from autoscaler.model.pods import Pod, Scale, ScaleError
from autoscaler.model.spec import LABEL_SELECTOR

__all__ = [
    "DRY_RUN_CONDITION_REASON",
    "DRY_RUN_EVENT_REASON",
    "SCALE_WRITE_DRY_RUN",
    "SCALE_WRITE_SUCCEEDED",
    "Decision",
    "Event",
    "Limit",
    "MetricDetail",
    "ScaleWriteResult",
    "approximate_float",
    "complete",
    "decide",
    "readable_text",
    "tolerances_for",
]

_LIMIT_RULES_LEGACY = {"TooFewReplicas": "MinReplicas", "TooManyReplicas": "MaxReplicas",
                       "ScaleUpLimit": "ScaleUpLimit"}
_LIMIT_RULES_BEHAVIOR = {"TooFewReplicas": "MinReplicas", "TooManyReplicas": "MaxReplicas",
                         "ScaleUpLimit": "ScaleUpPolicy", "ScaleDownLimit": "ScaleDownPolicy"}


class _Start(NamedTuple):
    """Where the replica count starts from before metrics: the bounds' say."""

    desired: int
    reason: str
    needs_metrics: bool
    rescale: bool
    scaled_to_zero: bool


def decide(*, autoscaler: Autoscaler, scale: Scale | ScaleError, pods: Sequence[Pod],
           metrics: Sequence[MetricInput], history: History, now: datetime,
           settings: Settings, other_selectors: Mapping[str, str] | None = None,
           replica_sets: Mapping[str, ReplicaSetOwner] | None = None) -> Decision:
    """One reconcile of `autoscaler` (reconcileAutoscaler), up to the write of the scale.

    `pods` are the pods the target's selector matches; `metrics[i]` is what the metrics API
    returned for `spec.metrics[i]` (or the error). `other_selectors` maps the names of the
    other autoscalers in the namespace to their targets' selectors (for upstream's
    AmbiguousSelector check); `explain` has none. `replica_sets` (the namespace's, by name)
    lets podSelectionStrategy OwnerReferences pick the target's own pods; without it the pods
    are counted as given. Phases: read the scale (and watch for other writers), apply the
    bounds, compute the metrics' proposal, stabilize and limit it, then plan the write (or
    keep the size).
    """
    ref = autoscaler.spec.scale_target_ref
    draft = Draft(old=autoscaler.status, conditions=autoscaler.status.conditions,
                  history=history,
                  reference=f"{ref.kind}/{autoscaler.metadata.namespace}/{ref.name}")
    gv_error = _group_version_error(ref.api_version)
    if gv_error is not None or isinstance(scale, ScaleError):
        return _failed_get_scale(draft, gv_error=gv_error, scale=scale, now=now)
    start = _read_scale_and_bounds(draft, autoscaler=autoscaler, scale=scale, now=now,
                                   settings=settings)
    report_scale_changes(draft, observed=scale.spec_replicas, now=now)
    desired, reason, rescale = start.desired, start.reason, start.rescale
    if autoscaler.spec.pod_selection_strategy != LABEL_SELECTOR and replica_sets is not None:
        selection = select_pods(strategy=autoscaler.spec.pod_selection_strategy,
                                target_kind=ref.kind, target_name=ref.name, pods=pods,
                                replica_sets=replica_sets)
        report_pod_selection(draft, selection, pods=len(pods))
        pods = selection.pods
        metrics = restrict_pod_metrics([m.type for m in autoscaler.spec.metrics], metrics,
                                       pods)
    pause = read_pause(autoscaler.metadata.annotation) if autoscaler.metadata.annotations \
        else None
    report_pause(draft, pause, now=now)
    behavior = autoscaler.spec.behavior
    if behavior is not None and behavior.sync_period_seconds is not None:
        draft.explanation.append(
            f"This autoscaler is reconciled every {behavior.sync_period_seconds} s "
            "(spec.behavior.syncPeriodSeconds), not every "
            f"{settings.sync_period.total_seconds():g} s (the controller's sync period).")
    if start.needs_metrics:
        proposed = _replicas_from_metrics(
            draft, start, autoscaler=autoscaler, scale=scale, pods=pods, metrics=metrics,
            pause=pause, settings=settings, now=now, other_selectors=other_selectors or {})
        if isinstance(proposed, Decision):
            return proposed
        desired, reason = proposed
        rescale = desired != draft.current
    paused = apply_pause(draft, pause, desired=desired, reason=reason, rescale=rescale)
    if paused.rescale:
        return plan_write(draft, autoscaler=autoscaler, desired=paused.desired,
                          reason=paused.reason)
    draft.explanation.append(f"Decision: keep {draft.reference} at "
                             f"{phrase_replicas(draft.current)}.")
    return draft.keep(desired_replicas=draft.current,
                      status=draft.status(desired_replicas=paused.shown), reason=paused.reason,
                      error=draft.error)


def _group_version_error(api_version: str) -> str | None:
    """schema.ParseGroupVersion's error, if any."""
    if not api_version or api_version == "/":
        return None
    if api_version.count("/") > 1:
        return f"unexpected GroupVersion string: {api_version}"
    return None


def _replicas_from_metrics(draft: Draft, start: _Start, *, autoscaler: Autoscaler, scale: Scale,
                           pods: Sequence[Pod], metrics: Sequence[MetricInput],
                           pause: Pause | None, settings: Settings, now: datetime,
                           other_selectors: Mapping[str, str]) -> tuple[int, str] | Decision:
    """reconcileAutoscaler's metrics branch: computeReplicasForMetrics, then
    normalizeDesiredReplicas(WithBehaviors); the replicas and the rescale reason, or the
    decision that keeps the size when no metric can be used."""
    result = compute_replicas_for_metrics(
        autoscaler=autoscaler, scale=scale, pods=pods, metrics=metrics,
        conditions=draft.conditions, settings=settings, now=now,
        other_selectors=other_selectors, failures=draft.history.metric_failures)
    if result.failures != draft.history.metric_failures:
        draft.history = draft.history._replace(metric_failures=result.failures)
    draft.conditions = result.conditions
    report_fallback(draft, fallbacks=result.fallbacks, failures=result.failures,
                    autoscaler=autoscaler, now=now)
    if draft.conditions is not result.conditions:
        result = result._replace(conditions=draft.conditions)
    failed = _take_metrics(draft, result)
    pinned = pause is not None and pause.mode == "replicas"
    if failed is not None and not pinned:
        return failed
    desired, reason = start.desired, start.reason
    if failed is None:
        desired, reason = _metrics_proposal(draft, result, desired=desired)
        desired = _stabilize_and_limit(draft, autoscaler=autoscaler, desired=desired,
                                       settings=settings, now=now)
    else:  # paused at a size: failing metrics do not stop the pause from setting it
        desired = draft.current
    if autoscaler.spec.idle is not None and failed is None:
        desired, reason = apply_activation(draft, statuses=result.statuses,
                                           autoscaler=autoscaler, metrics=metrics,
                                           desired=desired, reason=reason, settings=settings,
                                           now=now)
    if draft.current == 0 and draft.min_replicas != 0 and start.scaled_to_zero \
            and desired < draft.min_replicas:
        draft.limits.append(Limit("MinReplicas", desired, draft.min_replicas,
                                  "scaling up from zero goes at least to minReplicas"))
        desired = draft.min_replicas
        if not reason:
            reason = "Current number of replicas below Spec.MinReplicas"
    return desired, reason


def _failed_get_scale(draft: Draft, *, gv_error: str | None, scale: Scale | ScaleError,
                      now: datetime) -> Decision:
    """The scale could not be read: FailedGetScale, and nothing else is decided."""
    message = gv_error if gv_error is not None else \
        (scale.message if isinstance(scale, ScaleError) else "")
    draft.conditions = set_condition(draft.conditions, type=ABLE_TO_SCALE, status=FALSE,
                                     reason="FailedGetScale",
                                     message=Messages.FAILED_GET_SCALE.format(message), now=now)
    returned = (f"invalid API version in scale target reference: {message}"
                if gv_error is not None
                else f"failed to query scale subresource for {draft.reference}: {message}")
    draft.explanation.append(f"The scale of {draft.reference} could not be read: {message}. "
                             "Nothing else is decided until it can be.")
    draft.events.append(Event("Warning", "FailedGetScale", message))
    return draft.keep(desired_replicas=draft.old.current_replicas,
                      status=draft.old._replace(conditions=draft.conditions), error=returned)


def _read_scale_and_bounds(draft: Draft, *, autoscaler: Autoscaler, scale: Scale,
                           now: datetime, settings: Settings) -> _Start:
    """SucceededGetScale, the first recommendation, and what min/max and a zero size say
    before any metric is read."""
    spec = autoscaler.spec
    draft.conditions = set_condition(draft.conditions, type=ABLE_TO_SCALE, status=TRUE,
                                     reason="SucceededGetScale",
                                     message=Messages.SUCCEEDED_GET_SCALE, now=now)
    current = draft.current = scale.spec_replicas
    if draft.history.recommendations is None:
        recommendations = rules.record_initial_recommendation(
            draft.history.recommendations, current_replicas=current, now=now)
        draft.explanation.append(f"First sync: the current size {current} is remembered as a "
                                 "recommendation, so a scale-down waits a whole stabilization "
                                 "window.")
        draft.history = draft.history._replace(recommendations=recommendations)
    min_replicas = draft.min_replicas = spec.min_replicas if spec.min_replicas is not None \
        else 1
    max_replicas = draft.max_replicas = spec.max_replicas
    draft.explanation.append(f"{draft.reference} has {phrase_replicas(current)} (spec), "
                             f"{scale.status_replicas} (status); the autoscaler allows "
                             f"{min_replicas} to {max_replicas}.")
    has_object_or_external = spec.has_object_or_external
    scaled_to_zero = settings.scale_to_zero and \
        condition_status(draft.conditions, SCALED_TO_ZERO) == TRUE
    can_scale_from_zero = scaled_to_zero and has_object_or_external
    level = idle_level(spec, settings)
    if level is not None and current == level:
        draft.explanation.append(f"The target rests at its idle size {level}: the metrics "
                                 "decide whether it activates.")
        return _Start(current, "", needs_metrics=True, rescale=True,
                      scaled_to_zero=scaled_to_zero)
    if current == 0:
        if (min_replicas != 0 and scaled_to_zero) or can_scale_from_zero:
            draft.explanation.append("The target was scaled to zero by the autoscaler: metrics "
                                     "decide whether it comes back.")
            return _Start(0, "", needs_metrics=True, rescale=True, scaled_to_zero=scaled_to_zero)
        draft.conditions = set_condition(draft.conditions, type=SCALING_ACTIVE, status=FALSE,
                                         reason="ScalingDisabled",
                                         message=Messages.SCALING_DISABLED, now=now)
        if not settings.scale_to_zero:
            draft.conditions = remove_condition(draft.conditions, SCALED_TO_ZERO)
        draft.explanation.append("The target has 0 replicas and was not scaled to zero by the "
                                 "autoscaler: scaling is disabled until someone scales it up.")
        return _Start(0, "", needs_metrics=False, rescale=False, scaled_to_zero=scaled_to_zero)
    if current > max_replicas:
        draft.limits.append(Limit("MaxReplicas", current, max_replicas, "the current size is "
                                  "above maxReplicas; no metrics are consulted"))
        draft.explanation.append(f"The current size {current} is above maxReplicas: scale to "
                                 f"{max_replicas} without looking at metrics.")
        return _Start(max_replicas, "Current number of replicas above Spec.MaxReplicas",
                      needs_metrics=False, rescale=True, scaled_to_zero=scaled_to_zero)
    if current < min_replicas:
        draft.limits.append(Limit("MinReplicas", current, min_replicas, "the current size is "
                                  "below minReplicas; no metrics are consulted"))
        draft.explanation.append(f"The current size {current} is below minReplicas: scale to "
                                 f"{min_replicas} without looking at metrics.")
        return _Start(min_replicas, "Current number of replicas below Spec.MinReplicas",
                      needs_metrics=False, rescale=True, scaled_to_zero=scaled_to_zero)
    return _Start(0, "", needs_metrics=True, rescale=True, scaled_to_zero=scaled_to_zero)


def _take_metrics(draft: Draft, result: MetricsResult) -> Decision | None:
    """Record the metrics' outcome; when no metric can be used (or a failing one blocks a
    scale-down), the decision that keeps the size."""
    draft.conditions = result.conditions
    draft.events.extend(result.events)
    draft.details = result.details
    draft.metric_statuses = result.statuses
    draft.explanation.extend(_describe_metrics(result.details))
    if result.replicas != -1:
        if result.error is not None:
            draft.error = result.error  # some metrics failed: scale on the others, report
            draft.explanation.append("Some metrics failed, but the others ask for no "
                                     "scale-down, so the autoscaler goes on with them.")
        for note in result.notes:
            if note.from_replicas != note.to_replicas:
                draft.limits.append(Limit(note.rule, note.from_replicas, note.to_replicas,
                                          f"metric {result.winner}: {note.detail}"))
        return None
    assert result.error is not None
    if result.blocked_scale_down is not None:
        draft.limits.append(Limit("FailingMetricBlocksScaleDown", result.blocked_scale_down,
                                  draft.current, "a metric failed, and a failing metric blocks "
                                                 "any scale-down"))
        draft.explanation.append(f"The working metrics propose {result.blocked_scale_down}, a "
                                 "scale-down, but a metric failed: no scale-down while any "
                                 "metric fails.")
    else:
        draft.explanation.append("No metric could be used: the size stays, and "
                                 "status.desiredReplicas keeps its old value.")
    draft.events.append(Event("Warning", "FailedComputeMetricsReplicas", result.error))
    return draft.keep(
        desired_replicas=draft.current,
        status=draft.status(desired_replicas=draft.old.desired_replicas),
        error=f"failed to compute desired number of replicas based on listed metrics for "
              f"{draft.reference}: {result.error}")


def _metrics_proposal(draft: Draft, result: MetricsResult, *, desired: int) -> tuple[int, str]:
    """The replicas the metrics ask for, and upstream's rescale reason for them."""
    reason = ""
    rescale_metric = ""
    if result.replicas > desired:
        desired = result.replicas
        rescale_metric = result.name
    if desired > draft.current:
        reason = f"{rescale_metric} above target"
    if desired < draft.current:
        reason = "All metrics below target"
    most = f" (the most, from {readable_text(result.name, result.details)})." \
        if result.name else "."
    draft.explanation.append(f"The metrics ask for {phrase_replicas(desired)}{most}")
    return desired, reason


def _stabilize_and_limit(draft: Draft, *, autoscaler: Autoscaler, desired: int,
                         settings: Settings, now: datetime) -> int:
    """Stabilization windows, then min/max and the scale-up limits (legacy) or the behavior's
    policies; the AbleToScale and ScalingLimited conditions say what happened."""
    behavior = autoscaler.spec.behavior
    current = draft.current
    history = draft.history
    if behavior is None:
        stabilized = rules.stabilize_recommendation(
            history.recommendations or (), desired=desired,
            window=settings.downscale_stabilization_window, now=now)
        normalized = rules.convert_desired_replicas_with_rules(
            current_replicas=current, desired_replicas=stabilized.replicas,
            min_replicas=draft.min_replicas, max_replicas=draft.max_replicas,
            factor=settings.scale_up_limit_factor, minimum=settings.scale_up_limit_minimum)
        limit_names = _LIMIT_RULES_LEGACY
        window_text = (f"the {int(settings.downscale_stabilization_window.total_seconds())} s "
                       "downscale stabilization window")
    else:
        up, down = behavior.scale_up, behavior.scale_down
        up_window = up.stabilization_window_seconds if up is not None else None
        down_window = down.stabilization_window_seconds if down is not None else None
        if down_window is None:  # maybeInitScaleDownStabilizationWindow
            down_window = int(settings.downscale_stabilization_window.total_seconds())
        stabilized = rules.stabilize_recommendation_with_behaviors(
            history.recommendations or (), desired=desired, current=current,
            up_window_seconds=up_window or 0, down_window_seconds=down_window, now=now)
        normalized = rules.convert_desired_replicas_with_behavior_rate(
            current_replicas=current, desired_replicas=stabilized.replicas,
            min_replicas=draft.min_replicas, max_replicas=draft.max_replicas,
            behavior=behavior, up_events=history.scale_up_events,
            down_events=history.scale_down_events, now=now)
        limit_names = _LIMIT_RULES_BEHAVIOR
        window_text = f"the stabilization windows (up {up_window or 0} s, down {down_window} s)"
    draft.history = history._replace(recommendations=stabilized.recommendations)
    draft.conditions = set_condition(draft.conditions, type=ABLE_TO_SCALE, status=TRUE,
                                     reason=stabilized.reason, message=stabilized.message,
                                     now=now)
    if stabilized.replicas != desired:
        rule = ("ScaleUpStabilization" if stabilized.reason == "ScaleUpStabilized"
                else "ScaleDownStabilization")
        draft.limits.append(Limit(rule, desired, stabilized.replicas,
                                  f"{stabilized.message} ({window_text})"))
        draft.explanation.append(f"Stabilization ({window_text}) turns {desired} into "
                                 f"{stabilized.replicas}: {stabilized.message}.")
    limited = normalized.replicas != stabilized.replicas
    draft.conditions = set_condition(draft.conditions, type=SCALING_LIMITED,
                                     status=TRUE if limited else FALSE,
                                     reason=normalized.reason, message=normalized.message,
                                     now=now)
    if limited:
        draft.limits.append(Limit(limit_names.get(normalized.reason, normalized.reason),
                                  stabilized.replicas, normalized.replicas, normalized.message))
        draft.explanation.append(f"Limits turn {stabilized.replicas} into "
                                 f"{normalized.replicas}: {normalized.message}.")
    return normalized.replicas


def _describe_metrics(details: Sequence[MetricDetail]) -> list[str]:
    """One line of the explanation per metric: what it proposed, or why it failed."""
    lines = []
    for detail in details:
        label = detail.shown_name
        if detail.error is not None:
            lines.append(f"Metric {detail.index} ({label}) failed: {detail.error}")
            continue
        pods = ""
        if detail.unready_pods or detail.missing_pods or detail.ignored_pods:
            pods = (f"; pods: {detail.ready_pods} ready, {detail.unready_pods} unready, "
                    f"{detail.missing_pods} without metrics, {detail.ignored_pods} ignored")
        ratio = f"{detail.ratio:.4g}" if detail.ratio is not None else "undefined"
        lines.append(f"Metric {detail.index} ({label}): current {detail.current}, target "
                     f"{detail.target}, usage ratio {ratio}{pods}: proposes "
                     f"{detail.proposed_replicas}.")
    return lines

