"""One reconcile against upstream's horizontal_test.go scenarios, as numbers.

Upstream's controller tests run with tolerance 0.1, a 2 min cpu initialization period, a 10 s
readiness delay, a 5 min downscale window and scaleUpLimitFactor 8 (set in the test's init);
`reconcile_support.scenario` builds the same fixtures (pods with the request split over two
containers, metrics with each container at half the level) as wire-format objects.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.autoscaler import builders as b
from tests.autoscaler.reconcile_support import STATUS_OK, conditions, ok_with, scenario

T, F = "True", "False"
R = "Running"
ONE = "1.0"
READY_FOR_NEW_SCALE = ("AbleToScale", T, "ReadyForNewScale")
GOT_SCALE_ONLY = [("AbleToScale", T, "SucceededGetScale")]
DISABLED = [("AbleToScale", T, "SucceededGetScale"), ("ScalingActive", F, "ScalingDisabled")]
SCALED_TO_ZERO_TRUE = {"type": "ScaledToZero", "status": "True", "reason": "ScaledToZero",
                       "lastTransitionTime": b.ago(600)}


# --------------------------------------------------------------------------------------------
# cpu


CPU_CASES: list[tuple[str, dict[str, Any], int]] = [
    ("scale up", dict(levels=(300, 500, 700), requests=[ONE] * 3), 5),
    ("unready pods make the scale-up smaller",
     dict(levels=(300, 500, 700), requests=[ONE] * 3, readiness=(F, T, T)), 4),
    ("hot cpu pods make the scale-up smaller",
     dict(levels=(300, 500, 700), requests=[ONE] * 3, start=(b.hot(), b.cool(), b.cool())), 4),
    ("failed pods are ignored on scale-up",
     dict(spec_replicas=2, levels=(500, 700), requests=[ONE] * 4, readiness=(T, T, F, F),
          phase=(R, R, "Failed", "Failed")), 4),
    ("pods being deleted are ignored on scale-up",
     dict(spec_replicas=2, levels=(500, 700), requests=[ONE] * 4, readiness=(T, T, F, F),
          deleted=(False, False, True, True)), 4),
    ("unready pods keep utilization within target: no scale-up",
     dict(levels=(400, 500, 700), requests=[ONE] * 3, readiness=(T, F, F)), 3),
    ("hot cpu pods keep utilization within target: no scale-up",
     dict(levels=(400, 500, 700), requests=[ONE] * 3, readiness=(T, F, F),
          start=(b.cool(), b.hot(), b.hot())), 3),
    ("conflict retried, then scale up",
     dict(cpu_target=50, levels=(600, 700, 800), requests=[ONE] * 3), 5),
]


@pytest.mark.parametrize(("name", "fixture", "expected"), CPU_CASES, ids=[c[0] for c in CPU_CASES])
def test_cpu_scale_up_matches_upstream(name: str, fixture: dict[str, Any], expected: int) -> None:
    args: dict[str, Any] = dict(min_replicas=2, max_replicas=6, spec_replicas=3, cpu_target=30)
    args.update(fixture)
    decision = scenario(**args)
    assert decision.desired_replicas == expected
    assert decision.status.desired_replicas == expected
    if expected == args["spec_replicas"]:
        assert not decision.scale_updated
        assert conditions(decision) == ok_with(READY_FOR_NEW_SCALE)
    else:
        assert decision.scale_updated
        assert conditions(decision) == STATUS_OK


def test_cpu_status_reports_the_ready_pods_utilization() -> None:
    decision = scenario(min_replicas=2, max_replicas=6, spec_replicas=3, cpu_target=30,
                        levels=(400, 500, 700), requests=[ONE] * 3, readiness=(T, F, F))
    current = decision.status.current_metrics[0]
    assert current.resource is not None and current.resource.current.average_utilization == 40
    assert current.resource.current.average_value is not None
    assert current.resource.current.average_value.text == "400m"


SCALE_DOWN = dict(min_replicas=2, max_replicas=6, spec_replicas=5, cpu_target=50,
                  levels=(100, 300, 500, 250, 250), recommendations=[])

CPU_DOWN_CASES: list[tuple[str, dict[str, Any], int]] = [
    ("scale down", dict(requests=[ONE] * 5), 3),
    ("scale down leaves unready pods out",
     dict(requests=[ONE] * 5, readiness=(T, T, T, F, F)), 2),
    ("scale down leaves hot cpu pods out",
     dict(requests=[ONE] * 5, start=(b.cool(), b.cool(), b.cool(), b.hot(), b.hot())), 2),
    ("scale down ignores failed pods",
     dict(requests=[ONE] * 7, readiness=(T,) * 5 + (F, F), phase=(R,) * 5 + ("Failed",) * 2), 3),
    ("scale down ignores pods being deleted",
     dict(requests=[ONE] * 7, readiness=(T,) * 5 + (F, F), deleted=(False,) * 5 + (True,) * 2),
     3),
]


@pytest.mark.parametrize(("name", "fixture", "expected"), CPU_DOWN_CASES,
                         ids=[c[0] for c in CPU_DOWN_CASES])
def test_cpu_scale_down_matches_upstream(name: str, fixture: dict[str, Any],
                                         expected: int) -> None:
    decision = scenario(**{**SCALE_DOWN, **fixture})
    assert (decision.desired_replicas, decision.scale_updated) == (expected, True)
    assert conditions(decision) == STATUS_OK


def test_first_sync_holds_a_scale_down_for_the_stabilization_window() -> None:
    # TestScaleDownStabilizeInitialSize: no recommendations yet
    decision = scenario(**{**SCALE_DOWN, "recommendations": None, "requests": [ONE] * 5})
    assert decision.desired_replicas == 5 and not decision.scale_updated
    assert conditions(decision) == ok_with(("AbleToScale", T, "ScaleDownStabilized"))
    assert [limit.rule for limit in decision.limits] == ["ScaleDownStabilization"]
    assert [r.replicas for r in decision.history.recommendations or ()] == [5, 3]


@pytest.mark.parametrize(("container", "target", "spec", "levels", "expected"), [
    ("container1", 30, 3, (300, 500, 700), 5),
    ("container2", 50, 5, (100, 300, 500, 250, 250), 3),
])
def test_container_resource_metric_matches_upstream(container: str, target: int, spec: int,
                                                    levels: tuple[int, ...],
                                                    expected: int) -> None:
    metric = {"type": "ContainerResource", "containerResource": {
        "name": "cpu", "container": container,
        "target": {"type": "Utilization", "averageUtilization": target}}}
    decision = scenario(min_replicas=2, max_replicas=6, spec_replicas=spec, metrics=[metric],
                        levels=levels, requests=[ONE] * spec, recommendations=[])
    assert decision.desired_replicas == expected
    assert decision.events[-1].message.endswith(
        "" if expected < spec else
        "cpu container resource utilization (percentage of request) above target")


# --------------------------------------------------------------------------------------------
# custom metrics


PODS_15 = b.pods_metric("15.0")


@pytest.mark.parametrize(("name", "fixture", "expected", "limited"), [
    ("scale up on a pods metric", dict(levels=(20000, 10000, 30000)), 4, False),
    ("unready and hot cpu pods do not reduce a pods metric's scale",
     dict(levels=(50000, 10000, 30000), readiness=(T, T, F),
          start=(b.cool(), b.cool(), b.hot())), 6, False),
    ("unready and hot cpu pods scale to max, ScalingLimited TooManyReplicas",
     dict(levels=(50000, 15000, 30000), readiness=(F, T, F), start=(b.hot(), b.cool(), b.hot())),
     6, True),
])
def test_pods_metric_scale_up_matches_upstream(name: str, fixture: dict[str, Any], expected: int,
                                               limited: bool) -> None:
    decision = scenario(min_replicas=2, max_replicas=6, spec_replicas=3, metrics=[PODS_15],
                        requests=[ONE] * 3, **fixture)
    assert decision.desired_replicas == expected
    wanted = ok_with(("ScalingLimited", T, "TooManyReplicas")) if limited else STATUS_OK
    assert conditions(decision) == wanted


@pytest.mark.parametrize(("name", "metric", "levels", "spec", "expected"), [
    ("object metric with a Value target scales up", b.object_value("15.0"), (20000,), 3, 4),
    ("object metric with an AverageValue target scales up", b.object_average("10.0"), (40000,),
     3, 4),
    ("external metric with a Value target scales up", b.external_value("6666m"), (8600,), 3, 4),
    ("external metric with an AverageValue target scales up", b.external_average("2222m"),
     (8600,), 3, 4),
    ("pods metric scales down", b.pods_metric("20.0"), (12000,) * 5, 5, 3),
    ("object metric with a Value target scales down", b.object_value("20.0"), (12000,), 5, 3),
    ("object metric with an AverageValue target scales down", b.object_average("20.0"),
     (60000,), 5, 3),
    ("external metric with a Value target scales down", b.external_value("14400m"), (8600,), 5,
     3),
    ("external metric with an AverageValue target scales down", b.external_average("3000m"),
     (8600,), 5, 3),
])
def test_custom_and_external_metrics_match_upstream(name: str, metric: dict[str, Any],
                                                    levels: tuple[int, ...], spec: int,
                                                    expected: int) -> None:
    decision = scenario(min_replicas=2, max_replicas=6, spec_replicas=spec, metrics=[metric],
                        levels=levels, requests=[ONE] * spec, recommendations=[])
    assert decision.desired_replicas == expected
    assert conditions(decision) == STATUS_OK


@pytest.mark.parametrize(("name", "metric", "levels", "spec"), [
    ("cpu", None, (1010, 1030, 1020), 3),
    ("pods metric", b.pods_metric("20.0"), (20000, 20001, 21000), 3),
    ("object metric with a Value target", b.object_value("20.0"), (20050,), 3),
    ("external metric with a Value target", b.external_value("8666m"), (8600,), 4),
    ("object metric with an AverageValue target", b.object_average("2200m"), (8600,), 4),
    ("external metric with an AverageValue target", b.external_average("2200m"), (8600,), 4),
])
def test_no_scaling_within_the_tolerance(name: str, metric: dict[str, Any] | None,
                                         levels: tuple[int, ...], spec: int) -> None:
    decision = scenario(min_replicas=1, max_replicas=6, spec_replicas=spec,
                        cpu_target=100 if metric is None else 0,
                        metrics=[metric] if metric is not None else [], levels=levels,
                        requests=["0.9", "1.0", "1.1"] if metric is None else [ONE] * spec)
    assert decision.desired_replicas == spec and not decision.scale_updated
    assert conditions(decision) == ok_with(READY_FOR_NEW_SCALE)


@pytest.mark.parametrize(("name", "behavior", "levels", "requests", "expected", "reason"), [
    ("a 1% scale-up tolerance scales up", {"scaleUp": {"tolerance": "0.01"}},
     (1010, 1030, 1020), ["0.9", "1.0", "1.1"], 4, "SucceededRescale"),
    ("a 90% scale-down tolerance holds a scale-down", {"scaleDown": {"tolerance": "0.9"}},
     (300, 300, 300), [ONE] * 3, 3, "ReadyForNewScale"),
    ("the default tolerance holds a small scale-up", None, (1010, 1030, 1020),
     ["0.9", "1.0", "1.1"], 3, "ReadyForNewScale"),
])
def test_configurable_tolerance_matches_upstream(name: str, behavior: dict[str, Any] | None,
                                                 levels: tuple[int, ...], requests: list[str],
                                                 expected: int, reason: str) -> None:
    decision = scenario(min_replicas=1, max_replicas=5, spec_replicas=3, cpu_target=100,
                        levels=levels, requests=requests, behavior=behavior)
    assert decision.desired_replicas == expected
    assert conditions(decision) == ok_with(("AbleToScale", T, reason))


# --------------------------------------------------------------------------------------------
# min, max, and zero


@pytest.mark.parametrize(("name", "fixture", "expected", "wanted"), [
    ("scale down is clamped to minReplicas",
     dict(min_replicas=2, spec_replicas=3, levels=(10, 95, 10), requests=["0.9", "1.0", "1.1"],
          recommendations=[]), 2, ok_with(("ScalingLimited", T, "TooFewReplicas"))),
    ("scale down to zero when minReplicas is zero",
     dict(min_replicas=0, spec_replicas=3, levels=(0, 0, 0), requests=["0.9", "1.0", "1.1"],
          recommendations=[]), 0, STATUS_OK),
    ("scale down is clamped to min when the metrics want zero",
     dict(min_replicas=2, spec_replicas=3, levels=(0, 0, 0), requests=["0.9", "1.0", "1.1"],
          recommendations=[]), 2, ok_with(("ScalingLimited", T, "TooFewReplicas"))),
    ("no scaling while spec.replicas is zero",
     dict(min_replicas=3, spec_replicas=0, requests=[]), 0, DISABLED),
    ("below minReplicas: scale to min without metrics",
     dict(min_replicas=3, spec_replicas=2, requests=[]), 3,
     [("AbleToScale", T, "SucceededRescale")]),
    ("above maxReplicas: scale to max without metrics",
     dict(min_replicas=3, spec_replicas=10, requests=[]), 5,
     [("AbleToScale", T, "SucceededRescale")]),
    ("scale up is clamped to maxReplicas",
     dict(min_replicas=2, spec_replicas=3, levels=(8000, 9500, 1000),
          requests=["0.9", "1.0", "1.1"]), 5, ok_with(("ScalingLimited", T, "TooManyReplicas"))),
])
def test_replica_limits_match_upstream(name: str, fixture: dict[str, Any], expected: int,
                                       wanted: list[tuple[str, str, str]]) -> None:
    decision = scenario(max_replicas=5, cpu_target=90, **fixture)
    assert decision.desired_replicas == expected
    assert conditions(decision) == wanted
    if fixture["spec_replicas"] in (2, 10):
        assert decision.status.current_metrics == ()
        reason = "below Spec.MinReplicas" if expected == 3 else "above Spec.MaxReplicas"
        assert decision.events[-1].message == \
            f"New size: {expected}; reason: Current number of replicas {reason}"


def test_rc_below_min_and_above_max_scale_immediately_despite_a_recent_scale() -> None:
    up = scenario(min_replicas=2, max_replicas=6, spec_replicas=1, levels=(0, 0, 0, 0),
                  requests=[ONE] * 4, last_scale_time=b.ts(b.NOW))
    down = scenario(min_replicas=2, max_replicas=5, spec_replicas=6, cpu_target=50,
                    levels=(8000, 9500, 1000), requests=["0.9", "1.0", "1.1"],
                    last_scale_time=b.ts(b.NOW))
    assert (up.desired_replicas, down.desired_replicas) == (2, 5)
    assert conditions(up) == conditions(down) == [("AbleToScale", T, "SucceededRescale")]


ON = {**b.UPSTREAM_TEST_SETTINGS, "scaleToZero": True}
OFF = b.UPSTREAM_TEST_SETTINGS


@pytest.mark.parametrize(("name", "metric", "settings", "expected", "wanted"), [
    ("object metric scales to zero, ScaledToZero set", b.object_value("20.0"), ON, 0,
     ok_with(("ScaledToZero", T, "ScaledToZero"))),
    ("object metric scales to zero without the setting, no ScaledToZero",
     b.object_value("20.0"), OFF, 0, STATUS_OK),
    ("external metric scales to zero, ScaledToZero set", b.external_value("14400m"), ON, 0,
     ok_with(("ScaledToZero", T, "ScaledToZero"))),
    ("external metric scales to zero without the setting", b.external_value("14400m"), OFF, 0,
     STATUS_OK),
])
def test_scale_to_zero_matches_upstream(name: str, metric: dict[str, Any],
                                        settings: dict[str, Any], expected: int,
                                        wanted: list[tuple[str, str, str]]) -> None:
    decision = scenario(min_replicas=0, max_replicas=6, spec_replicas=5, metrics=[metric],
                        levels=(0,), requests=[ONE] * 5, recommendations=[], settings=settings)
    assert decision.desired_replicas == expected
    assert conditions(decision) == wanted


@pytest.mark.parametrize(("name", "fixture", "settings", "expected", "wanted"), [
    ("scales up from zero with the setting", dict(metrics=[b.object_value("15.0")],
                                                  levels=(20000,)), ON, 2,
     [("ScaledToZero", F, "NotScaledToZero"), *STATUS_OK]),
    ("stays at zero without the setting", dict(metrics=[b.object_value("15.0")],
                                               levels=(20000,)), OFF, 0, DISABLED),
    ("scaling up from zero ignores the tolerance", dict(metrics=[b.object_value("1.0")],
                                                        levels=(1000,)), ON, 1,
     [("ScaledToZero", F, "NotScaledToZero"), *STATUS_OK]),
    ("minReplicas raised while at zero: scale to min",
     dict(min_replicas=2, metrics=[b.object_value("15000m")], levels=(10000,)), ON, 2,
     [("ScaledToZero", F, "NotScaledToZero"), ("AbleToScale", T, "SucceededRescale"),
      ("ScalingActive", T, "ValidMetricFound"), ("ScalingLimited", T, "TooFewReplicas")]),
    ("minReplicas raised while at zero, without the setting: disabled",
     dict(min_replicas=2, metrics=[b.object_value("15000m")], levels=(10000,)), OFF, 0,
     DISABLED),
])
def test_scale_from_zero_matches_upstream(name: str, fixture: dict[str, Any],
                                          settings: dict[str, Any], expected: int,
                                          wanted: list[tuple[str, str, str]]) -> None:
    args: dict[str, Any] = dict(min_replicas=0, max_replicas=6, spec_replicas=0, requests=[],
                                initial_conditions=[SCALED_TO_ZERO_TRUE], settings=settings)
    args.update(fixture)
    decision = scenario(**args)
    assert decision.desired_replicas == expected
    assert conditions(decision) == wanted


@pytest.mark.parametrize("settings", [ON, OFF], ids=["setting on", "setting off"])
def test_zero_replicas_without_scaled_to_zero_disable_scaling(settings: dict[str, Any]) -> None:
    manual = scenario(min_replicas=1, max_replicas=6, spec_replicas=0, cpu_target=50, requests=[],
                      settings=settings)
    object_metric = scenario(min_replicas=0, max_replicas=6, spec_replicas=0, requests=[],
                             metrics=[b.object_value("15.0")], levels=(20000,),
                             settings=settings)
    cheddar = scenario(min_replicas=0, max_replicas=6, spec_replicas=0, cpu_target=30,
                       metrics=[{"type": "CheddarCheese"}], levels=(300, 400, 500),
                       requests=[ONE] * 3, recommendations=[], settings=settings)
    for decision in (manual, object_metric, cheddar):
        assert decision.desired_replicas == 0 and not decision.rescale
        assert conditions(decision) == DISABLED


@pytest.mark.parametrize("settings", [ON, OFF], ids=["setting on", "setting off"])
def test_scaled_to_zero_is_updated_or_removed_on_a_normal_rescale(
        settings: dict[str, Any]) -> None:
    decision = scenario(min_replicas=1, max_replicas=6, spec_replicas=3, cpu_target=30,
                        levels=(300, 500, 700), requests=[ONE] * 3,
                        initial_conditions=[SCALED_TO_ZERO_TRUE], settings=settings)
    assert decision.desired_replicas == 5
    if settings is ON:
        assert conditions(decision) == [("ScaledToZero", F, "NotScaledToZero"), *STATUS_OK]
    else:
        assert conditions(decision) == STATUS_OK


# --------------------------------------------------------------------------------------------
# edge cases of metrics


def test_superfluous_metrics_are_counted_and_the_result_clamped_to_max() -> None:
    decision = scenario(min_replicas=2, max_replicas=6, spec_replicas=4, cpu_target=100,
                        levels=(4000, 9500, 3000, 7000, 3200, 2000), requests=[ONE] * 4)
    assert decision.desired_replicas == 6
    assert conditions(decision) == ok_with(("ScalingLimited", T, "TooManyReplicas"))
    assert decision.metrics[0].proposed_replicas == 24


def test_pods_missing_metrics_count_at_their_request_on_scale_down() -> None:
    decision = scenario(min_replicas=2, max_replicas=6, spec_replicas=4, cpu_target=100,
                        levels=(400, 95), requests=[ONE] * 4, recommendations=[])
    assert decision.desired_replicas == 3
    assert "MissingMetricsRebalancing" in {limit.rule for limit in decision.limits}


def test_one_pod_reporting_for_four_replicas_scales_down_to_two() -> None:
    # TestCPUScalingEdgeCases "missing reports from some pods": only one pod is listed
    decision = scenario(min_replicas=1, max_replicas=5, spec_replicas=4, cpu_target=50,
                        levels=(200,), requests=["0.2"], recommendations=[])
    assert decision.desired_replicas == 2


def test_more_status_replicas_than_spec_do_not_scale() -> None:
    decision = scenario(min_replicas=1, max_replicas=8, spec_replicas=4, status_replicas=5,
                        cpu_target=50, levels=(500,) * 5, requests=["1"] * 5)
    assert decision.desired_replicas == 4 and not decision.rescale
    assert conditions(decision) == ok_with(READY_FOR_NEW_SCALE)


def test_upscale_is_capped_by_a_scale_up_policy_or_by_max() -> None:
    up = {"scaleUp": b.rules(percent=700, percent_period=60)}
    capped = scenario(min_replicas=1, max_replicas=100, spec_replicas=3, cpu_target=10,
                      levels=(100, 200, 300), requests=["0.1"] * 3, behavior=up)
    to_max = scenario(min_replicas=1, max_replicas=20, spec_replicas=3, cpu_target=10,
                      levels=(100, 200, 300), requests=["0.1"] * 3, behavior=up)
    assert capped.desired_replicas == 24
    assert conditions(capped) == ok_with(("ScalingLimited", T, "ScaleUpLimit"))
    assert [(lim.rule, lim.from_replicas, lim.to_replicas) for lim in capped.limits] == \
        [("ScaleUpPolicy", 60, 24)]
    assert to_max.desired_replicas == 20
    assert conditions(to_max) == ok_with(("ScalingLimited", T, "TooManyReplicas"))


def test_event_message_on_a_scale_up_is_upstreams() -> None:
    decision = scenario(min_replicas=1, max_replicas=5, spec_replicas=1, cpu_target=50,
                        levels=(200,), requests=["0.2"])
    assert [(e.type, e.reason, e.message) for e in decision.events] == [
        ("Normal", "SuccessfulRescale",
         "New size: 2; reason: cpu resource utilization (percentage of request) above target")]


def test_no_event_without_a_change() -> None:
    decision = scenario(min_replicas=1, max_replicas=5, spec_replicas=2, cpu_target=50,
                        levels=(200, 200), requests=["0.4", "0.4"])
    assert decision.events == () and decision.desired_replicas == 2


def test_scale_down_event_says_all_metrics_below_target() -> None:
    decision = scenario(**{**SCALE_DOWN, "requests": [ONE] * 5})
    assert decision.events[-1].message == "New size: 3; reason: All metrics below target"


def test_no_backoff_after_a_recent_scale_and_the_max_over_metrics() -> None:
    now = b.ts(b.NOW)
    pods_only = scenario(min_replicas=1, max_replicas=5, spec_replicas=3, metrics=[PODS_15],
                         levels=(20000, 10000, 30000), requests=[ONE] * 3, last_scale_time=now)
    both = scenario(min_replicas=1, max_replicas=5, spec_replicas=3, cpu_target=10,
                    metrics=[PODS_15], levels=(20000, 10000, 30000), requests=[ONE] * 3,
                    last_scale_time=now)
    assert pods_only.desired_replicas == 4 and conditions(pods_only) == STATUS_OK
    assert both.desired_replicas == 5
    assert conditions(both) == ok_with(("ScalingLimited", T, "TooManyReplicas"))


def test_stabilized_downscale_keeps_the_recent_maximum() -> None:
    decision = scenario(min_replicas=1, max_replicas=5, spec_replicas=4, cpu_target=100,
                        levels=(50, 50, 50), requests=["0.1"] * 3,
                        recommendations=[{"timestamp": b.ago(600), "replicas": 10},
                                         {"timestamp": b.ago(60), "replicas": 4}])
    assert decision.desired_replicas == 4 and not decision.rescale
    assert conditions(decision) == ok_with(("AbleToScale", T, "ScaleDownStabilized"))
    assert [r.replicas for r in decision.history.recommendations or ()] == [2, 4]


@pytest.mark.parametrize(("target", "expected"), [(56, 9), (55, 10)])
def test_computed_tolerance_regression(target: int, expected: int) -> None:
    requests = [f"{m}m" for m in (400, 200, 310, 290, 302, 298, 301, 299, 300, 300)]
    decision = scenario(min_replicas=0, max_replicas=1000, spec_replicas=10, cpu_target=target,
                        levels=(150,) * 10, requests=requests, recommendations=[])
    assert decision.desired_replicas == expected


def test_status_equal_to_the_old_one_needs_no_write() -> None:
    first = scenario(min_replicas=2, max_replicas=6, spec_replicas=3, cpu_target=30,
                     levels=(300, 400, 300), requests=[ONE] * 3, recommendations=[])
    assert first.status_changed  # a first sync writes conditions
