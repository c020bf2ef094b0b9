"""Render userdata, args, file and certificate templates as Go ``text/template`` does.

Templates use upstream's language (``nstance.config.gotemplate`` parses, ``nstance.config.goexec``
runs) with ``missingkey=zero``: a missing ``{{ .Vars.x }}`` is empty, an unknown struct field such
as ``{{ .Instance.Foo }}`` is an error. Text outside ``{{ }}`` is never interpreted. Every error is
a ``RenderError`` whose message starts with the template's name (e.g. ``templates.web.userdata``)
and says what is wrong, with its line.

Parsed templates are cached by source text. No I/O: fetching ``source: url`` userdata is the
server's job.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from nstance.config.errors import RenderError, join_path
from nstance.config.goexec import ExecError, UnknownField, execute
from nstance.config.gotemplate import GoTemplateError, Item, parse
from nstance.config.templatedata import TemplateData

_EMPTY = TemplateData()


@functools.lru_cache(maxsize=4096)
def _compile(source: str) -> list[Item] | str:
    """Parse ``source``; return the syntax tree, or the reason it cannot be parsed."""
    try:
        return parse(source)
    except GoTemplateError as exc:
        return str(exc)
    except RecursionError:
        return "template nesting is too deep"


def needs_rendering(text: str) -> bool:
    """True when ``text`` contains a template action (plain strings are used as they are)."""
    return "{{" in text


def template_problem(source: str) -> str | None:
    """Why ``source`` cannot be used: a parse error, an unsupported construct, or a field the data
    does not have (found by a trial run with empty data); None if it can be used."""
    if not needs_rendering(source):
        return None
    compiled = _compile(source)
    if isinstance(compiled, str):
        return compiled
    try:
        execute(compiled, _EMPTY.go_data())
    except UnknownField as exc:
        return str(exc)
    except (ExecError, ArithmeticError, LookupError, TypeError, ValueError):
        return None  # depends on the data; reported when the template runs
    return None


def render_template(name: str, source: str, data: TemplateData) -> str:
    """Render one template; raise RenderError naming ``name`` and the problem."""
    if not needs_rendering(source):
        return source
    compiled = _compile(source)
    if isinstance(compiled, str):
        raise RenderError(f"{name}: {compiled}")
    try:
        return execute(compiled, data.go_data())
    except ExecError as exc:
        raise RenderError(f"{name}: {exc}") from None
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
        raise RenderError(f"{name}: {type(exc).__name__}: {exc}") from None


def render_value(name: str, value: Any, data: TemplateData) -> Any:
    """Render every string inside a JSON-like value (dict values, list items); keys stay as they are."""
    if isinstance(value, str):
        return render_template(name, value, data)
    if isinstance(value, Mapping):
        return {key: render_value(join_path(name, str(key)), item, data) for key, item in value.items()}
    if isinstance(value, list):
        return [render_value(join_path(name, i), item, data) for i, item in enumerate(value)]
    return value


def render_args(args: Mapping[str, Any], data: TemplateData, name: str = "args") -> dict[str, Any]:
    """Render provider args recursively, string values only; errors name the arg's path."""
    return {key: render_value(join_path(name, key), value, data) for key, value in args.items()}
