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

The parts, in Go's order: values, lexer, parser (and the parse tree), execution, functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from adapter.rules.templating.execution import _State
from adapter.rules.templating.parser import _Node, _Parser
from adapter.rules.templating.values import (
    NO_VALUE,
    GoStruct,
    TemplateExecutionError,
    TemplateSyntaxError,
    go_sprint_value,
)

__all__ = [
    "NO_VALUE",
    "GoStruct",
    "Template",
    "TemplateExecutionError",
    "TemplateSyntaxError",
    "go_sprint_value",
    "parse_template",
]


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
