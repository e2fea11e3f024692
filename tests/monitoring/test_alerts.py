"""The PrometheusRule: valid for promtool, and each alert fires on its bad state only.

The same cases are checked twice: `promtool test rules` evaluates the alerts (with `for` and
labels) with Prometheus' rule engine, and a running Prometheus server, which loads the rule file
and holds the cases' series (backfilled with promtool, one time window per case), answers each
alert's expression through its query API.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.fakes.exporter import infer_type
from testbed.fakes.prometheus import MetricFamily, PrometheusServer, SeriesSamples
from testbed.fakes.tools import require_tool
from tests.monitoring.support import (
    REPO,
    alert_expressions,
    expand_values,
    parse_series,
    rule_groups,
    seconds,
)

ADAPTER = {"job": "metricscale-adapter", "instance": "10.0.0.1:6443"}
HPA = 'namespace="shop", horizontalpodautoscaler="web", kind="HorizontalPodAutoscaler"'
HPA_LABELS = {"namespace": "shop", "horizontalpodautoscaler": "web",
              "kind": "HorizontalPodAutoscaler"}


def _apiservices() -> list[str]:
    """The APIServices the adapter registers, the opt-in resource-metrics one included."""
    names = []
    for manifest in ("manifests/adapter/apiservices.yaml",
                     "manifests/components/resource-metrics/apiservice.yaml"):
        names += [document["metadata"]["name"]
                  for document in yaml.safe_load_all((REPO / manifest).read_text())
                  if document and document["kind"] == "APIService"]
    return names


APISERVICES = _apiservices()
# Unavailable APIServices of other servers: the adapter's alert ignores them.
OTHER_APISERVICES = ("v1beta1.metrics.example.com", "v1beta2.custom.metrics.example.com",
                     "v1.example.com")


def _unavailable(names: tuple[str, ...] | list[str], values: str) -> list[tuple[str, str]]:
    return [(f'aggregator_unavailable_apiservice{{name="{name}"}}', values) for name in names]


# alert: (evaluated at, series in the bad state, series in the good state,
#         the label sets of the alerts that fire in the bad state)
CASES: dict[str, tuple[str, list[tuple[str, str]], list[tuple[str, str]],
                       list[dict[str, str]]]] = {
    "MetricscaleAdapterDown": (
        "10m",
        [('up{job="metricscale-adapter", instance="a"}', "0x10")],
        [('up{job="metricscale-adapter", instance="a"}', "1x10")],
        [{}]),  # absent() of a comparison keeps no labels
    "MetricscaleAdapterAPIServiceUnavailable": (
        "10m",
        _unavailable(APISERVICES, "1x10") + _unavailable(OTHER_APISERVICES, "0x10"),
        _unavailable(APISERVICES, "0x10") + _unavailable(OTHER_APISERVICES, "1x10"),
        [{"name": name} for name in APISERVICES]),
    "MetricscaleDiscoveryStale": (
        "10m",
        [('metricscale_discovery_age_seconds{job="metricscale-adapter", '
          'instance="10.0.0.1:6443", backend="thanos"}', "1000+60x10"),
         ('metricscale_discovery_age_seconds{job="metricscale-adapter", '
          'instance="10.0.0.1:6443", backend="default"}', "30x10")],
        [('metricscale_discovery_age_seconds{job="metricscale-adapter", '
          'instance="10.0.0.1:6443", backend="default"}', "30x10")],
        [{**ADAPTER, "backend": "thanos"}]),
    "MetricscaleConfigReloadFailed": (
        "10m",
        [('metricscale_config_last_reload_successful{job="metricscale-adapter", '
          'instance="10.0.0.1:6443"}', "0x10")],
        [('metricscale_config_last_reload_successful{job="metricscale-adapter", '
          'instance="10.0.0.1:6443"}', "0 0 1x8")],
        [ADAPTER]),
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
        [{"job": "metricscale-adapter", "endpoint": "query"}]),
    "MetricscaleAutoscalerNotReconciling": (
        "30m",
        [('metricscale_autoscaler_reconciles_total{result="ok"}', "5x30"),
         ("metricscale_autoscaler_autoscalers", "3x30")],
        [('metricscale_autoscaler_reconciles_total{result="ok"}', "0+10x30"),
         ("metricscale_autoscaler_autoscalers", "3x30")],
        [{}]),
    "MetricscaleAutoscalerAtMaximum": (
        "20m",
        [(f"metricscale_autoscaler_status_current_replicas{{{HPA}}}", "10x20"),
         (f"metricscale_autoscaler_spec_max_replicas{{{HPA}}}", "10x20")],
        [(f"metricscale_autoscaler_status_current_replicas{{{HPA}}}", "5x20"),
         (f"metricscale_autoscaler_spec_max_replicas{{{HPA}}}", "10x20")],
        [HPA_LABELS]),
    "MetricscaleAutoscalerMetricsFailing": (
        "20m",
        [(f'metricscale_autoscaler_status_condition{{{HPA}, condition="ScalingActive", '
          'status="false"}', "1x20")],
        [(f'metricscale_autoscaler_status_condition{{{HPA}, condition="ScalingActive", '
          'status="false"}', "0x20")],
        [HPA_LABELS]),
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


def test_the_apiservice_alert_covers_every_apiservice_the_adapter_can_serve() -> None:
    assert {"v1beta1.custom.metrics.k8s.io", "v1beta2.custom.metrics.k8s.io",
            "v1beta1.external.metrics.k8s.io", "v1beta1.metrics.k8s.io"} <= set(APISERVICES)


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
    expected = ([{"exp_labels": {**alert_labels, "severity": _severity(alert)}}
                 for alert_labels in labels] if state == "bad" else [])
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


# ---- each alert's expression against a running Prometheus server

# Each (alert, state) gets its own hour of backfilled history, so one server holds every case
# and the expressions, which aggregate over all series, see one case at a time: a case spans at
# most 30 minutes and the expressions look back at most 15 (plus the 5-minute lookback).
SCENARIOS = [(alert, state) for alert in sorted(CASES) for state in ("bad", "good")]
WINDOW = 3600
STEP = 60  # the cases' `interval`
RULE_HEALTH_TIMEOUT = 20.0


def _window_start(history_start: int, alert: str, state: str) -> int:
    return history_start + SCENARIOS.index((alert, state)) * WINDOW


def _families(history_start: int) -> list[MetricFamily]:
    samples: dict[str, dict[tuple[tuple[str, str], ...], list[tuple[float, float]]]] = {}
    for alert, state in SCENARIOS:
        _at, bad, good, _labels = CASES[alert]
        start = _window_start(history_start, alert, state)
        for series, values in bad if state == "bad" else good:
            name, labels = parse_series(series)
            points = samples.setdefault(name, {}).setdefault(tuple(sorted(labels.items())), [])
            points += [(start + index * STEP, value)
                       for index, value in enumerate(expand_values(values))]
    return [MetricFamily(name=name, type=infer_type(name),
                         series=[SeriesSamples(labels=dict(labels), samples=sorted(points))
                                 for labels, points in by_labels.items()])
            for name, by_labels in samples.items()]


@pytest.fixture(scope="module")
def history_start() -> int:
    # Whole hours a day back: old enough to lie wholly before the server's head block.
    return (int(time.time()) // WINDOW - 24) * WINDOW


@pytest.fixture(scope="module")
def rules_server(
    prometheus_binary: str, promtool_binary: str, history_start: int
) -> Iterator[PrometheusServer]:
    """A Prometheus of this module's own: the PrometheusRule's groups as its rule file, and
    every case's series backfilled with promtool into its own window of history."""
    with contextlib.ExitStack() as cleanup:
        server = PrometheusServer(binary=prometheus_binary, promtool=promtool_binary)
        cleanup.callback(server.close)
        rules = server.directory / "metricscale-rules.yaml"
        rules.write_text(yaml.safe_dump(rule_groups(), sort_keys=False))
        config = json.loads(server.config_file.read_text())
        config["rule_files"] = [str(rules)]
        server.config_file.write_text(json.dumps(config, indent=2) + "\n")
        server.backfill(_families(history_start))
        server.start()
        yield server


def _label_order(labels: dict[str, str]) -> list[tuple[str, str]]:
    return sorted(labels.items())


def _alerting_rules(server: PrometheusServer) -> dict[str, dict[str, Any]]:
    # /api/v1/rules answers GET only (PrometheusClient.api POSTs).
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{server.url}/api/v1/rules?type=alert", timeout=10) as response:
        payload = json.load(response)
    assert payload["status"] == "success", payload
    return {rule["name"]: rule for group in payload["data"]["groups"] for rule in group["rules"]}


@pytest.mark.prometheus
def test_the_server_loads_every_alert_and_evaluates_it_without_error(
        rules_server: PrometheusServer) -> None:
    deadline = time.monotonic() + RULE_HEALTH_TIMEOUT
    while True:
        rules = _alerting_rules(rules_server)
        if all(rule["health"] != "unknown" for rule in rules.values()) or (
                time.monotonic() > deadline):
            break
        time.sleep(0.2)
    assert set(rules) == set(alert_expressions())
    unhealthy = {name: (rule["health"], rule.get("lastError"))
                 for name, rule in rules.items() if rule["health"] != "ok"}
    assert unhealthy == {}


@pytest.mark.prometheus
@pytest.mark.parametrize(("alert", "state"), SCENARIOS)
def test_the_server_answers_each_alert_expression_on_the_bad_state_only(
        rules_server: PrometheusServer, history_start: int, alert: str, state: str) -> None:
    at, _bad, _good, labels = CASES[alert]
    moment = _window_start(history_start, alert, state) + seconds(at)
    answer = rules_server.query(alert_expressions()[alert], at=moment)
    found = sorted((dict(sample.labels) for sample in answer), key=_label_order)
    expected = sorted(labels, key=_label_order) if state == "bad" else []
    assert found == expected, "\n".join(str(sample) for sample in answer)
