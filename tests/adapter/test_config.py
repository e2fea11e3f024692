"""The config file: strict like go-yaml's UnmarshalStrict, errors naming the rule and field."""

from __future__ import annotations

import pytest

from adapter.rules.config import ConfigError, parse_config, parse_prometheus_duration
from adapter.rules.defaults import DEFAULT_CONFIG_YAML, default_config
from adapter.rules.resources import GroupResource

RULE = """
- seriesQuery: 'http_requests_total{namespace!=""}'
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  name: {matches: "^(.*)_total$", as: "${1}_per_second"}
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        parse_config(text)
    return [str(issue) for issue in raised.value.issues]


def test_a_valid_rule_is_compiled() -> None:
    config = parse_config("rules:" + RULE + "externalRules:" + RULE.replace(
        "{namespace: {resource: namespace}, pod: {resource: pod}}",
        "{namespace: {resource: namespace}}"))
    rule = config.rules[0]
    assert rule.path == "rules[0]"
    assert rule.series_query == 'http_requests_total{namespace!=""}'
    assert rule.resources.overrides == (("namespace", GroupResource("namespace")),
                                        ("pod", GroupResource("pod")))
    assert rule.name.api_name("http_requests_total") == "http_requests_per_second"
    assert [f.pattern for f in rule.filters] == ["^(.*)_total$"]  # the implicit `is`
    assert config.external_rules[0].path == "externalRules[0]"
    assert config.series_queries() == ('http_requests_total{namespace!=""}',)
    assert config.warnings == ()


def test_empty_file_is_an_empty_config() -> None:
    config = parse_config("")
    assert (config.rules, config.external_rules, config.resource_rules) == ((), (), None)


def test_helm_values_pasted_as_config_fail_like_issue_412() -> None:
    assert problems("rules: {default: false, external: []}") == [
        "rules: cannot unmarshal !!map into []config.DiscoveryRule (line 1)"]


@pytest.mark.parametrize(("text", "expected"), [
    ("rules:\n- seriesQuery: x\n  metricsQuery: y\n  nmae: {}\n",
     "rules[0].nmae: field nmae not found in type config.DiscoveryRule (line 4)"),
    ("rules:\n- seriesQuery: x\n  metricsQuery: y\n  seriesQuery: z\n",
     'rules[0].seriesQuery: key "seriesQuery" already set in map (line 4)'),
    ("rules:\n- seriesQuery: x\n  metricsQuery: y\n  name: {as: [a]}\n",
     "rules[0].name.as: cannot unmarshal !!seq into string (line 4)"),
    ("rules:\n- seriesQuery: x\n  metricsQuery: y\n- seriesQuery: x\n  metricsQuery: y\n"
     "- seriesQuery: x\n  metricsQuery: y\n  name: {matches: '(a)(b)'}\n",
     "rules[2].name.as: must specify an 'as' value for name matcher \"(a)(b)\" associated with "
     'series query "x" (line 8)'),
    ("rules:\n- seriesQuery: x\n  metricsQuery: y\n  resources: {namespaced: maybe}\n",
     "rules[0].resources.namespaced: cannot unmarshal !!str `maybe` into bool (line 4)"),
    ("externalRules:\n- seriesQuery: x\n  metricsQuery: y\n  seriesFilters: [{is: a, isNot: b}]\n",
     "externalRules[0].seriesFilters[0]: cannot have both an `is` (\"a\") and `isNot` (\"b\") "
     "expression in a single filter (line 4)"),
    ("rules:\n- seriesQuery: x\n  metricsQuery: y\n  seriesFilters: [{}]\n",
     "rules[0].seriesFilters[0]: must have either an `is` or `isNot` expression in a filter "
     "(line 4)"),
    ("rules:\n- seriesQuery: x\n  metricsQuery: y\n  seriesFilters: [{isNot: 'a(?!b)'}]\n",
     'rules[0].seriesFilters[0]: unable to compile series filter "a(?!b)": error parsing '
     "regexp: invalid or unsupported Perl syntax: `(?!` (line 4)"),
    ("rules:\n- seriesQuery: x\n  metricsQuery: y\n  name: {matches: 'a++'}\n",
     'rules[0].name.matches: unable to compile series name match expression "a++" associated '
     'with series query "x": error parsing regexp: invalid nested repetition operator: `++` '
     "(line 4)"),
    ("rules:\n- seriesQuery: x\n  metricsQuery: y\n  resources: {template: '<<.Group>>'}\n",
     'rules[0].resources.template: unable to generate label format from template '
     '"<<.Group>>": must include at least `{{.Resource}}` in the label template (line 4)'),
    ("rules:\n- seriesQuery: x\n  metricsQuery: '<<join .GroupBySlice \",\">>'\n",
     'rules[0].metricsQuery: unable to parse metrics query template "<<join .GroupBySlice '
     '\\",\\">>": template: metrics-query:1: function "join" not defined (line 3)'),
    ("rules:\n- metricsQuery: y\n",
     "rules[0].seriesQuery: required: the series selector that discovery sends to "
     "/api/v1/series (line 2)"),
    ("rules:\n- seriesQuery: x\n",
     "rules[0].metricsQuery: required: the PromQL template each request renders "
     "(prometheus-adapter has no default and fails every request) (line 2)"),
    ("rules:\n- seriesQuery: x\n  metricsQuery: y\n  resources:\n    overrides:\n"
     "      kubernetes.io/pod: {resource: pod}\n",
     'rules[0].resources.overrides["kubernetes.io/pod"]: "kubernetes.io/pod" is not a valid '
     "Prometheus label name (line 6)"),
    ("rules:\n- seriesQuery: x\n  metricsQuery: y\n  resources:\n    overrides:\n"
     "      pod: {group: ''}\n",
     "rules[0].resources.overrides.pod.resource: required: the resource this label names "
     "(e.g. pod, deployment) (line 6)"),
    ("resourceRules: {window: 1.5m}\n",
     "resourceRules.cpu: required: containerQuery, nodeQuery, resources and containerLabel "
     "(line 1)"),
    ("surprise: 1\n", "surprise: field surprise not found in type "
                      "config.MetricsDiscoveryConfig (line 1)"),
])
def test_errors_name_the_rule_and_the_field(text: str, expected: str) -> None:
    assert expected in problems(text)


def test_every_problem_is_reported_at_once() -> None:
    found = problems("rules:\n- seriesQuery: x\n  metricsQuery: '<<end>>'\n  foo: 1\n"
                     "- seriesQuery: y\n  metricsQuery: y\n  name: {matches: '(a)(b)'}\n")
    assert [issue.split(":")[0] for issue in found] == [
        "rules[0].metricsQuery", "rules[0].foo", "rules[1].name.as"]


def test_invalid_window_is_reported() -> None:
    assert any(p.startswith('resourceRules.window: not a valid duration string: "1.5m"')
               for p in problems("resourceRules: {window: 1.5m}\n"))


def test_yaml_syntax_errors_are_reported_with_a_line() -> None:
    (issue,) = problems("rules:\n- seriesQuery: 'x\n")
    assert issue.startswith("yaml: ") and "(line " in issue


def test_scalars_go_into_string_fields_as_their_source_text() -> None:
    config = parse_config("rules:\n- seriesQuery: 123\n  metricsQuery: x\n  name: {as: 0x1F}\n")
    assert config.rules[0].series_query == "123"
    assert config.rules[0].name_as == "0x1F"


def test_yaml_merge_keys_and_anchors_work_as_in_go_yaml() -> None:
    config = parse_config("""
rules:
- seriesQuery: a
  metricsQuery: q
  resources: &labels {overrides: {pod: {resource: pod}}}
- <<: {seriesQuery: b, metricsQuery: base}
  metricsQuery: mine
  resources: *labels
""")
    assert [(r.series_query, r.metrics_query) for r in config.rules] == [("a", "q"),
                                                                        ("b", "mine")]
    assert config.rules[1].resources.overrides == (("pod", GroupResource("pod")),)


def test_namespaced_accepts_yaml_booleans() -> None:
    config = parse_config("externalRules:\n- seriesQuery: x\n  metricsQuery: y\n"
                          "  resources: {namespaced: no}\n")
    assert config.external_rules[0].namespaced is False


@pytest.mark.parametrize(("text", "warning"), [
    ("externalRules:\n- seriesQuery: x\n  metricsQuery: y\n",
     "externalRules[0].resources: no label maps to namespaces"),
    ("rules:\n- seriesQuery: x\n  metricsQuery: y\n",
     "rules[0].resources: maps no label to a resource"),
    ("rules:\n- seriesQuery: '{__name__!=\"^container_.*\"}'\n  metricsQuery: y\n"
     "  resources: {template: <<.Resource>>}\n",
     "rules[0].seriesQuery: __name__ is compared with = or != against a value that looks like "
     "a regex"),
    ("rules:\n- seriesQuery: x\n  metricsQuery: y\n"
     "  resources: {template: <<.Resource>>, namespaced: false}\n",
     "rules[0].resources.namespaced: has no effect on rules"),
])
def test_things_that_cannot_work_as_intended_are_warned_about(text: str, warning: str) -> None:
    warnings = [str(w) for w in parse_config(text).warnings]
    assert any(w.startswith(warning) for w in warnings), warnings


@pytest.mark.parametrize(("text", "milliseconds"), [
    ("0", 0), ("5m", 300_000), ("1m30s", 90_000), ("90s", 90_000), ("1h", 3_600_000),
    ("250ms", 250), ("1d", 86_400_000), ("1w", 604_800_000),
])
def test_prometheus_durations(text: str, milliseconds: int) -> None:
    assert parse_prometheus_duration(text) == milliseconds


@pytest.mark.parametrize("text", ["", "1.5m", "5", "m", "1s1m", "-1m"])
def test_invalid_prometheus_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_prometheus_duration(text)


def test_default_rules_parse_without_warnings_and_do_not_map_job() -> None:
    config = default_config()
    assert config.warnings == ()
    assert len(config.rules) == 6 and config.resource_rules is not None
    for rule in config.rules:
        assert rule.resources.label_template is None
        assert "job" not in dict(rule.resources.overrides)
    assert "template:" not in DEFAULT_CONFIG_YAML.split("resourceRules:")[0].replace(
        "`template: <<.Resource>>`", "")


# --- strings that cannot be encoded ----------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ('rules:\n- seriesQuery: "up\\ud800"\n',
     ["rules[0].seriesQuery: \\ud800 is a UTF-16 surrogate escape, not a character: write the "
      "character itself (line 2)"]),
    # A pair is two lone surrogates to YAML (PyYAML does not join them): write the character.
    ('rules:\n- name: {as: "\\ud83d\\ude00"}\n',
     ["rules[0].name.as: \\ud83d is a UTF-16 surrogate escape, not a character: write the "
      "character itself (line 2)"]),
    ('rules:\n- "\\U0000dfff": 1\n',
     ['rules[0]["\\ufffd"]: \\udfff is a UTF-16 surrogate escape, not a character: write the '
      "character itself (line 2)"]),
])
def test_a_surrogate_escape_is_refused_naming_its_field(text: str, expected: list[str]) -> None:
    found = problems(text)
    assert found == expected
    "\n".join(found).encode()  # the messages themselves print


def test_an_alias_loop_is_walked_once() -> None:
    assert problems("a: &x [*x]\n") == [
        "a: field a not found in type config.MetricsDiscoveryConfig (line 1)"]


def test_a_real_character_is_kept() -> None:
    config = parse_config('rules:\n- seriesQuery: "up"\n  name: {as: "r\\u00e9ponses"}\n'
                          "  metricsQuery: x\n")
    assert config.rules[0].name_as == "réponses"
