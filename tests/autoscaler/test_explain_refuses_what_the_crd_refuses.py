"""`metricscale explain` refuses whatever the Autoscaler CRD refuses, with the same words.

Walked from manifests/autoscaler/crd.yaml itself, so that the CRD and explain cannot drift:

* every CEL rule (`x-kubernetes-validations`) has a row below: a spec that violates that rule
  and nothing else (checked with real CEL, cel-python, as tests/autoscaler/test_crd.py does),
  which explain refuses with exit 2 and the rule's own message at the rule's field; a rule
  added to the CRD without a row fails `test_every_cel_rule_has_a_row`;
* every constraint of the spec's schema (minimum, maximum, enum, pattern, required,
  minItems, minLength, maxLength) is broken in turn in a spec that has every field: the CRD's
  schema refuses it, and explain refuses it with exit 2 naming the field.

explain runs in this process (its `run`, on a snapshot file), as the command does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from cli.main import main
from tests.autoscaler.crd_support import SCHEMA, VALIDATOR, cel_errors, cel_rules

Obj = dict[str, Any]

TARGET = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}
CPU = {"type": "Resource", "resource": {"name": "cpu", "target": {
    "type": "Utilization", "averageUtilization": 60}}}
QUEUE = {"type": "External", "external": {"metric": {"name": "queue"}, "target": {
    "type": "AverageValue", "averageValue": "30"}}}
FALLBACK = {"replicas": 3, "failureThreshold": 3, "failureDurationSeconds": 60,
            "behavior": "static"}
SELECTOR = {"matchLabels": {"queue": "orders"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]}
RULES = {"stabilizationWindowSeconds": 60, "selectPolicy": "Max", "tolerance": "0.05",
         "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15}]}
# Every field of the spec, each constrained one at least once (and valid).
EVERY_FIELD: Obj = {
    "scaleTargetRef": TARGET, "minReplicas": 2, "maxReplicas": 10,
    "podSelectionStrategy": "LabelSelector",
    "idle": {"replicas": 1, "cooldownSeconds": 300},
    "behavior": {"scaleUp": RULES, "scaleDown": RULES, "syncPeriodSeconds": 30},
    "metrics": [
        {"type": "Resource", "resource": {
            "name": "cpu", "fallback": FALLBACK, "activationThreshold": "1",
            "target": {"type": "Utilization", "averageUtilization": 50, "value": "1"}}},
        {"type": "Resource", "resource": {"name": "memory", "target": {
            "type": "AverageValue", "averageValue": "512Mi"}}},
        {"type": "ContainerResource", "containerResource": {
            "name": "cpu", "container": "app", "fallback": FALLBACK,
            "activationThreshold": "1",
            "target": {"type": "Utilization", "averageUtilization": 50, "value": "1"}}},
        {"type": "ContainerResource", "containerResource": {
            "name": "cpu", "container": "app", "target": {
                "type": "AverageValue", "averageValue": "100m"}}},
        {"type": "Pods", "pods": {
            "metric": {"name": "qps", "selector": SELECTOR}, "fallback": FALLBACK,
            "activationThreshold": "1", "target": {
                "type": "AverageValue", "averageValue": "10", "value": "1",
                "averageUtilization": 5}}},
        {"type": "Object", "object": {
            "describedObject": {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                                "name": "main"},
            "metric": {"name": "requests", "selector": SELECTOR}, "fallback": FALLBACK,
            "activationThreshold": "1", "target": {
                "type": "Value", "value": "10k", "averageValue": "1",
                "averageUtilization": 5}}},
        {"type": "External", "external": {
            "metric": {"name": "queue", "selector": SELECTOR}, "fallback": FALLBACK,
            "activationThreshold": "1", "target": {
                "type": "Value", "value": "1", "averageUtilization": 5}}},
        QUEUE,
    ],
}


def autoscaler(spec: Obj) -> Obj:
    return {"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
            "metadata": {"name": "web", "namespace": "shop"}, "spec": spec}


def explain(spec: Obj, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`metricscale explain FILE` on a snapshot of an Autoscaler with this spec."""
    snapshot = {"apiVersion": "metricscale.dev/v1alpha1", "kind": "DecisionSnapshot",
                "now": "2026-11-21T10:00:00Z", "autoscaler": autoscaler(spec),
                "scale": {"spec": {"replicas": 3},
                          "status": {"replicas": 3, "selector": "app=web"}}}
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(snapshot), encoding="utf-8")
    status = main(["explain", str(path)])
    return status, capsys.readouterr().err


def refused(field: str, message: str) -> str:
    return f"metricscale explain: invalid snapshot: autoscaler.{field}: {message}\n"


def test_a_spec_with_every_field_is_accepted_by_both(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    obj = autoscaler(EVERY_FIELD)
    assert list(VALIDATOR.iter_errors(obj)) == [] and cel_errors(obj) == []
    assert explain(EVERY_FIELD, tmp_path, capsys) == (0, "")


# --------------------------------------------------------------------------------- CEL rules


class Row(NamedTuple):
    node: str  # the concrete path of the rule's node in `specs`
    specs: tuple[Obj, ...]  # each violates this rule and nothing else


def spec_with(**fields: Any) -> Obj:
    return {"scaleTargetRef": TARGET, "maxReplicas": 5, **fields}


def metric(kind: str, key: str, **source: Any) -> Obj:
    return {"type": kind, key: source}


POSITIVE = {"type": "AverageValue", "averageValue": "1"}

# (schema path, rule) -> a row. The rule's message and fieldPath are read from the CRD.
ROWS: dict[tuple[str, str], Row] = {
    (".spec", "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas"): Row(
        "spec", (spec_with(minReplicas=4, maxReplicas=3),)),
    (".spec", "!has(self.minReplicas) || self.minReplicas > 0 || (has(self.metrics) && "
              "self.metrics.exists(m, m.type == 'Object' || m.type == 'External'))"): Row(
        "spec", (spec_with(minReplicas=0, metrics=[CPU]),
                 spec_with(minReplicas=0))),  # without metrics: the default is cpu
    (".spec", "!has(self.idle) || !has(self.idle.replicas) || self.idle.replicas < "
              "(has(self.minReplicas) ? self.minReplicas : 1)"): Row(
        "spec", (spec_with(minReplicas=2, idle={"replicas": 2}),
                 spec_with(idle={"replicas": 1}))),  # minReplicas defaults to 1
    (".spec.metrics[]", "self.type == 'Object' ? has(self.object) : !has(self.object)"): Row(
        "spec.metrics[0]", (spec_with(metrics=[{"type": "Object"}]),
                            spec_with(metrics=[{**CPU, "object": {
                                "describedObject": TARGET, "metric": {"name": "m"},
                                "target": {"type": "Value", "value": "1"}}}]))),
    (".spec.metrics[]", "self.type == 'Pods' ? has(self.pods) : !has(self.pods)"): Row(
        "spec.metrics[0]", (spec_with(metrics=[{"type": "Pods"}]),)),
    (".spec.metrics[]", "self.type == 'Resource' ? has(self.resource) : "
                        "!has(self.resource)"): Row(
        "spec.metrics[0]", (spec_with(metrics=[{"type": "Resource"}]),)),
    (".spec.metrics[]", "self.type == 'ContainerResource' ? has(self.containerResource) : "
                        "!has(self.containerResource)"): Row(
        "spec.metrics[0]", (spec_with(metrics=[{"type": "ContainerResource"}]),)),
    (".spec.metrics[]", "self.type == 'External' ? has(self.external) : "
                        "!has(self.external)"): Row(
        "spec.metrics[0]", (spec_with(metrics=[{"type": "External"}]),)),
    (".spec.metrics[].object", "has(self.target.value) || has(self.target.averageValue)"): Row(
        "spec.metrics[0].object", (spec_with(metrics=[metric(
            "Object", "object", describedObject=TARGET, metric={"name": "m"},
            target={"type": "Utilization", "averageUtilization": 5})]),)),
    (".spec.metrics[].pods", "has(self.target.averageValue)"): Row(
        "spec.metrics[0].pods", (spec_with(metrics=[metric(
            "Pods", "pods", metric={"name": "m"}, target={"type": "Value", "value": "1"})]),)),
    (".spec.metrics[].resource", "has(self.target.averageUtilization) || "
                                 "has(self.target.averageValue)"): Row(
        "spec.metrics[0].resource", (spec_with(metrics=[metric(
            "Resource", "resource", name="cpu", target={"type": "Utilization"})]),)),
    (".spec.metrics[].resource", "!(has(self.target.averageUtilization) && "
                                 "has(self.target.averageValue))"): Row(
        "spec.metrics[0].resource", (spec_with(metrics=[metric(
            "Resource", "resource", name="cpu", target={
                "type": "Utilization", "averageUtilization": 5, "averageValue": "1"})]),)),
    (".spec.metrics[].containerResource", "has(self.target.averageUtilization) || "
                                          "has(self.target.averageValue)"): Row(
        "spec.metrics[0].containerResource", (spec_with(metrics=[metric(
            "ContainerResource", "containerResource", name="cpu", container="app",
            target={"type": "Utilization"})]),)),
    (".spec.metrics[].containerResource", "!(has(self.target.averageUtilization) && "
                                          "has(self.target.averageValue))"): Row(
        "spec.metrics[0].containerResource", (spec_with(metrics=[metric(
            "ContainerResource", "containerResource", name="cpu", container="app",
            target={"type": "Utilization", "averageUtilization": 5,
                    "averageValue": "1"})]),)),
    (".spec.metrics[].external", "has(self.target.value) || has(self.target.averageValue)"):
        Row("spec.metrics[0].external", (spec_with(metrics=[metric(
            "External", "external", metric={"name": "q"},
            target={"type": "Utilization", "averageUtilization": 5})]),)),
    (".spec.metrics[].external", "!(has(self.target.value) && has(self.target.averageValue))"):
        Row("spec.metrics[0].external", (spec_with(metrics=[metric(
            "External", "external", metric={"name": "q"},
            target={**POSITIVE, "type": "Value", "value": "1"})]),)),
}


def crd_rules() -> dict[tuple[str, str], Obj]:
    """(schema path, rule) -> the rule, for every rule of the CRD's spec."""
    found = {}
    for path, node, _ in cel_rules(SCHEMA):
        for rule in node.get("x-kubernetes-validations", []):
            if path.startswith(".spec"):
                found[(path, " ".join(rule["rule"].split()))] = rule
    return found


CRD_RULES = crd_rules()


def test_every_cel_rule_has_a_row() -> None:
    assert len(CRD_RULES) >= 16
    missing = sorted(set(CRD_RULES) - set(ROWS))
    assert not missing, f"CEL rules of the CRD without a row (and maybe without a check in " \
                        f"autoscaler/model/validation.py): {missing}"
    assert not set(ROWS) - set(CRD_RULES), "rows for rules the CRD no longer has"


CASES = [(key, index) for key, row in ROWS.items() for index in range(len(row.specs))]


@pytest.mark.parametrize(("key", "index"), CASES,
                         ids=[f"{key[0]}: {CRD_RULES.get(key, {}).get('message')} #{index}"
                              for key, index in CASES])
def test_explain_refuses_what_each_cel_rule_refuses_with_its_message(
        key: tuple[str, str], index: int, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    rule = CRD_RULES[key]
    row = ROWS[key]
    spec = row.specs[index]
    obj = autoscaler(spec)
    # The CRD refuses it for this rule alone (its schema accepts it; real CEL).
    assert list(VALIDATOR.iter_errors(obj)) == []
    assert cel_errors(obj) == [f"{key[0]}: {rule['rule']}"]
    field = row.node + (rule.get("fieldPath") or "")
    assert explain(spec, tmp_path, capsys) == (2, refused(field, rule["message"]))


# ----------------------------------------------------------------- the schema's constraints

# A value each pattern refuses (a new pattern in the CRD needs one here).
PATTERN_VIOLATIONS = {
    r"^([^/%.]|[^/%.][^/%]|\.[^/%.]|[^/%]{3,})$": "a/b",
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$": "App_1",
    r"^\+?(([0-9]*[1-9][0-9]*(\.[0-9]*)?)|([0-9]*\.[0-9]*[1-9][0-9]*))(([KMGTPE]i)|"
    r"[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$": "0",
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+"
    r"(\.[0-9]*)?)|(\.[0-9]+))))?$": "-1",
}
CONSTRAINTS = ("minimum", "maximum", "enum", "pattern", "required", "minItems", "minLength",
               "maxLength")
# What else a node of the spec may say; a keyword outside both lists fails the walk below.
NOT_CONSTRAINTS = {"type", "description", "properties", "items", "additionalProperties",
                   "default", "format", "anyOf", "x-kubernetes-int-or-string",
                   "x-kubernetes-list-type", "x-kubernetes-map-type",
                   "x-kubernetes-validations"}


class Constraint(NamedTuple):
    path: str  # schema path, e.g. spec.metrics[].pods.target.averageValue
    keyword: str
    argument: Any


def constraints(node: Obj, path: str) -> Iterator[Constraint]:
    unknown = set(node) - set(CONSTRAINTS) - NOT_CONSTRAINTS
    assert not unknown, f"{path}: keywords neither checked nor known: {unknown}"
    for keyword in CONSTRAINTS:
        if keyword == "required":
            for key in node.get("required", []):
                yield Constraint(path, keyword, key)
        elif keyword in node:
            yield Constraint(path, keyword, node[keyword])
    for key, child in (node.get("properties") or {}).items():
        yield from constraints(child, f"{path}.{key}")
    if "items" in node:
        yield from constraints(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from constraints(node["additionalProperties"], f"{path}.*")


SPEC_CONSTRAINTS = list(constraints(SCHEMA["properties"]["spec"], "spec"))


def first_location(obj: Any, parts: list[str], concrete: str) -> tuple[str, Any, Any] | None:
    """(concrete path, container, key) of the first value at the schema path in `obj`."""
    part, rest = parts[0], parts[1:]
    if part == "[]":
        if not isinstance(obj, list):
            return None
        for index, item in enumerate(obj):
            where = f"{concrete}[{index}]"
            found = (where, obj, index) if not rest else first_location(item, rest, where)
            if found is not None:
                return found
        return None
    if part == "*":
        if not isinstance(obj, dict) or not obj:
            return None
        key = next(iter(obj))
        return (f"{concrete}.{key}", obj, key) if not rest else \
            first_location(obj[key], rest, f"{concrete}.{key}")
    if not isinstance(obj, dict) or part not in obj:
        return None
    where = f"{concrete}.{part}" if concrete else part
    return (where, obj, part) if not rest else first_location(obj[part], rest, where)


def broken(constraint: Constraint) -> tuple[Obj, str]:
    """EVERY_FIELD with this constraint broken at its first place, and that field's path."""
    spec = json.loads(json.dumps(EVERY_FIELD))  # no shared parts: each edit is one place
    parts = re.findall(r"[^.\[\]]+|\[\]", constraint.path)[1:]  # without the leading "spec"
    if not parts:  # the spec itself: only `required` applies here
        assert constraint.keyword == "required"
        del spec[constraint.argument]
        return spec, f"spec.{constraint.argument}"
    found = first_location(spec, parts, "spec")
    assert found is not None, f"EVERY_FIELD has no {constraint.path}: add it"
    where, container, key = found
    keyword, argument = constraint.keyword, constraint.argument
    if keyword == "required":
        del container[key][argument]
        return spec, f"{where}.{argument}"
    container[key] = {
        "minimum": lambda: argument - 1,
        "maximum": lambda: argument + 1,
        "enum": lambda: "NotOneOfThem",
        "pattern": lambda: PATTERN_VIOLATIONS[argument],
        "minItems": lambda: [],
        "minLength": lambda: "",
        "maxLength": lambda: "a" * (argument + 1),
    }[keyword]()
    return spec, where


def test_the_walk_finds_every_kind_of_constraint() -> None:
    kinds = {c.keyword for c in SPEC_CONSTRAINTS}
    assert kinds == set(CONSTRAINTS)
    assert len(SPEC_CONSTRAINTS) > 100


@pytest.mark.parametrize("constraint", SPEC_CONSTRAINTS,
                         ids=[f"{c.path} {c.keyword} {c.argument}"[:120]
                              for c in SPEC_CONSTRAINTS])
def test_explain_refuses_what_the_schema_refuses_naming_the_field(
        constraint: Constraint, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, field = broken(constraint)
    assert list(VALIDATOR.iter_errors(autoscaler(spec))) != [], "the CRD accepts it"
    status, stderr = explain(spec, tmp_path, capsys)
    assert status == 2
    assert stderr.startswith(f"metricscale explain: invalid snapshot: autoscaler.{field}: "), \
        stderr
    assert stderr.count("\n") == 1
