"""Metric names the dashboards and alerts use, and the names both programs export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "manifests" / "monitoring"
RULES = MONITORING / "prometheusrule.yaml"
_NAME = re.compile(r"\b(metricscale_[a-z0-9_]+)")


def rule_groups() -> dict[str, Any]:
    """The rule groups of the PrometheusRule, in the shape promtool reads."""
    document = yaml.safe_load(RULES.read_text())
    assert document["kind"] == "PrometheusRule"
    return {"groups": document["spec"]["groups"]}


def alert_expressions() -> dict[str, str]:
    return {rule["alert"]: rule["expr"]
            for group in rule_groups()["groups"] for rule in group["rules"]}


def dashboard_expressions() -> list[str]:
    found: list[str] = []
    for name in ("adapter.json", "autoscaler.json"):
        board = json.loads((MONITORING / "dashboards" / name).read_text())
        found += [target["expr"] for panel in board["panels"]
                  for target in panel.get("targets", [])]
        found += [variable["query"] if isinstance(variable["query"], str)
                  else variable["query"]["query"]
                  for variable in board["templating"]["list"] if variable["type"] == "query"]
    return found


def metric_names(expression: str) -> set[str]:
    return set(_NAME.findall(expression))


def exported_names(registry: CollectorRegistry) -> set[str]:
    """Every series name the registry's families produce, with the suffixes of their types."""
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


# ---- promtool's test notation, for loading the same series into a real Prometheus

_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"\\]*)"\s*(?:,|$)')
_EXPANDING = re.compile(r"^(-?[0-9.]+)(?:([+-])([0-9.]+))?x([0-9]+)$")
_DURATION = {"s": 1, "m": 60, "h": 3600}


def parse_series(series: str) -> tuple[str, dict[str, str]]:
    """`name{a="x", b="y"}` (promtool's input_series) as (name, labels); no escapes."""
    match = _SERIES.match(series.strip())
    assert match, f"not a series: {series!r}"
    name, inner = match.group(1), (match.group(2) or "").strip()
    labels: dict[str, str] = {}
    position = 0
    while position < len(inner):
        label = _LABEL.match(inner, position)
        assert label, f"cannot read the labels of {series!r} at {inner[position:]!r}"
        labels[label.group(1)] = label.group(2)
        position = label.end()
    return name, labels


def expand_values(values: str) -> list[float]:
    """promtool's value notation (`1 2 3`, `5x3`, `0+10x20`, `10-1x4`) as the samples, one per
    interval; `_` and `stale` are not needed by the cases and not supported."""
    expanded: list[float] = []
    for token in values.split():
        match = _EXPANDING.match(token)
        if match is None:
            expanded.append(float(token))
            continue
        start, sign, step, count = match.groups()
        delta = float(step or 0) * (-1 if sign == "-" else 1)
        expanded += [float(start) + delta * index for index in range(int(count) + 1)]
    return expanded


def seconds(duration: str) -> int:
    """`10m`, `30s`, `1h` in seconds."""
    return int(duration[:-1]) * _DURATION[duration[-1]]
