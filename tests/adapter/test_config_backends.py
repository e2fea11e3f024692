"""`backends:` (our extension): named Prometheus backends, rules bound to them, tenants."""

from __future__ import annotations

import pytest

from adapter.rules.config import DEFAULT_BACKEND, ConfigError, parse_config
from adapter.rules.tenants import follows_namespaces, namespace_tenants

RULE = """
- seriesQuery: 'http_requests_total{namespace!="",pod!=""}'
  resources: {template: "<<.Resource>>"}
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'
"""

RESOURCE_RULE = """
    containerQuery: 'sum(rate(c[1m])) by (<<.GroupBy>>)'
    nodeQuery: 'sum(rate(n[1m])) by (<<.GroupBy>>)'
    resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod},
                node: {resource: node}}}
    containerLabel: container
"""

THANOS_AND_MIMIR = """\
backends:
- name: thanos
  url: https://thanos-query.monitoring.svc:9090
  caFile: /etc/thanos/ca.crt
  timeout: 10s
  verb: get
  acceptEncoding: gzip
- name: mimir
  url: http://mimir-gateway.mimir.svc/prometheus
  headers:
    X-Scope-OrgID: {value: "<<.Namespace>>", default: platform}
    X-Static: yes-static
  tenants: [team-a, team-b]
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        parse_config(text)
    return [str(issue) for issue in raised.value.issues]


def test_a_file_without_backends_binds_every_rule_to_default() -> None:
    config = parse_config("rules:" + RULE + "externalRules:" + RULE)
    assert config.backends == ()
    assert {r.backend for r in (*config.rules, *config.external_rules)} == {DEFAULT_BACKEND}
    assert config.rules_by_backend() == {"default": ("rules[0]", "externalRules[0]")}


def test_backends_are_parsed_with_their_options() -> None:
    config = parse_config(THANOS_AND_MIMIR + "rules:" + RULE + RULE.replace(
        "metricsQuery", "backend: mimir\n  metricsQuery")
        + "resourceRules:\n  cpu:" + RESOURCE_RULE + "    backend: thanos\n  memory:"
        + RESOURCE_RULE)
    thanos, mimir = config.backends
    assert (thanos.name, thanos.url, thanos.ca_file, thanos.timeout_seconds, thanos.verb) == (
        "thanos", "https://thanos-query.monitoring.svc:9090", "/etc/thanos/ca.crt", 10.0, "GET")
    assert (thanos.accept_encoding, mimir.accept_encoding) == ("gzip", None)
    assert not thanos.per_namespace
    assert mimir.per_namespace and mimir.tenants == ("team-a", "team-b")
    tenant, static = mimir.headers
    assert (tenant.name, tenant.default) == ("X-Scope-OrgID", "platform")
    assert tenant.template is not None
    assert tenant.template.render({"Namespace": "team-a"}) == "team-a"
    assert (static.value, static.template) == ("yes-static", None)
    assert [r.backend for r in config.rules] == ["default", "mimir"]
    assert config.resource_rules is not None
    assert config.resource_rules.cpu.backend == "thanos"
    assert config.resource_rules.memory.backend == "default"
    assert config.rules_by_backend() == {
        "default": ("rules[0]", "resourceRules.memory"),
        "thanos": ("resourceRules.cpu",), "mimir": ("rules[1]",)}
    assert config.series_queries_for("mimir") == ('http_requests_total{namespace!="",pod!=""}',)
    assert config.series_queries_for("thanos") == ()


def test_an_unknown_backend_name_is_reported_at_the_rule() -> None:
    assert problems(THANOS_AND_MIMIR + "externalRules:" + RULE.replace(
        "metricsQuery", "backend: victoria\n  metricsQuery")) == [
        'externalRules[0].backend: unknown backend "victoria" (known: default, mimir, thanos)'
        " (line 17)"]


def test_duplicate_names_default_and_bad_urls_are_errors_with_lines() -> None:
    assert problems("""\
backends:
- name: a
  url: ftp://a
- name: a
  url: http://a2
- name: default
  url: http://d
- name: b
- name: Bad_Name
  url: http://[::1
""") == [
        "backends[0].url: must be an http:// or https:// URL (line 3)",
        'backends[1].name: duplicate backend name "a" (also backends[0]) (line 4)',
        'backends[2].name: "default" is the backend of --prometheus-url and its flags; '
        "choose another name (line 6)",
        "backends[3].url: required: the Prometheus base URL (line 8)",
        "backends[4].name: must be lowercase letters, digits and '-' (line 9)",
        "backends[4].url: not a valid URL: Invalid IPv6 URL (line 10)"]


@pytest.mark.parametrize(("backend", "expected"), [
    ("  bogus: 1\n", "backends[0].bogus: field bogus not found in type Backend (line 4)"),
    ("  timeout: soon\n", 'backends[0].timeout: not a valid duration string: "soon" (line 4)'),
    ("  verb: PUT\n", "backends[0].verb: must be GET or POST (line 4)"),
    ("  acceptEncoding: br\n", "backends[0].acceptEncoding: must be identity or gzip (line 4)"),
    ("  basicAuth: {username: u}\n",
     "backends[0].basicAuth: needs both username and passwordFile (line 4)"),
    ("  tenants: [a]\n", "backends[0].tenants: needs a header whose value is a template over "
     "<<.Namespace>> (line 4)"),
    ('  headers: {X-Org: "<<.Namespace"}\n',
     'backends[0].headers["X-Org"]: unable to parse header template'),
    ("  headers: {X-Org: {value: fixed, default: d}}\n",
     'backends[0].headers["X-Org"].default: only a templated value (<<.Namespace>>) needs a '
     "default (line 4)"),
    ("  insecureSkipVerify: maybe\n",
     "backends[0].insecureSkipVerify: cannot unmarshal !!str `maybe` into bool (line 4)"),
])
def test_bad_backend_options_name_their_field(backend: str, expected: str) -> None:
    found = problems("backends:\n- name: b\n  url: http://b\n" + backend)
    assert len(found) == 1 and found[0].startswith(expected), found


def test_a_tenant_backend_without_tenants_follows_the_namespaces() -> None:
    config = parse_config('backends:\n- name: m\n  url: http://m\n'
                          '  headers: {X-Scope-OrgID: "<<.Namespace>>"}\n')
    assert [str(w) for w in config.warnings] == []
    assert config.backends[0].tenants is None and follows_namespaces(config.backends[0])
    assert namespace_tenants(config.backends[0], ["b", "a", "b"]) == ["b", "a"]


def test_an_empty_tenants_list_is_a_warning() -> None:
    config = parse_config('backends:\n- name: m\n  url: http://m\n'
                          '  headers: {X-Scope-OrgID: "<<.Namespace>>"}\n  tenants: []\n')
    assert [str(w) for w in config.warnings] == [
        "backends[0].tenants: empty: discovery lists no tenant but the header's default, so "
        "this backend serves no namespace (leave the field out to follow every namespace) "
        "(line 5)"]
    assert not follows_namespaces(config.backends[0])


def test_a_rule_on_a_named_backend_is_served_without_a_warning() -> None:
    config = parse_config(THANOS_AND_MIMIR + "rules:" + RULE.replace(
        "metricsQuery", "backend: mimir\n  metricsQuery"))
    assert [str(w) for w in config.warnings] == []
    assert config.rules_by_backend()["mimir"] == ("rules[0]",)


def test_resource_rules_on_a_tenant_backend_need_a_default_for_nodes() -> None:
    tenant = ('backends:\n- name: m\n  url: http://m\n  headers:\n'
              '    X-Scope-OrgID: "<<.Namespace>>"\n  tenants: [a]\n')
    resource = ("resourceRules:\n  cpu:" + RESOURCE_RULE + "    backend: m\n  memory:"
                + RESOURCE_RULE + "  window: 1m\n")
    found = problems(tenant + resource)
    assert any(p.startswith("resourceRules.cpu.backend: backend \"m\" has a header templated "
                            "over the namespace without a default") for p in found), found
    with_default = tenant.replace('"<<.Namespace>>"', '{value: "<<.Namespace>>", default: ops}')
    parse_config(with_default + resource)


def test_a_url_with_a_control_character_is_an_error() -> None:
    assert problems('backends:\n- name: b\n  url: "http://b:9090/\\n"\n') == [
        "backends[0].url: contains a control character (U+000A) (line 3)"]
