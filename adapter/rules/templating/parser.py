"""The parse tree and the parser: actions, pipelines, commands and control structures, with
the errors Go's text/template/parse reports."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from adapter.rules.templating.lexer import _Item, _Lexer
from adapter.rules.templating.values import TemplateSyntaxError
from metricscale.core.selectors import quote_go_string


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
