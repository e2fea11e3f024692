"""Kubernetes label selectors: upstream grammar and error texts, matching, metav1.LabelSelector.

The parser follows `k8s.io/apimachinery/pkg/labels` (lexer, parser, `NewRequirement` validation)
closely enough that a selector string means the same thing here as in a Go client or server,
and a bad one is rejected with the same words. `Selector.__str__` is Go's `String()`:
requirements sorted by key (stable), values sorted.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = [
    "LabelSelector",
    "LabelSelectorRequirement",
    "Operator",
    "Requirement",
    "Selector",
    "SelectorError",
    "format_label_selector",
    "label_key_errors",
    "label_selector_from_json",
    "label_selector_json",
    "label_value_errors",
    "new_requirement",
    "parse_selector",
    "quote_go_string",
    "render_label_selector",
    "selector_from_label_selector",
    "selector_from_set",
]


class SelectorError(ValueError):
    """A selector string or LabelSelector object that is not valid; the message is upstream's."""


class Operator(Enum):
    """`selection.Operator`; the values are Go's strings (they appear in error messages)."""

    DOES_NOT_EXIST = "!"
    EQUALS = "="
    DOUBLE_EQUALS = "=="
    IN = "in"
    NOT_EQUALS = "!="
    NOT_IN = "notin"
    EXISTS = "exists"
    GREATER_THAN = "gt"
    LESS_THAN = "lt"


# The order Go lists them in `found '…', expected: in, notin, =, ==, !=, gt, lt`.
_BINARY_OPERATORS = (
    Operator.IN, Operator.NOT_IN, Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.NOT_EQUALS,
    Operator.GREATER_THAN, Operator.LESS_THAN,
)


# --- Go string quoting ----------------------------------------------------------------------------

_GO_ESCAPES = {
    "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
    '"': '\\"', "\\": "\\\\",
}


# Printable ASCII without `"` or `\\`: Go quotes it verbatim. Most label values, object names and
# whole `.LabelMatchers` strings are like this, and the per-character loop below costs ~40 µs on a
# 100-pod matcher (several per request).
_GO_VERBATIM = re.compile(r'[ !#-\[\]-~]*')


def quote_go_string(text: str) -> str:
    """Go's `strconv.Quote` (`%q`): also a valid PromQL double-quoted string for any text.

    Shared here because selector error texts and PromQL label matchers both need it.
    """
    if _GO_VERBATIM.fullmatch(text) is not None:
        return f'"{text}"'
    out = ['"']
    for char in text:
        escaped = _GO_ESCAPES.get(char)
        if escaped is not None:
            out.append(escaped)
            continue
        code = ord(char)
        # Go's IsPrint and Python's isprintable agree: letters, marks, numbers, punctuation,
        # symbols and the ASCII space. U+FFFD is the one printable rune written escaped (Go
        # writes it as is): Prometheus's lexer rejects a literal one as "invalid UTF-8 rune".
        if char.isprintable() and code != 0xFFFD:
            out.append(char)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\\ufffd")  # not a valid rune: Go writes the replacement character
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


# --- validation (k8s.io/apimachinery/pkg/api/validate/content) -----------------------------------

_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE_FMT = "(" + _QUALIFIED_NAME_FMT + ")?"
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS1123_SUBDOMAIN_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_NAME_MSG = ("must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
             "with an alphanumeric character")
_VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, "
              "'-', '_' or '.', and must start and end with an alphanumeric character")
_SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                  "characters, '-' or '.', and must start and end with an alphanumeric character")


def _regex_error(message: str, regex: str, *examples: str) -> str:
    shown = " or ".join(f"'{example}', " for example in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{regex}')"


def _max_len_error(length: int) -> str:
    return f"must be no more than {length} bytes"


def label_key_errors(key: str) -> list[str]:
    """`content.IsLabelKey`: an optional DNS-subdomain prefix and `/`, then a 63-byte name."""
    errors: list[str] = []
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            if len(prefix.encode()) > 253:
                errors.append("prefix part " + _max_len_error(253))
            if not _DNS1123_SUBDOMAIN.fullmatch(prefix):
                errors.append("prefix part " + _regex_error(
                    _SUBDOMAIN_MSG, _DNS1123_SUBDOMAIN_FMT, "example.com"))
    else:
        return [
            "a valid label key " + _regex_error(_NAME_MSG, _QUALIFIED_NAME_FMT,
                                                "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errors.append("name part must be non-empty")
    elif len(name.encode()) > 63:
        errors.append("name part " + _max_len_error(63))
    if not _QUALIFIED_NAME.fullmatch(name):
        errors.append("name part " + _regex_error(_NAME_MSG, _QUALIFIED_NAME_FMT,
                                                  "MyName", "my.name", "123-abc"))
    return errors


def label_value_errors(value: str) -> list[str]:
    """`content.IsLabelValue`: empty, or up to 63 bytes of `[A-Za-z0-9._-]`, alphanumeric ends."""
    errors: list[str] = []
    if len(value.encode()) > 63:
        errors.append(_max_len_error(63))
    if value and not _QUALIFIED_NAME.fullmatch(value):
        errors.append(_regex_error(_VALUE_MSG, _LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return errors


def _field_invalid(path: str, *, value: str, detail: str) -> str:
    """`field.Invalid(path, value, detail).Error()`."""
    return f"{path}: Invalid value: {quote_go_string(value)}: {detail}"


def _aggregate(messages: Sequence[str]) -> str:
    """`utilerrors.NewAggregate(...).Error()`: one message as is, several as `[a, b]`."""
    unique = list(dict.fromkeys(messages))
    return unique[0] if len(unique) == 1 else "[" + ", ".join(unique) + "]"


_INT64 = re.compile(r"[+-]?[0-9]+")


def _parse_int64(text: str) -> int | None:
    if not _INT64.fullmatch(text):
        return None
    number = int(text)
    return number if -(2**63) <= number < 2**63 else None


# --- requirements and selectors -------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """One `key op values` term. Build it with `new_requirement` (which validates)."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """`Requirement.Matches`."""
        op = self.operator
        if op in (Operator.IN, Operator.EQUALS, Operator.DOUBLE_EQUALS):
            return self.key in labels and labels[self.key] in self.values
        if op in (Operator.NOT_IN, Operator.NOT_EQUALS):
            return self.key not in labels or labels[self.key] not in self.values
        if op is Operator.EXISTS:
            return self.key in labels
        if op is Operator.DOES_NOT_EXIST:
            return self.key not in labels
        # Gt / Lt: both sides must be int64; anything else never matches.
        if self.key not in labels or len(self.values) != 1:
            return False
        have = _parse_int64(labels[self.key])
        want = _parse_int64(self.values[0])
        if have is None or want is None:
            return False
        return have > want if op is Operator.GREATER_THAN else have < want

    def sorted_values(self) -> tuple[str, ...]:
        return tuple(sorted(self.values))

    def __str__(self) -> str:
        op = self.operator
        if op is Operator.EXISTS:
            return self.key
        if op is Operator.DOES_NOT_EXIST:
            return "!" + self.key
        symbol = {
            Operator.EQUALS: "=", Operator.DOUBLE_EQUALS: "==", Operator.NOT_EQUALS: "!=",
            Operator.IN: " in ", Operator.NOT_IN: " notin ", Operator.GREATER_THAN: ">",
            Operator.LESS_THAN: "<",
        }[op]
        values = self.values[0] if len(self.values) == 1 else ",".join(sorted(self.values))
        if op in (Operator.IN, Operator.NOT_IN):
            values = f"({values})"
        return f"{self.key}{symbol}{values}"


_EXACT = frozenset({Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.IN})


@dataclass(frozen=True)
class Selector:
    """An AND of requirements, sorted by key. `nothing=True` is `labels.Nothing()`."""

    requirements: tuple[Requirement, ...] = ()
    nothing: bool = field(default=False)

    @classmethod
    def everything(cls) -> Selector:
        return cls()

    @classmethod
    def match_nothing(cls) -> Selector:
        return cls(nothing=True)

    @classmethod
    def of(cls, requirements: Iterable[Requirement]) -> Selector:
        """A selector over these requirements, stably sorted by key as `Selector.Add` does."""
        return cls(tuple(sorted(requirements, key=lambda r: r.key)))

    def is_empty(self) -> bool:
        """`Empty()`: true when nothing is restricted (the nothing-selector is not empty)."""
        return not self.nothing and not self.requirements

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.nothing:
            return False
        for requirement in self.requirements:  # noqa: SIM110 - a hot loop; all() is slower
            if not requirement.matches(labels):
                return False
        return True

    def exact_labels(self) -> tuple[tuple[str, str], ...] | None:
        """The (key, value) pairs an object must all carry when every requirement is
        `key=value` (the common case), else None. Pairs, not a dict: `app=b,app=a` is two
        requirements that nothing meets, where a dict would keep only the last."""
        return self._exact_labels

    @functools.cached_property
    def _exact_labels(self) -> tuple[tuple[str, str], ...] | None:
        # Computed once per selector (selectors are immutable; parse_selector caches them).
        if self.nothing or any(r.operator not in _EXACT or len(r.values) != 1
                               for r in self.requirements):
            return None
        return tuple((r.key, r.values[0]) for r in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(requirement) for requirement in self.requirements)


def new_requirement(key: str, operator: Operator, values: Sequence[str],
                    *, path: str | None = None) -> Requirement:
    """`labels.NewRequirement`: validate and build, with upstream's aggregated error text.

    `path` is the field path the errors are reported under (None prints as Go's nil path).
    """
    errors: list[str] = []
    key_path = "key" if path is None else f"{path}.key"
    value_path = "values" if path is None else f"{path}.values"
    key_problems = label_key_errors(key)
    if key_problems:
        errors.append(_field_invalid(key_path, value=key, detail="; ".join(key_problems)))
    count = len(values)
    if operator in (Operator.IN, Operator.NOT_IN):
        if count == 0:
            errors.append(f"{value_path}: Invalid value: []string{{}}: for 'in', 'notin' "
                          "operators, values set can't be empty")
    elif operator in (Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.NOT_EQUALS):
        if count != 1:
            errors.append(f"{value_path}: Invalid value: {_go_string_slice(values)}: "
                          "exact-match compatibility requires one single value")
    elif operator in (Operator.EXISTS, Operator.DOES_NOT_EXIST):
        if count != 0:
            errors.append(f"{value_path}: Invalid value: {_go_string_slice(values)}: "
                          "values set must be empty for exists and does not exist")
    elif operator in (Operator.GREATER_THAN, Operator.LESS_THAN):
        if count != 1:
            errors.append(f"{value_path}: Invalid value: {_go_string_slice(values)}: "
                          "for 'Gt', 'Lt' operators, exactly one value is required")
        for index, value in enumerate(values):
            if _parse_int64(value) is None:
                errors.append(_field_invalid(f"{value_path}[{index}]", value=value,
                                             detail="for 'Gt', 'Lt' operators, the value "
                                                    "must be an integer"))
    for index, value in enumerate(values):
        value_problems = label_value_errors(value)
        if value_problems:
            errors.append(_field_invalid(f"{value_path}[{index}][{key}]", value=value,
                                         detail="; ".join(value_problems)))
    if errors:
        raise SelectorError(_aggregate(errors))
    return Requirement(key, operator, tuple(values))


def _go_string_slice(values: Sequence[str]) -> str:
    return "[]string{" + ", ".join(quote_go_string(v) for v in values) + "}"


# --- lexer and parser (labels.Parse) --------------------------------------------------------------


class _Token(Enum):
    ERROR = 0
    END = 1
    CLOSED_PAR = 2
    COMMA = 3
    DOES_NOT_EXIST = 4
    DOUBLE_EQUALS = 5
    EQUALS = 6
    GREATER_THAN = 7
    IDENTIFIER = 8
    IN = 9
    LESS_THAN = 10
    NOT_EQUALS = 11
    NOT_IN = 12
    OPEN_PAR = 13


_LITERAL_TOKENS = {
    ")": _Token.CLOSED_PAR, ",": _Token.COMMA, "!": _Token.DOES_NOT_EXIST,
    "==": _Token.DOUBLE_EQUALS, "=": _Token.EQUALS, ">": _Token.GREATER_THAN, "in": _Token.IN,
    "<": _Token.LESS_THAN, "!=": _Token.NOT_EQUALS, "notin": _Token.NOT_IN, "(": _Token.OPEN_PAR,
}
_SPECIAL = frozenset("=!(),><")
_WHITESPACE = frozenset(" \t\r\n")


def _lex(text: str) -> list[tuple[_Token, str]]:
    items: list[tuple[_Token, str]] = []
    pos = 0
    length = len(text)
    while True:
        while pos < length and text[pos] in _WHITESPACE:
            pos += 1
        if pos >= length:
            items.append((_Token.END, ""))
            return items
        if text[pos] in _SPECIAL:
            # Grow the operator while it stays a known token ("!" then "!=").
            buffer = ""
            last: tuple[_Token, str] | None = None
            while pos < length and text[pos] in _SPECIAL:
                candidate = buffer + text[pos]
                token = _LITERAL_TOKENS.get(candidate)
                if token is not None:
                    last = (token, candidate)
                elif last is not None:
                    break
                buffer = candidate
                pos += 1
            items.append(last if last is not None
                         else (_Token.ERROR, f"error expected: keyword found '{buffer}'"))
        else:
            start = pos
            while pos < length and text[pos] not in _SPECIAL and text[pos] not in _WHITESPACE:
                pos += 1
            word = text[start:pos]
            items.append((_LITERAL_TOKENS.get(word, _Token.IDENTIFIER), word))


class _Parser:
    def __init__(self, text: str) -> None:
        self.items = _lex(text)
        self.position = 0

    def _get(self, index: int, values_context: bool) -> tuple[_Token, str]:
        token, literal = self.items[index]
        # In a values context "in" and "notin" are plain words (`x in (in)`).
        if values_context and token in (_Token.IN, _Token.NOT_IN):
            token = _Token.IDENTIFIER
        return token, literal

    def lookahead(self, values_context: bool = True) -> tuple[_Token, str]:
        return self._get(self.position, values_context)

    def consume(self, values_context: bool = True) -> tuple[_Token, str]:
        self.position += 1
        return self._get(self.position - 1, values_context)

    def parse(self) -> list[Requirement]:
        requirements: list[Requirement] = []
        while True:
            token, literal = self.lookahead()
            if token in (_Token.IDENTIFIER, _Token.DOES_NOT_EXIST):
                try:
                    requirement = self.parse_requirement()
                except SelectorError as error:
                    raise SelectorError(f"unable to parse requirement: {error}") from None
                requirements.append(requirement)
                token, literal = self.consume()
                if token is _Token.END:
                    return requirements
                if token is _Token.COMMA:
                    after, after_literal = self.lookahead()
                    if after not in (_Token.IDENTIFIER, _Token.DOES_NOT_EXIST):
                        raise SelectorError(
                            f"found '{after_literal}', expected: identifier after ','")
                else:
                    raise SelectorError(
                        f"found '{literal}', expected: ',' or 'end of string'")
            elif token is _Token.END:
                return requirements
            else:
                raise SelectorError(
                    f"found '{literal}', expected: !, identifier, or 'end of string'")

    def parse_requirement(self) -> Requirement:
        key, operator = self.parse_key_and_infer_operator()
        if operator in (Operator.EXISTS, Operator.DOES_NOT_EXIST):
            return new_requirement(key, operator, ())
        operator = self.parse_operator()
        if operator in (Operator.IN, Operator.NOT_IN):
            values = self.parse_values()
        else:
            values = self.parse_exact_value()
        return new_requirement(key, operator, sorted(values))

    def parse_key_and_infer_operator(self) -> tuple[str, Operator | None]:
        operator: Operator | None = None
        token, literal = self.consume()
        if token is _Token.DOES_NOT_EXIST:
            operator = Operator.DOES_NOT_EXIST
            token, literal = self.consume()
        if token is not _Token.IDENTIFIER:
            raise SelectorError(f"found '{literal}', expected: identifier")
        problems = label_key_errors(literal)
        if problems:
            raise SelectorError(_field_invalid("<nil>", value=literal, detail="; ".join(problems)))
        following, _ = self.lookahead()
        if following in (_Token.END, _Token.COMMA) and operator is not Operator.DOES_NOT_EXIST:
            operator = Operator.EXISTS
        return literal, operator

    def parse_operator(self) -> Operator:
        token, literal = self.consume(values_context=False)
        operator = {
            _Token.IN: Operator.IN, _Token.EQUALS: Operator.EQUALS,
            _Token.DOUBLE_EQUALS: Operator.DOUBLE_EQUALS,
            _Token.GREATER_THAN: Operator.GREATER_THAN,
            _Token.LESS_THAN: Operator.LESS_THAN, _Token.NOT_IN: Operator.NOT_IN,
            _Token.NOT_EQUALS: Operator.NOT_EQUALS,
        }.get(token)
        if operator is None:
            expected = ", ".join(op.value for op in _BINARY_OPERATORS)
            raise SelectorError(f"found '{literal}', expected: {expected}")
        return operator

    def parse_values(self) -> set[str]:
        token, literal = self.consume()
        if token is not _Token.OPEN_PAR:
            raise SelectorError(f"found '{literal}' expected: '('")
        token, literal = self.lookahead()
        if token in (_Token.IDENTIFIER, _Token.COMMA):
            values = self.parse_identifiers_list()
            closing, _ = self.consume()
            if closing is not _Token.CLOSED_PAR:
                raise SelectorError(f"found '{literal}', expected: ')'")
            return values
        if token is _Token.CLOSED_PAR:
            self.consume()
            return {""}
        raise SelectorError(f"found '{literal}', expected: ',', ')' or identifier")

    def parse_identifiers_list(self) -> set[str]:
        values: set[str] = set()
        while True:
            token, literal = self.consume()
            if token is _Token.IDENTIFIER:
                values.add(literal)
                following, following_literal = self.lookahead()
                if following is _Token.COMMA:
                    continue
                if following is _Token.CLOSED_PAR:
                    return values
                raise SelectorError(f"found '{following_literal}', expected: ',' or ')'")
            if token is _Token.COMMA:
                # "(,a" "a,,b" and "a,)" all contain the empty value.
                if not values:
                    values.add("")
                following, _ = self.lookahead()
                if following is _Token.CLOSED_PAR:
                    values.add("")
                    return values
                if following is _Token.COMMA:
                    values.add("")
            else:
                raise SelectorError(f"found '{literal}', expected: ',', or identifier")

    def parse_exact_value(self) -> set[str]:
        token, _ = self.lookahead()
        if token in (_Token.END, _Token.COMMA):
            return {""}
        token, literal = self.consume()
        if token is _Token.IDENTIFIER:
            return {literal}
        raise SelectorError(f"found '{literal}', expected: identifier")


@functools.lru_cache(maxsize=256)
def parse_selector(text: str) -> Selector:
    """`labels.Parse`: the empty string selects everything.

    Cached (the value is immutable): an HPA sends the same selector on every sync.
    """
    return Selector.of(_Parser(text).parse())


def selector_from_set(labels: Mapping[str, str]) -> Selector:
    """`SelectorFromSet`: `k=v` for every pair (not validated, like upstream)."""
    return Selector.of(Requirement(key, Operator.EQUALS, (value,)) for key, value in labels.items())


# --- metav1.LabelSelector JSON -------------------------------------------------------------------

_JSON_OPERATORS = {
    "In": Operator.IN, "NotIn": Operator.NOT_IN, "Exists": Operator.EXISTS,
    "DoesNotExist": Operator.DOES_NOT_EXIST,
}


@dataclass(frozen=True)
class LabelSelectorRequirement:
    """One `matchExpressions` entry of a metav1.LabelSelector, as written."""

    key: str
    operator: str
    values: tuple[str, ...] | None = None


@dataclass(frozen=True)
class LabelSelector:
    """metav1.LabelSelector as written in a spec (matchLabels keep their input order)."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[LabelSelectorRequirement, ...] = ()


def label_selector_from_json(raw: Mapping[str, Any]) -> LabelSelector:
    """A LabelSelector object as the API sends it; SelectorError names a wrong shape."""
    if not isinstance(raw, Mapping):
        raise SelectorError("a label selector must be an object")
    match_labels = raw.get("matchLabels") or {}
    match_expressions = raw.get("matchExpressions") or []
    if not isinstance(match_labels, Mapping):
        raise SelectorError("matchLabels must be an object of strings")
    if not isinstance(match_expressions, list):
        raise SelectorError("matchExpressions must be a list")
    labels: list[tuple[str, str]] = []
    for key, value in match_labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise SelectorError("matchLabels must be an object of strings")
        labels.append((key, value))
    expressions: list[LabelSelectorRequirement] = []
    for expression in match_expressions:
        if not isinstance(expression, Mapping):
            raise SelectorError("each matchExpressions item must be an object")
        key = expression.get("key", "")
        operator = expression.get("operator", "")
        values = expression.get("values")
        if not isinstance(key, str) or not isinstance(operator, str) or not (
                values is None or (isinstance(values, list)
                and all(isinstance(v, str) for v in values))):
            raise SelectorError("matchExpressions items need a string key and operator "
                                "and a list of string values")
        expressions.append(LabelSelectorRequirement(
            key, operator, None if values is None else tuple(values)))
    return LabelSelector(tuple(labels), tuple(expressions))


def render_label_selector(selector: LabelSelector) -> dict[str, Any]:
    """The LabelSelector as JSON again (empty parts left out)."""
    out: dict[str, Any] = {}
    if selector.match_labels:
        out["matchLabels"] = dict(selector.match_labels)
    if selector.match_expressions:
        expressions = []
        for requirement in selector.match_expressions:
            item: dict[str, Any] = {"key": requirement.key, "operator": requirement.operator}
            if requirement.values:
                item["values"] = list(requirement.values)
            expressions.append(item)
        out["matchExpressions"] = expressions
    return out


def format_label_selector(selector: LabelSelector | None) -> str:
    """Go's `(*metav1.LabelSelector).String()`, as `%v`/`%+v` print it in upstream's messages."""
    if selector is None:
        return "nil"
    labels = "".join(f"{key}: {value}," for key, value in sorted(selector.match_labels))
    expressions = "".join(
        f"LabelSelectorRequirement{{Key:{req.key},Operator:{req.operator},"
        f"Values:[{' '.join(req.values or ())}],}},"
        for req in selector.match_expressions
    )
    return (f"&LabelSelector{{MatchLabels:map[string]string{{{labels}}},"
            f"MatchExpressions:[]LabelSelectorRequirement{{{expressions}}},}}")


def selector_from_label_selector(
        label_selector: LabelSelector | Mapping[str, Any] | None) -> Selector:
    """`metav1.LabelSelectorAsSelector`: None selects nothing, an empty one everything."""
    if label_selector is None:
        return Selector.match_nothing()
    if not isinstance(label_selector, LabelSelector):
        label_selector = label_selector_from_json(label_selector)
    requirements: list[Requirement] = []
    for key, value in label_selector.match_labels:
        requirements.append(new_requirement(key, Operator.EQUALS, (value,)))
    for expression in label_selector.match_expressions:
        operator = _JSON_OPERATORS.get(expression.operator)
        if operator is None:
            raise SelectorError(f"{quote_go_string(expression.operator)} is not a valid label "
                                "selector operator")
        requirements.append(new_requirement(expression.key, operator,
                                            tuple(expression.values or ())))
    return Selector.of(requirements)


def label_selector_json(selector: Selector) -> dict[str, Any]:
    """The `metav1.LabelSelector` a selector string converts to (`ParseToLabelSelector`).

    `!=` becomes `NotIn` with its one value (upstream refuses `!=` here and fails the whole
    request; the two mean the same). `>`/`<` have no LabelSelector form and raise.
    """
    match_labels: dict[str, str] = {}
    expressions: list[dict[str, Any]] = []
    for requirement in selector.requirements:
        op = requirement.operator
        if op in (Operator.EQUALS, Operator.DOUBLE_EQUALS):
            match_labels[requirement.key] = requirement.values[0]
            continue
        if op in (Operator.GREATER_THAN, Operator.LESS_THAN):
            raise SelectorError(f"{quote_go_string(op.value)} isn't supported in label selectors")
        name = {Operator.IN: "In", Operator.NOT_IN: "NotIn", Operator.NOT_EQUALS: "NotIn",
                Operator.EXISTS: "Exists", Operator.DOES_NOT_EXIST: "DoesNotExist"}[op]
        expression: dict[str, Any] = {"key": requirement.key, "operator": name}
        if requirement.values:
            expression["values"] = list(requirement.sorted_values())
        expressions.append(expression)
    result: dict[str, Any] = {}
    if match_labels:
        result["matchLabels"] = match_labels
    if expressions:
        result["matchExpressions"] = expressions
    return result
