"""What the controller keeps in the cluster beyond upstream's status: history, dry run, columns.

Upstream's HPA controller keeps its stabilization recommendations and scale events in memory
only, so a restarted or failed-over controller forgets the windows it was in the middle of.
metricscale also keeps them in the autoscaler (`status.history` of an Autoscaler, the
`metricscale.dev/history` annotation of a native HPA, whose status schema is fixed).

Writing them on every reconcile would cost a write per sync (each sync records a new
recommendation). Instead the persisted copy is *compact* (the newest recommendation per value
within the longest window) and is rewritten only when it stops describing the decisions to
come: when a recommendation differs from the last persisted one, or the scale events change.
Between two writes every recommendation equals the last persisted value, so a controller that
takes over reads the history back and counts that last value as recommended at takeover
(`restore_history`): it never scales down sooner than the previous leader would have, and may
hold a size at most the takeover delay longer.

The failed reads of a metric with a fallback are counted the same way: each one is written
until the count reaches the metric's failureThreshold (or the reads have failed for its
failureDurationSeconds); from then on a higher count decides nothing new (the fallback applies
until a read succeeds), so a steady outage writes nothing. The persisted entry keeps `since`,
and a count of at least the threshold; a new leader goes on counting from there.

All of it is pure: values in, values out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from autoscaler.decision.settings import Settings
from autoscaler.model.fields import ModelError, Quantity
from autoscaler.model.history import (
    History,
    MetricFailure,
    Recommendation,
    parse_history,
    render_history,
)
from autoscaler.model.spec import AutoscalerSpec, MetricSpec
from autoscaler.model.status import AutoscalerStatus, MetricStatus
from metricscale.core.quantity import Format, format_quantity

__all__ = [
    "DRY_RUN_ANNOTATION",
    "HISTORY_ANNOTATION",
    "compact_history",
    "format_reference",
    "format_targets",
    "history_from_annotations",
    "history_from_status",
    "history_horizon",
    "is_dry_run",
    "needs_persisting",
    "render_history_annotation",
    "render_persisted_history",
    "restore_history",
]

HISTORY_ANNOTATION = "metricscale.dev/history"
DRY_RUN_ANNOTATION = "metricscale.dev/dry-run"
# The longest window the API allows (validation's MaxStabilizationWindowSeconds).
_MAX_WINDOW = timedelta(seconds=3600)


# --------------------------------------------------------------------------------------------
# History


def history_horizon(spec: AutoscalerSpec, settings: Settings) -> timedelta:
    """How far back a recommendation can still matter for this autoscaler."""
    windows = [settings.downscale_stabilization_window]
    behavior = spec.behavior
    if behavior is not None:
        for rules in (behavior.scale_up, behavior.scale_down):
            if rules is not None and rules.stabilization_window_seconds is not None:
                windows.append(timedelta(seconds=rules.stabilization_window_seconds))
    return min(max(windows), _MAX_WINDOW) if windows else _MAX_WINDOW


def compact_history(history: History, *, now: datetime, horizon: timedelta) -> History:
    """The recommendations that can still matter: within the horizon, the newest per value.

    An older recommendation of the same value never changes a maximum or a minimum over a
    window that also holds the newer one, and a window holding the older one holds the newer.
    """
    if history.recommendations is None:
        return history
    cutoff = now - horizon
    newest: dict[int, tuple[datetime, int, Recommendation]] = {}
    for position, rec in enumerate(history.recommendations):
        if rec.timestamp < cutoff:
            continue
        kept = newest.get(rec.replicas)
        if kept is None or (rec.timestamp, position) > kept[:2]:
            newest[rec.replicas] = (rec.timestamp, position, rec)
    # Oldest first; equal times keep the order they were made in (a first sync records the
    # current size and the first recommendation at the same instant).
    ordered = tuple(rec for _, _, rec in sorted(newest.values(), key=lambda kept: kept[:2]))
    return history._replace(recommendations=ordered)


def _latest(recommendations: tuple[Recommendation, ...]) -> Recommendation:
    """The most recent recommendation; of equal times, the one made last."""
    return max(enumerate(recommendations), key=lambda item: (item[1].timestamp, item[0]))[1]


def _failure_settled(persisted: MetricFailure, current: MetricFailure, *,
                     spec: AutoscalerSpec | None, now: datetime) -> bool:
    """Whether the persisted count of a metric's failed reads still decides as the current one
    does: the same outage (same `since`), and either the same count or one past the point
    where more failures change nothing (the threshold reached, or the duration passed)."""
    if persisted.metric != current.metric or persisted.since != current.since:
        return False
    if persisted.failures == current.failures:
        return True
    metrics = spec.metrics if spec is not None else ()
    fallback = metrics[current.metric].fallback if 0 <= current.metric < len(metrics) else None
    if fallback is None:
        return False
    if persisted.failures >= fallback.failure_threshold:
        return True
    seconds = fallback.failure_duration_seconds
    return seconds is not None and (now - current.since).total_seconds() >= seconds


def _failures_settled(persisted: tuple[MetricFailure, ...], current: tuple[MetricFailure, ...],
                      *, spec: AutoscalerSpec | None, now: datetime) -> bool:
    return len(persisted) == len(current) and all(
        _failure_settled(old, new, spec=spec, now=now)
        for old, new in zip(persisted, current, strict=True))


def needs_persisting(persisted: History | None, current: History, *, now: datetime,
                     horizon: timedelta, spec: AutoscalerSpec | None = None) -> bool:
    """Whether the persisted history no longer describes `current` (see the module docstring).

    Recommendations equal to the last persisted value are covered by it; so are entries that
    aged out of the horizon. Scale events are compared exactly: they change only on a rescale.
    Failed reads are compared exactly until, by the fallbacks of `spec`, more of them decide
    nothing new (without `spec`, always exactly).
    """
    if current.recommendations is None:
        return False
    if persisted is None or not persisted.recommendations:
        return True
    if (persisted.scale_up_events != current.scale_up_events
            or persisted.scale_down_events != current.scale_down_events
            or not _failures_settled(persisted.metric_failures, current.metric_failures,
                                     spec=spec, now=now)
            or persisted.inactive_since != current.inactive_since
            or persisted.scale_watch != current.scale_watch):
        return True
    last = _latest(persisted.recommendations).replicas
    if all(rec.replicas == last for rec in current.recommendations):
        return False  # the steady state: every recommendation is the persisted last value
    known = set(compact_history(persisted, now=now, horizon=horizon).recommendations or ())
    compacted = compact_history(current, now=now, horizon=horizon).recommendations or ()
    return any(rec.replicas != last and rec not in known for rec in compacted)


def restore_history(persisted: History | None, *, now: datetime) -> History:
    """The in-memory history of a controller that starts (or takes over) now.

    Without a persisted history this is upstream's first sync. Otherwise the last persisted
    recommendation is also counted as made now: the previous leader went on recommending it
    until it stopped (any other value would have been persisted).
    """
    if persisted is None:
        return History()
    recommendations = persisted.recommendations
    if not recommendations:
        return persisted._replace(recommendations=None)
    last = _latest(recommendations)
    if now > last.timestamp:
        recommendations = (*recommendations, Recommendation(timestamp=now,
                                                            replicas=last.replicas))
    return persisted._replace(recommendations=recommendations)


def render_persisted_history(history: History, *, now: datetime,
                             horizon: timedelta) -> dict[str, Any]:
    """`status.history` (and the annotation's JSON): the compact history in snapshot form."""
    return render_history(compact_history(history, now=now, horizon=horizon))


def history_from_status(status: Mapping[str, Any] | None) -> History | None:
    """The history an Autoscaler's status carries, or None; raises ModelError when malformed."""
    if not status or status.get("history") is None:
        return None
    return parse_history(status["history"], "status.history")


def history_from_annotations(annotations: Mapping[str, str] | None) -> History | None:
    """The history a native HPA's annotation carries, or None; raises ModelError if malformed."""
    text = (annotations or {}).get(HISTORY_ANNOTATION)
    if not text:
        return None
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise ModelError(f"metadata.annotations[{HISTORY_ANNOTATION}]",
                         f"is not JSON: {err}") from None
    return parse_history(raw, f"metadata.annotations[{HISTORY_ANNOTATION}]")


def render_history_annotation(history: History, *, now: datetime, horizon: timedelta) -> str:
    """The annotation's value: compact JSON, stable key order (so equal histories compare)."""
    return json.dumps(render_persisted_history(history, now=now, horizon=horizon),
                      separators=(",", ":"), sort_keys=True)


# --------------------------------------------------------------------------------------------
# Dry run


def is_dry_run(annotations: Mapping[str, str] | None, *, globally: bool) -> bool:
    """The controller's --dry-run, or `metricscale.dev/dry-run: "true"` on the autoscaler."""
    if globally:
        return True
    value = (annotations or {}).get(DRY_RUN_ANNOTATION, "")
    return value.strip().lower() in {"true", "1", "yes"}


# --------------------------------------------------------------------------------------------
# The REFERENCE and TARGETS columns, as kubectl prints an HPA


def format_reference(spec: AutoscalerSpec) -> str:
    """REFERENCE: `Kind/name` of the scale target."""
    ref = spec.scale_target_ref
    return f"{ref.kind}/{ref.name}"


def _go_string(quantity: Quantity | None) -> str:
    """Quantity.String(): canonical, in the format the text was written in."""
    if quantity is None:
        return "<unknown>"
    binary = quantity.text.rstrip().endswith("i")
    return format_quantity(quantity.value, Format.BINARY_SI if binary else Format.DECIMAL_SI)


def _format_metric(spec: MetricSpec, status: MetricStatus | None) -> str:
    unknown = "<unknown>"
    if spec.type == "External" and spec.external is not None:
        target = spec.external.target
        current_status = status.external if status is not None else None
        if target.average_value is not None:
            current = unknown
            if current_status is not None and current_status.current.average_value is not None:
                current = _go_string(current_status.current.average_value)
            return f"{current}/{_go_string(target.average_value)} (avg)"
        current = _go_string(current_status.current.value) if current_status else unknown
        return f"{current}/{_go_string(target.value)}"
    if spec.type == "Pods" and spec.pods is not None:
        pods = status.pods if status is not None else None
        current = _go_string(pods.current.average_value) if pods is not None else unknown
        return f"{current}/{_go_string(spec.pods.target.average_value)}"
    if spec.type == "Object" and spec.object is not None:
        target = spec.object.target
        obj = status.object if status is not None else None
        if target.average_value is not None:
            current = unknown
            if obj is not None and obj.current.average_value is not None:
                current = _go_string(obj.current.average_value)
            return f"{current}/{_go_string(target.average_value)} (avg)"
        current = _go_string(obj.current.value) if obj is not None else unknown
        return f"{current}/{_go_string(target.value)}"
    if spec.type in {"Resource", "ContainerResource"}:
        if spec.type == "Resource" and spec.resource is not None:
            name, target = spec.resource.name, spec.resource.target
            value = status.resource.current if status and status.resource else None
        elif spec.container_resource is not None:
            name, target = spec.container_resource.name, spec.container_resource.target
            value = (status.container_resource.current
                     if status and status.container_resource else None)
        else:
            return "<unknown type>"
        if target.average_value is not None:
            current = _go_string(value.average_value) if value is not None else unknown
            return f"{name}: {current}/{_go_string(target.average_value)}"
        current = unknown
        if value is not None and value.average_utilization is not None:
            current = f"{value.average_utilization}%"
        wanted = (f"{target.average_utilization}%" if target.average_utilization is not None
                  else "<auto>")
        return f"{name}: {current}/{wanted}"
    return "<unknown type>"


def format_targets(spec: AutoscalerSpec, status: AutoscalerStatus) -> str:
    """TARGETS: `current/target` of the first two metrics, as kubectl's formatHPAMetrics."""
    if not spec.metrics:
        return "<none>"
    shown = []
    for index, metric in enumerate(spec.metrics):
        current = status.current_metrics[index] if index < len(status.current_metrics) else None
        shown.append(_format_metric(metric, current))
    if len(shown) > 2:
        return f"{', '.join(shown[:2])} + {len(shown) - 2} more..."
    return ", ".join(shown)
