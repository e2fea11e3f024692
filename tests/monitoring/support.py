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
