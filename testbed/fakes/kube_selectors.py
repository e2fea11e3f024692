"""Label and field selectors with apimachinery's grammar, matching rules and string forms."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FieldRequirement",
    "LabelRequirement",
    "SelectorError",
    "format_label_selector",
    "label_selector_from_object",
    "labels_match",
    "parse_field_selector",
    "parse_label_selector",
]


class SelectorError(ValueError):
    """A selector string or LabelSelector object that apimachinery would reject."""


_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME_MESSAGE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_LABEL_VALUE_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


def label_key_errors(key: str) -> list[str]:
    """content.IsLabelKey / IsQualifiedName."""
    prefix, slash, name = key.rpartition("/")
    errors: list[str] = []
    if slash and not prefix:
        errors.append("prefix part must be non-empty")
    elif prefix:
        if len(prefix) > 253:
            errors.append("prefix part must be no more than 253 bytes")
        if not _DNS_SUBDOMAIN.match(prefix):
            errors.append("prefix part a lowercase RFC 1123 subdomain must consist of lower case "
                          "alphanumeric characters, '-' or '.', and must start and end with an "
                          "alphanumeric character")
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 bytes")
    elif not _LABEL_NAME.match(name):
        errors.append(_QUALIFIED_NAME_MESSAGE)
    return errors


def label_value_errors(value: str) -> list[str]:
    errors: list[str] = []
    if len(value) > 63:
        errors.append("must be no more than 63 bytes")
    if value and not _LABEL_NAME.match(value):
        errors.append(_LABEL_VALUE_MESSAGE)
    return errors


@dataclass(frozen=True)
class LabelRequirement:
    """labels.Requirement: operator is one of = == != in notin exists ! gt lt."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        if self.operator in ("=", "==", "in"):
            return present and value in self.values
        if self.operator in ("!=", "notin"):
            return not present or value not in self.values
        if self.operator == "exists":
            return present
        if self.operator == "!":
            return not present
        if self.operator in ("gt", "lt"):
            if not present:
                return False
            try:
                have, want = int(value), int(self.values[0])
            except ValueError:
                return False
            return have > want if self.operator == "gt" else have < want
        return False

    def __str__(self) -> str:
        if self.operator == "!":
            return f"!{self.key}"
        if self.operator == "exists":
            return self.key
        rendered = ",".join(sorted(self.values)) if len(self.values) > 1 else self.values[0]
        symbol = {"=": "=", "==": "==", "!=": "!=", "gt": ">", "lt": "<"}.get(self.operator)
        if symbol is not None:
            return f"{self.key}{symbol}{rendered}"
        return f"{self.key} {self.operator} ({rendered})"


def _new_requirement(key: str, operator: str, values: Sequence[str]) -> LabelRequirement:
    problems: list[str] = []
    key_problems = label_key_errors(key)
    if key_problems:
        problems.append(f'key: Invalid value: "{key}": {"; ".join(key_problems)}')
    if operator in ("in", "notin") and not values:
        problems.append("values: Invalid value: []: for 'in', 'notin' operators, values set "
                        "can't be empty")
    if operator in ("gt", "lt"):
        for value in values:
            if not re.fullmatch(r"[+-]?[0-9]+", value):
                problems.append(f'values[0]: Invalid value: "{value}": for \'Gt\', \'Lt\' '
                                "operators, the value must be an integer")
    for value in values:
        value_problems = label_value_errors(value)
        if value_problems:
            problems.append(f'values[{key}]: Invalid value: "{value}": '
                            + "; ".join(value_problems))
    if problems:
        joined = problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
        raise SelectorError(joined)
    return LabelRequirement(key, operator, tuple(values))


_SPECIAL = set("=!(),><")
_WHITESPACE = set(" \t\r\n")
_OPERATOR_TOKENS = {"==", "=", "!=", "!", "(", ")", ",", ">", "<"}


def _lex(text: str) -> list[tuple[str, str]]:
    """Tokens as (kind, literal); kind is the literal for operators, 'id' or 'end'."""
    tokens: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        if i >= n:
            tokens.append(("end", ""))
            return tokens
        if text[i] in _SPECIAL:
            # Longest run of special symbols that is still an operator token.
            best, j, buffer = "", i, ""
            while j < n and text[j] in _SPECIAL:
                buffer += text[j]
                if buffer in _OPERATOR_TOKENS:
                    best = buffer
                elif best:
                    break
                j += 1
            if not best:
                raise SelectorError(f"unable to parse requirement: found '{buffer}', "
                                    "expected: keyword")
            tokens.append((best, best))
            i += len(best)
            continue
        j = i
        while j < n and text[j] not in _SPECIAL and text[j] not in _WHITESPACE:
            j += 1
        word = text[i:j]
        tokens.append((word if word in ("in", "notin") else "id", word))
        i = j


class _LabelParser:
    def __init__(self, text: str) -> None:
        self.tokens = _lex(text)
        self.position = 0

    def _peek(self, values: bool) -> tuple[str, str]:
        kind, literal = self.tokens[self.position]
        if values and kind in ("in", "notin"):
            kind = "id"
        return kind, literal

    def _next(self, values: bool) -> tuple[str, str]:
        token = self._peek(values)
        self.position += 1
        return token

    def parse(self) -> list[LabelRequirement]:
        requirements: list[LabelRequirement] = []
        while True:
            kind, literal = self._peek(True)
            if kind == "end":
                return requirements
            if kind not in ("id", "!"):
                raise SelectorError(f"found '{literal}', expected: !, identifier, or "
                                    "'end of string'")
            try:
                requirements.append(self._requirement())
            except SelectorError as error:
                raise SelectorError(f"unable to parse requirement: {error}") from None
            kind, literal = self._next(True)
            if kind == "end":
                return requirements
            if kind != ",":
                raise SelectorError(f"found '{literal}', expected: ',' or 'end of string'")
            following, literal = self._peek(True)
            if following not in ("id", "!"):
                raise SelectorError(f"found '{literal}', expected: identifier after ','")

    def _requirement(self) -> LabelRequirement:
        operator = ""
        kind, literal = self._next(True)
        if kind == "!":
            operator = "!"
            kind, literal = self._next(True)
        if kind != "id":
            raise SelectorError(f"found '{literal}', expected: identifier")
        key = literal
        key_problems = label_key_errors(key)
        if key_problems:
            raise SelectorError(f'Invalid value: "{key}": ' + "; ".join(key_problems))
        following, _ = self._peek(True)
        if operator == "!" or following in ("end", ","):
            # `!key=x` is `!key` followed by a stray `=`: the caller reports it, as Go does.
            return _new_requirement(key, operator or "exists", ())
        kind, literal = self._next(False)
        operators = {"in": "in", "notin": "notin", "=": "=", "==": "==", "!=": "!=",
                     ">": "gt", "<": "lt"}
        if kind not in operators:
            raise SelectorError(f"found '{literal}', expected: in, notin, =, ==, !=, gt, lt")
        operator = operators[kind]
        values = self._set_values() if operator in ("in", "notin") else self._exact_value()
        return _new_requirement(key, operator, sorted(values))

    def _set_values(self) -> set[str]:
        kind, literal = self._next(True)
        if kind != "(":
            raise SelectorError(f"found '{literal}' expected: '('")
        kind, literal = self._peek(True)
        if kind == ")":
            self._next(True)
            return {""}
        if kind not in ("id", ","):
            raise SelectorError(f"found '{literal}', expected: ',', ')' or identifier")
        values: set[str] = set()
        while True:
            kind, literal = self._next(True)
            if kind == "id":
                values.add(literal)
                following, literal2 = self._peek(True)
                if following == ",":
                    continue
                if following == ")":
                    self._next(True)
                    return values
                raise SelectorError(f"found '{literal2}', expected: ',' or ')'")
            if kind == ",":
                if not values:
                    values.add("")
                following, _ = self._peek(True)
                if following == ")":
                    values.add("")
                    self._next(True)
                    return values
                if following == ",":
                    values.add("")
                continue
            raise SelectorError(f"found '{literal}', expected: ',', or identifier")

    def _exact_value(self) -> set[str]:
        kind, literal = self._peek(True)
        if kind in ("end", ","):
            return {""}
        kind, literal = self._next(True)
        if kind == "id":
            return {literal}
        raise SelectorError(f"found '{literal}', expected: identifier")


def parse_label_selector(text: str) -> tuple[LabelRequirement, ...]:
    """labels.Parse: requirements sorted by key (stable), as the Go parser returns them."""
    requirements = _LabelParser(text).parse()
    return tuple(sorted(requirements, key=lambda r: r.key))


def labels_match(requirements: Sequence[LabelRequirement], labels: Mapping[str, str]) -> bool:
    return all(r.matches(labels) for r in requirements)


def format_label_selector(requirements: Sequence[LabelRequirement]) -> str:
    return ",".join(str(r) for r in requirements)


_EXPRESSION_OPERATORS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}


def label_selector_from_object(selector: Mapping[str, Any] | None
                               ) -> tuple[LabelRequirement, ...] | None:
    """metav1.LabelSelectorAsSelector; None means labels.Nothing() (a nil selector)."""
    if selector is None:
        return None
    requirements: list[LabelRequirement] = []
    for key, value in sorted((selector.get("matchLabels") or {}).items()):
        requirements.append(_new_requirement(key, "=", (value,)))
    for expression in selector.get("matchExpressions") or []:
        operator = _EXPRESSION_OPERATORS.get(expression.get("operator", ""))
        if operator is None:
            raise SelectorError(f'"{expression.get("operator", "")}" is not a valid label '
                                "selector operator")
        values = tuple(expression.get("values") or ())
        requirements.append(_new_requirement(expression.get("key", ""), operator, values))
    return tuple(sorted(requirements, key=lambda r: r.key))


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    operator: str  # "=", "==" or "!="
    value: str

    def matches(self, fields: Mapping[str, str]) -> bool:
        have = fields.get(self.field)
        if self.operator == "!=":
            return have != self.value
        return have == self.value


def _split_unescaped(text: str, separator: str) -> list[str]:
    parts, current, escaped = [], "", False
    for char in text:
        if escaped:
            current += char
            escaped = False
        elif char == "\\":
            current += char
            escaped = True
        elif char == separator:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return parts


def _unescape_field_value(text: str, selector: str) -> str:
    out, i = "", 0
    while i < len(text):
        if text[i] == "\\":
            if i + 1 >= len(text) or text[i + 1] not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence: {selector}")
            out += text[i + 1]
            i += 2
        else:
            out += text[i]
            i += 1
    return out


def parse_field_selector(text: str) -> tuple[FieldRequirement, ...]:
    """fields.ParseSelector: `a=b,c!=d`, with `\\,`, `\\=` and `\\\\` escapes in values."""
    requirements: list[FieldRequirement] = []
    if not text.strip():
        return ()
    for term in _split_unescaped(text, ","):
        if not term:
            continue
        found: tuple[int, str] | None = None
        i = 0
        while i < len(term):
            if term[i] == "\\":
                i += 2
                continue
            for operator in ("!=", "==", "="):
                if term.startswith(operator, i):
                    found = (i, operator)
                    break
            if found:
                break
            i += 1
        if found is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
        index, operator = found
        requirements.append(FieldRequirement(
            term[:index], operator, _unescape_field_value(term[index + len(operator):], text)))
    return tuple(requirements)


FieldsOf = Callable[[Mapping[str, Any]], dict[str, str]]
