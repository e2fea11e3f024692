"""Values as Go's templates see them: errors, the invalid value, structs, how `%v` prints a
value and what is true."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

__all__ = ["NO_VALUE", "GoStruct", "TemplateExecutionError", "TemplateSyntaxError",
           "go_sprint_value"]


class TemplateSyntaxError(ValueError):
    """The template does not parse (reported when the configuration is loaded)."""


class TemplateExecutionError(RuntimeError):
    """Rendering failed (reported per request, as Go's `Execute` error)."""


class _NoValue:
    """Go's invalid reflect.Value: a missing map entry reached through a field chain."""

    def __repr__(self) -> str:
        return "<no value>"


NO_VALUE = _NoValue()


@dataclass(frozen=True)
class GoStruct:
    """A Go struct value: a type name (for error messages) and its exported fields in order."""

    type_name: str
    fields: Mapping[str, Any]


# --- values ---------------------------------------------------------------------------------------


def _go_type(value: Any) -> str:
    if isinstance(value, GoStruct):
        return value.type_name
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "[]string" if all(isinstance(v, str) for v in value) else "[]interface {}"
    if isinstance(value, Mapping):
        return "map[string]string"
    return "<nil>" if value is None else "interface {}"


def _go_float(value: float) -> str:
    """strconv.FormatFloat(f, 'g', -1, 64): shortest digits, exponent form from 1e+06 / 1e-05."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if str(value).startswith("-") else "0"
    sign, digit_tuple, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + exponent  # position of the decimal point in the digit string
    exp10 = point - 1
    prefix = "-" if sign else ""
    if exp10 < -4 or exp10 >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{prefix}{mantissa}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"
    if point <= 0:
        return f"{prefix}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{prefix}{digits}{'0' * (point - len(digits))}"
    return f"{prefix}{digits[:point]}.{digits[point:]}"


def go_sprint_value(value: Any) -> str:
    """How Go's `%v` (and template output) prints a value."""
    if value is NO_VALUE:
        return "<no value>"
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, str):
        return value
    if isinstance(value, GoStruct):
        return "{" + " ".join(go_sprint_value(v) for v in value.fields.values()) + "}"
    if isinstance(value, Mapping):
        return "map[" + " ".join(f"{go_sprint_value(k)}:{go_sprint_value(value[k])}"
                                 for k in sorted(value)) + "]"
    if isinstance(value, list | tuple):
        return "[" + " ".join(go_sprint_value(v) for v in value) + "]"
    return str(value)


def _truth(value: Any) -> bool | None:
    """Go's `isTrue`; None when the value has no truth (an invalid value)."""
    if value is NO_VALUE:
        return None
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value != 0
    if isinstance(value, str | list | tuple | Mapping):
        return len(value) > 0
    return True
