"""Request-body decoding as kube-apiserver does it: pruning, type checks, time normalisation.

Built-in kinds use the upstream OpenAPI definitions (shipped with kubernetes-validate), custom
resources their CRD's structural schema (with defaults and the common validations).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from testbed.fakes.kube_cel import has_rules, rule_errors
from testbed.fakes.kube_errors import (
    FieldError,
    duplicate,
    go_map_literal,
    invalid_value,
    not_supported,
    required_value,
)

__all__ = [
    "BuiltinSchemas",
    "DecodeError",
    "DecodeResult",
    "SchemaNode",
    "StructuralSchema",
    "builtin_schemas",
    "format_micro_time",
    "format_time",
]

# The OpenAPI definitions shipped with kubernetes-validate (a test dependency) for the
# Kubernetes minor that kubernetes-asyncio 36.1.0 was generated from.
SCHEMA_VERSION = "1.36.0"


class DecodeError(ValueError):
    """A body the Go decoder would refuse: answered as 400 BadRequest."""


@dataclass
class DecodeResult:
    value: Any
    unknown_fields: list[str] = field(default_factory=list)


def format_time(moment: datetime) -> str:
    """metav1.Time on the wire: RFC 3339, UTC, whole seconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(moment: datetime) -> str:
    """metav1.MicroTime on the wire: RFC 3339, UTC, exactly six fractional digits."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})([.,]\d+)?(Z|[+-]\d{2}:\d{2})$")
_RFC3339_MICRO = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{6})(Z|[+-]\d{2}:\d{2})$")
_QUANTITY = re.compile(
    r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([numkMGTPE]|[KMGTPE]i|[eE][+-]?[0-9]+)?$")


def _parse_moment(match: re.Match[str], fraction: str) -> datetime:
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    zone = match.group(8)
    micro = int((fraction + "000000")[:6]) if fraction else 0
    text = f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
    offset = "+00:00" if zone == "Z" else zone
    return datetime.fromisoformat(f"{text}.{micro:06d}{offset}")


def parse_time(text: str) -> datetime:
    match = _RFC3339.match(text)
    if match is None:
        raise DecodeError(f'parsing time "{text}" as "2006-01-02T15:04:05Z07:00": cannot parse '
                          f'"{text}" as "2006"')
    try:
        return _parse_moment(match, (match.group(7) or "")[1:])
    except ValueError as error:
        raise DecodeError(f'parsing time "{text}": {error}') from None


def parse_micro_time(text: str) -> datetime:
    match = _RFC3339_MICRO.match(text)
    if match is None:
        raise DecodeError(f'parsing time "{text}" as "2006-01-02T15:04:05.000000Z07:00": '
                          f'cannot parse "{text}" as "2006-01-02T15:04:05.000000Z07:00"')
    try:
        return _parse_moment(match, match.group(7))
    except ValueError as error:
        raise DecodeError(f'parsing time "{text}": {error}') from None


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


class SchemaNode:
    """One node of the built-in OpenAPI definitions, seen through its `$ref`."""

    def __init__(self, definitions: dict[str, Any], raw: dict[str, Any]) -> None:
        self._definitions = definitions
        self.raw = raw
        self.ref = ""
        resolved = raw
        while "$ref" in resolved:
            self.ref = resolved["$ref"].rsplit("/", 1)[-1]
            resolved = definitions[self.ref]
        self.resolved = resolved

    @property
    def types(self) -> set[str]:
        declared = self.resolved.get("type", [])
        return {declared} if isinstance(declared, str) else set(declared)

    def field(self, name: str) -> SchemaNode | None:
        properties = self.resolved.get("properties")
        if properties is not None:
            child = properties.get(name)
            return SchemaNode(self._definitions, child) if child is not None else None
        extra = self.resolved.get("additionalProperties")
        if isinstance(extra, dict):
            return SchemaNode(self._definitions, extra)
        return None

    def elements(self) -> SchemaNode | None:
        items = self.resolved.get("items")
        return SchemaNode(self._definitions, items) if isinstance(items, dict) else None

    @property
    def patch_strategy(self) -> str:
        return str(self.raw.get("x-kubernetes-patch-strategy")
                   or self.resolved.get("x-kubernetes-patch-strategy") or "")

    @property
    def merge_key(self) -> str | None:
        key = self.raw.get("x-kubernetes-patch-merge-key") or self.resolved.get(
            "x-kubernetes-patch-merge-key")
        return str(key) if key else None

    @property
    def go_type(self) -> str:
        if self.ref:
            return self.ref.rsplit(".", 1)[-1]
        types = self.types - {"null"}
        if "integer" in types:
            return str(self.resolved.get("format", "int64"))
        if "number" in types:
            return "float64"
        if "boolean" in types:
            return "bool"
        if "array" in types:
            element = self.elements()
            return "[]" + (element.go_type if element is not None else "interface {}")
        if "object" in types:
            value = self.field("*")
            return "map[string]" + (value.go_type if value is not None else "string")
        return "string"


class BuiltinSchemas:
    """Root schemas of the built-in kinds, by (group, version, kind)."""

    def __init__(self, definitions: dict[str, Any]) -> None:
        self._definitions = definitions
        self._roots: dict[tuple[str, str, str], str] = {}
        for name, definition in definitions.items():
            for gvk in definition.get("x-kubernetes-group-version-kind", []):
                self._roots.setdefault((gvk["group"], gvk["version"], gvk["kind"]), name)

    def root(self, group: str, version: str, kind: str) -> SchemaNode | None:
        name = self._roots.get((group, version, kind))
        if name is None:
            return None
        return SchemaNode(self._definitions, {"$ref": f"#/$defs/{name}"})

    def node(self, definition: str) -> SchemaNode:
        return SchemaNode(self._definitions, {"$ref": f"#/$defs/{definition}"})

    def decode(self, value: Any, root: SchemaNode) -> DecodeResult:
        """Prune unknown fields, check JSON types, normalise times, drop nulls."""
        result = DecodeResult(value=None)
        result.value = self._walk(value, root, "", root.go_type, result)
        return result

    def _walk(self, value: Any, node: SchemaNode, path: str, parent: str,
              result: DecodeResult) -> Any:
        def refuse() -> DecodeError:
            where = f"Go struct field {parent}.{path}" if path else "Go value"
            return DecodeError(f"json: cannot unmarshal {_json_type(value)} into {where} of "
                               f"type {node.go_type}")

        ref = node.ref.rsplit(".", 1)[-1]
        if node.ref == "io.k8s.apimachinery.pkg.apis.meta.v1.Time":
            if not isinstance(value, str):
                raise refuse()
            return format_time(parse_time(value))
        if node.ref == "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime":
            if not isinstance(value, str):
                raise refuse()
            return format_micro_time(parse_micro_time(value))
        if ref == "Quantity":
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise refuse()
            text = value if isinstance(value, str) else json.dumps(value)
            if not _QUANTITY.match(text):
                raise DecodeError("quantities must match the regular expression "
                                  "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
            return text
        if ref == "IntOrString":
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise refuse()
            return value
        if ref in ("RawExtension", "JSON", "FieldsV1"):
            return copy.deepcopy(value)
        types = node.types - {"null"}
        if "object" in types or node.resolved.get("properties") is not None:
            if not isinstance(value, dict):
                raise refuse()
            properties = node.resolved.get("properties")
            extra = node.resolved.get("additionalProperties")
            out: dict[str, Any] = {}
            struct = node.go_type if node.ref else parent
            for key, child_value in value.items():
                child_path = f"{path}.{key}" if path else key
                if child_value is None:
                    continue
                if properties is not None:
                    if key not in properties:
                        result.unknown_fields.append(child_path)
                        continue
                    child = SchemaNode(self._definitions, properties[key])
                elif isinstance(extra, dict):
                    child = SchemaNode(self._definitions, extra)
                else:
                    out[key] = copy.deepcopy(child_value)
                    continue
                out[key] = self._walk(child_value, child, child_path, struct, result)
            return out
        if "array" in types:
            if not isinstance(value, list):
                raise refuse()
            element = node.elements()
            if element is None:
                return copy.deepcopy(value)
            return [self._walk(v, element, f"{path}[{i}]", parent, result)
                    for i, v in enumerate(value) if v is not None]
        if "integer" in types:
            if isinstance(value, bool) or not isinstance(value, int):
                raise refuse()
            return value
        if "number" in types:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise refuse()
            return value
        if "boolean" in types:
            if not isinstance(value, bool):
                raise refuse()
            return value
        if "string" in types:
            if not isinstance(value, str):
                raise refuse()
            return value
        return copy.deepcopy(value)


@functools.cache
def builtin_schemas() -> BuiltinSchemas:
    """Loaded once per process (read-only afterwards)."""
    folder = resources.files("kubernetes_validate").joinpath(
        "kubernetes-json-schema", f"v{SCHEMA_VERSION}-local", "_definitions.json")
    definitions = json.loads(folder.read_text())["$defs"]
    return BuiltinSchemas(definitions)


# --- CRD structural schemas ------------------------------------------------------------------


class StructuralSchema:
    """A CRD version's openAPIV3Schema: pruning, defaulting and the common validations."""

    def __init__(self, schema: dict[str, Any] | None) -> None:
        self.schema = schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True}

    def at(self, path: list[str]) -> dict[str, Any] | None:
        node: dict[str, Any] | None = self.schema
        for part in path:
            if node is None:
                return None
            node = (node.get("properties") or {}).get(part)
        return node

    @functools.cached_property
    def has_rules(self) -> bool:
        return has_rules(self.schema)

    def rule_errors(self, new: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
        """The failed `x-kubernetes-validations` rules of `new` (an update passes `old`)."""
        return rule_errors(self.schema, new, old)

    def decode(self, value: dict[str, Any], old: dict[str, Any] | None = None
               ) -> tuple[dict[str, Any], list[str], list[FieldError]]:
        """(pruned and defaulted object, unknown field paths, validation errors).

        With `old` (an update), validation ratchets as apiextensions-apiserver does since
        v1.30 (CRDValidationRatcheting, `customresource/strategy.go` ValidateUpdate): schema
        errors inside a value equal to its correlated old value are dropped (correlation by
        object property, and by key for `x-kubernetes-list-type: map` items), and list-type
        errors count only when the old object had none."""
        unknown: list[str] = []
        errors: list[FieldError] = []
        list_errors: list[FieldError] = []
        metadata_schema = builtin_schemas().node("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")
        out: dict[str, Any] = {}
        for key in ("apiVersion", "kind"):
            if key in value:
                out[key] = value[key]
        if isinstance(value.get("metadata"), dict):
            decoded = builtin_schemas().decode(value["metadata"], metadata_schema)
            out["metadata"] = decoded.value
            unknown.extend(f"metadata.{p}" for p in decoded.unknown_fields)
        skip = ("apiVersion", "kind", "metadata")
        rest = {k: v for k, v in value.items() if k not in skip}
        old_rest: Any = _UNCORRELATED if old is None else \
            {k: v for k, v in old.items() if k not in skip}
        walk = _Walk(unknown, list_errors)
        body = self._walk(rest, self.schema, "", walk, errors, old_rest, root=True)
        if isinstance(body, dict):
            out.update(body)
        if list_errors and old is not None:
            old_walk = _Walk([], [])
            self._walk({k: v for k, v in old.items() if k not in skip}, self.schema, "",
                       old_walk, [], _UNCORRELATED, root=True)
            if old_walk.list_errors:
                list_errors = []  # ratcheted: the old object broke the list rules already
        return out, unknown, errors + list_errors

    def _walk(self, value: Any, schema: dict[str, Any], path: str, walk: _Walk,
              errors: list[FieldError], old: Any, *, root: bool = False) -> Any:
        local: list[FieldError] = []
        result = self._walk_node(value, schema, path, walk, local, old, root=root)
        if local and not (old is not _UNCORRELATED and result == old):
            errors.extend(local)
        return result

    def _walk_node(self, value: Any, schema: dict[str, Any], path: str, walk: _Walk,
                   errors: list[FieldError], old: Any, *, root: bool) -> Any:
        name = path or "<root>"
        declared = schema.get("type")
        if schema.get("x-kubernetes-int-or-string"):
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                errors.append(FieldError("TypeInvalid", name,
                                         f"{name} in body must be of type integer,string: "
                                         f"\"{_json_type(value)}\"", _json_type(value)))
            elif isinstance(value, str):
                self._string(value, schema, name, errors)  # pattern applies to the string form
            return value
        type_ok = {
            "object": isinstance(value, dict),
            "array": isinstance(value, list),
            "string": isinstance(value, str),
            "integer": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, (int, float)) and not isinstance(value, bool),
            "boolean": isinstance(value, bool),
        }
        if declared and not type_ok.get(declared, True):
            # validation.go kubeOpenAPIResultToFieldErrors: TypeInvalid, the value being the
            # JSON type found.
            errors.append(FieldError("TypeInvalid", name, f"{name} in body must be of type "
                                     f"{declared}: \"{_json_type(value)}\"", _json_type(value)))
            return value
        if "enum" in schema and value not in schema["enum"]:
            errors.append(not_supported(name, value, [json.dumps(e).strip('"')
                                                      for e in schema["enum"]]))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self._bounds(value, schema, name, errors)
        if isinstance(value, str):
            self._string(value, schema, name, errors)
        if isinstance(value, list):
            if "minItems" in schema and len(value) < schema["minItems"]:
                errors.append(invalid_value(name, len(value), f"{name} in body should have at "
                                            f"least {schema['minItems']} items"))
            if "maxItems" in schema and len(value) > schema["maxItems"]:
                errors.append(FieldError("TooMany", name, f"must have at most "
                                         f"{schema['maxItems']} items", len(value)))
            items = schema.get("items")
            if isinstance(items, dict):
                walked = [self._walk(v, items, f"{path}[{i}]", walk, errors,
                                     _old_item(v, schema, old))
                          for i, v in enumerate(value) if v is not None or items.get("nullable")]
            else:
                walked = copy.deepcopy(value)
            walk.list_errors.extend(_list_type_errors(walked, schema, name))
            return walked
        if isinstance(value, dict):
            return self._object(value, schema, path, walk, errors, old, root=root)
        return value

    def _object(self, value: dict[str, Any], schema: dict[str, Any], path: str, walk: _Walk,
                errors: list[FieldError], old: Any, *, root: bool) -> dict[str, Any]:
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        embedded = bool(schema.get("x-kubernetes-embedded-resource"))
        out: dict[str, Any] = {}
        # Defaults first, then the walk, which defaults inside defaulted values too
        # (structuraldefaulting.Default: `scaleUp: {}` gets its children's defaults).
        value = dict(value)
        for key, child_schema in (properties or {}).items():
            if value.get(key) is None and "default" in child_schema and not (
                    key in value and child_schema.get("nullable")):
                value[key] = copy.deepcopy(child_schema["default"])
        for key, child in value.items():
            child_path = f"{path}.{key}" if path else key
            if embedded and key in ("apiVersion", "kind", "metadata"):
                out[key] = copy.deepcopy(child)
                continue
            if properties is not None and key in properties:
                child_schema = properties[key]
            elif isinstance(extra, dict):
                child_schema = extra
            elif preserve or extra is True:
                out[key] = copy.deepcopy(child)
                continue
            else:
                walk.unknown.append(child_path)
                continue
            if child is None and not child_schema.get("nullable"):
                continue
            old_child = old[key] if isinstance(old, dict) and key in old else _UNCORRELATED
            out[key] = (None if child is None else
                        self._walk(child, child_schema, child_path, walk, errors, old_child))
        for key in schema.get("required") or []:
            if key not in out:
                errors.append(required_value(f"{path}.{key}" if path else key))
        if "minProperties" in schema and len(out) < schema["minProperties"]:
            errors.append(invalid_value(path or "<root>", len(out),
                          f"{path} in body should have at least {schema['minProperties']} "
                          "properties"))
        return out

    @staticmethod
    def _bounds(value: float, schema: dict[str, Any], name: str,
                errors: list[FieldError]) -> None:
        if "minimum" in schema:
            low = schema["minimum"]
            if value < low or (schema.get("exclusiveMinimum") is True and value == low):
                relation = "greater than" if schema.get("exclusiveMinimum") else \
                    "greater than or equal to"
                errors.append(invalid_value(name, value, f"{name} in body should be "
                                                         f"{relation} {low}"))
        if "maximum" in schema:
            high = schema["maximum"]
            if value > high or (schema.get("exclusiveMaximum") is True and value == high):
                relation = "less than" if schema.get("exclusiveMaximum") else \
                    "less than or equal to"
                errors.append(invalid_value(name, value, f"{name} in body should be "
                                                         f"{relation} {high}"))

    @staticmethod
    def _string(value: str, schema: dict[str, Any], name: str,
                errors: list[FieldError]) -> None:
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(FieldError("TooLong", name,
                                     f"may not be more than {schema['maxLength']} bytes", value))
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(invalid_value(name, value, f"{name} in body should be at least "
                                                     f"{schema['minLength']} chars long"))
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            errors.append(invalid_value(name, value, f"{name} in body should match "
                                                     f"'{schema['pattern']}'"))
        if schema.get("format") == "date-time" and not _DATE_TIME.match(value):
            errors.append(invalid_value(name, value, f"{name} in body must be of type "
                                                     f'date-time: "{value}"'))


_UNCORRELATED: Any = object()  # no old value to ratchet against


@dataclass
class _Walk:
    """What one decode collects besides the validation errors."""

    unknown: list[str]
    list_errors: list[FieldError]  # listtype.ValidateListSetsAndMaps, ratcheted as a whole


def _old_item(item: Any, schema: dict[str, Any], old: Any) -> Any:
    """The old item correlated with `item`: by key in a map list, by value in a set."""
    if not isinstance(old, list):
        return _UNCORRELATED
    list_type = schema.get("x-kubernetes-list-type")
    if list_type == "map" and isinstance(item, dict):
        keys = schema.get("x-kubernetes-list-map-keys") or []
        wanted = [item.get(k) for k in keys]
        return next((o for o in old if isinstance(o, dict) and [o.get(k) for k in keys] ==
                     wanted), _UNCORRELATED)
    if list_type == "set" and item in old:
        return item
    return _UNCORRELATED


# strfmt's date-time layouts: RFC 3339 with or without a fraction, with a zone, `T` or a space.
_DATE_TIME = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})?$")


def _list_type_errors(items: list[Any], schema: dict[str, Any], name: str) -> list[FieldError]:
    """listtype.ValidateListSetsAndMaps: sets hold unique items, maps unique keys."""
    list_type = schema.get("x-kubernetes-list-type")
    if list_type not in ("set", "map") or len(items) <= 1:
        return []
    if list_type == "map":
        for index, item in enumerate(items):
            if item is not None and not isinstance(item, dict):
                return [invalid_value(f"{name}[{index}]", item,
                                      "must be an object for an array of list-type map")]
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen_keys: dict[str, int] = {}
        problems = []
        for index, item in enumerate(items):
            key = {k: item[k] for k in keys if isinstance(item, dict) and k in item}
            text = json.dumps(key, sort_keys=True)
            seen_keys[text] = seen_keys.get(text, 0) + 1
            if seen_keys[text] == 2:
                problems.append(duplicate(f"{name}[{index}]", go_map_literal(key)))
        return problems
    seen: dict[str, int] = {}
    problems = []
    for index, item in enumerate(items):
        text = json.dumps(item, sort_keys=True)
        seen[text] = seen.get(text, 0) + 1
        if seen[text] == 2:
            problems.append(duplicate(f"{name}[{index}]", item))
    return problems
