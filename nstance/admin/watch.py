"""``nstance-admin watch``: the live view of groups and instances (what ``make run`` shows).

Each redraw makes two calls per shard over a channel opened once: ListGroups and ListInstances (the
oldest ``--max-instances`` instances by ID, 100 by default, on-demand ones included, with their status
and last report; one call per 2,000 instances, ``client.LIST_PAGE_SIZE``). A shard with more says so
under the table: a view of 100,000 instances redrawn every second would list them all every second,
keep the server busy doing it and scroll past any terminal. A server without
ListInstances (upstream's) falls back to what the Operator API offers there: the instances of
``--instances-dir`` (the local provider's directory), each asked for its status in one concurrent burst
of GetInstanceStatus calls, or else the provider IDs ListGroups reports.

The frame is built by the pure ``render`` and written in one piece: the cursor goes home, each line
overwrites the previous frame's and is cleared to its end, and what is below the new frame is cleared,
so the screen never goes blank between frames (no flicker). Without a terminal (``--once``, a pipe)
frames are printed plainly one after the other.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import grpc
import typer

from nstance.core.durations import parse_duration
from nstance.core.errors import NstanceError
from nstance.rpc import operator_pb2

from .client import ShardClient, describe_rpc_error, open_channel
from .shardcalls import AllShardsOpt, IdentityDirOpt, ServersOpt, ShardOpt, TimeoutOpt, resolve_target

HOME = "\033[H"
CLEAR_LINE = "\033[K"
CLEAR_BELOW = "\033[J"
HIDE_CURSOR = "\033[?25l"
SHOW_CURSOR = "\033[?25h"
DEFAULT_MAX_INSTANCES = 100
"""Instances listed per shard and redraw unless ``--max-instances`` says otherwise."""


@dataclass(frozen=True, slots=True)
class InstanceRow:
    """One instance line of the view."""

    shard: str
    group: str
    instance: str
    status: str
    last_seen: str


@dataclass(slots=True)
class ShardView:
    """What one redraw learned about one shard."""

    shard: str
    groups: list[operator_pb2.GroupStatus] = field(default_factory=list)
    instances: list[InstanceRow] = field(default_factory=list)
    error: str = ""
    more: bool = False  # instances beyond the ones shown exist


def local_instances(directory: Path | None) -> dict[str, str]:
    """``{instance_id: group}`` of the local provider's live instances under ``directory``."""
    if directory is None or not directory.is_dir():
        return {}
    out: dict[str, str] = {}
    for path in sorted(directory.glob("*/instance.json")):
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and meta.get("status") != "deleted" and meta.get("instance_id"):
            out[str(meta["instance_id"])] = str(meta.get("group", ""))
    return out


def _ago(status: operator_pb2.InstanceStatusResponse | operator_pb2.InstanceSummary, now: datetime) -> str:
    if not status.HasField("last_seen"):
        return "-"
    seconds = max(0, int((now - status.last_seen.ToDatetime(tzinfo=UTC)).total_seconds()))
    return f"{seconds}s ago" if seconds < 120 else f"{seconds // 60}m ago"


def collect(client: ShardClient, local: dict[str, str], now: datetime, max_instances: int) -> ShardView:
    """One redraw's data for one shard: ListGroups, then the oldest ``max_instances`` instances
    through ListInstances (or the fallback)."""
    view = ShardView(client.shard)
    try:
        view.groups = sorted(client.list_groups(), key=lambda g: g.key)
        listed = client.list_instances(limit=max_instances + 1)  # one more: are there more?
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            return _cap(_collect_without_listing(client, view, local, now), max_instances)
        view.error = describe_rpc_error(exc, timeout=client.timeout)
        return view
    view.more = len(listed) > max_instances
    del listed[max_instances:]
    view.instances = sorted(
        (
            InstanceRow(
                client.shard,
                item.group + (" (on-demand)" if item.on_demand else ""),
                item.instance_id,
                "draining" if item.draining else item.status,
                _ago(item, now),
            )
            for item in listed
        ),
        key=lambda r: (r.group, r.instance),
    )
    return view


def _collect_without_listing(
    client: ShardClient, view: ShardView, local: dict[str, str], now: datetime
) -> ShardView:
    """A server without ListInstances: the local provider's instances by ID, else provider IDs."""
    statuses = client.get_instance_statuses(sorted(local))
    for instance_id, result in statuses.items():
        if isinstance(result, str):
            if result.startswith("NOT_FOUND"):
                row = InstanceRow(client.shard, local[instance_id], instance_id, "starting", "-")
            else:
                row = InstanceRow(client.shard, local[instance_id], instance_id, "?", result)
        else:
            row = InstanceRow(client.shard, local[instance_id], instance_id, result.status, _ago(result, now))
        view.instances.append(row)
    if not local:  # another provider: the provider IDs ListGroups reports are all there is
        view.instances = [
            InstanceRow(client.shard, g.key, provider_id, "running", "-")
            for g in view.groups
            for provider_id in g.provider_ids
        ]
    view.instances.sort(key=lambda r: (r.group, r.instance))
    return view


def _cap(view: ShardView, max_instances: int) -> ShardView:
    """Keep the first ``max_instances`` instance lines of ``view`` and note whether there were more."""
    view.more = len(view.instances) > max_instances
    del view.instances[max_instances:]
    return view


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(line[i])) for line in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in [header, *rows]
    ]


def render(title: str, views: Sequence[ShardView], clock_text: str, max_instances: int) -> list[str]:
    """The lines of one frame."""
    lines = [f"{title}   {clock_text}", ""]
    group_rows = [
        [v.shard, g.key, str(g.size), str(g.actual_size), "static" if g.is_static else "dynamic"]
        for v in views
        for g in v.groups
    ]
    group_header = ["SHARD", "GROUP", "SIZE", "RUNNING", "KIND"]
    lines += _table(group_header, group_rows) if group_rows else ["no groups"]
    lines.append("")
    rows = [[r.shard, r.group, r.instance, r.status, r.last_seen] for v in views for r in v.instances]
    if rows:
        lines += _table(["SHARD", "GROUP", "INSTANCE", "STATUS", "LAST_SEEN"], rows)
    elif not any(v.more for v in views):
        lines.append("no instances")
    if any(v.more for v in views):
        shards = ", ".join(v.shard for v in views if v.more)
        lines.append(
            f"(more instances on {shards}: at most {max_instances} per shard are shown, the oldest; "
            "--max-instances shows more, nstance-admin instance list shows all)"
        )
    for v in views:
        if v.error:
            lines += ["", f"shard {v.shard}: {v.error}"]
    return lines


def paint(lines: Sequence[str], *, terminal: bool) -> str:
    """The bytes that replace the previous frame with ``lines`` (plain text without a terminal)."""
    if not terminal:
        return "\n".join(lines) + "\n\n"
    return HOME + "".join(f"{line}{CLEAR_LINE}\n" for line in lines) + CLEAR_BELOW


@contextmanager
def _cursor_hidden(terminal: bool) -> Iterator[None]:
    if terminal:
        sys.stdout.write(HIDE_CURSOR)
    try:
        yield
    finally:
        if terminal:
            sys.stdout.write(SHOW_CURSOR)
            sys.stdout.flush()


def watch(
    ctx: typer.Context,
    interval: Annotated[str, typer.Option("--interval", help="Redraw interval (Go duration).")] = "1s",
    instances_dir: Annotated[
        Path | None,
        typer.Option("--instances-dir", help="The local provider's instance directory (IDs, groups)."),
    ] = None,
    title: Annotated[str, typer.Option("--title", help="First line of the view.")] = "Nstance",
    once: Annotated[bool, typer.Option("--once", help="Draw one frame and exit.")] = False,
    max_instances: Annotated[
        int,
        typer.Option(
            "--max-instances",
            help="Instances listed per shard, the oldest (0: groups only); a line says when there are more.",
        ),
    ] = DEFAULT_MAX_INSTANCES,
    servers: ServersOpt = "",
    identity_dir: IdentityDirOpt = None,
    shard: ShardOpt = None,
    all_shards: AllShardsOpt = False,
    timeout: TimeoutOpt = "5s",
) -> None:
    """Show groups and instances live: one ListGroups per shard per redraw, every second by default."""
    try:
        seconds = parse_duration(interval).total_seconds()
    except NstanceError:
        seconds = 0.0
    if seconds <= 0:
        typer.echo(f"error: --interval {interval!r} must be a positive duration, e.g. 1s", err=True)
        raise typer.Exit(1)
    if max_instances < 0:
        typer.echo(f"error: --max-instances {max_instances} must be 0 or more", err=True)
        raise typer.Exit(1)
    # Without --shard the view shows every shard in --servers.
    target = resolve_target(ctx, servers, identity_dir, shard, all_shards or shard is None, timeout, "table")
    channels = {name: open_channel(target.servers[name], target.identity) for name in target.shards}
    clients = [
        ShardClient(name, target.servers[name], channels[name], target.timeout) for name in target.shards
    ]
    terminal = sys.stdout.isatty() and not once
    try:
        with _cursor_hidden(terminal):
            while True:
                started = time.monotonic()
                now = datetime.now(UTC)
                local = local_instances(instances_dir)
                views = [collect(client, local, now, max_instances) for client in clients]
                lines = render(title, views, now.astimezone().strftime("%H:%M:%S"), max_instances)
                sys.stdout.write(paint(lines, terminal=terminal))
                sys.stdout.flush()
                if once:
                    if any(v.error for v in views):
                        raise typer.Exit(1)
                    return
                time.sleep(max(0.0, seconds - (time.monotonic() - started)))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    finally:
        for channel in channels.values():
            channel.close()


def register_watch(app: typer.Typer) -> None:
    """Attach ``watch`` to nstance-admin."""
    app.command("watch")(watch)
