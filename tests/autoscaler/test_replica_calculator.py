"""The replica calculator against upstream's replica_calculator_test.go scenarios, as numbers.

Fixtures follow upstream's: 2 containers per pod, each requesting the pod's request and each
reporting the pod's level (so a pod uses and requests twice the numbers in the tables), pod
start and Ready-transition times at Go's zero time unless given, metrics at the zero time with
a one-minute window, a 2 min cpu initialization period and a 10 s readiness delay.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from autoscaler.decision.replicas import (
    INT32_MAX,
    INT64_MAX,
    CalculationError,
    ReadinessRules,
    Tolerances,
    calculate_requests,
    get_external_metric_replicas,
    get_external_per_pod_metric_replicas,
    get_metric_replicas,
    get_object_metric_replicas,
    get_object_per_pod_metric_replicas,
    get_resource_replicas,
    group_pods,
    per_pod_usage,
)
from autoscaler.model.metrics import MetricFetchError, MetricInput, parse_metric_input
from autoscaler.model.pods import Pod, parse_pod, parse_pods
from tests.autoscaler import builders as b

RULES = ReadinessRules(cpu_initialization_period=timedelta(minutes=2),
                       initial_readiness_delay=timedelta(seconds=10), now=b.NOW)
DEFAULT = Tolerances(0.1, 0.1)
UP_1 = Tolerances(0.1, 0.01)
N = "Running"


def calc_pods(count: int, *, requests: Sequence[str], readiness: Sequence[str] | None = None,
              start: Sequence[str] | None = None, phase: Sequence[str] | None = None,
              deleted: Sequence[bool] | None = None) -> tuple[Pod, ...]:
    """upstream's newFakePodClient: max(currentReplicas, len(podPhase)) pods."""
    total = max(count, len(phase or ()))
    pods = []
    for i in range(total):
        request = requests[i] if i < len(requests) else None
        pods.append(b.pod(
            i, requests=(request, request),
            ready=readiness[i] if readiness and i < len(readiness) else "True",
            start=start[i] if start else b.ZERO, ready_since=b.ZERO,
            phase=phase[i] if phase else N, deleted=bool(deleted and deleted[i])))
    return parse_pods(b.pod_list(pods))


def resource_metrics(levels: list[list[int]], names: Sequence[str] | None = None) -> MetricInput:
    return parse_metric_input(b.pod_metrics(levels, names=names), "m", metric_type="Resource")


@dataclass(frozen=True)
class ResourceCase:
    name: str
    current: int
    requests: Sequence[str]
    levels: list[list[int]]
    target: int
    replicas: int
    utilization: int
    raw: int
    container: str = ""
    readiness: Sequence[str] | None = None
    start: Sequence[str] | None = None
    phase: Sequence[str] | None = None
    deleted: Sequence[bool] | None = None
    tolerances: Tolerances = DEFAULT


F, T = "False", "True"
R, P, FAILED, SUCCEEDED = "Running", "Pending", "Failed", "Succeeded"
ONE3 = ("1.0",) * 3
MIXED = ("0.9", "1.0", "1.1")

RESOURCE_CASES = [
    ResourceCase("scale up", 3, ONE3, b.calc_levels(300, 500, 700), 30, 5, 50, 2 * 500),
    ResourceCase("scale up: container metric", 3, ONE3,
                 [[1000, 300], [1000, 500], [1000, 700]], 30, 5, 50, 500, container="container2"),
    ResourceCase("scale up: unready pod scales less", 3, ONE3, b.calc_levels(300, 500, 700), 30,
                 4, 60, 2 * 600, readiness=(F, T, T)),
    ResourceCase("scale up: hot-CPU container scales less", 3, ONE3,
                 [[0, 300], [0, 500], [0, 700]], 30, 4, 60, 600, container="container2",
                 start=(b.hot(), b.cool(), b.cool())),
    ResourceCase("scale up: hot-CPU pod scales less", 3, ONE3, b.calc_levels(300, 500, 700), 30,
                 4, 60, 2 * 600, start=(b.hot(), b.cool(), b.cool())),
    ResourceCase("no scale: unready pods ignored", 3, ONE3, b.calc_levels(400, 500, 700), 30,
                 3, 40, 2 * 400, readiness=(T, F, F)),
    ResourceCase("no scale: hot-CPU pods ignored", 3, ONE3, b.calc_levels(400, 500, 700), 30,
                 3, 40, 2 * 400, readiness=(T, F, F), start=(b.cool(), b.hot(), b.hot())),
    ResourceCase("scale up: failed pods ignored", 2, ("1.0",) * 4, b.calc_levels(500, 700), 30,
                 4, 60, 2 * 600, readiness=(T, T, F, F), phase=(R, R, FAILED, FAILED)),
    ResourceCase("scale up: failed pods ignored with missing container metric", 2,
                 ("1.0",) * 4, [[1000, 500], [9000, 700], [1000], [9000]], 30, 4, 60, 600,
                 container="container2", readiness=(T, T, F, F), phase=(R, R, FAILED, FAILED)),
    ResourceCase("scale up: succeeded pods ignored", 2, ("1.0",) * 4, b.calc_levels(500, 700),
                 30, 4, 60, 2 * 600, readiness=(T, T, F, F), phase=(R, R, SUCCEEDED, SUCCEEDED)),
    ResourceCase("scale up: container metric with succeeded pods ignored", 2, ("1.0",) * 4,
                 [[1000, 500], [9000, 700]], 30, 4, 60, 600, container="container2",
                 readiness=(T, T, F, F), phase=(R, R, SUCCEEDED, SUCCEEDED)),
    ResourceCase("scale up: pods being deleted are ignored", 2, ("1.0",) * 4,
                 b.calc_levels(500, 700), 30, 4, 60, 2 * 600, readiness=(T, T, F, F),
                 phase=(R, R, R, R), deleted=(False, False, True, True)),
    ResourceCase("scale up: container metrics with pods being deleted ignored", 2, ("1.0",) * 4,
                 b.calc_levels(500, 700), 30, 4, 60, 600, container="container1",
                 readiness=(T, T, F, F), phase=(R, R, R, R), deleted=(False, False, True, True)),
    ResourceCase("scale down", 5, ("1.0",) * 5, b.calc_levels(100, 300, 500, 250, 250), 50, 3,
                 28, 2 * 280),
    ResourceCase("scale down: container metric", 5, ("1.0",) * 5,
                 [[1000, 100], [1000, 300], [1000, 500], [1000, 250], [1000, 250]], 50, 3, 28,
                 280, container="container2"),
    ResourceCase("scale down: exclude unready pods", 5, ("1.0",) * 5,
                 b.calc_levels(100, 300, 500, 250, 250), 50, 2, 30, 2 * 300,
                 readiness=(T, T, T, F, F)),
    ResourceCase("scale down: exclude unscheduled pods", 5, ("1.0",) * 5, b.calc_levels(100), 50,
                 1, 10, 2 * 100, readiness=(T, F, F, F, F), phase=(R, P, P, P, P)),
    ResourceCase("scale down: ignore hot-CPU pods", 5, ("1.0",) * 5,
                 b.calc_levels(100, 300, 500, 250, 250), 50, 2, 30, 2 * 300,
                 start=(b.cool(), b.cool(), b.cool(), b.hot(), b.hot())),
    ResourceCase("scale down: container metric ignores hot-CPU pods", 5, ("1.0",) * 5,
                 [[1000, 100], [1000, 300], [1000, 500], [1000, 1000], [1000, 1000]], 50, 2, 30,
                 300, container="container2",
                 start=(b.cool(), b.cool(), b.cool(), b.hot(), b.hot())),
    ResourceCase("scale down: failed pods ignored", 5, ("1.0",) * 7,
                 b.calc_levels(100, 300, 500, 250, 250), 50, 3, 28, 2 * 280,
                 readiness=(T, T, T, T, T, F, F), phase=(R, R, R, R, R, FAILED, FAILED)),
    ResourceCase("scale down: succeeded pods ignored", 5, ("1.0",) * 7,
                 b.calc_levels(100, 300, 500, 250, 250), 50, 3, 28, 2 * 280,
                 readiness=(T, T, T, T, T, F, F), phase=(R, R, R, R, R, SUCCEEDED, SUCCEEDED)),
    ResourceCase("scale down: still-running pods being deleted are ignored", 5, ("1.0",) * 7,
                 [[1000, 100], [1000, 300], [1000, 500], [1000, 250], [1000, 250]], 50, 3, 28,
                 280, container="container2", readiness=(T, T, T, T, T, F, F),
                 phase=(R,) * 7, deleted=(False,) * 5 + (True, True)),
    # tolerance (TestReplicaCalcResourceTolerance)
    ResourceCase("within default tolerance", 3, MIXED, b.calc_levels(1010, 1030, 1020), 100, 3,
                 102, 2 * 1020),
    ResourceCase("outside 0% tolerance", 3, MIXED, b.calc_levels(909, 1010, 1111), 100, 4, 101,
                 2 * 1010, tolerances=Tolerances(0.0, 0.0)),
    ResourceCase("within 200% scale-up tolerance", 3, MIXED, b.calc_levels(1890, 1910, 1900),
                 100, 3, 190, 2 * 1900, tolerances=Tolerances(0.1, 2.0)),
    ResourceCase("outside 8% scale-up tolerance (superfluous scale-down tolerance)", 3, MIXED,
                 b.calc_levels(1100, 1080, 1090), 100, 4, 109, 2 * 1090,
                 tolerances=Tolerances(2.0, 0.08)),
    ResourceCase("within 36% scale-down tolerance", 3, MIXED, b.calc_levels(660, 640, 650), 100,
                 3, 65, 2 * 650, tolerances=Tolerances(0.36, 0.1)),
    ResourceCase("outside 34% scale-down tolerance", 3, MIXED, b.calc_levels(660, 640, 650),
                 100, 2, 65, 2 * 650, tolerances=Tolerances(0.34, 0.1)),
    # missing and superfluous metrics (TestReplicaCalcResourceMissingMetrics)
    ResourceCase("superfluous metrics are counted", 4, ("1.0",) * 4,
                 b.calc_levels(4000, 9500, 3000, 7000, 3200, 2000), 100, 24, 587, 2 * 5875),
    ResourceCase("some pods missing metrics scales down", 4, ("1.0",) * 4,
                 b.calc_levels(400, 95), 100, 3, 24, 495),
    ResourceCase("no change: metric equal to target", 2, ("1.0",) * 2, b.calc_levels(1000), 100,
                 2, 100, 2 * 1000),
    ResourceCase("no change: metric above target", 2, ("1.0",) * 2, b.calc_levels(1900), 100, 2,
                 190, 2 * 1900),
    ResourceCase("no change: metric below target", 2, ("1.0",) * 2, b.calc_levels(600), 100, 2,
                 60, 2 * 600),
    ResourceCase("no change: unready pod metric missing", 3, ONE3, b.calc_levels(100, 450), 50,
                 3, 45, 2 * 450, readiness=(F, T, T)),
    ResourceCase("no change: hot-CPU pod metric missing", 3, ONE3, b.calc_levels(100, 450), 50,
                 3, 45, 2 * 450, start=(b.hot(), b.cool(), b.cool())),
    ResourceCase("scale up: unready pod metric missing", 3, ONE3, b.calc_levels(100, 2000), 50,
                 4, 200, 2 * 2000, readiness=(F, T, T)),
    ResourceCase("scale up: hot-CPU pod metric missing", 3, ONE3, b.calc_levels(100, 2000), 50,
                 4, 200, 2 * 2000, readiness=(F, T, T), start=(b.hot(), b.cool(), b.cool())),
    ResourceCase("scale down: unready pod metric missing", 4, ("1.0",) * 4,
                 b.calc_levels(100, 100, 100), 50, 3, 10, 2 * 100, readiness=(F, T, T, T)),
    ResourceCase("scale down: a target over 100% fills missing pods at the target", 4,
                 ("1.0", "1.0", "2.0", "2.0"), b.calc_levels(200, 100, 100), 300, 2, 6, 2 * 100,
                 readiness=(F, T, T, T)),
    ResourceCase("rolling update with maxSurge: the extra pod without metrics changes nothing",
                 2, ONE3, b.calc_levels(100, 100), 50, 2, 10, 2 * 100, phase=(R, R, R)),
]


@pytest.mark.parametrize("case", RESOURCE_CASES, ids=lambda c: c.name)
def test_resource_utilization_target_proposes_upstreams_replicas(case: ResourceCase) -> None:
    pods = calc_pods(case.current, requests=case.requests, readiness=case.readiness,
                     start=case.start, phase=case.phase, deleted=case.deleted)
    result = get_resource_replicas(
        current_replicas=case.current, target_utilization=case.target, resource="cpu",
        container=case.container, tolerances=case.tolerances, pods=pods,
        metrics=resource_metrics(case.levels), rules=RULES)
    assert (result.replicas, result.utilization, result.usage) == \
        (case.replicas, case.utilization, case.raw)
    assert result.timestamp == parse_pod(b.pod(0), "p").start_time  # the first item's: zero


@pytest.mark.parametrize(("name", "current", "requests", "levels", "names", "message"), [
    ("disjoint pod and metric names", 1, ("1.0",), b.calc_levels(100), ["an-older-pod-name"],
     "no metrics returned matched known pods"),
    ("no metrics returned from the metrics API", 4, ONE3, b.calc_levels(), None,
     "unable to get metrics for resource cpu: no metrics returned from resource metrics API"),
    ("missing cpu request on a container", 1, (), b.calc_levels(200), None,
     "missing request for cpu in container container1 of Pod test-pod-0"),
])
def test_resource_target_errors_carry_upstreams_text(name: str, current: int,
                                                     requests: Sequence[str],
                                                     levels: list[list[int]],
                                                     names: list[str] | None,
                                                     message: str) -> None:
    pods = calc_pods(current, requests=requests)
    with pytest.raises(CalculationError) as caught:
        get_resource_replicas(current_replicas=current, target_utilization=100, resource="cpu",
                              container="", tolerances=DEFAULT, pods=pods,
                              metrics=resource_metrics(levels, names), rules=RULES)
    assert str(caught.value) == message


def test_a_failed_metrics_call_is_wrapped_as_upstream_wraps_it() -> None:
    with pytest.raises(CalculationError) as caught:
        get_resource_replicas(current_replicas=3, target_utilization=50, resource="cpu",
                              container="", tolerances=DEFAULT,
                              pods=calc_pods(3, requests=ONE3),
                              metrics=MetricFetchError("something went wrong"), rules=RULES)
    assert str(caught.value) == ("unable to get metrics for resource cpu: unable to fetch "
                                 "metrics from resource metrics API: something went wrong")


def test_computed_tolerance_regression_scales_just_outside_and_not_inside() -> None:
    # TestReplicaCalcComputedToleranceAlgImplementation: 10 pods at 150m, requests summing 3000m
    requests = [f"{m}m" for m in (400, 200, 310, 290, 302, 298, 301, 299, 300, 300)]
    levels = b.calc_levels(*([150] * 10))
    for target, expected in ((56, 9), (55, 10)):
        result = get_resource_replicas(
            current_replicas=10, target_utilization=target, resource="cpu", container="",
            tolerances=DEFAULT, pods=calc_pods(10, requests=requests),
            metrics=resource_metrics(levels), rules=RULES)
        assert (result.replicas, result.utilization, result.usage) == (expected, 50, 300)


# --------------------------------------------------------------------------------------------
# Pods metrics (TestReplicaCalcPodMetric)


def custom(levels: Sequence[int]) -> MetricInput:
    return parse_metric_input(b.custom_metrics(levels), "m", metric_type="Pods")


@pytest.mark.parametrize(("name", "current", "levels", "target", "replicas", "usage", "extra"), [
    ("scale up", 3, (20000, 10000, 30000), 15000, 4, 20000, {}),
    ("unready hot-CPU pods do not reduce a pods metric's scale-up", 3, (50000, 10000, 30000),
     15000, 6, 30000, {"readiness": (T, T, F), "start": (b.cool(), b.cool(), b.hot())}),
    ("unready hot-CPU pods do not avoid a pods metric's scale-down", 3, (50000, 15000, 30000),
     15000, 7, 31666, {"readiness": (F, T, F), "start": (b.hot(), b.cool(), b.hot())}),
    ("scale down", 5, (12000,) * 5, 20000, 3, 12000, {}),
    ("within default tolerance", 3, (20000, 21000, 21000), 20000, 3, 20666, {}),
    ("outside a configurable 1% tolerance", 3, (20000, 21000, 21000), 20000, 4, 20666,
     {"tolerances": UP_1}),
    ("no change: missing metrics", 5, (20000, 19000, 21000), 20000, 5, 20000, {}),
    ("rolling update with maxSurge: the extra pod without metrics changes nothing", 2,
     (10000, 10000), 17000, 2, 10000, {"phase": (R, R, R)}),
])
def test_pods_metric_proposes_upstreams_replicas(name: str, current: int, levels: Sequence[int],
                                                 target: int, replicas: int, usage: int,
                                                 extra: dict[str, Any]) -> None:
    pods = calc_pods(current, requests=ONE3, readiness=extra.get("readiness"),
                     start=extra.get("start"), phase=extra.get("phase"))
    result = get_metric_replicas(current_replicas=current, target_usage=target,
                                 metric_name="qps", tolerances=extra.get("tolerances", DEFAULT),
                                 pods=pods, metrics=custom(levels), rules=RULES)
    assert (result.replicas, result.usage) == (replicas, usage)


# --------------------------------------------------------------------------------------------
# Object metrics (TestReplicaCalcObjectMetric, TestReplicaCalcObjectPerPodMetric)


def obj(level: int) -> MetricInput:
    return parse_metric_input(b.object_metric(level), "m", metric_type="Object")


@pytest.mark.parametrize(("name", "current", "level", "target", "replicas", "readiness", "tol"), [
    ("scale up", 3, 20000, 15000, 4, None, DEFAULT),
    ("a very large metric saturates replicas at MaxInt32", 3, INT64_MAX, 1, INT32_MAX, None,
     DEFAULT),
    ("unready pods are not counted", 3, 50000, 10000, 5, (F, T, F), DEFAULT),
    ("scale down", 5, 12000, 20000, 3, None, DEFAULT),
    ("within default tolerance", 3, 20666, 20000, 3, None, DEFAULT),
    ("outside a configurable 1% tolerance", 3, 20666, 20000, 4, None, UP_1),
])
def test_object_value_target_proposes_upstreams_replicas(name: str, current: int, level: int,
                                                         target: int, replicas: int,
                                                         readiness: Sequence[str] | None,
                                                         tol: Tolerances) -> None:
    result = get_object_metric_replicas(
        current_replicas=current, target_usage=target, metric_name="qps",
        object_kind="Deployment", object_name="some-deployment", namespace=b.NAMESPACE,
        tolerances=tol, pods=calc_pods(current, requests=ONE3, readiness=readiness),
        metrics=obj(level))
    assert (result.replicas, result.usage) == (replicas, level)
    assert result.timestamp.year == 1  # upstream reports the zero time for Value targets


@pytest.mark.parametrize(("name", "status", "level", "target", "replicas", "usage", "tol"), [
    ("usage overflow with a huge target leaves replicas unchanged", 1, INT64_MAX, INT64_MAX, 1,
     INT64_MAX, DEFAULT),
    ("scale up", 3, 20000, 5000, 4, 6667, DEFAULT),
    ("scale down", 5, 6000, 2000, 3, 1200, DEFAULT),
    ("within default tolerance", 4, 20166, 5000, 4, 5042, DEFAULT),
    ("outside a configurable 1% tolerance", 4, 20208, 5000, 5, 5052, UP_1),
    ("zero status replicas do not overflow the usage", 0, 20000, 5000, 4, 0, DEFAULT),
    ("zero status replicas and a zero metric do not underflow", 0, 0, 5000, 0, 0, DEFAULT),
])
def test_object_average_value_target_proposes_upstreams_replicas(
        name: str, status: int, level: int, target: int, replicas: int, usage: int,
        tol: Tolerances) -> None:
    result = get_object_per_pod_metric_replicas(
        status_replicas=status, target_average_usage=target, metric_name="qps",
        object_kind="Deployment", object_name="some-deployment", namespace=b.NAMESPACE,
        tolerances=tol, metrics=obj(level))
    assert (result.replicas, result.usage) == (replicas, usage)


def test_object_metric_needs_exactly_one_value() -> None:
    with pytest.raises(CalculationError) as caught:
        get_object_metric_replicas(
            current_replicas=3, target_usage=1000, metric_name="qps", object_kind="Deployment",
            object_name="some-deployment", namespace=b.NAMESPACE, tolerances=DEFAULT,
            pods=calc_pods(3, requests=ONE3),
            metrics=parse_metric_input(b.custom_metrics([]), "m", metric_type="Object"))
    assert str(caught.value) == (
        "unable to get metric qps on Deployment test-namespace/some-deployment: unable to fetch "
        "metrics from custom metrics API: the custom metrics API server returned 0 results when "
        "we asked for exactly one")


# --------------------------------------------------------------------------------------------
# External metrics (TestReplicaCalcExternalMetric, TestReplicaCalcExternalPerPodMetric)


def ext(*levels: int) -> MetricInput:
    return parse_metric_input(b.external_metrics(levels), "m", metric_type="External")


@pytest.mark.parametrize(("name", "current", "levels", "target", "replicas", "usage", "extra"), [
    ("scale down because unready pods are not counted (it would scale up otherwise)", 3,
     (8600,), 4400, 2, 8600, {"readiness": (F, T, F)}),
    ("scale down", 5, (8600,), 14334, 3, 8600, {}),
    ("within default tolerance", 3, (8600,), 8888, 3, 8600, {}),
    ("outside a configurable 1% tolerance", 3, (8900,), 8800, 4, 8900, {"tolerances": UP_1}),
    ("a sum overflowing int64 is capped at MaxInt64", 3, (INT64_MAX // 2 + 1,) * 2, INT64_MAX, 3,
     INT64_MAX, {}),
])
def test_external_value_target_proposes_upstreams_replicas(name: str, current: int,
                                                           levels: Sequence[int], target: int,
                                                           replicas: int, usage: int,
                                                           extra: dict[str, Any]) -> None:
    result = get_external_metric_replicas(
        current_replicas=current, target_usage=target, metric_name="qps",
        namespace=b.NAMESPACE, selector_text="nil", tolerances=extra.get("tolerances", DEFAULT),
        pods=calc_pods(current, requests=ONE3, readiness=extra.get("readiness")),
        metrics=ext(*levels))
    assert (result.replicas, result.usage) == (replicas, usage)


@pytest.mark.parametrize(("name", "status", "level", "target", "replicas", "usage", "tol"), [
    ("a replica count overflow saturates at MaxInt32", 1, INT64_MAX, 1, INT32_MAX, INT64_MAX,
     DEFAULT),
    ("usage overflow with a huge target leaves replicas unchanged", 1, INT64_MAX, INT64_MAX, 1,
     INT64_MAX, DEFAULT),
    ("zero status replicas do not overflow the usage", 0, 20000, 5000, 4, 0, DEFAULT),
    ("zero status replicas and a zero metric do not underflow", 0, 0, 5000, 0, 0, DEFAULT),
    ("scale up", 3, 8600, 2150, 4, 2867, DEFAULT),
    ("scale down", 5, 8600, 2867, 3, 1720, DEFAULT),
    ("within default tolerance", 3, 8600, 2900, 3, 2867, DEFAULT),
    ("outside a configurable 1% tolerance", 3, 8600, 2800, 4, 2867, UP_1),
])
def test_external_average_value_target_proposes_upstreams_replicas(
        name: str, status: int, level: int, target: int, replicas: int, usage: int,
        tol: Tolerances) -> None:
    result = get_external_per_pod_metric_replicas(
        status_replicas=status, target_usage_per_pod=target, metric_name="qps",
        namespace=b.NAMESPACE, selector_text="nil", tolerances=tol, metrics=ext(level))
    assert (result.replicas, result.usage) == (replicas, usage)


@pytest.mark.parametrize(("usage", "replicas", "expected"), [
    (20000, 0, 0), (1000, 3, 334), (INT64_MAX, 1, INT64_MAX)])
def test_per_pod_usage_rounds_up_and_guards_overflow(usage: int, replicas: int,
                                                     expected: int) -> None:
    assert per_pod_usage(usage, replicas) == expected


# --------------------------------------------------------------------------------------------
# groupPods (TestGroupPods) and calculateRequests (TestCalculateRequests)


def one_pod(name: str, *, phase: str = "Running", start: str | None = None,
            ready: str | None = None, since: str | None = None,
            deleted: bool = False) -> Pod:
    raw = b.pod(0, name=name, phase=phase, start=start, ready=ready, ready_since=since,
                deleted=deleted)
    return parse_pod(raw, "pod")


def metric_at(timestamp_seconds_ago: float | None, window: float) -> tuple[int, Any, Any]:
    when = b.NOW - timedelta(seconds=timestamp_seconds_ago) if timestamp_seconds_ago is not None \
        else parse_pod(b.pod(0), "p").start_time
    return (1, when, timedelta(seconds=window))


@pytest.mark.parametrize(("name", "pod", "metric", "resource", "expected"), [
    ("a ready pod counts for memory", one_pod("bentham"), metric_at(0, 60), "memory", "ready"),
    ("a cpu pod without a Ready condition is unready",
     one_pod("lucretius", start=b.ago(0)), metric_at(None, 0), "cpu", "unready"),
    ("a ready pod with fresh metrics counts during the initialization period",
     one_pod("bentham", start=b.ago(60), ready="True", since=b.ago(30)), metric_at(0, 30), "cpu",
     "ready"),
    ("a ready pod without fresh metrics is unready during the initialization period",
     one_pod("bentham", start=b.ago(60), ready="True", since=b.ago(30)), metric_at(0, 60), "cpu",
     "unready"),
    ("an unready pod is unready during the initialization period",
     one_pod("lucretius", start=b.ago(600), ready="False", since=b.ago(594)),
     metric_at(None, 0), "cpu", "unready"),
    ("a ready pod without fresh metrics counts after the initialization period",
     one_pod("bentham", start=b.ago(180), ready="True", since=b.ago(180)), metric_at(120, 60),
     "cpu", "ready"),
    ("an unready pod that was ready counts after the initialization period",
     one_pod("lucretius", start=b.ago(600), ready="False", since=b.ago(540)),
     metric_at(None, 0), "cpu", "ready"),
    ("readiness exactly at the delay counts as having been ready",
     one_pod("lucretius", start=b.ago(600), ready="False", since=b.ago(590)),
     metric_at(None, 0), "cpu", "ready"),
    ("a pod without metrics is missing", one_pod("epicurus", start=b.ago(180)), None, "cpu",
     "missing"),
    ("a pending pod is unready, not missing", one_pod("unscheduled", phase="Pending"), None,
     "cpu", "unready"),
    ("a pod being deleted is ignored", one_pod("deleted", phase="Pending", deleted=True),
     metric_at(None, 0), "cpu", "ignored"),
    ("a failed pod is ignored", one_pod("failed", phase="Failed"), metric_at(None, 0), "cpu",
     "ignored"),
    ("a succeeded pod is ignored", one_pod("succeeded", phase="Succeeded"), metric_at(None, 0),
     "cpu", "ignored"),
])
def test_group_pods_puts_each_pod_where_upstream_does(name: str, pod: Pod,
                                                      metric: tuple[int, Any, Any] | None,
                                                      resource: str, expected: str) -> None:
    metrics = {pod.name: metric} if metric is not None else {}
    groups = group_pods([pod], metrics, resource=resource, rules=RULES)
    where = {"ready": groups.ready == 1, "unready": pod.name in groups.unready,
             "missing": pod.name in groups.missing, "ignored": pod.name in groups.ignored}
    assert [k for k, v in where.items() if v] == [expected]


def raw_pod(spec: dict[str, Any]) -> Pod:
    return parse_pod({"metadata": {"name": "test-pod"}, "spec": spec, "status": {}}, "pod")


def cont(name: str, cpu: str | None = None, *, always: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    if cpu is not None:
        out["resources"] = {"requests": {"cpu": cpu}}
    if always:
        out["restartPolicy"] = "Always"
    return out


@pytest.mark.parametrize(("name", "spec", "container", "pod_level", "expected"), [
    ("containers are summed", {"containers": [cont("c1", "100m"), cont("c2", "50m")]}, "", True,
     150),
    ("pod-level requests win when set", {"resources": {"requests": {"cpu": "800m"}},
                                         "containers": [cont("c1", "100m"), cont("c2", "50m")]},
     "", True, 800),
    ("pod-level requests are ignored without the feature",
     {"resources": {"requests": {"cpu": "800m"}},
      "containers": [cont("c1", "100m"), cont("c2", "50m")]}, "", False, 150),
    ("pod-level requests cover a container without requests",
     {"resources": {"requests": {"cpu": "800m"}}, "containers": [cont("c1"), cont("c2", "50m")]},
     "", True, 800),
    ("a named container counts alone", {"containers": [cont("c1", "100m"), cont("c2", "50m")]},
     "c1", True, 100),
    ("a named container ignores pod-level requests",
     {"resources": {"requests": {"cpu": "800m"}},
      "containers": [cont("c1", "100m"), cont("c2", "50m")]}, "c1", True, 100),
    ("restartable init containers count, ordinary ones do not",
     {"containers": [cont("c1", "100m")],
      "initContainers": [cont("init", "20m"), cont("sidecar", "50m", always=True)]}, "", True,
     150),
])
def test_requests_are_calculated_as_upstream_does(name: str, spec: dict[str, Any], container: str,
                                                  pod_level: bool, expected: int) -> None:
    requests = calculate_requests([raw_pod(spec)], container=container, resource="cpu",
                                  pod_level_resources=pod_level)
    assert requests == {"test-pod": expected}


@pytest.mark.parametrize(("spec", "container", "message"), [
    ({"containers": [cont("container1"), cont("container2", "50m")]}, "",
     "missing request for cpu in container container1 of Pod test-pod"),
    ({"containers": [cont("container1", "100m")]}, "non-existent-container",
     "container non-existent-container not found in Pod test-pod"),
    ({"resources": {"requests": {"memory": "1Gi"}}, "containers": [cont("c1")]}, "",
     "missing pod-level request for cpu in Pod test-pod"),
])
def test_request_errors_carry_upstreams_text(spec: dict[str, Any], container: str,
                                             message: str) -> None:
    with pytest.raises(CalculationError) as caught:
        calculate_requests([raw_pod(spec)], container=container, resource="cpu")
    assert str(caught.value) == message


def test_ratio_arithmetic_is_float64_like_go() -> None:
    # 1.1 * 3 is 3.3000000000000003 in float64, so ceil gives 4 (upstream gives 4 too)
    pods = calc_pods(3, requests=("1.0",) * 3)
    result = get_metric_replicas(current_replicas=3, target_usage=10000, metric_name="qps",
                                 tolerances=Tolerances(0.0, 0.0), pods=pods,
                                 metrics=custom((11000, 11000, 11000)), rules=RULES)
    assert result.ratio == 1.1 and math.ceil(1.1 * 3) == 4 and result.replicas == 4
