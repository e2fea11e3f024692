"""autoscaler.decision.handover: the memory an Autoscaler taking over from an HPA starts with,
and the controller reading it from the hand-over annotation until its first status write."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from autoscaler.decision.handover import (
    carried_history,
    handover_history,
    rescales_from_events,
)
from autoscaler.decision.persistence import (
    HISTORY_ANNOTATION,
    history_from_annotations,
    render_history_annotation,
)
from autoscaler.model.history import History, Recommendation, ScaleEvent, render_history
from autoscaler.model.objects import parse_autoscaler
from tests.autoscaler.test_reconciler import HPA_KEY, KEY, NS, World, autoscaler

T0 = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)
BEHAVIOR = {"scaleDown": {"stabilizationWindowSeconds": 0,
                          "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def stamp(seconds: float) -> str:
    return at(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


def spec(behavior: dict[str, Any] | None = BEHAVIOR) -> Any:
    return parse_autoscaler(autoscaler(behavior=behavior) if behavior else autoscaler()).spec


def rescale_event(size: int, seconds: float, *, count: int = 1,
                  first: float | None = None) -> dict[str, Any]:
    return {"reason": "SuccessfulRescale", "type": "Normal", "count": count,
            "message": f"New size: {size}; reason: All metrics below target",
            "firstTimestamp": stamp(seconds if first is None else first),
            "lastTimestamp": stamp(seconds)}


# ------------------------------------------------------------------------- reading the events


def test_rescales_are_read_from_successful_rescale_events_oldest_first() -> None:
    events = [rescale_event(4, 30), {"reason": "FailedGetPodsMetric", "message": "x"},
              rescale_event(5, 10),
              {"reason": "SuccessfulRescale", "note": "New size: 3; reason: r",
               "eventTime": at(50).strftime("%Y-%m-%dT%H:%M:%S.%fZ")},
              {"reason": "SuccessfulRescale", "message": "garbled"}]
    assert [(r.timestamp, r.replicas) for r in rescales_from_events(events)] == [
        (at(10), 5), (at(30), 4), (at(50), 3)]


def test_an_event_seen_twice_counts_at_its_first_and_last_time() -> None:
    rescales = rescales_from_events([rescale_event(5, 100, count=2, first=20),
                                     rescale_event(4, 60)])
    assert [r.replicas for r in rescales] == [5, 4, 5]


# --------------------------------------------------------------------- the history it builds


def test_an_hpa_run_by_metricscale_hands_over_its_own_history_exactly() -> None:
    own = History(recommendations=(Recommendation(at(0), 7), Recommendation(at(40), 3)),
                  scale_down_events=(ScaleEvent(at(20), 2),))
    handover = handover_history(annotated=own, current_replicas=5, rescales=(), spec=spec(),
                                now=at(50))
    assert handover.history == own
    assert handover.source == "annotation"


def test_without_its_memory_the_current_size_counts_as_recommended_at_the_handover() -> None:
    handover = handover_history(annotated=None, current_replicas=5, rescales=(),
                                spec=spec(None), now=at(50))
    assert handover.source == "reconstructed"
    assert handover.history.recommendations == (Recommendation(at(50), 5),)
    assert handover.history.scale_down_events == ()
    assert "restarts" in handover.notes[0]


def test_rescales_within_the_policies_period_become_scale_events() -> None:
    rescales = rescales_from_events([rescale_event(6, 0), rescale_event(5, 20),
                                     rescale_event(7, 30), rescale_event(4, 45)])
    handover = handover_history(annotated=None, current_replicas=4, rescales=rescales,
                                spec=spec({**BEHAVIOR, "scaleUp": {"policies": [
                                    {"type": "Pods", "value": 4, "periodSeconds": 15}]}}),
                                now=at(70))
    assert handover.history.scale_down_events == (ScaleEvent(at(20), 1), ScaleEvent(at(45), 3))
    assert handover.history.scale_up_events == (ScaleEvent(at(30), 2),)
    assert handover.notes[1:] == ()  # the size before 5 at 20 is the 6 of an older event


def test_a_rescale_whose_size_before_is_unknown_is_reported_not_guessed() -> None:
    handover = handover_history(annotated=None, current_replicas=4,
                                rescales=rescales_from_events([rescale_event(4, 30)]),
                                spec=spec(), now=at(50))
    assert handover.history.scale_down_events == ()
    assert "size before it is no longer in the HPA's Events" in handover.notes[1]


def test_without_behavior_no_scale_events_are_kept_as_upstream_keeps_none() -> None:
    rescales = rescales_from_events([rescale_event(6, 0), rescale_event(5, 20)])
    handover = handover_history(annotated=None, current_replicas=5, rescales=rescales,
                                spec=spec(None), now=at(30))
    assert handover.history.scale_down_events == ()


# ------------------------------------------------------------------- where the memory comes from


def test_an_autoscalers_status_wins_over_the_handover_annotation() -> None:
    status_history = History(recommendations=(Recommendation(at(0), 3),))
    annotated = History(recommendations=(Recommendation(at(0), 9),))
    annotations = {HISTORY_ANNOTATION: json.dumps(render_history(annotated))}
    # Not yet in the status: carried, and the first reconcile writes it there.
    assert carried_history(kind="Autoscaler", status=None,
                           annotations=annotations) == (annotated, None)
    assert carried_history(kind="Autoscaler",
                           status={"history": render_history(status_history)},
                           annotations=annotations) == (status_history, status_history)
    assert carried_history(kind="HorizontalPodAutoscaler",
                           status={"history": render_history(status_history)},
                           annotations=annotations) == (annotated, annotated)


async def test_the_controller_continues_the_rate_limit_of_the_hpa_it_takes_over_from() -> None:
    """A native HPA (run by metricscale) at 5, Pods 1 per 60 s down: it steps to 4 at 0. The
    Autoscaler made from it at 30 with the hand-over annotation must wait for 60 as the HPA
    would have, where a fresh Autoscaler steps down at once."""
    world = World(replicas=5, qps="1", behavior=BEHAVIOR, kind="HorizontalPodAutoscaler")
    await world.reconciler.reconcile_once(HPA_KEY, at(0))
    assert world.kube.replicas(NS, "web") == 4
    hpa_entry = world.caches.get(HPA_KEY)
    assert hpa_entry is not None
    own = history_from_annotations(hpa_entry.annotations)
    handover = handover_history(annotated=own, current_replicas=4, rescales=(),
                                spec=spec(), now=at(30))
    world.caches.entries.pop(HPA_KEY)  # the HPA is deleted, and its controller forgets it
    world.reconciler.forget(HPA_KEY)
    seed = render_history_annotation(handover.history, now=at(30),
                                     horizon=timedelta(minutes=5))
    world.caches.put(autoscaler(behavior=BEHAVIOR, annotations={HISTORY_ANNOTATION: seed}))
    taking_over = world.new_reconciler()
    await taking_over.reconcile_once(KEY, at(30))
    assert world.kube.replicas(NS, "web") == 4
    assert world.conditions()["ScalingLimited"] == ("True", "ScaleDownLimit")
    assert world.status()["history"]["scaleDownEvents"]  # the status now holds the memory
    await taking_over.reconcile_once(KEY, at(61))
    assert world.kube.replicas(NS, "web") == 3

    fresh = World(replicas=4, qps="1", behavior=BEHAVIOR)
    await fresh.reconciler.reconcile_once(KEY, at(30))
    assert fresh.kube.replicas(NS, "web") == 3  # what a hand-over without the memory does
