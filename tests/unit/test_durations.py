"""Go durations (metricscale.core.durations): what each program's duration parser builds on."""

from __future__ import annotations

from decimal import Decimal

import pytest

from metricscale.core.durations import DurationError, parse_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("1.s", Decimal(1)), (".5s", Decimal("0.5")), ("+0", Decimal(0)), ("-0", Decimal(0)),
    ("1h1m1s1ms1us1ns", Decimal("3661.001001001")), ("2µs", Decimal("0.000002")),
])
def test_go_duration_corners_parse_as_go_parses_them(text: str, seconds: Decimal) -> None:
    assert parse_duration(text) == seconds


def test_an_unknown_unit_is_named_in_the_error() -> None:
    with pytest.raises(DurationError) as caught:
        parse_duration("3d")
    assert caught.value.unknown_unit == "d"
    assert str(caught.value) == "unknown unit 'd' in duration '3d'"


@pytest.mark.parametrize("text", ["", "+", "-", "1", ".", "1.5.5s", " 1s"])
def test_malformed_durations_raise_duration_error(text: str) -> None:
    with pytest.raises(DurationError) as caught:
        parse_duration(text)
    assert caught.value.unknown_unit is None
    assert str(caught.value) == f"invalid duration {text!r}"
