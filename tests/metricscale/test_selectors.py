"""Label selectors: apimachinery's grammar, error texts, matching and LabelSelector JSON."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metricscale.core.selectors import (
    Operator,
    Requirement,
    Selector,
    SelectorError,
    label_selector_json,
    new_requirement,
    parse_selector,
    quote_go_string,
    selector_from_label_selector,
    selector_from_set,
)

# --- parsing and canonical String() --------------------------------------------------------------


@pytest.mark.parametrize(("text", "canonical"), [
    ("", ""),
    ("a=b", "a=b"),
    ("a==b", "a==b"),
    ("a!=b", "a!=b"),
    ("a", "a"),
    ("!a", "!a"),
    ("a in (c,b)", "a in (b,c)"),
    ("a notin (c, b, c)", "a notin (b,c)"),
    ("x>5", "x>5"),
    ("x<05", "x<05"),
    ("b=1,a=2", "a=2,b=1"),
    ("  tier in (cache,web) , app = web ", "app=web,tier in (cache,web)"),
    ("a=", "a="),
    ("a in ()", "a in ()"),
    ("x in (foo,,baz),y,z notin ()", "x in (,baz,foo),y,z notin ()"),
    ("in in (in)", "in in (in)"),
    ("app.kubernetes.io/name=web", "app.kubernetes.io/name=web"),
    ("b=2,a,b!=3", "a,b=2,b!=3"),
])
def test_parse_gives_gos_canonical_string(text: str, canonical: str) -> None:
    assert str(parse_selector(text)) == canonical


def test_requirements_are_sorted_by_key_keeping_order_of_equal_keys() -> None:
    selector = parse_selector("z=1,a!=2,a=3")
    assert [(r.key, r.operator) for r in selector.requirements] == [
        ("a", Operator.NOT_EQUALS), ("a", Operator.EQUALS), ("z", Operator.EQUALS)]


@pytest.mark.parametrize(("text", "message"), [
    ("a=b=c", "found '=', expected: ',' or 'end of string'"),
    ("a b", "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"),
    ("=a", "found '=', expected: !, identifier, or 'end of string'"),
    ("a,", "found '', expected: identifier after ','"),
    ("a in b", "unable to parse requirement: found 'b' expected: '('"),
    ("a in (b", "unable to parse requirement: found '', expected: ',' or ')'"),
    ("a in (b c)", "unable to parse requirement: found 'c', expected: ',' or ')'"),
    ("a (b)", "unable to parse requirement: found '(', expected: in, notin, =, ==, !=, gt, lt"),
    ("x>abc", "unable to parse requirement: values[0]: Invalid value: \"abc\": for 'Gt', 'Lt' "
              "operators, the value must be an integer"),
    ("a=b c", "found 'c', expected: ',' or 'end of string'"),
])
def test_bad_selectors_fail_with_upstream_words(text: str, message: str) -> None:
    with pytest.raises(SelectorError) as raised:
        parse_selector(text)
    assert str(raised.value) == message


def test_bad_key_is_reported_on_the_nil_path_like_go() -> None:
    with pytest.raises(SelectorError) as raised:
        parse_selector("-bad=x")
    assert str(raised.value).startswith(
        'unable to parse requirement: <nil>: Invalid value: "-bad": name part must consist of '
        "alphanumeric characters")


def test_bad_value_names_value_index_and_key() -> None:
    with pytest.raises(SelectorError) as raised:
        parse_selector("app=-web")
    assert str(raised.value).startswith(
        'unable to parse requirement: values[0][app]: Invalid value: "-web": a valid label must '
        "be an empty string or consist of alphanumeric characters")


def test_several_problems_are_aggregated_in_brackets() -> None:
    with pytest.raises(SelectorError) as raised:
        parse_selector("x>-abc")
    message = str(raised.value)
    assert message.startswith("unable to parse requirement: [values[0]: Invalid value: \"-abc\"")
    assert "values[0][x]: Invalid value" in message and message.endswith("]")


@pytest.mark.parametrize("key", ["a" * 64, "Example.com/a", "a/b/c", "/a", "a/"])
def test_invalid_keys_are_refused(key: str) -> None:
    with pytest.raises(SelectorError):
        parse_selector(f"{key}=x")


def test_value_longer_than_63_bytes_is_refused() -> None:
    with pytest.raises(SelectorError, match="must be no more than 63 bytes"):
        parse_selector("a=" + "v" * 64)


# --- matching ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "labels", "expected"), [
    ("", {}, True),
    ("a=b", {"a": "b"}, True),
    ("a=b", {}, False),
    ("a!=b", {}, True),
    ("a!=b", {"a": "b"}, False),
    ("a in (b,c)", {"a": "c"}, True),
    ("a notin (b,c)", {}, True),
    ("a notin (b,c)", {"a": "b"}, False),
    ("a", {"a": ""}, True),
    ("!a", {"a": ""}, False),
    ("x>5", {"x": "6"}, True),
    ("x>5", {"x": "5"}, False),
    ("x<5", {"x": "-7"}, True),
    ("x>5", {"x": "six"}, False),
    ("x>5", {}, False),
    ("a=b,c", {"a": "b"}, False),
])
def test_matches(text: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_selector(text).matches(labels) is expected


def test_nothing_selector_matches_nothing_and_everything_matches_all() -> None:
    assert not Selector.match_nothing().matches({})
    assert Selector.everything().matches({"a": "b"})
    assert Selector.everything().is_empty() and not Selector.match_nothing().is_empty()


# --- LabelSelector JSON --------------------------------------------------------------------------


def test_label_selector_as_selector_nil_selects_nothing_and_empty_selects_everything() -> None:
    assert selector_from_label_selector(None).nothing
    assert selector_from_label_selector({}).is_empty()


def test_label_selector_as_selector_combines_labels_and_expressions_sorted() -> None:
    selector = selector_from_label_selector({
        "matchLabels": {"tier": "web", "app": "shop"},
        "matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["dev", "ci"]},
                             {"key": "canary", "operator": "DoesNotExist"}],
    })
    assert str(selector) == "app=shop,!canary,env notin (ci,dev),tier=web"


def test_label_selector_with_bad_operator_is_refused_with_go_text() -> None:
    with pytest.raises(SelectorError, match='"Gt" is not a valid label selector operator'):
        selector_from_label_selector({"matchExpressions": [{"key": "a", "operator": "Gt",
                                                            "values": ["1"]}]})


def test_label_selector_requirement_errors_name_key_and_values() -> None:
    with pytest.raises(SelectorError, match=r"^values: Invalid value: \[\]string\{\}: for 'in'"):
        selector_from_label_selector({"matchExpressions": [{"key": "a", "operator": "In"}]})
    with pytest.raises(SelectorError, match=r'^key: Invalid value: "a b"'):
        selector_from_label_selector({"matchLabels": {"a b": "c"}})


@pytest.mark.parametrize(("text", "expected"), [
    ("verb=GET", {"matchLabels": {"verb": "GET"}}),
    ("verb==GET", {"matchLabels": {"verb": "GET"}}),
    ("verb in (POST,GET)", {"matchExpressions": [{"key": "verb", "operator": "In",
                                                  "values": ["GET", "POST"]}]}),
    ("verb", {"matchExpressions": [{"key": "verb", "operator": "Exists"}]}),
    ("!verb", {"matchExpressions": [{"key": "verb", "operator": "DoesNotExist"}]}),
    ("verb!=GET", {"matchExpressions": [{"key": "verb", "operator": "NotIn",
                                         "values": ["GET"]}]}),
    ("a=1,b notin (x)", {"matchLabels": {"a": "1"},
                         "matchExpressions": [{"key": "b", "operator": "NotIn",
                                               "values": ["x"]}]}),
    ("", {}),
])
def test_selector_echo_as_label_selector_json(text: str, expected: dict[str, object]) -> None:
    assert label_selector_json(parse_selector(text)) == expected


def test_gt_has_no_label_selector_form() -> None:
    with pytest.raises(SelectorError, match="isn't supported in label selectors"):
        label_selector_json(parse_selector("x>1"))


def test_selector_from_set_is_sorted_equality() -> None:
    assert str(selector_from_set({"b": "2", "a": "1"})) == "a=1,b=2"


def test_new_requirement_refuses_wrong_value_counts() -> None:
    with pytest.raises(SelectorError, match="exact-match compatibility requires one single value"):
        new_requirement("a", Operator.EQUALS, ["x", "y"])
    with pytest.raises(SelectorError, match="values set must be empty"):
        new_requirement("a", Operator.EXISTS, ["x"])


# --- Go quoting -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "quoted"), [
    ("plain", '"plain"'),
    ('a"b\\c', '"a\\"b\\\\c"'),
    ("tab\tnl\nbell\a", '"tab\\tnl\\nbell\\a"'),
    ("\x00\x7f", '"\\x00\\x7f"'),
    ("é€", '"é€"'),
    ("\u00a0", '"\\u00a0"'),
    ("\U000e0001", '"\\U000e0001"'),
])
def test_quote_go_string_matches_strconv_quote(text: str, quoted: str) -> None:
    assert quote_go_string(text) == quoted


@given(st.one_of(st.text(), st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7F))))
def test_quote_go_string_fast_path_writes_what_the_escaping_loop_writes(text: str) -> None:
    # A trailing NUL sends the whole text through the per-character loop; without it, plain
    # printable ASCII takes the verbatim fast path. Both must quote `text` identically.
    assert quote_go_string(text) == quote_go_string(text + "\x00")[:-5] + '"'


# --- properties -----------------------------------------------------------------------------------

_NAME = st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,10}[A-Za-z0-9])?", fullmatch=True)
_PREFIX = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,6}[a-z0-9])?(\.[a-z0-9]{1,5}){0,2}", fullmatch=True)
_KEY = st.one_of(_NAME, st.builds(lambda p, n: f"{p}/{n}", _PREFIX, _NAME))
_VALUE = st.one_of(st.just(""), _NAME)


@st.composite
def _requirements(draw: st.DrawFn) -> Requirement:
    key = draw(_KEY)
    operator = draw(st.sampled_from(list(Operator)))
    if operator in (Operator.IN, Operator.NOT_IN):
        values = sorted(set(draw(st.lists(_VALUE, min_size=1, max_size=4))))
    elif operator in (Operator.EXISTS, Operator.DOES_NOT_EXIST):
        values = []
    elif operator in (Operator.GREATER_THAN, Operator.LESS_THAN):
        values = [str(draw(st.integers(min_value=0, max_value=10**12)))]
    else:
        values = [draw(_VALUE)]
    return new_requirement(key, operator, values)


@given(st.lists(_requirements(), max_size=5))
def test_parse_of_string_round_trips(requirements: list[Requirement]) -> None:
    selector = Selector.of(requirements)
    text = str(selector)
    parsed = parse_selector(text)
    assert parsed == selector
    assert str(parsed) == text


@given(st.lists(_requirements(), max_size=5),
       st.dictionaries(_KEY, _VALUE, max_size=4))
def test_matches_is_the_and_of_requirement_matches(requirements: list[Requirement],
                                                   labels: dict[str, str]) -> None:
    selector = Selector.of(requirements)
    assert selector.matches(labels) == all(r.matches(labels) for r in requirements)
