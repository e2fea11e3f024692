"""`x-kubernetes-validations` of a CRD's schema, evaluated with a real CEL implementation.

Follows apiextensions-apiserver's `pkg/apiserver/schema/cel/validation.go` (v1.32): a rule is
evaluated with `self` bound to the value at its schema node (the whole object at the root);
rules that mention `oldSelf` are transition rules, evaluated only where the node has a
correlated old value (object properties, granular maps, and items of `x-kubernetes-list-type:
map` lists by their keys); a failed rule is `Invalid` at the node (or its `fieldPath`), with the
value left out for objects and arrays, and `message`, `messageExpression` or "failed rule:
<rule>" as the detail; `reason` picks the error type. Validation ratcheting (on by default
since v1.30) is followed too: a rule without `oldSelf` is not enforced on a value equal to its
correlated old value.

CEL itself is cel-python (`celpy`), not a translation: a rule it cannot compile is refused when
the CRD is created, as the real server refuses it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel

from testbed.fakes.kube_errors import OMIT_VALUE, FieldError

__all__ = ["RuleCompileError", "compile_rule", "has_rules", "rule_errors",
           "schema_rule_problems"]

_OLD_SELF = re.compile(r"\boldSelf\b")


class RuleCompileError(ValueError):
    """A rule CEL cannot compile (the CRD that carries it is refused)."""


@dataclass(frozen=True)
class _Compiled:
    program: Any
    uses_old_self: bool


@functools.lru_cache(maxsize=1024)
def compile_rule(text: str) -> _Compiled:
    environment = celpy.Environment()
    try:
        program = environment.program(environment.compile(text))
    except Exception as error:  # celpy raises its parser's own error types
        raise RuleCompileError(f"compilation failed: {error}".strip()) from None
    return _Compiled(program, bool(_OLD_SELF.search(text)))


def schema_rule_problems(schema: Any, path: str) -> list[str]:
    """The rules of a schema (recursively) that do not compile, as `path: message` texts."""
    problems: list[str] = []
    if not isinstance(schema, dict):
        return problems
    for index, rule in enumerate(schema.get("x-kubernetes-validations") or []):
        text = rule.get("rule", "") if isinstance(rule, dict) else ""
        try:
            compile_rule(text)
        except RuleCompileError as error:
            problems.append(f"{path}.x-kubernetes-validations[{index}].rule: {error}")
    for key, child in (schema.get("properties") or {}).items():
        problems += schema_rule_problems(child, f"{path}.properties[{key}]")
    if isinstance(schema.get("items"), dict):
        problems += schema_rule_problems(schema["items"], f"{path}.items")
    if isinstance(schema.get("additionalProperties"), dict):
        problems += schema_rule_problems(schema["additionalProperties"],
                                         f"{path}.additionalProperties")
    return problems


def has_rules(schema: Any) -> bool:
    """Whether the schema holds any rule (the real server builds a CEL validator only then)."""
    if not isinstance(schema, dict):
        return False
    if schema.get("x-kubernetes-validations"):
        return True
    children = list((schema.get("properties") or {}).values())
    children += [schema.get(key) for key in ("items", "additionalProperties")]
    return any(has_rules(child) for child in children)


def _has_transition_rules(schema: dict[str, Any]) -> bool:
    for rule in schema.get("x-kubernetes-validations") or []:
        if isinstance(rule, dict) and _OLD_SELF.search(rule.get("rule", "")):
            return True
    children = list((schema.get("properties") or {}).values())
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            children.append(schema[key])
    return any(_has_transition_rules(child) for child in children if isinstance(child, dict))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def rule_errors(schema: dict[str, Any], value: Any, old: Any, *, path: str = "",
                correlated: bool = True) -> list[FieldError]:
    """Every failed rule under `schema` for `value` (and its correlated `old`, or None)."""
    if value is None:
        return []  # only non-null values are validated (a rule on the parent may test presence)
    if not correlated:
        old = None
    unchanged = old is not None and old == value
    if unchanged and not _has_transition_rules(schema):
        return []  # ratcheting: an unchanged value keeps whatever it was accepted with
    errors = _node_errors(schema, value, old, path=path, unchanged=unchanged)
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        granular = schema.get("x-kubernetes-map-type") != "atomic"
        for key, child in value.items():
            child_schema = properties.get(key) if key in properties else (
                extra if isinstance(extra, dict) else None)
            if child_schema is None:
                continue
            old_child = old.get(key) if granular and isinstance(old, dict) else None
            errors += rule_errors(child_schema, child, old_child, path=_join(path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = schema["items"]
        keys = schema.get("x-kubernetes-list-map-keys") or []
        by_key: dict[str, Any] = {}
        if schema.get("x-kubernetes-list-type") == "map" and isinstance(old, list):
            for item in old:
                if isinstance(item, dict):
                    by_key[repr([item.get(k) for k in keys])] = item
        for index, item in enumerate(value):
            old_item = (by_key.get(repr([item.get(k) for k in keys]))
                        if isinstance(item, dict) and by_key else None)
            errors += rule_errors(items, item, old_item, path=f"{path}[{index}]")
    return errors


def _node_errors(schema: dict[str, Any], value: Any, old: Any, *, path: str,
                 unchanged: bool) -> list[FieldError]:
    errors: list[FieldError] = []
    rules = schema.get("x-kubernetes-validations") or []
    if not rules:
        return errors
    activation = {"self": json_to_cel(value)}
    if old is not None:
        activation["oldSelf"] = json_to_cel(old)
    shown = OMIT_VALUE if isinstance(value, dict | list) else value
    where = path or "<nil>"
    for rule in rules:
        text = str(rule.get("rule", ""))
        compiled = compile_rule(text)
        if compiled.uses_old_self and old is None:
            continue  # transition rules need a correlated old value
        if not compiled.uses_old_self and unchanged:
            continue  # ratcheted
        shown_rule = str(rule.get("message") or "").strip() or text.strip()
        try:
            result = compiled.program.evaluate(activation)
        except Exception as error:  # celpy's evaluation errors: no such key, overflow, ...
            errors.append(FieldError("Invalid", where,
                                     f"{_eval_error(error)} evaluating rule: {shown_rule}",
                                     shown))
            continue
        if isinstance(result, celtypes.BoolType) and bool(result):
            continue
        detail = _message(rule, activation, text)
        at = _join(where if path else "", str(rule.get("fieldPath") or "").lstrip(".")) \
            if rule.get("fieldPath") else where
        errors.append(_error_for_reason(str(rule.get("reason") or ""), at, shown, detail))
    return errors


def _eval_error(error: Exception) -> str:
    args = getattr(error, "args", ())
    return str(args[0]) if args else str(error)


def _message(rule: dict[str, Any], activation: dict[str, Any], text: str) -> str:
    expression = rule.get("messageExpression")
    if expression:
        try:
            value = compile_rule(str(expression)).program.evaluate(activation)
        except Exception:
            value = None
        if isinstance(value, str):
            message = str(value).strip()
            if message and "\n" not in message:
                return message
    message = str(rule.get("message") or "").strip()
    return message or f"failed rule: {text.strip()}"


def _error_for_reason(reason: str, path: str, value: Any, detail: str) -> FieldError:
    if reason == "FieldValueForbidden":
        return FieldError("Forbidden", path, detail)
    if reason == "FieldValueRequired":
        return FieldError("Required", path, detail)
    if reason == "FieldValueDuplicate":
        return FieldError("Duplicate", path, "", value)
    return FieldError("Invalid", path, detail, value)
