"""Durations, parsed and printed: the grammars the commands take, and Go's printing.

Each grammar is the one its users know from where the value comes from, so they differ on
purpose:

* `parse_go_duration` (and `parse_go_timedelta`, `go_duration_argument`): Go's
  `time.ParseDuration`, for the flags that kube-controller-manager, the generic API server and
  prometheus-adapter take (`--horizontal-pod-autoscaler-sync-period`,
  `--metrics-relist-interval`, `--prometheus-timeout`, `--leader-elect-*`) and for the metrics
  API's `window`. No days: Go has none.
* `parse_prometheus_duration`: Prometheus' `model.ParseDuration` (`5m`, `1d`, `1w`, `250ms`),
  for what a prometheus-adapter rule file says in Prometheus' words (a backend's `timeout`,
  `resourceRules.window`).
* `parse_range_duration`: `metricscale replay`'s ranges and steps (`--last 1d12h`): Prometheus'
  syntax in the units replay has always taken, whole days, hours, minutes and seconds.
* `parse_lifetime`: a certificate lifetime for `metricscale certs` (`30d`, `720h`, `1w2d`): a
  sum of whole weeks, days, hours, minutes and seconds, in any order and any case.

Every parser raises `DurationError` (a ValueError) with the text it was given; each command
words the error for its own flag. `format_duration` prints any duration as Go does.
"""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

from metricscale.core.selectors import quote_go_string

__all__ = [
    "GO_DURATION_HINT",
    "DurationError",
    "flag_message",
    "format_duration",
    "go_duration_argument",
    "parse_duration",
    "parse_go_duration",
    "parse_go_timedelta",
    "parse_lifetime",
    "parse_prometheus_duration",
    "parse_range_duration",
]

# What a flag's error adds, so a user who typed `5x` or `30` sees the format expected.
GO_DURATION_HINT = "use Go durations such as 15s or 1m30s"

_DURATION_UNITS: dict[str, Decimal] = {
    "ns": Decimal("1e-9"), "us": Decimal("1e-6"), "µs": Decimal("1e-6"), "μs": Decimal("1e-6"),
    "ms": Decimal("1e-3"), "s": Decimal(1), "m": Decimal(60), "h": Decimal(3600),
}
_DURATION_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)([a-zµμ]+)")
_PROMETHEUS_DURATION = re.compile(r"(?:([0-9]+)y)?(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?"
                                  r"(?:([0-9]+)m)?(?:([0-9]+)s)?(?:([0-9]+)ms)?")
_PROMETHEUS_UNITS_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
_RANGE_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_LIFETIME_PART = re.compile(r"(\d+)([wdhms])")
_LIFETIME_UNITS = {"w": "weeks", "d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


class DurationError(ValueError):
    """Text that is not a duration of its grammar; `unknown_unit` is set when only a unit is
    wrong (Go's grammar)."""

    def __init__(self, text: str, *, unknown_unit: str | None = None,
                 message: str | None = None) -> None:
        self.text = text
        self.unknown_unit = unknown_unit
        if message is not None:
            super().__init__(message)
        elif unknown_unit is None:
            super().__init__(f"invalid duration {text!r}")
        else:
            super().__init__(f"unknown unit {unknown_unit!r} in duration {text!r}")

    @property
    def go_message(self) -> str:
        """Go's words for it, as the Go programs print it in an object's field."""
        return f"time: invalid duration {self.text!r}"


def flag_message(text: str) -> str:
    """The error a duration flag shows: `invalid duration '5x': use Go durations such as 15s`."""
    return f"invalid duration {text!r}: {GO_DURATION_HINT}"


# --------------------------------------------------------------------------------------------
# Go's time.ParseDuration


def parse_go_duration(text: str) -> Decimal:
    """Go's `time.ParseDuration` in seconds, exactly: `90s`, `1m30s`, `1.5h`, `500ms`, `0`."""
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


# The name the Go grammar had when it was the only one.
parse_duration = parse_go_duration


def parse_go_timedelta(text: str) -> timedelta:
    """A Go duration (`15s`, `5m0s`, `1h30m`, `500ms`; surrounding blanks ignored) as a
    timedelta, rounded half to even to the microsecond as `timedelta(seconds=...)` rounds.

    DurationError carries `text` as given; a duration beyond timedelta's range raises
    OverflowError."""
    try:
        seconds = parse_go_duration(text.strip())
    except DurationError:
        raise DurationError(text) from None
    return timedelta(microseconds=int((seconds * 1_000_000).to_integral_value(ROUND_HALF_EVEN)))


def go_duration_argument(text: str) -> timedelta:
    """argparse `type=` for a Go duration flag: its error names the format expected."""
    try:
        return parse_go_timedelta(text)
    except DurationError:
        raise argparse.ArgumentTypeError(flag_message(text)) from None


def format_duration(value: timedelta) -> str:
    """Go's `Duration.String()`, exactly: `1h0m0s`, `1m30.5s`, `15s`, `500ms`, `1.5µs`, `0s`."""
    nanoseconds = ((value.days * 86_400 + value.seconds) * 1_000_000
                   + value.microseconds) * 1000
    if nanoseconds == 0:
        return "0s"
    sign = "-" if nanoseconds < 0 else ""
    magnitude = abs(nanoseconds)
    if magnitude < 1_000_000_000:  # below a second, in the largest unit that is at least 1
        for size, unit in ((1_000_000, "ms"), (1000, "µs"), (1, "ns")):
            if magnitude >= size:
                return f"{sign}{_decimal(magnitude, size)}{unit}"
    hours, rest = divmod(magnitude, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    seconds = f"{_decimal(rest, 1_000_000_000)}s"
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{sign}{minutes}m{seconds}"
    return f"{sign}{seconds}"


def _decimal(amount: int, unit: int) -> str:
    """`amount / unit` written out exactly, without trailing zeros (`1.5`, `16.854775807`)."""
    whole, fraction = divmod(amount, unit)
    if not fraction:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{fraction:0{digits}d}".rstrip("0")


# --------------------------------------------------------------------------------------------
# Prometheus' duration syntax, and certificate lifetimes


def parse_prometheus_duration(text: str) -> int:
    """Prometheus' `model.ParseDuration` (`1m30s`, `5m`, `1d`; no decimals) in milliseconds,
    with its error messages."""
    if text == "0":
        return 0
    if not text:
        raise DurationError(text, message="empty duration string")
    match = _PROMETHEUS_DURATION.fullmatch(text)
    if match is None or not any(match.groups()):
        raise DurationError(text, message=f"not a valid duration string: {quote_go_string(text)}")
    return sum(int(value) * unit for value, unit in zip(match.groups(), _PROMETHEUS_UNITS_MS,
                                                        strict=True) if value)


def parse_range_duration(text: str) -> timedelta:
    """A replay range or step (`15s`, `5m`, `24h`, `1d12h`): Prometheus' syntax in whole days,
    hours, minutes and seconds, in that order (surrounding blanks ignored).

    DurationError carries `text` as given; a duration beyond timedelta's range raises
    OverflowError."""
    match = _RANGE_DURATION.fullmatch(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise DurationError(text)
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


def parse_lifetime(text: str) -> timedelta:
    """A certificate lifetime: `30d`, `720h`, `1w2d`, `90m`, `3600s` (whole numbers with units
    w/d/h/m/s, in any order and any case; surrounding blanks ignored)."""
    compact = text.strip().lower()
    if not compact or _LIFETIME_PART.sub("", compact):
        raise DurationError(text)
    total = timedelta()
    for amount, unit in _LIFETIME_PART.findall(compact):
        total += timedelta(**{_LIFETIME_UNITS[unit]: int(amount)})
    return total
