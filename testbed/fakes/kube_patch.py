"""The three PATCH formats kube-apiserver accepts: JSON merge, JSON patch and strategic merge."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any, Protocol

__all__ = [
    "PatchError",
    "PatchSchema",
    "apply_json_patch",
    "apply_merge_patch",
    "apply_strategic_merge_patch",
]


class PatchError(ValueError):
    """A patch that cannot be applied; `code` is the HTTP status the apiserver answers with."""

    def __init__(self, message: str, *, code: int = 422) -> None:
        super().__init__(message)
        self.code = code


class PatchSchema(Protocol):
    """What strategic merge needs to know about one node of the object's schema."""

    def field(self, name: str) -> PatchSchema | None: ...

    def elements(self) -> PatchSchema | None: ...

    @property
    def patch_strategy(self) -> str: ...

    @property
    def merge_key(self) -> str | None: ...


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: null deletes, objects merge, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f'JSON pointer "{path}" must start with "/"', code=422)
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(document: Any, parts: list[str], op: str, path: str) -> Any:
    node = document
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(f"{op} operation does not apply: doc is missing path: \"{path}\"")
    return node


def _index(node: list[Any], part: str, *, op: str, path: str, allow_end: bool) -> int:
    if part == "-" and allow_end:
        return len(node)
    if not part.isdigit() or (len(part) > 1 and part.startswith("0")):
        raise PatchError(f"{op} operation does not apply: invalid array index: \"{path}\"")
    index = int(part)
    limit = len(node) if allow_end else len(node) - 1
    if index > limit:
        raise PatchError(f"{op} operation does not apply: index out of bounds: \"{path}\"")
    return index


def _get(document: Any, path: str, op: str) -> Any:
    node = document
    for part in _pointer(path):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list):
            node = node[_index(node, part, op=op, path=path, allow_end=False)]
        else:
            raise PatchError(f"{op} operation does not apply: doc is missing key: \"{path}\"")
    return node


def _add(document: Any, path: str, value: Any, op: str = "add") -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(document, parts, op, path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, op=op, path=path, allow_end=True), value)
    else:
        raise PatchError(f"{op} operation does not apply: doc is missing path: \"{path}\"")
    return document


def _remove(document: Any, path: str, op: str = "remove") -> tuple[Any, Any]:
    parts = _pointer(path)
    if not parts:
        raise PatchError(f"{op} operation does not apply: cannot remove the root")
    parent = _parent(document, parts, op, path)
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"{op} operation does not apply: doc is missing key: \"{path}\"")
        return document, parent.pop(last)
    if isinstance(parent, list):
        return document, parent.pop(_index(parent, last, op=op, path=path, allow_end=False))
    raise PatchError(f"{op} operation does not apply: doc is missing path: \"{path}\"")


def apply_json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch (evanphx/json-patch semantics and messages, approximately)."""
    if not isinstance(operations, list):
        raise PatchError("json: cannot unmarshal object into Go value of type jsonpatch.Patch",
                         code=400)
    document = copy.deepcopy(target)
    for operation in operations:
        if not isinstance(operation, dict):
            raise PatchError("json: cannot unmarshal into Go value of type jsonpatch.Operation",
                             code=400)
        op = operation.get("op")
        path = operation.get("path")
        if not isinstance(path, str):
            raise PatchError(f"{op} operation does not apply: missing path")
        if op in ("add", "replace", "test") and "value" not in operation:
            raise PatchError(f"{op} operation does not apply: missing value")
        value = copy.deepcopy(operation.get("value"))
        if op == "add":
            document = _add(document, path, value)
        elif op == "remove":
            document, _ = _remove(document, path)
        elif op == "replace":
            _get(document, path, "replace")
            if _pointer(path):
                document, _ = _remove(document, path, "replace")
            document = _add(document, path, value, "replace")
        elif op in ("move", "copy"):
            source = operation.get("from")
            if not isinstance(source, str):
                raise PatchError(f"{op} operation does not apply: missing from path")
            if op == "move":
                document, moved = _remove(document, source, "move")
            else:
                moved = copy.deepcopy(_get(document, source, "copy"))
            document = _add(document, path, moved, op)
        elif op == "test":
            try:
                have = _get(document, path, "test")
            except PatchError:
                have = None
            if json.dumps(have, sort_keys=True) != json.dumps(value, sort_keys=True):
                raise PatchError(f"testing value {path} failed: test failed")
        else:
            raise PatchError(f"Unexpected kind: {op}")
    return document


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value
                if not (isinstance(v, dict) and set(v) == {"$patch"})]
    return value


def apply_strategic_merge_patch(target: dict[str, Any], patch: Any,
                                schema: PatchSchema | None) -> dict[str, Any]:
    """Strategic merge patch driven by the type's patchStrategy/patchMergeKey annotations."""
    if not isinstance(patch, dict):
        raise PatchError("unable to find api field in struct for the patch: patch is not an "
                         "object", code=400)
    return _merge_map(copy.deepcopy(target), patch, schema)


def _strategy(schema: PatchSchema | None) -> set[str]:
    if schema is None or not schema.patch_strategy:
        return set()
    return set(schema.patch_strategy.split(","))


def _merge_map(original: dict[str, Any], patch: dict[str, Any],
               schema: PatchSchema | None) -> dict[str, Any]:
    patch = dict(patch)
    directive = patch.pop("$patch", None)
    if directive == "replace":
        return _strip_directives(patch)  # type: ignore[no-any-return]
    if directive == "delete":
        return {}
    if directive not in (None, "merge"):
        raise PatchError(f"Unknown patch type: {directive}", code=400)
    result = dict(original)
    retain = patch.pop("$retainKeys", None)
    if retain is not None:
        if not isinstance(retain, list):
            raise PatchError("invalid patch: $retainKeys must be a list", code=400)
        result = {k: v for k, v in result.items() if k in retain}
    orders: dict[str, list[Any]] = {}
    for key in list(patch):
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            drop = patch.pop(key) or []
            if isinstance(result.get(name), list):
                result[name] = [v for v in result[name] if v not in drop]
        elif key.startswith("$setElementOrder/"):
            orders[key.split("/", 1)[1]] = patch.pop(key) or []
    for key, value in patch.items():
        child = schema.field(key) if schema is not None else None
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            if value.get("$patch") == "delete":
                result.pop(key, None)
            elif isinstance(result.get(key), dict) and "replace" not in _strategy(child):
                result[key] = _merge_map(result[key], value, child)
            else:
                result[key] = _merge_map({}, value, child)
        elif isinstance(value, list):
            if "merge" in _strategy(child) and isinstance(result.get(key), list):
                result[key] = _merge_list(result[key], value, child)
            elif value and any(isinstance(v, dict) and v.get("$patch") == "replace"
                               for v in value):
                result[key] = _strip_directives(value)
            else:
                result[key] = _strip_directives(value)
        else:
            result[key] = value
    for name, order in orders.items():
        if isinstance(result.get(name), list):
            child = schema.field(name) if schema is not None else None
            result[name] = _apply_order(result[name], order, child.merge_key if child else None)
    return result


def _merge_list(original: list[Any], patch: list[Any], schema: PatchSchema | None) -> list[Any]:
    if any(isinstance(v, dict) and v.get("$patch") == "replace" for v in patch):
        return [_strip_directives(v) for v in patch
                if not (isinstance(v, dict) and v.get("$patch") == "replace")]
    merge_key = schema.merge_key if schema is not None else None
    elements = schema.elements() if schema is not None else None
    if merge_key is None:
        merged = list(original)
        for value in patch:
            if value not in merged:
                merged.append(_strip_directives(value))
        return merged
    result = list(original)
    for element in patch:
        if not isinstance(element, dict):
            raise PatchError(f"{element!r} is not a map: cannot merge with merge key {merge_key}",
                             code=400)
        if merge_key not in element:
            raise PatchError(f"map: {element} does not contain declared merge key: {merge_key}",
                             code=500)
        wanted = element[merge_key]
        position = next((i for i, v in enumerate(result)
                         if isinstance(v, dict) and v.get(merge_key) == wanted), None)
        if element.get("$patch") == "delete":
            result = [v for v in result if not (isinstance(v, dict) and v.get(merge_key) == wanted)]
        elif position is None:
            result.append(_merge_map({}, element, elements))
        else:
            result[position] = _merge_map(result[position], element, elements)
    return result


def _apply_order(values: list[Any], order: Sequence[Any], merge_key: str | None) -> list[Any]:
    def identity(value: Any) -> Any:
        if merge_key is not None and isinstance(value, dict):
            return json.dumps(value.get(merge_key), sort_keys=True)
        return json.dumps(value, sort_keys=True)

    wanted = [identity(o) for o in order]
    ordered = sorted((v for v in values if identity(v) in wanted),
                     key=lambda v: wanted.index(identity(v)))
    rest = [v for v in values if identity(v) not in wanted]
    return ordered + rest
