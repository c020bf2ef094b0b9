"""Go's flag syntax on nstance-operator's command line, as upstream's Deployment writes it.

Upstream's operator parses its flags with Go's ``flag`` package, and its Helm chart passes them that
way (``--leader-elect=true``, ``-metrics-bind-address :8080``). Click, which parses ours, differs in
two ways, and ``go_style_argv`` rewrites an argument list so click reads it as Go would:

* a single dash works for long names as well as two (``-leader-elect`` is ``--leader-elect``);
* a boolean flag takes an optional ``=value`` in ``strconv.ParseBool``'s spelling (``1 t T TRUE true
  True`` and ``0 f F FALSE false False``): true becomes the bare flag, false its ``--no-`` form, or, for
  a flag without one, removes the flag's earlier occurrences (the last one wins, as in Go). Anything
  else is refused with ``GoFlagError`` naming the flag, as Go refuses it.

The value of an option that takes one is copied as it is, even when it starts with a dash (Go does the
same). ``-h`` and ``-help`` ask for the help, as in Go. Names click does not know are left for click to
report. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, Protocol

from nstance.core.errors import InvalidArgument

GO_TRUE: Final = ("1", "t", "T", "TRUE", "true", "True")
GO_FALSE: Final = ("0", "f", "F", "FALSE", "false", "False")
GO_HELP: Final = ("-h", "-help", "--h")


class OptionLike(Protocol):
    """What is read of a click option (typer's vendored click or click itself)."""

    @property
    def name(self) -> str | None: ...
    @property
    def opts(self) -> list[str]: ...
    @property
    def secondary_opts(self) -> list[str]: ...
    @property
    def is_flag(self) -> bool: ...


class GoFlagError(InvalidArgument):
    """A boolean flag was given a value Go's ``strconv.ParseBool`` refuses."""


def parse_go_bool(value: str, flag: str) -> bool:
    """``value`` read as Go's ``strconv.ParseBool`` reads it; GoFlagError naming ``flag`` otherwise."""
    if value in GO_TRUE:
        return True
    if value in GO_FALSE:
        return False
    raise GoFlagError(
        f"invalid boolean value {value!r} for {flag}: use one of {', '.join(GO_TRUE + GO_FALSE)}"
    )


def _spellings(declared: Iterable[OptionLike]) -> dict[str, OptionLike]:
    """Every spelling of every option (``--name``, ``-v``, ``--no-name``) → its option."""
    return {opt: option for option in declared for opt in (*option.opts, *option.secondary_opts)}


def _lookup(arg: str, options: dict[str, OptionLike]) -> tuple[str, str | None] | None:
    """``(spelling click knows, value after '=' or None)`` for a flag argument, None if unknown."""
    name, sep, value = arg.lstrip("-").partition("=")
    if not name or arg.startswith("---"):
        return None
    for spelling in (f"--{name}", f"-{name}"):
        if spelling in options:
            return spelling, (value if sep else None)
    return None


def go_style_argv(argv: Sequence[str], declared: Iterable[OptionLike]) -> list[str]:
    """``argv`` rewritten so that click, knowing the ``declared`` options, parses it as Go's flag
    package would (module docstring)."""
    options = _spellings(declared)
    out: list[str] = []
    # Positions in ``out`` of each boolean option's occurrences, to drop them when a later =false wins.
    seen: dict[str, list[int]] = {}
    dropped: set[int] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            out.extend(argv[i - 1 :])
            break
        if arg in GO_HELP:
            out.append("--help")
            continue
        found = _lookup(arg, options) if arg.startswith("-") and arg != "-" else None
        if found is None:
            out.append(arg)
            continue
        spelling, value = found
        option = options[spelling]
        key = option.name or spelling
        if not option.is_flag:
            if value is None:
                out.append(spelling)
                if i < len(argv):
                    out.append(argv[i])
                    i += 1
            else:
                out.append(f"{spelling}={value}")
            continue
        if value is not None and spelling in option.secondary_opts:
            out.append(arg)  # ``--no-x=...`` is no Go syntax: click explains the mistake
            continue
        if value is None or parse_go_bool(value, spelling):
            seen.setdefault(key, []).append(len(out))
            out.append(spelling)
        elif option.secondary_opts:
            seen.setdefault(key, []).append(len(out))
            out.append(option.secondary_opts[0])
        else:
            dropped.update(seen.pop(key, []))
    return [arg for index, arg in enumerate(out) if index not in dropped]
