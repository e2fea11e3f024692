"""Executing a parse tree over data, as Go's text/template executes it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapter.rules.templating.functions import _FUNCTIONS, _ArgumentCountError, _CallError
from adapter.rules.templating.parser import (
    _Action,
    _Chain,
    _Command,
    _Constant,
    _Control,
    _Dot,
    _Field,
    _Identifier,
    _Node,
    _Pipeline,
    _Text,
    _Variable,
)
from adapter.rules.templating.values import (
    NO_VALUE,
    GoStruct,
    TemplateExecutionError,
    _go_type,
    _truth,
    go_sprint_value,
)
from metricscale.core.selectors import quote_go_string

if TYPE_CHECKING:
    from adapter.rules.templating import Template


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
