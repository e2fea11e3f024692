"""manifests/autoscaler as the tests read it: the objects, the Autoscaler CRD and its schema
as a validator (JSON Schema for the structural part, real CEL for its rules)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from celpy.adapter import json_to_cel

from testbed.fakes.kube_cel import compile_rule

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
HERE = MANIFESTS / "autoscaler"

Obj = dict[str, Any]


def documents(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def one(objects: list[Obj], kind: str, name: str) -> Obj:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


OBJECTS = [doc for path in sorted(HERE.glob("*.yaml")) if path.name != "kustomization.yaml"
           for doc in documents(path)]
CRD = one(OBJECTS, "CustomResourceDefinition", "autoscalers.metricscale.dev")
(VERSION,) = CRD["spec"]["versions"]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]


def strict(node: Any) -> Any:
    """The schema as JSON Schema, refusing unknown fields (kubectl's default field validation)."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict(value) for key, value in node.items()
           if not key.startswith("x-kubernetes-") and key != "default"}
    if node.get("type") == "object" and "properties" in node \
            and "additionalProperties" not in node and node.get("properties") != {}:
        out["additionalProperties"] = False
    if node is SCHEMA["properties"]["metadata"]:
        out = {"type": "object"}
    return out


VALIDATOR = jsonschema.Draft7Validator(strict(SCHEMA),
                                       format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)


def cel_rules(node: Obj, path: str = "") -> Iterator[tuple[str, Obj, str]]:
    """(schema path, schema node, rule) for every x-kubernetes-validations rule."""
    for rule in node.get("x-kubernetes-validations", []):
        yield path, node, rule["rule"]
    for key, child in (node.get("properties") or {}).items():
        yield from cel_rules(child, f"{path}.{key}")
    if "items" in node:
        yield from cel_rules(node["items"], f"{path}[]")


def values_at(obj: Any, path: str) -> Iterator[Any]:
    parts = re.findall(r"[^.\[\]]+|\[\]", path)
    current = [obj]
    for part in parts:
        nxt = []
        for value in current:
            if part == "[]" and isinstance(value, list):
                nxt.extend(value)
            elif isinstance(value, dict) and part in value:
                nxt.append(value[part])
        current = nxt
    return iter(current)


def cel_errors(obj: Obj) -> list[str]:
    """The CRD's own rules over the test's objects, evaluated by real CEL (cel-python, as the
    fake API server evaluates them)."""
    errors = []
    for path, _, rule in cel_rules(SCHEMA):
        program = compile_rule(rule).program
        for value in values_at(obj, path):
            try:
                passed = bool(program.evaluate({"self": json_to_cel(value)}))
            except Exception:  # an evaluation error fails the rule, as upstream reports it
                passed = False
            if not passed:
                errors.append(f"{path}: {rule}")
    return errors


def problems(obj: Obj) -> list[str]:
    schema_errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                     for e in VALIDATOR.iter_errors(obj)]
    return schema_errors or cel_errors(obj)
