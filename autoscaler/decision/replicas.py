"""The replica calculator: upstream's replica_calculator.go and its metrics client's pure parts.

Integer arithmetic is Go's: int64 sums (wrapping), division truncating toward zero, int32
utilization percentages. Ratios are float64 upstream (`float64(a) / float64(b)`,
`math.Ceil(ratio * float64(n))`), and Python floats are IEEE float64, so those are floats here
too and give the very same numbers; conversions back to int32 follow Go on amd64.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import NamedTuple

from autoscaler.model.metrics import (
    ExternalMetricValueList,
    MetricFetchError,
    MetricInput,
    MetricValueList,
    PodMetricsList,
)
from autoscaler.model.pods import Pod
from autoscaler.model.times import GO_ZERO_TIME
from metricscale.core.quantity import milli_value

__all__ = [
    "CalculationError",
    "CalculationNote",
    "PodGroups",
    "ReadinessRules",
    "ReplicaCalculation",
    "Tolerances",
    "calculate_requests",
    "custom_pod_metrics",
    "external_metric_values",
    "get_external_metric_replicas",
    "get_external_per_pod_metric_replicas",
    "get_metric_replicas",
    "get_object_metric_replicas",
    "get_object_per_pod_metric_replicas",
    "get_raw_resource_replicas",
    "get_resource_replicas",
    "go_float_to_int32",
    "group_pods",
    "metric_usage_ratio",
    "object_metric_value",
    "per_pod_usage",
    "ready_pods_count",
    "resource_pod_metrics",
    "resource_utilization_ratio",
]

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
_UINT64 = 2**64
_TERMINAL_PHASES = frozenset({"Failed", "Succeeded"})
# Pod-level requests (KEP-2837) exist for these resources.
_POD_LEVEL_RESOURCES = frozenset({"cpu", "memory"})

# A pod's metric for one calculation: (milli value, sample timestamp, sample window).
PodMetric = tuple[int, datetime, timedelta]


class CalculationError(Exception):
    """A replica count could not be computed; `str(err)` is upstream's error text."""


# --------------------------------------------------------------------------------------------
# Go arithmetic


def _wrap64(value: int) -> int:
    """int64 two's-complement wrap-around (addition is associative modulo 2^64)."""
    value %= _UINT64
    return value - _UINT64 if value > INT64_MAX else value


def _wrap32(value: int) -> int:
    value %= 2**32
    return value - 2**32 if value > INT32_MAX else value


def _go_div(a: int, b: int) -> int:
    """Go's integer division: truncates toward zero."""
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b >= 0) else -quotient


def _fdiv(a: float, b: float) -> float:
    """float64 division as Go does it: x/0 is ±Inf, 0/0 is NaN."""
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def go_float_to_int32(value: float) -> int:
    """Go's `int32(f)` on amd64: truncation; NaN and out-of-range give math.MinInt32."""
    if math.isnan(value) or math.isinf(value):
        return INT32_MIN
    truncated = math.trunc(value)
    if truncated > INT32_MAX or truncated < INT32_MIN:
        return INT32_MIN
    return truncated


def _ceil_int32(value: float) -> int:
    """`int32(math.Ceil(value))`."""
    if math.isnan(value) or math.isinf(value):
        return INT32_MIN
    return go_float_to_int32(float(math.ceil(value)))


# --------------------------------------------------------------------------------------------
# Tolerances and readiness settings


class Tolerances(NamedTuple):
    """Usage-ratio tolerances; both ends inclusive, the two sides may differ."""

    scale_down: float
    scale_up: float

    def is_within(self, ratio: float) -> bool:
        return (1.0 - self.scale_down) <= ratio <= (1.0 + self.scale_up)

    def __str__(self) -> str:
        return f"[down:{self.scale_down * 100:.1f}%, up:{self.scale_up * 100:.1f}%]"


class ReadinessRules(NamedTuple):
    """What groupPods needs besides pods and metrics: the two periods and `now`."""

    cpu_initialization_period: timedelta
    initial_readiness_delay: timedelta
    now: datetime


# --------------------------------------------------------------------------------------------
# Results


class CalculationNote(NamedTuple):
    """A rule of the calculator that changed the proposal: tolerance, rebalancing, direction."""

    rule: str
    from_replicas: int
    to_replicas: int
    detail: str


class PodGroups(NamedTuple):
    ready: int
    unready: frozenset[str]
    missing: frozenset[str]
    ignored: frozenset[str]


class ReplicaCalculation(NamedTuple):
    """One metric's proposal, with what it is based on."""

    replicas: int
    usage: int  # milli: raw average, per-pod usage, or the total, as upstream reports it
    timestamp: datetime
    ratio: float
    utilization: int | None = None
    new_ratio: float | None = None
    groups: PodGroups | None = None
    ready_pods: int | None = None
    notes: tuple[CalculationNote, ...] = ()


# --------------------------------------------------------------------------------------------
# The metrics client's pure parts (metrics/client.go)


def _fetch_failed(api: str, metrics: MetricInput) -> CalculationError:
    message = (metrics.message if isinstance(metrics, MetricFetchError)
               else "no metrics were fetched")
    return CalculationError(f"unable to fetch metrics from {api} metrics API: {message}")


def resource_pod_metrics(metrics: MetricInput, *, resource: str,
                         container: str) -> tuple[dict[str, PodMetric], datetime]:
    """GetResourceMetric: milli usage per pod (all containers, or the named one)."""
    if not isinstance(metrics, PodMetricsList):
        raise _fetch_failed("resource", metrics)
    if not metrics.items:
        raise CalculationError("no metrics returned from resource metrics API")
    result: dict[str, PodMetric] = {}
    for item in metrics.items:
        if container:
            for usage in item.containers:
                if usage.name == container:
                    quantity = usage.usage.get(resource)
                    if quantity is not None:
                        result[item.name] = (quantity.milli, item.timestamp, item.window)
                    break
            continue
        # summed at parse time; absent when a container lacks it or there are no containers,
        # and then the pod counts as missing
        total = item.usage_totals.get(resource)
        if total is not None:
            if total > INT64_MAX or total < INT64_MIN:
                total = _wrap64(total)
            result[item.name] = (total, item.timestamp, item.window)
    return result, metrics.items[0].timestamp


def custom_pod_metrics(metrics: MetricInput) -> tuple[dict[str, PodMetric], datetime]:
    """GetRawMetric: milli value per described pod; the window defaults to one minute."""
    if not isinstance(metrics, MetricValueList):
        raise _fetch_failed("custom", metrics)
    if not metrics.items:
        raise CalculationError("no metrics returned from custom metrics API")
    result: dict[str, PodMetric] = {}
    for item in metrics.items:
        result[item.described_name] = (item.value.milli, item.timestamp, item.window)
    return result, metrics.items[0].timestamp


def object_metric_value(metrics: MetricInput) -> tuple[int, datetime]:
    """GetObjectMetric: the single value the custom metrics API returned for the object."""
    if not isinstance(metrics, MetricValueList):
        raise _fetch_failed("custom", metrics)
    if len(metrics.items) != 1:
        raise CalculationError(
            "unable to fetch metrics from custom metrics API: the custom metrics API server "
            f"returned {len(metrics.items)} results when we asked for exactly one")
    item = metrics.items[0]
    return item.value.milli, item.timestamp


def external_metric_values(metrics: MetricInput) -> tuple[list[int], datetime]:
    """GetExternalMetric: every returned value, in milli-units."""
    if not isinstance(metrics, ExternalMetricValueList):
        raise _fetch_failed("external", metrics)
    if not metrics.items:
        raise CalculationError("no metrics returned from external metrics API")
    return [item.value.milli for item in metrics.items], metrics.items[0].timestamp


# --------------------------------------------------------------------------------------------
# metrics/utilization.go


def resource_utilization_ratio(metrics: Mapping[str, PodMetric], requests: Mapping[str, int],
                               target_utilization: int) -> tuple[float, int, int]:
    """GetResourceUtilizationRatio: (ratio, utilization %, raw average), Go's integer maths."""
    metrics_total = 0
    requests_total = 0
    entries = 0
    for name, metric in metrics.items():
        request = requests.get(name)
        if request is None:
            continue  # metrics of unknown pods are extraneous
        metrics_total += metric[0]
        requests_total += request
        entries += 1
    metrics_total = _wrap64(metrics_total)
    requests_total = _wrap64(requests_total)
    if requests_total == 0:
        raise CalculationError("no metrics returned matched known pods")
    utilization = _wrap32(_go_div(_wrap64(metrics_total * 100), requests_total))
    ratio = _fdiv(float(utilization), float(target_utilization))
    return ratio, utilization, _go_div(metrics_total, entries)


def metric_usage_ratio(metrics: Mapping[str, PodMetric], target_usage: int) -> tuple[float, int]:
    """GetMetricUsageRatio: (ratio, integer average)."""
    total = 0
    for metric in metrics.values():
        total += metric[0]
    usage = _go_div(_wrap64(total), len(metrics))
    return _fdiv(float(usage), float(target_usage)), usage


# --------------------------------------------------------------------------------------------
# Pods: grouping and requests


def _ready_groups(pods: Sequence[Pod], pod_metrics: dict[str, PodMetric], *, resource: str,
                  rules: ReadinessRules) -> PodGroups:
    """Group the pods and keep only the metrics of ready pods; fails when none is left."""
    if not pods:
        raise CalculationError("no pods returned by selector while calculating replica count")
    groups = group_pods(pods, pod_metrics, resource=resource, rules=rules)
    for name in groups.ignored:
        pod_metrics.pop(name, None)
    for name in groups.unready:
        pod_metrics.pop(name, None)
    if not pod_metrics:
        raise CalculationError("did not receive metrics for targeted pods (pods might be unready)")
    return groups


def _fill_for_rebalance(pod_metrics: dict[str, PodMetric], groups: PodGroups, *, ratio: float,
                        scale_up_with_unready: bool,
                        scale_down_usage: Callable[[str], int]) -> None:
    """The rebalance's assumptions: a missing pod uses `scale_down_usage(name)` on a scale-down
    and nothing on a scale-up; an unready pod uses nothing when it held a scale-up back."""
    if groups.missing:
        if ratio < 1.0:
            for name in groups.missing:
                pod_metrics[name] = (scale_down_usage(name), GO_ZERO_TIME, timedelta(0))
        elif ratio > 1.0:
            for name in groups.missing:
                pod_metrics[name] = (0, GO_ZERO_TIME, timedelta(0))
    if scale_up_with_unready:
        for name in groups.unready:
            pod_metrics[name] = (0, GO_ZERO_TIME, timedelta(0))


def group_pods(pods: Sequence[Pod], metrics: Mapping[str, PodMetric], *, resource: str,
               rules: ReadinessRules) -> PodGroups:
    """groupPods: every listed pod is ignored, unready, missing (its metric), or ready."""
    ready = 0
    unready: set[str] = set()
    missing: set[str] = set()
    ignored: set[str] = set()
    cpu = resource == "cpu"
    now = rules.now
    initialization = rules.cpu_initialization_period
    delay = rules.initial_readiness_delay
    for pod in pods:
        if pod.deletion_timestamp is not None or pod.phase in _TERMINAL_PHASES:
            ignored.add(pod.name)
            continue
        if pod.phase == "Pending":
            unready.add(pod.name)
            continue
        metric = metrics.get(pod.name)
        if metric is None:
            missing.add(pod.name)
            continue
        if cpu:
            condition = pod.ready
            start = pod.start_time
            if condition is None or start is None:
                unready.add(pod.name)
                continue
            if start + initialization > now:
                # still initialising: a sample that may include pre-ready usage is skipped
                if condition.status == "False" or \
                        metric[1] < condition.last_transition_time + metric[2]:
                    unready.add(pod.name)
                    continue
            elif condition.status == "False" and start + delay > condition.last_transition_time:
                # unready and never ready since it started
                unready.add(pod.name)
                continue
        ready += 1
    return PodGroups(ready=ready, unready=frozenset(unready), missing=frozenset(missing),
                     ignored=frozenset(ignored))


def _supported_pod_level(resource: str) -> bool:
    return resource in _POD_LEVEL_RESOURCES or resource.startswith("hugepages-")


def _pod_level_requests_set(pod: Pod) -> bool:
    return bool(pod.pod_requests) and any(_supported_pod_level(r) for r in pod.pod_requests or {})


def _add(total: dict[str, Decimal], more: Mapping[str, Decimal]) -> None:
    for name, value in more.items():
        total[name] = total.get(name, Decimal(0)) + value


def _pod_requests(pod: Pod) -> dict[str, Decimal]:
    """component-helpers PodRequests: containers, sidecars and init containers, then pod-level."""
    requests: dict[str, Decimal] = {}
    for container in pod.containers:
        _add(requests, {n: q.value for n, q in container.requests.items()})
    sidecars: dict[str, Decimal] = {}
    init_max: dict[str, Decimal] = {}
    for container in pod.init_containers:
        own = {n: q.value for n, q in container.requests.items()}
        if container.restartable:
            _add(requests, own)
            _add(sidecars, own)
            effective = dict(sidecars)
        else:
            effective = dict(own)
            _add(effective, sidecars)
        for name, value in effective.items():
            if name not in init_max or value > init_max[name]:
                init_max[name] = value
    for name, value in init_max.items():
        if name not in requests or value > requests[name]:
            requests[name] = value
    for name, quantity in (pod.pod_requests or {}).items():
        if _supported_pod_level(name):
            requests[name] = quantity.value
    _add(requests, {n: q.value for n, q in (pod.overhead or {}).items()})
    return requests


def calculate_requests(pods: Iterable[Pod], *, container: str, resource: str,
                       pod_level_resources: bool = True) -> dict[str, int]:
    """calculateRequests: each listed pod's request for `resource`, in milli-units."""
    requests: dict[str, int] = {}
    for pod in pods:
        if pod_level_resources and not container and pod.pod_requests \
                and _pod_level_requests_set(pod):
            value = _pod_requests(pod).get(resource)
            if value is None:
                raise CalculationError(
                    f"missing pod-level request for {resource} in Pod {pod.name}")
            requests[pod.name] = milli_value(value)
            continue
        if not container:
            total = pod.request_totals.get(resource)
            if total is None:
                lacking = pod.request_missing.get(resource)
                if lacking is None:
                    counted = pod.counted_containers
                    if not counted:
                        requests[pod.name] = 0
                        continue
                    lacking = counted[0].name
                raise CalculationError(
                    f"missing request for {resource} in container {lacking} of Pod {pod.name}")
            requests[pod.name] = total
            continue
        for candidate in pod.counted_containers:
            if candidate.name == container:
                quantity = candidate.requests.get(resource)
                if quantity is None:
                    raise CalculationError(f"missing request for {resource} in container "
                                           f"{candidate.name} of Pod {pod.name}")
                requests[pod.name] = quantity.milli
                break
        else:
            raise CalculationError(f"container {container} not found in Pod {pod.name}")
    return requests


def _ready(pods: Sequence[Pod]) -> int:
    count = 0
    for pod in pods:
        if pod.phase == "Running" and pod.ready is not None and pod.ready.status == "True":
            count += 1
    return count


def ready_pods_count(pods: Sequence[Pod]) -> int:
    """getReadyPodsCount: Running pods whose Ready condition is True (deleted ones included)."""
    if not pods:
        raise CalculationError("no pods returned by selector while calculating replica count")
    return _ready(pods)


# --------------------------------------------------------------------------------------------
# Per-kind calculations (replica_calculator.go)


def _rebalance_notes(*, ratio: float, new_ratio: float, groups: PodGroups, naive: int,
                     result: int, scale_up_with_unready: bool, flipped: bool,
                     current: int, within: bool) -> tuple[CalculationNote, ...]:
    """Explain a rebalanced proposal: which pods were filled in, and which rule decided."""
    parts = []
    if groups.missing and ratio != 1.0:
        fill = "their target" if ratio < 1.0 else "0"
        parts.append(f"{len(groups.missing)} pod(s) without metrics counted at {fill}")
    if scale_up_with_unready:
        parts.append(f"{len(groups.unready)} unready pod(s) counted at 0")
    rule = "MissingMetricsRebalancing" if groups.missing else "UnreadyPodsRebalancing"
    detail = "; ".join(parts) or "pods without metrics left out"
    notes = [CalculationNote(rule, naive, result,
                             f"{detail}: usage ratio {ratio:.4g} became {new_ratio:.4g}")]
    if within or flipped:
        why = ("the rebalanced ratio is within the tolerance" if within
               else "rebalancing would reverse the scaling direction")
        notes.append(CalculationNote("Tolerance" if within else "DirectionFlip", naive, current,
                                     why))
    return tuple(notes)


def _finish_rebalanced(*, ratio: float, new_ratio: float, metrics_count: int,
                       current_replicas: int, tolerances: Tolerances, groups: PodGroups,
                       scale_up_with_unready: bool) -> tuple[int, tuple[CalculationNote, ...]]:
    naive = _ceil_int32(ratio * float(groups.ready))
    within = tolerances.is_within(new_ratio)
    flipped = (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio)
    if within or flipped:
        return current_replicas, _rebalance_notes(
            ratio=ratio, new_ratio=new_ratio, groups=groups, naive=naive, result=current_replicas,
            scale_up_with_unready=scale_up_with_unready, flipped=flipped, within=within,
            current=current_replicas)
    new_replicas = _ceil_int32(new_ratio * float(metrics_count))
    if (new_ratio < 1.0 and new_replicas > current_replicas) or \
            (new_ratio > 1.0 and new_replicas < current_replicas):
        notes = _rebalance_notes(
            ratio=ratio, new_ratio=new_ratio, groups=groups, naive=naive, result=current_replicas,
            scale_up_with_unready=scale_up_with_unready, flipped=False, within=False,
            current=current_replicas)
        return current_replicas, (*notes, CalculationNote(
            "DirectionFlip", new_replicas, current_replicas,
            "counting every pod would reverse the scaling direction"))
    return new_replicas, _rebalance_notes(
        ratio=ratio, new_ratio=new_ratio, groups=groups, naive=naive, result=new_replicas,
        scale_up_with_unready=scale_up_with_unready, flipped=False, within=False,
        current=current_replicas)


def _tolerance_note(ratio: float, ready: int, current: int) -> tuple[CalculationNote, ...]:
    would = _ceil_int32(ratio * float(ready))
    if would == current:
        return ()
    return (CalculationNote("Tolerance", would, current,
                            f"usage ratio {ratio:.4g} is within the tolerance"),)


def get_resource_replicas(*, current_replicas: int, target_utilization: int, resource: str,
                          container: str, tolerances: Tolerances, pods: Sequence[Pod],
                          metrics: MetricInput, rules: ReadinessRules,
                          pod_level_resources: bool = True) -> ReplicaCalculation:
    """GetResourceReplicas: a Utilization target on a resource (optionally one container)."""
    try:
        pod_metrics, timestamp = resource_pod_metrics(metrics, resource=resource,
                                                      container=container)
    except CalculationError as err:
        raise CalculationError(f"unable to get metrics for resource {resource}: {err}") from None
    groups = _ready_groups(pods, pod_metrics, resource=resource, rules=rules)
    requests = calculate_requests(pods, container=container, resource=resource,
                                  pod_level_resources=pod_level_resources)
    ratio, utilization, raw = resource_utilization_ratio(pod_metrics, requests, target_utilization)

    scale_up_with_unready = bool(groups.unready) and ratio > 1.0
    if not scale_up_with_unready and not groups.missing:
        if tolerances.is_within(ratio):
            return ReplicaCalculation(
                replicas=current_replicas, usage=raw, utilization=utilization,
                timestamp=timestamp, ratio=ratio, groups=groups,
                notes=_tolerance_note(ratio, groups.ready, current_replicas))
        return ReplicaCalculation(
            replicas=_ceil_int32(ratio * float(groups.ready)), usage=raw,
            utilization=utilization, timestamp=timestamp, ratio=ratio, groups=groups)

    # on a scale-down, a pod without metrics is taken to use its request, or the target when
    # the target is above 100%
    fallback = max(100, target_utilization)
    _fill_for_rebalance(pod_metrics, groups, ratio=ratio,
                        scale_up_with_unready=scale_up_with_unready,
                        scale_down_usage=lambda name: _go_div(requests.get(name, 0) * fallback,
                                                              100))

    new_ratio, _, _ = resource_utilization_ratio(pod_metrics, requests, target_utilization)
    replicas, notes = _finish_rebalanced(
        ratio=ratio, new_ratio=new_ratio, metrics_count=len(pod_metrics),
        current_replicas=current_replicas, tolerances=tolerances, groups=groups,
        scale_up_with_unready=scale_up_with_unready)
    return ReplicaCalculation(replicas=replicas, usage=raw, utilization=utilization,
                              timestamp=timestamp, ratio=ratio, new_ratio=new_ratio,
                              groups=groups, notes=notes)


def _plain_metric_replicas(*, pod_metrics: dict[str, PodMetric], current_replicas: int,
                           target_usage: int, tolerances: Tolerances, pods: Sequence[Pod],
                           resource: str, rules: ReadinessRules,
                           timestamp: datetime) -> ReplicaCalculation:
    """calcPlainMetricReplicas: average-value targets (raw resource usage, Pods metrics)."""
    groups = _ready_groups(pods, pod_metrics, resource=resource, rules=rules)
    ratio, usage = metric_usage_ratio(pod_metrics, target_usage)

    scale_up_with_unready = bool(groups.unready) and ratio > 1.0
    if not scale_up_with_unready and not groups.missing:
        if tolerances.is_within(ratio):
            return ReplicaCalculation(replicas=current_replicas, usage=usage, timestamp=timestamp,
                                      ratio=ratio, groups=groups,
                                      notes=_tolerance_note(ratio, groups.ready, current_replicas))
        return ReplicaCalculation(replicas=_ceil_int32(ratio * float(groups.ready)), usage=usage,
                                  timestamp=timestamp, ratio=ratio, groups=groups)

    _fill_for_rebalance(pod_metrics, groups, ratio=ratio,
                        scale_up_with_unready=scale_up_with_unready,
                        scale_down_usage=lambda name: target_usage)  # exactly the target

    new_ratio, _ = metric_usage_ratio(pod_metrics, target_usage)
    replicas, notes = _finish_rebalanced(
        ratio=ratio, new_ratio=new_ratio, metrics_count=len(pod_metrics),
        current_replicas=current_replicas, tolerances=tolerances, groups=groups,
        scale_up_with_unready=scale_up_with_unready)
    return ReplicaCalculation(replicas=replicas, usage=usage, timestamp=timestamp, ratio=ratio,
                              new_ratio=new_ratio, groups=groups, notes=notes)


def get_raw_resource_replicas(*, current_replicas: int, target_usage: int, resource: str,
                              container: str, tolerances: Tolerances, pods: Sequence[Pod],
                              metrics: MetricInput, rules: ReadinessRules) -> ReplicaCalculation:
    """GetRawResourceReplicas: an AverageValue target on a resource."""
    try:
        pod_metrics, timestamp = resource_pod_metrics(metrics, resource=resource,
                                                      container=container)
    except CalculationError as err:
        raise CalculationError(f"unable to get metrics for resource {resource}: {err}") from None
    return _plain_metric_replicas(pod_metrics=pod_metrics, current_replicas=current_replicas,
                                  target_usage=target_usage, tolerances=tolerances, pods=pods,
                                  resource=resource, rules=rules, timestamp=timestamp)


def get_metric_replicas(*, current_replicas: int, target_usage: int, metric_name: str,
                        tolerances: Tolerances, pods: Sequence[Pod], metrics: MetricInput,
                        rules: ReadinessRules) -> ReplicaCalculation:
    """GetMetricReplicas: a Pods metric (no cpu readiness rules)."""
    try:
        pod_metrics, timestamp = custom_pod_metrics(metrics)
    except CalculationError as err:
        raise CalculationError(f"unable to get metric {metric_name}: {err}") from None
    return _plain_metric_replicas(pod_metrics=pod_metrics, current_replicas=current_replicas,
                                  target_usage=target_usage, tolerances=tolerances, pods=pods,
                                  resource="", rules=rules, timestamp=timestamp)


def _usage_ratio_replica_count(*, current_replicas: int, ratio: float, tolerances: Tolerances,
                               pods: Sequence[Pod]) -> tuple[int, int | None,
                                                             tuple[CalculationNote, ...]]:
    """getUsageRatioReplicaCount: (replicas, ready pods counted, notes)."""
    if current_replicas != 0:
        if tolerances.is_within(ratio):
            notes: tuple[CalculationNote, ...] = ()
            if pods:  # what it would have been, for the explanation only
                would = _ceil_int32(ratio * float(_ready(pods)))
                if would != current_replicas:
                    notes = (CalculationNote("Tolerance", would, current_replicas,
                                             f"usage ratio {ratio:.4g} is within the tolerance"),)
            return current_replicas, None, notes
        try:
            ready = ready_pods_count(pods)
        except CalculationError as err:
            raise CalculationError(f"unable to calculate ready pods: {err}") from None
        proposal = ratio * float(ready)
        if proposal > INT32_MAX:
            return INT32_MAX, ready, ()
        return _ceil_int32(proposal), ready, ()
    # from zero replicas: neither tolerance nor pods play a part
    return _ceil_int32(ratio), None, ()


def get_object_metric_replicas(*, current_replicas: int, target_usage: int, metric_name: str,
                               object_kind: str, object_name: str, namespace: str,
                               tolerances: Tolerances, pods: Sequence[Pod],
                               metrics: MetricInput) -> ReplicaCalculation:
    """GetObjectMetricReplicas: an Object metric with a Value target."""
    try:
        usage, _ = object_metric_value(metrics)
    except CalculationError as err:
        raise CalculationError(f"unable to get metric {metric_name} on {object_kind} "
                               f"{namespace}/{object_name}: {err}") from None
    ratio = _fdiv(float(usage), float(target_usage))
    replicas, ready, notes = _usage_ratio_replica_count(
        current_replicas=current_replicas, ratio=ratio, tolerances=tolerances, pods=pods)
    # upstream drops the object's timestamp here and reports the zero time
    return ReplicaCalculation(replicas=replicas, usage=usage, timestamp=GO_ZERO_TIME, ratio=ratio,
                              ready_pods=ready, notes=notes)


def per_pod_usage(usage: int, status_replicas: int) -> int:
    """getPerPodUsage: ceil(usage / replicas); MaxInt64 on overflow, 0 for zero replicas."""
    if float(usage) >= float(INT64_MAX):
        return INT64_MAX
    if status_replicas == 0:
        return 0
    value = math.ceil(_fdiv(float(usage), float(status_replicas)))
    return int(value)


def _per_pod_replicas(*, usage: int, target: int, status_replicas: int, tolerances: Tolerances,
                      clamp: bool) -> tuple[int, float, tuple[CalculationNote, ...]]:
    """The per-pod (AverageValue) Object/External rule: ceil(usage / target) when not tolerated.

    Only the External variant clamps to MaxInt32; the Object one converts like Go's int32().
    """
    ratio = _fdiv(float(usage), float(target) * float(status_replicas))
    per_target = _fdiv(float(usage), float(target))
    rounded = float(math.ceil(per_target)) if math.isfinite(per_target) else per_target
    proposal = INT32_MAX if clamp and rounded > INT32_MAX else go_float_to_int32(rounded)
    if tolerances.is_within(ratio):
        notes: tuple[CalculationNote, ...] = ()
        if proposal != status_replicas:
            notes = (CalculationNote("Tolerance", proposal, status_replicas,
                                     f"usage ratio {ratio:.4g} is within the tolerance"),)
        return status_replicas, ratio, notes
    return proposal, ratio, ()


def get_object_per_pod_metric_replicas(*, status_replicas: int, target_average_usage: int,
                                       metric_name: str, object_kind: str, object_name: str,
                                       namespace: str, tolerances: Tolerances,
                                       metrics: MetricInput) -> ReplicaCalculation:
    """GetObjectPerPodMetricReplicas: an Object metric with an AverageValue target."""
    try:
        usage, timestamp = object_metric_value(metrics)
    except CalculationError as err:
        raise CalculationError(f"unable to get metric {metric_name} on {object_kind} "
                               f"{namespace}/{object_name}: {err}") from None
    replicas, ratio, notes = _per_pod_replicas(usage=usage, target=target_average_usage,
                                               status_replicas=status_replicas,
                                               tolerances=tolerances, clamp=False)
    return ReplicaCalculation(replicas=replicas, usage=per_pod_usage(usage, status_replicas),
                              timestamp=timestamp, ratio=ratio, notes=notes)


def _external_error(namespace: str, metric_name: str, selector_text: str,
                    err: CalculationError) -> CalculationError:
    return CalculationError(
        f"unable to get external metric {namespace}/{metric_name}/{selector_text}: {err}")


def get_external_metric_replicas(*, current_replicas: int, target_usage: int, metric_name: str,
                                 namespace: str, selector_text: str, tolerances: Tolerances,
                                 pods: Sequence[Pod], metrics: MetricInput) -> ReplicaCalculation:
    """GetExternalMetricReplicas: an External metric with a Value target (the sum)."""
    try:
        values, _ = external_metric_values(metrics)
    except CalculationError as err:
        raise _external_error(namespace, metric_name, selector_text, err) from None
    usage = 0
    for value in values:
        if value > 0 and usage > INT64_MAX - value:
            usage = INT64_MAX  # capped on positive overflow
            break
        usage = _wrap64(usage + value)
    ratio = _fdiv(float(usage), float(target_usage))
    replicas, ready, notes = _usage_ratio_replica_count(
        current_replicas=current_replicas, ratio=ratio, tolerances=tolerances, pods=pods)
    return ReplicaCalculation(replicas=replicas, usage=usage, timestamp=GO_ZERO_TIME, ratio=ratio,
                              ready_pods=ready, notes=notes)


def get_external_per_pod_metric_replicas(*, status_replicas: int, target_usage_per_pod: int,
                                         metric_name: str, namespace: str, selector_text: str,
                                         tolerances: Tolerances,
                                         metrics: MetricInput) -> ReplicaCalculation:
    """GetExternalPerPodMetricReplicas: an External metric with an AverageValue target."""
    try:
        values, timestamp = external_metric_values(metrics)
    except CalculationError as err:
        raise _external_error(namespace, metric_name, selector_text, err) from None
    usage = 0
    for value in values:
        usage = _wrap64(usage + value)
        if usage < 0:  # only an int64 overflow gets here
            usage = INT64_MAX
            break
    replicas, ratio, notes = _per_pod_replicas(usage=usage, target=target_usage_per_pod,
                                               status_replicas=status_replicas,
                                               tolerances=tolerances, clamp=True)
    return ReplicaCalculation(replicas=replicas, usage=per_pod_usage(usage, status_replicas),
                              timestamp=timestamp, ratio=ratio, notes=notes)
