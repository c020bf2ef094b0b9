"""``nstance-admin group list|status|create|scale|delete``: groups on shard servers, through the
Operator API (see ``shardcalls`` for the shared flags). A static group (from config.jsonc) is never
deleted here: ``delete`` refuses it, or with ``--reset-static`` drops its runtime changes.
"""

from __future__ import annotations

from typing import Annotated

import typer

from nstance.core.errors import FailedPrecondition
from nstance.rpc import operator_pb2

from .client import ShardClient
from .output import Column, Row, View, checked_identifier, fail
from .persistent import PersistentGroup
from .shardcalls import (
    OutputOpt,
    VarsOpt,
    check_size,
    execute,
    group_target,
    parse_vars,
    shard_options,
)

group_app = typer.Typer(
    cls=PersistentGroup, add_completion=False, help="Groups on shard servers (Operator API)."
)
group_app.callback()(shard_options)


def _group_row(shard: str, group: operator_pb2.GroupStatus) -> Row:
    return {
        "shard": shard,
        "group": group.key,
        "tenant": group.tenant,
        "template": group.template,
        "size": group.size,
        "actual_size": group.actual_size,
        "instance_type": group.instance_type,
        "subnet_pool": group.subnet_pool,
        "vars": dict(sorted(group.vars.items())),
        "is_static": group.is_static,
        "etag": group.etag,
        "provider_ids": list(group.provider_ids),
    }


GROUP_COLUMNS: list[Column] = [
    ("SHARD", "shard"),
    ("GROUP", "group"),
    ("SIZE", "size"),
    ("ACTUAL", "actual_size"),
    ("TEMPLATE", "template"),
    ("INSTANCE_TYPE", "instance_type"),
    ("STATIC", "is_static"),
]
GROUP_DETAILS: list[Column] = [
    ("shard", "shard"),
    ("group", "group"),
    ("tenant", "tenant"),
    ("template", "template"),
    ("size", "size"),
    ("actual size", "actual_size"),
    ("instance type", "instance_type"),
    ("subnet pool", "subnet_pool"),
    ("static", "is_static"),
    ("vars", "vars"),
    ("provider ids", "provider_ids"),
    ("etag", "etag"),
]


@group_app.command("list")
def group_list(
    ctx: typer.Context,
    output: OutputOpt = "table",
) -> None:
    """List the groups of your tenant (static and dynamic) with desired and actual size."""
    target = group_target(ctx, output)

    def action(client: ShardClient) -> list[Row]:
        return [_group_row(client.shard, g) for g in sorted(client.list_groups(), key=lambda g: g.key)]

    execute(target, action, View(GROUP_COLUMNS, empty="no groups"))


@group_app.command("status")
def group_status(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Group name.")],
    output: OutputOpt = "table",
) -> None:
    """Show one group: settings, merged vars, actual size and provider IDs (a shard without it fails)."""
    target = group_target(ctx, output)
    execute(
        target,
        lambda client: [_group_row(client.shard, client.get_group(name))],
        View(GROUP_DETAILS, details=True),
    )


@group_app.command("create")
def group_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Group name (lowercase letters, digits, '-').")],
    template: Annotated[str, typer.Option("--template", help="Template of the group's instances. Required.")],
    size: Annotated[int, typer.Option("--size", help="Desired number of instances per shard.")] = 0,
    instance_type: Annotated[
        str, typer.Option("--instance-type", help="Override of the template's instance type.")
    ] = "",
    subnet_pool: Annotated[
        str, typer.Option("--subnet-pool", help="Override of the template's subnet pool.")
    ] = "",
    var: VarsOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Create a dynamic group, or replace its settings if it exists (UpsertGroup)."""
    checked_identifier(name, "group")
    if not template:
        raise fail("--template must not be empty")
    check_size(size, "--size")
    variables = parse_vars(var)
    target = group_target(ctx, output)
    config = operator_pb2.GroupConfig(
        template=template,
        size=size,
        instance_type=instance_type,
        subnet_pool=subnet_pool,
        vars=variables,
    )
    execute(
        target,
        lambda client: [_group_row(client.shard, client.upsert_group(name, config))],
        View(GROUP_COLUMNS),
    )


# A negative SIZE reaches the range check (and its message) instead of reading as an unknown option.
@group_app.command("scale", context_settings={"ignore_unknown_options": True})
def group_scale(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Group name.")],
    size: Annotated[int, typer.Argument(help="New desired number of instances on each selected shard.")],
    output: OutputOpt = "table",
) -> None:
    """Change a group's size and nothing else.

    The group is read first (ListGroups); its template, instance type, subnet pool and vars are sent back.

    Vars are sent as the server reports them (merged with the template's).
    """
    checked_identifier(name, "group")
    check_size(size, "SIZE")
    target = group_target(ctx, output)

    def action(client: ShardClient) -> list[Row]:
        current = client.get_group(name)
        config = operator_pb2.GroupConfig(
            template=current.template,
            size=size,
            instance_type=current.instance_type,
            subnet_pool=current.subnet_pool,
            vars=dict(current.vars),
        )
        updated = client.upsert_group(name, config)
        return [{"shard": client.shard, "group": name, "previous_size": current.size, "size": updated.size}]

    columns = [("SHARD", "shard"), ("GROUP", "group"), ("PREVIOUS", "previous_size"), ("SIZE", "size")]
    execute(target, action, View(columns))


@group_app.command("delete")
def group_delete(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Group name.")],
    reset_static: Annotated[
        bool,
        typer.Option(
            "--reset-static",
            help="For a static group (from config.jsonc): drop its runtime changes, back to the config.",
        ),
    ] = False,
    output: OutputOpt = "table",
) -> None:
    """Delete a dynamic group and its instances.

    A static group (defined in config.jsonc) cannot be deleted here: it is refused, or with
    --reset-static its runtime changes (size, overrides) are dropped and it returns to its config.
    """
    checked_identifier(name, "group")
    target = group_target(ctx, output)

    def action(client: ShardClient) -> list[Row]:
        before = client.get_group(name)
        if before.is_static and not reset_static:
            raise FailedPrecondition(
                f"group {name!r} is static (defined in config.jsonc) and cannot be deleted here; remove it "
                f"from config.jsonc, scale it with `group scale {name} N`, or use --reset-static to drop "
                f"its runtime changes (size now {before.size})"
            )
        client.delete_group(name)
        if not before.is_static:
            return [{"shard": client.shard, "group": name, "result": "deleted"}]
        after = client.get_group(name)
        result = f"reset to its config (size {before.size} -> {after.size})"
        return [{"shard": client.shard, "group": name, "result": result}]

    execute(target, action, View([("SHARD", "shard"), ("GROUP", "group"), ("RESULT", "result")]))
