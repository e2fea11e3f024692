"""One reconcile of an autoscaler, as upstream's horizontal.go makes it, as a pure function.

`decide(...)` computes everything up to the write of the target's scale; when it says
`rescale`, the decision awaits that write: the caller writes `new_replicas` (or, in a dry run,
does not) and hands the outcome to `complete(...)`, which applies upstream's after-write rules
(SucceededRescale or FailedUpdateScale, the events, the scale-event log, lastScaleTime), or
their dry-run form. `explain` completes with a successful write.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import NamedTuple

from autoscaler.decision import behavior as rules
from autoscaler.decision.conditions import (
    ABLE_TO_SCALE,
    ACTIVE,
    FALLBACK,
    FALSE,
    PAUSED,
    SCALED_TO_ZERO,
    SCALING_ACTIVE,
    SCALING_LIMITED,
    TRUE,
    Messages,
    condition_status,
    remove_condition,
    set_condition,
)
from autoscaler.decision.conflicts import (
    CONFLICT_CONDITION,
    CONFLICT_WINDOW,
    conflict_conditions,
    observe_replicas,
)
from autoscaler.decision.events import Event
from autoscaler.decision.pause import Pause, read_pause
from autoscaler.decision.phrases import phrase_replicas
from autoscaler.decision.pod_selection import (
    PodSelection,
    ReplicaSetOwner,
    restrict_pod_metrics,
    select_pods,
)
from autoscaler.decision.replicas import (
    CalculationError,
    CalculationNote,
    ReadinessRules,
    ReplicaCalculation,
    Tolerances,
    external_metric_values,
    get_external_metric_replicas,
    get_external_per_pod_metric_replicas,
    get_metric_replicas,
    get_object_metric_replicas,
    get_object_per_pod_metric_replicas,
    get_raw_resource_replicas,
    get_resource_replicas,
    object_metric_value,
)
from autoscaler.decision.settings import Settings
from autoscaler.model.fields import Quantity
from autoscaler.model.history import History, MetricFailure
from autoscaler.model.metrics import MetricInput
from autoscaler.model.objects import Autoscaler
from autoscaler.model.pods import Pod, Scale, ScaleError, pods_matching
from autoscaler.model.spec import (
    LABEL_SELECTOR,
    AutoscalerSpec,
    Behavior,
    MetricFallback,
    MetricSpec,
    MetricTarget,
)
from autoscaler.model.status import (
    AutoscalerStatus,
    Condition,
    ContainerResourceMetricStatus,
    ExternalMetricStatus,
    MetricStatus,
    MetricValueStatus,
    ObjectMetricStatus,
    PodsMetricStatus,
    ResourceMetricStatus,
)
from autoscaler.model.times import format_time
from metricscale.core.quantity import Format, format_milli
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
    "DRY_RUN_CONDITION_REASON",
    "DRY_RUN_EVENT_REASON",
    "SCALE_WRITE_DRY_RUN",
    "SCALE_WRITE_SUCCEEDED",
    "Decision",
    "Event",
    "Limit",
    "MetricDetail",
    "ScaleWriteResult",
    "approximate_float",
    "complete",
    "decide",
    "readable_text",
    "tolerances_for",
]


class Limit(NamedTuple):
    """A rule that changed the replica count, from what to what."""

    rule: str
    from_replicas: int
    to_replicas: int
    detail: str


@dataclass(frozen=True)
class MetricDetail:
    """One spec.metrics entry: what it proposed and on what grounds (or why it failed)."""

    index: int
    type: str
    name: str
    description: str = ""  # upstream's name for it in messages, e.g. "pods metric qps"
    # How a readable report names it, where upstream's name prints Go values: "external metric
    # qps (queue=orders)" for upstream's "external metric qps(&LabelSelector{...})", and
    # "external metric qps" for "external metric qps(nil)". Empty: the description serves.
    label: str = ""
    proposed_replicas: int | None = None
    current: str | None = None
    target: str | None = None
    ratio: float | None = None
    error: str | None = None
    reason: str | None = None
    ready_pods: int | None = None
    unready_pods: int | None = None
    missing_pods: int | None = None
    ignored_pods: int | None = None

    @property
    def shown_name(self) -> str:
        """The metric's name in a readable report (never Go's rendering of a selector)."""
        return self.label or self.description or f"{self.type} metric {self.name}".strip()


def readable_text(text: str, details: Sequence[MetricDetail]) -> str:
    """`text` (a rescale reason, upstream's words) with each metric's readable name in place
    of upstream's name for it: for a report, never for a status, an event or a log."""
    for detail in details:
        if detail.label and detail.description and detail.label != detail.description:
            text = text.replace(detail.description, detail.label)
    return text


@dataclass(frozen=True)
class ScaleWriteResult:
    """The outcome of writing scale.spec.replicas: written (no `error`), failed (`error`), or
    not made because the autoscaler runs dry (`dry_run`)."""

    error: str | None = None
    dry_run: bool = False

    @property
    def succeeded(self) -> bool:
        return self.error is None and not self.dry_run


SCALE_WRITE_SUCCEEDED = ScaleWriteResult()
SCALE_WRITE_DRY_RUN = ScaleWriteResult(dry_run=True)
DRY_RUN_EVENT_REASON = "DryRunRescale"
DRY_RUN_CONDITION_REASON = "DryRun"


class _Pending(NamedTuple):
    """Everything the after-write step needs (upstream keeps it in local variables)."""

    old_status: AutoscalerStatus
    conditions: tuple[Condition, ...]
    metric_statuses: tuple[MetricStatus, ...]
    current_replicas: int
    new_replicas: int
    min_replicas: int
    reason: str
    history: History
    has_object_or_external: bool
    reference: str
    error: str | None
    behavior: Behavior | None


@dataclass(frozen=True)
class Decision:
    """What one reconcile decided, and what the controller writes and records for it."""

    desired_replicas: int  # the target's size after this reconcile (if the write succeeds)
    rescale: bool  # scale.spec.replicas is (to be) written with new_replicas
    new_replicas: int
    rescale_reason: str
    scale_updated: bool  # the write happened and succeeded
    status: AutoscalerStatus
    events: tuple[Event, ...]
    metrics: tuple[MetricDetail, ...]
    limits: tuple[Limit, ...]
    history: History
    explanation: tuple[str, ...]
    error: str | None = None  # what reconcileAutoscaler returns (for the log)
    pending: _Pending | None = field(default=None, repr=False, compare=False)
    # KEP-5325 with OwnerReferences: the pods this decision left out (None: not selected here)
    ignored_pods: int | None = None
    # The autoscaler's status before this reconcile (for status_changed).
    previous_status: AutoscalerStatus | None = field(default=None, repr=False, compare=False)

    @property
    def status_changed(self) -> bool:
        """Upstream skips the status write when False (compared only when asked: a deep
        comparison the replay's thousands of decisions never need)."""
        return self.previous_status is None or self.status != self.previous_status

    @property
    def awaiting_write(self) -> bool:
        return self.pending is not None


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


def _group_version_error(api_version: str) -> str | None:
    """schema.ParseGroupVersion's error, if any."""
    if not api_version or api_version == "/":
        return None
    if api_version.count("/") > 1:
        return f"unexpected GroupVersion string: {api_version}"
    return None


def _build_quantity(resource: str, milli: int) -> Quantity:
    """buildQuantity: memory in BinarySI (as metrics-server reports it), the rest DecimalSI."""
    return Quantity.from_milli(milli, Format.BINARY_SI if resource == "memory"
                               else Format.DECIMAL_SI)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _fmt_milli(milli: int) -> str:
    return format_milli(milli, Format.DECIMAL_SI)


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


class _MetricsResult(NamedTuple):
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


def _falls_back(fallback: MetricFallback, failure: MetricFailure, now: datetime) -> bool:
    """KEP-5679: after failureThreshold failed reads in a row (or failureDurationSeconds)."""
    if failure.failures >= fallback.failure_threshold:
        return True
    seconds = fallback.failure_duration_seconds
    return seconds is not None and (now - failure.since).total_seconds() >= seconds


def _fallback_replicas(fallback: MetricFallback, *, current: int) -> int:
    """KEDA's fallback behaviors."""
    if fallback.behavior == "currentReplicas":
        return current
    if fallback.behavior == "currentReplicasIfHigher":
        return max(current, fallback.replicas)
    if fallback.behavior == "currentReplicasIfLower":
        return min(current, fallback.replicas)
    return fallback.replicas


def _compute_replicas_for_metrics(*, autoscaler: Autoscaler, scale: Scale, pods: Sequence[Pod],
                                  metrics: Sequence[MetricInput], conditions: tuple[Condition, ...],
                                  settings: Settings, now: datetime,
                                  other_selectors: Mapping[str, str],
                                  failures: Sequence[MetricFailure] = ()) -> _MetricsResult:
    selector, problem, listed = _selector_problem(autoscaler, scale, pods, other_selectors)
    if problem is not None or selector is None:
        assert problem is not None
        event_reason, event_text, condition_reason, condition_message = problem
        conditions = set_condition(conditions, type=SCALING_ACTIVE, status=FALSE,
                                   reason=condition_reason, message=condition_message, now=now)
        return _MetricsResult(replicas=-1, name="", statuses=(), error=event_text,
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
    statuses = [_NO_STATUS] * len(specs)
    events: list[Event] = []
    details: list[MetricDetail] = []
    invalid = 0
    first_error: str | None = None
    first_condition: tuple[str, str] | None = None
    replicas = 0
    name = ""
    notes: tuple[CalculationNote, ...] = ()
    winner = -1
    previous = {failure.metric: failure for failure in failures}
    failing: list[MetricFailure] = []
    fallbacks: list[tuple[int, int, int]] = []
    for index, metric in enumerate(specs):
        data = metrics[index] if index < len(metrics) else None
        outcome = _compute_replicas_for_metric(index, metric, data, ctx)
        events.extend(outcome.events)
        details.append(outcome.detail)
        if outcome.error is not None and metric.fallback is not None:
            before = previous.get(index)
            failure = MetricFailure(metric=index,
                                    failures=(before.failures if before else 0) + 1,
                                    since=before.since if before else now)
            failing.append(failure)
            if _falls_back(metric.fallback, failure, now):
                proposal = _fallback_replicas(metric.fallback, current=scale.spec_replicas)
                fallbacks.append((index, proposal, failure.failures))
                detail = outcome.detail
                details[-1] = replace(detail, proposed_replicas=proposal, reason="Fallback")
                if replicas == 0 or proposal > replicas:
                    label = detail.description or f"{metric.type} metric {detail.name}".strip()
                    replicas, name, notes, winner = proposal, f"{label} (fallback)", (), index
                continue
        if outcome.error is not None:
            if invalid <= 0:
                first_error, first_condition = outcome.error, outcome.condition
            invalid += 1
            continue
        assert outcome.status is not None
        statuses[index] = outcome.status
        if replicas == 0 or outcome.replicas > replicas:
            replicas, name, notes = outcome.replicas, outcome.name, outcome.notes
            winner = index

    error = None
    if first_error is not None:
        error = f"invalid metrics ({invalid} invalid out of {len(specs)}), first error is: " \
                f"{first_error}"
    if invalid >= len(specs) or (invalid > 0 and replicas < scale.spec_replicas):
        reason, message = first_condition or ("", "")
        conditions = set_condition(conditions, type=SCALING_ACTIVE, status=FALSE, reason=reason,
                                   message=message, now=now)
        return _MetricsResult(
            replicas=-1, name="", statuses=tuple(statuses), error=error, conditions=conditions,
            events=tuple(events), details=tuple(details), notes=(),
            blocked_scale_down=replicas if invalid < len(specs) else None,
            failures=tuple(failing), fallbacks=tuple(fallbacks))
    conditions = set_condition(conditions, type=SCALING_ACTIVE, status=TRUE,
                               reason="ValidMetricFound",
                               message=Messages.VALID_METRIC_FOUND.format(name), now=now)
    return _MetricsResult(replicas=replicas, name=name, statuses=tuple(statuses), error=error,
                          conditions=conditions, events=tuple(events), details=tuple(details),
                          notes=notes, blocked_scale_down=None, winner=winner,
                          failures=tuple(failing), fallbacks=tuple(fallbacks))


# --------------------------------------------------------------------------------------------
# The reconcile


_LIMIT_RULES_LEGACY = {"TooFewReplicas": "MinReplicas", "TooManyReplicas": "MaxReplicas",
                       "ScaleUpLimit": "ScaleUpLimit"}
_LIMIT_RULES_BEHAVIOR = {"TooFewReplicas": "MinReplicas", "TooManyReplicas": "MaxReplicas",
                         "ScaleUpLimit": "ScaleUpPolicy", "ScaleDownLimit": "ScaleDownPolicy"}


@dataclass
class _Draft:
    """What one decide() has gathered so far, phase by phase, with the prose that explains it."""

    old: AutoscalerStatus
    reference: str
    conditions: tuple[Condition, ...]
    history: History
    current: int = 0
    min_replicas: int = 1
    max_replicas: int = 1
    events: list[Event] = field(default_factory=list)
    limits: list[Limit] = field(default_factory=list)
    explanation: list[str] = field(default_factory=list)
    details: tuple[MetricDetail, ...] = ()
    metric_statuses: tuple[MetricStatus, ...] = ()
    error: str | None = None
    ignored_pods: int | None = None

    def keep(self, *, desired_replicas: int, status: AutoscalerStatus, reason: str = "",
             error: str | None = None) -> Decision:
        """A decision that writes no scale."""
        return Decision(
            desired_replicas=desired_replicas, rescale=False, new_replicas=desired_replicas,
            rescale_reason=reason, scale_updated=False, status=status,
            previous_status=self.old, events=tuple(self.events),
            metrics=self.details, limits=tuple(self.limits), history=self.history,
            explanation=tuple(self.explanation), error=error, ignored_pods=self.ignored_pods)

    def status(self, *, desired_replicas: int) -> AutoscalerStatus:
        return AutoscalerStatus(current_replicas=self.current, desired_replicas=desired_replicas,
                                last_scale_time=self.old.last_scale_time,
                                current_metrics=self.metric_statuses, conditions=self.conditions)


class _Start(NamedTuple):
    """Where the replica count starts from before metrics: the bounds' say."""

    desired: int
    reason: str
    needs_metrics: bool
    rescale: bool
    scaled_to_zero: bool


def decide(*, autoscaler: Autoscaler, scale: Scale | ScaleError, pods: Sequence[Pod],
           metrics: Sequence[MetricInput], history: History, now: datetime,
           settings: Settings, other_selectors: Mapping[str, str] | None = None,
           replica_sets: Mapping[str, ReplicaSetOwner] | None = None) -> Decision:
    """One reconcile of `autoscaler` (reconcileAutoscaler), up to the write of the scale.

    `pods` are the pods the target's selector matches; `metrics[i]` is what the metrics API
    returned for `spec.metrics[i]` (or the error). `other_selectors` maps the names of the
    other autoscalers in the namespace to their targets' selectors (for upstream's
    AmbiguousSelector check); `explain` has none. `replica_sets` (the namespace's, by name)
    lets podSelectionStrategy OwnerReferences pick the target's own pods; without it the pods
    are counted as given. Phases: read the scale (and watch for other writers), apply the
    bounds, compute the metrics' proposal, stabilize and limit it, then plan the write (or
    keep the size).
    """
    ref = autoscaler.spec.scale_target_ref
    draft = _Draft(old=autoscaler.status, conditions=autoscaler.status.conditions,
                   history=history,
                   reference=f"{ref.kind}/{autoscaler.metadata.namespace}/{ref.name}")
    gv_error = _group_version_error(ref.api_version)
    if gv_error is not None or isinstance(scale, ScaleError):
        return _failed_get_scale(draft, gv_error=gv_error, scale=scale, now=now)
    start = _read_scale_and_bounds(draft, autoscaler=autoscaler, scale=scale, now=now,
                                   settings=settings)
    _watch_scale(draft, observed=scale.spec_replicas, now=now)
    desired, reason, rescale = start.desired, start.reason, start.rescale
    if autoscaler.spec.pod_selection_strategy != LABEL_SELECTOR and replica_sets is not None:
        selection = select_pods(strategy=autoscaler.spec.pod_selection_strategy,
                                target_kind=ref.kind, target_name=ref.name, pods=pods,
                                replica_sets=replica_sets)
        _report_pod_selection(draft, selection, pods=len(pods))
        pods = selection.pods
        metrics = restrict_pod_metrics([m.type for m in autoscaler.spec.metrics], metrics,
                                       pods)
    pause = read_pause(autoscaler.metadata.annotation) if autoscaler.metadata.annotations \
        else None
    _report_pause(draft, pause, now=now)
    behavior = autoscaler.spec.behavior
    if behavior is not None and behavior.sync_period_seconds is not None:
        draft.explanation.append(
            f"This autoscaler is reconciled every {behavior.sync_period_seconds} s "
            "(spec.behavior.syncPeriodSeconds), not every "
            f"{settings.sync_period.total_seconds():g} s (the controller's sync period).")
    if start.needs_metrics:
        result = _compute_replicas_for_metrics(
            autoscaler=autoscaler, scale=scale, pods=pods, metrics=metrics,
            conditions=draft.conditions, settings=settings, now=now,
            other_selectors=other_selectors or {}, failures=draft.history.metric_failures)
        if result.failures != draft.history.metric_failures:
            draft.history = draft.history._replace(metric_failures=result.failures)
        draft.conditions = result.conditions
        _report_fallback(draft, result, autoscaler=autoscaler, now=now)
        if draft.conditions is not result.conditions:
            result = result._replace(conditions=draft.conditions)
        failed = _take_metrics(draft, result)
        pinned = pause is not None and pause.mode == "replicas"
        if failed is not None and not pinned:
            return failed
        if failed is None:
            desired, reason = _metrics_proposal(draft, result, desired=desired)
            desired = _stabilize_and_limit(draft, autoscaler=autoscaler, desired=desired,
                                           settings=settings, now=now)
        else:  # paused at a size: failing metrics do not stop the pause from setting it
            desired = draft.current
        if autoscaler.spec.idle is not None and failed is None:
            desired, reason = _apply_activation(draft, result, autoscaler=autoscaler,
                                                metrics=metrics, desired=desired, reason=reason,
                                                settings=settings, now=now)
        if draft.current == 0 and draft.min_replicas != 0 and start.scaled_to_zero \
                and desired < draft.min_replicas:
            draft.limits.append(Limit("MinReplicas", desired, draft.min_replicas,
                                      "scaling up from zero goes at least to minReplicas"))
            desired = draft.min_replicas
            if not reason:
                reason = "Current number of replicas below Spec.MinReplicas"
        rescale = desired != draft.current
    shown = draft.current  # status.desiredReplicas when the size is kept
    if pause is not None and pause.mode == "replicas":
        assert pause.replicas is not None
        if pause.replicas != desired:
            draft.limits.append(Limit("PausedReplicas", desired, pause.replicas, pause.message))
        draft.explanation.append(f"Paused at {phrase_replicas(pause.replicas)} "
                                 f"({pause.message}); the metrics' {desired} is not applied.")
        desired, reason = pause.replicas, f"paused at {phrase_replicas(pause.replicas)}"
        rescale = desired != draft.current
    elif pause is not None and rescale and pause.holds(current=draft.current, desired=desired):
        draft.limits.append(Limit("Paused", desired, draft.current, pause.message))
        draft.explanation.append(f"Without the pause the target would go from {draft.current} "
                                 f"to {desired}: {pause.message}, so it stays.")
        shown, rescale = desired, False
    if rescale:
        return _plan_write(draft, autoscaler=autoscaler, desired=desired, reason=reason)
    draft.explanation.append(f"Decision: keep {draft.reference} at "
                             f"{phrase_replicas(draft.current)}.")
    return draft.keep(desired_replicas=draft.current,
                      status=draft.status(desired_replicas=shown), reason=reason,
                      error=draft.error)


def idle_level(spec: AutoscalerSpec, settings: Settings) -> int | None:
    """Where the target rests while no metric is active; None without `spec.idle`, and for an
    idle size of 0 without --scale-to-zero (the controller-wide switch, as upstream's gate)."""
    if spec.idle is None or (spec.idle.replicas == 0 and not settings.scale_to_zero):
        return None
    return spec.idle.replicas


def _activation_value(metric: MetricSpec, status: MetricStatus | None,
                      data: MetricInput | None) -> Decimal | None:
    """What KEDA compares with the activation threshold: an External metric's total and an
    Object metric's value as the metrics API returned them (they exist with no pod running);
    for the pods' metrics, their current average (or utilization) as the status reports it."""
    try:
        if metric.type == "External" and data is not None:
            values, _ = external_metric_values(data)
            return Decimal(sum(values)) / 1000
        if metric.type == "Object" and data is not None:
            value, _ = object_metric_value(data)
            return Decimal(value) / 1000
    except CalculationError:
        return None
    return _current_value(status, _target_of(metric)) if status is not None else None


def _current_value(status: MetricStatus, target: MetricTarget | None) -> Decimal | None:
    """The metric's current value in its target's terms (Value, AverageValue, Utilization)."""
    source = (status.resource or status.container_resource or status.pods or status.object
              or status.external)
    if source is None or target is None:
        return None
    current = source.current
    if target.type == "Utilization":
        utilization = current.average_utilization
        return Decimal(utilization) if utilization is not None else None
    quantity = current.value if target.type == "Value" else current.average_value
    return quantity.value if quantity is not None else None


def _status_of(result: _MetricsResult, index: int) -> MetricStatus | None:
    return result.statuses[index] if index < len(result.statuses) else None


def _target_of(metric: MetricSpec) -> MetricTarget | None:
    for source in (metric.resource, metric.container_resource, metric.pods, metric.object,
                   metric.external):
        if source is not None:
            return source.target
    return None


def _apply_activation(draft: _Draft, result: _MetricsResult, *, autoscaler: Autoscaler,
                      metrics: Sequence[MetricInput], desired: int, reason: str,
                      settings: Settings, now: datetime) -> tuple[int, str]:
    """KEDA's activation and cooldown around upstream's decision: the idle size is left only
    when a metric is active (above its activationThreshold, 0 by default), and returned to only
    after every metric has been inactive for idle.cooldownSeconds; between 1 and N the
    decision is upstream's."""
    spec = autoscaler.spec
    assert spec.idle is not None
    level = idle_level(spec, settings)
    if level is None:
        draft.conditions = set_condition(
            draft.conditions, type=ACTIVE, status=FALSE, reason="IdleNeedsScaleToZero",
            message="idle.replicas 0 needs the controller's --scale-to-zero flag; activation "
                    "and cooldown are off", now=now)
        return desired, reason
    active = []
    for index, metric in enumerate(spec.metrics):
        value = _activation_value(metric, _status_of(result, index),
                                  metrics[index] if index < len(metrics) else None)
        threshold = metric.activation_threshold.value \
            if metric.activation_threshold is not None else Decimal(0)
        if value is not None and value > threshold:
            active.append(f"metric {index} ({value} > {threshold})")
    # Active, the target runs at least minReplicas, and at least one pod above its idle size.
    floor = max(1, min(max(draft.min_replicas, level + 1), draft.max_replicas))
    if active:
        draft.history = draft.history._replace(inactive_since=None)
        draft.conditions = set_condition(draft.conditions, type=ACTIVE, status=TRUE,
                                         reason="ScalerActive",
                                         message="active: " + ", ".join(active), now=now)
        if desired < floor:
            draft.limits.append(Limit("Activation", desired, floor, "a metric is active: the "
                                      f"target runs at least {phrase_replicas(floor)}"))
            desired = floor
        if draft.current <= level:
            reason = "activated: " + ", ".join(active)
            draft.explanation.append(f"Activation: {', '.join(active)}, so the target "
                                     f"leaves its idle size {level} for {desired}.")
        return desired, reason
    since = draft.history.inactive_since or now
    draft.history = draft.history._replace(inactive_since=since)
    cooldown = timedelta(seconds=spec.idle.cooldown_seconds)
    if draft.current <= level:
        draft.conditions = set_condition(
            draft.conditions, type=ACTIVE, status=FALSE, reason="ScalerNotActive",
            message=f"no metric is above its activation threshold: idle at {level}", now=now)
        if desired != draft.current:
            draft.limits.append(Limit("Idle", desired, draft.current, "no metric is active"))
        draft.explanation.append(f"No metric is active: the target stays at its idle size "
                                 f"{level}.")
        return draft.current, reason
    if now - since >= cooldown:
        draft.conditions = set_condition(
            draft.conditions, type=ACTIVE, status=FALSE, reason="ScalerNotActive",
            message=f"no metric has been active for {spec.idle.cooldown_seconds} s: idle at "
                    f"{level}", now=now)
        draft.limits.append(Limit("Cooldown", desired, level, f"no metric active since "
                                  f"{since.isoformat()}"))
        draft.explanation.append(f"No metric has been active for the "
                                 f"{spec.idle.cooldown_seconds} s cooldown: the target goes to "
                                 f"its idle size {level}.")
        return level, f"no metric active for {spec.idle.cooldown_seconds} s (cooldown)"
    remaining = int((cooldown - (now - since)).total_seconds())
    draft.conditions = set_condition(
        draft.conditions, type=ACTIVE, status=FALSE, reason="ScalerNotActive",
        message=f"no metric is above its activation threshold; idle in {remaining} s unless "
                "one becomes active", now=now)
    if desired < floor:
        draft.limits.append(Limit("Activation", desired, floor, "below the active floor until "
                                  "the cooldown ends"))
        desired = floor
    return desired, reason


def _reads(count: int) -> str:
    return "1 read" if count == 1 else f"{count} reads"


def _fallback_cause(fallback: MetricFallback, failure: MetricFailure | None,
                    failures: int) -> str:
    """Why a metric falls back, in words that stay the same for as long as the outage does:
    the threshold it reached or the time it has failed for, never the running count (a
    condition whose message changed at every sync would be rewritten at every sync; the count
    is in the history)."""
    if failures >= fallback.failure_threshold or failure is None \
            or fallback.failure_duration_seconds is None:
        return f"failed {fallback.failure_threshold} or more reads in a row"
    return f"failed every read for {fallback.failure_duration_seconds} s or more"


def _report_fallback(draft: _Draft, result: _MetricsResult, *, autoscaler: Autoscaler,
                     now: datetime) -> None:
    """The Fallback condition while a metric proposes its fallback (events on entering and
    leaving it); never present for an autoscaler without fallbacks."""
    was = next((c for c in draft.conditions if c.type == FALLBACK and c.status == TRUE), None)
    if not result.fallbacks:
        if was is not None:
            draft.conditions = remove_condition(draft.conditions, FALLBACK)
            draft.events.append(Event("Normal", "FallbackEnded", "every metric reads again: "
                                      "the fallback no longer applies"))
            draft.explanation.append("The metrics read again: no fallback applies.")
        return
    steady, counted, timed = [], [], []
    failing = {failure.metric: failure for failure in result.failures}
    for index, proposal, failures in result.fallbacks:
        fallback = autoscaler.spec.metrics[index].fallback
        assert fallback is not None
        proposes = f"proposes {phrase_replicas(proposal)} (fallback {fallback.behavior})"
        failure = failing.get(index)
        steady.append(f"metric {index} {_fallback_cause(fallback, failure, failures)} and "
                      f"{proposes}")
        counted.append(f"metric {index} failed {_reads(failures)} in a row and {proposes}")
        since = f", since {format_time(failure.since)}" if failure is not None else ""
        timed.append(f"metric {index} failed {_reads(failures)} in a row{since}, and "
                     f"{proposes}")
    message = "; ".join(steady)
    draft.conditions = set_condition(draft.conditions, type=FALLBACK, status=TRUE,
                                     reason="FallbackActive", message=message, now=now)
    draft.explanation.append(f"Fallback: {'; '.join(timed)}.")
    if was is None:
        # One event on entering, with the count at that moment (the threshold, or fewer when
        # the reads failed for failureDurationSeconds first).
        draft.events.append(Event("Warning", "FallbackActive", "; ".join(counted)))


def _watch_scale(draft: _Draft, *, observed: int, now: datetime) -> None:
    """Conflict detection: another writer changed the replicas this autoscaler left the target
    at (an event each time; the ScalingConflict condition after a second change within the
    window, until a window passes without one). It changes no replica count."""
    watch = draft.history.scale_watch
    seen = observe_replicas(watch, observed=observed, now=now)
    if seen.watch is watch and not seen.events and not seen.watch.conflicting \
            and not any(c.type == CONFLICT_CONDITION for c in draft.conditions):
        return  # the steady state: the size we left, no conflict to keep or lift
    if seen.watch is not watch:
        draft.history = draft.history._replace(scale_watch=seen.watch)
    draft.events.extend(seen.events)
    if seen.changed_from is not None:
        draft.explanation.append(
            f"Since the last sync the target's replicas changed from {seen.changed_from} to "
            f"{observed}, and this autoscaler did not write them: another writer did (a "
            "`kubectl apply` or `scale`, a GitOps tool, a second autoscaler).")
    was = condition_status(draft.conditions, CONFLICT_CONDITION) == TRUE
    draft.conditions = conflict_conditions(draft.conditions, conflicting=seen.watch.conflicting,
                                           now=now)
    minutes = int(CONFLICT_WINDOW.total_seconds() // 60)
    if seen.watch.conflicting:
        draft.explanation.append(
            f"ScalingConflict: another writer changed the replicas at least twice within "
            f"{minutes} minutes; the condition stays until {minutes} minutes pass without a "
            "change.")
    elif was:
        draft.explanation.append(f"No external change for {minutes} minutes: the "
                                 "ScalingConflict condition is lifted.")


def _report_pod_selection(draft: _Draft, selection: PodSelection, *, pods: int) -> None:
    """KEP-5325's OwnerReferences: which of the selector's pods the decision counts."""
    draft.ignored_pods = selection.ignored
    ref = draft.reference.split("/")
    target = f"{ref[0]}/{ref[-1]}"
    parts = []
    if selection.not_owned:
        parts.append(f"{selection.not_owned} not owned by {target}")
    if selection.rollout_unready:
        parts.append(f"{selection.rollout_unready} not Ready in its newest ReplicaSet during a "
                     "rollout")
    left_out = f": {', '.join(parts)} left out" if parts else ""
    draft.explanation.append(
        f"Pod selection (OwnerReferences, KEP-5325): {len(selection.pods)} of the selector's "
        f"{pods} pods count{left_out}.")


def _report_pause(draft: _Draft, pause: Pause | None, *, now: datetime) -> None:
    """The Paused condition while paused (and the events of pausing and resuming); without a
    pause annotation no condition is added, so an unpaused autoscaler's status is upstream's."""
    was = next((c for c in draft.conditions if c.type == PAUSED and c.status == TRUE), None)
    if pause is None:
        if was is not None:
            draft.conditions = remove_condition(draft.conditions, PAUSED)
            draft.events.append(Event("Normal", "Resumed", "the pause annotations were "
                                      "removed: scaling resumes"))
            draft.explanation.append("The pause was lifted: the autoscaler scales again.")
        return
    draft.conditions = set_condition(draft.conditions, type=PAUSED, status=TRUE,
                                     reason=pause.reason, message=pause.message, now=now)
    if was is None or was.reason != pause.reason:
        draft.events.append(Event("Warning" if pause.problem else "Normal", pause.reason,
                                  pause.message))


def _failed_get_scale(draft: _Draft, *, gv_error: str | None, scale: Scale | ScaleError,
                      now: datetime) -> Decision:
    """The scale could not be read: FailedGetScale, and nothing else is decided."""
    message = gv_error if gv_error is not None else \
        (scale.message if isinstance(scale, ScaleError) else "")
    draft.conditions = set_condition(draft.conditions, type=ABLE_TO_SCALE, status=FALSE,
                                     reason="FailedGetScale",
                                     message=Messages.FAILED_GET_SCALE.format(message), now=now)
    returned = (f"invalid API version in scale target reference: {message}"
                if gv_error is not None
                else f"failed to query scale subresource for {draft.reference}: {message}")
    draft.explanation.append(f"The scale of {draft.reference} could not be read: {message}. "
                             "Nothing else is decided until it can be.")
    draft.events.append(Event("Warning", "FailedGetScale", message))
    return draft.keep(desired_replicas=draft.old.current_replicas,
                      status=draft.old._replace(conditions=draft.conditions), error=returned)


def _read_scale_and_bounds(draft: _Draft, *, autoscaler: Autoscaler, scale: Scale,
                           now: datetime, settings: Settings) -> _Start:
    """SucceededGetScale, the first recommendation, and what min/max and a zero size say
    before any metric is read."""
    spec = autoscaler.spec
    draft.conditions = set_condition(draft.conditions, type=ABLE_TO_SCALE, status=TRUE,
                                     reason="SucceededGetScale",
                                     message=Messages.SUCCEEDED_GET_SCALE, now=now)
    current = draft.current = scale.spec_replicas
    if draft.history.recommendations is None:
        recommendations = rules.record_initial_recommendation(
            draft.history.recommendations, current_replicas=current, now=now)
        draft.explanation.append(f"First sync: the current size {current} is remembered as a "
                                 "recommendation, so a scale-down waits a whole stabilization "
                                 "window.")
        draft.history = draft.history._replace(recommendations=recommendations)
    min_replicas = draft.min_replicas = spec.min_replicas if spec.min_replicas is not None \
        else 1
    max_replicas = draft.max_replicas = spec.max_replicas
    draft.explanation.append(f"{draft.reference} has {phrase_replicas(current)} (spec), "
                             f"{scale.status_replicas} (status); the autoscaler allows "
                             f"{min_replicas} to {max_replicas}.")
    has_object_or_external = spec.has_object_or_external
    scaled_to_zero = settings.scale_to_zero and \
        condition_status(draft.conditions, SCALED_TO_ZERO) == TRUE
    can_scale_from_zero = scaled_to_zero and has_object_or_external
    level = idle_level(spec, settings)
    if level is not None and current == level:
        draft.explanation.append(f"The target rests at its idle size {level}: the metrics "
                                 "decide whether it activates.")
        return _Start(current, "", needs_metrics=True, rescale=True,
                      scaled_to_zero=scaled_to_zero)
    if current == 0:
        if (min_replicas != 0 and scaled_to_zero) or can_scale_from_zero:
            draft.explanation.append("The target was scaled to zero by the autoscaler: metrics "
                                     "decide whether it comes back.")
            return _Start(0, "", needs_metrics=True, rescale=True, scaled_to_zero=scaled_to_zero)
        draft.conditions = set_condition(draft.conditions, type=SCALING_ACTIVE, status=FALSE,
                                         reason="ScalingDisabled",
                                         message=Messages.SCALING_DISABLED, now=now)
        if not settings.scale_to_zero:
            draft.conditions = remove_condition(draft.conditions, SCALED_TO_ZERO)
        draft.explanation.append("The target has 0 replicas and was not scaled to zero by the "
                                 "autoscaler: scaling is disabled until someone scales it up.")
        return _Start(0, "", needs_metrics=False, rescale=False, scaled_to_zero=scaled_to_zero)
    if current > max_replicas:
        draft.limits.append(Limit("MaxReplicas", current, max_replicas, "the current size is "
                                  "above maxReplicas; no metrics are consulted"))
        draft.explanation.append(f"The current size {current} is above maxReplicas: scale to "
                                 f"{max_replicas} without looking at metrics.")
        return _Start(max_replicas, "Current number of replicas above Spec.MaxReplicas",
                      needs_metrics=False, rescale=True, scaled_to_zero=scaled_to_zero)
    if current < min_replicas:
        draft.limits.append(Limit("MinReplicas", current, min_replicas, "the current size is "
                                  "below minReplicas; no metrics are consulted"))
        draft.explanation.append(f"The current size {current} is below minReplicas: scale to "
                                 f"{min_replicas} without looking at metrics.")
        return _Start(min_replicas, "Current number of replicas below Spec.MinReplicas",
                      needs_metrics=False, rescale=True, scaled_to_zero=scaled_to_zero)
    return _Start(0, "", needs_metrics=True, rescale=True, scaled_to_zero=scaled_to_zero)


def _take_metrics(draft: _Draft, result: _MetricsResult) -> Decision | None:
    """Record the metrics' outcome; when no metric can be used (or a failing one blocks a
    scale-down), the decision that keeps the size."""
    draft.conditions = result.conditions
    draft.events.extend(result.events)
    draft.details = result.details
    draft.metric_statuses = result.statuses
    draft.explanation.extend(_describe_metrics(result.details))
    if result.replicas != -1:
        if result.error is not None:
            draft.error = result.error  # some metrics failed: scale on the others, report
            draft.explanation.append("Some metrics failed, but the others ask for no "
                                     "scale-down, so the autoscaler goes on with them.")
        for note in result.notes:
            if note.from_replicas != note.to_replicas:
                draft.limits.append(Limit(note.rule, note.from_replicas, note.to_replicas,
                                          f"metric {result.winner}: {note.detail}"))
        return None
    assert result.error is not None
    if result.blocked_scale_down is not None:
        draft.limits.append(Limit("FailingMetricBlocksScaleDown", result.blocked_scale_down,
                                  draft.current, "a metric failed, and a failing metric blocks "
                                                 "any scale-down"))
        draft.explanation.append(f"The working metrics propose {result.blocked_scale_down}, a "
                                 "scale-down, but a metric failed: no scale-down while any "
                                 "metric fails.")
    else:
        draft.explanation.append("No metric could be used: the size stays, and "
                                 "status.desiredReplicas keeps its old value.")
    draft.events.append(Event("Warning", "FailedComputeMetricsReplicas", result.error))
    return draft.keep(
        desired_replicas=draft.current,
        status=draft.status(desired_replicas=draft.old.desired_replicas),
        error=f"failed to compute desired number of replicas based on listed metrics for "
              f"{draft.reference}: {result.error}")


def _metrics_proposal(draft: _Draft, result: _MetricsResult, *, desired: int) -> tuple[int, str]:
    """The replicas the metrics ask for, and upstream's rescale reason for them."""
    reason = ""
    rescale_metric = ""
    if result.replicas > desired:
        desired = result.replicas
        rescale_metric = result.name
    if desired > draft.current:
        reason = f"{rescale_metric} above target"
    if desired < draft.current:
        reason = "All metrics below target"
    most = f" (the most, from {readable_text(result.name, result.details)})." \
        if result.name else "."
    draft.explanation.append(f"The metrics ask for {phrase_replicas(desired)}{most}")
    return desired, reason


def _stabilize_and_limit(draft: _Draft, *, autoscaler: Autoscaler, desired: int,
                         settings: Settings, now: datetime) -> int:
    """Stabilization windows, then min/max and the scale-up limits (legacy) or the behavior's
    policies; the AbleToScale and ScalingLimited conditions say what happened."""
    behavior = autoscaler.spec.behavior
    current = draft.current
    history = draft.history
    if behavior is None:
        stabilized = rules.stabilize_recommendation(
            history.recommendations or (), desired=desired,
            window=settings.downscale_stabilization_window, now=now)
        normalized = rules.convert_desired_replicas_with_rules(
            current_replicas=current, desired_replicas=stabilized.replicas,
            min_replicas=draft.min_replicas, max_replicas=draft.max_replicas,
            factor=settings.scale_up_limit_factor, minimum=settings.scale_up_limit_minimum)
        limit_names = _LIMIT_RULES_LEGACY
        window_text = (f"the {int(settings.downscale_stabilization_window.total_seconds())} s "
                       "downscale stabilization window")
    else:
        up, down = behavior.scale_up, behavior.scale_down
        up_window = up.stabilization_window_seconds if up is not None else None
        down_window = down.stabilization_window_seconds if down is not None else None
        if down_window is None:  # maybeInitScaleDownStabilizationWindow
            down_window = int(settings.downscale_stabilization_window.total_seconds())
        stabilized = rules.stabilize_recommendation_with_behaviors(
            history.recommendations or (), desired=desired, current=current,
            up_window_seconds=up_window or 0, down_window_seconds=down_window, now=now)
        normalized = rules.convert_desired_replicas_with_behavior_rate(
            current_replicas=current, desired_replicas=stabilized.replicas,
            min_replicas=draft.min_replicas, max_replicas=draft.max_replicas,
            behavior=behavior, up_events=history.scale_up_events,
            down_events=history.scale_down_events, now=now)
        limit_names = _LIMIT_RULES_BEHAVIOR
        window_text = f"the stabilization windows (up {up_window or 0} s, down {down_window} s)"
    draft.history = history._replace(recommendations=stabilized.recommendations)
    draft.conditions = set_condition(draft.conditions, type=ABLE_TO_SCALE, status=TRUE,
                                     reason=stabilized.reason, message=stabilized.message,
                                     now=now)
    if stabilized.replicas != desired:
        rule = ("ScaleUpStabilization" if stabilized.reason == "ScaleUpStabilized"
                else "ScaleDownStabilization")
        draft.limits.append(Limit(rule, desired, stabilized.replicas,
                                  f"{stabilized.message} ({window_text})"))
        draft.explanation.append(f"Stabilization ({window_text}) turns {desired} into "
                                 f"{stabilized.replicas}: {stabilized.message}.")
    limited = normalized.replicas != stabilized.replicas
    draft.conditions = set_condition(draft.conditions, type=SCALING_LIMITED,
                                     status=TRUE if limited else FALSE,
                                     reason=normalized.reason, message=normalized.message,
                                     now=now)
    if limited:
        draft.limits.append(Limit(limit_names.get(normalized.reason, normalized.reason),
                                  stabilized.replicas, normalized.replicas, normalized.message))
        draft.explanation.append(f"Limits turn {stabilized.replicas} into "
                                 f"{normalized.replicas}: {normalized.message}.")
    return normalized.replicas


def _plan_write(draft: _Draft, *, autoscaler: Autoscaler, desired: int,
                reason: str) -> Decision:
    """A decision that awaits the write of `desired` (complete() applies its outcome)."""
    draft.explanation.append(f"Decision: scale {draft.reference} from {draft.current} to "
                             f"{desired} ({readable_text(reason, draft.details)}).")
    spec = autoscaler.spec
    pending = _Pending(
        old_status=draft.old, conditions=draft.conditions,
        metric_statuses=draft.metric_statuses, current_replicas=draft.current,
        new_replicas=desired, min_replicas=draft.min_replicas, reason=reason,
        history=draft.history,
        has_object_or_external=spec.has_object_or_external,
        reference=draft.reference, error=draft.error, behavior=spec.behavior)
    # The status as this reconcile sees it before the write; complete() finishes it.
    planned = draft.status(desired_replicas=desired)
    return Decision(
        desired_replicas=desired, rescale=True, new_replicas=desired, rescale_reason=reason,
        scale_updated=False, status=planned, previous_status=draft.old,
        events=tuple(draft.events), metrics=draft.details, limits=tuple(draft.limits),
        history=draft.history, explanation=tuple(draft.explanation), error=draft.error,
        pending=pending, ignored_pods=draft.ignored_pods)


def _after_write(decision: Decision, result: ScaleWriteResult, *, settings: Settings,
                 now: datetime) -> Decision:
    """The part of reconcileAutoscaler after `scale.spec.replicas` was written (or not)."""
    pending = decision.pending
    assert pending is not None
    conditions = pending.conditions
    events = list(decision.events)
    explanation = list(decision.explanation)
    history = pending.history
    old = pending.old_status
    if result.error is not None:
        events.append(Event("Warning", "FailedRescale",
                            f"New size: {pending.new_replicas}; reason: {pending.reason}; "
                            f"error: {result.error}"))
        conditions = set_condition(conditions, type=ABLE_TO_SCALE, status=FALSE,
                                   reason="FailedUpdateScale",
                                   message=Messages.FAILED_UPDATE_SCALE.format(result.error),
                                   now=now)
        status = AutoscalerStatus(current_replicas=pending.current_replicas,
                                  desired_replicas=old.desired_replicas,
                                  last_scale_time=old.last_scale_time,
                                  current_metrics=pending.metric_statuses, conditions=conditions)
        explanation.append(f"Writing the new size failed ({result.error}): the size stays "
                           f"{pending.current_replicas} and status.desiredReplicas keeps its old "
                           "value.")
        return replace(
            decision, desired_replicas=pending.current_replicas, scale_updated=False,
            status=status, events=tuple(events),
            history=history, explanation=tuple(explanation),
            error=f"failed to rescale {pending.reference}: {result.error}",
            pending=None)

    new_size = f"New size: {pending.new_replicas}; reason: {pending.reason}"
    if result.dry_run:
        # What the write would have done, without its consequences: no scale event is
        # remembered and lastScaleTime stays; the condition and the event say so.
        conditions = set_condition(
            conditions, type=ABLE_TO_SCALE, status=TRUE, reason=DRY_RUN_CONDITION_REASON,
            message=f"dry run: the HPA controller would have updated the target scale to "
                    f"{pending.new_replicas}", now=now)
        events.append(Event("Normal", DRY_RUN_EVENT_REASON,
                            f"{new_size}; dry run: the target was not scaled"))
        explanation.append("Dry run: the target's scale was not written.")
        last_scale_time = old.last_scale_time
    else:
        conditions = set_condition(
            conditions, type=ABLE_TO_SCALE, status=TRUE, reason="SucceededRescale",
            message=Messages.SUCCEEDED_RESCALE.format(pending.new_replicas), now=now)
        events.append(Event("Normal", "SuccessfulRescale", new_size))
        up, down = rules.store_scale_event(
            pending.behavior,
            up_events=history.scale_up_events, down_events=history.scale_down_events,
            previous_replicas=pending.current_replicas, new_replicas=pending.new_replicas,
            now=now)
        watch = history.scale_watch
        history = history._replace(
            scale_up_events=up, scale_down_events=down,
            scale_watch=None if watch is None else watch._replace(replicas=pending.new_replicas))
        last_scale_time = now
    if settings.scale_to_zero:
        if pending.current_replicas > 0 and pending.new_replicas == 0 \
                and pending.min_replicas == 0 and pending.has_object_or_external:
            conditions = set_condition(conditions, type=SCALED_TO_ZERO, status=TRUE,
                                       reason="ScaledToZero", message=Messages.SCALED_TO_ZERO,
                                       now=now)
        else:
            conditions = set_condition(conditions, type=SCALED_TO_ZERO, status=FALSE,
                                       reason="NotScaledToZero",
                                       message=Messages.NOT_SCALED_TO_ZERO, now=now)
    else:
        conditions = remove_condition(conditions, SCALED_TO_ZERO)
    status = AutoscalerStatus(current_replicas=pending.current_replicas,
                              desired_replicas=pending.new_replicas,
                              last_scale_time=last_scale_time,
                              current_metrics=pending.metric_statuses, conditions=conditions)
    return replace(
        decision, desired_replicas=pending.new_replicas, scale_updated=result.succeeded,
        status=status, events=tuple(events),
        history=history, explanation=tuple(explanation), pending=None)


def complete(decision: Decision, *, write_result: ScaleWriteResult, settings: Settings,
             now: datetime) -> Decision:
    """Apply the outcome of writing `decision.new_replicas` to the target's scale: written,
    failed, or not made in a dry run (SCALE_WRITE_DRY_RUN).

    Without a pending write (no rescale, or already completed) the decision is returned as is.
    `now` and `settings` must be the ones `decide` was called with.
    """
    if decision.pending is None:
        return decision
    return _after_write(decision, write_result, settings=settings, now=now)


def _describe_metrics(details: Sequence[MetricDetail]) -> list[str]:
    lines = []
    for detail in details:
        label = detail.shown_name
        if detail.error is not None:
            lines.append(f"Metric {detail.index} ({label}) failed: {detail.error}")
            continue
        pods = ""
        if detail.unready_pods or detail.missing_pods or detail.ignored_pods:
            pods = (f"; pods: {detail.ready_pods} ready, {detail.unready_pods} unready, "
                    f"{detail.missing_pods} without metrics, {detail.ignored_pods} ignored")
        ratio = f"{detail.ratio:.4g}" if detail.ratio is not None else "undefined"
        lines.append(f"Metric {detail.index} ({label}): current {detail.current}, target "
                     f"{detail.target}, usage ratio {ratio}{pods}: proposes "
                     f"{detail.proposed_replicas}.")
    return lines

