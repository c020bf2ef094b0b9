"""``nstance-admin instance list|show|create|delete``: instances on shard servers, through the Operator
API (see ``shardcalls`` for the shared flags).
"""

from __future__ import annotations

from typing import Annotated

import grpc
import typer

from nstance.core.errors import NotFound
from nstance.rpc import operator_pb2

from .client import ShardClient
from .output import Column, Row, View, checked_identifier, fail, timestamp
from .persistent import PersistentGroup, option_value
from .shardcalls import (
    OutputOpt,
    VarsOpt,
    execute,
    group_target,
    parse_vars,
    shard_options,
)

instance_app = typer.Typer(
    cls=PersistentGroup, add_completion=False, help="Instances on shard servers (Operator API)."
)
instance_app.callback()(shard_options)


INSTANCE_DETAILS: list[Column] = [
    ("shard", "shard"),
    ("instance id", "instance_id"),
    ("tenant", "tenant"),
    # GetInstanceStatus answers with the provider's word (running), where ``instance list`` and the
    # live view show the agent's (registered, healthy): the label says which one this is.
    ("provider status", "status"),
    ("provider id", "provider_instance_id"),
    ("created at", "created_at"),
    ("last seen", "last_seen"),
]


@instance_app.command("list")
def instance_list(
    ctx: typer.Context,
    group: Annotated[str | None, typer.Option("--group", help="Only this group.")] = None,
    output: OutputOpt = "table",
) -> None:
    """List the instances of each shard - managed and on-demand - with their instance IDs.

    A server without ListInstances (upstream's) is asked for its groups instead: then only the
    provider IDs of running managed instances can be shown, and a note on stderr says so.
    """
    target = group_target(ctx, output)

    def action(client: ShardClient) -> list[Row]:
        try:
            found = client.list_instances(group or "")
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            return _provider_ids_only(client, group)
        return [
            {
                "shard": client.shard,
                "instance_id": item.instance_id,
                "group": item.group,
                "status": "draining" if item.draining else item.status,
                "on_demand": item.on_demand,
                "provider_id": item.provider_instance_id,
                "created_at": timestamp(item, "created_at"),
                "last_seen": timestamp(item, "last_seen"),
            }
            for item in found
        ]

    columns = [
        ("SHARD", "shard"),
        ("INSTANCE_ID", "instance_id"),
        ("GROUP", "group"),
        ("STATUS", "status"),
        ("ON_DEMAND", "on_demand"),
        ("PROVIDER_ID", "provider_id"),
    ]
    execute(target, action, View(columns, empty="no instances"))


def _provider_ids_only(client: ShardClient, group: str | None) -> list[Row]:
    """The fallback for a server without ListInstances: running managed instances by provider ID."""
    typer.echo(
        f"note: shard {client.shard} has no ListInstances (an upstream server?): showing only the "
        "provider IDs of its running managed instances",
        err=True,
    )
    groups = [client.get_group(group)] if group else sorted(client.list_groups(), key=lambda g: g.key)
    return [
        {"shard": client.shard, "group": g.key, "status": "running", "on_demand": False, "provider_id": pid}
        for g in groups
        for pid in g.provider_ids
    ]


@instance_app.command("show")
def instance_show(
    ctx: typer.Context,
    instance_id: Annotated[str, typer.Argument(help="Instance ID.")],
    output: OutputOpt = "table",
) -> None:
    """Show one instance as the server sees it (GetInstanceStatus): its provider status (pending,
    running, failed, deleted), where ``instance list`` shows how its agent is doing."""
    target = group_target(ctx, output)

    def action(client: ShardClient) -> list[Row]:
        status = client.get_instance_status(instance_id)
        return [
            {
                "shard": client.shard,
                "instance_id": status.instance_id,
                "tenant": status.tenant,
                "status": status.status,
                "provider_instance_id": status.provider_instance_id,
                "created_at": timestamp(status, "created_at"),
                "last_seen": timestamp(status, "last_seen"),
            }
        ]

    execute(target, action, View(INSTANCE_DETAILS, details=True))


@instance_app.command("create")
def instance_create(
    ctx: typer.Context,
    group: Annotated[str, typer.Option("--group", help="Group the on-demand instance belongs to. Required.")],
    instance_id: Annotated[
        str, typer.Option("--instance-id", help="Instance ID to use (default: the server generates one).")
    ] = "",
    template: Annotated[str, typer.Option("--template", help="Override of the group's template.")] = "",
    instance_type: Annotated[
        str, typer.Option("--instance-type", help="Override of the instance type.")
    ] = "",
    subnet_pool: Annotated[str, typer.Option("--subnet-pool", help="Override of the subnet pool.")] = "",
    var: VarsOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Create an on-demand instance in a group (CreateInstance); prints its ID and status."""
    checked_identifier(group, "--group")
    if instance_id and option_value(ctx, "all_shards"):
        raise fail("--instance-id names one instance; use it with --shard, not --all-shards")
    variables = parse_vars(var)
    target = group_target(ctx, output)
    config = operator_pb2.InstanceConfig(
        group=group,
        template=template,
        instance_type=instance_type,
        subnet_pool=subnet_pool,
        vars=variables,
    )

    def action(client: ShardClient) -> list[Row]:
        created = client.create_instance(config, instance_id)
        return [{"shard": client.shard, "instance_id": created.instance_id, "status": created.status}]

    columns = [("SHARD", "shard"), ("INSTANCE_ID", "instance_id"), ("STATUS", "status")]
    execute(target, action, View(columns))


@instance_app.command("delete")
def instance_delete(
    ctx: typer.Context,
    instance_id: Annotated[str, typer.Argument(help="Instance ID.")],
    output: OutputOpt = "table",
) -> None:
    """Delete an instance (idempotent: prints deleting or deleted; an unknown ID is an error)."""
    target = group_target(ctx, output)

    def action(client: ShardClient) -> list[Row]:
        result = client.delete_instance(instance_id)
        if result.status == "unknown":
            raise NotFound(f"instance {instance_id!r} is not known to this shard")
        return [{"shard": client.shard, "instance_id": instance_id, "status": result.status}]

    columns = [("SHARD", "shard"), ("INSTANCE_ID", "instance_id"), ("STATUS", "status")]
    execute(target, action, View(columns))
