"""The controller's Prometheus metrics (the API latency lives with the API client)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["ControllerMetrics"]


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
        self.queue_depth = Gauge(
            "metricscale_autoscaler_queue_depth", "Autoscalers waiting for a worker.",
            registry=registry)
        self.autoscalers = Gauge(
            "metricscale_autoscaler_autoscalers", "Autoscalers in the cache.", registry=registry)
        self.leader = Gauge(
            "metricscale_autoscaler_leader", "1 while this replica holds the lease.",
            registry=registry)
