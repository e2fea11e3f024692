"""Reading the Kubernetes wire format: typed field readers that name the field path in their
errors, quantities and label selectors."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from metricscale.core.quantity import (
    Format,
    QuantityError,
    format_milli,
    milli_value,
    parse_quantity,
)
from metricscale.core.selectors import (
    LabelSelector,
    LabelSelectorRequirement,
)

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "ModelError",
    "Quantity",
    "join_path",
    "kind_name",
    "parse_label_selector",
    "parse_quantity_value",
    "read_bool",
    "read_int",
    "read_list",
    "read_object",
    "read_optional_object",
    "read_optional_quantity",
    "read_resource_list",
    "read_str",
    "read_string_map",
]


INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class ModelError(ValueError):
    """Input that does not parse; `path` names the field, `str(err)` is `path: message`."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


def read_object(raw: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ModelError(path, f"must be an object, not {kind_name(raw)}")
    return raw


def kind_name(raw: Any) -> str:
    if raw is None:
        return "null"
    if isinstance(raw, bool):
        return "a boolean"
    if isinstance(raw, int | float):
        return "a number"
    if isinstance(raw, str):
        return "a string"
    if isinstance(raw, list | tuple):
        return "a list"
    return "an object" if isinstance(raw, Mapping) else type(raw).__name__


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def read_optional_object(obj: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any] | None:
    raw = obj.get(key)
    return None if raw is None else read_object(raw, join_path(path, key))


def read_str(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> str:
    raw = obj.get(key)
    if raw is None:
        if required:
            raise ModelError(join_path(path, key), "is required")
        return ""
    if not isinstance(raw, str):
        raise ModelError(join_path(path, key), f"must be a string, not {kind_name(raw)}")
    if required and not raw:
        raise ModelError(join_path(path, key), "must not be empty")
    return raw


def read_int(obj: Mapping[str, Any], key: str, path: str, *, bits: int = 32,
         required: bool = False) -> int | None:
    raw = obj.get(key)
    where = join_path(path, key)
    if raw is None:
        if required:
            raise ModelError(where, "is required")
        return None
    if isinstance(raw, bool) or not isinstance(raw, int):
        if isinstance(raw, float) and raw.is_integer():
            raw = int(raw)
        else:
            raise ModelError(where, f"must be an integer, not {kind_name(raw)}")
    low, high = (INT32_MIN, INT32_MAX) if bits == 32 else (INT64_MIN, INT64_MAX)
    if not low <= raw <= high:
        raise ModelError(where, f"must fit in int{bits}")
    return int(raw)


def read_bool(obj: Mapping[str, Any], key: str, path: str) -> bool:
    raw = obj.get(key)
    if raw is None:
        return False
    if not isinstance(raw, bool):
        raise ModelError(join_path(path, key), f"must be true or false, not {kind_name(raw)}")
    return raw


def read_list(obj: Mapping[str, Any], key: str, path: str) -> list[Any] | None:
    raw = obj.get(key)
    if raw is None:
        return None
    if not isinstance(raw, list | tuple):
        raise ModelError(join_path(path, key), f"must be a list, not {kind_name(raw)}")
    return list(raw)


def read_string_map(obj: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
    raw = obj.get(key)
    if raw is None:
        return {}
    mapping = read_object(raw, join_path(path, key))
    out: dict[str, str] = {}
    for name, value in mapping.items():
        if not isinstance(value, str):
            raise ModelError(f"{join_path(path, key)}.{name}",
                             f"must be a string, not {kind_name(value)}")
        out[str(name)] = value
    return out


@dataclass(frozen=True)
class Quantity:
    """A resource.Quantity: its exact value, `MilliValue()`, and the text it came as.

    Equality is by value, as Go's semantic equality compares quantities.
    """

    value: Decimal
    milli: int = field(compare=False)
    text: str = field(compare=False)

    @classmethod
    def parse(cls, text: str) -> Quantity:
        # Fast paths for the shapes metrics APIs answer most ("12", "1500m"): the same values
        # parse_quantity and milli_value give, without the regular expression and Decimal
        # contexts. Short enough that MilliValue cannot saturate.
        if len(text) <= 15 and text.isascii():
            if text.isdigit():
                whole = int(text)
                return cls(value=Decimal(whole), milli=whole * 1000, text=text)
            if text[-1:] == "m" and text[:-1].isdigit():
                milli = int(text[:-1])
                return cls(value=Decimal(milli).scaleb(-3), milli=milli, text=text)
        value = parse_quantity(text)
        # Go's MilliValue saturates instead of overflowing int64 for absurd values; so do we.
        milli = max(INT64_MIN, min(INT64_MAX, milli_value(value)))
        return cls(value=value, milli=milli, text=text)

    @classmethod
    def from_milli(cls, milli: int, fmt: Format = Format.DECIMAL_SI) -> Quantity:
        """resource.NewMilliQuantity(milli, fmt) (shared: quantities are immutable, and a
        decision makes one for every metric, mostly of values it has made before)."""
        if cls is Quantity:
            if fmt is Format.DECIMAL_SI:  # the common case, cached by the number alone
                return _decimal_from_milli(milli)
            return _quantity_from_milli(milli, fmt)
        return cls(value=Decimal(milli).scaleb(-3), milli=milli, text=format_milli(milli, fmt))


@functools.lru_cache(maxsize=4096)
def _quantity_from_milli(milli: int, fmt: Format) -> Quantity:
    return Quantity(value=Decimal(milli).scaleb(-3), milli=milli, text=format_milli(milli, fmt))


@functools.lru_cache(maxsize=4096)
def _decimal_from_milli(milli: int) -> Quantity:
    return _quantity_from_milli.__wrapped__(milli, Format.DECIMAL_SI)


def parse_quantity_value(raw: Any, path: str) -> Quantity:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ModelError(path, f"must be a quantity string such as \"500m\", not {kind_name(raw)}")
    # Quantity.UnmarshalJSON also accepts bare JSON numbers.
    text = raw if isinstance(raw, str) else repr(raw)
    try:
        return Quantity.parse(text)
    except QuantityError as err:
        raise ModelError(path, str(err)) from None


def read_optional_quantity(obj: Mapping[str, Any], key: str, path: str) -> Quantity | None:
    raw = obj.get(key)
    return None if raw is None else parse_quantity_value(raw, join_path(path, key))


def read_resource_list(obj: Mapping[str, Any], key: str, path: str) -> dict[str, Quantity]:
    raw = obj.get(key)
    if raw is None:
        return {}
    mapping = read_object(raw, join_path(path, key))
    return {str(name): parse_quantity_value(value, f"{join_path(path, key)}.{name}")
            for name, value in mapping.items()}


def parse_label_selector(raw: Any, path: str) -> LabelSelector:
    obj = read_object(raw, path)
    labels = read_string_map(obj, "matchLabels", path)
    expressions = []
    for i, item in enumerate(read_list(obj, "matchExpressions", path) or []):
        where = f"{path}.matchExpressions[{i}]"
        expr = read_object(item, where)
        values_raw = read_list(expr, "values", where)
        values: tuple[str, ...] | None = None
        if values_raw is not None:
            for j, value in enumerate(values_raw):
                if not isinstance(value, str):
                    raise ModelError(f"{where}.values[{j}]",
                                     f"must be a string, not {kind_name(value)}")
            values = tuple(values_raw)
        expressions.append(LabelSelectorRequirement(
            key=read_str(expr, "key", where), operator=read_str(expr, "operator", where),
            values=values))
    return LabelSelector(match_labels=tuple(labels.items()), match_expressions=tuple(expressions))
