"""YAML nodes to checked values, strictly as go-yaml v2's `UnmarshalStrict` decodes them:
unknown and duplicate keys and wrong types are issues with their field path and line."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import yaml

from adapter.rules.config.values import ConfigIssue
from metricscale.core.selectors import quote_go_string

_TAG_PREFIX = "tag:yaml.org,2002:"
_MERGE = _TAG_PREFIX + "merge"
_NULL = _TAG_PREFIX + "null"
_TRUE = frozenset({"y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"})
_FALSE = frozenset({"n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"})


def _short_tag(node: yaml.Node) -> str:
    tag = str(node.tag)
    return "!!" + tag[len(_TAG_PREFIX):] if tag.startswith(_TAG_PREFIX) else tag


def _child_path(path: str, key: str) -> str:
    """`a.b` for plain keys, `a["x.y"]` for keys a dot would make ambiguous."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{path}[{quote_go_string(key)}]"
    return f"{path}.{key}" if path else key


def _mapping_value(node: yaml.Node, key: str) -> yaml.Node | None:
    """The value of a plain key of a mapping node, without checks (for cross-references)."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                return value_node  # type: ignore[no-any-return]
    return None


def _is_null(node: yaml.Node | None) -> bool:
    return node is None or (isinstance(node, yaml.ScalarNode) and node.tag == _NULL)


class _Decoder:
    def __init__(self) -> None:
        self.issues: list[ConfigIssue] = []

    def issue(self, path: str, message: str, node: yaml.Node | None) -> None:
        line = None if node is None else node.start_mark.line + 1
        self.issues.append(ConfigIssue(path, message, line))

    def type_error(self, path: str, node: yaml.Node, go_type: str) -> None:
        shown = _short_tag(node)
        if isinstance(node, yaml.ScalarNode):
            shown += f" `{node.value}`"
        self.issue(path, f"cannot unmarshal {shown} into {go_type}", node)

    def mapping(self, node: yaml.Node | None, path: str, go_type: str,
                fields: Sequence[str] | None) -> dict[str, yaml.Node] | None:
        """Keys → value nodes; `fields=None` accepts any key (a Go map)."""
        if _is_null(node):
            return {}
        assert node is not None
        if not isinstance(node, yaml.MappingNode):
            self.type_error(path, node, go_type)
            return None
        result: dict[str, yaml.Node] = {}
        seen: set[str] = set()
        for key_node, value_node in self._pairs(node):
            if not isinstance(key_node, yaml.ScalarNode):
                self.type_error(path, key_node, "string")
                continue
            key = "" if key_node.tag == _NULL else str(key_node.value)
            child = _child_path(path, key)
            if key in seen:
                self.issue(child, f"key {quote_go_string(key)} already set in map", key_node)
                continue
            seen.add(key)
            if fields is not None and key not in fields:
                self.issue(child, f"field {key} not found in type {go_type}", key_node)
                continue
            result[key] = value_node
        return result

    def _pairs(self, node: yaml.MappingNode) -> Iterator[tuple[yaml.Node, yaml.Node]]:
        """Key/value pairs with YAML merge keys (`<<: *base`) applied underneath."""
        explicit = [(k, v) for k, v in node.value if k.tag != _MERGE]
        merged: list[tuple[yaml.Node, yaml.Node]] = []
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE:
                continue
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) \
                else [value_node]
            for source in sources:
                if isinstance(source, yaml.MappingNode):
                    merged.extend(self._pairs(source))
        explicit_keys = {k.value for k, _ in explicit if isinstance(k, yaml.ScalarNode)}
        seen: set[str] = set()
        for key_node, value_node in merged:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value not in explicit_keys \
                    and key_node.value not in seen:
                seen.add(key_node.value)
                yield key_node, value_node
        yield from explicit

    def sequence(self, node: yaml.Node | None, path: str, go_type: str) -> list[yaml.Node]:
        if _is_null(node):
            return []
        assert node is not None
        if not isinstance(node, yaml.SequenceNode):
            self.type_error(path, node, go_type)
            return []
        return list(node.value)

    def string(self, node: yaml.Node | None, path: str) -> str:
        if _is_null(node):
            return ""
        assert node is not None
        if not isinstance(node, yaml.ScalarNode):
            self.type_error(path, node, "string")
            return ""
        return str(node.value)

    def boolean(self, node: yaml.Node | None, path: str) -> bool | None:
        if _is_null(node):
            return None
        assert node is not None
        if isinstance(node, yaml.ScalarNode) and node.tag in (_TAG_PREFIX + "bool",
                                                                _TAG_PREFIX + "str"):
            if node.value in _TRUE and (node.tag.endswith("bool") or node.style is None):
                return True
            if node.value in _FALSE and (node.tag.endswith("bool") or node.style is None):
                return False
        self.type_error(path, node, "bool")
        return None
