"""What the API server refuses in an autoscaler's spec: the Autoscaler CRD's schema (types,
required fields, minimum, maximum, enum, pattern, lengths, items) and its CEL rules
(`x-kubernetes-validations`), mirrored from manifests/autoscaler/crd.yaml, with the API
server's words. `metricscale explain` refuses such a spec, as `kubectl apply` would; the
controller does not ask (the API server already did, and an object stored before a schema
change is decided upon as upstream would).

tests/autoscaler/test_explain_refuses_what_the_crd_refuses.py holds this mirror to the CRD:
every rule and every constraint there has a spec here that the CRD (real CEL) and explain
both refuse, so a rule added to the CRD alone fails that test.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autoscaler.model.fields import INT32_MAX, INT32_MIN, ModelError

__all__ = ["validate_spec"]


# A CEL rule: whether it holds for the object at its node, its message, and its fieldPath
# (relative to the node; "" reports the node itself).
Rule = tuple[Callable[[Mapping[str, Any]], bool], str, str]


@dataclass(frozen=True)
class _Schema:
    """One node of the CRD's structural schema, as far as validation goes."""

    type: str  # object, array, string, integer, int-or-string
    properties: Mapping[str, _Schema] = field(default_factory=dict)
    values: _Schema | None = None  # additionalProperties
    items: _Schema | None = None
    required: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    enum: tuple[str, ...] = ()
    pattern: str | None = None
    min_length: int | None = None
    max_length: int | None = None
    min_items: int | None = None
    rules: tuple[Rule, ...] = ()


def _has(obj: Mapping[str, Any], *keys: str) -> bool:
    """CEL's has(self.a.b): every key present (a JSON null counts as absent, as pruned)."""
    node: Any = obj
    for key in keys:
        if not isinstance(node, Mapping) or node.get(key) is None:
            return False
        node = node[key]
    return True


# --------------------------------------------------------------------------------------------
# The schema (manifests/autoscaler/crd.yaml, spec)

_NAME = r"^([^/%.]|[^/%.][^/%]|\.[^/%.]|[^/%]{3,})$"  # ValidatePathSegmentName
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_POSITIVE_QUANTITY = (r"^\+?(([0-9]*[1-9][0-9]*(\.[0-9]*)?)|([0-9]*\.[0-9]*[1-9][0-9]*))"
                      r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
_QUANTITY = (r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
             r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")

_STRING = _Schema("string")
_NAME_STRING = _Schema("string", min_length=1, pattern=_NAME)


def _integer(minimum: int | None = None, maximum: int | None = None) -> _Schema:
    return _Schema("integer", minimum=minimum, maximum=maximum)


def _enum(*values: str) -> _Schema:
    return _Schema("string", enum=values)


_REFERENCE = _Schema("object", required=("kind", "name"), properties={
    "apiVersion": _STRING, "kind": _NAME_STRING, "name": _NAME_STRING})

_SELECTOR = _Schema("object", properties={
    "matchExpressions": _Schema("array", items=_Schema(
        "object", required=("key", "operator"), properties={
            "key": _STRING,
            "operator": _enum("In", "NotIn", "Exists", "DoesNotExist"),
            "values": _Schema("array", items=_STRING)})),
    "matchLabels": _Schema("object", values=_STRING)})

_IDENTIFIER = _Schema("object", required=("name",), properties={
    "name": _NAME_STRING, "selector": _SELECTOR})

_TARGET = _Schema("object", required=("type",), properties={
    "type": _enum("Utilization", "Value", "AverageValue"),
    "value": _Schema("int-or-string", pattern=_POSITIVE_QUANTITY),
    "averageValue": _Schema("int-or-string", pattern=_POSITIVE_QUANTITY),
    "averageUtilization": _integer(minimum=1)})

_FALLBACK = _Schema("object", required=("replicas",), properties={
    "replicas": _integer(minimum=0),
    "failureThreshold": _integer(minimum=1),
    "failureDurationSeconds": _integer(minimum=1, maximum=86400),
    "behavior": _enum("static", "currentReplicas", "currentReplicasIfHigher",
                      "currentReplicasIfLower")})

_ACTIVATION_THRESHOLD = _Schema("int-or-string", pattern=_QUANTITY)


def _source(required: tuple[str, ...], properties: Mapping[str, _Schema],
            rules: tuple[Rule, ...]) -> _Schema:
    """A metric source: its own fields, and the fallback and activation threshold (ours)."""
    return _Schema("object", required=required, rules=rules, properties={
        **properties, "fallback": _FALLBACK, "activationThreshold": _ACTIVATION_THRESHOLD})


_RAW_OR_UTILIZATION: tuple[Rule, ...] = (
    (lambda s: _has(s, "target", "averageUtilization") or _has(s, "target", "averageValue"),
     "must set either a target raw value or a target utilization", ""),
    (lambda s: not (_has(s, "target", "averageUtilization")
                    and _has(s, "target", "averageValue")),
     "may not set both a target raw value and a target utilization", ""),
)

_SOURCES = (("Object", "object"), ("Pods", "pods"), ("Resource", "resource"),
            ("ContainerResource", "containerResource"), ("External", "external"))


def _source_rule(kind: str, key: str) -> Rule:
    return ((lambda m: (m.get("type") == kind) == _has(m, key)),
            f"{key} must be set when type is {kind}, and only then", "")


_METRIC = _Schema("object", required=("type",), properties={
    "type": _enum("ContainerResource", "External", "Object", "Pods", "Resource"),
    "object": _source(("describedObject", "target", "metric"), {
        "describedObject": _REFERENCE, "metric": _IDENTIFIER, "target": _TARGET}, (
        (lambda s: _has(s, "target", "value") or _has(s, "target", "averageValue"),
         "must set either a target value or averageValue", ""),)),
    "pods": _source(("metric", "target"), {"metric": _IDENTIFIER, "target": _TARGET}, (
        (lambda s: _has(s, "target", "averageValue"),
         "must specify a positive target averageValue", ""),)),
    "resource": _source(("name", "target"), {
        "name": _Schema("string", min_length=1), "target": _TARGET}, _RAW_OR_UTILIZATION),
    "containerResource": _source(("name", "target", "container"), {
        "name": _Schema("string", min_length=1),
        "container": _Schema("string", min_length=1, max_length=63, pattern=_DNS_LABEL),
        "target": _TARGET}, _RAW_OR_UTILIZATION),
    "external": _source(("metric", "target"), {"metric": _IDENTIFIER, "target": _TARGET}, (
        (lambda s: _has(s, "target", "value") or _has(s, "target", "averageValue"),
         "must set either a target value for metric or a per-pod target", ""),
        (lambda s: not (_has(s, "target", "value") and _has(s, "target", "averageValue")),
         "may not set both a target value for metric and a per-pod target", ""))),
}, rules=tuple(_source_rule(kind, key) for kind, key in _SOURCES))

_RULES = _Schema("object", properties={
    "stabilizationWindowSeconds": _integer(minimum=0, maximum=3600),
    "selectPolicy": _enum("Max", "Min", "Disabled"),
    "policies": _Schema("array", min_items=1, items=_Schema(
        "object", required=("type", "value", "periodSeconds"), properties={
            "type": _enum("Pods", "Percent"),
            "value": _integer(minimum=1),
            "periodSeconds": _integer(minimum=1, maximum=1800)})),
    "tolerance": _Schema("int-or-string", pattern=_QUANTITY)})


def _min_replicas(spec: Mapping[str, Any]) -> Any:
    return spec["minReplicas"] if _has(spec, "minReplicas") else 1


_SPEC = _Schema("object", required=("scaleTargetRef", "maxReplicas"), properties={
    "scaleTargetRef": _REFERENCE,
    "minReplicas": _integer(minimum=0),
    "maxReplicas": _integer(minimum=1),
    "metrics": _Schema("array", items=_METRIC),
    "behavior": _Schema("object", properties={
        "scaleUp": _RULES, "scaleDown": _RULES,
        "syncPeriodSeconds": _integer(minimum=1, maximum=3600)}),
    "idle": _Schema("object", properties={
        "replicas": _integer(minimum=0), "cooldownSeconds": _integer(minimum=0)}),
    "podSelectionStrategy": _enum("LabelSelector", "OwnerReferences"),
}, rules=(
    (lambda s: not _has(s, "minReplicas") or s["minReplicas"] <= s["maxReplicas"],
     "maxReplicas must be greater than or equal to minReplicas", "maxReplicas"),
    (lambda s: not _has(s, "minReplicas") or s["minReplicas"] > 0 or (
        _has(s, "metrics") and any(isinstance(m, Mapping) and m.get("type") in
                                   ("Object", "External") for m in s["metrics"])),
     "minReplicas 0 needs at least one Object or External metric", "minReplicas"),
    (lambda s: not _has(s, "idle", "replicas") or s["idle"]["replicas"] < _min_replicas(s),
     "idle.replicas must be less than minReplicas", "idle.replicas"),
))


# --------------------------------------------------------------------------------------------
# Checking a value against it


_COMPILED: dict[str, re.Pattern[str]] = {}


def _matches(pattern: str, text: str) -> bool:
    # The API server's patterns are RE2, where `$` is the end of the text (Python's `$` would
    # also match before a final newline).
    compiled = _COMPILED.get(pattern)
    if compiled is None:
        compiled = _COMPILED[pattern] = re.compile(
            pattern[:-1] + r"\Z" if pattern.endswith("$") else pattern)
    return compiled.search(text) is not None


def _is_integer(value: Any) -> bool:
    """A JSON integer (a float with an integral value decodes from one, as in Go)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


_TYPE_NAMES = {"object": "object", "array": "array", "string": "string",
               "integer": "integer", "int-or-string": "integer or string"}


def _type_holds(schema: _Schema, value: Any) -> bool:
    kind = schema.type
    if kind == "object":
        return isinstance(value, Mapping)
    if kind == "array":
        return isinstance(value, list | tuple)
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return _is_integer(value)
    return isinstance(value, str) or _is_integer(value)  # int-or-string


def _check(schema: _Schema, value: Any, path: str, *, strict: bool) -> None:
    if value is None:  # absent (a null is pruned): `required` speaks for it
        return
    if not _type_holds(schema, value):
        raise ModelError(path, f"must be of type {_TYPE_NAMES[schema.type]}")
    if schema.type == "object":
        _check_object(schema, value, path, strict=strict)
    elif schema.type == "array":
        if schema.min_items is not None and len(value) < schema.min_items:
            raise ModelError(path, f"should have at least {schema.min_items} items")
        if schema.items is not None:
            for index, item in enumerate(value):
                _check(schema.items, item, f"{path}[{index}]", strict=strict)
    elif schema.type == "integer":
        number = int(value)
        if not INT32_MIN <= number <= INT32_MAX:
            raise ModelError(path, "must fit in int32")
        if schema.minimum is not None and number < schema.minimum:
            raise ModelError(path, f"should be greater than or equal to {schema.minimum}")
        if schema.maximum is not None and number > schema.maximum:
            raise ModelError(path, f"should be less than or equal to {schema.maximum}")
    elif isinstance(value, str):
        _check_string(schema, value, path)


def _check_string(schema: _Schema, value: str, path: str) -> None:
    if schema.enum and value not in schema.enum:
        supported = ", ".join(json.dumps(option) for option in schema.enum)
        raise ModelError(path, f"Unsupported value: {json.dumps(value)}: supported values: "
                               f"{supported}")
    if schema.min_length is not None and len(value) < schema.min_length:
        raise ModelError(path, f"should be at least {schema.min_length} chars long")
    if schema.max_length is not None and len(value) > schema.max_length:
        raise ModelError(path, f"should be at most {schema.max_length} chars long")
    if schema.pattern is not None and not _matches(schema.pattern, value):
        raise ModelError(path, f"should match '{schema.pattern}'")


def _check_object(schema: _Schema, value: Mapping[str, Any], path: str, *,
                  strict: bool) -> None:
    for key in schema.required:
        if value.get(key) is None:
            raise ModelError(f"{path}.{key}", "Required value")
    for key, child in schema.properties.items():
        _check(child, value.get(key), f"{path}.{key}", strict=strict)
    for key, item in value.items():
        if key in schema.properties:
            continue
        if schema.values is not None:
            _check(schema.values, item, f"{path}.{key}", strict=strict)
        elif strict:
            raise ModelError(f"{path}.{key}", f"unknown field {json.dumps(str(key))}")
    for holds, message, field_path in schema.rules:
        if not holds(value):
            raise ModelError(f"{path}.{field_path}" if field_path else path, message)


def validate_spec(raw: Any, path: str = "spec", *, strict: bool = False) -> None:
    """Raise ModelError for the first thing in `raw` (an autoscaler's spec, as on the wire)
    that the Autoscaler CRD refuses; `strict` also refuses fields it does not know, as
    kubectl's strict field validation does (an Autoscaler's; a native HPA's spec may carry
    fields newer than this mirror)."""
    if raw is None:
        return  # the parser names a missing spec
    _check(_SPEC, raw, path, strict=strict)
