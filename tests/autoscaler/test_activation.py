"""Activation and cooldown (KEDA's activationThreshold, cooldownPeriod and idleReplicaCount, as
`spec.idle` and `<source>.activationThreshold`): the idle size is left only when a metric is
active, returned to only after every metric has been inactive for the cooldown; between the
idle size and the active sizes the decision stays upstream's; without `spec.idle` nothing
changes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.model.history import parse_history, render_history
from tests.autoscaler import builders as b
from tests.autoscaler.reconcile_support import scenario

ZERO_ON = {**b.UPSTREAM_TEST_SETTINGS, "scaleToZero": True}


def queue(threshold: str | None = "0.5", *, target: str = "1") -> dict[str, Any]:
    """An External metric, 1 per pod as its target, active above `threshold`."""
    source: dict[str, Any] = {"metric": {"name": "qps"},
                              "target": {"type": "AverageValue", "averageValue": target}}
    if threshold is not None:
        source["activationThreshold"] = threshold
    return {"type": "External", "external": source}


def run(level_milli: int, *, current: int, idle: dict[str, Any] | None = None,
        threshold: str | None = "0.5", inactive_ago: float | None = None,
        min_replicas: int = 1, max_replicas: int = 10,
        run_settings: dict[str, Any] | None = None, **extra: Any) -> Any:
    history: dict[str, Any] = {"recommendations": []}
    if inactive_ago is not None:
        history["inactiveSince"] = b.ago(inactive_ago)
    return scenario(min_replicas=min_replicas, max_replicas=max_replicas, spec_replicas=current,
                    metrics=[queue(threshold)], metric_inputs=[b.external_metrics([level_milli])],
                    history=history, settings=ZERO_ON if run_settings is None else run_settings,
                    spec_extra={"idle": {"replicas": 0, "cooldownSeconds": 60} if idle is None
                                else idle}, **extra)


def condition(decision: Any, kind: str = "Active") -> tuple[str, str] | None:
    return next(((c.status, c.reason) for c in decision.status.conditions if c.type == kind),
                None)


def limits(decision: Any) -> list[tuple[str, int, int]]:
    return [(lim.rule, lim.from_replicas, lim.to_replicas) for lim in decision.limits]


# (what, total metric value in milli-units, current, seconds inactive before, expected size,
#  Active condition reason, a limit that applied)
CASES = [
    ("idle and inactive: stays at 0", 400, 0, None, 0, "ScalerNotActive", None),
    ("idle, at the threshold: still inactive", 500, 0, None, 0, "ScalerNotActive", None),
    ("idle and active: leaves 0", 600, 0, None, 1, "ScalerActive", None),
    ("idle and very active: upstream's size", 4000, 0, None, 4, "ScalerActive", None),
    ("running and active: upstream decides", 6000, 3, None, 6, "ScalerActive", None),
    ("running, inactive, cooldown not over: the active floor", 100, 3, 30, 1,
     "ScalerNotActive", None),
    ("running, inactive, cooldown over: idle", 100, 3, 61, 0, "ScalerNotActive",
     ("Cooldown", 1, 0)),
    ("running, just became inactive: the clock starts", 100, 2, None, 1, "ScalerNotActive",
     None),
]


@pytest.mark.parametrize(("what", "level", "current", "inactive_ago", "expected", "reason",
                          "limit"), CASES, ids=[c[0] for c in CASES])
def test_activation_and_cooldown(what: str, level: int, current: int,
                                 inactive_ago: float | None, expected: int, reason: str,
                                 limit: tuple[str, int, int] | None) -> None:
    decision = run(level, current=current, inactive_ago=inactive_ago)
    assert decision.desired_replicas == expected, decision.explanation
    assert condition(decision) == ("True" if reason == "ScalerActive" else "False", reason)
    if limit is not None:
        assert limit in limits(decision)


def test_the_inactive_clock_starts_when_no_metric_is_active_and_stops_when_one_is() -> None:
    decision = run(100, current=3)
    assert decision.history.inactive_since == b.NOW
    assert "inactiveSince" in render_history(decision.history)
    assert run(100, current=3, inactive_ago=20).history.inactive_since == \
        b.NOW - timedelta(seconds=20)
    assert run(900, current=3, inactive_ago=20).history.inactive_since is None


def test_an_idle_size_above_zero_needs_no_scale_to_zero_flag() -> None:
    idle = {"replicas": 1, "cooldownSeconds": 0}
    rests = run(100, current=1, idle=idle, min_replicas=2, run_settings=b.UPSTREAM_TEST_SETTINGS)
    assert rests.desired_replicas == 1 and condition(rests) == ("False", "ScalerNotActive")
    wakes = run(900, current=1, idle=idle, min_replicas=2,
                run_settings=b.UPSTREAM_TEST_SETTINGS)
    assert wakes.desired_replicas == 2 and condition(wakes) == ("True", "ScalerActive")
    sleeps = run(100, current=4, idle=idle, min_replicas=2,
                 run_settings=b.UPSTREAM_TEST_SETTINGS)
    assert sleeps.desired_replicas == 1


def test_idle_zero_without_the_scale_to_zero_flag_says_so_and_stays_upstream() -> None:
    decision = run(100, current=3, run_settings=b.UPSTREAM_TEST_SETTINGS)
    assert condition(decision) == ("False", "IdleNeedsScaleToZero")
    upstream = scenario(min_replicas=1, max_replicas=10, spec_replicas=3, metrics=[queue()],
                        metric_inputs=[b.external_metrics([100])],
                        history={"recommendations": []})
    assert decision.desired_replicas == upstream.desired_replicas


def test_without_a_threshold_any_value_above_zero_is_active() -> None:
    assert run(1, current=0, threshold=None).desired_replicas == 1
    assert run(0, current=0, threshold=None).desired_replicas == 0


def test_one_active_metric_of_two_is_enough() -> None:
    metrics = [queue("5"), queue("0.5")]
    decision = scenario(min_replicas=1, max_replicas=10, spec_replicas=0, metrics=metrics,
                        metric_inputs=[b.external_metrics([100]), b.external_metrics([900])],
                        history={"recommendations": []}, settings=ZERO_ON,
                        spec_extra={"idle": {"replicas": 0, "cooldownSeconds": 60}})
    assert decision.desired_replicas == 1
    assert condition(decision) == ("True", "ScalerActive")


def test_a_pods_metric_at_zero_pods_activates_to_the_active_floor() -> None:
    """Nothing runs, so a Pods metric has no value and is never active: a queue must wake the
    target; the floor is minReplicas when a metric is active."""
    metrics = [queue("0.5"), b.pods_metric("10")]
    decision = scenario(min_replicas=3, max_replicas=10, spec_replicas=0, metrics=metrics,
                        metric_inputs=[b.external_metrics([900]), {"error": "no pods"}],
                        history={"recommendations": []}, settings=ZERO_ON,
                        spec_extra={"idle": {"replicas": 0, "cooldownSeconds": 60}})
    assert decision.desired_replicas == 3


def test_explain_says_why() -> None:
    woke = run(600, current=0)
    assert any("Activation" in line for line in woke.explanation)
    slept = run(100, current=3, inactive_ago=61)
    assert any("cooldown" in line for line in slept.explanation)


def test_without_idle_nothing_changes() -> None:
    plain = scenario(min_replicas=1, max_replicas=10, spec_replicas=3, metrics=[queue()],
                     metric_inputs=[b.external_metrics([100])], history={"recommendations": []},
                     settings=ZERO_ON)
    assert condition(plain) is None
    assert plain.history.inactive_since is None
    assert "inactiveSince" not in render_history(plain.history)


def test_the_history_round_trips_with_its_inactive_clock() -> None:
    history = run(100, current=3, inactive_ago=20).history
    assert parse_history(render_history(history)) == history


@settings(max_examples=120, deadline=None)
@given(levels=st.lists(st.integers(0, 20000), min_size=1, max_size=3),
       thresholds=st.lists(st.sampled_from(["0", "0.5", "2", "10"]), min_size=3, max_size=3),
       current=st.integers(0, 8), inactive_ago=st.one_of(st.none(), st.floats(0, 600)),
       cooldown=st.integers(0, 300))
def test_never_scales_to_zero_while_a_metric_is_active(
        levels: list[int], thresholds: list[str], current: int, inactive_ago: float | None,
        cooldown: int) -> None:
    metrics = [queue(thresholds[i]) for i in range(len(levels))]
    history: dict[str, Any] = {"recommendations": []}
    if inactive_ago is not None:
        history["inactiveSince"] = b.ago(inactive_ago)
    decision = scenario(min_replicas=1, max_replicas=8, spec_replicas=current, metrics=metrics,
                        metric_inputs=[b.external_metrics([level]) for level in levels],
                        history=history, settings=ZERO_ON,
                        spec_extra={"idle": {"replicas": 0, "cooldownSeconds": cooldown}})
    active = any(level / 1000 > float(thresholds[i]) for i, level in enumerate(levels))
    if active:
        assert decision.desired_replicas >= 1
        assert condition(decision) == ("True", "ScalerActive")
    else:
        assert condition(decision) == ("False", "ScalerNotActive")
        if current == 0:
            assert decision.desired_replicas == 0
    assert 0 <= decision.desired_replicas <= 8
