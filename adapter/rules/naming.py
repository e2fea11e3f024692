"""Series name → API metric name: RE2 regexes, `seriesFilters`, `name.matches`/`as` expansion.

prometheus-adapter compiles these regexes with Go's RE2 engine. Python's `re` differs in a few
places, so `compile_re2` translates RE2 syntax into an equivalent Python pattern and refuses the
syntax that only Python understands (lookarounds, backreferences, possessive quantifiers) with
Go's own error words, so a config that works here also works upstream and the other way round.
`expand_go_template` is `regexp.ExpandString`, including its `$name` longest-word rule that
turns `$1_per_second` into the empty string.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from metricscale.core.selectors import quote_go_string

__all__ = [
    "NameMatcher",
    "NamingError",
    "RegexError",
    "SeriesFilter",
    "compile_re2",
    "expand_go_template",
    "make_series_filter",
    "passes_filters",
    "rule_filters",
]


class RegexError(ValueError):
    """A pattern that RE2 (or our translation of it) does not accept."""


class NamingError(ValueError):
    """A `name` or `seriesFilters` setting that prometheus-adapter would refuse at startup."""


# --- RE2 → Python ---------------------------------------------------------------------------------

_POSIX_CLASSES = {
    "alnum": "0-9A-Za-z", "alpha": "A-Za-z", "ascii": "\\x00-\\x7f", "blank": "\\t ",
    "cntrl": "\\x00-\\x1f\\x7f", "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~",
    "punct": "!-/:-@\\[-`{-~", "space": "\\t\\n\\v\\f\\r ", "upper": "A-Z", "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}
_GO_SPACE = "\\t\\n\\f\\r "  # RE2's \s: no \v, unlike Python's
_REPEAT = re.compile(r"\{([0-9]+)(,([0-9]*))?\}")
_SIMPLE_ESCAPES = {"a": "\\a", "f": "\\f", "t": "\\t", "n": "\\n", "r": "\\r", "v": "\\v"}


def _syntax_error(code: str, expression: str) -> RegexError:
    return RegexError(f"error parsing regexp: {code}: `{expression}`")


def _literal(char: str) -> str:
    """One character as a Python pattern literal, safe inside and outside classes."""
    if char.isascii() and char.isalnum():
        return char
    code = ord(char)
    if 0x21 <= code <= 0x7E:
        return "\\" + char
    return f"\\U{code:08x}"


class _Translator:
    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.pos = 0
        self.out: list[str] = []
        # Per open group: the inline flag groups opened inside it, closed at `|` and `)`.
        self.flag_stack: list[list[str]] = [[]]
        self.multiline = bool(re.search(r"\(\?[a-zA-Z]*m", pattern))

    def run(self) -> str:
        pattern = self.pattern
        while self.pos < len(pattern):
            char = pattern[self.pos]
            if char == "\\":
                self.escape()
            elif char == "[":
                self.char_class()
            elif char == "(":
                self.open_group()
            elif char == ")":
                if len(self.flag_stack) == 1:
                    raise _syntax_error("unexpected )", pattern)
                self.out.append(")" * len(self.flag_stack.pop()))
                self.out.append(")")
                self.pos += 1
            elif char == "|":
                flags = self.flag_stack[-1]
                self.out.append(")" * len(flags) + "|" + "".join(flags))
                self.pos += 1
            elif char in "*+?":
                self.out.append(char)
                self.pos += 1
                self.check_repeat_after(allow_lazy=True)
            elif char == "{":
                match = _REPEAT.match(pattern, self.pos)
                if match is None:
                    self.out.append("\\{")  # RE2 treats a brace that is not a repeat as literal
                    self.pos += 1
                    continue
                low = int(match.group(1))
                high = match.group(3)
                if low > 1000 or (high not in (None, "") and (int(high) > 1000 or
                                                             int(high) < low)):
                    raise _syntax_error("invalid repeat count", match.group(0))
                self.out.append(match.group(0))
                self.pos = match.end()
                self.check_repeat_after(allow_lazy=True)
            elif char == "}":
                self.out.append("\\}")
                self.pos += 1
            elif char == "$":
                self.out.append("$" if self.multiline else "\\Z")
                self.pos += 1
            else:
                self.out.append(char)
                self.pos += 1
        if len(self.flag_stack) != 1:
            raise _syntax_error("missing closing )", pattern)
        self.out.append(")" * len(self.flag_stack[0]))
        return "".join(self.out)

    def check_repeat_after(self, *, allow_lazy: bool = False) -> None:
        """RE2 rejects `a**`, `a*+`, `a+{2}`; Python reads `a*+` as possessive, so refuse it."""
        pattern = self.pattern
        start = self.pos
        if allow_lazy and self.pos < len(pattern) and pattern[self.pos] == "?":
            self.out.append("?")
            self.pos += 1
        if self.pos < len(pattern) and (pattern[self.pos] in "*+?" or
                                        _REPEAT.match(pattern, self.pos)):
            operator = pattern[max(0, start - 1):self.pos + 1]
            raise _syntax_error("invalid nested repetition operator", operator)

    def open_group(self) -> None:
        pattern = self.pattern
        rest = pattern[self.pos:]
        if not rest.startswith("(?"):
            self.out.append("(")
            self.flag_stack.append([])
            self.pos += 1
            return
        named = re.match(r"\(\?P?<([^>]*)>", rest)
        if named is not None and not rest.startswith(("(?<=", "(?<!")):
            name = named.group(1)
            if not name or not re.fullmatch(r"[A-Za-z0-9_]+", name):
                raise _syntax_error("invalid named capture", named.group(0))
            self.out.append(f"(?P<{name}>")
            self.flag_stack.append([])
            self.pos += named.end()
            return
        flags = re.match(r"\(\?([a-zA-Z]*)(-([a-zA-Z]*))?([:)])", rest)
        if flags is None:
            raise _syntax_error("invalid or unsupported Perl syntax", rest[:3])
        on, off, end = flags.group(1), flags.group(3) or "", flags.group(4)
        for letter in on + off:
            if letter == "U":
                raise RegexError("error parsing regexp: the (?U) ungreedy flag is not supported "
                                 f"by metricscale: `{flags.group(0)}`")
            if letter not in "ims":
                raise _syntax_error("invalid or unsupported Perl syntax", flags.group(0))
        if flags.group(2) is not None and not off:
            raise _syntax_error("invalid or unsupported Perl syntax", flags.group(0))
        python_flags = on + (f"-{off}" if off else "")
        self.pos += flags.end()
        if end == ":":
            self.out.append(f"(?{python_flags}:")
            self.flag_stack.append([])
        elif python_flags:
            # Go applies `(?i)` to the rest of the enclosing group; Python 3.11 only allows
            # global flags at the very start, so scope them explicitly.
            opener = f"(?{python_flags}:"
            self.out.append(opener)
            self.flag_stack[-1].append(opener)

    def escape(self) -> None:
        pattern = self.pattern
        if self.pos + 1 >= len(pattern):
            raise RegexError("error parsing regexp: trailing backslash at end of expression: ``")
        code = pattern[self.pos + 1]
        if code == "Q":
            end = pattern.find("\\E", self.pos + 2)
            text = pattern[self.pos + 2:] if end < 0 else pattern[self.pos + 2:end]
            self.out.append("".join(_literal(c) for c in text))
            self.pos = len(pattern) if end < 0 else end + 2
            return
        if code == "z":
            self.out.append("\\Z")
        elif code in "AbB":
            self.out.append("\\" + code)
        elif code == "s":
            self.out.append(f"[{_GO_SPACE}]")
        elif code == "S":
            self.out.append(f"[^{_GO_SPACE}]")
        elif code in "dDwW":
            self.out.append("\\" + code)
        else:
            self.out.append(self.escaped_char())
            return
        self.pos += 2

    def escaped_char(self) -> str:
        """A single-character escape (octal, hex, `\\n`, punctuation) as a Python literal."""
        char = self.escaped_rune()
        return _literal(char)

    def escaped_rune(self) -> str:
        pattern = self.pattern
        start = self.pos
        code = pattern[self.pos + 1]
        self.pos += 2
        if code in "01234567":
            digits = re.match(r"[0-7]{0,2}", pattern[self.pos:])
            assert digits is not None
            if code != "0" and not digits.group(0):
                raise _syntax_error("invalid escape sequence", pattern[start:self.pos])
            self.pos += digits.end()
            return chr(int(code + digits.group(0), 8))
        if code == "x":
            braced = re.match(r"\{([0-9a-fA-F]+)\}", pattern[self.pos:])
            plain = re.match(r"[0-9a-fA-F]{2}", pattern[self.pos:])
            if braced is not None and int(braced.group(1), 16) <= 0x10FFFF:
                self.pos += braced.end()
                return chr(int(braced.group(1), 16))
            if plain is not None:
                self.pos += 2
                return chr(int(plain.group(0), 16))
            raise _syntax_error("invalid escape sequence", pattern[start:self.pos + 2])
        if code in _SIMPLE_ESCAPES:
            return {"a": "\a", "f": "\f", "t": "\t", "n": "\n", "r": "\r", "v": "\v"}[code]
        if code in "pP":
            raise RegexError("error parsing regexp: Unicode classes (\\p, \\P) are not supported "
                             f"by metricscale: `{pattern[start:self.pos]}`")
        if code.isascii() and not code.isalnum():
            return code
        raise _syntax_error("invalid escape sequence", pattern[start:self.pos])

    def char_class(self) -> None:
        pattern = self.pattern
        start = self.pos
        self.pos += 1
        parts = ["["]
        if self.pos < len(pattern) and pattern[self.pos] == "^":
            parts.append("^")
            self.pos += 1
        first = True
        while True:
            if self.pos >= len(pattern):
                raise _syntax_error("missing closing ]", pattern[start:])
            char = pattern[self.pos]
            if char == "]" and not first:
                self.pos += 1
                break
            first = False
            posix = re.match(r"\[:(\^?)([a-z]+):\]", pattern[self.pos:])
            if posix is not None:
                ranges = _POSIX_CLASSES.get(posix.group(2))
                if ranges is None:
                    raise _syntax_error("invalid character class range", posix.group(0))
                if posix.group(1):
                    raise RegexError("error parsing regexp: negated POSIX classes are not "
                                     f"supported by metricscale: `{posix.group(0)}`")
                parts.append(ranges)
                self.pos += posix.end()
                continue
            if char == "\\" and self.pos + 1 < len(pattern):
                code = pattern[self.pos + 1]
                if code in "dDwW":
                    parts.append("\\" + code)
                    self.pos += 2
                    continue
                if code == "s":
                    parts.append(_GO_SPACE)
                    self.pos += 2
                    continue
                if code == "S":
                    parts.append("\\S")  # Python's \S also excludes \v; RE2's does not
                    self.pos += 2
                    continue
            low = self.class_char()
            if self.pos + 1 < len(pattern) and pattern[self.pos] == "-" \
                    and pattern[self.pos + 1] != "]":
                self.pos += 1
                high = self.class_char()
                if high < low:
                    raise _syntax_error("invalid character class range", f"{low}-{high}")
                parts.append(f"{_literal(low)}-{_literal(high)}")
            else:
                parts.append(_literal(low))
        parts.append("]")
        self.out.append("".join(parts))

    def class_char(self) -> str:
        pattern = self.pattern
        if self.pos >= len(pattern):
            raise _syntax_error("missing closing ]", pattern)
        char = pattern[self.pos]
        if char == "\\":
            if self.pos + 1 >= len(pattern):
                raise RegexError("error parsing regexp: trailing backslash at end of "
                                 "expression: ``")
            return self.escaped_rune()
        self.pos += 1
        return char


def compile_re2(pattern: str) -> re.Pattern[str]:
    """Compile an RE2 pattern (Go `regexp.Compile`) into an equivalent Python pattern."""
    translated = _Translator(pattern).run()
    try:
        return re.compile(translated, re.ASCII)
    except re.error as error:
        raise RegexError(f"error parsing regexp: {error.msg}: `{pattern}`") from None


# --- regexp.ExpandString -----------------------------------------------------------------------


def _is_name_char(char: str) -> bool:
    category = unicodedata.category(char)
    return char == "_" or category.startswith("L") or category == "Nd"


def expand_go_template(template: str, match: re.Match[str]) -> str:
    """Go's `Regexp.ExpandString(nil, template, src, match)` for one match."""
    names = match.re.groupindex
    out: list[str] = []
    rest = template
    while True:
        dollar = rest.find("$")
        if dollar < 0:
            break
        out.append(rest[:dollar])
        rest = rest[dollar + 1:]
        if rest.startswith("$"):
            out.append("$")
            rest = rest[1:]
            continue
        braced = rest.startswith("{")
        body = rest[1:] if braced else rest
        length = 0
        while length < len(body) and _is_name_char(body[length]):
            length += 1
        if length == 0 or (braced and not body.startswith("}", length)):
            out.append("$")  # malformed: the dollar is kept as text
            continue
        name = body[:length]
        rest = body[length + 1:] if braced else body[length:]
        number = int(name) if name.isascii() and name.isdigit() and \
            (name == "0" or not name.startswith("0")) and len(name) <= 8 else -1
        group = number if number >= 0 else names.get(name, -1)
        if 0 <= group <= match.re.groups and match.start(group) >= 0:
            out.append(match.group(group))
    out.append(rest)
    return "".join(out)


# --- name matcher and series filters -------------------------------------------------------------


@dataclass(frozen=True)
class NameMatcher:
    """`name: {matches, as}` with upstream's defaults applied."""

    matches: str
    as_template: str
    regex: re.Pattern[str]

    @classmethod
    def from_config(cls, *, matches: str, as_: str, series_query: str) -> NameMatcher:
        """Compile `matches` (default `.*`) and work out the default `as` (`$0` or `$1`)."""
        try:
            regex = compile_re2(matches or ".*")
        except RegexError as error:
            raise NamingError(f"unable to compile series name match expression "
                              f"{_q(matches)} associated with series query {_q(series_query)}: "
                              f"{error}") from None
        template = as_
        if not template:
            if regex.groups == 0:
                template = "$0"
            elif regex.groups == 1:
                template = "$1"
            else:
                raise NamingError(f"must specify an 'as' value for name matcher {_q(matches)} "
                                  f"associated with series query {_q(series_query)}")
        return cls(matches or ".*", template, regex)

    def api_name(self, series_name: str) -> str | None:
        """The API metric name for a series, or None when `matches` does not match it."""
        match = self.regex.search(series_name)
        if match is None:
            return None
        return expand_go_template(self.as_template, match)


@dataclass(frozen=True)
class SeriesFilter:
    """One `is`/`isNot` filter: an unanchored search on the series name."""

    pattern: str
    positive: bool
    regex: re.Pattern[str]

    def matches(self, series_name: str) -> bool:
        return (self.regex.search(series_name) is not None) == self.positive


def _q(text: str) -> str:
    return quote_go_string(text)


def make_series_filter(*, is_: str, is_not: str) -> SeriesFilter:
    """Build a filter, refusing what `NewReMatcher` refuses (with its words)."""
    if is_ and is_not:
        raise NamingError(f"cannot have both an `is` ({_q(is_)}) and `isNot` ({_q(is_not)}) "
                          "expression in a single filter")
    if not is_ and not is_not:
        raise NamingError("must have either an `is` or `isNot` expression in a filter")
    pattern = is_ or is_not
    try:
        regex = compile_re2(pattern)
    except RegexError as error:
        raise NamingError(f"unable to compile series filter {_q(pattern)}: {error}") from None
    return SeriesFilter(pattern, bool(is_), regex)


def passes_filters(filters: Iterable[SeriesFilter], series_name: str) -> bool:
    """All filters of a rule are ANDed."""
    return all(f.matches(series_name) for f in filters)


def rule_filters(filters: Sequence[SeriesFilter], name: NameMatcher,
                 *, explicit_matches: bool) -> tuple[SeriesFilter, ...]:
    """The filters a rule applies: its own, then the implicit `is` from a non-empty `matches`."""
    if not explicit_matches:
        return tuple(filters)
    return (*filters, SeriesFilter(name.matches, True, name.regex))
