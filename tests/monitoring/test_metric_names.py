"""Every metric the dashboards and alerts query is one the programs really export."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from adapter.http.app import _RequestMetrics
from adapter.http.reloading import ReloadMetrics
from adapter.kube.catalog import ClusterCatalog
from adapter.prometheus.client import _Metrics
from adapter.prometheus.relisting import RelistMetrics
from autoscaler.controller.exported import AutoscalerSeries
from autoscaler.controller.stats import ControllerMetrics
from tests.monitoring.support import (
    alert_expressions,
    dashboard_expressions,
    exported_names,
    metric_names,
)


def _adapter_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    _RequestMetrics.register(registry)
    _Metrics.register(registry)
    RelistMetrics.register(registry)
    ReloadMetrics.register(registry)
    ClusterCatalog(object(), registry=registry)  # type: ignore[arg-type]  # no I/O until refresh
    return registry


def _autoscaler_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    ControllerMetrics(registry)
    registry.register(AutoscalerSeries(list))
    return registry


def test_names_are_read_from_expressions() -> None:
    assert metric_names("rate(metricscale_a_total[5m]) / metricscale_b") == {
        "metricscale_a_total", "metricscale_b"}


def test_dashboards_and_alerts_use_only_exported_metric_names() -> None:
    exported = exported_names(_adapter_registry()) | exported_names(_autoscaler_registry())
    used = {name for expr in [*dashboard_expressions(), *alert_expressions().values()]
            for name in metric_names(expr)}
    assert used, "no metricscale_ names found: the extraction is broken"
    assert used - exported == set()


def test_the_autoscaler_dashboard_shows_every_kube_state_metrics_style_series() -> None:
    used = {name for expr in dashboard_expressions() for name in metric_names(expr)}
    for suffix in ("spec_min_replicas", "spec_max_replicas", "status_current_replicas",
                   "status_desired_replicas", "spec_target_metric", "status_target_metric"):
        assert f"metricscale_autoscaler_{suffix}" in used
