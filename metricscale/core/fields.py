r"""Field selectors (`fieldSelector=metadata.name=web,spec.nodeName!=n1`), as apimachinery's
`fields.ParseSelector` reads them.

Terms are separated by unescaped commas; each is `key=value`, `key==value` or `key!=value`,
split at the first operator (keys cannot be escaped). In values, `\\`, `\,` and `\=` are the
escapes; any other backslash sequence, or an unescaped `,` or `=`, is an error. Which keys a
resource supports is the caller's business (`FieldSelector.unsupported`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["FieldRequirement", "FieldSelector", "FieldSelectorError", "parse_field_selector"]


class FieldSelectorError(ValueError):
    """The text is not a field selector (a 400 for the client)."""


@dataclass(frozen=True)
class FieldRequirement:
    key: str
    value: str
    negated: bool

    def matches(self, fields: Mapping[str, str]) -> bool:
        # apimachinery's hasTerm/notHasTerm: a field the object lacks reads as "".
        equal = fields.get(self.key, "") == self.value
        return not equal if self.negated else equal

    def __str__(self) -> str:
        return f"{self.key}{'!=' if self.negated else '='}{escape_field_value(self.value)}"


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def is_empty(self) -> bool:
        return not self.requirements

    def matches(self, fields: Mapping[str, str]) -> bool:
        return all(requirement.matches(fields) for requirement in self.requirements)

    def unsupported(self, known: Iterable[str]) -> str | None:
        """The first key not among `known`, or None."""
        allowed = set(known)
        return next((r.key for r in self.requirements if r.key not in allowed), None)

    def __str__(self) -> str:
        return ",".join(map(str, self.requirements))


def escape_field_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def _split_terms(text: str) -> list[str]:
    terms: list[str] = []
    start = 0
    escaped = False
    for index, char in enumerate(text):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ",":
            terms.append(text[start:index])
            start = index + 1
    terms.append(text[start:])
    return terms


_OPERATORS = ("!=", "==", "=")  # `==` before `=`, so no `=` is left on the value


def _split_term(term: str) -> tuple[str, str, str] | None:
    for index in range(len(term)):
        for operator in _OPERATORS:
            if term.startswith(operator, index):
                return term[:index], operator, term[index + len(operator):]
    return None


def _unescape(value: str) -> str:
    if not any(char in value for char in "\\,="):
        return value
    out: list[str] = []
    escaped = False
    for char in value:
        if escaped:
            if char not in "\\,=":
                raise FieldSelectorError(
                    f"invalid field selector: invalid escape sequence: \\{char}")
            out.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in ",=":
            raise FieldSelectorError(
                f"invalid field selector: unescaped character in value: {char!r}")
        else:
            out.append(char)
    if escaped:
        raise FieldSelectorError("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def parse_field_selector(text: str) -> FieldSelector:
    """Parse `text`; the empty string selects everything. Terms are kept sorted, as upstream."""
    if not text:
        return FieldSelector()
    requirements: list[FieldRequirement] = []
    for term in sorted(_split_terms(text)):
        if term == "":
            continue
        split = _split_term(term)
        if split is None:
            raise FieldSelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
        key, operator, raw = split
        requirements.append(FieldRequirement(key, _unescape(raw), negated=operator == "!="))
    return FieldSelector(tuple(requirements))
