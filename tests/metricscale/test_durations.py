"""Durations (metricscale.core.durations): Go's grammar, Prometheus', certificate lifetimes."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from metricscale.core.durations import (
    DurationError,
    format_duration,
    parse_go_duration,
    parse_go_timedelta,
    parse_lifetime,
    parse_prometheus_duration,
    parse_range_duration,
)


@pytest.mark.parametrize(("text", "seconds"), [
    ("1.s", Decimal(1)), (".5s", Decimal("0.5")), ("+0", Decimal(0)), ("-0", Decimal(0)),
    ("1h1m1s1ms1us1ns", Decimal("3661.001001001")), ("2µs", Decimal("0.000002")),
])
def test_go_duration_corners_parse_as_go_parses_them(text: str, seconds: Decimal) -> None:
    assert parse_go_duration(text) == seconds


def test_an_unknown_unit_is_named_in_the_error() -> None:
    with pytest.raises(DurationError) as caught:
        parse_go_duration("3d")
    assert caught.value.unknown_unit == "d"
    assert str(caught.value) == "unknown unit 'd' in duration '3d'"


@pytest.mark.parametrize("text", ["", "+", "-", "1", ".", "1.5.5s", " 1s"])
def test_malformed_durations_raise_duration_error(text: str) -> None:
    with pytest.raises(DurationError) as caught:
        parse_go_duration(text)
    assert caught.value.unknown_unit is None
    assert str(caught.value) == f"invalid duration {text!r}"


def test_a_go_duration_in_an_object_field_fails_in_go_s_words() -> None:
    with pytest.raises(DurationError) as caught:
        parse_go_timedelta(" 5x ")
    assert caught.value.go_message == "time: invalid duration ' 5x '"


@pytest.mark.parametrize("text", ["1w", "1h1d", "1.5h", "500ms", "0"])
def test_replay_ranges_take_whole_days_to_seconds_in_order(text: str) -> None:
    with pytest.raises(DurationError):
        parse_range_duration(text)


def test_lifetimes_take_weeks_in_any_order_and_case() -> None:
    assert parse_lifetime("2D1W") == timedelta(days=9)
    assert parse_range_duration("1d12h") == timedelta(hours=36)


@pytest.mark.parametrize(("value", "text"), [
    (timedelta(0), "0s"), (timedelta(seconds=90), "1m30s"), (timedelta(hours=1), "1h0m0s"),
    (timedelta(milliseconds=1500), "1.5s"), (timedelta(milliseconds=500), "500ms"),
    (timedelta(microseconds=1500), "1.5ms"), (timedelta(microseconds=1), "1µs"),
    (timedelta(seconds=-5), "-5s"), (timedelta(microseconds=9_223_372_036_854_775),
                                     "2562047h47m16.854775s"),
])
def test_durations_print_as_go_prints_them(value: timedelta, text: str) -> None:
    assert format_duration(value) == text


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty duration string"), ("1.5m", 'not a valid duration string: "1.5m"')])
def test_prometheus_durations_fail_in_prometheus_words(text: str, message: str) -> None:
    with pytest.raises(DurationError, match=message):
        parse_prometheus_duration(text)
