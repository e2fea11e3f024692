"""The controller's memory for one autoscaler: recommendations and scale events (upstream's),
metric failures, inactivity and the replicas it left the target at (ours)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

from autoscaler.model.fields import (
    ModelError,
    read_bool,
    read_int,
    read_list,
    read_object,
)
from autoscaler.model.times import (
    format_time_precise,
    parse_time,
)

__all__ = [
    "History",
    "MetricFailure",
    "Recommendation",
    "ScaleEvent",
    "ScaleWatch",
    "parse_history",
    "render_history",
]


class Recommendation(NamedTuple):
    timestamp: datetime
    replicas: int


class ScaleEvent(NamedTuple):
    timestamp: datetime
    replica_change: int
    outdated: bool = False


class MetricFailure(NamedTuple):
    """A metric with a fallback whose reads fail: how many in a row, since when (ours)."""

    metric: int  # its index in spec.metrics
    failures: int
    since: datetime


class ScaleWatch(NamedTuple):
    """Conflict detection (ours): the replicas this autoscaler left its target at the end of its
    last sync (written, or kept), and the changes it saw and did not make."""

    replicas: int
    external_changes: tuple[datetime, ...] = ()  # within the conflict window, oldest first
    conflicting: bool = False  # the ScalingConflict condition is set


class History(NamedTuple):
    """Recommendations and scale events; `recommendations is None` means a first sync."""

    recommendations: tuple[Recommendation, ...] | None = None
    scale_up_events: tuple[ScaleEvent, ...] = ()
    scale_down_events: tuple[ScaleEvent, ...] = ()
    metric_failures: tuple[MetricFailure, ...] = ()
    inactive_since: datetime | None = None  # ours: since when no metric has been active
    scale_watch: ScaleWatch | None = None  # ours: None before the first sync that read a scale


def _parse_events(raw: Mapping[str, Any], key: str, path: str) -> tuple[ScaleEvent, ...]:
    events = []
    for i, item in enumerate(read_list(raw, key, path) or []):
        where = f"{path}.{key}[{i}]"
        obj = read_object(item, where)
        timestamp = obj.get("timestamp")
        if timestamp is None:
            raise ModelError(f"{where}.timestamp", "is required")
        events.append(ScaleEvent(
            timestamp=parse_time(timestamp, f"{where}.timestamp"),
            replica_change=read_int(obj, "replicaChange", where, required=True) or 0,
            outdated=read_bool(obj, "outdated", where),
        ))
    return tuple(events)


def parse_history(raw: Any, path: str = "history") -> History:
    if raw is None:
        return History()
    obj = read_object(raw, path)
    recommendations: tuple[Recommendation, ...] | None = None
    recs_raw = read_list(obj, "recommendations", path)
    if recs_raw is not None:
        recs = []
        for i, item in enumerate(recs_raw):
            where = f"{path}.recommendations[{i}]"
            rec = read_object(item, where)
            timestamp = rec.get("timestamp")
            if timestamp is None:
                raise ModelError(f"{where}.timestamp", "is required")
            recs.append(Recommendation(
                timestamp=parse_time(timestamp, f"{where}.timestamp"),
                replicas=read_int(rec, "replicas", where, required=True) or 0))
        recommendations = tuple(recs)
    failures = []
    for i, item in enumerate(read_list(obj, "metricFailures", path) or []):
        where = f"{path}.metricFailures[{i}]"
        entry = read_object(item, where)
        since = entry.get("since")
        if since is None:
            raise ModelError(f"{where}.since", "is required")
        failures.append(MetricFailure(
            metric=read_int(entry, "metric", where, required=True) or 0,
            failures=read_int(entry, "failures", where, required=True) or 0,
            since=parse_time(since, f"{where}.since")))
    return History(
        recommendations=recommendations,
        scale_watch=_parse_scale_watch(obj, path),
        scale_up_events=_parse_events(obj, "scaleUpEvents", path),
        scale_down_events=_parse_events(obj, "scaleDownEvents", path),
        metric_failures=tuple(failures),
        inactive_since=(parse_time(obj["inactiveSince"], f"{path}.inactiveSince")
                        if obj.get("inactiveSince") is not None else None),
    )


def _parse_scale_watch(obj: Mapping[str, Any], path: str) -> ScaleWatch | None:
    raw = obj.get("scaleWatch")
    if raw is None:
        return None
    where = f"{path}.scaleWatch"
    watch = read_object(raw, where)
    replicas = read_int(watch, "replicas", where, required=True) or 0
    if replicas < 0:
        raise ModelError(f"{where}.replicas", "must be 0 or more")
    changes = []
    for i, item in enumerate(read_list(watch, "externalChanges", where) or []):
        changes.append(parse_time(item, f"{where}.externalChanges[{i}]"))
    return ScaleWatch(replicas=replicas, external_changes=tuple(changes),
                      conflicting=read_bool(watch, "conflicting", where))


def render_history(history: History) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if history.recommendations is not None:
        out["recommendations"] = [
            {"timestamp": format_time_precise(r.timestamp), "replicas": r.replicas}
            for r in history.recommendations]
    out["scaleUpEvents"] = [_render_event(e) for e in history.scale_up_events]
    out["scaleDownEvents"] = [_render_event(e) for e in history.scale_down_events]
    if history.metric_failures:  # only with a fallback failing: upstream's shape otherwise
        out["metricFailures"] = [{"metric": f.metric, "failures": f.failures,
                                  "since": format_time_precise(f.since)}
                                 for f in history.metric_failures]
    if history.inactive_since is not None:  # only with spec.idle: upstream's shape otherwise
        out["inactiveSince"] = format_time_precise(history.inactive_since)
    watch = history.scale_watch
    if watch is not None:
        rendered: dict[str, Any] = {"replicas": watch.replicas}
        if watch.external_changes:
            rendered["externalChanges"] = [format_time_precise(t)
                                           for t in watch.external_changes]
        if watch.conflicting:
            rendered["conflicting"] = True
        out["scaleWatch"] = rendered
    return out


def _render_event(event: ScaleEvent) -> dict[str, Any]:
    return {"timestamp": format_time_precise(event.timestamp),
            "replicaChange": event.replica_change, "outdated": event.outdated}
