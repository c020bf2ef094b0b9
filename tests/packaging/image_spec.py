"""A small reader for the repository's Dockerfile and .dockerignore, for the packaging tests.

Responsible for: splitting the Dockerfile into stages and instructions (comments dropped, line
continuations joined), resolving ``ARG`` defaults declared before the first ``FROM``, and listing what
a stage copies from the build context. It understands the subset of the syntax the Dockerfile uses
(no heredocs, no escape-character directive).

Must not: run Docker or touch the network; the tests that need a built package build the wheel
themselves (``test_wheel.py``).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def runs(self) -> list[str]:
        return [i.args for i in self.all("RUN")]

    def context_copies(self) -> list[str]:
        """Sources this stage COPYs from the build context (not ``--from`` another stage)."""
        sources: list[str] = []
        for copy in self.all("COPY"):
            words = shlex.split(copy.args)
            if any(w.startswith("--from=") for w in words):
                continue
            paths = [w for w in words if not w.startswith("--")]
            sources.extend(paths[:-1])  # the last one is the destination
        return sources

    def text(self) -> str:
        """Every instruction of the stage, one per line, as written (continuations joined)."""
        return "\n".join(f"{i.keyword} {i.args}" for i in self.instructions)


@dataclass
class Dockerfile:
    args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def resolve(self, value: str) -> str:
        """``value`` with ``$NAME`` / ``${NAME}`` of the global ARG defaults substituted."""
        return re.sub(
            r"\$\{(\w+)\}|\$(\w+)", lambda m: self.args.get(m.group(1) or m.group(2), m.group(0)), value
        )


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction text) with comments dropped and continuations joined."""
    out: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue
        if not current:
            start = number
        if stripped.endswith("\\"):
            current.append(stripped[:-1].strip())
            continue
        current.append(stripped)
        out.append((start, " ".join(part for part in current if part)))
        current = []
    if current:
        out.append((start, " ".join(current)))
    return out


def parse(text: str) -> Dockerfile:
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for number, line in logical_lines(text):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif not stages:
            if keyword == "ARG":
                key, _, default = rest.partition("=")
                args[key.strip()] = default.strip().strip('"')
        else:
            stages[-1].instructions.append(Instruction(keyword, rest, number))
    return Dockerfile(args=args, stages=stages)


def load() -> Dockerfile:
    return parse(DOCKERFILE.read_text(encoding="utf-8"))


def exec_form(args: str) -> list[str]:
    """The JSON array of an exec-form ENTRYPOINT/CMD (raises on the shell form)."""
    value = json.loads(args)
    assert isinstance(value, list)
    assert all(isinstance(v, str) for v in value)
    return [str(v) for v in value]


def dockerignore_patterns() -> list[str]:
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def builder_sources() -> list[str]:
    """What the first stage (the wheel builder) copies from the build context, e.g. ``nstance/``."""
    return load().stages[0].context_copies()
