"""Per-autoscaler series in kube-state-metrics' HPA shape, built from the cache at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from autoscaler.model.objects import Autoscaler
from autoscaler.model.spec import MetricIdentifier, MetricSpec, MetricTarget
from autoscaler.model.status import MetricStatus, MetricValueStatus

__all__ = ["PREFIX", "AutoscalerSeries", "target_values"]

PREFIX = "metricscale_autoscaler_"
# kube-state-metrics' label names, plus `kind`: an Autoscaler and a native HPA may share a name.
_OBJECT_LABELS = ["namespace", "horizontalpodautoscaler", "kind"]
_METRIC_LABELS = [*_OBJECT_LABELS, "metric_name", "metric_target_type"]
_CONDITION_STATUSES = ("true", "false", "unknown")


def _metric_name(*, kind_name: str, metric: MetricIdentifier | None) -> str:
    return metric.name if metric is not None else kind_name


def _spec_name_and_target(spec: MetricSpec) -> tuple[str, MetricTarget] | None:
    if spec.resource is not None:
        return spec.resource.name, spec.resource.target
    if spec.container_resource is not None:
        return spec.container_resource.name, spec.container_resource.target
    for source in (spec.pods, spec.object, spec.external):
        if source is not None:
            return source.metric.name, source.target
    return None


def _status_name_and_value(status: MetricStatus) -> tuple[str, MetricValueStatus] | None:
    if status.resource is not None:
        return status.resource.name, status.resource.current
    if status.container_resource is not None:
        return status.container_resource.name, status.container_resource.current
    for source in (status.pods, status.object, status.external):
        if source is not None:
            return source.metric.name, source.current
    return None


def target_values(*, value: MetricValueStatus | MetricTarget) -> list[tuple[str, float]]:
    """The (metric_target_type, number) pairs of a target or a current value, as kube-state-metrics
    names them: value, average (averageValue) and utilization (averageUtilization)."""
    found: list[tuple[str, float]] = []
    if value.value is not None:
        found.append(("value", value.value.milli / 1000))
    if value.average_value is not None:
        found.append(("average", value.average_value.milli / 1000))
    if value.average_utilization is not None:
        found.append(("utilization", float(value.average_utilization)))
    return found


class AutoscalerSeries(Collector):
    """Builds every per-autoscaler series at scrape time from `autoscalers()`.

    Nothing is kept between scrapes, so a deleted autoscaler's series vanish with it."""

    def __init__(self, autoscalers: Callable[[], Iterable[tuple[str, Autoscaler]]]) -> None:
        self._autoscalers = autoscalers

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(self._families())

    def _families(self) -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(PREFIX + "spec_min_replicas",
                              "Lower limit of replicas the autoscaler may set.",
                              labels=_OBJECT_LABELS),
            GaugeMetricFamily(PREFIX + "spec_max_replicas",
                              "Upper limit of replicas the autoscaler may set.",
                              labels=_OBJECT_LABELS),
            GaugeMetricFamily(PREFIX + "status_current_replicas",
                              "Replicas of the target, as last seen by the autoscaler.",
                              labels=_OBJECT_LABELS),
            GaugeMetricFamily(PREFIX + "status_desired_replicas",
                              "Replicas the autoscaler last asked for.", labels=_OBJECT_LABELS),
            GaugeMetricFamily(PREFIX + "spec_target_metric",
                              "Target of each metric of the autoscaler.", labels=_METRIC_LABELS),
            GaugeMetricFamily(PREFIX + "status_target_metric",
                              "Current value of each metric of the autoscaler.",
                              labels=_METRIC_LABELS),
            GaugeMetricFamily(PREFIX + "status_condition",
                              "Condition of the autoscaler (1 on the status it has).",
                              labels=[*_OBJECT_LABELS, "condition", "status"]),
        ]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = self._families()
        min_r, max_r, current, desired, target, status, condition = families
        for kind, autoscaler in self._autoscalers():
            labels = [autoscaler.metadata.namespace, autoscaler.metadata.name, kind]
            spec = autoscaler.spec
            # An unset minReplicas means 1, as the API server defaults it.
            min_r.add_metric(labels, spec.min_replicas if spec.min_replicas is not None else 1)
            max_r.add_metric(labels, spec.max_replicas)
            current.add_metric(labels, autoscaler.status.current_replicas)
            desired.add_metric(labels, autoscaler.status.desired_replicas)
            for metric in spec.metrics:
                named = _spec_name_and_target(metric)
                if named is not None:
                    for target_type, number in target_values(value=named[1]):
                        target.add_metric([*labels, named[0], target_type], number)
            for metric_status in autoscaler.status.current_metrics:
                seen = _status_name_and_value(metric_status)
                if seen is not None:
                    for target_type, number in target_values(value=seen[1]):
                        status.add_metric([*labels, seen[0], target_type], number)
            for cond in autoscaler.status.conditions:
                have = cond.status.lower()
                for candidate in _CONDITION_STATUSES:
                    condition.add_metric([*labels, cond.type, candidate],
                                         1.0 if have == candidate else 0.0)
        return iter(families)
