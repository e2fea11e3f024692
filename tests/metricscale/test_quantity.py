"""Quantities: the canonical forms of contract §10.1, MilliValue rounding, and round trips."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metricscale.core.quantity import (
    Format,
    QuantityError,
    format_milli,
    format_quantity,
    milli_value,
    parse_quantity,
)

CONTRACT_TABLE = [
    ("0.5", "500m"), ("1.5", "1500m"), ("0.1", "100m"), ("0.066", "66m"), ("0.0015", "1500u"),
    ("1", "1"), ("10", "10"), ("100", "100"), ("1500", "1500"), ("1001", "1001"), ("2000", "2k"),
    ("1234.567", "1234567m"), ("1200000", "1200k"), ("3000000", "3M"), ("-0.25", "-250m"),
    ("1048576", "1048576"), ("0", "0"), ("1e-12", "1n"),
]


@pytest.mark.parametrize(("value", "canonical"), CONTRACT_TABLE)
def test_decimal_si_canonical_form_matches_go(value: str, canonical: str) -> None:
    assert format_quantity(Decimal(value)) == canonical


@pytest.mark.parametrize(("value", "canonical"), [
    ("1048576", "1Mi"), ("1536", "1536"), ("1572864", "1536Ki"), ("512", "512"),
    ("1.5", "1500m"), ("-2048", "-2Ki"),
])
def test_binary_si_canonical_form_matches_go(value: str, canonical: str) -> None:
    assert format_quantity(Decimal(value), Format.BINARY_SI) == canonical


@pytest.mark.parametrize(("text", "milli"), [
    ("1500u", 2), ("1n", 1), ("2", 2000), ("1Gi", 1073741824000), ("1e3", 1000000),
    (".5", 500), ("100m", 100), ("-1500u", -2), ("1k", 1000000), ("+3", 3000), ("5.", 5000),
])
def test_milli_value_rounds_up_like_go(text: str, milli: int) -> None:
    assert milli_value(text) == milli


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "1Ki2", "--1", "1 m", "0x10", "NaN", "Inf"])
def test_invalid_quantities_are_rejected_with_the_text(text: str) -> None:
    with pytest.raises(QuantityError, match="quantities must match"):
        parse_quantity(text)


def test_format_milli_is_new_milli_quantity() -> None:
    assert format_milli(1500) == "1500m"
    assert format_milli(2000) == "2"
    assert format_milli(1073741824000, Format.BINARY_SI) == "1Gi"


def test_values_beyond_int64_are_clamped() -> None:
    assert format_quantity(Decimal(2) ** 70) == format_quantity(Decimal(2**63 - 1))


@given(st.integers(min_value=-(10**15), max_value=10**15), st.integers(min_value=-9, max_value=3))
def test_decimal_si_round_trips_exactly(mantissa: int, exponent: int) -> None:
    value = Decimal(mantissa).scaleb(exponent)
    assert parse_quantity(format_quantity(value)) == value


@given(st.integers(min_value=0, max_value=2**50))
def test_binary_si_round_trips_exactly(value: int) -> None:
    assert parse_quantity(format_quantity(value, Format.BINARY_SI)) == value
