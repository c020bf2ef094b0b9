"""Compatibility layer for templates written for upstream's Go ``text/template``.

Jinja2 renders every template. Two Go habits are handled here, before Jinja2 sees the text:

* field references with a leading dot, ``{{ .Instance.ID }}`` / ``{{.Vars.foo}}``, are rewritten to
  ``{{ Instance.ID }}`` (only inside ``{{ }}``, never inside string literals);
* every other Go construct found in a ``{{ }}`` action (``if``, ``range``, ``with``, ``end``,
  ``template``, ``define``, ``block``, ``$variables``, Go comments, Go function calls such as
  ``printf "%s" .X`` and pipes such as ``.X | printf``) is refused with a message naming the
  construct and the Jinja2 spelling to use instead.

``{{- x -}}`` whitespace trimming means the same in both languages and is left alone. Natively
written Jinja2 (``{% if %}``, ``{{ x | upper }}``) passes through unchanged. Pure text processing.
"""

from __future__ import annotations

import re

_ACTION = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_LEADING_DOT = re.compile(r"(^|[^\w)\]}'\"`.])\.(?=[A-Za-z_])")
_FIRST_WORD = re.compile(r"^([A-Za-z_]\w*)(\s+(\S+))?")
_PIPE = re.compile(r"(?<!\|)\|(?!\|)\s*([A-Za-z_]\w*)(\s+(\S+))?")
_JINJA_WORDS = frozenset({"if", "else", "and", "or", "not", "in", "is"})

_KEYWORD_HINTS: dict[str, str] = {
    "if": "{% if %}",
    "else": "{% else %}",
    "end": "{% endif %} / {% endfor %}",
    "range": "{% for %}",
    "with": "{% with %} or {% set %}",
    "template": "{% include %} or a macro",
    "define": "{% macro %}",
    "block": "{% block %}",
    "break": "{% break %} (loopcontrols) or a filter",
    "continue": "{% continue %} (loopcontrols) or a filter",
}
_GO_FUNCS = frozenset(
    {"printf", "print", "println", "html", "js", "urlquery", "len", "index", "slice", "call",
     "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not"}
)  # fmt: skip
_ARG_START = re.compile(r"""[."'`$\w(]""")


class GoConstructError(ValueError):
    """A Go template construct that has no automatic Jinja2 translation."""

    def __init__(self, construct: str, hint: str) -> None:
        self.construct = construct
        self.hint = hint
        super().__init__(f'Go template construct "{construct}" is not supported; use Jinja2 syntax ({hint})')


def _mask_strings(body: str) -> str:
    """Replace string literals by '_' runs of the same length so only code is inspected."""
    return _STRING.sub(lambda m: "_" * len(m.group(0)), body)


def _refuse(code: str) -> None:
    inner = code.strip().removeprefix("-").removesuffix("-").strip()
    if inner.startswith("/*"):
        raise GoConstructError("comment", "{# ... #}")
    if inner == ".":
        raise GoConstructError(".", "name the field, e.g. {{ Instance.ID }}")
    if "$" in inner:
        raise GoConstructError("$variable", "{% set name = ... %}")
    first = _FIRST_WORD.match(inner)
    if first is not None:
        word, following = first.group(1), first.group(3)
        if word in _KEYWORD_HINTS:
            raise GoConstructError(word, _KEYWORD_HINTS[word])
        if (
            word in _GO_FUNCS - {"and", "or", "not"}
            and following
            and not following.startswith("(")
            and following not in _JINJA_WORDS
            and _ARG_START.match(following)
        ):
            raise GoConstructError(word, "an expression or filter, e.g. {{ '%s' | format(x) }}")
    for pipe in _PIPE.finditer(inner):
        name, following = pipe.group(1), pipe.group(3)
        takes_go_args = (
            following is not None
            and not following.startswith("(")
            and following not in _JINJA_WORDS
            and bool(_ARG_START.match(following))
        )
        if name in _GO_FUNCS or takes_go_args:
            raise GoConstructError("pipe", "a filter with parentheses, e.g. {{ x | default('y') }}")


def translate_go_template(source: str) -> str:
    """Rewrite Go-style leading-dot references for Jinja2; raise GoConstructError for other Go syntax."""
    if "{{" not in source:
        return source

    def action(match: re.Match[str]) -> str:
        body = match.group(1)
        masked = _mask_strings(body)
        _refuse(masked)
        drop = {m.end() - 1 for m in _LEADING_DOT.finditer(masked)}
        if not drop:
            return match.group(0)
        return "{{" + "".join(ch for i, ch in enumerate(body) if i not in drop) + "}}"

    return _ACTION.sub(action, source)
