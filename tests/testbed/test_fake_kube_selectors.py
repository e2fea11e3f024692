"""Fake kube-apiserver: label/field selector grammar and string forms (apimachinery rules)."""

from __future__ import annotations

import pytest

from testbed.fakes.kube_selectors import (
    SelectorError,
    format_label_selector,
    label_selector_from_object,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)

LABELS = {"app": "web", "tier": "front", "n": "5", "empty": ""}


@pytest.mark.parametrize(("selector", "matches"), [
    ("", True),
    ("app=web", True),
    ("app==web", True),
    ("app!=web", False),
    ("missing!=x", True),
    ("app in (web,db)", True),
    ("app in (db)", False),
    ("app notin (db)", True),
    ("missing notin (x)", True),
    ("app", True),
    ("!app", False),
    ("!missing", True),
    ("app=web, tier=front", True),
    ("app=web,tier=back", False),
    ("n>4", True),
    ("n<4", False),
    ("missing>1", False),
    ("empty=", True),
    ("empty in (,x)", True),
    ("in=x", False),  # keywords are identifiers in key position
])
def test_label_selector_matching(selector: str, matches: bool) -> None:
    assert labels_match(parse_label_selector(selector), LABELS) is matches


@pytest.mark.parametrize("selector", [
    "===", "app=(web)", "app in web", "app in (a", "a b", "!a=b", ",a", "a,", "x/=y",
    "n>a", "app=" + "v" * 64, "-bad=x",
])
def test_invalid_label_selectors_are_rejected(selector: str) -> None:
    with pytest.raises(SelectorError):
        parse_label_selector(selector)


@pytest.mark.parametrize(("selector", "formatted"), [
    ("tier=front,app=web", "app=web,tier=front"),
    ("app in (web, db)", "app in (db,web)"),
    ("!b,a", "a,!b"),
    ("x notin (z,y)", "x notin (y,z)"),
])
def test_label_selectors_print_as_go_does(selector: str, formatted: str) -> None:
    assert format_label_selector(parse_label_selector(selector)) == formatted


def test_label_selector_objects_convert_like_label_selector_as_selector() -> None:
    converted = label_selector_from_object({
        "matchLabels": {"b": "1", "a": "2"},
        "matchExpressions": [{"key": "c", "operator": "Exists"},
                             {"key": "a", "operator": "NotIn", "values": ["3"]}]})
    assert converted is not None
    assert format_label_selector(converted) == "a=2,a notin (3),b=1,c"
    assert label_selector_from_object(None) is None
    assert label_selector_from_object({}) == ()
    with pytest.raises(SelectorError):
        label_selector_from_object({"matchExpressions": [{"key": "a", "operator": "Like"}]})


@pytest.mark.parametrize(("selector", "parsed"), [
    ("metadata.name=a", [("metadata.name", "=", "a")]),
    ("metadata.name==a,status.phase!=Running", [("metadata.name", "==", "a"),
                                                ("status.phase", "!=", "Running")]),
    (r"metadata.name=a\,b", [("metadata.name", "=", "a,b")]),
    ("metadata.name=", [("metadata.name", "=", "")]),
])
def test_field_selector_parsing(selector: str, parsed: list[tuple[str, str, str]]) -> None:
    assert [(r.field, r.operator, r.value) for r in parse_field_selector(selector)] == parsed


@pytest.mark.parametrize("selector", ["metadata.name", r"metadata.name=a\x"])
def test_invalid_field_selectors_are_rejected(selector: str) -> None:
    with pytest.raises(SelectorError):
        parse_field_selector(selector)
