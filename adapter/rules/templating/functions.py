"""The builtin functions: `and` and `or` aside (they short-circuit, in execution), `not`,
`len`, `index`, `slice`, the comparisons, `print`, `printf`, `println`, `html`, `urlquery`."""

from __future__ import annotations

import html
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from adapter.rules.templating.values import NO_VALUE, _go_float, _go_type, _truth, go_sprint_value
from metricscale.core.selectors import quote_go_string


class _ArgumentCountError(Exception):
    pass


class _CallError(Exception):
    pass


def _want(name: str, values: Sequence[Any], count: int, *, at_least: bool = False) -> None:
    if (len(values) < count) if at_least else (len(values) != count):
        want = f"at least {count}" if at_least else str(count)
        raise _ArgumentCountError(f"wrong number of args for {name}: want {want} "
                                  f"got {len(values)}")


def _fn_not(values: Sequence[Any]) -> Any:
    _want("not", values, 1)
    return not _truth(values[0])


def _fn_len(values: Sequence[Any]) -> Any:
    _want("len", values, 1)
    item = values[0]
    if isinstance(item, str):
        return len(item.encode())
    if isinstance(item, list | tuple | Mapping):
        return len(item)
    raise _CallError(f"len of type {_go_type(item)}")


def _index_value(item: Any, key: Any) -> Any:
    if item is NO_VALUE or item is None:
        raise _CallError("index of untyped nil")
    if isinstance(item, Mapping):
        if not isinstance(key, str):
            raise _CallError(f"value has type {_go_type(key)}; should be string")
        return item.get(key, "")
    if isinstance(item, str | list | tuple):
        if isinstance(key, bool) or not isinstance(key, int):
            raise _CallError(f"cannot index slice/array with type {_go_type(key)}")
        sequence: Sequence[Any] = item.encode() if isinstance(item, str) else item
        if not 0 <= key < len(sequence):
            raise _CallError(f"index out of range: {key}")
        return sequence[key]
    raise _CallError(f"can't index item of type {_go_type(item)}")


def _fn_index(values: Sequence[Any]) -> Any:
    _want("index", values, 1, at_least=True)
    item = values[0]
    for key in values[1:]:
        item = _index_value(item, key)
    return item


def _fn_slice(values: Sequence[Any]) -> Any:
    _want("slice", values, 1, at_least=True)
    item, bounds = values[0], values[1:]
    if len(bounds) > 3:
        raise _CallError(f"too many slice indexes: {len(bounds)}")
    if not isinstance(item, str | list | tuple):
        raise _CallError(f"can't slice item of type {_go_type(item)}")
    if isinstance(item, str) and len(bounds) == 3:
        raise _CallError("cannot 3-index slice a string")
    numbers = []
    for bound in bounds:
        if isinstance(bound, bool) or not isinstance(bound, int):
            raise _CallError(f"cannot index slice/array with type {_go_type(bound)}")
        numbers.append(bound)
    start = numbers[0] if numbers else 0
    stop = numbers[1] if len(numbers) > 1 else len(item)
    if not 0 <= start <= stop <= len(item):
        raise _CallError(f"index out of range: {stop if stop > len(item) else start}")
    return item[start:stop]


_KIND_BOOL, _KIND_INT, _KIND_FLOAT, _KIND_STRING, _KIND_OTHER = range(5)


def _basic_kind(value: Any) -> int:
    if isinstance(value, bool):
        return _KIND_BOOL
    if isinstance(value, int):
        return _KIND_INT
    if isinstance(value, float):
        return _KIND_FLOAT
    if isinstance(value, str):
        return _KIND_STRING
    return _KIND_OTHER


def _fn_eq(values: Sequence[Any]) -> Any:
    _want("eq", values, 1, at_least=True)
    if len(values) == 1:
        raise _CallError("missing argument for comparison")
    first = values[0]
    for other in values[1:]:
        if first is None or other is None:
            if first is None and other is None:
                return True
            continue
        kind_first, kind_other = _basic_kind(first), _basic_kind(other)
        if kind_first != kind_other:
            raise _CallError("incompatible types for comparison")
        if kind_first == _KIND_OTHER:
            raise _CallError(f"non-comparable type {go_sprint_value(first)}: {_go_type(first)}")
        if first == other:
            return True
    return False


def _fn_ne(values: Sequence[Any]) -> Any:
    _want("ne", values, 2)
    return not _fn_eq(values)


def _ordered(name: str, values: Sequence[Any]) -> tuple[Any, Any]:
    _want(name, values, 2)
    left, right = values
    kind_left, kind_right = _basic_kind(left), _basic_kind(right)
    if kind_left in (_KIND_BOOL, _KIND_OTHER) or kind_right in (_KIND_BOOL, _KIND_OTHER):
        raise _CallError("invalid type for comparison")
    if kind_left != kind_right:
        raise _CallError("incompatible types for comparison")
    return left, right


def _fn_lt(values: Sequence[Any]) -> Any:
    left, right = _ordered("lt", values)
    return left < right


def _fn_le(values: Sequence[Any]) -> Any:
    left, right = _ordered("le", values)
    return left <= right


def _fn_gt(values: Sequence[Any]) -> Any:
    left, right = _ordered("gt", values)
    return left > right


def _fn_ge(values: Sequence[Any]) -> Any:
    left, right = _ordered("ge", values)
    return left >= right


def _fn_print(values: Sequence[Any]) -> Any:
    """fmt.Sprint: a space between operands when neither side is a string."""
    out: list[str] = []
    for index, value in enumerate(values):
        if index and not isinstance(value, str) and not isinstance(values[index - 1], str):
            out.append(" ")
        out.append(go_sprint_value(value))
    return "".join(out)


def _fn_println(values: Sequence[Any]) -> Any:
    return " ".join(go_sprint_value(v) for v in values) + "\n"


def _fn_html(values: Sequence[Any]) -> Any:
    text = _fn_print(values)
    return html.escape(text, quote=True).replace("&#x27;", "&#39;").replace("&quot;", "&#34;") \
        .replace("\0", "\ufffd")


def _fn_urlquery(values: Sequence[Any]) -> Any:
    return urllib.parse.quote_plus(_fn_print(values), safe="")


_VERB = re.compile(r"%([-+# 0]*)(\*|[0-9]+)?(?:\.(\*|[0-9]+)?)?(.|$)", re.S)


def _bad_verb(verb: str, value: Any) -> str:
    if value is None:
        return f"%!{verb}(<nil>)"
    return f"%!{verb}({_go_type(value)}={go_sprint_value(value)})"


def _format_one(verb: str, value: Any, precision: int | None) -> str:
    if verb == "v":
        return go_sprint_value(value)
    if isinstance(value, list | tuple) and verb in "sqdx":
        return "[" + " ".join(_format_one(verb, v, precision) for v in value) + "]"
    if isinstance(value, Mapping) and verb in "sqdx":
        return "map[" + " ".join(f"{_format_one(verb, k, precision)}:"
                                 f"{_format_one(verb, value[k], precision)}"
                                 for k in sorted(value)) + "]"
    if verb == "s":
        if isinstance(value, str):
            return value if precision is None else value[:precision]
        return _bad_verb(verb, value)
    if verb == "q":
        if isinstance(value, str):
            return quote_go_string(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return "'" + quote_go_string(chr(value))[1:-1].replace("'", "\\'") + "'"
        return _bad_verb(verb, value)
    if verb == "d":
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return _bad_verb(verb, value)
    if verb == "t":
        return ("true" if value else "false") if isinstance(value, bool) else \
            _bad_verb(verb, value)
    if verb == "x":
        if isinstance(value, str):
            return value.encode().hex()
        if isinstance(value, int) and not isinstance(value, bool):
            return format(value, "x")
        return _bad_verb(verb, value)
    if verb in "feg":
        if isinstance(value, float):
            if verb == "g" and precision is None:
                return _go_float(value)
            return format(value, f".{6 if precision is None else precision}{verb}")
        return _bad_verb(verb, value)
    return _bad_verb(verb, value)


def _fn_printf(values: Sequence[Any]) -> Any:
    _want("printf", values, 1, at_least=True)
    template, operands = values[0], list(values[1:])
    if not isinstance(template, str):
        raise _CallError(f"wrong type for value; expected string; got {_go_type(template)}")
    out: list[str] = []
    used = 0
    position = 0
    while True:
        percent = template.find("%", position)
        if percent < 0:
            out.append(template[position:])
            break
        out.append(template[position:percent])
        match = _VERB.match(template, percent)
        assert match is not None
        flags, width_text, precision_text, verb = match.groups()
        position = match.end()
        if verb == "%":
            out.append("%")
            continue
        if verb == "":
            out.append("%!(NOVERB)")
            break
        width = None
        if width_text == "*":
            width = operands[used] if used < len(operands) else 0
            used += 1
        elif width_text:
            width = int(width_text)
        precision = None
        if precision_text == "*":
            precision = operands[used] if used < len(operands) else 0
            used += 1
        elif precision_text is not None:
            precision = int(precision_text)
        elif match.group(0).find(".") >= 0:
            precision = 0
        if used >= len(operands):
            out.append(f"%!{verb}(MISSING)")
            continue
        text = _format_one(verb, operands[used], precision)
        used += 1
        if isinstance(width, int) and len(text) < width:
            if "-" in flags:
                text = text.ljust(width)
            elif "0" in flags and verb in "dfegx" and re.fullmatch(r"-?[0-9a-f.e+]+", text):
                sign = "-" if text.startswith("-") else ""
                text = sign + text[len(sign):].rjust(width - len(sign), "0")
            else:
                text = text.rjust(width)
        out.append(text)
    if used < len(operands):
        extra = ", ".join(f"{_go_type(v)}={go_sprint_value(v)}" for v in operands[used:])
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)


_FUNCTIONS: Mapping[str, Callable[[Sequence[Any]], Any]] = {
    "not": _fn_not, "len": _fn_len, "index": _fn_index, "slice": _fn_slice, "eq": _fn_eq,
    "ne": _fn_ne, "lt": _fn_lt, "le": _fn_le, "gt": _fn_gt, "ge": _fn_ge, "print": _fn_print,
    "printf": _fn_printf, "println": _fn_println, "html": _fn_html, "urlquery": _fn_urlquery,
}
