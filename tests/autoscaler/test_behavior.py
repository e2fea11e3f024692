"""Stabilization, rate policies and scale events against upstream's horizontal_test.go tables."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from autoscaler.decision.behavior import (
    calculate_scale_down_limit,
    calculate_scale_up_limit,
    convert_desired_replicas_with_behavior_rate,
    convert_desired_replicas_with_rules,
    replicas_change_per_period,
    scale_up_limit,
    stabilize_recommendation,
    stabilize_recommendation_with_behaviors,
    store_scale_event,
)
from autoscaler.model.history import Recommendation, ScaleEvent
from autoscaler.model.objects import parse_autoscaler as _parse
from autoscaler.model.spec import Behavior, ScalingPolicy, ScalingRules
from tests.autoscaler import builders as b

NOW = b.NOW


def at(seconds_ago: float) -> Any:
    return NOW - timedelta(seconds=seconds_ago)


def uniform(changes: list[int], period: int) -> tuple[ScaleEvent, ...]:
    """generateEventsUniformDistribution: each event in the middle of its slice of the period."""
    segment = period / len(changes)
    return tuple(ScaleEvent(timestamp=at(int(period - segment * (i + 1) + segment / 2)),
                            replica_change=change) for i, change in enumerate(changes))


def behavior(up: dict[str, Any] | None = None, down: dict[str, Any] | None = None) -> Behavior:
    """A behavior as the API server defaults it (GenerateHPAScale{Up,Down}Rules)."""
    raw: dict[str, Any] = {}
    if up is not None:
        raw["scaleUp"] = up
    if down is not None:
        raw["scaleDown"] = down
    spec = _parse(b.hpa(behavior=raw)).spec
    assert spec.behavior is not None
    return spec.behavior


# --------------------------------------------------------------------------------------------
# Without behavior


@pytest.mark.parametrize(("current", "desired", "low", "high", "expected", "reason"), [
    (5, 7, 3, 8, 7, "DesiredWithinRange"),
    (3, 1, 2, 8, 2, "TooFewReplicas"),
    (1, 0, 0, 10, 0, "DesiredWithinRange"),
    (20, 1000, 1, 10, 10, "TooManyReplicas"),
    (3, 1000, 1, 2000, 24, "ScaleUpLimit"),  # calculateScaleUpLimit(3) with factor 8
])
def test_legacy_limits_match_upstream_with_its_test_factor(current: int, desired: int, low: int,
                                                           high: int, expected: int,
                                                           reason: str) -> None:
    result = convert_desired_replicas_with_rules(
        current_replicas=current, desired_replicas=desired, min_replicas=low, max_replicas=high,
        factor=8.0, minimum=4.0)
    assert (result.replicas, result.reason) == (expected, reason)


@pytest.mark.parametrize(("current", "expected"), [(0, 4), (1, 4), (2, 4), (3, 6), (10, 20)])
def test_default_scale_up_limit_is_twice_current_but_at_least_four(current: int,
                                                                   expected: int) -> None:
    assert scale_up_limit(current, factor=2.0, minimum=4.0) == expected


@pytest.mark.parametrize(("name", "recs", "desired", "expected", "length"), [
    ("empty log", [], 5, 5, 1),
    ("stabilize", [(4, 120), (5, 60)], 3, 5, 3),
    ("no stabilize", [(1, 120), (2, 60)], 3, 3, 3),
    ("no stabilize - old recommendations", [(10, 600), (9, 540)], 3, 3, 2),
    ("stabilize - old recommendations", [(10, 600), (4, 60), (5, 120), (9, 540)], 3, 5, 4),
])
def test_legacy_stabilization_matches_upstream(name: str, recs: list[tuple[int, int]],
                                               desired: int, expected: int, length: int) -> None:
    log = tuple(Recommendation(timestamp=at(s), replicas=r) for r, s in recs)
    result = stabilize_recommendation(log, desired=desired, window=timedelta(minutes=5), now=NOW)
    assert result.replicas == expected
    assert len(result.recommendations) == length
    assert result.reason == ("ReadyForNewScale" if expected == desired else "ScaleDownStabilized")


def test_legacy_stabilization_overwrites_the_last_old_entry() -> None:
    log = (Recommendation(at(600), 10), Recommendation(at(60), 4), Recommendation(at(540), 9))
    result = stabilize_recommendation(log, desired=3, window=timedelta(minutes=5), now=NOW)
    assert [(r.replicas, r.timestamp) for r in result.recommendations] == \
        [(10, at(600)), (4, at(60)), (3, NOW)]


# --------------------------------------------------------------------------------------------
# With behavior: stabilization (TestNormalizeDesiredReplicasWithBehavior)


@pytest.mark.parametrize(("name", "recs", "current", "desired", "expected", "stored", "up",
                          "down"), [
    ("empty recommendations for scaling down", [], 100, 5, 5, [5], 0, 0),
    ("simple scale down stabilization", [(4, 120), (5, 60)], 100, 3, 5, [4, 5, 3], 0, 180),
    ("simple scale up stabilization", [(4, 120), (5, 60)], 1, 7, 4, [4, 5, 7], 300, 0),
    ("no scale down stabilization", [(1, 120), (2, 60)], 100, 3, 3, [1, 2, 3], 300, 0),
    ("no scale up stabilization", [(4, 120), (5, 60)], 1, 3, 3, [4, 5, 3], 0, 300),
    ("no scale down stabilization, reuse recommendation element", [(10, 600), (9, 540)], 100,
     3, 3, [10, 3], 0, 0),
    ("no scale up stabilization, reuse recommendation element", [(10, 600), (9, 540)], 1, 100,
     100, [10, 100], 0, 0),
    ("scale down stabilization, reuse one of obsolete recommendation element",
     [(10, 600), (4, 60), (5, 120), (9, 540)], 100, 3, 5, [10, 4, 5, 3], 0, 180),
    ("scale up stabilization, reuse one of obsolete recommendation element",
     [(10, 6000), (6, 60), (5, 120), (9, 180)], 1, 100, 5, [100, 6, 5, 9], 300, 300),
    ("scale up and down stabilization, do not scale up when prenormalized rec goes down",
     [(2, 6000), (3, 180)], 2, 1, 2, None, 300, 300),
    ("scale up and down stabilization, do not scale down when prenormalized rec goes up",
     [(2, 6000), (1, 180)], 2, 3, 2, None, 300, 300),
])
def test_behavior_stabilization_matches_upstream(name: str, recs: list[tuple[int, int]],
                                                 current: int, desired: int, expected: int,
                                                 stored: list[int] | None, up: int,
                                                 down: int) -> None:
    log = tuple(Recommendation(timestamp=at(s), replicas=r) for r, s in recs)
    result = stabilize_recommendation_with_behaviors(
        log, desired=desired, current=current, up_window_seconds=up,
        down_window_seconds=down, now=NOW)
    assert result.replicas == expected
    if stored is not None:
        assert [r.replicas for r in result.recommendations] == stored


def test_behavior_stabilization_reasons() -> None:
    down = stabilize_recommendation_with_behaviors(
        (Recommendation(at(60), 5),), desired=3, current=6, up_window_seconds=0,
        down_window_seconds=300, now=NOW)
    up = stabilize_recommendation_with_behaviors(
        (Recommendation(at(60), 4),), desired=7, current=1, up_window_seconds=300,
        down_window_seconds=0, now=NOW)
    assert (down.reason, up.reason) == ("ScaleDownStabilized", "ScaleUpStabilized")
    assert up.message == ("recent recommendations were lower than current one, applying the "
                          "lowest recent recommendation")


# --------------------------------------------------------------------------------------------
# With behavior: rate policies (TestScalingWithRules)


def r(pods: int = 0, pods_period: int = 0, percent: int = 0, percent_period: int = 0,
      window: int = 0) -> dict[str, Any]:
    return b.rules(pods=pods, pods_period=pods_period, percent=percent,
                   percent_period=percent_period, window=window)


SCALING_WITH_RULES: list[tuple[str, dict[str, Any]]] = [
    ("prenormalized desired replicas within range",
     dict(current=5, desired=7, low=3, high=8, expected=7, reason="DesiredWithinRange")),
    ("prenormalized desired replicas < minReplicas",
     dict(current=3, desired=1, low=2, high=8, expected=2, reason="TooFewReplicas")),
    ("prenormalized desired replicas within range when minReplicas is 0",
     dict(current=1, desired=0, low=0, high=10, expected=0, reason="DesiredWithinRange")),
    ("maxReplicas is the limit because maxReplicas < scaleUpLimit",
     dict(current=20, desired=1000, low=1, high=10, expected=10, reason="TooManyReplicas")),
    ("desired replica count is more than the maximum replica count",
     dict(current=100, desired=1000, low=100, high=150, expected=150, reason="TooManyReplicas")),
    ("scaleUpLimit is the limit because scaleUpLimit < maxReplicas with user policies",
     dict(current=3, desired=1000, low=1, high=2000, expected=4, reason="ScaleUpLimit",
          up=r(percent=1, percent_period=60))),
    ("scaleUp with default behavior",
     dict(current=10, desired=50, low=1, high=1000, expected=20, reason="ScaleUpLimit")),
    ("scaleUp with pods policy larger than percent policy",
     dict(current=10, desired=500, low=1, high=1000, expected=110, reason="ScaleUpLimit",
          up=r(100, 60, 100, 60))),
    ("scaleUp with percent policy larger than pods policy",
     dict(current=10, desired=500, low=1, high=1000, expected=20, reason="ScaleUpLimit",
          up=r(2, 60, 100, 60))),
    ("scaleUp with spec MaxReplicas limitation with large pod policy",
     dict(current=10, desired=50, low=1, high=1000, expected=50, reason="DesiredWithinRange",
          up=r(100, 60))),
    ("scaleUp with spec MaxReplicas limitation with large percent policy",
     dict(current=10, desired=50, low=1, high=1000, expected=50, reason="DesiredWithinRange",
          up=r(10000, 60))),
    ("scaleUp with pod policy limitation",
     dict(current=10, desired=50, low=1, high=1000, expected=40, reason="ScaleUpLimit",
          up=r(30, 60))),
    ("scaleUp with percent policy limitation",
     dict(current=10, desired=50, low=1, high=1000, expected=30, reason="ScaleUpLimit",
          up=r(percent=200, percent_period=60))),
    ("scaleDown with percent policy larger than pod policy",
     dict(current=100, desired=2, low=1, high=1000, expected=80, reason="ScaleDownLimit",
          down=r(20, 60, 1, 60, 300))),
    ("scaleDown with pod policy larger than percent policy",
     dict(current=100, desired=2, low=1, high=1000, expected=98, reason="ScaleDownLimit",
          down=r(2, 60, 1, 60, 300))),
    ("scaleDown with spec MinReplicas limitation with large pod policy",
     dict(current=10, desired=0, low=1, high=1000, expected=1, reason="TooFewReplicas",
          down=r(100, 60, window=300))),
    ("scaleDown with spec MinReplicas limitation with large percent policy",
     dict(current=10, desired=2, low=5, high=1000, expected=5, reason="TooFewReplicas",
          down=r(percent=100, percent_period=60, window=300))),
    ("scaleDown with pod policy limitation",
     dict(current=10, desired=2, low=1, high=1000, expected=5, reason="ScaleDownLimit",
          down=r(5, 60, window=300))),
    ("scaleDown with percent policy limitation",
     dict(current=10, desired=5, low=1, high=1000, expected=5, reason="DesiredWithinRange",
          down=r(percent=50, percent_period=60, window=300))),
    ("scaleUp with spec MaxReplicas limitation with large pod policy and events",
     dict(current=100, desired=500, low=1, high=200, expected=200, reason="TooManyReplicas",
          up=r(300, 60), up_events=uniform([1, 5, 9], 120))),
    ("scaleUp with spec MaxReplicas limitation with large percent policy and events",
     dict(current=100, desired=500, low=1, high=200, expected=200, reason="TooManyReplicas",
          up=r(percent=10000, percent_period=60), up_events=uniform([1, 5, 9], 120))),
    ("scaleUp with currentReplicas limitation with rate.PeriodSeconds with a lot of recent "
     "scale up events",
     dict(current=100, desired=500, low=1, high=1000, expected=100, reason="ScaleUpLimit",
          up=r(5, 120), up_events=uniform([1, 5, 9], 120))),
    ("scaleUp with pod policy and previous scale up events",
     dict(current=100, desired=500, low=1, high=1000, expected=235, reason="ScaleUpLimit",
          up=r(150, 120), up_events=uniform([1, 5, 9], 120))),
    ("scaleUp with percent policy and previous scale up events",
     dict(current=100, desired=500, low=1, high=1000, expected=255, reason="ScaleUpLimit",
          up=r(percent=200, percent_period=120), up_events=uniform([1, 5, 9], 120))),
    ("scaleUp with percent policy and previous scale up and down events",
     dict(current=6, desired=24, low=1, high=1000, expected=16, reason="ScaleUpLimit",
          up=r(percent=300, percent_period=300), up_events=uniform([4], 120),
          down_events=uniform([2], 120))),
    ("scaleDown with default policy and previous events",
     dict(current=10, desired=5, low=1, high=1000, expected=5, reason="DesiredWithinRange",
          down_events=uniform([1, 5, 9], 120))),
    ("scaleDown with spec MinReplicas=nil limitation with large pod policy and previous events",
     dict(current=100, desired=0, low=1, high=1000, expected=1, reason="TooFewReplicas",
          down=r(115, 120, window=300), down_events=uniform([1, 5, 9], 120))),
    ("scaleDown with spec MinReplicas limitation with large pod policy and previous events",
     dict(current=100, desired=0, low=5, high=1000, expected=5, reason="TooFewReplicas",
          down=r(130, 120, window=300), down_events=uniform([1, 5, 9], 120))),
    ("scaleDown with spec MinReplicas limitation with large percent policy and previous events",
     dict(current=100, desired=2, low=5, high=1000, expected=5, reason="TooFewReplicas",
          down=r(percent=100, percent_period=120, window=300),
          down_events=uniform([1, 5, 9], 120))),
    ("scaleDown with pod policy limitation and previous events",
     dict(current=100, desired=2, low=1, high=1000, expected=100, reason="ScaleDownLimit",
          down=r(5, 120, window=300), down_events=uniform([1, 5, 9], 120))),
    ("scaleDown with percent policy limitation and previous events",
     dict(current=100, desired=0, low=1, high=1000, expected=56, reason="ScaleDownLimit",
          down=r(percent=50, percent_period=120, window=300),
          down_events=uniform([2, 4, 6], 120))),
    ("scaleDown with percent policy and previous scale up and down events",
     dict(current=10, desired=1, low=1, high=1000, expected=6, reason="ScaleDownLimit",
          down=r(percent=50, percent_period=180), up_events=uniform([2], 120),
          down_events=uniform([4], 120))),
    ("scaleDown with previous events preventing further scale down",
     dict(current=100, desired=0, low=1, high=1000, expected=100, reason="ScaleDownLimit",
          down=r(percent=10, percent_period=120, window=300),
          down_events=uniform([10, 10, 10], 120))),
    ("scaleDown with with previous events still allowing more scale down",
     dict(current=10, desired=5, low=1, high=1000, expected=5, reason="DesiredWithinRange",
          down=r(percent=1000, percent_period=120, window=300),
          down_events=uniform([10, 10, 10], 120))),
    ("check 'outdated' flag for events for one behavior for up",
     dict(current=100, desired=200, low=1, high=1000, expected=200, reason="DesiredWithinRange",
          up=r(1000, 60), up_events=uniform([8, 12, 9, 11], 120))),
    ("check that events were not marked 'outdated' for two different policies in the behavior "
     "for up",
     dict(current=100, desired=200, low=1, high=1000, expected=200, reason="DesiredWithinRange",
          up=r(1000, 120, 100, 60), up_events=uniform([8, 12, 9, 11], 120))),
    ("check that events were marked 'outdated' for two different policies in the behavior for up",
     dict(current=100, desired=200, low=1, high=1000, expected=200, reason="DesiredWithinRange",
          up=r(1000, 30, 100, 60), up_events=uniform([8, 12, 9, 11], 120))),
    ("check 'outdated' flag for events for one behavior for down",
     dict(current=100, desired=5, low=1, high=1000, expected=5, reason="DesiredWithinRange",
          down=r(1000, 60, window=300), down_events=uniform([8, 12, 9, 11], 120))),
    ("check that events were not marked 'outdated' for two different policies in the behavior "
     "for down",
     dict(current=100, desired=5, low=1, high=1000, expected=5, reason="DesiredWithinRange",
          down=r(1000, 120, 100, 60, 300), down_events=uniform([8, 12, 9, 11], 120))),
    ("check that events were marked 'outdated' for two different policies in the behavior for "
     "down",
     dict(current=100, desired=5, low=1, high=1000, expected=5, reason="DesiredWithinRange",
          down=r(1000, 30, 100, 60, 300), down_events=uniform([8, 12, 9, 11], 120))),
]


@pytest.mark.parametrize(("name", "case"), SCALING_WITH_RULES,
                         ids=[c[0] for c in SCALING_WITH_RULES])
def test_rate_policies_match_upstream(name: str, case: dict[str, Any]) -> None:
    result = convert_desired_replicas_with_behavior_rate(
        current_replicas=case["current"], desired_replicas=case["desired"],
        min_replicas=case["low"], max_replicas=case["high"],
        behavior=behavior(case.get("up", {}), case.get("down", {})),
        up_events=case.get("up_events", ()), down_events=case.get("down_events", ()), now=NOW)
    assert (result.replicas, result.reason) == (case["expected"], case["reason"])


MIN_POLICY = ScalingRules(stabilization_window_seconds=300, select_policy="Min",
                          policies=(ScalingPolicy("Pods", 2, 60), ScalingPolicy("Percent", 50, 60)))


def test_select_policy_min_picks_the_smallest_change() -> None:
    assert calculate_scale_up_limit(1, up_events=(), down_events=(), rules=MIN_POLICY,
                                    now=NOW) == 2
    assert calculate_scale_down_limit(5, up_events=(), down_events=(), rules=MIN_POLICY,
                                      now=NOW) == 3


def test_select_policy_disabled_allows_no_change_in_that_direction() -> None:
    disabled = ScalingRules(select_policy="Disabled", policies=(ScalingPolicy("Pods", 4, 15),))
    assert calculate_scale_up_limit(7, up_events=(), down_events=(), rules=disabled,
                                    now=NOW) == 7
    result = convert_desired_replicas_with_behavior_rate(
        current_replicas=7, desired_replicas=2, min_replicas=1, max_replicas=10,
        behavior=Behavior(scale_up=disabled, scale_down=disabled), up_events=(),
        down_events=(), now=NOW)
    assert (result.replicas, result.reason) == (7, "ScaleDownLimit")


def test_events_count_only_strictly_inside_the_period() -> None:
    events = (ScaleEvent(at(60), 5), ScaleEvent(at(59), 3), ScaleEvent(at(61), 100))
    assert replicas_change_per_period(60, events, now=NOW) == 3


# --------------------------------------------------------------------------------------------
# Scale events (TestStoreScaleEvents)

STORE_CASES: list[tuple[str, list[tuple[int, int]], list[tuple[int, bool]], dict[str, Any] | None,
                        int]] = [
    ("empty entries with default behavior", [], [], None, 0),
    ("empty entries with two-policy-behavior", [], [(5, False)], r(10, 60, 100, 60), 0),
    ("one outdated entry to be kept untouched without behavior", [(7, 61)], [(7, False)], None,
     0),
    ("one outdated entry to be replaced with behavior", [(7, 61)], [(5, False)],
     r(10, 60, 100, 60), 0),
    ("one actual entry to be not touched with behavior", [(7, 58)], [(7, False), (5, False)],
     r(10, 60, 100, 60), 7),
    ("two entries, one of them to be replaced", [(7, 61), (6, 59)], [(5, False), (6, False)],
     r(10, 60), 6),
    ("replace one entry, use policies with different periods",
     [(8, 29), (6, 59), (7, 61), (9, 61)], [(8, False), (6, False), (7, True), (5, False)],
     r(10, 60, 100, 30), 14),
    ("two entries, both actual", [(7, 58), (6, 59)], [(7, False), (6, False), (5, False)],
     r(10, 120, 100, 30), 13),
]


@pytest.mark.parametrize(("name", "previous", "stored", "rules_raw", "change"), STORE_CASES,
                         ids=[c[0] for c in STORE_CASES])
@pytest.mark.parametrize("direction", ["up", "down"])
def test_scale_events_are_stored_as_upstream_stores_them(
        name: str, previous: list[tuple[int, int]], stored: list[tuple[int, bool]],
        rules_raw: dict[str, Any] | None, change: int, direction: str) -> None:
    events = tuple(ScaleEvent(at(s), c) for c, s in previous)
    assert replicas_change_per_period(60, events, now=NOW) == change
    rules_behavior = None
    if rules_raw is not None:
        rules_behavior = behavior(up=rules_raw) if direction == "up" else behavior(down=rules_raw)
    up, down = store_scale_event(
        rules_behavior, up_events=events if direction == "up" else (),
        down_events=events if direction == "down" else (), previous_replicas=10,
        new_replicas=15 if direction == "up" else 5, now=NOW)
    result = up if direction == "up" else down
    if rules_raw is None:
        assert result == events  # without a behavior nothing is stored
        return
    assert [(e.replica_change, e.outdated) for e in result] == stored
