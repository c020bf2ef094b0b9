"""Persistent options for nstance-admin's command groups, as upstream's cobra persistent flags work.

A group built with ``PersistentGroup`` (``typer.Typer(cls=PersistentGroup)``) lends its options to
every command below it, so each is accepted on the group itself and after any subcommand under it:
``cluster --storage-provider file nonce ...`` and ``cluster nonce --storage-provider file ...`` are the
same, as are ``nstance-admin --temp-dir X cluster nonce ...`` and ``... cluster nonce --temp-dir X``.
Eager options (``--version``) stay where they are declared, as upstream's local flags do. A command
that declares an option of the same name or flag keeps its own (``config upload --shard``), as in cobra.

The top group also moves an option given before the command that takes it to just after that
command's name (``hoisted``), as cobra finds options anywhere: ``--servers S group list``.

Each option is declared once, on its group's callback. The copy lent to a subcommand passes nothing
to that subcommand's function; a value given there is stored in the group's context, where commands
read it with ``option_value``. Given in both places, the later one wins, as in cobra. Only values from
the command line are carried down; the group already read its environment variable and default.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import typer
from typer.core import TyperGroup

#: Where borrowed options are listed in a subcommand's ``--help``.
HELP_PANEL = "Global options"
#: The click parameter source of a value typed on the command line. Click is reached only through
#: typer (which vendors its own copy in newer releases), so sources are compared by name.
COMMANDLINE = "COMMANDLINE"


class PersistentGroup(TyperGroup):
    """A typer group whose own options (but eager ones) are accepted by every command below it."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        lent = [p for p in self.params if p.param_type_name == "option" and not p.is_eager]
        for command in _below(self):
            for option in lent:
                if not _declares(command, option):
                    command.params.append(_borrowed(option, self))

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """The top group first moves options given before a subcommand that belong further down to
        after that subcommand, as cobra finds them anywhere on the line: upstream's own scripts run
        ``nstance-admin --servers S --identity-dir D group list``."""
        if ctx.parent is None:
            args = hoisted(self, args)
        return list(super().parse_args(ctx, args))


def option_value(ctx: typer.Context, name: str) -> Any:
    """The value of option ``name`` for the running command: its own parameter, else the nearest
    enclosing group's (which holds a value given after a subcommand too). KeyError if none has it."""
    current: Any = ctx
    while current is not None:
        if name in current.params:
            return current.params[name]
        current = current.parent
    raise KeyError(f"no command in {ctx.command_path!r} declares the option {name!r}")


def hoisted(root: Any, args: list[str]) -> list[str]:
    """``args`` with every option that the command it stands before does not declare moved to just
    after the last command name (``--servers S group list`` is ``group list --servers S``).

    Whether an option takes a value is read from its declaration anywhere below ``root``; an unknown
    option is left where it is, for click to refuse. Stops at ``--`` and at the first argument that is
    not a command name.
    """
    takes_value = _value_options(root)
    head: list[str] = []
    moved: list[str] = []
    command, i = root, 0
    while i < len(args) and args[i] != "--":
        arg = args[i]
        if arg.startswith("-") and arg != "-":
            name = arg.split("=", 1)[0]
            size = 2 if "=" not in arg and takes_value.get(name, False) else 1
            chunk = args[i : i + size]
            i += size
            if name in takes_value and not _flags(command) & {name}:
                moved.extend(chunk)
            else:
                head.extend(chunk)
            continue
        head.append(arg)
        i += 1
        command = getattr(command, "commands", {}).get(arg)
        if command is None or not getattr(command, "commands", None):
            break
    return head + moved + args[i:]


def _flags(command: Any) -> set[str]:
    """Every option flag ``command`` declares (or borrows)."""
    found: set[str] = set()
    for param in command.params:
        if param.param_type_name == "option":
            found |= set(param.opts) | set(param.secondary_opts)
    return found


def _value_options(root: Any) -> dict[str, bool]:
    """Each option flag declared at ``root`` or below, and whether it takes a value."""
    found: dict[str, bool] = {}
    for command in (root, *_below(root)):
        for param in command.params:
            if param.param_type_name != "option":
                continue
            for flag in param.opts:
                found[flag] = not param.is_flag and not param.count
            for flag in param.secondary_opts:
                found[flag] = False
    return found


def _below(group: Any) -> Iterator[Any]:
    """Every command and group below ``group``, depth first."""
    for command in getattr(group, "commands", {}).values():
        yield command
        yield from _below(command)


def _declares(command: Any, option: Any) -> bool:
    """Whether ``command`` already has a parameter of ``option``'s name or one of its flags."""
    flags = set(option.opts) | set(option.secondary_opts)
    return any(
        param.name == option.name or flags & (set(param.opts) | set(param.secondary_opts))
        for param in command.params
    )


def _borrowed(option: Any, owner: Any) -> Any:
    """A copy of ``option`` for a command below ``owner``; a value given to it is stored in ``owner``'s
    context (after ``option``'s own callback, so it is converted as on the group)."""
    lent = copy.copy(option)
    lent.expose_value = False
    lent.required = False
    if hasattr(lent, "rich_help_panel"):
        lent.rich_help_panel = HELP_PANEL
    own_callback = option.callback

    def carry(ctx: typer.Context, param: Any, value: Any) -> Any:
        source = ctx.get_parameter_source(param.name)
        if source is None or source.name != COMMANDLINE:
            return value
        if own_callback is not None:
            value = own_callback(ctx, param, value)
        holder = ctx.parent
        while holder is not None and holder.command is not owner:
            holder = holder.parent
        if holder is not None:
            holder.params[param.name] = value
            holder.set_parameter_source(param.name, source)
        return value

    lent.callback = carry
    return lent
