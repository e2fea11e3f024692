"""Building blocks of the reconcilers in the table of differences: reading and rewriting answers.

Each helper is pure: it takes answers (`Exchange`) and returns new ones.
"""

from __future__ import annotations

import copy
import math
import re
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from decimal import ROUND_DOWN, Decimal, InvalidOperation
from typing import Any

from tests.differential.harness import Exchange, PromQuery

__all__ = [
    "GO_INT64_INDEFINITE",
    "api_resource_list",
    "exact_milli",
    "go_milli",
    "is_not_found_metric",
    "items",
    "map_items",
    "map_queries",
    "message",
    "path_with_query",
    "promql_unescape_regex",
    "quantity",
    "status",
    "with_body",
    "with_resources",
]

# What Go's int64(x) gives on amd64 for NaN, ±Inf and anything out of range.
GO_INT64_INDEFINITE = -(2**63)


def status(exchange: Exchange) -> Mapping[str, Any] | None:
    """The Status body of an answer, if it is one."""
    body = exchange.body
    if isinstance(body, dict) and body.get("kind") == "Status":
        return body
    return None


def message(exchange: Exchange) -> str:
    found = status(exchange)
    return str(found.get("message", "")) if found else ""


def is_not_found_metric(exchange: Exchange) -> bool:
    """A 404 NotFound Status saying a metric was not found (either server's wording)."""
    found = status(exchange)
    return (exchange.status == 404 and found is not None and found.get("reason") == "NotFound"
            and str(found.get("message", "")).startswith("the server could not find the metric"))


def items(exchange: Exchange) -> list[Any] | None:
    body = exchange.body
    if isinstance(body, dict) and isinstance(body.get("items"), list):
        return list(body["items"])
    return None


def with_body(exchange: Exchange, body: Any) -> Exchange:
    return replace(exchange, body=body)


def map_items(exchange: Exchange, change: Callable[[dict[str, Any]], dict[str, Any] | None]
              ) -> Exchange:
    """Each item rewritten by `change` (None drops it)."""
    found = items(exchange)
    if found is None:
        return exchange
    body = dict(exchange.body)
    kept = []
    for item in found:
        changed = change(copy.deepcopy(item))
        if changed is not None:
            kept.append(changed)
    body["items"] = kept
    return with_body(exchange, body)


def map_queries(exchange: Exchange, change: Callable[[PromQuery], PromQuery]) -> Exchange:
    return replace(exchange, queries=tuple(change(q) for q in exchange.queries))


def api_resource_list(exchange: Exchange) -> list[dict[str, Any]] | None:
    body = exchange.body
    if (exchange.status == 200 and isinstance(body, dict)
            and body.get("kind") == "APIResourceList" and isinstance(body.get("resources"), list)):
        return [dict(r) for r in body["resources"]]
    return None


def with_resources(exchange: Exchange, resources: Iterable[Mapping[str, Any]]) -> Exchange:
    body = dict(exchange.body)
    body["resources"] = [dict(r) for r in resources]
    return with_body(exchange, body)


# --------------------------------------------------------------------------------------------
# Values


def go_milli(text: str, *, nan_is_zero: bool) -> int:
    """prometheus-adapter's milli-units of a sample: Go's `int64(value * 1000)` on amd64 (NaN is
    0 where it guards against it)."""
    value = float(text)
    if math.isnan(value):
        return 0 if nan_is_zero else GO_INT64_INDEFINITE
    scaled = value * 1000.0
    if math.isinf(scaled) or not -(2.0**63) <= scaled < 2.0**63:
        return GO_INT64_INDEFINITE
    return int(scaled)


def exact_milli(text: str) -> int | None:
    """The sample's exact decimal value in milli-units, truncated toward zero (None when it is
    not a finite number)."""
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return 0 if value.is_nan() else None
    return int((value * 1000).to_integral_value(rounding=ROUND_DOWN))


_SUFFIXES = {0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}


def quantity(milli: int) -> str:
    """The canonical DecimalSI string of `milli` thousandths, as Go's
    `resource.NewMilliQuantity(milli, DecimalSI).String()` writes it: milli-units when there is
    a fraction of a unit, else whole units with the largest suffix that keeps them whole."""
    if milli % 1000:
        return f"{milli}m"
    units, exponent = milli // 1000, 0
    if units == 0:
        return "0"
    while units % 1000 == 0 and exponent < 18:
        units //= 1000
        exponent += 3
    return f"{units}{_SUFFIXES[exponent]}"


def promql_unescape_regex(promql: str) -> str:
    """Regex metacharacters that were backslash-escaped inside PromQL strings, unescaped."""
    return re.sub(r"\\\\([.+*?()|\[\]{}^$])", r"\1", promql)


def path_with_query(path: str, **params: str) -> str:
    base, _, query = path.partition("?")
    values = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    values.update(params)
    return f"{base}?{urllib.parse.urlencode(values)}" if values else base
