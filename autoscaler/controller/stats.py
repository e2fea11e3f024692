"""The controller's Prometheus metrics (the API latency lives with the API client)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["ControllerMetrics", "ShadowMetrics"]


class ControllerMetrics:
    """The counters, gauges and histograms of one controller replica."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.reconciles = Counter(
            "metricscale_autoscaler_reconciles_total",
            "Reconciles, by result (ok, failed, timeout, not_leader, gone).",
            ["result"], registry=registry)
        self.duration = Histogram(
            "metricscale_autoscaler_reconcile_duration_seconds",
            "Duration of one reconcile, including its API calls.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry)
        self.decisions = Counter(
            "metricscale_autoscaler_decisions_total",
            "Decisions, by outcome (scale_up, scale_down, no_change, dry_run_scale_up, "
            "dry_run_scale_down, failed_rescale, failed_get_scale, failed_metrics, invalid).",
            ["outcome"], registry=registry)
        self.errors = Counter(
            "metricscale_autoscaler_errors_total",
            "Errors, by reason (the Warning event reason, or what failed in the controller).",
            ["reason"], registry=registry)
        self.external_scale_changes = Counter(
            "metricscale_autoscaler_external_scale_changes_total",
            "Changes of a target's replicas between two syncs that this controller did not "
            "write (kubectl apply, another autoscaler, a GitOps tool).",
            ["namespace", "autoscaler"], registry=registry)
        # Our features' state, per autoscaler; a series exists only while the feature is in use,
        # so an autoscaler that uses none of them adds no series.
        self.feature_condition = Gauge(
            "metricscale_autoscaler_feature_condition",
            "1 while the condition of one of metricscale's own features (Paused, Fallback, "
            "Active, ScalingConflict) is True, 0 while it is False; absent when not set.",
            ["namespace", "autoscaler", "condition"], registry=registry)
        self.metric_read_failures = Gauge(
            "metricscale_autoscaler_metric_read_failures",
            "Failed reads in a row of a metric that has a fallback (status.history."
            "metricFailures), by its index in spec.metrics.",
            ["namespace", "autoscaler", "metric"], registry=registry)
        self.ignored_pods = Gauge(
            "metricscale_autoscaler_ignored_pods",
            "Pods the last decision left out under podSelectionStrategy OwnerReferences.",
            ["namespace", "autoscaler"], registry=registry)
        self.sync_period = Gauge(
            "metricscale_autoscaler_sync_period_seconds",
            "An autoscaler's own sync period (spec.behavior.syncPeriodSeconds), when it has one.",
            ["namespace", "autoscaler"], registry=registry)
        self.queue_depth = Gauge(
            "metricscale_autoscaler_queue_depth", "Autoscalers waiting for a worker.",
            registry=registry)
        self.autoscalers = Gauge(
            "metricscale_autoscaler_autoscalers", "Autoscalers in the cache.", registry=registry)
        self.leader = Gauge(
            "metricscale_autoscaler_leader", "1 while this replica holds the lease.",
            registry=registry)
        # Registered in every mode (one registry, one set of names); samples in shadow mode only.
        self.shadow = ShadowMetrics(registry)


class ShadowMetrics:
    """Shadow mode's series, per HPA, with kube-state-metrics' label names (`namespace`,
    `horizontalpodautoscaler`) so they join its kube_horizontalpodautoscaler_* series."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.replicas = Gauge(
            "metricscale_shadow_replicas",
            "The replicas metricscale would have set at its latest decision for the HPA (shadow "
            "mode); compare kube_horizontalpodautoscaler_status_desired_replicas.",
            ["namespace", "horizontalpodautoscaler"], registry=registry)
        self.decisions = Counter(
            "metricscale_shadow_decisions",
            "Shadow decisions by result: agree or differ with the HPA's decision from the same "
            "replicas; warmup (made before the shadow's history can be the HPA's) and unjudged "
            "(nothing to compare with) are not part of the agreement rate.",
            ["namespace", "horizontalpodautoscaler", "result"], registry=registry)
        self.publish_failures = Counter(
            "metricscale_shadow_publish_failures",
            "Failed writes of the ConfigMap that explain --live --shadow reads.",
            registry=registry)
