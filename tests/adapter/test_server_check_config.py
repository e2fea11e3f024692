"""`metricscale adapter --check-config FILE`: validation messages that name the rule and field,
and, given --prometheus-url, each rule's discovered metrics with a sample query."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from adapter.server import check_config
from adapter.settings import parse_settings
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import PrometheusServer

VALID = """
rules:
- seriesQuery: '{{__name__=~"cc_.*_total",job="{job}"}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  name:
    matches: '^cc_(.*)_total$'
    as: '${{1}}_per_second'
  metricsQuery: 'sum(rate(<<.Series>>{{<<.LabelMatchers>>}}[2m])) by (<<.GroupBy>>)'
externalRules:
- seriesQuery: '{{__name__="cc_queue",job="{job}"}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (queue)'
"""

INVALID = """
rules:
- seriesQuery: 'x'
  seriesFilters:
  - is: 'a'
    isNot: 'b'
  name:
    matches: '(a)(b)'
  metricsQuery: 'sum(x) by (<<join .GroupBySlice ",">>)'
  extra: 1
"""


def run_check(tmp_path: Path, text: str, *args: str) -> tuple[int, str]:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    out = io.StringIO()
    code = check_config(parse_settings(["--check-config", str(path), *args]), out=out)
    return code, out.getvalue()


def test_a_valid_file_is_summarised_and_exits_0(tmp_path: Path) -> None:
    code, out = run_check(tmp_path, VALID.format(job="j"))
    assert code == 0
    assert out.endswith("valid: 1 rules, 1 externalRules, resourceRules: no\n")


def test_an_invalid_file_names_each_rule_and_field_and_exits_1(tmp_path: Path) -> None:
    code, out = run_check(tmp_path, INVALID)
    assert code == 1
    assert "rules[0].seriesFilters[0]: cannot have both an `is`" in out
    assert "rules[0].name.as: must specify an 'as' value" in out
    assert "rules[0].metricsQuery: unable to parse metrics query template" in out
    assert "rules[0].extra: field extra not found in type config.DiscoveryRule" in out
    assert out.rstrip().endswith("invalid (4 problem(s))")


def test_a_missing_file_exits_1(tmp_path: Path) -> None:
    out = io.StringIO()
    settings = parse_settings(["--check-config", str(tmp_path / "nowhere.yaml")])
    assert check_config(settings, out=out) == 1
    assert "cannot read" in out.getvalue()


@pytest.mark.prometheus
def test_with_prometheus_each_rule_lists_its_metrics_and_a_sample_query(
        tmp_path: Path, prometheus: PrometheusServer, exporter: Exporter) -> None:
    exporter.set("cc_http_requests_total", {"namespace": "shop", "pod": "web-0"}, 1)
    exporter.set("cc_queue", {"namespace": "shop", "queue": "orders"}, 3)
    prometheus.wait_for(f'{{job="{exporter.job}",__name__=~"cc_.*"}}',
                        lambda samples: len(samples) == 2, timeout=120)
    code, out = run_check(tmp_path, VALID.format(job=exporter.job),
                          "--prometheus-url", prometheus.url)
    assert code == 0, out
    assert "rules[0]: seriesQuery" in out and "1 series names, 2 metrics" in out
    assert "pods/http_requests_per_second (namespaced, series cc_http_requests_total)" in out
    assert ('sum(rate(cc_http_requests_total{namespace="<namespace>",pod="<name>"}[2m])) '
            'by (pod)') in out
    assert "namespaces/http_requests_per_second (cluster-scoped" in out
    assert 'sum(cc_queue{namespace="<namespace>"}) by (queue)' in out
    assert "discovered 2 custom and 1 external metrics" in out


@pytest.mark.shipped_interpreter
def test_an_unreachable_prometheus_exits_1(tmp_path: Path) -> None:
    code, out = run_check(tmp_path, VALID.format(job="j"), "--prometheus-url",
                          "http://127.0.0.1:9", "--prometheus-timeout", "2s")
    assert code == 1
    assert "discovery against http://127.0.0.1:9 failed" in out


REPO = Path(__file__).resolve().parents[2]


def test_the_manifests_configmap_is_checked_through_its_config_yaml() -> None:
    out = io.StringIO()
    path = REPO / "manifests/adapter/configmap.yaml"
    code = check_config(parse_settings(["--check-config", str(path)]), out=out)
    assert code == 0, out.getvalue()
    assert "checking its data.config.yaml" in out.getvalue()
    assert "apiVersion" not in out.getvalue()
    assert ": valid: " in out.getvalue()


def test_a_configmap_without_config_yaml_says_what_to_pass(tmp_path: Path) -> None:
    code, out = run_check(tmp_path, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"
                                    "data: {other.yaml: 'rules: []'}\n")
    assert code == 1
    assert "without data.config.yaml" in out


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n"])
def test_an_empty_file_is_a_warning_not_zero_valid_rules(tmp_path: Path, text: str) -> None:
    code, out = run_check(tmp_path, text)
    assert code == 0
    assert "warning: the file is empty" in out
    assert "valid: 0 rules" not in out


def test_each_backend_is_listed_with_the_rules_that_read_from_it(tmp_path: Path) -> None:
    text = """backends:
- name: thanos
  url: http://user:secret@thanos:9090
- name: spare
  url: http://spare:9090
rules:
- seriesQuery: 'a_total'
  backend: thanos
  metricsQuery: 'sum(<<.Series>>)'
- seriesQuery: 'b_total'
  metricsQuery: 'sum(<<.Series>>)'
externalRules:
- seriesQuery: 'queue'
  backend: thanos
  metricsQuery: 'sum(<<.Series>>)'
"""
    code, output = run_check(tmp_path, text)
    assert code == 0, output
    lines = output.splitlines()
    assert "not served yet" not in output
    assert lines[-3:] == [
        "backend default (--prometheus-url): rules[1]",
        "backend thanos (http://user@thanos:9090): rules[0], externalRules[0]",
        "backend spare (http://spare:9090): no rule"]


def test_a_tenant_backend_is_listed_with_its_tenants(tmp_path: Path) -> None:
    text = """backends:
- name: listed
  url: http://listed:9090
  headers: {X-Scope-OrgID: {value: "<<.Namespace>>", default: platform}}
  tenants: [team-a, team-b]
- name: following
  url: http://following:9090
  headers: {X-Scope-OrgID: "<<.Namespace>>"}
rules:
- seriesQuery: 'a_total'
  backend: listed
  metricsQuery: 'sum(<<.Series>>)'
- seriesQuery: 'b_total'
  backend: following
  metricsQuery: 'sum(<<.Series>>)'
"""
    code, output = run_check(tmp_path, text)
    assert code == 0, output
    assert output.splitlines()[-2:] == [
        "backend listed (http://listed:9090): rules[0]; tenants: team-a, team-b, platform",
        "backend following (http://following:9090): rules[1]; tenants: one per namespace the "
        "adapter sees (at most 1000)"]
