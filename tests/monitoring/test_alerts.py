"""The PrometheusRule: valid for promtool, and each alert fires on its bad state only.

Both checks run the real promtool; `promtool test rules` evaluates the expressions with
Prometheus' own engine over the series given below.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.tools import require_tool
from tests.monitoring.support import alert_expressions, rule_groups

ADAPTER = {"job": "metricscale-adapter", "instance": "10.0.0.1:6443"}
HPA = 'namespace="shop", horizontalpodautoscaler="web", kind="HorizontalPodAutoscaler"'
HPA_LABELS = {"namespace": "shop", "horizontalpodautoscaler": "web",
              "kind": "HorizontalPodAutoscaler"}

# alert: (evaluated at, series in the bad state, series in the good state, labels when firing)
CASES: dict[str, tuple[str, list[tuple[str, str]], list[tuple[str, str]], dict[str, str]]] = {
    "MetricscaleAdapterDown": (
        "10m",
        [('up{job="metricscale-adapter", instance="a"}', "0x10")],
        [('up{job="metricscale-adapter", instance="a"}', "1x10")],
        {}),  # absent() of a comparison keeps no labels
    "MetricscaleAdapterAPIServiceUnavailable": (
        "10m",
        [('aggregator_unavailable_apiservice{name="v1beta1.custom.metrics.k8s.io"}', "1x10")],
        [('aggregator_unavailable_apiservice{name="v1beta1.custom.metrics.k8s.io"}', "0x10")],
        {"name": "v1beta1.custom.metrics.k8s.io"}),
    "MetricscaleDiscoveryStale": (
        "10m",
        [('metricscale_discovery_age_seconds{job="metricscale-adapter", '
          'instance="10.0.0.1:6443"}', "1000+60x10")],
        [('metricscale_discovery_age_seconds{job="metricscale-adapter", '
          'instance="10.0.0.1:6443"}', "30x10")],
        ADAPTER),
    "MetricscaleConfigReloadFailed": (
        "10m",
        [('metricscale_config_last_reload_successful{job="metricscale-adapter", '
          'instance="10.0.0.1:6443"}', "0x10")],
        [('metricscale_config_last_reload_successful{job="metricscale-adapter", '
          'instance="10.0.0.1:6443"}', "0 0 1x8")],
        ADAPTER),
    "MetricscalePrometheusErrors": (
        "20m",
        [('metricscale_prometheus_request_errors_total{job="metricscale-adapter", '
          'endpoint="query", reason="timeout"}', "0+10x20"),
         ('metricscale_prometheus_request_duration_seconds_count{job="metricscale-adapter", '
          'endpoint="query"}', "0+100x20")],
        [('metricscale_prometheus_request_errors_total{job="metricscale-adapter", '
          'endpoint="query", reason="timeout"}', "0x20"),
         ('metricscale_prometheus_request_duration_seconds_count{job="metricscale-adapter", '
          'endpoint="query"}', "0+100x20")],
        {"job": "metricscale-adapter", "endpoint": "query"}),
    "MetricscaleAutoscalerNotReconciling": (
        "30m",
        [('metricscale_autoscaler_reconciles_total{result="ok"}', "5x30"),
         ("metricscale_autoscaler_autoscalers", "3x30")],
        [('metricscale_autoscaler_reconciles_total{result="ok"}', "0+10x30"),
         ("metricscale_autoscaler_autoscalers", "3x30")],
        {}),
    "MetricscaleAutoscalerAtMaximum": (
        "20m",
        [(f"metricscale_autoscaler_status_current_replicas{{{HPA}}}", "10x20"),
         (f"metricscale_autoscaler_spec_max_replicas{{{HPA}}}", "10x20")],
        [(f"metricscale_autoscaler_status_current_replicas{{{HPA}}}", "5x20"),
         (f"metricscale_autoscaler_spec_max_replicas{{{HPA}}}", "10x20")],
        HPA_LABELS),
    "MetricscaleAutoscalerMetricsFailing": (
        "20m",
        [(f'metricscale_autoscaler_status_condition{{{HPA}, condition="ScalingActive", '
          'status="false"}', "1x20")],
        [(f'metricscale_autoscaler_status_condition{{{HPA}, condition="ScalingActive", '
          'status="false"}', "0x20")],
        HPA_LABELS),
}


@pytest.fixture(scope="module")
def promtool() -> str:
    return require_tool("promtool")


def _severity(alert: str) -> str:
    (rule,) = [rule for group in rule_groups()["groups"] for rule in group["rules"]
               if rule.get("alert") == alert]
    return str(rule["labels"]["severity"])


def _groups_without_annotations() -> dict[str, Any]:
    # promtool compares annotations too; the expressions, `for` and labels are what is tested.
    groups = rule_groups()
    for group in groups["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return groups


def _run(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_every_case_names_an_alert_of_the_rule_and_every_alert_has_a_case() -> None:
    assert set(CASES) == set(alert_expressions())


def test_promtool_accepts_the_rule_groups(promtool: str, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule_groups()))
    result = _run(promtool, "check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("alert", sorted(CASES))
@pytest.mark.parametrize("state", ["bad", "good"])
def test_alert_fires_on_the_bad_state_and_stays_quiet_on_the_good(
        promtool: str, tmp_path: Path, alert: str, state: str) -> None:
    at, bad, good, labels = CASES[alert]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(_groups_without_annotations()))
    expected = ([{"exp_labels": {**labels, "severity": _severity(alert)}}]
                if state == "bad" else [])
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": series, "values": values}
                             for series, values in (bad if state == "bad" else good)],
            "alert_rule_test": [{"eval_time": at, "alertname": alert,
                                 "exp_alerts": expected}],
        }],
    }
    test_file = tmp_path / "tests.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = _run(promtool, "test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr
