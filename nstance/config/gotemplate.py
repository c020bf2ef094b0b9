"""Parser for the Go ``text/template`` language, the subset Nstance templates use.

Everything outside ``{{ }}`` is text and passes through untouched (``${#ARR[@]}``, ``{%``, ``{#``).
Actions: output pipelines, ``if``/``else if``/``else``, ``with``/``else with``, ``range`` (with
``$i, $v :=``, ``else``, ``break``, ``continue``), ``end``, variables (``$x := ...``, ``$x = ...``,
``$``), field chains (``.A.B``, ``$x.A``, ``(pipeline).A``), pipes (``x | printf "%s"``), string,
raw-string, rune, number, ``true``/``false``/``nil`` literals, ``{{/* comments */}}`` and
``{{-``/``-}}`` whitespace trimming, with Go's rules for each.

``define``, ``template``, ``block`` and the functions ``call`` and ``js`` are refused with a
``GoTemplateError`` naming the construct, and so are complex number literals; so is any function Go's
``text/template`` does not define, and a variable used where it is not declared (Go refuses those at
parse time too). The evaluator is ``nstance.config.goexec``. Pure text
processing; nothing is executed here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

FUNCTIONS = frozenset(
    {"and", "or", "not", "len", "index", "slice", "print", "printf", "println", "html", "urlquery",
     "eq", "ne", "lt", "le", "gt", "ge"}
)  # fmt: skip
"""Functions the evaluator implements (all of Go's builtins except ``call`` and ``js``)."""

_UNSUPPORTED_FUNCTIONS = {"call": "call", "js": "js"}
_UNSUPPORTED_KEYWORDS = frozenset({"define", "template", "block"})
_TRIM_SPACE = " \t\r\n"


class GoTemplateError(ValueError):
    """A template that cannot be parsed or uses a construct this implementation does not support."""


class UnsupportedConstruct(GoTemplateError):
    """A valid Go template construct that Nstance does not implement (``define``, ``call``, ...)."""

    def __init__(self, construct: str, line: int) -> None:
        self.construct = construct
        super().__init__(f'line {line}: Go template construct "{construct}" is not supported')


# ---- syntax tree ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Field:
    """``.A.B`` (names) on dot; ``names == ()`` is dot itself."""

    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Variable:
    """``$x.A.B``; ``name`` includes the ``$``."""

    name: str
    names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Chain:
    """``(pipeline).A.B``."""

    node: Pipeline
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Identifier:
    name: str


@dataclass(frozen=True, slots=True)
class Literal:
    value: object


@dataclass(frozen=True, slots=True)
class Command:
    args: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Pipeline:
    line: int
    commands: tuple[Command, ...]
    decl: tuple[str, ...] = ()
    assign: bool = False


@dataclass(frozen=True, slots=True)
class Action:
    pipe: Pipeline


@dataclass(slots=True)
class Branch:
    """``if``/``with``/``range``: ``body`` when the pipeline is true (non-empty), else ``other``."""

    kind: str
    pipe: Pipeline
    body: list[Item] = field(default_factory=list)
    other: list[Item] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class LoopControl:
    word: str  # "break" or "continue"
    line: int


Node = Field | Variable | Chain | Identifier | Literal | Pipeline
Item = Text | Action | Branch | LoopControl


# ---- lexing of the text/action structure --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Segment:
    text: str | None  # text, or None for an action
    body: str = ""
    line: int = 1


def _segments(source: str) -> list[_Segment]:
    """Split into text and action bodies, applying ``{{-``/``-}}`` trimming and dropping comments."""
    out: list[_Segment] = []
    pos = 0
    trim_next = False
    while True:
        start = source.find("{{", pos)
        text = source[pos:] if start < 0 else source[pos:start]
        if trim_next:
            text = text.lstrip(_TRIM_SPACE)
        if start < 0:
            out.append(_Segment(text))
            return out
        line = source.count("\n", 0, start) + 1
        inner = start + 2
        trim_left = (
            source.startswith("-", inner) and inner + 1 < len(source) and source[inner + 1] in _TRIM_SPACE
        )
        if trim_left:
            text = text.rstrip(_TRIM_SPACE)
            inner += 2
        out.append(_Segment(text))
        body_start = inner
        while inner < len(source) and source[inner] in _TRIM_SPACE:
            inner += 1
        if source.startswith("/*", inner):
            close = source.find("*/", inner + 2)
            if close < 0:
                raise GoTemplateError(f"line {line}: unclosed comment")
            after = close + 2
            trim_next = source.startswith(" -}}", after)
            if trim_next:
                after += 4
            elif source.startswith("}}", after):
                after += 2
            else:
                raise GoTemplateError(f"line {line}: comment ends before closing delimiter")
            if not trim_left and inner != body_start:
                raise GoTemplateError(f"line {line}: a comment must start right after {{{{")
            pos = after
            continue
        end, body, trim_next = _action_end(source, body_start, line)
        out.append(_Segment(None, body, line))
        pos = end


def _action_end(source: str, start: int, line: int) -> tuple[int, str, bool]:
    """Find the ``}}`` closing an action (skipping quoted strings); return (end, body, trim_right)."""
    i = start
    n = len(source)
    while i < n:
        ch = source[i]
        if ch in "\"'`":
            i = _skip_quoted(source, i, line)
            continue
        if source.startswith("}}", i):
            body = source[start:i]
            if body.endswith((" -", "\t-", "\n-", "\r-")):
                return i + 2, body[:-1], True
            return i + 2, body, False
        i += 1
    raise GoTemplateError(f"line {line}: unclosed action")


def _skip_quoted(source: str, i: int, line: int) -> int:
    quote = source[i]
    j = i + 1
    while j < len(source):
        ch = source[j]
        if ch == "\\" and quote != "`":
            j += 2
            continue
        if ch == quote:
            return j + 1
        if ch == "\n" and quote != "`":
            break
        j += 1
    raise GoTemplateError(f"line {line}: unterminated quoted string")


# ---- tokens inside an action -------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<declare>:=)
  | (?P<assign>=)
  | (?P<string>"(?:\\.|[^"\\])*")
  | (?P<raw>`[^`]*`)
  | (?P<char>'(?:\\.|[^'\\])+')
  | (?P<number>[+-]?(?:0[xX][0-9a-fA-F_]*(?:\.[0-9a-fA-F_]*)?(?:[pP][+-]?[\d_]*)?
                      |0[oO][0-7_]*(?:\.[0-7_]*)?|0[bB][01_]*(?:\.[01_]*)?
                      |(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?[\d_]*)?)i?)
  | (?P<field>\.[A-Za-z_]\w*)
  | (?P<dot>\.)
  | (?P<variable>\$\w*)
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<punct>[()|,])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str
    text: str
    space_before: bool


def _tokens(body: str, line: int) -> list[_Tok]:
    out: list[_Tok] = []
    pos = 0
    space = True
    while pos < len(body):
        match = _TOKEN.match(body, pos)
        if match is None:
            raise GoTemplateError(f"line {line}: unexpected {body[pos]!r} in action")
        kind = match.lastgroup or ""
        if kind == "space":
            space = True
        else:
            out.append(_Tok(kind, match.group(0), space))
            space = False
        pos = match.end()
    return out


_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\",
            "'": "'", '"': '"'}  # fmt: skip


def _unquote(text: str, line: int) -> str:
    """Interpret a Go double-quoted string or rune literal body (quotes removed)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1 : i + 2]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in ("x", "u", "U"):
            width = {"x": 2, "u": 4, "U": 8}[nxt]
            digits = text[i + 2 : i + 2 + width]
            if len(digits) != width or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise GoTemplateError(f"line {line}: invalid escape in string")
            out.append(chr(int(digits, 16)))
            i += 2 + width
        elif nxt in "01234567" and nxt:
            digits = text[i + 1 : i + 4]
            if len(digits) != 3 or not all(c in "01234567" for c in digits):
                raise GoTemplateError(f"line {line}: invalid escape in string")
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            raise GoTemplateError(f"line {line}: invalid escape \\{nxt} in string")
    return "".join(out)


def _number(text: str, line: int) -> int | float:
    """A number literal as Go's template parser reads it: an integer when it is one (``0x``, ``0o``,
    ``0b`` and a leading ``0`` for octal, ``_`` between digits; up to 64 bits, an int beyond 63 is
    refused when used), else a float (decimal, or hexadecimal with a ``p`` exponent). Complex
    numbers (``1i``) are not supported."""
    if text.endswith("i"):
        raise GoTemplateError(f"line {line}: complex number {text!r} is not supported")
    digits = text.lstrip("+-")
    try:
        if re.fullmatch(r"0[0-7_]*[0-7][0-7_]*", digits):
            value = int(text.replace("_", ""), 8)
        else:
            value = int(text, 0)
    except ValueError:
        pass
    else:
        if not -(1 << 63) <= value < 1 << 64:
            raise GoTemplateError(f"line {line}: integer overflow: {text!r}")
        return value
    hexadecimal = digits[:2] in ("0x", "0X")
    if (hexadecimal and not re.search("[pP]", digits)) or (not hexadecimal and "_" in digits):
        raise GoTemplateError(f"line {line}: illegal number syntax: {text!r}")
    if not re.search("[.eEpP]", digits):
        raise GoTemplateError(f"line {line}: integer overflow: {text!r}")
    try:
        number = float.fromhex(text) if hexadecimal else float(text)
    except ValueError:
        raise GoTemplateError(f"line {line}: illegal number syntax: {text!r}") from None
    if math.isinf(number):
        raise GoTemplateError(f"line {line}: illegal number syntax: {text!r}")
    return number


# ---- parser --------------------------------------------------------------------------------------


class _ActionParser:
    """Parses the tokens of one action into a pipeline."""

    def __init__(self, tokens: list[_Tok], line: int, scope: list[str]) -> None:
        self.toks = tokens
        self.i = 0
        self.line = line
        #: The variables declared so far where this action stands (``$`` first); a declaration here
        #: adds to it, as Go's parser does.
        self.scope = scope

    def peek(self) -> _Tok | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def error(self, message: str) -> GoTemplateError:
        return GoTemplateError(f"line {self.line}: {message}")

    def pipeline(self, context: str, allow_decl: bool = True, *, until_paren: bool = False) -> Pipeline:
        decl: list[str] = []
        assign = False
        if allow_decl:
            decl, assign = self._declarations(context)
        commands: list[Command] = []
        while True:
            commands.append(self.command(until_paren=until_paren))
            tok = self.peek()
            if tok is not None and tok.kind == "punct" and tok.text == "|":
                self.take()
                continue
            break
        tok = self.peek()
        if until_paren:
            if tok is None or tok.text != ")":
                raise self.error("unclosed left paren")
        elif tok is not None:
            raise self.error(f"unexpected {tok.text!r} in {context}")
        return Pipeline(self.line, tuple(commands), tuple(decl), assign)

    def _declarations(self, context: str) -> tuple[list[str], bool]:
        toks = self.toks[self.i :]
        if len(toks) >= 2 and toks[0].kind == "variable":
            if toks[1].kind in ("declare", "assign"):
                self.i += 2
                self.scope.append(toks[0].text)
                return [toks[0].text], toks[1].kind == "assign"
            if (
                context == "range"
                and len(toks) >= 4
                and toks[1].text == ","
                and toks[2].kind == "variable"
                and toks[3].kind in ("declare", "assign")
            ):
                self.i += 4
                self.scope.extend((toks[0].text, toks[2].text))
                return [toks[0].text, toks[2].text], toks[3].kind == "assign"
        return [], False

    def command(self, *, until_paren: bool) -> Command:
        args: list[Node] = []
        while True:
            tok = self.peek()
            if tok is None or (tok.kind == "punct" and tok.text in "|)"):
                break
            if args and not tok.space_before and tok.kind != "punct":
                raise self.error(f"missing space before {tok.text!r}")
            args.append(self.operand())
        if not args:
            raise self.error("missing value for command")
        return Command(tuple(args))

    def operand(self) -> Node:
        tok = self.take()
        node: Node
        if tok.kind == "field":
            names = [tok.text[1:]]
            names.extend(self._field_chain())
            return Field(tuple(names))
        if tok.kind == "dot":
            return Field(())
        if tok.kind == "variable":
            if tok.text not in self.scope:
                raise self.error(f'undefined variable "{tok.text}"')
            return Variable(tok.text, tuple(self._field_chain()))
        if tok.kind == "string":
            return Literal(_unquote(tok.text[1:-1], self.line))
        if tok.kind == "raw":
            return Literal(tok.text[1:-1])
        if tok.kind == "char":
            value = _unquote(tok.text[1:-1], self.line)
            if len(value) != 1:
                raise self.error(f"malformed character constant: {tok.text}")
            return Literal(ord(value))
        if tok.kind == "number":
            return Literal(_number(tok.text, self.line))
        if tok.kind == "ident":
            return self._identifier(tok.text)
        if tok.kind == "punct" and tok.text == "(":
            inner = self.pipeline("parenthesized pipeline", allow_decl=False, until_paren=True)
            self.take()  # ")"
            names = self._field_chain()
            node = inner
            return Chain(inner, tuple(names)) if names else node
        raise self.error(f"unexpected {tok.text!r} in operand")

    def _identifier(self, name: str) -> Node:
        if name in ("true", "false"):
            return Literal(name == "true")
        if name == "nil":
            return Literal(None)
        if name in _UNSUPPORTED_FUNCTIONS or name in _UNSUPPORTED_KEYWORDS:
            raise UnsupportedConstruct(name, self.line)
        if name in _KEYWORDS:
            raise self.error(f"unexpected keyword {name!r} in command")
        if name not in FUNCTIONS:
            hint = f" (fields are written with a leading dot: .{name})" if name[:1].isupper() else ""
            raise self.error(f'function "{name}" not defined{hint}')
        return Identifier(name)

    def _field_chain(self) -> list[str]:
        names: list[str] = []
        while True:
            tok = self.peek()
            if tok is None or tok.kind != "field" or tok.space_before:
                return names
            self.take()
            names.append(tok.text[1:])


_KEYWORDS = frozenset({"if", "else", "end", "range", "with", "break", "continue"})


def _parse_pipeline(body: str, line: int, context: str, scope: list[str]) -> Pipeline:
    toks = _tokens(body, line)
    if not toks:
        raise GoTemplateError(f"line {line}: missing value for {context}")
    return _ActionParser(toks, line, scope).pipeline(context)


@dataclass(slots=True)
class _Frame:
    branch: Branch | None
    items: list[Item]
    chained: bool = False  # opened by {{else if}}/{{else with}}: closed by its parent's {{end}}
    in_else: bool = False
    #: How many variables were in scope before the branch's pipeline: its {{end}} forgets the rest.
    scope_mark: int = 1


def _close(stack: list[_Frame], scope: list[str]) -> int:
    """Pop the frames one {{end}} closes (and the variables declared in them); return how many of
    them were range loops."""
    loops = 0
    while True:
        frame = stack.pop()
        del scope[frame.scope_mark :]
        if frame.branch is not None and frame.branch.kind == "range":
            loops += 1
        if not frame.chained:
            return loops


def parse(source: str) -> list[Item]:
    """Parse ``source``; raise GoTemplateError (or UnsupportedConstruct) with a line number.

    A variable must be declared before it is used, where it is used: as in Go, a declaration lasts
    until the {{end}} of the if, with or range it was made in (else branches included), or to the
    end of the template.
    """
    root: list[Item] = []
    stack: list[_Frame] = [_Frame(None, root)]
    scope = ["$"]
    loops = 0
    for seg in _segments(source):
        items = stack[-1].items
        if seg.text is not None:
            if seg.text:
                items.append(Text(seg.text))
            continue
        body, line = seg.body.strip(_TRIM_SPACE), seg.line
        word = re.match(r"[A-Za-z_]\w*", body)
        keyword = word.group(0) if word else ""
        rest = body[len(keyword) :].strip(_TRIM_SPACE) if keyword else body
        if keyword in _UNSUPPORTED_KEYWORDS:
            raise UnsupportedConstruct(keyword, line)
        if keyword in ("if", "with", "range"):
            mark = len(scope)
            branch = Branch(keyword, _parse_pipeline(rest, line, keyword, scope))
            items.append(branch)
            stack.append(_Frame(branch, branch.body, scope_mark=mark))
            loops += keyword == "range"
        elif keyword == "else":
            frame = stack[-1]
            if frame.branch is None or frame.in_else:
                raise GoTemplateError(f"line {line}: unexpected {{{{else}}}}")
            frame.in_else = True
            frame.items = frame.branch.other
            chained = re.match(r"(if|with)\b", rest)
            if chained:
                kind = chained.group(1)
                mark = len(scope)
                inner = Branch(kind, _parse_pipeline(rest[chained.end() :], line, kind, scope))
                frame.branch.other.append(inner)
                stack.append(_Frame(inner, inner.body, chained=True, scope_mark=mark))
            elif rest:
                raise GoTemplateError(f"line {line}: unexpected {rest!r} after else")
        elif keyword == "end":
            if rest:
                raise GoTemplateError(f"line {line}: unexpected {rest!r} in end")
            if len(stack) == 1:
                raise GoTemplateError(f"line {line}: unexpected {{{{end}}}}")
            loops -= _close(stack, scope)
        elif keyword in ("break", "continue") and not rest:
            if loops == 0:
                raise GoTemplateError(f"line {line}: {{{{{keyword}}}}} outside {{{{range}}}}")
            items.append(LoopControl(keyword, line))
        else:
            items.append(Action(_parse_pipeline(body, line, "command", scope)))
    if len(stack) > 1:
        open_branch = stack[-1].branch
        kind = open_branch.kind if open_branch else "end"
        raise GoTemplateError(f"unexpected EOF: {{{{{kind}}}}} has no matching {{{{end}}}}")
    return root
