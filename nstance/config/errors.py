"""Config problems and the one error type the config package raises for bad user input.

A ``Problem`` names a JSON path (``templates.knc.kind``) and the rule that failed, in a plain
sentence. ``ConfigError`` carries every problem found in one pass, so an operator fixes a file in
one round trip. ``RenderError`` is raised when a userdata/args/file template cannot be rendered.

Nothing here reads files or knows the schema; it only formats what other modules found.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nstance.core.errors import InvalidArgument

_SIMPLE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a config document: where (JSON path) and which rule failed."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(InvalidArgument):
    """A config document failed to parse or validate; ``problems`` lists every problem found."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = list(problems)
        count = len(self.problems)
        noun = "problem" if count == 1 else "problems"
        lines = [f"{source}: invalid configuration ({count} {noun}):"]
        lines.extend(f"  {problem}" for problem in self.problems)
        super().__init__("\n".join(lines))


class RenderError(InvalidArgument):
    """A template (userdata, args, file or certificate field) could not be compiled or rendered."""


def join_path(base: str, *parts: str | int) -> str:
    """Append keys and list indexes to a dotted JSON path.

    Keys that are not plain words (for example file names with dots) are quoted so the path stays
    unambiguous: ``templates.knc.files["kubelet.crt"].kind``; list indexes render as ``[0]``.
    """
    out = base
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _SIMPLE_KEY.fullmatch(part):
            out = f"{out}.{part}" if out else part
        else:
            out += '["' + part.replace("\\", "\\\\").replace('"', '\\"') + '"]'
    return out
