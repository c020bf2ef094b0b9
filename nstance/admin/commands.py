"""nstance-admin's shard commands (Operator gRPC API) and ``cluster register-operator``.

Shard commands: ``group list|status|create|scale|delete``, ``instance list|show|create|delete`` and
``config status|refresh``. Each takes ``--servers`` (env NSTANCE_ADMIN_SERVERS), ``--identity-dir``
(env NSTANCE_ADMIN_IDENTITY_DIR, default ``<temp-dir>/cli-operator-identity``), ``--shard`` (env
NSTANCE_ADMIN_SHARD) or ``--all-shards``, ``--timeout`` (Go duration, default 30s) and ``--output
table|json``. Shards are called one after the other; a failing shard is reported as ``error: shard
NAME (ADDR): CODE: details`` on stderr, the remaining shards still run, and the exit status is 1 if
any shard failed. Tables always start with a SHARD column; JSON output is a list of objects.

``cluster register-operator`` issues an operator client certificate directly with the cluster CA key
(no server needed), records it at ``operator/{tenant}.{cluster_id}.json`` in the cluster scope and
writes the identity directory the shard commands read.

This module decides nothing about the wire (that is ``client``) and never edits shard storage; the
only object it writes is the operator registration record. ``register`` attaches the commands to the
typer apps of ``cli``; this module does not import ``cli``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from cryptography.x509.oid import NameOID
from google.protobuf.message import Message

from nstance.core.atomicfile import write_atomic
from nstance.core.durations import parse_duration
from nstance.core.errors import FailedPrecondition, NotFound, NstanceError
from nstance.core.ids import identifier_problem, new_puid
from nstance.pki.certs import issue_client_certificate
from nstance.pki.keys import (
    PrivateKey,
    PublicKey,
    generate_private_key,
    load_any_public_key_pem,
    load_private_key_pem,
    private_key_to_pem,
    public_key_to_pem,
    public_keys_equal,
    require_public_key,
)
from nstance.pki.operator_record import operator_record, operator_record_key
from nstance.rpc import operator_pb2
from nstance.secrets.cluster_identity import load_cluster_identity

from .client import (
    CA_FILE,
    CERT_FILE,
    IDENTITY_DIR_ENV,
    KEY_FILE,
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
from .options import (
    KeyProviderOpt,
    KeySourceOpt,
    SecretsPrefixOpt,
    SecretsProjectOpt,
    SecretsProviderOpt,
    StorageBucketOpt,
    StoragePrefixOpt,
    StorageProviderOpt,
)
from .stores import StorageOptions, cluster_id_from_storage, open_cluster_stores

Row = dict[str, Any]
INT32_MAX = 2**31 - 1
OUTPUT_FORMATS = ("table", "json")

group_app = typer.Typer(add_completion=False, help="Groups on shard servers (Operator API).")
instance_app = typer.Typer(add_completion=False, help="Instances on shard servers (Operator API).")


# --- shared option declarations ----------------------------------------------------------------

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
VarsOpt = Annotated[list[str] | None, typer.Option("--var", help="Template variable KEY=VALUE (repeatable).")]


# --- small helpers -----------------------------------------------------------------------------


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


@contextmanager
def _expected_errors() -> Iterator[None]:
    try:
        yield
    except NstanceError as exc:
        raise _fail(str(exc)) from None


def _checked_identifier(value: str, what: str) -> str:
    problem = identifier_problem(value)
    if problem:
        raise _fail(f"{what} {value!r}: {problem}")
    return value


def _temp_dir(ctx: typer.Context) -> Path:
    value = ctx.find_root().params.get("temp_dir")
    return Path(value) if value else Path("./temp")


def _parse_vars(values: Sequence[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise _fail(f"--var {item!r}: expected KEY=VALUE")
        if key in out:
            raise _fail(f"--var {key!r} is given twice")
        out[key] = value
    return out


def _check_size(size: int, what: str) -> int:
    if size < 0:
        raise _fail(f"{what} {size}: the size must be 0 or more")
    if size > INT32_MAX:
        raise _fail(f"{what} {size}: the size must be at most {INT32_MAX}")
    return size


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _timestamp(message: Message, field: str) -> str | None:
    """RFC 3339 text of a Timestamp field, or None when the server left it unset."""
    if not message.HasField(field):
        return None
    value = getattr(message, field)
    return _rfc3339(value.ToDatetime(tzinfo=UTC))


def _cell(value: object) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


Column = tuple[str, str]  # (header, row key)


def _print_table(rows: Sequence[Row], columns: Sequence[Column]) -> None:
    cells = [[header for header, _ in columns]]
    cells.extend([_cell(row.get(key)) for _, key in columns] for row in rows)
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        typer.echo("   ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip())


def _print_details(rows: Sequence[Row], fields: Sequence[Column]) -> None:
    width = max(len(label) for label, _ in fields) + 1
    for index, row in enumerate(rows):
        if index:
            typer.echo("")
        for label, key in fields:
            typer.echo(f"{label + ':':<{width}} {_cell(row.get(key))}")


@dataclass(frozen=True, slots=True)
class _View:
    """How a command shows its rows in table mode."""

    columns: Sequence[Column]
    empty: str = ""
    details: bool = False

    def show(self, rows: Sequence[Row]) -> None:
        if not rows:
            if self.empty:
                typer.echo(self.empty)
            return
        if self.details:
            _print_details(rows, self.columns)
        else:
            _print_table(rows, self.columns)


@dataclass(frozen=True, slots=True)
class _Target:
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
) -> _Target:
    if output not in OUTPUT_FORMATS:
        raise _fail(f"--output {output!r} is not supported; use one of: {', '.join(OUTPUT_FORMATS)}")
    with _expected_errors():
        parsed = parse_servers(servers)
        shards = select_shards(parsed, shard, all_shards)
        seconds = parse_duration(timeout).total_seconds()
        if seconds <= 0:
            raise _fail(f"--timeout {timeout!r} must be a positive duration")
        identity = load_identity(identity_dir or default_identity_dir(_temp_dir(ctx)))
    return _Target(parsed, shards, identity, seconds, output)


def _execute(target: _Target, action: Callable[[ShardClient], list[Row]], view: _View) -> None:
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


# --- rows ----------------------------------------------------------------------------------------


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
INSTANCE_DETAILS: list[Column] = [
    ("shard", "shard"),
    ("instance id", "instance_id"),
    ("tenant", "tenant"),
    ("status", "status"),
    ("provider id", "provider_instance_id"),
    ("created at", "created_at"),
    ("last seen", "last_seen"),
]


# --- group ---------------------------------------------------------------------------------------


@group_app.command("list")
def group_list(
    ctx: typer.Context,
    servers: ServersOpt = "",
    identity_dir: IdentityDirOpt = None,
    shard: ShardOpt = None,
    all_shards: AllShardsOpt = False,
    timeout: TimeoutOpt = "30s",
    output: OutputOpt = "table",
) -> None:
    """List the groups of your tenant (static and dynamic) with desired and actual size."""
    target = resolve_target(ctx, servers, identity_dir, shard, all_shards, timeout, output)

    def action(client: ShardClient) -> list[Row]:
        return [_group_row(client.shard, g) for g in sorted(client.list_groups(), key=lambda g: g.key)]

    _execute(target, action, _View(GROUP_COLUMNS, empty="no groups"))


@group_app.command("status")
def group_status(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Group name.")],
    servers: ServersOpt = "",
    identity_dir: IdentityDirOpt = None,
    shard: ShardOpt = None,
    all_shards: AllShardsOpt = False,
    timeout: TimeoutOpt = "30s",
    output: OutputOpt = "table",
) -> None:
    """Show one group: settings, merged vars, actual size and provider IDs (a shard without it fails)."""
    target = resolve_target(ctx, servers, identity_dir, shard, all_shards, timeout, output)
    _execute(
        target,
        lambda client: [_group_row(client.shard, client.get_group(name))],
        _View(GROUP_DETAILS, details=True),
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
    servers: ServersOpt = "",
    identity_dir: IdentityDirOpt = None,
    shard: ShardOpt = None,
    all_shards: AllShardsOpt = False,
    timeout: TimeoutOpt = "30s",
    output: OutputOpt = "table",
) -> None:
    """Create a dynamic group, or replace its settings if it exists (UpsertGroup)."""
    _checked_identifier(name, "group")
    if not template:
        raise _fail("--template must not be empty")
    _check_size(size, "--size")
    variables = _parse_vars(var)
    target = resolve_target(ctx, servers, identity_dir, shard, all_shards, timeout, output)
    config = operator_pb2.GroupConfig(
        template=template,
        size=size,
        instance_type=instance_type,
        subnet_pool=subnet_pool,
        vars=variables,
    )
    _execute(
        target,
        lambda client: [_group_row(client.shard, client.upsert_group(name, config))],
        _View(GROUP_COLUMNS),
    )


# A negative SIZE reaches the range check (and its message) instead of reading as an unknown option.
@group_app.command("scale", context_settings={"ignore_unknown_options": True})
def group_scale(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Group name.")],
    size: Annotated[int, typer.Argument(help="New desired number of instances on each selected shard.")],
    servers: ServersOpt = "",
    identity_dir: IdentityDirOpt = None,
    shard: ShardOpt = None,
    all_shards: AllShardsOpt = False,
    timeout: TimeoutOpt = "30s",
    output: OutputOpt = "table",
) -> None:
    """Change a group's size and nothing else.

    The group is read first (ListGroups); its template, instance type, subnet pool and vars are sent back.

    Vars are sent as the server reports them (merged with the template's).
    """
    _checked_identifier(name, "group")
    _check_size(size, "SIZE")
    target = resolve_target(ctx, servers, identity_dir, shard, all_shards, timeout, output)

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
    _execute(target, action, _View(columns))


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
    servers: ServersOpt = "",
    identity_dir: IdentityDirOpt = None,
    shard: ShardOpt = None,
    all_shards: AllShardsOpt = False,
    timeout: TimeoutOpt = "30s",
    output: OutputOpt = "table",
) -> None:
    """Delete a dynamic group and its instances.

    A static group (defined in config.jsonc) cannot be deleted here: it is refused, or with
    --reset-static its runtime changes (size, overrides) are dropped and it returns to its config.
    """
    _checked_identifier(name, "group")
    target = resolve_target(ctx, servers, identity_dir, shard, all_shards, timeout, output)

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

    _execute(target, action, _View([("SHARD", "shard"), ("GROUP", "group"), ("RESULT", "result")]))


# --- instance ------------------------------------------------------------------------------------


@instance_app.command("list")
def instance_list(
    ctx: typer.Context,
    group: Annotated[str | None, typer.Option("--group", help="Only this group.")] = None,
    servers: ServersOpt = "",
    identity_dir: IdentityDirOpt = None,
    shard: ShardOpt = None,
    all_shards: AllShardsOpt = False,
    timeout: TimeoutOpt = "30s",
    output: OutputOpt = "table",
) -> None:
    """List running managed instances by provider ID, per group.

    The Operator API has no instance listing: this shows each group's provider IDs from ListGroups.

    On-demand instances, instances not yet running and instance IDs are not shown (see `instance show`).
    """
    target = resolve_target(ctx, servers, identity_dir, shard, all_shards, timeout, output)

    def action(client: ShardClient) -> list[Row]:
        groups = [client.get_group(group)] if group else sorted(client.list_groups(), key=lambda g: g.key)
        return [
            {"shard": client.shard, "group": g.key, "provider_id": provider_id}
            for g in groups
            for provider_id in g.provider_ids
        ]

    columns = [("SHARD", "shard"), ("GROUP", "group"), ("PROVIDER_ID", "provider_id")]
    _execute(target, action, _View(columns, empty="no running managed instances"))


@instance_app.command("show")
def instance_show(
    ctx: typer.Context,
    instance_id: Annotated[str, typer.Argument(help="Instance ID.")],
    servers: ServersOpt = "",
    identity_dir: IdentityDirOpt = None,
    shard: ShardOpt = None,
    all_shards: AllShardsOpt = False,
    timeout: TimeoutOpt = "30s",
    output: OutputOpt = "table",
) -> None:
    """Show one instance's status as the server sees it (GetInstanceStatus)."""
    target = resolve_target(ctx, servers, identity_dir, shard, all_shards, timeout, output)

    def action(client: ShardClient) -> list[Row]:
        status = client.get_instance_status(instance_id)
        return [
            {
                "shard": client.shard,
                "instance_id": status.instance_id,
                "tenant": status.tenant,
                "status": status.status,
                "provider_instance_id": status.provider_instance_id,
                "created_at": _timestamp(status, "created_at"),
                "last_seen": _timestamp(status, "last_seen"),
            }
        ]

    _execute(target, action, _View(INSTANCE_DETAILS, details=True))


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
    servers: ServersOpt = "",
    identity_dir: IdentityDirOpt = None,
    shard: ShardOpt = None,
    all_shards: AllShardsOpt = False,
    timeout: TimeoutOpt = "30s",
    output: OutputOpt = "table",
) -> None:
    """Create an on-demand instance in a group (CreateInstance); prints its ID and status."""
    _checked_identifier(group, "--group")
    if instance_id and all_shards:
        raise _fail("--instance-id names one instance; use it with --shard, not --all-shards")
    variables = _parse_vars(var)
    target = resolve_target(ctx, servers, identity_dir, shard, all_shards, timeout, output)
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
    _execute(target, action, _View(columns))


@instance_app.command("delete")
def instance_delete(
    ctx: typer.Context,
    instance_id: Annotated[str, typer.Argument(help="Instance ID.")],
    servers: ServersOpt = "",
    identity_dir: IdentityDirOpt = None,
    shard: ShardOpt = None,
    all_shards: AllShardsOpt = False,
    timeout: TimeoutOpt = "30s",
    output: OutputOpt = "table",
) -> None:
    """Delete an instance (idempotent: prints deleting or deleted; an unknown ID is an error)."""
    target = resolve_target(ctx, servers, identity_dir, shard, all_shards, timeout, output)

    def action(client: ShardClient) -> list[Row]:
        result = client.delete_instance(instance_id)
        if result.status == "unknown":
            raise NotFound(f"instance {instance_id!r} is not known to this shard")
        return [{"shard": client.shard, "instance_id": instance_id, "status": result.status}]

    columns = [("SHARD", "shard"), ("INSTANCE_ID", "instance_id"), ("STATUS", "status")]
    _execute(target, action, _View(columns))


# --- config --------------------------------------------------------------------------------------


def config_status(
    ctx: typer.Context,
    servers: ServersOpt = "",
    identity_dir: IdentityDirOpt = None,
    shard: ShardOpt = None,
    all_shards: AllShardsOpt = False,
    timeout: TimeoutOpt = "30s",
    output: OutputOpt = "table",
) -> None:
    """Show the config.jsonc each shard server has loaded (etag, last modified, size)."""
    target = resolve_target(ctx, servers, identity_dir, shard, all_shards, timeout, output)

    def action(client: ShardClient) -> list[Row]:
        status = client.get_config_status()
        return [
            {
                "shard": client.shard,
                "etag": status.etag,
                "last_modified": _timestamp(status, "last_modified"),
                "size": status.size,
            }
        ]

    columns = [("SHARD", "shard"), ("ETAG", "etag"), ("LAST_MODIFIED", "last_modified"), ("SIZE", "size")]
    _execute(target, action, _View(columns))


def config_refresh(
    ctx: typer.Context,
    servers: ServersOpt = "",
    identity_dir: IdentityDirOpt = None,
    shard: ShardOpt = None,
    all_shards: AllShardsOpt = False,
    timeout: TimeoutOpt = "30s",
    output: OutputOpt = "table",
) -> None:
    """Make shard servers download their config again and apply it without a restart."""
    target = resolve_target(ctx, servers, identity_dir, shard, all_shards, timeout, output)

    def action(client: ShardClient) -> list[Row]:
        result = client.refresh_config()
        return [
            {
                "shard": client.shard,
                "updated": result.updated,
                "result": "updated" if result.updated else "unchanged",
                "prev_etag": result.prev_etag,
                "etag": result.etag,
            }
        ]

    columns = [("SHARD", "shard"), ("RESULT", "result"), ("PREV_ETAG", "prev_etag"), ("ETAG", "etag")]
    _execute(target, action, _View(columns))


# --- cluster register-operator -------------------------------------------------------------------


def _operator_public_key(path: Path) -> PublicKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _fail(f"--public-key-file {path}: {exc.strerror or exc}") from None
    with _expected_errors():
        key = load_any_public_key_pem(data, what=f"--public-key-file {path}")
    with _expected_errors():
        return require_public_key(key, ("ecdsa-p256", "ed25519"), what=f"--public-key-file {path}")


def _check_output_dir(directory: Path, public_key: PublicKey | None, force: bool) -> None:
    """Refuse to clobber an identity, or to leave a key beside a certificate it does not match."""
    if directory.exists() and not directory.is_dir():
        raise _fail(f"--output-dir {directory} exists and is not a directory")
    cert_path, key_path = directory / CERT_FILE, directory / KEY_FILE
    if not force and (cert_path.exists() or (public_key is None and key_path.exists())):
        raise _fail(
            f"{directory} already holds an operator identity; use --force to replace it, "
            "or choose another --output-dir"
        )
    if public_key is not None and key_path.exists():
        try:
            existing = load_private_key_pem(key_path.read_bytes(), what=str(key_path))
        except (OSError, NstanceError):
            existing = None
        if existing is None or not public_keys_equal(existing, public_key):
            raise _fail(
                f"{key_path} is not the private key of --public-key-file; remove it or choose another "
                "--output-dir (the new certificate would not match it)"
            )


def cluster_register_operator(
    ctx: typer.Context,
    cluster_id: Annotated[
        str,
        typer.Option(
            "--cluster-id",
            help="Cluster identifier. Default: read from storage (the CA, else the shard configs).",
        ),
    ] = "",
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant the operator acts for.")] = "default",
    operator_id: Annotated[
        str | None,
        typer.Option("--operator-id", help="Operator ID (certificate CN). Default: a new puidv7 'opr...'."),
    ] = None,
    public_key_file: Annotated[
        Path | None,
        typer.Option(
            "--public-key-file",
            help="ECDSA P-256 or Ed25519 public key (PEM) to certify. Default: generate a key pair.",
        ),
    ] = None,
    output_dir: Annotated[
        Path | None,
        typer.Option(
            "--output-dir",
            envvar=IDENTITY_DIR_ENV,
            help=(
                "Directory for ca.crt, identity.key and identity.crt. "
                "Default <temp-dir>/cli-operator-identity."
            ),
        ),
    ] = None,
    cert_ttl_hours: Annotated[
        int, typer.Option("--cert-ttl-hours", help="Certificate lifetime in hours.")
    ] = 8760,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an identity already in the output directory.")
    ] = False,
    storage_provider: StorageProviderOpt = "s3",
    storage_bucket: StorageBucketOpt = "",
    storage_prefix: StoragePrefixOpt = "cluster/",
    secrets_provider: SecretsProviderOpt = "object-storage",
    secrets_prefix: SecretsPrefixOpt = "",
    secrets_project: SecretsProjectOpt = "",
    key_provider: KeyProviderOpt = "env",
    key_source: KeySourceOpt = "NSTANCE_ENCRYPTION_KEY",
) -> None:
    """Issue an operator certificate with the cluster CA key (no server needed) and write the identity."""
    if cluster_id:
        _checked_identifier(cluster_id, "--cluster-id")
    _checked_identifier(tenant, "--tenant")
    op_id = operator_id if operator_id is not None else str(new_puid("opr"))
    _checked_identifier(op_id, "--operator-id")
    if cert_ttl_hours <= 0:
        raise _fail(f"--cert-ttl-hours {cert_ttl_hours} must be a positive number of hours")
    directory = output_dir or default_identity_dir(_temp_dir(ctx))
    public_key = _operator_public_key(public_key_file) if public_key_file else None
    _check_output_dir(directory, public_key, force)
    private_key: PrivateKey | None = None
    if public_key is None:
        private_key = generate_private_key("ecdsa-p256")
        public_key = private_key.public_key()

    opts = StorageOptions(
        storage_provider=storage_provider,
        storage_bucket=storage_bucket,
        storage_prefix=storage_prefix,
        secrets_provider=secrets_provider,
        secrets_prefix=secrets_prefix,
        secrets_project=secrets_project,
        key_provider=key_provider,
        key_source=key_source,
    )
    with _expected_errors():
        stores = open_cluster_stores(opts)
        identity = load_cluster_identity(stores.cluster, stores.secrets)
        if not cluster_id:
            orgs = identity.ca.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
            cluster_id = cluster_id_from_storage(stores, str(orgs[0].value) if orgs else "")
        issued = issue_client_certificate(
            identity.ca,
            public_key,
            client_id=op_id,
            tenant=tenant,
            role="operator",
            ttl=timedelta(hours=cert_ttl_hours),
        )
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise _fail(f"cannot create --output-dir {directory}: {exc.strerror or exc}") from None

    record_key = operator_record_key(tenant, cluster_id)
    record = operator_record(
        cluster_id=cluster_id,
        tenant=tenant,
        operator_id=op_id,
        public_key_pem=public_key_to_pem(public_key).decode("ascii"),
        issued=issued,
        now=datetime.now(UTC),
    )
    with _expected_errors():
        replaced = stores.cluster.exists(record_key)
        stores.cluster.put(record_key, record)

    written = [directory / CA_FILE]
    try:
        write_atomic(directory / CA_FILE, identity.ca.cert_pem, mode=0o644, dir_mode=None)
        if private_key is not None:
            write_atomic(directory / KEY_FILE, private_key_to_pem(private_key), mode=0o600, dir_mode=None)
            written.append(directory / KEY_FILE)
        write_atomic(directory / CERT_FILE, issued.cert_pem, mode=0o644, dir_mode=None)
        written.append(directory / CERT_FILE)
    except OSError as exc:
        raise _fail(
            f"the certificate was issued and recorded, but writing {directory} failed: {exc.strerror or exc}"
        ) from None

    typer.echo(
        f"registered operator {op_id} for tenant {tenant} in cluster {cluster_id} "
        f"(certificate serial {issued.serial_hex}, expires {_rfc3339(issued.not_after)})"
    )
    typer.echo(f"wrote {', '.join(str(p) for p in written)}")
    verb = "replaced" if replaced else "wrote"
    typer.echo(f"{verb} registration record {storage_prefix}{record_key}")
    if private_key is None:
        typer.echo(f"put the private key of {public_key_file} in {directory / KEY_FILE} to use this identity")


# --- registration --------------------------------------------------------------------------------


def register(app: typer.Typer, cluster_app: typer.Typer, config_app: typer.Typer) -> None:
    """Attach the shard commands and ``cluster register-operator`` to nstance-admin's typer apps."""
    app.add_typer(group_app, name="group")
    app.add_typer(instance_app, name="instance")
    config_app.command("status")(config_status)
    config_app.command("refresh")(config_refresh)
    cluster_app.command("register-operator")(cluster_register_operator)
