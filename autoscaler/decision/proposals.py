"""What the metrics propose: upstream's computeReplicasForMetrics, computeReplicasForMetric
and computeStatusFor*Metric (horizontal.go), over the replica calculator (replicas.py).

Each `spec.metrics` entry proposes a replica count with its status, or fails with upstream's
event and condition; a failing metric with a `fallback` proposes the fallback's replicas once it
has failed long enough (fallback.py). The most replicas win, as upstream's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import NamedTuple

from autoscaler.decision.conditions import (
    FALSE,
    SCALING_ACTIVE,
    TRUE,
    Messages,
    set_condition,
)
from autoscaler.decision.events import Event
from autoscaler.decision.fallback import count_failure, fallback_replicas, falls_back
from autoscaler.decision.outcome import MetricDetail
from autoscaler.decision.replicas import (
    CalculationError,
    CalculationNote,
    ReadinessRules,
    ReplicaCalculation,
    Tolerances,
    get_external_metric_replicas,
    get_external_per_pod_metric_replicas,
    get_metric_replicas,
    get_object_metric_replicas,
    get_object_per_pod_metric_replicas,
    get_raw_resource_replicas,
    get_resource_replicas,
)
from autoscaler.decision.settings import Settings
from autoscaler.model.fields import Quantity
from autoscaler.model.history import MetricFailure
from autoscaler.model.metrics import MetricInput
from autoscaler.model.objects import Autoscaler
from autoscaler.model.pods import Pod, Scale, pods_matching
from autoscaler.model.spec import MetricSpec, MetricTarget
from autoscaler.model.status import (
    Condition,
    ContainerResourceMetricStatus,
    ExternalMetricStatus,
    MetricStatus,
    MetricValueStatus,
    ObjectMetricStatus,
    PodsMetricStatus,
    ResourceMetricStatus,
)
from metricscale.core.quantity import Format
from metricscale.core.selectors import (
    LabelSelector,
    Selector,
    SelectorError,
    format_label_selector,
    parse_selector,
    quote_go_string,
    selector_from_label_selector,
)

__all__ = [
    "MetricsResult",
    "approximate_float",
    "compute_replicas_for_metrics",
    "tolerances_for",
]


# --------------------------------------------------------------------------------------------
# Helpers


def approximate_float(quantity: Quantity) -> float:
    """Quantity.AsApproximateFloat64: unscaled digits times a power of ten, in float64."""
    sign, digits, exponent = quantity.value.as_tuple()
    if not isinstance(exponent, int):
        return float(quantity.value)
    base = float(int("".join(map(str, digits)) or "0"))
    if sign:
        base = -base
    if exponent == 0:
        return base
    # Go's math.Pow(10, e) is the correctly rounded power for the exponents quantities have
    return base * math.pow(10.0, exponent)


def tolerances_for(autoscaler: Autoscaler, settings: Settings) -> Tolerances:
    """tolerancesForHpa: the flag's tolerance, per direction overridden by spec.behavior."""
    down = up = settings.tolerance
    behavior = autoscaler.spec.behavior
    if behavior is not None:
        if behavior.scale_down is not None and behavior.scale_down.tolerance is not None:
            down = approximate_float(behavior.scale_down.tolerance)
        if behavior.scale_up is not None and behavior.scale_up.tolerance is not None:
            up = approximate_float(behavior.scale_up.tolerance)
    return Tolerances(scale_down=down, scale_up=up)


def _build_quantity(resource: str, milli: int) -> Quantity:
    """buildQuantity: memory in BinarySI (as metrics-server reports it), the rest DecimalSI."""
    return Quantity.from_milli(milli, Format.BINARY_SI if resource == "memory"
                               else Format.DECIMAL_SI)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


@functools.lru_cache(maxsize=1024)
def _fmt_target(target: MetricTarget) -> str:
    if target.average_utilization is not None and target.average_value is None:
        return f"{target.average_utilization}%"
    quantity = target.average_value or target.value
    return quantity.text if quantity is not None else "(none)"


def _with_calculation(head: _Head, calc: ReplicaCalculation, *, description: str,
                      current: str, label: str = "") -> MetricDetail:
    groups = calc.groups
    ready, unready, missing, ignored = (
        (calc.ready_pods, None, None, None) if groups is None else
        (groups.ready, len(groups.unready), len(groups.missing), len(groups.ignored)))
    return MetricDetail(index=head.metric_index, type=head.type, name=head.name,
                        target=head.target, description=description, label=label,
                        proposed_replicas=calc.replicas, current=current,
                        ratio=_finite(calc.ratio), ready_pods=ready, unready_pods=unready,
                        missing_pods=missing, ignored_pods=ignored)


# --------------------------------------------------------------------------------------------
# One metric: computeReplicasForMetric and computeStatusFor*Metric


class _MetricOutcome(NamedTuple):
    detail: MetricDetail
    events: tuple[Event, ...] = ()
    replicas: int = 0
    name: str = ""
    timestamp: datetime | None = None
    status: MetricStatus | None = None
    error: str | None = None  # the error computeReplicasForMetric returns
    condition: tuple[str, str] | None = None  # (reason, message) for ScalingActive=False
    notes: tuple[CalculationNote, ...] = ()


class _MetricContext(NamedTuple):
    spec_replicas: int
    status_replicas: int
    pods: Sequence[Pod]
    namespace: str
    tolerances: Tolerances
    readiness: ReadinessRules


class _Head(NamedTuple):
    """A metric's identity in its MetricDetail, before the outcome is known."""

    metric_index: int
    type: str
    name: str
    target: str | None


def _failed(head: _Head, *, reason: str, event_error: str,
            returned_error: str) -> _MetricOutcome:
    """getUnableComputeReplicaCountCondition: a Warning event and a proposed condition."""
    return _MetricOutcome(
        detail=MetricDetail(index=head.metric_index, type=head.type, name=head.name,
                            target=head.target, error=event_error, reason=reason),
        events=(Event("Warning", reason, event_error),),
        error=returned_error,
        condition=(reason, Messages.UNABLE_TO_COMPUTE.format(event_error)),
    )


def _readable_selector(selector: LabelSelector | None) -> str:
    """A metric selector as kubectl prints selectors, after a space and in parentheses
    (" (queue=orders)"); "" for none, and for one that does not convert (that metric fails)."""
    if selector is None:
        return ""
    try:
        text = str(selector_from_label_selector(selector))
    except SelectorError:
        return ""
    return f" ({text})" if text else ""


def _selector_error(selector: LabelSelector | None) -> str | None:
    if selector is None:
        return None
    try:
        selector_from_label_selector(selector)
    except SelectorError as err:
        return str(err)
    return None


def _resource_metric(index: int, metric: MetricSpec, data: MetricInput,
                     ctx: _MetricContext) -> _MetricOutcome:
    """computeStatusForResourceMetric and computeStatusForContainerResourceMetric (both
    through computeStatusForResourceMetricGeneric)."""
    container_source = metric.container_resource
    if container_source is not None:
        resource, target, container = (container_source.name, container_source.target,
                                       container_source.container)
        reason = "FailedGetContainerResourceMetric"
        wrap = f"failed to get {container} container metric value: "
    else:
        assert metric.resource is not None
        resource, target, container = metric.resource.name, metric.resource.target, ""
        reason = "FailedGetResourceMetric"
        wrap = f"failed to get {resource} resource metric value: "
    head = _Head(index, metric.type, resource, _fmt_target(target))
    try:
        if target.average_value is not None:
            try:
                calc = get_raw_resource_replicas(
                    current_replicas=ctx.spec_replicas, target_usage=target.average_value.milli,
                    resource=resource, container=container, tolerances=ctx.tolerances,
                    pods=ctx.pods, metrics=data, rules=ctx.readiness)
            except CalculationError as err:
                raise CalculationError(f"failed to get {resource} usage: {err}") from None
            name = f"{resource} resource"
            quantity = _build_quantity(resource, calc.usage)
            current = MetricValueStatus(average_value=quantity)
            shown = quantity.text
        elif target.average_utilization is None:
            raise CalculationError(
                "invalid resource metric source: neither an average utilization target nor an "
                "average value (usage) target was set")
        else:
            try:
                calc = get_resource_replicas(
                    current_replicas=ctx.spec_replicas,
                    target_utilization=target.average_utilization, resource=resource,
                    container=container, tolerances=ctx.tolerances, pods=ctx.pods, metrics=data,
                    rules=ctx.readiness)
            except CalculationError as err:
                raise CalculationError(f"failed to get {resource} utilization: {err}") from None
            name = (f"{resource} container resource utilization (percentage of request)"
                    if container_source is not None
                    else f"{resource} resource utilization (percentage of request)")
            quantity = _build_quantity(resource, calc.usage)
            current = MetricValueStatus(average_value=quantity,
                                        average_utilization=calc.utilization)
            shown = f"{calc.utilization}% ({quantity.text} average)"
    except CalculationError as err:
        return _failed(head, reason=reason, event_error=str(err),
                       returned_error=wrap + str(err))
    if container_source is not None:
        status = MetricStatus(type=metric.type, container_resource=ContainerResourceMetricStatus(
            name=resource, container=container, current=current))
    else:
        status = MetricStatus(type=metric.type, resource=ResourceMetricStatus(
            name=resource, current=current))
    detail = _with_calculation(head, calc, description=name, current=shown)
    return _MetricOutcome(detail=detail, replicas=calc.replicas, name=name,
                          timestamp=calc.timestamp, status=status, notes=calc.notes)


def _pods_metric(index: int, metric: MetricSpec, data: MetricInput,
                 ctx: _MetricContext) -> _MetricOutcome:
    """computeStatusForPodsMetric, with computeReplicasForMetric's selector check."""
    source = metric.pods
    assert source is not None and source.target.average_value is not None
    reason = "FailedGetPodsMetric"
    head = _Head(index, metric.type, source.metric.name, _fmt_target(source.target))
    selector_error = _selector_error(source.metric.selector)
    if selector_error is not None:
        return _failed(head, reason=reason, event_error=selector_error,
                       returned_error=f"failed to get pods metric value: {selector_error}")
    try:
        calc = get_metric_replicas(current_replicas=ctx.spec_replicas,
                                   target_usage=source.target.average_value.milli,
                                   metric_name=source.metric.name, tolerances=ctx.tolerances,
                                   pods=ctx.pods, metrics=data, rules=ctx.readiness)
    except CalculationError as err:
        return _failed(head, reason=reason, event_error=str(err),
                       returned_error=f"failed to get pods metric value: {err}")
    name = f"pods metric {source.metric.name}"
    quantity = Quantity.from_milli(calc.usage)
    status = MetricStatus(type=metric.type, pods=PodsMetricStatus(
        metric=source.metric,
        current=MetricValueStatus(average_value=quantity)))
    detail = _with_calculation(head, calc, description=name, current=quantity.text)
    return _MetricOutcome(detail=detail, replicas=calc.replicas, name=name,
                          timestamp=calc.timestamp, status=status, notes=calc.notes)


def _object_metric(index: int, metric: MetricSpec, data: MetricInput,
                   ctx: _MetricContext) -> _MetricOutcome:
    """computeStatusForObjectMetric, with computeReplicasForMetric's selector check."""
    source = metric.object
    assert source is not None
    reason = "FailedGetObjectMetric"
    wrap = "failed to get object metric value: "
    target = source.target
    head = _Head(index, metric.type, source.metric.name, _fmt_target(target))
    selector_error = _selector_error(source.metric.selector)
    if selector_error is not None:
        return _failed(head, reason=reason, event_error=selector_error,
                       returned_error=wrap + selector_error)
    identifier = source.metric
    ref = source.described_object
    if target.type == "Value" and target.value is not None:
        try:
            calc = get_object_metric_replicas(
                current_replicas=ctx.spec_replicas, target_usage=target.value.milli,
                metric_name=source.metric.name, object_kind=ref.kind, object_name=ref.name,
                namespace=ctx.namespace, tolerances=ctx.tolerances, pods=ctx.pods, metrics=data)
        except CalculationError as err:
            return _failed(head, reason=reason, event_error=str(err),
                           returned_error=wrap + str(err))
        quantity = Quantity.from_milli(calc.usage)
        current = MetricValueStatus(value=quantity)
        name = f"{ref.kind} metric {source.metric.name}"
        label = name
    elif target.type == "AverageValue" and target.average_value is not None:
        try:
            calc = get_object_per_pod_metric_replicas(
                status_replicas=ctx.status_replicas,
                target_average_usage=target.average_value.milli,
                metric_name=source.metric.name, object_kind=ref.kind, object_name=ref.name,
                namespace=ctx.namespace, tolerances=ctx.tolerances, metrics=data)
        except CalculationError as err:
            return _failed(head, reason=reason, event_error=str(err),
                           returned_error=f"{wrap}failed to get {source.metric.name} "
                                          f"object metric: {err}")
        quantity = Quantity.from_milli(calc.usage)
        current = MetricValueStatus(average_value=quantity)
        # upstream names Object AverageValue metrics like External ones
        name = (f"external metric {source.metric.name}"
                f"({format_label_selector(source.metric.selector)})")
        label = (f"{ref.kind} metric {source.metric.name}"
                 f"{_readable_selector(source.metric.selector)} per pod")
    else:
        message = ("invalid object metric source: neither a value target nor an average value "
                   "target was set")
        return _failed(head, reason=reason, event_error=message, returned_error=wrap + message)
    status = MetricStatus(type=metric.type, object=ObjectMetricStatus(
        metric=identifier, current=current, described_object=ref))
    detail = _with_calculation(head, calc, description=name, current=quantity.text,
                               label=label)
    return _MetricOutcome(detail=detail, replicas=calc.replicas, name=name,
                          timestamp=calc.timestamp, status=status, notes=calc.notes)


def _external_metric(index: int, metric: MetricSpec, data: MetricInput,
                     ctx: _MetricContext) -> _MetricOutcome:
    """computeStatusForExternalMetric."""
    source = metric.external
    assert source is not None
    reason = "FailedGetExternalMetric"
    metric_name = source.metric.name
    target = source.target
    head = _Head(index, metric.type, metric_name, _fmt_target(target))
    selector_text = format_label_selector(source.metric.selector)
    name = f"external metric {metric_name}({selector_text})"
    label = f"external metric {metric_name}{_readable_selector(source.metric.selector)}"
    identifier = source.metric
    if target.average_value is not None:
        try:
            selector_error = _selector_error(source.metric.selector)
            if selector_error is not None:
                raise CalculationError(selector_error)
            calc = get_external_per_pod_metric_replicas(
                status_replicas=ctx.status_replicas,
                target_usage_per_pod=target.average_value.milli, metric_name=metric_name,
                namespace=ctx.namespace, selector_text=selector_text,
                tolerances=ctx.tolerances, metrics=data)
        except CalculationError as err:
            return _failed(head, reason=reason, event_error=str(err),
                           returned_error=f"failed to get {metric_name} external metric "
                                          f"value: failed to get {metric_name} external "
                                          f"metric: {err}")
        quantity = Quantity.from_milli(calc.usage)
        current = MetricValueStatus(average_value=quantity)
    elif target.value is not None:
        try:
            selector_error = _selector_error(source.metric.selector)
            if selector_error is not None:
                raise CalculationError(selector_error)
            calc = get_external_metric_replicas(
                current_replicas=ctx.spec_replicas, target_usage=target.value.milli,
                metric_name=metric_name, namespace=ctx.namespace, selector_text=selector_text,
                tolerances=ctx.tolerances, pods=ctx.pods, metrics=data)
        except CalculationError as err:
            return _failed(head, reason=reason, event_error=str(err),
                           returned_error=f"failed to get {metric_name} external metric "
                                          f"value: failed to get external metric "
                                          f"{metric_name}: {err}")
        quantity = Quantity.from_milli(calc.usage)
        current = MetricValueStatus(value=quantity)
    else:
        message = ("invalid external metric source: neither a value target nor an average value "
                   "target was set")
        return _failed(head, reason=reason, event_error=message,
                       returned_error=f"failed to get {metric_name} external metric value: "
                                      + message)
    status = MetricStatus(type=metric.type, external=ExternalMetricStatus(
        metric=identifier, current=current))
    detail = _with_calculation(head, calc, description=name, current=quantity.text,
                               label=label)
    return _MetricOutcome(detail=detail, replicas=calc.replicas, name=name,
                          timestamp=calc.timestamp, status=status, notes=calc.notes)


def _compute_replicas_for_metric(index: int, metric: MetricSpec, data: MetricInput,
                                 ctx: _MetricContext) -> _MetricOutcome:
    """computeReplicasForMetric: the metric's type picks its computeStatusFor*Metric."""
    if metric.type in {"Resource", "ContainerResource"}:
        return _resource_metric(index, metric, data, ctx)
    if metric.type == "Pods":
        return _pods_metric(index, metric, data, ctx)
    if metric.type == "Object":
        return _object_metric(index, metric, data, ctx)
    if metric.type == "External":
        return _external_metric(index, metric, data, ctx)
    message = f"unknown metric source type {quote_go_string(metric.type)}"
    head = _Head(index, metric.type, "", None)
    return _failed(head, reason="InvalidMetricSourceType", event_error=message,
                   returned_error=message)


# --------------------------------------------------------------------------------------------
# All metrics: computeReplicasForMetrics


class MetricsResult(NamedTuple):
    """What computeReplicasForMetrics returns, with each metric's detail and fallback."""

    replicas: int  # -1: failure, nothing to scale on
    name: str
    statuses: tuple[MetricStatus, ...]
    error: str | None
    conditions: tuple[Condition, ...]
    events: tuple[Event, ...]
    details: tuple[MetricDetail, ...]
    notes: tuple[CalculationNote, ...]
    blocked_scale_down: int | None  # the valid proposal a failing metric refused
    winner: int = -1  # the index of the metric whose proposal won
    failures: tuple[MetricFailure, ...] = ()  # metrics with a fallback whose reads fail
    fallbacks: tuple[tuple[int, int, int], ...] = ()  # (metric, proposal, failures) in use


_NO_STATUS = MetricStatus()  # a metric that could not be used (immutable: shared)


def _selector_problem(autoscaler: Autoscaler, scale: Scale, pods: Sequence[Pod],
                      other_selectors: Mapping[str, str]
                      ) -> tuple[Selector | None, tuple[str, str, str, str] | None, list[Pod]]:
    """validateAndParseSelector: (selector, (event reason, event text, condition reason,
    condition message, error)?, listed pods)."""
    if not scale.selector:
        return None, ("SelectorRequired", "selector is required", "InvalidSelector",
                      Messages.MISSING_SELECTOR), []
    try:
        selector = parse_selector(scale.selector)
    except SelectorError as err:
        message = f"couldn't convert selector into a corresponding internal selector object: {err}"
        return None, ("InvalidSelector", message, "InvalidSelector", message), []
    namespace = autoscaler.metadata.namespace
    listed = pods_matching(pods, selector, namespace)
    if listed:
        for other, text in sorted(other_selectors.items()):
            try:
                other_selector = parse_selector(text)
            except SelectorError:
                continue
            if any(other_selector.matches(pod.labels) for pod in listed):
                keys = f"[{namespace}/{autoscaler.metadata.name} {namespace}/{other}]"
                message = (f"pods by selector {scale.selector} are controlled by more than one "
                           f"HPA (e.g. {keys})")
                return None, ("AmbiguousSelector", message, "AmbiguousSelector", message), []
    return selector, None, listed


@dataclass
class _Tally:
    """What the loop over spec.metrics has gathered so far (upstream's local variables)."""

    statuses: list[MetricStatus]
    previous: dict[int, MetricFailure]  # the failed reads in a row before this sync
    events: list[Event] = field(default_factory=list)
    details: list[MetricDetail] = field(default_factory=list)
    invalid: int = 0
    first_error: str | None = None
    first_condition: tuple[str, str] | None = None
    replicas: int = 0
    name: str = ""
    notes: tuple[CalculationNote, ...] = ()
    winner: int = -1
    failing: list[MetricFailure] = field(default_factory=list)
    fallbacks: list[tuple[int, int, int]] = field(default_factory=list)

    def fall_back(self, index: int, metric: MetricSpec, *, current: int,
                  now: datetime) -> bool:
        """Count a failed read of a metric with a fallback; True when it proposes its
        fallback's replicas instead of failing."""
        assert metric.fallback is not None
        failure = count_failure(self.previous.get(index), metric=index, now=now)
        self.failing.append(failure)
        if not falls_back(metric.fallback, failure, now):
            return False
        proposal = fallback_replicas(metric.fallback, current=current)
        self.fallbacks.append((index, proposal, failure.failures))
        detail = self.details[-1]
        self.details[-1] = replace(detail, proposed_replicas=proposal, reason="Fallback")
        if self.replicas == 0 or proposal > self.replicas:
            label = detail.description or f"{metric.type} metric {detail.name}".strip()
            self.replicas, self.name, self.notes = proposal, f"{label} (fallback)", ()
            self.winner = index
        return True


def compute_replicas_for_metrics(*, autoscaler: Autoscaler, scale: Scale, pods: Sequence[Pod],
                                 metrics: Sequence[MetricInput], conditions: tuple[Condition, ...],
                                 settings: Settings, now: datetime,
                                 other_selectors: Mapping[str, str],
                                 failures: Sequence[MetricFailure] = ()) -> MetricsResult:
    """computeReplicasForMetrics: the most replicas any metric proposes, each metric's status
    and the ScalingActive condition; a failing metric blocks a scale-down (as upstream's),
    and with a fallback proposes its replicas once it has failed long enough."""
    selector, problem, listed = _selector_problem(autoscaler, scale, pods, other_selectors)
    if problem is not None or selector is None:
        assert problem is not None
        event_reason, event_text, condition_reason, condition_message = problem
        conditions = set_condition(conditions, type=SCALING_ACTIVE, status=FALSE,
                                   reason=condition_reason, message=condition_message, now=now)
        return MetricsResult(replicas=-1, name="", statuses=(), error=event_text,
                             conditions=conditions,
                             events=(Event("Warning", event_reason, event_text),), details=(),
                             notes=(), blocked_scale_down=None, failures=tuple(failures))

    specs = autoscaler.spec.metrics
    ctx = _MetricContext(
        spec_replicas=scale.spec_replicas, status_replicas=scale.status_replicas, pods=listed,
        namespace=autoscaler.metadata.namespace,
        tolerances=tolerances_for(autoscaler, settings),
        readiness=ReadinessRules(cpu_initialization_period=settings.cpu_initialization_period,
                                 initial_readiness_delay=settings.initial_readiness_delay,
                                 now=now))
    tally = _Tally(statuses=[_NO_STATUS] * len(specs),
                   previous={failure.metric: failure for failure in failures})
    for index, metric in enumerate(specs):
        data = metrics[index] if index < len(metrics) else None
        outcome = _compute_replicas_for_metric(index, metric, data, ctx)
        tally.events.extend(outcome.events)
        tally.details.append(outcome.detail)
        if outcome.error is not None and metric.fallback is not None and tally.fall_back(
                index, metric, current=scale.spec_replicas, now=now):
            continue
        if outcome.error is not None:
            if tally.invalid <= 0:
                tally.first_error, tally.first_condition = outcome.error, outcome.condition
            tally.invalid += 1
            continue
        assert outcome.status is not None
        tally.statuses[index] = outcome.status
        if tally.replicas == 0 or outcome.replicas > tally.replicas:
            tally.replicas, tally.name, tally.notes = outcome.replicas, outcome.name, outcome.notes
            tally.winner = index
    return _metrics_result(tally, conditions=conditions, metrics=len(specs),
                           spec_replicas=scale.spec_replicas, now=now)


def _metrics_result(tally: _Tally, *, conditions: tuple[Condition, ...], metrics: int,
                    spec_replicas: int, now: datetime) -> MetricsResult:
    """The end of computeReplicasForMetrics: the proposal and ScalingActive=True, or the
    failure with the first failing metric's condition."""
    error = None
    if tally.first_error is not None:
        error = f"invalid metrics ({tally.invalid} invalid out of {metrics}), first error is: " \
                f"{tally.first_error}"
    if tally.invalid >= metrics or (tally.invalid > 0 and tally.replicas < spec_replicas):
        reason, message = tally.first_condition or ("", "")
        conditions = set_condition(conditions, type=SCALING_ACTIVE, status=FALSE, reason=reason,
                                   message=message, now=now)
        return MetricsResult(
            replicas=-1, name="", statuses=tuple(tally.statuses), error=error,
            conditions=conditions, events=tuple(tally.events), details=tuple(tally.details),
            notes=(), blocked_scale_down=tally.replicas if tally.invalid < metrics else None,
            failures=tuple(tally.failing), fallbacks=tuple(tally.fallbacks))
    conditions = set_condition(conditions, type=SCALING_ACTIVE, status=TRUE,
                               reason="ValidMetricFound",
                               message=Messages.VALID_METRIC_FOUND.format(tally.name), now=now)
    return MetricsResult(replicas=tally.replicas, name=tally.name,
                         statuses=tuple(tally.statuses), error=error, conditions=conditions,
                         events=tuple(tally.events), details=tuple(tally.details),
                         notes=tally.notes, blocked_scale_down=None, winner=tally.winner,
                         failures=tuple(tally.failing), fallbacks=tuple(tally.fallbacks))
