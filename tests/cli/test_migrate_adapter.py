"""cli.migrate_adapter: a prometheus-adapter ConfigMap, rule file or chart values made into
metricscale's configuration; every rule left out is reported with why; the documented
differences the file meets are named by their ids in docs/differences-prometheus-adapter.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from adapter.rules.config import parse_config
from adapter.rules.defaults import CONFIG_GEN_DEFAULTS_YAML, DEFAULT_CONFIG_YAML
from cli.migrate_adapter import (
    DIFFERENCES_DOC,
    GENERAL_DIFFERENCES,
    MigrationError,
    configmap_manifest,
    migrate_adapter_config,
)

CHECKOUT = Path(__file__).resolve().parents[2]

RULES = """\
# the team's rules
rules:
- seriesQuery: 'http_requests_total{namespace!="",pod!=""}'
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  name: {matches: "^(.*)_total$", as: "${1}_per_second"}
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'
externalRules:
- seriesQuery: 'queue_messages_ready{namespace!="",queue!=""}'
  resources: {overrides: {namespace: {resource: namespace}}}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (queue)'
"""


def ids(text: str, **kwargs: bool) -> list[str]:
    return [d.id for d in migrate_adapter_config(text, **kwargs).differences]


def test_a_configmaps_rules_are_carried_verbatim_comments_included() -> None:
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "adapter-config", "namespace": "monitoring"},
                 "data": {"config.yaml": RULES}}
    migration = migrate_adapter_config(yaml.safe_dump(configmap))
    assert migration.source == "configmap"
    assert migration.config_text == RULES
    assert migration.dropped == []
    manifest = configmap_manifest(migration, namespace="metricscale")
    assert manifest["metadata"]["name"] == "metricscale-adapter-config"
    assert parse_config(manifest["data"]["config.yaml"]).rules[0].name_as == "${1}_per_second"


def test_a_configmap_found_in_a_list_or_a_manifest_bundle() -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": [
        {"kind": "ConfigMap", "metadata": {"name": "other"}, "data": {"note": "hello"}},
        {"kind": "ConfigMap", "metadata": {"name": "adapter"}, "data": {"rules.yaml": RULES}}]}
    migration = migrate_adapter_config(yaml.safe_dump(listed))
    assert migration.config_text == RULES
    assert "ConfigMap adapter, key rules.yaml" in migration.notes[0]


def test_a_rule_the_stricter_parser_refuses_is_left_out_and_named_with_its_source_index() -> None:
    text = RULES.replace("externalRules:", """\
- seriesQuery: 'broken_total{namespace!=""}'
  resources: {template: <<.Resource>>}
- seriesQuery: 'fine{namespace!=""}'
  resources: {template: <<.Resource>>}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
- seriesQuery: 'odd{namespace!=""}'
  resources: {overrides: {"a.b": {resource: pod}}}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
externalRules:""")
    migration = migrate_adapter_config(text)
    assert [line.split(":")[0] for line in migration.dropped] == [
        "rules[3] left out", "rules[1] left out"]
    assert "rules[1].metricsQuery: required" in migration.dropped[1]
    assert migration.config is not None
    assert [r.series_query for r in migration.config.rules] == [
        'http_requests_total{namespace!="",pod!=""}', 'fine{namespace!=""}']
    assert ids(text).count("rules-that-cannot-work") == 2


def test_a_glued_capture_group_is_the_unnamed_metrics_difference_with_the_fix() -> None:
    text = RULES.replace("${1}_per_second", "$1_per_second")
    (found,) = [d for d in migrate_adapter_config(text).differences
                if d.id == "unnamed-metrics"]
    assert "write ${1}_per_second" in found.where


def test_rule_shapes_name_the_differences_they_meet() -> None:
    text = """\
rules:
- seriesQuery: 'up{namespace!=""}'
  resources:
    overrides:
      namespace: {resource: namespace}
      kubernetes_namespace: {resource: namespace}
      storage_class: {group: storage.k8s.io, resource: storageclass}
      widget: {group: example.com, resource: widget}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
externalRules:
- seriesQuery: 'QueueDepth{namespace!=""}'
  resources: {overrides: {namespace: {resource: namespace}}}
  metricsQuery: 'scalar(sum(<<.Series>>{<<.LabelMatchers>>}))'
"""
    found = ids(text)
    assert found.count("real-scope") == 2  # a storage class, and a CRD of unknown scope
    assert found.count("missing-resources") == 1
    assert "deterministic-labels" in found
    assert "external-names-ignore-case" in found
    assert "external-labels-never-null" in found
    assert "groups-always-served" not in found


def test_a_file_without_external_rules_meets_groups_always_served() -> None:
    text = RULES.split("externalRules:")[0]
    assert ids(text) == ["groups-always-served"]


def test_helm_values_become_rules_and_flags_and_report_what_they_cannot_carry() -> None:
    values = {
        "prometheus": {"url": "http://prometheus.monitoring.svc", "port": 9090, "path": "prom"},
        "metricsRelistInterval": "30s",
        "extraArguments": ["--prometheus-verb=GET", "--prometheus-auth-config=/etc/auth.yaml",
                           "--v=6", "--unheard-of=1"],
        "rules": {"default": True,
                  "custom": yaml.safe_load(RULES)["rules"],
                  "external": yaml.safe_load(RULES)["externalRules"],
                  "resource": yaml.safe_load(DEFAULT_CONFIG_YAML)["resourceRules"],
                  "existing": None},
        "tls": {"enable": True},
    }
    migration = migrate_adapter_config(yaml.safe_dump({"prometheus-adapter": values}))
    assert migration.source == "helm values"
    config = migration.config
    assert config is not None
    config_gen = yaml.safe_load(CONFIG_GEN_DEFAULTS_YAML)["rules"]
    assert len(config.rules) == len(config_gen) + 1
    assert config.rules[-1].name_as == "${1}_per_second"
    assert len(config.external_rules) == 1 and config.resource_rules is not None
    assert migration.flags == ["--prometheus-url=http://prometheus.monitoring.svc:9090/prom",
                               "--metrics-relist-interval=30s", "--prometheus-verb=GET"]
    dropped = "\n".join(migration.dropped)
    assert "--prometheus-auth-config" in dropped and "--prometheus-token-file" in dropped
    assert "--v=6" in dropped and "--unheard-of=1" in dropped
    notes = "\n".join(migration.notes)
    assert "config-gen" in notes and "jobs.batch" in notes
    assert "resource-metrics" in notes and "tls.enable" in notes


def test_our_default_rules_replace_the_charts_when_asked() -> None:
    values = {"rules": {"default": True, "custom": []}}
    migration = migrate_adapter_config(yaml.safe_dump(values), our_defaults=True)
    assert migration.config is not None
    ours = parse_config(DEFAULT_CONFIG_YAML)
    assert [r.resources.overrides for r in migration.config.rules] == [
        r.resources.overrides for r in ours.rules]


def test_an_existing_configmap_in_the_values_is_reported_not_guessed() -> None:
    migration = migrate_adapter_config(yaml.safe_dump(
        {"rules": {"default": False, "existing": "my-rules"}}))
    assert any("rules.existing: my-rules" in line for line in migration.dropped)


@pytest.mark.parametrize("text", ["", "just: a mapping\n", "- a\n- list\n"])
def test_a_file_without_a_configuration_is_refused(text: str) -> None:
    with pytest.raises(MigrationError):
        migrate_adapter_config(text)


def test_a_problem_that_is_no_rules_own_stops_the_migration() -> None:
    with pytest.raises(MigrationError, match="rulez"):
        migrate_adapter_config("rules: []\nrulez: []\n")


def test_every_difference_named_is_a_row_of_the_differences_document() -> None:
    table = (CHECKOUT / DIFFERENCES_DOC).read_text()
    documented = set(re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.MULTILINE))
    source = (CHECKOUT / "cli" / "migrate_adapter.py").read_text()
    named = set(re.findall(r'Difference\(\s*"([a-z0-9-]+)"', source))
    named |= set(re.findall(r'return "([a-z0-9-]+)"', source))
    named |= {"template-actions", "regex-features", *GENERAL_DIFFERENCES}
    assert named and named <= documented, named - documented
