"""A hand-over from an HPA to an Autoscaler: the memory the Autoscaler starts with, and where a
controller finds the memory an autoscaler carries.

`metricscale migrate hpa --apply` creates the Autoscaler with the history it should continue in
the `metricscale.dev/history` annotation (a status cannot be written on create, and one written
after it would race the controller's first reconcile, which reads the memory once): the
controller reads an Autoscaler's `status.history`, or, while the status has none, that
annotation. From the first status the controller writes, the status is what counts.

What the history holds depends on who ran the HPA:

* metricscale in native-HPA mode keeps the HPA's history in the same annotation: it is carried
  over as it is, so the Autoscaler continues the very windows and rate policies the HPA was in;
* kube-controller-manager keeps its recommendations in memory, which nothing outside can read.
  The Autoscaler then starts as kube-controller-manager does after its own restart: the target's
  current size counts as recommended at the hand-over, so no scale-down comes before a whole
  downscale window has passed (never sooner than the HPA would have, at most a window later),
  and the rescales its Events record (`New size: N; reason: ...`) are carried as scale events
  for the rate policies, where the size before each is known.

All of it is pure: values in, values out.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from autoscaler.decision.behavior import longest_policy_period
from autoscaler.decision.persistence import history_from_annotations, history_from_status
from autoscaler.model.fields import ModelError
from autoscaler.model.history import History, Recommendation, ScaleEvent
from autoscaler.model.objects import HPA_KIND
from autoscaler.model.spec import AutoscalerSpec
from autoscaler.model.times import format_time, parse_time

__all__ = [
    "Carried",
    "Handover",
    "Rescale",
    "carried_history",
    "handover_history",
    "rescales_from_events",
]

_NEW_SIZE = re.compile(r"^New size: (\d+); reason: ")


class Carried(NamedTuple):
    """The history an autoscaler carries, and the part of it already in the controller's own
    store (a native HPA's annotation, an Autoscaler's status): a hand-over's annotation is not,
    so the first reconcile writes it into the status."""

    history: History | None
    stored: History | None


def carried_history(*, kind: str, status: Mapping[str, Any] | None,
                    annotations: Mapping[str, str] | None) -> Carried:
    """The history an autoscaler carries: a native HPA's annotation; an Autoscaler's
    `status.history`, else (a hand-over not yet reconciled) the annotation. Raises ModelError
    when the one that counts is malformed."""
    if kind == HPA_KIND:
        annotated = history_from_annotations(annotations)
        return Carried(annotated, annotated)
    from_status = history_from_status(status)
    if from_status is not None:
        return Carried(from_status, from_status)
    return Carried(history_from_annotations(annotations), None)


class Rescale(NamedTuple):
    """A scale the HPA's controller made: when, and to how many replicas."""

    timestamp: datetime
    replicas: int


def _event_time(event: Mapping[str, Any]) -> datetime | None:
    series = event.get("series") if isinstance(event.get("series"), Mapping) else {}
    assert isinstance(series, Mapping)
    for raw in (series.get("lastObservedTime"), event.get("lastTimestamp"),
                event.get("eventTime"), event.get("firstTimestamp")):
        if raw:
            try:
                return parse_time(raw, "event")
            except ModelError:
                continue
    return None


def rescales_from_events(events: Sequence[Mapping[str, Any]]) -> tuple[Rescale, ...]:
    """The rescales that `SuccessfulRescale` Events (core/v1 or events.k8s.io) record, oldest
    first. An Event seen more than once (`count` > 1, the same size again) counts at its first
    and its last time."""
    found: set[Rescale] = set()
    for event in events:
        if event.get("reason") != "SuccessfulRescale":
            continue
        text = event.get("message") if event.get("message") is not None else event.get("note")
        match = _NEW_SIZE.match(str(text or ""))
        when = _event_time(event)
        if match is None or when is None:
            continue
        replicas = int(match[1])
        found.add(Rescale(when, replicas))
        first = event.get("firstTimestamp")
        if first and (event.get("count") or 1) > 1:
            with contextlib.suppress(ModelError):
                found.add(Rescale(parse_time(first, "event"), replicas))
    return tuple(sorted(found))


class Handover(NamedTuple):
    """The history an Autoscaler taking over starts with, where it came from, and what of the
    HPA's memory could not be carried."""

    history: History
    source: str  # "annotation" (exact) or "reconstructed"
    notes: tuple[str, ...] = ()


def _scale_events(rescales: Sequence[Rescale], *, spec: AutoscalerSpec,
                  now: datetime) -> tuple[tuple[ScaleEvent, ...], tuple[ScaleEvent, ...],
                                          tuple[str, ...]]:
    behavior = spec.behavior
    if behavior is None:
        return (), (), ()  # without behavior upstream records no scale events
    up_period = longest_policy_period(behavior.scale_up)
    down_period = longest_policy_period(behavior.scale_down)
    horizon = now - timedelta(seconds=max(up_period, down_period))
    up: list[ScaleEvent] = []
    down: list[ScaleEvent] = []
    notes: list[str] = []
    ordered = sorted(rescales)
    for index, rescale in enumerate(ordered):
        if rescale.timestamp <= horizon:
            continue  # older than every policy's period: it limits nothing any more
        if index == 0:
            notes.append(f"the rescale to {rescale.replicas} at {format_time(rescale.timestamp)} "
                         "is not carried to the rate policies: the size before it is no longer "
                         "in the HPA's Events")
            continue
        change = rescale.replicas - ordered[index - 1].replicas
        if change > 0:
            up.append(ScaleEvent(rescale.timestamp, change))
        elif change < 0:
            down.append(ScaleEvent(rescale.timestamp, -change))
    return tuple(up), tuple(down), tuple(notes)


def handover_history(*, annotated: History | None, current_replicas: int,
                     rescales: Sequence[Rescale], spec: AutoscalerSpec,
                     now: datetime) -> Handover:
    """The history for an Autoscaler taking over from an HPA now (see the module docstring):
    the HPA's own annotation when metricscale ran it, else the restart rule and its Events."""
    if annotated is not None and annotated.recommendations:
        return Handover(annotated, "annotation")
    up, down, notes = _scale_events(rescales, spec=spec, now=now)
    history = History(
        recommendations=(Recommendation(timestamp=now, replicas=current_replicas),),
        scale_up_events=up, scale_down_events=down)
    return Handover(history, "reconstructed", (
        "kube-controller-manager keeps its stabilization recommendations in memory only: the "
        f"Autoscaler counts the current {current_replicas} replicas as recommended at the "
        "hand-over, as kube-controller-manager does when it restarts, so it scales down no "
        "sooner than the HPA would have and at most one downscale window later", *notes))
