"""The Grafana dashboards of the adapter and the autoscaler, built with grafana-foundation-sdk.

`python -m monitoring.dashboards` (or `make dashboards`) rewrites manifests/monitoring/dashboards/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

__all__ = ["OUTPUT", "adapter_dashboard", "autoscaler_dashboard", "render_files",
           "shadow_agreement"]

OUTPUT = Path(__file__).resolve().parent.parent / "manifests" / "monitoring" / "dashboards"
_DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
_ADAPTER_JOB = 'job=~"$job"'
_AUTOSCALER = 'namespace=~"$namespace", horizontalpodautoscaler=~"$autoscaler"'


def shadow_agreement(window: str, *, by: str = "") -> str:
    """Shadow mode's agreement rate over `window` (a PromQL range, `$__range` on the
    dashboard): agreeing decisions over judged ones. Warm-up and unjudged decisions are
    neither (docs/shadow.md says why)."""
    grouping = f" by ({by})" if by else ""
    decisions = "metricscale_shadow_decisions_total"
    return (f'sum{grouping} (increase({decisions}{{result="agree"}}[{window}])) / '
            f'sum{grouping} (increase({decisions}{{result=~"agree|differ"}}[{window}]))')


def _query(expr: str, legend: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend)


def _graph(title: str, *, unit: str, queries: list[tuple[str, str]],
           width: int = 12) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).unit(unit).datasource(_DATASOURCE)
             .height(8).span(width))
    for expr, legend in queries:
        panel = panel.with_target(_query(expr, legend))
    return panel


def _stat(title: str, *, expr: str, unit: str = "none") -> stat.Panel:
    return (stat.Panel().title(title).unit(unit).datasource(_DATASOURCE).height(4).span(6)
            .with_target(_query(expr, "")))


def _variables(board: dashboard.Dashboard) -> dashboard.Dashboard:
    return board.with_variable(
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))


def _label_variable(name: str, *, label: str, query: str) -> dashboard.QueryVariable:
    return (dashboard.QueryVariable(name).label(label).datasource(_DATASOURCE)
            .query(f"label_values({query})").multi(True).include_all(True)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED))


def adapter_dashboard() -> dashboard.Dashboard:
    """Requests, latency, Prometheus queries and discovery of the metrics adapter."""
    job = _ADAPTER_JOB
    board = (dashboard.Dashboard("metricscale / adapter").uid("metricscale-adapter")
             .tags(["metricscale"]).refresh("30s").time("now-3h", "now").timezone("browser"))
    board = _variables(board).with_variable(_label_variable(
        "job", label="Job", query="metricscale_http_requests_total, job"))
    return (
        board
        .with_row(dashboard.Row("Requests"))
        .with_panel(_graph("Requests by route and code", unit="reqps", queries=[
            (f"sum by (route, code) (rate(metricscale_http_requests_total{{{job}}}[5m]))",
             "{{route}} {{code}}")]))
        .with_panel(_graph("Request latency", unit="s", queries=[
            (f"histogram_quantile({q}, sum by (le, route) "
             f"(rate(metricscale_http_request_duration_seconds_bucket{{{job}}}[5m])))",
             f"p{int(q * 100)} {{{{route}}}}") for q in (0.5, 0.99)]))
        .with_row(dashboard.Row("Prometheus"))
        .with_panel(_graph("Prometheus query latency", unit="s", queries=[
            (f"histogram_quantile({q}, sum by (le, endpoint) "
             f"(rate(metricscale_prometheus_request_duration_seconds_bucket{{{job}}}[5m])))",
             f"p{int(q * 100)} {{{{endpoint}}}}") for q in (0.5, 0.99)], width=8))
        .with_panel(_graph("Prometheus errors", unit="reqps", queries=[
            ("sum by (endpoint, reason) "
             f"(rate(metricscale_prometheus_request_errors_total{{{job}}}[5m]))",
             "{{endpoint}} {{reason}}")], width=8))
        .with_panel(_graph("Shared and cached queries", unit="reqps", queries=[
            (f"sum by (endpoint) (rate(metricscale_prometheus_requests_shared_total{{{job}}}"
             "[5m]))", "shared {{endpoint}}"),
            (f"sum by (endpoint) (rate(metricscale_prometheus_cache_hits_total{{{job}}}[5m]))",
             "cached {{endpoint}}")], width=8))
        .with_row(dashboard.Row("Discovery"))
        .with_panel(_stat("Discovery age", unit="s",
                          expr=f"max(metricscale_discovery_age_seconds{{{job}}})"))
        .with_panel(_stat("Custom metrics",
                          expr=f'max(metricscale_discovered_metrics{{{job}, api="custom"}})'))
        .with_panel(_stat("External metrics",
                          expr=f'max(metricscale_discovered_metrics{{{job}, api="external"}})'))
        .with_panel(_stat("Series shapes",
                          expr=f"max(metricscale_discovered_series_shapes{{{job}}})"))
        .with_panel(_graph("Discovery passes", unit="ops", queries=[
            ("sum by (backend, result) "
             f"(rate(metricscale_discovery_passes_total{{{job}}}[5m]))",
             "{{backend}} {{result}}")]))
        .with_panel(_graph("Discovery duration", unit="s", queries=[
            ("histogram_quantile(0.9, sum by (backend, le) "
             f"(rate(metricscale_discovery_duration_seconds_bucket{{{job}}}[15m])))",
             "p90 {{backend}}")]))
        .with_panel(_graph("Discovery age by backend", unit="s", queries=[
            (f"max by (backend) (metricscale_discovery_age_seconds{{{job}}})",
             "{{backend}}")]))
        .with_panel(_graph("Metrics by rule", unit="none", queries=[
            (f"max by (rule) (metricscale_rule_discovered_metrics{{{job}}})", "{{rule}}")]))
        .with_panel(_graph("Cluster resources discovered", unit="none", queries=[
            (f"max(metricscale_kube_discovery_resources{{{job}}})", "resources"),
            (f"sum(metricscale_kube_discovery_failed_group_versions{{{job}}})",
             "failed group versions")]))
    )


def autoscaler_dashboard() -> dashboard.Dashboard:
    """Reconciles and errors of the controller, and replicas and metrics per autoscaler."""
    sel = _AUTOSCALER
    board = (dashboard.Dashboard("metricscale / autoscaler").uid("metricscale-autoscaler")
             .tags(["metricscale"]).refresh("30s").time("now-3h", "now").timezone("browser"))
    board = (_variables(board)
             .with_variable(_label_variable(
                 "namespace", label="Namespace",
                 query="metricscale_autoscaler_spec_max_replicas, namespace"))
             .with_variable(_label_variable(
                 "autoscaler", label="Autoscaler",
                 query='metricscale_autoscaler_spec_max_replicas{namespace=~"$namespace"}, '
                       "horizontalpodautoscaler")))
    return (
        board
        .with_row(dashboard.Row("Controller"))
        .with_panel(_graph("Reconciles by result", unit="ops", queries=[
            ("sum by (result) (rate(metricscale_autoscaler_reconciles_total[5m]))",
             "{{result}}")], width=8))
        .with_panel(_graph("Errors by reason", unit="ops", queries=[
            ("sum by (reason) (rate(metricscale_autoscaler_errors_total[5m]))",
             "{{reason}}")], width=8))
        .with_panel(_graph("Reconcile duration", unit="s", queries=[
            ("histogram_quantile(0.99, sum by (le) "
             "(rate(metricscale_autoscaler_reconcile_duration_seconds_bucket[5m])))", "p99"),
            ("max(metricscale_autoscaler_queue_depth)", "queue depth")], width=8))
        .with_row(dashboard.Row("Autoscalers"))
        .with_panel(_graph("Replicas", unit="none", width=24, queries=[
            (f"metricscale_autoscaler_status_current_replicas{{{sel}}}",
             "current {{namespace}}/{{horizontalpodautoscaler}}"),
            (f"metricscale_autoscaler_status_desired_replicas{{{sel}}}",
             "desired {{namespace}}/{{horizontalpodautoscaler}}"),
            (f"metricscale_autoscaler_spec_min_replicas{{{sel}}}",
             "min {{namespace}}/{{horizontalpodautoscaler}}"),
            (f"metricscale_autoscaler_spec_max_replicas{{{sel}}}",
             "max {{namespace}}/{{horizontalpodautoscaler}}")]))
        .with_panel(_graph("Metric against target (current / target)", unit="percentunit",
                           width=24, queries=[
            (f"metricscale_autoscaler_status_target_metric{{{sel}}} / on (namespace, "
             "horizontalpodautoscaler, kind, metric_name, metric_target_type) "
             f"metricscale_autoscaler_spec_target_metric{{{sel}}}",
             "{{namespace}}/{{horizontalpodautoscaler}} {{metric_name}} "
             "({{metric_target_type}})")]))
        .with_panel(_graph("Conditions that are not True", unit="none", width=24, queries=[
            (f'metricscale_autoscaler_status_condition{{{sel}, status!="true"}} == 1',
             "{{namespace}}/{{horizontalpodautoscaler}} {{condition}}={{status}}")]))
        # Shadow mode (`--shadow`) watches native HPAs, which the variables above (Autoscalers)
        # do not list: these panels show every shadowed HPA.
        .with_row(dashboard.Row("Shadow mode (native HPAs)"))
        .with_panel(_stat("Shadow agreement over the time range", unit="percentunit",
                          expr=shadow_agreement("$__range")))
        .with_panel(_graph("Shadow decisions by result", unit="ops", width=18, queries=[
            ("sum by (result) (rate(metricscale_shadow_decisions_total[5m]))",
             "{{result}}")]))
        .with_panel(_graph("Shadow agreement by HPA", unit="percentunit", width=24, queries=[
            (shadow_agreement("30m", by="namespace, horizontalpodautoscaler"),
             "{{namespace}}/{{horizontalpodautoscaler}}")]))
        .with_panel(_graph("Shadow replicas beside the HPA's", unit="none", width=24, queries=[
            ("metricscale_shadow_replicas",
             "metricscale {{namespace}}/{{horizontalpodautoscaler}}"),
            ("kube_horizontalpodautoscaler_status_desired_replicas and on (namespace, "
             "horizontalpodautoscaler) metricscale_shadow_replicas",
             "HPA {{namespace}}/{{horizontalpodautoscaler}}")]))
    )


def _dashboard_json(board: dashboard.Dashboard) -> str:
    plain = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    # The builders leave every panel at id 0; Grafana links and panel views need them unique.
    for number, panel in enumerate(plain["panels"], start=1):
        panel["id"] = number
    return json.dumps(plain, indent=2, sort_keys=True) + "\n"


def render_files() -> dict[str, str]:
    """Every generated file, by name under OUTPUT."""
    boards = {"adapter.json": _dashboard_json(adapter_dashboard()),
              "autoscaler.json": _dashboard_json(autoscaler_dashboard())}
    configmap = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "metricscale-dashboards",
                     "labels": {"grafana_dashboard": "1",
                                "app.kubernetes.io/part-of": "metricscale"}},
        "data": {
            f"metricscale-{name}": text for name, text in boards.items()},
    }
    header = "# Generated by `make dashboards` (monitoring/dashboards.py): do not edit.\n"
    return {**boards,
            "configmap.yaml": header + yaml.safe_dump(configmap, sort_keys=True, width=1000)}


def main() -> int:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    for name, text in render_files().items():
        (OUTPUT / name).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
