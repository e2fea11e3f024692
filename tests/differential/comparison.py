"""Comparing two answers: what may legitimately vary is normalised away, and every other
difference must be one the table of deliberate differences explains.

An answer (`harness.Exchange`) is the status, the media type, the `Warning` headers, the JSON
body and the PromQL sent to Prometheus. `normalize` removes what legitimately varies between
two servers asked a moment apart: timestamps (checked for their RFC 3339 form first) and the
order of lists that are sets (items, discovery resources, containers, queries sent
concurrently). `reconcile` then lets each `Difference` of the table, in table order, rewrite
the pair so that the difference it describes, and nothing else, disappears; the ids of the
differences that changed something are the ones observed. Whatever remains unequal is a
difference nobody declared.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tests.differential.harness import Exchange, Pair, Server

__all__ = [
    "Context",
    "Difference",
    "Outcome",
    "Request",
    "Witness",
    "ask",
    "comparable",
    "describe",
    "normalize",
    "reconcile",
    "sorted_alternatives",
]

_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
TIMESTAMP = "<timestamp>"


@dataclass(frozen=True)
class Request:
    """One request, sent to both servers of a pair."""

    pair: str
    path: str
    method: str = "GET"
    accept: str = "application/json"

    @property
    def group(self) -> str:
        parts = self.path.split("?", 1)[0].split("/")
        return parts[2] if len(parts) > 2 and parts[1] == "apis" else ""

    def query(self, name: str) -> str | None:
        import urllib.parse

        values = urllib.parse.parse_qs(self.path.partition("?")[2], keep_blank_values=True)
        found = values.get(name)
        return found[0] if found else None

    def __str__(self) -> str:
        accept = "" if self.accept == "application/json" else f" (Accept: {self.accept})"
        return f"{self.pair}: {self.method} {self.path}{accept}"


@dataclass(frozen=True)
class Context:
    """What a reconciler may use besides the two answers: the request, and prometheus-adapter
    asked another path of the same pair (to compare ours with the request upstream would need
    to make for the same answer)."""

    request: Request
    ask_upstream: Callable[[str], Exchange]


Reconciler = Callable[[Context, Exchange, Exchange], tuple[Exchange, Exchange] | None]


@dataclass(frozen=True)
class Witness:
    """A request that shows a difference: the pair asked, and the path with `{ns}` (the
    world's namespace) and `{ns2}` (its other namespace) to fill in."""

    pair: str
    path: str
    method: str = "GET"
    accept: str = "application/json"


def _never(_: Context, __: Exchange, ___: Exchange) -> None:
    return None


@dataclass(frozen=True)
class Difference:
    """A deliberate difference from prometheus-adapter: its id, what it is, why, how a pair of
    answers showing it is reconciled (None when the pair does not show it), and where it shows:
    requests (each must show it, or one of them with `any_witness`) or configurations
    prometheus-adapter and metricscale judge differently at start (names of the configuration
    cases)."""

    id: str
    description: str
    reason: str
    reconcile: Reconciler = field(default=_never, repr=False, compare=False)
    witnesses: tuple[Witness, ...] = ()
    configs: tuple[str, ...] = ()
    any_witness: bool = False  # one witness showing it suffices (else: every one must)


@dataclass(frozen=True)
class Outcome:
    """The two answers after normalisation and reconciliation, and what was reconciled."""

    request: Request
    upstream: Exchange
    ours: Exchange
    observed: tuple[str, ...]

    @property
    def same(self) -> bool:
        return comparable(self.upstream) == comparable(self.ours)


# --------------------------------------------------------------------------------------------
# Normalisation: what legitimately varies


def _sort_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _item_key(item: Any) -> str:
    if isinstance(item, dict):
        described = item.get("describedObject")
        if isinstance(described, dict):
            return f"{described.get('namespace', '')}/{described.get('name', '')}"
        metadata = item.get("metadata")
        if isinstance(metadata, dict) and "name" in metadata:
            return f"{metadata.get('namespace', '')}/{metadata['name']}"
    return _sort_key(item)


def _normalize_json(value: Any, *, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _normalize_json(v, key=k) for k, v in value.items()}
    if isinstance(value, list):
        items = [_normalize_json(v) for v in value]
        if key == "items":
            return sorted(items, key=_item_key)
        if key in ("resources", "containers", "groups"):
            return sorted(items, key=lambda v: _sort_key(v.get("name") if isinstance(v, dict)
                                                           else v))
        return items
    if key == "timestamp" and isinstance(value, str) and value != TIMESTAMP:
        if not _TIMESTAMP.fullmatch(value):
            return f"<malformed timestamp {value!r}>"
        return TIMESTAMP
    return value


_ALTERNATION = re.compile(r'(=~|!~)"((?:[^"\\]|\\.)*)"')


def sorted_alternatives(promql: str) -> str:
    """The alternatives of each regex matcher in one order: a set of names, which
    prometheus-adapter joins in its informer's order (random) for resource metrics."""
    def sort(match: re.Match[str]) -> str:
        return f'{match.group(1)}"{"|".join(sorted(match.group(2).split("|")))}"'

    return _ALTERNATION.sub(sort, promql)


def normalize(exchange: Exchange) -> Exchange:
    """Timestamps replaced, set-like lists sorted, queries sorted (some are sent in parallel),
    regex alternatives sorted."""
    queries = (replace(q, promql=sorted_alternatives(q.promql)) for q in exchange.queries)
    return replace(exchange, body=_normalize_json(exchange.body),
                   queries=tuple(sorted(queries, key=lambda q: (q.promql, q.method))))


# --------------------------------------------------------------------------------------------
# Reconciliation: what is different on purpose


def comparable(exchange: Exchange) -> Exchange:
    """What must be equal: everything but the sample values each query got back (a value moving
    with time is judged by the answers built from it, not by its digits)."""
    return replace(exchange, queries=tuple(replace(q, samples=()) for q in exchange.queries))


def reconcile(context: Context, upstream: Exchange, ours: Exchange,
              differences: Sequence[Difference]) -> Outcome:
    upstream, ours = normalize(upstream), normalize(ours)
    observed: list[str] = []
    # Until nothing changes: a reconciler that asks upstream again brings back an answer the
    # reconcilers before it in the table have not seen.
    for _ in range(len(differences) + 1):
        changed = False
        for difference in differences:
            if comparable(upstream) == comparable(ours):
                break
            result = difference.reconcile(context, upstream, ours)
            if result is None:
                continue
            new_upstream, new_ours = normalize(result[0]), normalize(result[1])
            if (new_upstream, new_ours) != (upstream, ours):
                if difference.id not in observed:
                    observed.append(difference.id)
                upstream, ours = new_upstream, new_ours
                changed = True
        if not changed:
            break
    return Outcome(context.request, upstream, ours, tuple(observed))


# --------------------------------------------------------------------------------------------
# Reporting


def _show(exchange: Exchange) -> str:
    body = json.dumps(exchange.body, sort_keys=True, indent=1)
    if len(body) > 6000:
        body = body[:6000] + " …"
    queries = "\n".join(f"    {q.method} {q.promql!r} -> {list(q.values)}"
                        for q in exchange.queries) or "    (none)"
    return (f"  {exchange.status} {exchange.content_type} warnings={list(exchange.warnings)}\n"
            f"  queries:\n{queries}\n  body: {body}")


def describe(outcome: Outcome) -> str:
    """The request and both remaining answers, for a failure message."""
    return (f"{outcome.request}\n(reconciled: {', '.join(outcome.observed) or 'nothing'})\n"
            f"prometheus-adapter:\n{_show(outcome.upstream)}\n"
            f"metricscale:\n{_show(outcome.ours)}")


# --------------------------------------------------------------------------------------------
# Asking both


def ask(pair: Pair, request: Request, *, attempts: int = 6) -> tuple[Exchange, Exchange]:
    """prometheus-adapter's and our answer to `request`, ours asked between two asks of
    prometheus-adapter that were answered the same (so that values moving with time, or
    objects and series arriving, cannot pass for a difference)."""
    last: tuple[Exchange, Exchange] | None = None
    def asked(server: Server) -> Exchange:
        return server.exchange(request.path, method=request.method, accept=request.accept)

    for _ in range(attempts):
        before, ours, after = asked(pair.upstream), asked(pair.ours), asked(pair.upstream)
        if comparable(normalize(before)) == comparable(normalize(after)):
            return before, ours
        last = (before, after)
    assert last is not None
    raise AssertionError(f"prometheus-adapter's answer to {request} kept changing:\n"
                         f"{_show(normalize(last[0]))}\nthen\n{_show(normalize(last[1]))}")
