"""Kubernetes quantities: exact parsing to Decimal, `MilliValue()`, and Go's canonical formatting.

Everything here is exact (Decimal and int); no float ever takes part. The canonical forms are
the ones apimachinery's `resource.Quantity` prints, so a value we render is byte-identical to
what a Go server would send (see aggregation-contract.md section 10.1).
"""

from __future__ import annotations

import functools
import re
from decimal import ROUND_UP, Decimal, localcontext
from enum import Enum

__all__ = [
    "Format",
    "QuantityError",
    "format_milli",
    "format_quantity",
    "milli_value",
    "parse_quantity",
]


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


class Format(Enum):
    DECIMAL_SI = "DecimalSI"
    BINARY_SI = "BinarySI"
    DECIMAL_EXPONENT = "DecimalExponent"


_DECIMAL_SUFFIXES: dict[str, int] = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}
_BINARY_SUFFIXES: dict[str, int] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SUFFIX_BY_EXPONENT: dict[int, str] = {e: s for s, e in _DECIMAL_SUFFIXES.items()}
_BINARY_SUFFIX_BY_POWER: dict[int, str] = {p // 10: s for s, p in _BINARY_SUFFIXES.items()}

_QUANTITY = re.compile(
    r"^(?P<sign>[+-])?(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>[numkMGTPE]|[KMGTPE]i|[eE][+-]?[0-9]+)?$"
)

# Go keeps at most nano precision and at most 2^63-1 base units in a canonical value.
_NANO = Decimal("1e-9")
_MAX_INT64 = 2**63 - 1
_PRECISION = 80  # digits; far beyond any value a quantity can hold


def parse_quantity(text: str) -> Decimal:
    """Parse a quantity string (`"1500m"`, `"2Gi"`, `"1e3"`) into its exact value."""
    if not isinstance(text, str):
        raise QuantityError(f"quantity must be a string, not {type(text).__name__}")
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise QuantityError(f"quantities must match the regular expression "
                            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}")
    sign = -1 if match["sign"] == "-" else 1
    with localcontext() as ctx:
        ctx.prec = _PRECISION
        number = Decimal(match["number"])
        suffix = match["suffix"] or ""
        if suffix in _BINARY_SUFFIXES:
            value = number * (2 ** _BINARY_SUFFIXES[suffix])
        elif suffix in _DECIMAL_SUFFIXES:
            value = number.scaleb(_DECIMAL_SUFFIXES[suffix])
        else:
            value = number.scaleb(int(suffix[1:]))
        result: Decimal = sign * value
        return result


def milli_value(value: Decimal | str) -> int:
    """`Quantity.MilliValue()`: the value in thousandths, rounded up (away from zero)."""
    exact = parse_quantity(value) if isinstance(value, str) else value
    with localcontext() as ctx:
        ctx.prec = _PRECISION
        return int((exact * 1000).to_integral_value(rounding=ROUND_UP))


def _round_to_nano(value: Decimal) -> Decimal:
    exponent = value.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -9:
        with localcontext() as ctx:
            ctx.prec = _PRECISION
            return value.quantize(_NANO, rounding=ROUND_UP)
    return value


def _decimal_si(value: Decimal) -> str:
    if value == 0:
        return "0"
    value = _round_to_nano(value)
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    mantissa = int("".join(map(str, digits)))
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    shift = exponent % 3  # floor-mod: lower the exponent to a multiple of 3
    mantissa *= 10 ** shift
    exponent -= shift
    if exponent > 18:
        mantissa *= 10 ** (exponent - 18)
        exponent = 18
    return f"{'-' if sign else ''}{mantissa}{_SUFFIX_BY_EXPONENT[exponent]}"


def _binary_si(value: Decimal) -> str:
    # Go prints small or fractional binary quantities in decimal notation.
    if -1024 < value < 1024 or value != value.to_integral_value():
        return _decimal_si(value)
    amount = int(value)
    negative = amount < 0
    amount = abs(amount)
    power = 0
    while power < 6 and amount % 1024 == 0:
        amount //= 1024
        power += 1
    suffix = _BINARY_SUFFIX_BY_POWER.get(power, "")
    return f"{'-' if negative else ''}{amount}{suffix}"


def format_quantity(value: Decimal | int, fmt: Format = Format.DECIMAL_SI) -> str:
    """The canonical string Go prints for this exact value in the given format."""
    exact = Decimal(value)
    limit = Decimal(_MAX_INT64)
    if exact > limit or exact < -limit:
        exact = limit if exact > 0 else -limit
    if fmt is Format.BINARY_SI:
        return _binary_si(exact)
    return _decimal_si(exact)


@functools.lru_cache(maxsize=4096)
def format_milli(milli: int, fmt: Format = Format.DECIMAL_SI) -> str:
    """`resource.NewMilliQuantity(milli, fmt).String()` (memoised: a pure function that a
    decision calls for every metric, mostly with values it has seen before)."""
    return format_quantity(Decimal(milli).scaleb(-3), fmt)

