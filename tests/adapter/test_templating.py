"""The Go text/template subset: output byte-for-byte as Go prints it, errors where Go errs."""

from __future__ import annotations

from typing import Any

import pytest

from adapter.rules.templating import (
    GoStruct,
    TemplateExecutionError,
    TemplateSyntaxError,
    go_sprint_value,
    parse_template,
)

ARGS = GoStruct("naming.queryTemplateArgs", {
    "Series": "http_requests_total",
    "LabelMatchers": 'namespace="shop",pod=~"a|b"',
    "LabelValuesByName": {"pod": "a|b", "namespace": "shop"},
    "GroupBy": "pod,container",
    "GroupBySlice": ["pod", "container"],
})


def render(source: str, data: Any = ARGS) -> str:
    return parse_template(source, name="metrics-query").render(data)


@pytest.mark.parametrize(("source", "output"), [
    ("sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)",
     'sum(rate(http_requests_total{namespace="shop",pod=~"a|b"}[2m])) by (pod,container)'),
    ("no actions at all", "no actions at all"),
    ("<<.GroupBySlice>>", "[pod container]"),
    ("<<.LabelValuesByName>>", "map[namespace:shop pod:a|b]"),
    ('<<index .LabelValuesByName "pod">>', "a|b"),
    ('<<index .LabelValuesByName "missing">>', ""),
    ("<<.LabelValuesByName.pod>>", "a|b"),
    ("<<.LabelValuesByName.missing>>", "<no value>"),
    ("<<index .GroupBySlice 1>>", "container"),
    ("<<len .GroupBySlice>> <<len .Series>>", "2 19"),
    ("<<range .GroupBySlice>>[<<.>>]<<end>>", "[pod][container]"),
    ("<<range $i, $l := .GroupBySlice>><<$i>>=<<$l>>;<<end>>", "0=pod;1=container;"),
    ("<<range $k, $v := .LabelValuesByName>><<$k>>:<<$v>> <<end>>", "namespace:shop pod:a|b "),
    ("<<range .Missing>>x<<else>>empty<<end>>", None),
    ('<<if eq .GroupBy "pod,container">>yes<<else>>no<<end>>', "yes"),
    ('<<if ne .GroupBy "pod">>yes<<end>>', "yes"),
    ('<<if eq .Series "a" "b" "http_requests_total">>any<<end>>', "any"),
    ('<<if .GroupBy>>a<<else if .Series>>b<<else>>c<<end>>', "a"),
    ('<<if not .GroupBy>>a<<else if .Series>>b<<else>>c<<end>>', "b"),
    ("<<with .Series>><<.>><<end>>", "http_requests_total"),
    ('<<printf "%s|%q|%d|%v" .Series .GroupBy 7 .GroupBySlice>>',
     'http_requests_total|"pod,container"|7|[pod container]'),
    ('<<printf "%q" .GroupBySlice>>', '["pod" "container"]'),
    ('<<printf "%d" .Series>>', "%!d(string=http_requests_total)"),
    ('<<printf "%s %s" .Series>>', "http_requests_total %!s(MISSING)"),
    ('<<printf "%s" .Series 3>>', "http_requests_total%!(EXTRA int=3)"),
    ('<<printf "%5s|%-5s|%03d|%%" "ab" "cd" 7>>', "   ab|cd   |007|%"),
    ('<<.Series | printf "%s!">>', "http_requests_total!"),
    ('<<print 1 2 "a" 3 "b" "c">>', "1 2a3bc"),
    ("a   <<- .GroupBy ->>   b", "apod,containerb"),
    ("a\n  <<- /* comment */ ->>\n  b", "ab"),
    ("<<$x := .Series>><<$x>>", "http_requests_total"),
    ('<<$x := "a">><<$x = "b">><<$x>>', "b"),
    ("<<(index .GroupBySlice 0)>>", "pod"),
    ('<<slice .Series 0 4>>', "http"),
    ("<<and .Series .GroupBy>> <<or \"\" .Series>>", "pod,container http_requests_total"),
    ("<<lt 1 2>> <<ge 2 2>> <<gt \"b\" \"a\">>", "true true true"),
    ("<<`raw \\n`>> <<\"esc\\tq\">>", "raw \\n esc\tq"),
    ("<<1.5>> <<1e6>> <<0x1F>> <<-3>>", "1.5 1e+06 31 -3"),
    ("<<html \"<a&b>\">> <<urlquery \"a b&c\">>", "&lt;a&amp;b&gt; a+b%26c"),
    ("sum by (<<.GroupBy>>) (\n  x{<<.LabelMatchers>>}\n)\n",
     'sum by (pod,container) (\n  x{namespace="shop",pod=~"a|b"}\n)\n'),
])
def test_renders_like_go(source: str, output: str | None) -> None:
    if output is None:
        with pytest.raises(TemplateExecutionError):
            render(source)
        return
    assert render(source) == output


def test_resource_label_template_reads_group_and_resource() -> None:
    data = GoStruct("schema.GroupResource", {"Group": "apps", "Resource": "deployment"})
    source = "kube_<<.Group>>_<<.Resource>>"
    assert parse_template(source, name="resource-label").render(data) == "kube_apps_deployment"


@pytest.mark.parametrize(("source", "message"), [
    ('<<join .GroupBySlice ",">>', 'template: metrics-query:1: function "join" not defined'),
    ("<<if .Series>>x", "template: metrics-query:1: unexpected EOF"),
    ("<<end>>", "template: metrics-query:1: unexpected {{end}}"),
    ("<<else>>", "template: metrics-query:1: unexpected {{else}}"),
    ("<<.Series", "template: metrics-query:1: unclosed action"),
    ('<<"abc>>', "template: metrics-query:1: unterminated quoted string"),
    ("<<$y>>", 'template: metrics-query:1: undefined variable "$y"'),
    ("<<>>", "template: metrics-query:1: missing value for command"),
    ("a\nb\n<<.X | 3>>", "template: metrics-query:3: non executable command in pipeline stage 2"),
    ("<<define \"x\">>a<<end>>", "template: metrics-query:1: {{define}} is not supported by "
                                 "metricscale"),
    ("<<call .X>>", 'template: metrics-query:1: function "call" is not supported by metricscale'),
    ("<<(.Series>>", "template: metrics-query:1: unclosed left paren"),
])
def test_parse_errors_are_reported_when_loading(source: str, message: str) -> None:
    with pytest.raises(TemplateSyntaxError) as raised:
        parse_template(source, name="metrics-query")
    assert str(raised.value) == message


@pytest.mark.parametrize(("source", "message"), [
    ("<<.LabelMatchersByName>>",
     'template: metrics-query:1:2: executing "metrics-query" at <.LabelMatchersByName>: '
     "can't evaluate field LabelMatchersByName in type naming.queryTemplateArgs"),
    ("x <<.Series.Foo>>",
     'template: metrics-query:1:4: executing "metrics-query" at <.Series.Foo>: '
     "can't evaluate field Foo in type string"),
    ("<<index .GroupBySlice 5>>",
     'template: metrics-query:1:2: executing "metrics-query" at <index .GroupBySlice 5>: '
     "error calling index: index out of range: 5"),
    ("<<len 3>>",
     'template: metrics-query:1:2: executing "metrics-query" at <len 3>: '
     "error calling len: len of type int"),
    ('<<eq .Series 1>>',
     'template: metrics-query:1:2: executing "metrics-query" at <eq .Series 1>: '
     "error calling eq: incompatible types for comparison"),
    ("<<.Series 1>>",
     'template: metrics-query:1:2: executing "metrics-query" at <.Series>: '
     "Series has arguments but cannot be invoked as function"),
    ("<<if .LabelValuesByName.x>>a<<end>>",
     'template: metrics-query:1:5: executing "metrics-query" at <.LabelValuesByName.x>: '
     "if/with can't use <no value>"),
])
def test_execution_errors_are_reported_per_render(source: str, message: str) -> None:
    template = parse_template(source, name="metrics-query")
    with pytest.raises(TemplateExecutionError) as raised:
        template.render(ARGS)
    assert str(raised.value) == message


@pytest.mark.parametrize(("value", "printed"), [
    (["a", "b"], "[a b]"),
    ([], "[]"),
    ({"b": "2", "a": "1"}, "map[a:1 b:2]"),
    ({}, "map[]"),
    (True, "true"),
    (None, "<nil>"),
    (0.1, "0.1"),
    (123456.0, "123456"),
    (1234567.0, "1.234567e+06"),
    (1e-5, "1e-05"),
    (GoStruct("t", {"A": "x", "B": 1}), "{x 1}"),
])
def test_values_print_as_gos_fmt(value: Any, printed: str) -> None:
    assert go_sprint_value(value) == printed
