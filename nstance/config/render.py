"""Render userdata, args, file and certificate templates with a sandboxed Jinja2 environment.

Templates are Jinja2 (``ImmutableSandboxedEnvironment``, ``StrictUndefined``, trailing newline
kept). Upstream Go-style references (``{{ .Instance.ID }}``) are rewritten first by
``nstance.config.gotemplate``; other Go constructs are refused. Every error is a ``RenderError``
whose message starts with the template's name (e.g. ``templates.web.userdata``) and says what is
wrong: a syntax error with its line, an undefined name, or a sandbox refusal.

Compiled templates are cached by source text. No I/O: fetching ``source: url`` userdata is the
server's job.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from jinja2 import StrictUndefined, Template, TemplateError, TemplateSyntaxError
from jinja2.exceptions import SecurityError, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import missing

from nstance.config.errors import RenderError, join_path
from nstance.config.gotemplate import GoConstructError, translate_go_template
from nstance.config.templatedata import Namespace, TemplateData

_MARKERS = ("{{", "{%", "{#")


class _Undefined(StrictUndefined):
    """StrictUndefined whose message names the full missing path, e.g. ``Vars.role``."""

    __slots__ = ()

    @property
    def _undefined_message(self) -> str:
        if self._undefined_hint:
            return self._undefined_hint
        name = self._undefined_name
        obj = self._undefined_obj
        if isinstance(obj, Namespace):
            return f'undefined variable "{obj.path}.{name}"'
        if obj is missing:
            return f'undefined variable "{name}"'
        return f'undefined variable: {type(obj).__name__} value has no attribute or key "{name}"'


class _Environment(ImmutableSandboxedEnvironment):
    """Looks names up in a Namespace before any attribute, so user keys never hit Python attrs."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, Namespace):
            return self.getitem(obj, attribute)
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        if isinstance(obj, Namespace):
            try:
                return obj[argument]
            except KeyError:
                return self.undefined(obj=obj, name=argument)
        return super().getitem(obj, argument)


_ENV = _Environment(undefined=_Undefined, autoescape=False, keep_trailing_newline=True)


@functools.lru_cache(maxsize=4096)
def _compile(source: str) -> Template | str:
    """Compile ``source``; return the template, or the reason it cannot be compiled."""
    try:
        translated = translate_go_template(source)
    except GoConstructError as exc:
        return str(exc)
    try:
        return _ENV.from_string(translated)
    except TemplateSyntaxError as exc:
        return f"syntax error on line {exc.lineno}: {exc.message}"
    except TemplateError as exc:
        return f"template error: {exc}"


def needs_rendering(text: str) -> bool:
    """True when ``text`` contains template markup (plain strings are used as they are)."""
    return any(marker in text for marker in _MARKERS)


def template_problem(source: str) -> str | None:
    """Why ``source`` cannot be compiled (Go construct, syntax error), or None if it can."""
    if not needs_rendering(source):
        return None
    compiled = _compile(source)
    return compiled if isinstance(compiled, str) else None


def render_template(name: str, source: str, data: TemplateData) -> str:
    """Render one template; raise RenderError naming ``name`` and the problem."""
    if not needs_rendering(source):
        return source
    compiled = _compile(source)
    if isinstance(compiled, str):
        raise RenderError(f"{name}: {compiled}")
    try:
        return compiled.render(data.context())
    except SecurityError as exc:
        raise RenderError(f"{name}: refused by the template sandbox: {exc}") from None
    except UndefinedError as exc:
        raise RenderError(f"{name}: {exc}") from None
    except TemplateError as exc:
        raise RenderError(f"{name}: {exc}") from None
    except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError, RecursionError) as exc:
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
