"""Pause by annotation: decided and reported, never written (or only in the allowed direction,
or once to a pinned size), with the Paused condition and its events; without the annotations
nothing of upstream's status changes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.decision.pause import (
    PAUSED,
    PAUSED_REPLICAS,
    PAUSED_SCALE_IN,
    PAUSED_SCALE_OUT,
    read_pause,
)
from tests.autoscaler.reconcile_support import conditions, scenario

ONE = "1.0"
# 3 pods at 500m of 1 core requested against a 30% target: upstream scales 3 -> 5.
UP = {"min_replicas": 2, "max_replicas": 6, "spec_replicas": 3, "cpu_target": 30,
      "levels": (300, 500, 700), "requests": [ONE] * 3}
# 5 pods at 100m against 50%: upstream scales 5 -> 2 (the window holds nothing back here).
DOWN = {"min_replicas": 2, "max_replicas": 6, "spec_replicas": 5, "cpu_target": 50,
        "levels": (100, 100, 100, 100, 100), "requests": [ONE] * 5, "recommendations": []}


def paused_condition(decision: Any) -> tuple[str, str, str] | None:
    return next(((c.status, c.reason, c.message) for c in decision.status.conditions
                 if c.type == "Paused"), None)


def events(decision: Any) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in decision.events]


def test_without_annotations_the_status_is_upstreams() -> None:
    decision = scenario(**UP)
    assert decision.new_replicas == 5 and decision.rescale
    assert scenario(**DOWN).new_replicas == 2
    assert paused_condition(decision) is None
    assert [c[0] for c in conditions(decision)] == ["AbleToScale", "ScalingActive",
                                                    "ScalingLimited"]


def test_paused_decides_and_reports_but_writes_nothing() -> None:
    decision = scenario(**UP, annotations={PAUSED: "true"})
    assert not decision.rescale and decision.desired_replicas == 3
    assert decision.status.desired_replicas == 5  # what would have happened
    assert paused_condition(decision) == ("True", "Paused",
                                          f"paused by annotation {PAUSED}")
    assert ("Normal", "Paused") in events(decision)
    assert [(lim.rule, lim.from_replicas, lim.to_replicas) for lim in decision.limits][-1] == (
        "Paused", 5, 3)
    assert any("would go from 3 to 5" in line for line in decision.explanation)
    # Metrics are still read and reported.
    assert decision.metrics[0].proposed_replicas == 5


def test_a_second_paused_sync_raises_no_new_event_and_resuming_does() -> None:
    first = scenario(**UP, annotations={PAUSED: "true"})
    again = scenario(**UP, annotations={PAUSED: "true"}, initial_conditions=[
        {"type": "Paused", "status": "True", "reason": "Paused", "message": "x",
         "lastTransitionTime": "2026-11-21T09:00:00Z"}])
    assert ("Normal", "Paused") in events(first)
    assert ("Normal", "Paused") not in events(again)
    resumed = scenario(**UP, initial_conditions=[
        {"type": "Paused", "status": "True", "reason": "Paused", "message": "x",
         "lastTransitionTime": "2026-11-21T09:00:00Z"}])
    assert ("Normal", "Resumed") in events(resumed)
    assert paused_condition(resumed) is None and resumed.new_replicas == 5


def test_paused_replicas_sets_the_size_once_then_holds_it() -> None:
    decision = scenario(**UP, annotations={PAUSED_REPLICAS: "4"})
    assert decision.rescale and decision.new_replicas == 4
    assert paused_condition(decision)[:2] == ("True", "PausedAtReplicas")  # type: ignore[index]
    held = scenario(**{**UP, "spec_replicas": 4, "levels": (900, 900, 900, 900),
                       "requests": [ONE] * 4}, annotations={PAUSED_REPLICAS: "4"})
    assert not held.rescale and held.desired_replicas == 4


def test_paused_replicas_applies_even_outside_min_and_max() -> None:
    decision = scenario(**UP, annotations={PAUSED_REPLICAS: "9"})
    assert decision.rescale and decision.new_replicas == 9


def test_paused_replicas_applies_when_metrics_fail() -> None:
    decision = scenario(**UP, annotations={PAUSED_REPLICAS: "4"}, metric_inputs=[
        {"error": "the metrics API is down"}])
    assert decision.rescale and decision.new_replicas == 4


@pytest.mark.parametrize(("case", "key", "written"), [
    (UP, PAUSED_SCALE_IN, 5),      # scale-in held, scale-out allowed
    (UP, PAUSED_SCALE_OUT, None),  # scale-out held
    (DOWN, PAUSED_SCALE_IN, None),
    (DOWN, PAUSED_SCALE_OUT, 2),
])
def test_one_direction_only(case: dict[str, Any], key: str, written: int | None) -> None:
    decision = scenario(**case, annotations={key: "true"})
    if written is None:
        assert not decision.rescale
        assert decision.desired_replicas == case["spec_replicas"]
    else:
        assert decision.rescale and decision.new_replicas == written


@pytest.mark.parametrize("case", [UP, DOWN], ids=["up", "down"])
def test_scale_in_and_scale_out_together_hold_both_directions(case: dict[str, Any]) -> None:
    # KEDA: each annotation disables its own direction of the HPA (selectPolicy: Disabled),
    # whatever the other one says; with both, the target moves neither way.
    decision = scenario(**case, annotations={PAUSED_SCALE_IN: "true", PAUSED_SCALE_OUT: "true"})
    assert not decision.rescale and not decision.scale_updated
    assert decision.desired_replicas == case["spec_replicas"]
    assert paused_condition(decision) == (
        "True", "ScaleInAndOutPaused", f"scale-in and scale-out are paused by annotations "
                                       f"{PAUSED_SCALE_IN} and {PAUSED_SCALE_OUT}")
    assert ("Normal", "ScaleInAndOutPaused") in events(decision)
    assert [lim.rule for lim in decision.limits][-1] == "Paused"


@pytest.mark.parametrize(("annotations", "problem"), [
    ({PAUSED: "yes"}, "is neither"), ({PAUSED_REPLICAS: "three"}, "is not a whole number"),
    ({PAUSED_SCALE_IN: "1"}, "is neither"),
    # a typo in one direction is not hidden by the other direction being set
    ({PAUSED_SCALE_IN: "true", PAUSED_SCALE_OUT: "ture"}, "is neither"),
    ({PAUSED_SCALE_OUT: "true", PAUSED_SCALE_IN: "yes"}, "is neither")])
def test_a_value_that_cannot_be_read_pauses_fully_and_says_why(
        annotations: dict[str, str], problem: str) -> None:
    decision = scenario(**UP, annotations=annotations)
    assert not decision.rescale
    status, reason, message = paused_condition(decision)  # type: ignore[misc]
    assert (status, reason) == ("True", "InvalidPauseAnnotation") and problem in message
    assert ("Warning", "InvalidPauseAnnotation") in events(decision)


def test_read_pause_precedence() -> None:
    both = {PAUSED: "true", PAUSED_SCALE_IN: "true", PAUSED_REPLICAS: "2"}
    pause = read_pause(both.get)
    assert pause is not None and pause.mode == "replicas"
    one_way = read_pause({PAUSED: "false", PAUSED_SCALE_OUT: "TRUE"}.get)
    assert one_way is not None and one_way.mode == "scale-out"
    both_ways = read_pause({PAUSED_SCALE_IN: "true", PAUSED_SCALE_OUT: "true"}.get)
    assert both_ways is not None and both_ways.mode == "scale-in-and-out"
    assert both_ways.holds(current=3, desired=5) and both_ways.holds(current=3, desired=2)
    assert not both_ways.holds(current=3, desired=3)
    one_off = read_pause({PAUSED_SCALE_IN: "true", PAUSED_SCALE_OUT: "false"}.get)
    assert one_off is not None and one_off.mode == "scale-in"
    fully = read_pause({PAUSED: "true", PAUSED_SCALE_IN: "true", PAUSED_SCALE_OUT: "true"}.get)
    assert fully is not None and fully.mode == "full"
    assert read_pause({}.get) is None


@settings(max_examples=60, deadline=None)
@given(replicas=st.integers(2, 6), level=st.integers(0, 2000),
       key=st.sampled_from([PAUSED, "invalid", "both directions"]))
def test_a_fully_paused_autoscaler_never_writes(replicas: int, level: int, key: str) -> None:
    annotations = {PAUSED: "true"} if key == PAUSED else {PAUSED: "maybe"} \
        if key == "invalid" else {PAUSED_SCALE_IN: "true", PAUSED_SCALE_OUT: "true"}
    decision = scenario(min_replicas=2, max_replicas=6, spec_replicas=replicas, cpu_target=50,
                        levels=(level,) * replicas, requests=[ONE] * replicas,
                        annotations=annotations)
    assert not decision.rescale and not decision.scale_updated
    assert decision.desired_replicas == replicas


def test_one_paused_replica_is_said_in_the_singular() -> None:
    one = read_pause({PAUSED_REPLICAS: "1"}.get)
    assert one is not None and one.message == f"paused at 1 replica by annotation {PAUSED_REPLICAS}"
    three = read_pause({PAUSED_REPLICAS: "3"}.get)
    assert three is not None and three.message.startswith("paused at 3 replicas by annotation")
