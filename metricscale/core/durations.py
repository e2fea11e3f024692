"""Go's `time.ParseDuration`, exactly, in Decimal seconds (shared by both programs' flags)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["GO_DURATION_HINT", "DurationError", "flag_message", "parse_duration"]

# What a flag's error adds, so a user who typed `5x` or `30` sees the format expected.
GO_DURATION_HINT = "use Go durations such as 15s or 1m30s"

_DURATION_UNITS: dict[str, Decimal] = {
    "ns": Decimal("1e-9"), "us": Decimal("1e-6"), "µs": Decimal("1e-6"), "μs": Decimal("1e-6"),
    "ms": Decimal("1e-3"), "s": Decimal(1), "m": Decimal(60), "h": Decimal(3600),
}
_DURATION_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)([a-zµμ]+)")


class DurationError(ValueError):
    """Text that is not a Go duration; `unknown_unit` is set when only a unit is wrong."""

    def __init__(self, text: str, *, unknown_unit: str | None = None) -> None:
        self.text = text
        self.unknown_unit = unknown_unit
        if unknown_unit is None:
            super().__init__(f"invalid duration {text!r}")
        else:
            super().__init__(f"unknown unit {unknown_unit!r} in duration {text!r}")


def flag_message(text: str) -> str:
    """The error a duration flag shows: `invalid duration '5x': use Go durations such as 15s`."""
    return f"invalid duration {text!r}: {GO_DURATION_HINT}"


def parse_duration(text: str) -> Decimal:
    """Go's `time.ParseDuration` in seconds: `90s`, `1m30s`, `1.5h`, `500ms`, `0`."""
    original = text
    sign = Decimal(1)
    if text and text[0] in "+-":
        sign = Decimal(-1) if text[0] == "-" else Decimal(1)
        text = text[1:]
    if text == "0":
        return Decimal(0)
    if not text:
        raise DurationError(original)
    total = Decimal(0)
    position = 0
    while position < len(text):
        match = _DURATION_PART.match(text, position)
        if match is None or match.group(1) in ("", "."):
            raise DurationError(original)
        unit = _DURATION_UNITS.get(match.group(2))
        if unit is None:
            raise DurationError(original, unknown_unit=match.group(2))
        try:
            total += Decimal(match.group(1)) * unit
        except InvalidOperation:
            raise DurationError(original) from None
        position = match.end()
    return sign * total
