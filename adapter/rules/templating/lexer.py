"""The lexer: text and actions between `<<` and `>>` (trim markers, comments), as Go's
text/template/parse lexer splits them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from adapter.rules.templating.values import TemplateSyntaxError
from metricscale.core.selectors import quote_go_string

_LEFT = "<<"
_RIGHT = ">>"
_SPACE = " \t\r\n"
_KEYWORDS = frozenset({"block", "break", "continue", "define", "else", "end", "if", "range",
                       "nil", "template", "with"})
# One-character items other than the parentheses (which count depth).
_SINGLE = {"=": "assign", "|": "pipe", ",": "comma"}
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
            elif char in _SINGLE:
                self.items.append(_Item(_SINGLE[char], char, pos))
                pos += 1
            elif char == ":":
                if not src.startswith(":=", pos):
                    raise self.error("expected :=", pos)
                self.items.append(_Item("declare", ":=", pos))
                pos += 2
            elif char in "\"`'":
                pos = self.lex_quoted(pos, char)
            elif char == "$":
                pos = self.lex_word(pos + 1, "variable", start=pos)
            elif char == "." and not (pos + 1 < len(src) and src[pos + 1].isdigit()):
                pos = self.lex_word(pos + 1, "field", start=pos)
            elif char in "+-." or char.isdigit():
                pos = self.lex_number(pos)
            elif char.isalnum() or char == "_":
                pos = self.lex_identifier(pos)
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
            else:
                raise self.error(f"unrecognized character in action: U+{ord(char):04X} '{char}'",
                                 pos)

    def lex_quoted(self, pos: int, quote: str) -> int:
        """A "string", a `raw string` or a 'c'haracter constant starting at `pos`."""
        src = self.source
        if quote == '"':
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
            return end + 1
        if quote == "`":
            end = src.find("`", pos + 1)
            if end < 0:
                raise self.error("unterminated raw quoted string", pos)
            self.items.append(_Item("raw", src[pos:end + 1], pos))
            return end + 1
        match = _CHAR.match(src, pos)
        if match is None:
            raise self.error("unterminated character constant", pos)
        self.items.append(_Item("char", match.group(0), pos))
        return match.end()

    def lex_number(self, pos: int) -> int:
        src = self.source
        match = _NUMBER.match(src, pos)
        if match is None or match.end() == pos:
            raise self.error(f"bad number syntax: {quote_go_string(src[pos:pos + 1])}", pos)
        end = match.end()
        if end < len(src) and (src[end].isalnum() or src[end] == "_"):
            raise self.error(f"bad number syntax: {quote_go_string(src[pos:end + 1])}", pos)
        self.items.append(_Item("number", src[pos:end], pos))
        return end

    def lex_identifier(self, pos: int) -> int:
        """A keyword, `true`/`false`, or a function name."""
        src = self.source
        end = pos
        while end < len(src) and (src[end].isalnum() or src[end] == "_"):
            end += 1
        self.check_terminator(end)
        word = src[pos:end]
        kind = "keyword" if word in _KEYWORDS else \
            "bool" if word in ("true", "false") else "identifier"
        self.items.append(_Item(kind, word, pos))
        return end

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
