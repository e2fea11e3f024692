"""What metrics-server and metricscale show for the same usage, compared.

Every difference found is a `Difference` carrying the row of
docs/differences-metrics-server.md that explains it, but only when the difference follows that
row's rule (a window that is metrics-server's scrape interval against our configured range, a
CPU figure within a millicore...); anything else carries an `unexplained: ...` row, which the
document never lists, so a test fails on it. Plain functions over parsed JSON and kubectl's
output: the tests gather the answers, this module judges them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from metricscale.core.durations import parse_duration
from metricscale.core.quantity import parse_quantity

__all__ = [
    "DOC",
    "Difference",
    "Expectations",
    "KubectlRun",
    "compare_items",
    "compare_lists",
    "compare_top",
    "listed_rows",
    "unlisted",
]

DOC = Path(__file__).resolve().parents[2] / "docs" / "differences-metrics-server.md"
_ROW = re.compile(r"^\|\s*`(?P<row>[a-z0-9-]+)`\s*\|")
# Two answers made a few seconds apart are stamped a few seconds apart.
_SAME_MOMENT_SECONDS = 30
_MILLI = Decimal("0.001")
_FLOAT_SLACK = Decimal("0.000001")


@dataclass(frozen=True)
class Difference:
    row: str  # a row of DOC, or "unexplained: <what>"
    where: str
    metrics_server: str
    ours: str

    def __str__(self) -> str:
        return (f"[{self.row}] {self.where}: metrics-server {self.metrics_server!r}, "
                f"metricscale {self.ours!r}")


@dataclass(frozen=True)
class KubectlRun:
    """One kubectl command's exit code and output."""

    code: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Expectations:
    """What the comparison needs to know of the two set-ups."""

    window: str  # our resourceRules window, as we render it ("10s")
    resolution: Decimal  # metrics-server's --metric-resolution, in seconds
    # object name -> the row explaining why only we serve it (a pod metrics-server leaves out)
    only_ours: Mapping[str, str] = field(default_factory=dict)
    # kubectl row name -> containers summed into its CPU cell (1 when not given)
    containers: Mapping[str, int] = field(default_factory=dict)


def listed_rows(text: str) -> set[str]:
    """The rows of the table under `## Differences` (the `Fixed` table does not count)."""
    rows: set[str] = set()
    section = ""
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip().lower()
            continue
        match = _ROW.match(line)
        if match and section == "differences":
            rows.add(match["row"])
    return rows


def unlisted(differences: Iterable[Difference], rows: set[str]) -> list[Difference]:
    return [d for d in differences if d.row not in rows]


def _unexplained(what: str, where: str, ms: Any, ours: Any) -> Difference:
    return Difference(f"unexplained: {what}", where, str(ms), str(ours))


def _moment(text: Any) -> datetime | None:
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------
# Raw objects


def _compare_cpu(ms: str, ours: str, where: str) -> list[Difference]:
    if ms == ours:
        return []
    try:
        ms_cores, our_cores = parse_quantity(ms), parse_quantity(ours)
    except ValueError:
        return [_unexplained("cpu quantity", where, ms, ours)]
    # Ours: whole millicores cut down from the rate; metrics-server: its nanocores.
    whole_milli = (our_cores / _MILLI) == (our_cores / _MILLI).to_integral_value()
    if whole_milli and abs(ms_cores - our_cores) < _MILLI + _FLOAT_SLACK:
        return [Difference("cpu-precision", where, ms, ours)]
    return [_unexplained("cpu figure", where, ms, ours)]


def _compare_usage(ms: Mapping[str, Any], ours: Mapping[str, Any],
                   where: str) -> list[Difference]:
    found: list[Difference] = []
    if sorted(ms) != sorted(ours):
        found.append(_unexplained("usage resources", where, sorted(ms), sorted(ours)))
    if "cpu" in ms and "cpu" in ours:
        found += _compare_cpu(str(ms["cpu"]), str(ours["cpu"]), f"{where} cpu")
    if "memory" in ms and "memory" in ours and ms["memory"] != ours["memory"]:
        found.append(_unexplained("memory figure", f"{where} memory", ms["memory"],
                                  ours["memory"]))
    return found


def _compare_metadata(ms: Mapping[str, Any], ours: Mapping[str, Any],
                      where: str) -> list[Difference]:
    found: list[Difference] = []
    if list(ms) != list(ours):
        found.append(_unexplained("metadata fields or their order", where, list(ms),
                                  list(ours)))
    for key in ("name", "namespace", "labels"):
        if ms.get(key) != ours.get(key):
            found.append(_unexplained(f"metadata.{key}", where, ms.get(key), ours.get(key)))
    ms_created = _moment(ms.get("creationTimestamp"))
    our_created = _moment(ours.get("creationTimestamp"))
    # Both stamp an object with the moment the answer was made.
    if ms_created is None or our_created is None or \
            abs((ms_created - our_created).total_seconds()) > _SAME_MOMENT_SECONDS:
        found.append(_unexplained("metadata.creationTimestamp", where,
                                  ms.get("creationTimestamp"), ours.get("creationTimestamp")))
    return found


def _compare_times(ms: Mapping[str, Any], ours: Mapping[str, Any], where: str,
                   expect: Expectations) -> list[Difference]:
    found: list[Difference] = []
    if ms.get("window") != ours.get("window"):
        try:
            ms_window = parse_duration(str(ms.get("window")))
        except ValueError:
            ms_window = Decimal(-1)
        # metrics-server: the time between the two scrapes it used (one resolution, two after
        # a failed scrape); ours: the configured rate range, always.
        if ours.get("window") == expect.window and \
                0 < ms_window <= 2 * expect.resolution + 1:
            found.append(Difference("window", f"{where} window", str(ms.get("window")),
                                    str(ours.get("window"))))
        else:
            found.append(_unexplained("window", f"{where} window", ms.get("window"),
                                      ours.get("window")))
    if ms.get("timestamp") != ours.get("timestamp"):
        ms_time, our_time = _moment(ms.get("timestamp")), _moment(ours.get("timestamp"))
        ms_created = _moment((ms.get("metadata") or {}).get("creationTimestamp"))
        our_created = _moment((ours.get("metadata") or {}).get("creationTimestamp"))
        # metrics-server: when the kubelet measured the last point (a scrape, up to one
        # resolution before the answer); ours: the moment of the answer (the query's time).
        explained = (ms_time is not None and ms_created is not None
                     and our_time is not None and our_time == our_created
                     and ms_time <= ms_created
                     and (ms_created - ms_time).total_seconds()
                     <= float(2 * expect.resolution) + 2)
        found.append(Difference("timestamp" if explained else "unexplained: timestamp",
                                f"{where} timestamp", str(ms.get("timestamp")),
                                str(ours.get("timestamp"))))
    return found


def compare_items(ms: Mapping[str, Any], ours: Mapping[str, Any], *, where: str,
                  expect: Expectations) -> list[Difference]:
    """One PodMetrics or NodeMetrics (a list item, or a single object with kind/apiVersion)."""
    found: list[Difference] = []
    for key in ("kind", "apiVersion"):
        if ms.get(key) != ours.get(key):
            found.append(_unexplained(key, where, ms.get(key), ours.get(key)))
    if list(ms) != list(ours):
        found.append(_unexplained("fields or their order", where, list(ms), list(ours)))
    found += _compare_metadata(ms.get("metadata") or {}, ours.get("metadata") or {}, where)
    found += _compare_times(ms, ours, where, expect)
    if "usage" in ms or "usage" in ours:
        found += _compare_usage(ms.get("usage") or {}, ours.get("usage") or {}, where)
    if "containers" in ms or "containers" in ours:
        ms_containers = {c["name"]: c for c in ms.get("containers") or []}
        our_containers = {c["name"]: c for c in ours.get("containers") or []}
        if set(ms_containers) != set(our_containers):
            found.append(_unexplained("containers", where, sorted(ms_containers),
                                      sorted(our_containers)))
        elif list(ms_containers) != list(our_containers):
            # metrics-server lists them in Go's map order (random); we sort them by name.
            row = ("container-order" if list(our_containers) == sorted(our_containers)
                   else "unexplained: container order")
            found.append(Difference(row, f"{where} containers", str(list(ms_containers)),
                                    str(list(our_containers))))
        for name in sorted(set(ms_containers) & set(our_containers)):
            found += _compare_usage(ms_containers[name].get("usage") or {},
                                    our_containers[name].get("usage") or {},
                                    f"{where} container {name}")
    return found


def _item_key(item: Mapping[str, Any]) -> str:
    metadata = item.get("metadata") or {}
    namespace = metadata.get("namespace")
    return f"{namespace}/{metadata.get('name')}" if namespace else str(metadata.get("name"))


def compare_lists(ms: Mapping[str, Any], ours: Mapping[str, Any], *, where: str,
                  expect: Expectations, ms_warnings: Sequence[str] = (),
                  our_warnings: Sequence[str] = ()) -> list[Difference]:
    """A PodMetricsList or NodeMetricsList, with the Warning headers each came with."""
    found: list[Difference] = []
    for key in ("kind", "apiVersion", "metadata"):
        if ms.get(key) != ours.get(key):
            found.append(_unexplained(key, where, ms.get(key), ours.get(key)))
    ms_items = {_item_key(i): i for i in ms.get("items") or []}
    our_items = {_item_key(i): i for i in ours.get("items") or []}
    for key in sorted(set(ms_items) - set(our_items)):
        found.append(_unexplained("served by metrics-server only", f"{where} {key}", "served",
                                  "left out"))
    for key in sorted(set(our_items) - set(ms_items)):
        name = key.rpartition("/")[2]
        row = expect.only_ours.get(name, "unexplained: served by metricscale only")
        found.append(Difference(row, f"{where} {key}", "left out", "served"))
    shared = [k for k in ms_items if k in our_items]
    if shared != [k for k in our_items if k in ms_items]:
        found.append(_unexplained("item order", where, list(ms_items), list(our_items)))
    for key in sorted(shared):
        found += compare_items(ms_items[key], our_items[key], where=f"{where} {key}",
                               expect=expect)
    found += _compare_warnings(list(ms_warnings), list(our_warnings), where)
    return found


def _compare_warnings(ms: list[str], ours: list[str], where: str) -> list[Difference]:
    if ms == ours:
        return []
    # Ours says in a Warning header how many objects were left out and why; metrics-server
    # says nothing.
    if not ms and all("no metrics" in w or "without a" in w for w in ours):
        return [Difference("warning-header", f"{where} warnings", "", " | ".join(ours))]
    return [_unexplained("warnings", where, " | ".join(ms), " | ".join(ours))]


# --------------------------------------------------------------------------------------------
# kubectl top


def _table(stdout: str) -> tuple[list[str], list[list[str]]]:
    lines = [line.split() for line in stdout.strip().splitlines() if line.strip()]
    return (lines[0], lines[1:]) if lines else ([], [])


_KEY_COLUMNS = ("NAMESPACE", "POD", "NAME")


def _millicores(text: str) -> int | None:
    return int(text[:-1]) if text.endswith("m") and text[:-1].isdigit() else None


def _percent(text: str) -> int | None:
    return int(text[:-1]) if text.endswith("%") and text[:-1].isdigit() else None


def compare_top(ms: KubectlRun, ours: KubectlRun, *, where: str,
                expect: Expectations) -> list[Difference]:
    """`kubectl top ...` through each server: exit code, table and stderr."""
    found: list[Difference] = []
    if ms.code != ours.code:
        found.append(_unexplained("exit code", where, ms.code, ours.code))
    ms_err = [line for line in ms.stderr.splitlines() if line.strip()]
    our_err = [line for line in ours.stderr.splitlines() if line.strip()]
    extra = [line for line in our_err if line not in ms_err]
    missing = [line for line in ms_err if line not in our_err]
    if missing or any(not line.startswith("Warning: ") for line in extra):
        found.append(_unexplained("stderr", where, "\n".join(ms_err), "\n".join(our_err)))
    elif extra:
        found += _compare_warnings([], [line.removeprefix("Warning: ") for line in extra],
                                   f"{where} (stderr)")
    ms_head, ms_rows = _table(ms.stdout)
    our_head, our_rows = _table(ours.stdout)
    if ms_head != our_head:
        found.append(_unexplained("table header", where, ms_head, our_head))
    if ms_head != our_head or not ms_head:
        return found
    keys = [i for i, column in enumerate(ms_head) if column in _KEY_COLUMNS]

    def row_key(row: list[str]) -> tuple[str, ...]:
        return tuple(row[i] for i in keys)

    ms_by_key = {row_key(r): r for r in ms_rows}
    our_by_key = {row_key(r): r for r in our_rows}
    for key in sorted(set(ms_by_key) - set(our_by_key)):
        found.append(_unexplained("row shown by metrics-server only", f"{where} {key}",
                                  ms_by_key[key], "absent"))
    # The pod (or node) a row is of: `--containers` rows name the pod in POD.
    owner = ms_head.index("POD") if "POD" in ms_head else ms_head.index("NAME")
    for key in sorted(set(our_by_key) - set(ms_by_key)):
        row = expect.only_ours.get(our_by_key[key][owner],
                                   "unexplained: row shown by metricscale only")
        found.append(Difference(row, f"{where} {key}", "absent", " ".join(our_by_key[key])))
    shared = [k for k in ms_by_key if k in our_by_key]
    if shared != [k for k in our_by_key if k in ms_by_key]:
        found.append(_unexplained("row order", where, shared,
                                  [k for k in our_by_key if k in ms_by_key]))
    for key in shared:
        found += _compare_row(ms_head, ms_by_key[key], our_by_key[key], key=key,
                              where=where, expect=expect)
    return found


def _compare_row(head: list[str], ms: list[str], ours: list[str], *, key: tuple[str, ...],
                 where: str, expect: Expectations) -> list[Difference]:
    found: list[Difference] = []
    place = f"{where} {' '.join(key)}"
    if len(ms) != len(ours):
        return [_unexplained("row", place, ms, ours)]
    # A pod row's CPU is the sum of its containers' quantities: metrics-server's nanocores
    # summed then rounded up to millicores by kubectl, ours each truncated to millicores. Around
    # a whole millicore each can land a hair on its own side of it (a float rate): two apart.
    summed = 2 * (1 if "POD" in head else expect.containers.get(key[-1], 1))
    cpu_rounded = False
    for column, ms_cell, our_cell in zip(head, ms, ours, strict=True):
        if ms_cell == our_cell or column in _KEY_COLUMNS:
            continue
        if column == "CPU(cores)":
            ms_milli, our_milli = _millicores(ms_cell), _millicores(our_cell)
            if ms_milli is not None and our_milli is not None and \
                    0 < ms_milli - our_milli <= summed:
                cpu_rounded = True
                found.append(Difference("cpu-rounding", f"{place} {column}", ms_cell,
                                        our_cell))
                continue
        if column == "CPU(%)" and cpu_rounded:
            ms_percent, our_percent = _percent(ms_cell), _percent(our_cell)
            if ms_percent is not None and our_percent is not None and \
                    abs(ms_percent - our_percent) <= 1:
                found.append(Difference("cpu-rounding", f"{place} {column}", ms_cell,
                                        our_cell))
                continue
        found.append(_unexplained(column, place, ms_cell, our_cell))
    return found
