"""Turn pydantic validation errors into ``Problem`` objects with plain-sentence messages.

Users never see pydantic's own wording or error URLs: each error type maps to a short rule
("is required", "unknown field", "must be one of: a, b", "must be a whole number"), rule errors
raised by our validators keep their text, and locations become JSON paths. No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from nstance.config.errors import Problem, join_path
from nstance.config.fields import RULE_ERROR, RULES_ERROR, Ref

_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'")


def _one_of(ctx: Mapping[str, Any], value: object) -> str:
    choices = _QUOTED.findall(str(ctx.get("expected", "")))
    text = "must be one of: " + ", ".join(choices)
    if isinstance(value, str):
        text += f' (got "{value}")'
    return text


def _count(n: object, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _too_short(ctx: Mapping[str, Any], value: object) -> str:
    n = ctx.get("min_length", 1)
    return f"must have at least {_count(n, 'entry' if isinstance(value, dict) else 'item')}".replace(
        "entrys", "entries"
    )


_MESSAGES: dict[str, Callable[[Mapping[str, Any], object], str]] = {
    "missing": lambda c, v: "is required",
    "extra_forbidden": lambda c, v: "unknown field",
    "literal_error": _one_of,
    "int_type": lambda c, v: "must be a whole number",
    "int_parsing": lambda c, v: "must be a whole number",
    "int_from_float": lambda c, v: "must be a whole number",
    "float_type": lambda c, v: "must be a number",
    "string_type": lambda c, v: "must be a string",
    "bool_type": lambda c, v: "must be true or false",
    "dict_type": lambda c, v: "must be an object",
    "model_type": lambda c, v: "must be an object",
    "model_attributes_type": lambda c, v: "must be an object",
    "list_type": lambda c, v: "must be a list",
    "timedelta_type": lambda c, v: 'must be a duration string such as "90s" or "5m"',
    "greater_than_equal": lambda c, v: f"must be at least {c.get('ge')}",
    "greater_than": lambda c, v: f"must be greater than {c.get('gt')}",
    "less_than_equal": lambda c, v: f"must be at most {c.get('le')}",
    "less_than": lambda c, v: f"must be less than {c.get('lt')}",
    "too_short": _too_short,
    "too_long": lambda c, v: f"must have at most {c.get('max_length')} items",
    "string_too_short": lambda c, v: (
        "must not be empty"
        if c.get("min_length") == 1
        else f"must be at least {c.get('min_length')} characters"
    ),
    RULE_ERROR: lambda c, v: str(c.get("message", "is invalid")),
}


def _fallback(error: Mapping[str, Any]) -> str:
    msg = str(error.get("msg", "is invalid"))
    return "is invalid: " + msg[:1].lower() + msg[1:]


def problems_from_validation(exc: ValidationError, base: str = "") -> list[Problem]:
    """Translate every error of ``exc`` into a Problem whose path starts at ``base``."""
    problems: list[Problem] = []
    for error in exc.errors(include_url=False):
        loc = list(error["loc"])
        is_key = bool(loc) and loc[-1] == "[key]"
        if is_key:
            loc.pop()
        path = join_path(base, *loc)
        ctx: Mapping[str, Any] = error.get("ctx") or {}
        if error["type"] == RULES_ERROR:
            for parts, segments in ctx.get("violations", ()):
                text = "".join(join_path(path, *s.parts) if isinstance(s, Ref) else str(s) for s in segments)
                problems.append(Problem(join_path(path, *parts), text))
            continue
        render = _MESSAGES.get(error["type"])
        message = render(ctx, error.get("input")) if render else _fallback(error)
        problems.append(Problem(path, message))
    return problems
