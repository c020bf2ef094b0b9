"""How a shard command reaches its shards: the ``--servers``, ``--identity-dir``, ``--shard`` /
``--all-shards``, ``--timeout`` and ``--output`` flags, and ``execute``, which runs one action on
each selected shard (one after the other), prints the rows and reports each failing shard as
``error: shard NAME (ADDR): CODE: details`` on stderr, exiting 1 when any failed. Also the small
flag parsers the group and instance commands share (``--var KEY=VALUE,...``, sizes).

``shard_options`` declares the first five once, as the callback of the ``group``, ``instance`` and
``config`` groups, whose commands accept them too (``persistent``) and read them with
``group_target``, as upstream declares them persistent on ``group`` and ``config``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from nstance.core.durations import parse_duration

from .client import (
    IDENTITY_DIR_ENV,
    SERVERS_ENV,
    SHARD_ENV,
    OperatorIdentity,
    ShardClient,
    default_identity_dir,
    load_identity,
    parse_servers,
    run_on_shards,
    select_shards,
)
from .options import temp_dir
from .output import OUTPUT_FORMATS, Row, View, expected_errors, fail
from .persistent import option_value
from .stringslice import split_string_slice

INT32_MAX = 2**31 - 1

ServersOpt = Annotated[
    str,
    typer.Option(
        "--servers",
        envvar=SERVERS_ENV,
        help='Operator API addresses: "shard1=host:port,shard2=host:port". Required.',
    ),
]
IdentityDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--identity-dir",
        envvar=IDENTITY_DIR_ENV,
        help="Directory with ca.crt, identity.key, identity.crt. Default <temp-dir>/cli-operator-identity.",
    ),
]
ShardOpt = Annotated[
    str | None,
    typer.Option("--shard", envvar=SHARD_ENV, help="Shard to call (optional when --servers names only one)."),
]
AllShardsOpt = Annotated[
    bool, typer.Option("--all-shards", help="Call every shard in --servers, one after the other.")
]
TimeoutOpt = Annotated[str, typer.Option("--timeout", help="Per-call timeout as a Go duration (30s, 2m).")]
OutputOpt = Annotated[str, typer.Option("--output", "-o", help="Output format: table or json.")]
VarsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--var",
        help=(
            "Template variables KEY=VALUE, comma-separated and repeatable (--var a=1,b=2 --var c=3); "
            "a value with a comma or a quote is CSV-quoted: --var '\"k=a,b\"'."
        ),
    ),
]


def shard_options(
    servers: ServersOpt = "",
    identity_dir: IdentityDirOpt = None,
    shard: ShardOpt = None,
    all_shards: AllShardsOpt = False,
    timeout: TimeoutOpt = "30s",
) -> None:
    """The shard servers to call and the identity to call them with (see ``group_target``)."""
    del servers, identity_dir, shard, all_shards, timeout


def parse_vars(values: Sequence[str] | None) -> dict[str, str]:
    """``--var`` values as upstream's StringSlice flag reads them: each one a CSV record of ``KEY=VALUE``
    items (``a=1,b=2`` is two), every occurrence added to the last."""
    out: dict[str, str] = {}
    for given in values or ():
        try:
            items = split_string_slice(given)
        except ValueError as exc:
            raise fail(f"--var {given!r}: {exc}") from None
        for item in items:
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise fail(f"--var {item!r}: expected KEY=VALUE")
            if key in out:
                raise fail(f"--var {key!r} is given twice")
            out[key] = value
    return out


def check_size(size: int, what: str) -> int:
    if size < 0:
        raise fail(f"{what} {size}: the size must be 0 or more")
    if size > INT32_MAX:
        raise fail(f"{what} {size}: the size must be at most {INT32_MAX}")
    return size


@dataclass(frozen=True, slots=True)
class Target:
    servers: dict[str, str]
    shards: list[str]
    identity: OperatorIdentity
    timeout: float
    output: str


def resolve_target(
    ctx: typer.Context,
    servers: str,
    identity_dir: Path | None,
    shard: str | None,
    all_shards: bool,
    timeout: str,
    output: str,
) -> Target:
    if output not in OUTPUT_FORMATS:
        raise fail(f"--output {output!r} is not supported; use one of: {', '.join(OUTPUT_FORMATS)}")
    with expected_errors():
        parsed = parse_servers(servers)
        shards = select_shards(parsed, shard, all_shards)
        seconds = parse_duration(timeout).total_seconds()
        if seconds <= 0:
            raise fail(f"--timeout {timeout!r} must be a positive duration")
        identity = load_identity(identity_dir or default_identity_dir(temp_dir(ctx)))
    return Target(parsed, shards, identity, seconds, output)


def group_target(ctx: typer.Context, output: str) -> Target:
    """``resolve_target`` with the ``shard_options`` given to the command's group or to the command."""
    identity_dir = option_value(ctx, "identity_dir")
    return resolve_target(
        ctx,
        option_value(ctx, "servers"),
        Path(identity_dir) if identity_dir else None,
        option_value(ctx, "shard"),
        option_value(ctx, "all_shards"),
        option_value(ctx, "timeout"),
        output,
    )


def execute(target: Target, action: Callable[[ShardClient], list[Row]], view: View) -> None:
    """Run ``action`` on every selected shard, print the rows, report failures, exit 1 if any."""
    outcomes = run_on_shards(target.servers, target.shards, target.identity, action, timeout=target.timeout)
    rows = [row for outcome in outcomes for row in (outcome.value or [])]
    if target.output == "json":
        typer.echo(json.dumps(rows, indent=2))
    elif rows or all(outcome.ok for outcome in outcomes):
        view.show(rows)
    failed = [outcome for outcome in outcomes if not outcome.ok]
    for outcome in failed:
        typer.echo(f"error: shard {outcome.shard} ({outcome.target}): {outcome.error}", err=True)
    if failed:
        if len(outcomes) > 1:
            names = ", ".join(outcome.shard for outcome in failed)
            typer.echo(f"error: {len(failed)} of {len(outcomes)} shards failed: {names}", err=True)
        raise typer.Exit(1)
