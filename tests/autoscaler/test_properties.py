"""Hypothesis properties of the decision: bounds, tolerance, policy limits, stabilization."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from autoscaler.decision.behavior import (
    stabilize_recommendation,
    stabilize_recommendation_with_behaviors,
)
from autoscaler.decision.decide import Decision
from autoscaler.decision.snapshot import decide_snapshot, parse_snapshot
from autoscaler.model.history import Recommendation
from tests.autoscaler import builders as b

PROFILE = settings(max_examples=120, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow])
DEFAULTS = {"tolerance": 0.1}


def decide_cpu(*, low: int, high: int, current: int, levels: list[int],
               behavior: dict[str, Any] | None = None, history: dict[str, Any] | None = None,
               target: int = 50) -> Decision:
    pods = b.controller_pods(["1"] * len(levels))
    metric = b.pod_metrics(b.controller_levels(*levels)) if levels else {"error": "none"}
    raw = b.snapshot(autoscaler=b.hpa(min_replicas=low, max_replicas=high,
                                      metrics=[b.cpu_utilization(target)], behavior=behavior,
                                      current=current),
                     scale_object=b.scale(current), pods=pods, metrics=[metric],
                     history=history, settings=DEFAULTS)
    return decide_snapshot(parse_snapshot(raw))


bounds = st.integers(min_value=0, max_value=6).flatmap(
    lambda low: st.tuples(st.just(low), st.integers(min_value=max(low, 1), max_value=20)))


@PROFILE
@given(bounds=bounds, current=st.integers(min_value=0, max_value=25),
       loads=st.lists(st.integers(min_value=0, max_value=4000), min_size=1, max_size=25),
       with_behavior=st.booleans(), first_sync=st.booleans())
def test_the_result_stays_within_min_and_max_or_follows_the_clamp_rules(
        bounds: tuple[int, int], current: int, loads: list[int], with_behavior: bool,
        first_sync: bool) -> None:
    low, high = bounds
    levels = loads[:current] if current else []
    decision = decide_cpu(low=low, high=high, current=current, levels=levels,
                          behavior={} if with_behavior else None,
                          history=None if first_sync else b.NO_RECOMMENDATIONS)
    if current == 0:
        assert decision.desired_replicas == 0  # scaling is disabled at zero
    elif current > high:
        assert decision.desired_replicas == high
    elif current < low:
        assert decision.desired_replicas == low
    else:
        assert low <= decision.desired_replicas <= high


@PROFILE
@given(target=st.integers(min_value=100, max_value=100_000),
       permille=st.integers(min_value=900, max_value=1100),
       count=st.integers(min_value=1, max_value=12),
       transfers=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11),
                                    st.floats(min_value=0, max_value=1)), max_size=10),
       with_behavior=st.booleans())
def test_no_change_inside_the_tolerance(target: int, permille: int, count: int,
                                        transfers: list[tuple[int, int, float]],
                                        with_behavior: bool) -> None:
    average = target * permille // 1000
    assume(0.9 <= average / target <= 1.1)
    values = [average] * count
    for source, sink, share in transfers:  # spread the load, keeping the sum (and the average)
        source, sink = source % count, sink % count
        amount = int(values[source] * share)
        values[source] -= amount
        values[sink] += amount
    current = count
    raw = b.snapshot(
        autoscaler=b.hpa(min_replicas=1, max_replicas=100,
                         metrics=[b.pods_metric(f"{target}m")], current=current,
                         behavior={} if with_behavior else None),
        scale_object=b.scale(current), pods=b.controller_pods(["1"] * current),
        metrics=[b.custom_metrics(values)], history=b.NO_RECOMMENDATIONS, settings=DEFAULTS)
    decision = decide_snapshot(parse_snapshot(raw))
    assert decision.desired_replicas == current and not decision.rescale


policy_kind = st.sampled_from(["Pods", "Percent"])


@PROFILE
@given(current=st.integers(min_value=1, max_value=40),
       loads=st.lists(st.integers(min_value=0, max_value=5000), min_size=40, max_size=40),
       kind=policy_kind, value=st.integers(min_value=1, max_value=300),
       up_events=st.lists(st.tuples(st.integers(1, 10), st.integers(0, 119)), max_size=3),
       down_events=st.lists(st.tuples(st.integers(1, 10), st.integers(0, 119)), max_size=3))
def test_a_policy_never_allows_more_change_than_its_limit(
        current: int, loads: list[int], kind: str, value: int,
        up_events: list[tuple[int, int]], down_events: list[tuple[int, int]]) -> None:
    period = 60
    policy = {"type": kind, "value": value, "periodSeconds": period}
    behavior = {"scaleUp": {"policies": [policy], "stabilizationWindowSeconds": 0},
                "scaleDown": {"policies": [policy], "stabilizationWindowSeconds": 0}}
    history = {"recommendations": [],
               "scaleUpEvents": [{"timestamp": b.ago(s), "replicaChange": c}
                                 for c, s in up_events],
               "scaleDownEvents": [{"timestamp": b.ago(s), "replicaChange": c}
                                   for c, s in down_events]}
    decision = decide_cpu(low=1, high=1000, current=current, levels=loads[:current],
                          behavior=behavior, history=history)
    desired = decision.desired_replicas
    added = sum(c for c, s in up_events if s < period)
    removed = sum(c for c, s in down_events if s < period)
    start = current - added + removed  # the size at the start of the period
    if desired > current:
        allowed = start + value if kind == "Pods" else math.ceil(start * (1 + value / 100))
        assert desired <= max(allowed, current)
    elif desired < current:
        allowed = start - value if kind == "Pods" else int(start * (1 - value / 100))
        assert desired >= min(max(allowed, 1), current)


recommendation = st.tuples(st.integers(min_value=0, max_value=50),
                           st.integers(min_value=0, max_value=900))


@PROFILE
@given(recs=st.lists(recommendation, max_size=8), desired=st.integers(0, 50),
       window=st.integers(min_value=0, max_value=600))
def test_legacy_stabilization_never_goes_below_the_windows_maximum(
        recs: list[tuple[int, int]], desired: int, window: int) -> None:
    log = tuple(Recommendation(timestamp=b.NOW - timedelta(seconds=s), replicas=r)
                for r, s in recs)
    result = stabilize_recommendation(log, desired=desired, window=timedelta(seconds=window),
                                      now=b.NOW)
    in_window = [r for r, s in recs if s <= window]
    assert result.replicas == max([desired, *in_window])


@PROFILE
@given(recs=st.lists(recommendation, max_size=8), desired=st.integers(0, 50),
       current=st.integers(0, 50), up=st.integers(0, 600), down=st.integers(0, 600))
def test_behavior_stabilization_never_scales_down_past_the_windows_maximum(
        recs: list[tuple[int, int]], desired: int, current: int, up: int, down: int) -> None:
    log = tuple(Recommendation(timestamp=b.NOW - timedelta(seconds=s), replicas=r)
                for r, s in recs)
    result = stabilize_recommendation_with_behaviors(
        log, desired=desired, current=current, up_window_seconds=up, down_window_seconds=down,
        now=b.NOW)
    down_max = max([desired, *(r for r, s in recs if s < down)])
    up_min = min([desired, *(r for r, s in recs if s < up)])
    assert result.replicas >= min(current, down_max)
    assert result.replicas <= max(current, up_min)


@PROFILE
@given(current=st.integers(min_value=2, max_value=20),
       loads=st.lists(st.integers(min_value=0, max_value=400), min_size=20, max_size=20),
       recs=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 299)), min_size=1, max_size=5))
def test_a_decision_never_scales_down_past_the_windows_maximum(
        current: int, loads: list[int], recs: list[tuple[int, int]]) -> None:
    history = {"recommendations": [{"timestamp": b.ago(s), "replicas": r} for r, s in recs]}
    decision = decide_cpu(low=1, high=1000, current=current, levels=loads[:current],
                          history=history)
    window_max = max(r for r, _ in recs)
    if decision.desired_replicas < current:
        assert decision.desired_replicas >= window_max
