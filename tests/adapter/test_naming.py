"""Series naming: RE2 regexes in Python, `regexp.ExpandString`, filters, upstream's defaults."""

from __future__ import annotations

import re

import pytest

from adapter.rules.config import parse_config
from adapter.rules.defaults import CONFIG_GEN_DEFAULTS_YAML
from adapter.rules.naming import (
    NameMatcher,
    NamingError,
    RegexError,
    compile_re2,
    expand_go_template,
    make_series_filter,
    passes_filters,
)


def names_by_rule(series_name: str) -> dict[int, str]:
    """Which of the config-gen rules take a series, and the API name each gives it."""
    config = parse_config(CONFIG_GEN_DEFAULTS_YAML)
    taken = {}
    for number, rule in enumerate(config.rules, start=1):
        if passes_filters(rule.filters, series_name):
            name = rule.name.api_name(series_name)
            assert name is not None
            taken[number] = name
    return taken


# prometheus-adapter.md §3 "How names come out of it" (the cAdvisor rules only ever see
# container_* series and the general rules never do, as their series queries ensure).
@pytest.mark.parametrize(("series", "rule", "api_name"), [
    ("container_cpu_usage_seconds_total", 1, "cpu_usage"),
    ("container_network_receive_bytes_total", 2, "network_receive_bytes"),
    ("container_memory_working_set_bytes", 3, "memory_working_set_bytes"),
    ("http_requests_total", 5, "http_requests"),
    ("process_cpu_seconds_total", 6, "process_cpu"),
    ("queue_length", 4, "queue_length"),
])
def test_config_gen_defaults_name_series_as_documented(series: str, rule: int,
                                                       api_name: str) -> None:
    cadvisor = series.startswith("container_")
    taken = {n: name for n, name in names_by_rule(series).items() if (n <= 3) == cadvisor}
    assert taken == {rule: api_name}


def test_isnot_filter_is_unanchored_so_seconds_total_anywhere_is_rejected() -> None:
    assert 5 not in names_by_rule("foo_seconds_total_bar_total")
    assert names_by_rule("foo_seconds_total_bar_total").get(6) is None


def test_dollar_one_per_second_names_a_group_that_does_not_exist() -> None:
    quirk = NameMatcher.from_config(matches="^(.*)_total", as_="$1_per_second", series_query="q")
    fixed = NameMatcher.from_config(matches="^(.*)_total", as_="${1}_per_second",
                                    series_query="q")
    assert quirk.api_name("http_requests_total") == ""
    assert fixed.api_name("http_requests_total") == "http_requests_per_second"


@pytest.mark.parametrize(("template", "expected"), [
    ("$0", "foo_bar"),
    ("$1", "foo"),
    ("${1}", "foo"),
    ("${1}s", "foos"),
    ("$1s", ""),
    ("$first-$second", "foo-bar"),
    ("${second}_${first}", "bar_foo"),
    ("$$1", "$1"),
    ("$", "$"),
    ("$-", "$-"),
    ("${1", "${1"),
    ("$9", ""),
    ("$01", ""),
    ("${}", "${}"),
    ("no dollars", "no dollars"),
])
def test_expand_follows_go_expand_string(template: str, expected: str) -> None:
    regex = compile_re2("(?P<first>foo)_(?P<second>bar)")
    match = regex.search("xfoo_bary")
    assert match is not None
    assert expand_go_template(template, match) == expected


def test_text_outside_the_first_match_is_dropped() -> None:
    matcher = NameMatcher.from_config(matches="b+", as_="", series_query="q")
    assert matcher.api_name("abbbcbb") == "bbb"


@pytest.mark.parametrize(("matches", "as_", "expected_as"), [
    ("", "", "$0"),
    ("^foo$", "", "$0"),
    ("^(.*)_total$", "", "$1"),
    ("^(?:x)(.*)$", "", "$1"),
    ("^(a)(b)$", "$2", "$2"),
])
def test_default_as_depends_on_capture_groups(matches: str, as_: str, expected_as: str) -> None:
    assert NameMatcher.from_config(matches=matches, as_=as_,
                                   series_query="q").as_template == expected_as


def test_two_groups_without_as_is_refused_with_upstream_words() -> None:
    with pytest.raises(NamingError) as raised:
        NameMatcher.from_config(matches="^(a)(b)$", as_="", series_query="foo{}")
    assert str(raised.value) == ("must specify an 'as' value for name matcher \"^(a)(b)$\" "
                                 "associated with series query \"foo{}\"")


@pytest.mark.parametrize(("is_", "is_not", "message"), [
    ("a", "b", 'cannot have both an `is` ("a") and `isNot` ("b") expression in a single filter'),
    ("", "", "must have either an `is` or `isNot` expression in a filter"),
])
def test_filter_needs_exactly_one_of_is_and_isnot(is_: str, is_not: str, message: str) -> None:
    with pytest.raises(NamingError) as raised:
        make_series_filter(is_=is_, is_not=is_not)
    assert str(raised.value) == message


# --- RE2 in Python -----------------------------------------------------------------------------


@pytest.mark.parametrize(("pattern", "text", "matched"), [
    ("^container_(.*)$", "container_x\n", None),  # RE2's $ is the end of text only
    ("a(?i)b|c", "C", "C"),  # Go scopes (?i) to the rest of the group, alternatives included
    ("a(?i)b|c", "aB", "aB"),
    ("(?i)AB", "ab", "ab"),
    ("(?<n>x)", "x", "x"),
    ("[[:alpha:]]+", "ab1", "ab"),
    ("\\d+", "٣12", "12"),  # ASCII digits only, as RE2
    ("a\\sb", "a\vb", None),  # RE2's \s has no \v
    ("\\x41\\x{42}", "AB", "AB"),
    ("\\Qa.b\\E", "a.b", "a.b"),
    ("\\Qa.b\\E", "axb", None),
    ("a{,2}", "a{,2}", "a{,2}"),  # not a repeat in RE2: literal text
    ("a\\z", "a", "a"),
    ("[a-]", "-", "-"),
    ("[]a]", "]", "]"),
])
def test_re2_patterns_behave_as_in_go(pattern: str, text: str, matched: str | None) -> None:
    found = compile_re2(pattern).search(text)
    assert (found.group(0) if found else None) == matched


@pytest.mark.parametrize(("pattern", "message"), [
    ("(?=a)", "error parsing regexp: invalid or unsupported Perl syntax: `(?=`"),
    ("(?<=a)", "error parsing regexp: invalid or unsupported Perl syntax: `(?<`"),
    ("(?P=x)", "error parsing regexp: invalid or unsupported Perl syntax: `(?P`"),
    ("(a)\\1", "error parsing regexp: invalid escape sequence: `\\1`"),
    ("a*+", "error parsing regexp: invalid nested repetition operator: `*+`"),
    ("a++", "error parsing regexp: invalid nested repetition operator: `++`"),
    ("a{2}+", "error parsing regexp: invalid nested repetition operator: `}+`"),
    ("(?x)a", "error parsing regexp: invalid or unsupported Perl syntax: `(?x)`"),
    ("a\\Z", "error parsing regexp: invalid escape sequence: `\\Z`"),
    ("a{1001}", "error parsing regexp: invalid repeat count: `{1001}`"),
    ("(a", "error parsing regexp: missing closing ): `(a`"),
    ("a)", "error parsing regexp: unexpected ): `a)`"),
    ("a\\", "error parsing regexp: trailing backslash at end of expression: ``"),
])
def test_syntax_only_python_knows_is_refused_with_gos_words(pattern: str, message: str) -> None:
    with pytest.raises(RegexError) as raised:
        compile_re2(pattern)
    assert str(raised.value) == message


@pytest.mark.parametrize("pattern", ["\\pL", "\\p{Greek}", "(?U)a+", "[[:^alpha:]]"])
def test_rare_re2_syntax_without_a_python_equivalent_is_refused_loudly(pattern: str) -> None:
    with pytest.raises(RegexError, match="not supported by metricscale"):
        compile_re2(pattern)


def test_translation_is_compiled_ascii() -> None:
    assert compile_re2("x").flags & re.ASCII
