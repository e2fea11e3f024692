"""A Go `text/template` subset with `<<`/`>>` delimiters: what prometheus-adapter configs use.

Supported: text, `<<- `/` ->>` trim markers, `<</* comments */>>`, fields (`.A.B`, map keys
through fields), `.`, `$`, variables (`$x := …`, `range $i, $v := …`), string/raw-string/number/
bool/nil constants, parenthesised pipelines, `|` pipes, `if`/`else if`/`else`/`end`,
`range`/`else`/`end` (slices, maps in key order, ints), `with`, and the builtins `and`, `or`,
`not`, `len`, `index`, `slice`, `eq`, `ne`, `lt`, `le`, `gt`, `ge`, `print`, `printf`,
`println`, `html`, `urlquery`. Anything else that Go would accept (`define`, `template`,
`block`, `break`, `continue`, `call`, `js`) is refused when the template is parsed, and an
unknown function (there is no `join`) is a parse error exactly as in Go. Values print the way
Go's fmt prints them: slices as `[a b]`, maps as `map[k:v]` with sorted keys.
"""

from __future__ import annotations

import html
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from metricscale.core.selectors import quote_go_string

__all__ = [
    "NO_VALUE",
    "GoStruct",
    "Template",
    "TemplateExecutionError",
    "TemplateSyntaxError",
    "go_sprint_value",
    "parse_template",
]


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


# --- lexer ----------------------------------------------------------------------------------------

_LEFT = "<<"
_RIGHT = ">>"
_SPACE = " \t\r\n"
_KEYWORDS = frozenset({"block", "break", "continue", "define", "else", "end", "if", "range",
                       "nil", "template", "with"})
_CHAR = re.compile(r"'(\\.[^']*|[^'\\])'")
_NUMBER = re.compile(
    r"[+-]?(?:0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+"
    r"|(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][+-]?[0-9_]+)?)"
)


@dataclass(frozen=True)
class _Item:
    kind: str  # text, left, right, space, field, dot, variable, identifier, keyword, string,
    #            raw, number, char, bool, pipe, declare, assign, lparen, rparen, comma, eof
    value: str
    pos: int


class _Lexer:
    def __init__(self, source: str, name: str) -> None:
        self.source = source
        self.name = name
        self.items: list[_Item] = []

    def error(self, message: str, pos: int) -> TemplateSyntaxError:
        line = 1 + self.source.count("\n", 0, pos)
        return TemplateSyntaxError(f"template: {self.name}:{line}: {message}")

    def at_right_delim(self, pos: int) -> tuple[bool, bool]:
        src = self.source
        if pos + 1 < len(src) and src[pos] in _SPACE and src[pos + 1] == "-" \
                and src.startswith(_RIGHT, pos + 2):
            return True, True
        return src.startswith(_RIGHT, pos), False

    def run(self) -> list[_Item]:
        src = self.source
        pos = 0
        trim_next_text = False
        while True:
            start = src.find(_LEFT, pos)
            text = src[pos:] if start < 0 else src[pos:start]
            if trim_next_text:
                text = text.lstrip(_SPACE)
            after = (len(src) if start < 0 else start + len(_LEFT))
            trim_left = start >= 0 and src.startswith("-", after) \
                and after + 1 < len(src) and src[after + 1] in _SPACE
            if trim_left:
                text = text.rstrip(_SPACE)
            if text:
                self.items.append(_Item("text", text, pos))
            if start < 0:
                self.items.append(_Item("eof", "", len(src)))
                return self.items
            inner = after + (2 if trim_left else 0)
            if src.startswith("/*", inner):
                close = src.find("*/", inner + 2)
                if close < 0:
                    raise self.error("unclosed comment", start)
                is_delim, trim = self.at_right_delim(close + 2)
                if not is_delim:
                    raise self.error("comment ends before closing delimiter", start)
                pos = close + 2 + (2 if trim else 0) + len(_RIGHT)
                trim_next_text = trim
                continue
            self.items.append(_Item("left", _LEFT, start))
            pos, trim_next_text = self.lex_action(inner)

    def lex_action(self, pos: int) -> tuple[int, bool]:
        src = self.source
        depth = 0
        while True:
            is_delim, trim = self.at_right_delim(pos)
            if is_delim:
                if depth:
                    raise self.error("unclosed left paren", pos)
                if trim:
                    pos += 2
                self.items.append(_Item("right", _RIGHT, pos))
                return pos + len(_RIGHT), trim
            if pos >= len(src):
                raise self.error("unclosed action", pos)
            char = src[pos]
            if char in _SPACE:
                end = pos
                while end < len(src) and src[end] in _SPACE and not self.at_right_delim(end)[1]:
                    end += 1
                self.items.append(_Item("space", src[pos:end], pos))
                pos = end
            elif char == "=":
                self.items.append(_Item("assign", "=", pos))
                pos += 1
            elif char == ":":
                if not src.startswith(":=", pos):
                    raise self.error("expected :=", pos)
                self.items.append(_Item("declare", ":=", pos))
                pos += 2
            elif char == "|":
                self.items.append(_Item("pipe", "|", pos))
                pos += 1
            elif char == '"':
                end = pos + 1
                while True:
                    if end >= len(src) or src[end] == "\n":
                        raise self.error("unterminated quoted string", pos)
                    if src[end] == "\\":
                        end += 2
                        continue
                    if src[end] == '"':
                        break
                    end += 1
                self.items.append(_Item("string", src[pos:end + 1], pos))
                pos = end + 1
            elif char == "`":
                end = src.find("`", pos + 1)
                if end < 0:
                    raise self.error("unterminated raw quoted string", pos)
                self.items.append(_Item("raw", src[pos:end + 1], pos))
                pos = end + 1
            elif char == "'":
                match = _CHAR.match(src, pos)
                if match is None:
                    raise self.error("unterminated character constant", pos)
                self.items.append(_Item("char", match.group(0), pos))
                pos = match.end()
            elif char == "$":
                pos = self.lex_word(pos + 1, "variable", start=pos)
            elif char == "." and not (pos + 1 < len(src) and src[pos + 1].isdigit()):
                pos = self.lex_word(pos + 1, "field", start=pos)
            elif char in "+-." or char.isdigit():
                match = _NUMBER.match(src, pos)
                if match is None or match.end() == pos:
                    raise self.error(f"bad number syntax: {quote_go_string(src[pos:pos + 1])}",
                                     pos)
                end = match.end()
                if end < len(src) and (src[end].isalnum() or src[end] == "_"):
                    raise self.error(f"bad number syntax: {quote_go_string(src[pos:end + 1])}",
                                     pos)
                self.items.append(_Item("number", src[pos:end], pos))
                pos = end
            elif char.isalnum() or char == "_":
                end = pos
                while end < len(src) and (src[end].isalnum() or src[end] == "_"):
                    end += 1
                self.check_terminator(end)
                word = src[pos:end]
                kind = "keyword" if word in _KEYWORDS else \
                    "bool" if word in ("true", "false") else "identifier"
                self.items.append(_Item(kind, word, pos))
                pos = end
            elif char == "(":
                depth += 1
                self.items.append(_Item("lparen", "(", pos))
                pos += 1
            elif char == ")":
                depth -= 1
                if depth < 0:
                    raise self.error("unexpected right paren", pos)
                self.items.append(_Item("rparen", ")", pos))
                pos += 1
            elif char == ",":
                self.items.append(_Item("comma", ",", pos))
                pos += 1
            else:
                raise self.error(f"unrecognized character in action: U+{ord(char):04X} '{char}'",
                                 pos)

    def lex_word(self, pos: int, kind: str, *, start: int) -> int:
        src = self.source
        end = pos
        while end < len(src) and (src[end].isalnum() or src[end] == "_"):
            end += 1
        self.check_terminator(end)
        value = src[start:end]
        if kind == "field" and end == pos:
            self.items.append(_Item("dot", ".", start))
        else:
            self.items.append(_Item(kind, value, start))
        return end

    def check_terminator(self, pos: int) -> None:
        src = self.source
        if pos >= len(src) or src[pos] in _SPACE or src[pos] in ".,|:()" \
                or src.startswith(_RIGHT, pos):
            return
        raise self.error(f"bad character U+{ord(src[pos]):04X} '{src[pos]}'", pos)


# --- parse tree -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Node:
    pos: int
    text: str  # how the node is shown in error messages ("<.Foo>")


@dataclass(frozen=True)
class _Text(_Node):
    value: str


@dataclass(frozen=True)
class _Field(_Node):
    names: tuple[str, ...]


@dataclass(frozen=True)
class _Dot(_Node):
    pass


@dataclass(frozen=True)
class _Variable(_Node):
    name: str
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Constant(_Node):
    value: Any
    is_nil: bool = False


@dataclass(frozen=True)
class _Identifier(_Node):
    name: str


@dataclass(frozen=True)
class _Chain(_Node):
    node: _Node
    names: tuple[str, ...]


@dataclass(frozen=True)
class _Command(_Node):
    args: tuple[_Node, ...]


@dataclass(frozen=True)
class _Pipeline(_Node):
    declarations: tuple[str, ...]
    is_assign: bool
    commands: tuple[_Command, ...]


@dataclass(frozen=True)
class _Action(_Node):
    pipe: _Pipeline


@dataclass(frozen=True)
class _Control(_Node):
    kind: str  # if, range, with
    pipe: _Pipeline
    body: tuple[_Node, ...]
    otherwise: tuple[_Node, ...]


_BUILTINS = frozenset({"and", "or", "not", "len", "index", "slice", "eq", "ne", "lt", "le", "gt",
                       "ge", "print", "printf", "println", "html", "urlquery"})
_UNSUPPORTED_FUNCTIONS = frozenset({"call", "js"})


class _Parser:
    def __init__(self, source: str, name: str) -> None:
        self.source = source
        self.name = name
        self.items = _Lexer(source, name).run()
        self.index = 0
        self.scopes: list[list[str]] = [["$"]]

    # token access
    def error(self, message: str, pos: int) -> TemplateSyntaxError:
        line = 1 + self.source.count("\n", 0, pos)
        return TemplateSyntaxError(f"template: {self.name}:{line}: {message}")

    def next(self) -> _Item:
        item = self.items[self.index]
        self.index += 1
        return item

    def backup(self) -> None:
        self.index -= 1

    def peek(self) -> _Item:
        return self.items[self.index]

    def next_non_space(self) -> _Item:
        item = self.next()
        while item.kind == "space":
            item = self.next()
        return item

    def peek_non_space(self) -> _Item:
        item = self.next_non_space()
        self.backup()
        return item

    def describe(self, item: _Item) -> str:
        if item.kind == "eof":
            return "EOF"
        if item.kind == "right":
            return "right delimiter"
        return quote_go_string(item.value)

    # grammar
    def parse(self) -> tuple[_Node, ...]:
        nodes, end = self.item_list(top=True)
        assert end is None
        return nodes

    def item_list(self, *, top: bool = False) -> tuple[tuple[_Node, ...], _Item | None]:
        """Nodes up to `<<end>>` / `<<else …>>` (returned, consumed) or EOF at the top level."""
        nodes: list[_Node] = []
        while True:
            item = self.next()
            if item.kind == "eof":
                if top:
                    return tuple(nodes), None
                raise self.error("unexpected EOF", item.pos)
            if item.kind == "text":
                nodes.append(_Text(item.pos, item.value, item.value))
                continue
            keyword = self.peek_non_space()
            if keyword.kind == "keyword" and keyword.value in ("end", "else"):
                self.next_non_space()
                if top:
                    raise self.error(f"unexpected {{{{{keyword.value}}}}}", keyword.pos)
                return tuple(nodes), keyword
            nodes.append(self.action(item))

    def action(self, left: _Item) -> _Node:
        item = self.next_non_space()
        if item.kind == "keyword":
            if item.value in ("if", "range", "with"):
                return self.control(item)
            raise self.error(f"{{{{{item.value}}}}} is not supported by metricscale", item.pos)
        self.backup()
        pipe = self.pipeline("command", end="right")
        return _Action(left.pos, pipe.text, pipe)

    def control(self, keyword: _Item) -> _Node:
        self.scopes.append([])
        try:
            pipe = self.pipeline(keyword.value, end="right")
            body, end = self.item_list()
            otherwise: tuple[_Node, ...] = ()
            assert end is not None
            if end.value == "else":
                after = self.peek_non_space()
                if keyword.value in ("if", "with") and after.kind == "keyword" \
                        and after.value == keyword.value:
                    # `else if` / `else with`: a nested control that shares our `end`.
                    self.next_non_space()
                    otherwise = (self.control(after),)
                else:
                    closing = self.next_non_space()
                    if closing.kind != "right":
                        raise self.error(f"unexpected {self.describe(closing)} in else",
                                         closing.pos)
                    otherwise, end = self.item_list()
                    assert end is not None
                    if end.value != "end":
                        raise self.error("expected end; found {{else}}", end.pos)
                    self.expect_right(end)
            else:
                self.expect_right(end)
        finally:
            self.scopes.pop()
        return _Control(keyword.pos, keyword.value, keyword.value, pipe, body, otherwise)

    def expect_right(self, after: _Item) -> None:
        closing = self.next_non_space()
        if closing.kind != "right":
            raise self.error(f"unexpected {self.describe(closing)} in {after.value}", closing.pos)

    def pipeline(self, context: str, *, end: str) -> _Pipeline:
        start = self.peek_non_space()
        declarations: list[str] = []
        is_assign = False
        # `$x :=`, `$x =`, and in range `$i, $x :=`.
        save = self.index
        first = self.next_non_space()
        if first.kind == "variable":
            following = self.next_non_space()
            if following.kind in ("declare", "assign"):
                declarations.append(first.value)
                is_assign = following.kind == "assign"
            elif following.kind == "comma" and context == "range":
                second = self.next_non_space()
                operator = self.next_non_space()
                if second.kind != "variable" or operator.kind not in ("declare", "assign"):
                    raise self.error("range can only initialize variables", first.pos)
                declarations.extend((first.value, second.value))
                is_assign = operator.kind == "assign"
            else:
                self.index = save
        else:
            self.index = save
        for name in declarations:
            if is_assign:
                self.check_variable(name, first.pos)
            else:
                self.scopes[-1].append(name)
        commands: list[_Command] = []
        while True:
            item = self.next_non_space()
            if item.kind == end:
                if not commands:
                    raise self.error(f"missing value for {context}", item.pos)
                break
            if item.kind in ("bool", "char", "dot", "field", "identifier", "number", "raw",
                             "string", "variable", "lparen") \
                    or (item.kind == "keyword" and item.value == "nil"):
                self.backup()
                commands.append(self.command())
            else:
                raise self.error(f"unexpected {self.describe(item)} in {context}", item.pos)
        for number, command in enumerate(commands[1:], start=2):
            head = command.args[0]
            if isinstance(head, _Constant | _Dot):
                raise self.error(f"non executable command in pipeline stage {number}", head.pos)
        text = " | ".join(c.text for c in commands)
        return _Pipeline(start.pos, text, tuple(declarations), is_assign, tuple(commands))

    def command(self) -> _Command:
        start = self.peek_non_space()
        args: list[_Node] = []
        while True:
            self.peek_non_space()
            while self.peek().kind == "space":
                self.next()
            operand = self.operand()
            if operand is not None:
                args.append(operand)
            item = self.next()
            if item.kind == "space":
                continue
            if item.kind in ("right", "rparen"):
                self.backup()
            elif item.kind != "pipe":
                raise self.error(f"unexpected {self.describe(item)} in operand", item.pos)
            break
        if not args:
            raise self.error("empty command", start.pos)
        return _Command(start.pos, " ".join(a.text for a in args), tuple(args))

    def operand(self) -> _Node | None:
        node = self.term()
        if node is None:
            return None
        names: list[str] = []
        while self.peek().kind == "field":
            names.append(self.next().value[1:])
        if not names:
            return node
        suffix = "".join("." + n for n in names)
        if isinstance(node, _Field):
            return _Field(node.pos, node.text + suffix, node.names + tuple(names))
        if isinstance(node, _Variable):
            return _Variable(node.pos, node.text + suffix, node.name, node.names + tuple(names))
        if isinstance(node, _Constant | _Dot):
            raise self.error(f"unexpected . after term {quote_go_string(node.text)}", node.pos)
        return _Chain(node.pos, node.text + suffix, node, tuple(names))

    def term(self) -> _Node | None:
        item = self.next_non_space()
        kind = item.kind
        if kind == "identifier":
            if item.value in _UNSUPPORTED_FUNCTIONS:
                raise self.error(f"function {quote_go_string(item.value)} is not supported by "
                                 "metricscale", item.pos)
            if item.value not in _BUILTINS:
                raise self.error(f"function {quote_go_string(item.value)} not defined", item.pos)
            return _Identifier(item.pos, item.value, item.value)
        if kind == "dot":
            return _Dot(item.pos, ".")
        if kind == "keyword" and item.value == "nil":
            return _Constant(item.pos, "nil", None, is_nil=True)
        if kind == "variable":
            self.check_variable(item.value, item.pos)
            return _Variable(item.pos, item.value, item.value)
        if kind == "field":
            names = tuple(item.value[1:].split("."))
            return _Field(item.pos, item.value, names)
        if kind == "bool":
            return _Constant(item.pos, item.value, item.value == "true")
        if kind == "number":
            return _Constant(item.pos, item.value, self.number(item))
        if kind == "char":
            return _Constant(item.pos, item.value, ord(_go_unquote(item.value, '"')))
        if kind == "lparen":
            pipe = self.pipeline("parenthesized pipeline", end="rparen")
            return _Chain(item.pos, f"({pipe.text})", pipe, ())
        if kind in ("string", "raw"):
            try:
                value = _go_unquote(item.value, item.value[0])
            except ValueError as error:
                raise self.error(str(error), item.pos) from None
            return _Constant(item.pos, item.value, value)
        self.backup()
        return None

    def number(self, item: _Item) -> int | float:
        text = item.value.replace("_", "")
        try:
            lowered = text.lower().lstrip("+-")
            sign = -1 if text.startswith("-") else 1
            if lowered.startswith("0x"):
                return sign * int(lowered[2:], 16)
            if lowered.startswith("0b"):
                return sign * int(lowered[2:], 2)
            if lowered.startswith("0o"):
                return sign * int(lowered[2:], 8)
            if re.fullmatch(r"[0-9]+", lowered):
                if len(lowered) > 1 and lowered.startswith("0"):
                    return sign * int(lowered, 8)
                return sign * int(lowered)
            return float(text)
        except ValueError:
            raise self.error(f"bad number syntax: {quote_go_string(item.value)}",
                             item.pos) from None

    def check_variable(self, name: str, pos: int) -> None:
        base = name.split(".")[0]
        if not any(base in scope for scope in self.scopes):
            raise self.error(f"undefined variable {quote_go_string(base)}", pos)


_UNQUOTE_SIMPLE = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
                   "\\": "\\", "'": "'", '"': '"'}


def _go_unquote(literal: str, quote: str) -> str:
    """strconv.Unquote for "…", `…` and '…' literals."""
    if quote == "`":
        return literal[1:-1]
    body = literal[1:-1]
    out: list[str] = []
    index = 0
    while index < len(body):
        char = body[index]
        if char != "\\":
            out.append(char)
            index += 1
            continue
        if index + 1 >= len(body):
            raise ValueError("invalid syntax")
        code = body[index + 1]
        if code in _UNQUOTE_SIMPLE:
            out.append(_UNQUOTE_SIMPLE[code])
            index += 2
        elif code in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[code]
            digits = body[index + 2:index + 2 + width]
            if len(digits) != width or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                raise ValueError("invalid syntax")
            out.append(chr(int(digits, 16)))
            index += 2 + width
        elif code in "01234567":
            digits = body[index + 1:index + 4]
            if len(digits) != 3 or not re.fullmatch(r"[0-7]+", digits):
                raise ValueError("invalid syntax")
            out.append(chr(int(digits, 8)))
            index += 4
        else:
            raise ValueError("invalid syntax")
    return "".join(out)


# --- execution ------------------------------------------------------------------------------------


class _Missing:
    """No piped value (distinct from a piped nil)."""


_MISSING = _Missing()


@dataclass
class _State:
    template: Template
    variables: list[tuple[str, Any]] = field(default_factory=list)
    output: list[str] = field(default_factory=list)

    def error(self, node: _Node, message: str) -> TemplateExecutionError:
        source = self.template.source
        line = 1 + source.count("\n", 0, node.pos)
        column = node.pos - (source.rfind("\n", 0, node.pos) + 1)
        name = self.template.name
        return TemplateExecutionError(
            f"template: {name}:{line}:{column}: executing {quote_go_string(name)} "
            f"at <{node.text}>: {message}")

    def lookup(self, name: str) -> Any:
        for variable, value in reversed(self.variables):
            if variable == name:
                return value
        raise TemplateExecutionError(f"undefined variable: {name}")

    def assign(self, name: str, value: Any) -> None:
        for index in range(len(self.variables) - 1, -1, -1):
            if self.variables[index][0] == name:
                self.variables[index] = (name, value)
                return

    # walking
    def walk(self, dot: Any, nodes: Sequence[_Node]) -> None:
        for node in nodes:
            if isinstance(node, _Text):
                self.output.append(node.value)
            elif isinstance(node, _Action):
                # Declared variables live until the end of the enclosing control structure.
                value = self.eval_pipeline(dot, node.pipe)
                if not node.pipe.declarations:
                    self.output.append(go_sprint_value(value))
            elif isinstance(node, _Control):
                self.walk_control(dot, node)

    def walk_control(self, dot: Any, node: _Control) -> None:
        mark = len(self.variables)
        try:
            if node.kind == "range":
                self.walk_range(dot, node)
                return
            value = self.eval_pipeline(dot, node.pipe)
            truth = _truth(value)
            if truth is None:
                raise self.error(node.pipe, f"if/with can't use {go_sprint_value(value)}")
            if truth:
                self.walk(value if node.kind == "with" else dot, node.body)
            else:
                self.walk(dot, node.otherwise)
        finally:
            del self.variables[mark:]

    def walk_range(self, dot: Any, node: _Control) -> None:
        value = self.eval_pipeline(dot, node.pipe, declare=False)
        names = node.pipe.declarations
        pairs: list[tuple[Any, Any]]
        if value is NO_VALUE or value is None:
            pairs = []
        elif isinstance(value, list | tuple):
            pairs = list(enumerate(value))
        elif isinstance(value, Mapping):
            pairs = [(key, value[key]) for key in sorted(value)]
        elif isinstance(value, int) and not isinstance(value, bool):
            pairs = [(i, i) for i in range(value)]
        else:
            raise self.error(node.pipe, f"range can't iterate over {go_sprint_value(value)}")
        if not pairs:
            self.walk(dot, node.otherwise)
            return
        for key, element in pairs:
            mark = len(self.variables)
            if len(names) == 1:
                self.variables.append((names[0], element))
            elif len(names) == 2:
                self.variables.append((names[0], key))
                self.variables.append((names[1], element))
            self.walk(element, node.body)
            del self.variables[mark:]

    def eval_pipeline(self, dot: Any, pipe: _Pipeline, *, declare: bool = True) -> Any:
        value: Any = _MISSING
        for command in pipe.commands:
            value = self.eval_command(dot, command, value)
        if declare and pipe.declarations:
            for name in pipe.declarations:
                if pipe.is_assign:
                    self.assign(name, value)
                else:
                    self.variables.append((name, value))
        return value

    def eval_command(self, dot: Any, command: _Command, final: Any) -> Any:
        head = command.args[0]
        args = command.args[1:]
        if isinstance(head, _Field):
            return self.eval_field_chain(dot, head, args=args, final=final)
        if isinstance(head, _Chain):
            receiver = self.eval_arg(dot, head.node)
            if head.names:
                return self.eval_field_chain(receiver, head, args=args, final=final)
            self.not_a_function(head, args, final)
            return receiver
        if isinstance(head, _Identifier):
            return self.call(dot, head, args, final, where=command)
        if isinstance(head, _Variable):
            receiver = self.lookup(head.name)
            if head.names:
                return self.eval_field_chain(receiver, head, args=args, final=final)
            self.not_a_function(head, args, final)
            return receiver
        self.not_a_function(head, args, final)
        if isinstance(head, _Constant) and head.is_nil:
            raise self.error(head, "nil is not a command")
        return self.eval_arg(dot, head)

    def not_a_function(self, node: _Node, args: Sequence[_Node], final: Any) -> None:
        if args or final is not _MISSING:
            raise self.error(node, f"can't give argument to non-function {node.text}")

    def eval_arg(self, dot: Any, node: _Node) -> Any:
        if isinstance(node, _Dot):
            return dot
        if isinstance(node, _Constant):
            return node.value
        if isinstance(node, _Field):
            return self.eval_field_chain(dot, node)
        if isinstance(node, _Variable):
            value = self.lookup(node.name)
            if node.names:
                return self.eval_field_chain(value, node)
            return value
        if isinstance(node, _Pipeline):
            mark = len(self.variables)
            try:
                return self.eval_pipeline(dot, node)
            finally:
                del self.variables[mark:]
        if isinstance(node, _Chain):
            receiver = self.eval_arg(dot, node.node)
            if node.names:
                return self.eval_field_chain(receiver, node)
            return receiver
        if isinstance(node, _Identifier):
            return self.call(dot, node, (), _MISSING)
        raise self.error(node, "can't handle argument")  # pragma: no cover - parser prevents it

    def eval_field_chain(self, receiver: Any, node: _Field | _Chain | _Variable, *,
                         args: Sequence[_Node] = (), final: Any = _MISSING) -> Any:
        names = node.names
        for index, name in enumerate(names):
            last = index == len(names) - 1
            if last and (args or final is not _MISSING):
                raise self.error(node, f"{name} has arguments but cannot be invoked as function")
            receiver = self.eval_field(node, name, receiver)
        return receiver

    def eval_field(self, node: _Node, name: str, receiver: Any) -> Any:
        if receiver is NO_VALUE or receiver is None:
            raise self.error(node, f"nil pointer evaluating {_go_type(receiver)}.{name}")
        if isinstance(receiver, GoStruct):
            if name in receiver.fields:
                return receiver.fields[name]
            raise self.error(node, f"can't evaluate field {name} in type {receiver.type_name}")
        if isinstance(receiver, Mapping):
            return receiver.get(name, NO_VALUE)
        raise self.error(node, f"can't evaluate field {name} in type {_go_type(receiver)}")

    def call(self, dot: Any, node: _Identifier, args: Sequence[_Node], final: Any,
             *, where: _Node | None = None) -> Any:
        name = node.name
        site = node if where is None else where
        if name in ("and", "or"):
            # Short-circuit like Go 1.18+: stop at the first deciding argument.
            operands: list[Any] = [*args, final] if final is not _MISSING else list(args)
            if not operands:
                raise self.error(site, f"wrong number of args for {name}: want at least 1 got 0")
            value: Any = None
            for operand in operands:
                value = self.eval_arg(dot, operand) if isinstance(operand, _Node) else operand
                truth = bool(_truth(value))
                if (name == "and" and not truth) or (name == "or" and truth):
                    return value
            return value
        values = [self.eval_arg(dot, arg) for arg in args]
        if final is not _MISSING:
            values.append(final)
        # An invalid value handed to a function arrives as nil, as with Go's reflection.
        values = [None if value is NO_VALUE else value for value in values]
        function = _FUNCTIONS[name]
        try:
            return function(values)
        except _ArgumentCountError as error:
            raise self.error(site, str(error)) from None
        except _CallError as error:
            raise self.error(site, f"error calling {name}: {error}") from None


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


# --- public API -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Template:
    """A parsed template; `render` may be called any number of times, concurrently."""

    name: str
    source: str
    _nodes: tuple[_Node, ...] = field(repr=False, compare=False)

    def render(self, data: Any) -> str:
        """Execute with `data` as `.` (and `$`); raises TemplateExecutionError like Go's Execute."""
        state = _State(self, variables=[("$", data)])
        state.walk(data, self._nodes)
        return "".join(state.output)


def parse_template(source: str, *, name: str) -> Template:
    """Parse `source` with `<<`/`>>` delimiters; `name` appears in messages as Go's does."""
    return Template(name, source, _Parser(source, name).parse())
