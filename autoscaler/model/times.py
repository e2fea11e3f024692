"""Times on the wire: RFC 3339, Go's zero time included (durations: metricscale.core.durations)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from autoscaler.model.fields import (
    ModelError,
    join_path,
    kind_name,
)

__all__ = [
    "GO_ZERO_TIME",
    "format_time",
    "format_time_precise",
    "parse_time",
    "read_optional_time",
]


# Go's zero time.Time: a real instant (year 1), not "absent".
GO_ZERO_TIME = datetime(1, 1, 1, tzinfo=UTC)
_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)


def parse_time(raw: Any, path: str) -> datetime:
    """An RFC 3339 time (`2026-11-21T10:00:00Z`, fractions and offsets allowed) in UTC."""
    if not isinstance(raw, str):
        raise ModelError(path, f"must be an RFC 3339 time string, not {kind_name(raw)}")
    match = _RFC3339.match(raw)
    if match is None:
        raise ModelError(path,
                         f"must be an RFC 3339 time such as 2026-11-21T10:00:00Z, not {raw!r}")
    year, month, day, hour, minute, second = (int(match[i]) for i in range(1, 7))
    fraction = match[7] or ""
    micros = int((fraction[1:] + "000000")[:6]) if fraction else 0
    zone = match[8]
    try:
        value = datetime(year, month, day, hour, minute, second, micros, tzinfo=UTC)
        if zone not in {"Z", "z"}:
            sign = 1 if zone[0] == "+" else -1
            offset = timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
            value -= sign * offset
    except (ValueError, OverflowError) as err:
        raise ModelError(path, f"is not a valid time: {raw!r} ({err})") from None
    return value


def read_optional_time(obj: Mapping[str, Any], key: str, path: str) -> datetime | None:
    raw = obj.get(key)
    return None if raw is None else parse_time(raw, join_path(path, key))


def format_time(value: datetime) -> str:
    """metav1.Time on the wire: RFC 3339 in UTC, whole seconds."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_time_precise(value: datetime) -> str:
    """RFC 3339 in UTC, with microseconds when there are any (for history timestamps)."""
    utc = value.astimezone(UTC)
    if utc.microsecond:
        return utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ")
