"""Evaluator for templates parsed by ``nstance.config.gotemplate``, with Go's semantics.

Data is built from ``GoStruct`` (a struct: an unknown field is an error, as in Go), ``dict``
(a map: with ``missingkey=zero`` a missing key yields the map's zero value, ``""`` for Nstance's
``map[string]string`` data), lists, strings, ints, floats, bools and None (Go's nil).

Values print as Go's ``fmt.Print`` prints them; truth follows Go (false, 0, nil and empty strings,
maps and lists are false; structs are true); ``and``/``or`` short-circuit; ``eq``/``ne``/``lt``/...
compare basic values of the same kind and refuse to mix kinds; ``range`` over a map visits keys in
sorted order; ``printf`` follows ``nstance.config.goformat``. Every failure is an ``ExecError``
whose message names the line and the action, like Go's ``executing ... at <.X>``.
"""

from __future__ import annotations

import html
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nstance.config.goformat import GoByte, go_sprint, go_sprintf, go_sprintln, go_type, go_value_string
from nstance.config.gotemplate import (
    Action,
    Branch,
    Chain,
    Command,
    Field,
    Identifier,
    Item,
    Literal,
    Node,
    Pipeline,
    Text,
    Variable,
)

MAX_OUTPUT = 16 * 1024 * 1024
MAX_RANGE_STEPS = 1_000_000


class ExecError(ValueError):
    """A template failed while executing."""


class UnknownField(ExecError):
    """A field that the data's struct does not have (``.Instance.Foo``)."""


class RequiredKeys(dict[str, Any]):
    """A map whose missing keys are errors, not zero values (``.Image``: an image that could not be
    resolved must stop a create with the reason, not launch a VM without an image)."""

    def __init__(self, path: str, items: Mapping[str, Any]) -> None:
        super().__init__(items)
        self.path = path

    def lookup(self, key: str) -> Any:
        if key not in self:
            raise ExecError(f'undefined variable "{self.path}.{key}"')
        return self[key]


@dataclass(frozen=True, slots=True)
class GoStruct:
    """A Go struct value: named fields in order; ``name`` is used in error messages."""

    name: str
    fields: Mapping[str, Any]


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


def truth(value: Any) -> bool:
    """Go template truth: false, 0, nil, empty string/map/list are false; structs are true."""
    if value is None:
        return False
    if isinstance(value, GoStruct):
        return True
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, (str, bytes, dict, list, tuple)):
        return len(value) > 0
    return True


# ---- comparison and builtin functions ------------------------------------------------------------


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "nil"
    return "other"


def _comparable(value: Any) -> bool:
    """Whether Go's ``==`` takes the value: not a map or slice, nor a struct holding one."""
    if isinstance(value, GoStruct):
        return all(_comparable(field) for field in value.fields.values())
    return not isinstance(value, (dict, list, tuple))


def _eq(a: Any, b: Any) -> bool:
    """Go's ``eq`` on two operands: basic values of one kind compare; nil equals only nil; structs
    of comparable fields compare; a basic value against another kind, or maps and slices, fail."""
    ka, kb = _kind(a), _kind(b)
    basic = ("bool", "int", "float", "string")
    if ka in basic or kb in basic:
        if ka == kb:
            return bool(a == b)
        if a is None or b is None:
            return False
        raise ExecError("incompatible types for comparison")
    if a is None or b is None:
        return a is None and b is None
    if go_type(a) != go_type(b) or not _comparable(a):
        raise ExecError(f"non-comparable type {go_type(a)}")
    return bool(a == b)


def _ordered(name: str, a: Any, b: Any) -> tuple[Any, Any]:
    ka, kb = _kind(a), _kind(b)
    if ka not in ("int", "float", "string") or kb not in ("int", "float", "string"):
        raise ExecError(f"{name}: invalid type for comparison")
    if ka != kb:
        raise ExecError(f"{name}: incompatible types for comparison")
    return a, b


def _fn_eq(*args: Any) -> bool:
    if len(args) < 2:
        raise ExecError("missing argument for comparison")
    return any(_eq(args[0], other) for other in args[1:])


def _fn_ne(a: Any, b: Any) -> bool:
    return not _eq(a, b)


def _fn_lt(a: Any, b: Any) -> bool:
    x, y = _ordered("lt", a, b)
    return bool(x < y)


def _fn_le(a: Any, b: Any) -> bool:
    x, y = _ordered("le", a, b)
    return bool(x <= y)


def _fn_gt(a: Any, b: Any) -> bool:
    x, y = _ordered("gt", a, b)
    return bool(x > y)


def _fn_ge(a: Any, b: Any) -> bool:
    x, y = _ordered("ge", a, b)
    return bool(x >= y)


def _fn_not(a: Any) -> bool:
    return not truth(a)


def _fn_len(a: Any) -> int:
    if isinstance(a, str):
        return len(a.encode("utf-8"))
    if isinstance(a, (dict, list, tuple)):
        return len(a)
    raise ExecError(f"len of type {go_type(a)}")


def _index_one(item: Any, key: Any) -> Any:
    if isinstance(item, dict):
        if not isinstance(key, str):
            raise ExecError(f"value has type {go_type(key)}; should be string")
        return item.lookup(key) if isinstance(item, RequiredKeys) else item.get(key, "")
    if isinstance(item, (list, tuple, str)):
        if isinstance(key, bool) or not isinstance(key, int):
            raise ExecError(f"cannot index slice/array with type {go_type(key)}")
        if isinstance(item, str):
            data = item.encode("utf-8")
            if not 0 <= key < len(data):
                raise ExecError(f"index out of range: {key}")
            return GoByte(data[key])
        if not 0 <= key < len(item):
            raise ExecError(f"index out of range: {key}")
        return item[key]
    if item is None:
        raise ExecError("index of untyped nil")
    raise ExecError(f"can't index item of type {go_type(item)}")


def _fn_index(item: Any, *keys: Any) -> Any:
    if item is None:
        raise ExecError("index of untyped nil")
    for key in keys:
        item = _index_one(item, key)
    return item


def _fn_slice(item: Any, *bounds: Any) -> Any:
    if not isinstance(item, (str, list, tuple)):
        raise ExecError(f"can't slice item of type {go_type(item)}")
    if len(bounds) > 2:
        raise ExecError("too many slice indexes")
    for bound in bounds:
        if isinstance(bound, bool) or not isinstance(bound, int):
            raise ExecError(f"cannot index slice/array with type {go_type(bound)}")
    seq: Any = item.encode("utf-8") if isinstance(item, str) else item
    low = bounds[0] if bounds else 0
    high = bounds[1] if len(bounds) > 1 else len(seq)
    if not 0 <= low <= high <= len(seq):
        raise ExecError(f"index out of range: {high if high > len(seq) else low}")
    part = seq[low:high]
    return part.decode("utf-8", "replace") if isinstance(item, str) else list(part)


def _escaper_text(args: tuple[Any, ...]) -> str:
    """The text ``html`` and ``urlquery`` escape: their operands printed as Go's ``fmt.Sprint``
    prints them, a nil one as ``<no value>`` (text/template hands over no value for it)."""
    return go_sprint(*("<no value>" if arg is None else arg for arg in args))


def _fn_html(*args: Any) -> str:
    text = _escaper_text(args)
    return (
        html.escape(text, quote=True)
        .replace("&#x27;", "&#39;")
        .replace("&quot;", "&#34;")
        .replace("\x00", "\ufffd")
    )


def _fn_urlquery(*args: Any) -> str:
    return urllib.parse.quote_plus(_escaper_text(args), safe="")


_FUNCS: dict[str, Callable[..., Any]] = {
    "not": _fn_not,
    "len": _fn_len,
    "index": _fn_index,
    "slice": _fn_slice,
    "print": go_sprint,
    "printf": go_sprintf,
    "println": go_sprintln,
    "html": _fn_html,
    "urlquery": _fn_urlquery,
    "eq": _fn_eq,
    "ne": _fn_ne,
    "lt": _fn_lt,
    "le": _fn_le,
    "gt": _fn_gt,
    "ge": _fn_ge,
}
_ARITY: dict[str, tuple[int, int | None]] = {
    "not": (1, 1), "len": (1, 1), "index": (1, None), "slice": (1, None), "ne": (2, 2), "lt": (2, 2),
    "le": (2, 2), "gt": (2, 2), "ge": (2, 2), "eq": (1, None), "and": (1, None), "or": (1, None),
    "printf": (1, None),
}  # fmt: skip


# ---- execution -----------------------------------------------------------------------------------


def _describe(node: Node) -> str:
    if isinstance(node, Field):
        return "." + ".".join(node.names) if node.names else "."
    if isinstance(node, Variable):
        return node.name + "".join("." + n for n in node.names)
    if isinstance(node, Identifier):
        return node.name
    if isinstance(node, Literal):
        return go_value_string(node.value)
    if isinstance(node, Chain):
        return "(" + _describe_pipe(node.node) + ")" + "".join("." + n for n in node.names)
    return "(" + _describe_pipe(node) + ")"


def _describe_pipe(pipe: Pipeline) -> str:
    return " | ".join(" ".join(_describe(arg) for arg in cmd.args) for cmd in pipe.commands)


class _State:
    def __init__(self, root: Any) -> None:
        self.vars: list[tuple[str, Any]] = [("$", root)]
        self.out: list[str] = []
        self.size = 0
        self.steps = 0

    def write(self, text: str) -> None:
        self.size += len(text)
        if self.size > MAX_OUTPUT:
            raise ExecError(f"output is larger than {MAX_OUTPUT} bytes")
        self.out.append(text)

    def lookup(self, name: str, line: int) -> Any:
        for var, value in reversed(self.vars):
            if var == name:
                return value
        raise ExecError(f"line {line}: undefined variable: {name}")

    def assign(self, name: str, value: Any, line: int) -> None:
        for i in range(len(self.vars) - 1, -1, -1):
            if self.vars[i][0] == name:
                self.vars[i] = (name, value)
                return
        raise ExecError(f"line {line}: undefined variable: {name}")


def _field(value: Any, name: str, where: str) -> Any:
    if isinstance(value, GoStruct):
        if name not in value.fields:
            raise UnknownField(f"can't evaluate field {name} in type {value.name}")
        return value.fields[name]
    if isinstance(value, RequiredKeys):
        return value.lookup(name)
    if isinstance(value, dict):
        return value.get(name, "")
    if value is None:
        raise ExecError(f"nil pointer evaluating {where}")
    raise ExecError(f"can't evaluate field {name} in type {go_type(value)}")


def _fields(value: Any, names: tuple[str, ...], where: str) -> Any:
    for name in names:
        value = _field(value, name, where)
    return value


class _Executor:
    def __init__(self, root: Any) -> None:
        self.state = _State(root)

    def run(self, items: list[Item], dot: Any) -> None:
        for item in items:
            if isinstance(item, Text):
                self.state.write(item.text)
            elif isinstance(item, Action):
                value = self.pipeline(item.pipe, dot)
                if not item.pipe.decl:
                    self.state.write(go_value_string(value, top=True))
            elif isinstance(item, Branch):
                self.branch(item, dot)
            else:
                raise _Break() if item.word == "break" else _Continue()

    def scoped(self, items: list[Item], dot: Any, bindings: list[tuple[str, Any]] | None = None) -> None:
        mark = len(self.state.vars)
        self.state.vars.extend(bindings or ())
        try:
            self.run(items, dot)
        finally:
            del self.state.vars[mark:]

    def branch(self, item: Branch, dot: Any) -> None:
        mark = len(self.state.vars)
        try:
            value = self.pipeline(item.pipe, dot, bind=item.kind != "range")
            if item.kind == "if":
                self.scoped(item.body if truth(value) else item.other, dot)
            elif item.kind == "with":
                if truth(value):
                    self.scoped(item.body, value)
                else:
                    self.scoped(item.other, dot)
            else:
                # As Go does, the declared variables first take the pipeline's value itself
                # (an assignment to an undeclared one fails even when there is nothing to iterate).
                for name in item.pipe.decl:
                    if item.pipe.assign:
                        self.state.assign(name, value, item.pipe.line)
                    else:
                        self.state.vars.append((name, value))
                self.range(item, value, dot)
        finally:
            del self.state.vars[mark:]

    def range(self, item: Branch, value: Any, dot: Any) -> None:
        pairs: list[tuple[Any, Any]]
        if isinstance(value, dict):
            pairs = [(key, value[key]) for key in sorted(value)]
        elif isinstance(value, (list, tuple)):
            pairs = list(enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            if len(item.pipe.decl) > 1:
                raise ExecError(
                    f"line {item.pipe.line}: can't use {value} to iterate over more than one variable"
                )
            if value > MAX_RANGE_STEPS:
                raise ExecError(f"line {item.pipe.line}: range over {value} is too long")
            pairs = [(i, i) for i in range(value)]
        elif value is None:
            pairs = []
        else:
            raise ExecError(f"line {item.pipe.line}: range can't iterate over {go_value_string(value)}")
        if not pairs:
            self.scoped(item.other, dot)
            return
        decl = item.pipe.decl
        for key, element in pairs:
            self.state.steps += 1
            if self.state.steps > MAX_RANGE_STEPS:
                raise ExecError(f"line {item.pipe.line}: range ran more than {MAX_RANGE_STEPS} times")
            bindings: list[tuple[str, Any]] = []
            if len(decl) == 1:
                bindings = [(decl[0], element)]
            elif len(decl) == 2:
                bindings = [(decl[0], key), (decl[1], element)]
            if item.pipe.assign:
                for name, bound in bindings:
                    self.state.assign(name, bound, item.pipe.line)
                bindings = []
            try:
                self.scoped(item.body, element, bindings)
            except _Break:
                break
            except _Continue:
                continue

    def pipeline(self, pipe: Pipeline, dot: Any, *, bind: bool = True) -> Any:
        value: Any = _NO_VALUE
        for cmd in pipe.commands:
            value = self.command(cmd, dot, value, pipe.line)
        if bind and pipe.decl:
            name = pipe.decl[0]
            if pipe.assign:
                self.state.assign(name, value, pipe.line)
            else:
                self.state.vars.append((name, value))
        return value

    def command(self, cmd: Command, dot: Any, final: Any, line: int) -> Any:
        first = cmd.args[0]
        where = _describe(first)
        try:
            if isinstance(first, Literal) and first.value is None:
                raise ExecError("nil is not a command")
            if isinstance(first, Identifier):
                return self.call(first.name, cmd.args[1:], dot, final, line)
            if len(cmd.args) > 1 or final is not _NO_VALUE:
                if isinstance(first, (Field, Variable, Chain)) and first.names:
                    raise ExecError(f"{where} has arguments but cannot be invoked as function")
                raise ExecError(f"can't give argument to non-function {where}")
            return self.arg(first, dot, line)
        except ExecError as exc:
            if str(exc).startswith("line "):
                raise
            raise type(exc)(f"line {line}: executing at <{where}>: {exc}") from None

    def arg(self, node: Node, dot: Any, line: int) -> Any:
        if isinstance(node, Field):
            return _fields(dot, node.names, _describe(node))
        if isinstance(node, Variable):
            return _fields(self.state.lookup(node.name, line), node.names, _describe(node))
        if isinstance(node, Literal):
            value = node.value
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1 << 63:
                raise ExecError(f"{value} overflows int")
            return value
        if isinstance(node, Chain):
            return _fields(self.pipeline(node.node, dot), node.names, _describe(node))
        if isinstance(node, Pipeline):
            mark = len(self.state.vars)
            try:
                return self.pipeline(node, dot)
            finally:
                del self.state.vars[mark:]
        if isinstance(node, Identifier):
            return self.call(node.name, (), dot, _NO_VALUE, line)
        raise ExecError(f"can't evaluate {node!r}")

    def call(self, name: str, nodes: tuple[Node, ...], dot: Any, final: Any, line: int) -> Any:
        count = len(nodes) + (final is not _NO_VALUE)
        low, high = _ARITY.get(name, (0, None))
        if count < low or (high is not None and count > high):
            expected = str(low) if high == low else f"at least {low}"
            raise ExecError(f"wrong number of args for {name}: want {expected} got {count}")
        if name in ("and", "or"):
            value: Any = None
            for i in range(count):
                value = final if i == len(nodes) else self.arg(nodes[i], dot, line)
                if truth(value) != (name == "and"):
                    return value
            return value
        args = [self.arg(node, dot, line) for node in nodes]
        if final is not _NO_VALUE:
            args.append(final)
        return _FUNCS[name](*args)


class _NoValue:
    pass


_NO_VALUE: Any = _NoValue()


def execute(items: list[Item], data: Any) -> str:
    """Run a parsed template against ``data``; raise ExecError on failure."""
    executor = _Executor(data)
    try:
        executor.run(items, data)
    except RecursionError:
        raise ExecError("template nesting is too deep") from None
    return "".join(executor.state.out)
