"""Persistent options for nstance-admin's command groups, as upstream's cobra persistent flags work.

A group built with ``PersistentGroup`` (``typer.Typer(cls=PersistentGroup)``) lends its options to
every command below it, so each is accepted on the group itself and after any subcommand under it:
``cluster --storage-provider file nonce ...`` and ``cluster nonce --storage-provider file ...`` are the
same, as are ``nstance-admin --temp-dir X cluster nonce ...`` and ``... cluster nonce --temp-dir X``.
Eager options (``--version``) stay where they are declared, as upstream's local flags do. A command
that declares an option of the same name or flag keeps its own (``config upload --shard``), as in cobra.

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


def option_value(ctx: typer.Context, name: str) -> Any:
    """The value of option ``name`` for the running command: its own parameter, else the nearest
    enclosing group's (which holds a value given after a subcommand too). KeyError if none has it."""
    current: Any = ctx
    while current is not None:
        if name in current.params:
            return current.params[name]
        current = current.parent
    raise KeyError(f"no command in {ctx.command_path!r} declares the option {name!r}")


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
