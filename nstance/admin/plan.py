"""``nstance-admin config plan FILE``: what uploading a new config.jsonc would do, before it is uploaded.

For each selected shard it reads the stored ``shard/{shard}/config.jsonc`` and ``groups.jsonc`` and the
shard's instance records (``instance/*.json``) straight from object storage, merges every group under
the current and the new config, computes the runtime and infra hashes (``nstance.config.hashes``) and
lets ``nstance.core.configplan`` decide per group: push files, rotate N instances, resize, new group,
removed group or unchanged.

This module only reads storage; it writes nothing and contacts no server. It must not import
``nstance.server`` (admin and server are independent), so instance records are read as plain JSON here:
only ``tenant``, ``group``, ``status``, ``on_demand``, ``infra_config_hash`` and, for a record without
that hash, ``instance_type`` and ``config.template`` matter.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from nstance.config import (
    ConfigError,
    DynamicGroups,
    Problem,
    ServerConfig,
    all_group_keys,
    infra_hash,
    legacy_infra_hash,
    load_config_file,
    load_config_text,
    load_groups_text,
    merged_group,
    runtime_hash,
    validate_config_file,
)
from nstance.config.errors import join_path
from nstance.core.configplan import GroupChange, GroupHashes, InstanceFacts, plan_config_change
from nstance.core.errors import FailedPrecondition, InvalidArgument, NotFound, NstanceError
from nstance.core.ids import GroupKey, identifier_problem
from nstance.objectstore.base import ObjectNotFound, ObjectStore

from .options import StorageBucketOpt, StorageProviderOpt
from .output import fail, print_table
from .stores import StorageOptions, open_cluster_stores

CONFIG_KEY = "config.jsonc"
GROUPS_KEY = "groups.jsonc"
RECORD_PREFIX = "instance/"
READ_WORKERS = 8
OUTPUT_FORMATS = ("table", "json")


@dataclass(slots=True)
class ShardPlan:
    """The plan of one shard plus what the user should know about how it was made."""

    shard: str
    changes: list[GroupChange]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# --- hashes ----------------------------------------------------------------------------------------


def group_hashes(
    config: ServerConfig, dynamic: DynamicGroups
) -> tuple[dict[GroupKey, GroupHashes], list[Problem]]:
    """Hashes and size of every group the config and dynamic groups define, and the groups that break.

    A dynamic group whose template the config does not define cannot be merged; it is reported as a
    problem at ``tenant.group`` (the server refuses such a config the same way).
    """
    hashes: dict[GroupKey, GroupHashes] = {}
    problems: list[Problem] = []
    for tenant, group in all_group_keys(config, dynamic):
        try:
            merged = merged_group(config, dynamic, tenant, group)
        except (FailedPrecondition, NotFound) as exc:
            problems.append(Problem(join_path(tenant, group), str(exc)))
            continue
        hashes[(tenant, group)] = GroupHashes(
            runtime_hash(merged),
            infra_hash(merged),
            merged.size,
            legacy_infra_hash(merged),
            instance_type=merged.instance_type,
            template=merged.template,
        )
    return hashes, problems


# --- instance records ------------------------------------------------------------------------------


def _facts_of(key: str, data: bytes) -> tuple[GroupKey, InstanceFacts]:
    """The plan's view of one record; ValueError saying what is wrong if it cannot be used."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not valid UTF-8 JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"must be a JSON object, got {type(doc).__name__}")
    values: dict[str, str] = {}
    for name in ("instance_id", "tenant", "group"):
        raw = doc.get(name)
        if not isinstance(raw, str) or not raw:
            raise ValueError(f'field "{name}" must be a non-empty string')
        values[name] = raw
    for name in ("status", "infra_config_hash", "instance_type"):
        raw = doc.get(name)
        if raw is not None and not isinstance(raw, str):
            raise ValueError(f'field "{name}" must be a string, got {type(raw).__name__}')
        values[name] = raw or ""
    config = doc.get("config")
    template = config.get("template") if isinstance(config, dict) else None
    on_demand = doc.get("on_demand")
    if on_demand is not None and not isinstance(on_demand, bool):
        raise ValueError(f'field "on_demand" must be true or false, got {on_demand!r}')
    facts = InstanceFacts(
        instance_id=values["instance_id"],
        status=values["status"] or "pending",
        infra_hash=values["infra_config_hash"],
        on_demand=bool(on_demand),
        instance_type=values["instance_type"],
        template=template if isinstance(template, str) else "",
    )
    return (values["tenant"], values["group"]), facts


def _read_one(store: ObjectStore, key: str) -> tuple[GroupKey, InstanceFacts] | str | None:
    try:
        data, _ = store.get(key)
    except ObjectNotFound:
        return None  # deleted since the listing
    try:
        return _facts_of(key, data)
    except ValueError as exc:
        return f"skipped instance record {key}: {exc}"


def instance_facts(
    store: ObjectStore, *, workers: int = READ_WORKERS
) -> tuple[dict[GroupKey, list[InstanceFacts]], list[str]]:
    """Every readable instance record of a shard, by group, and one warning per record that is not."""
    keys = [key for key in store.list(RECORD_PREFIX) if key.endswith(".json")]
    if len(keys) > 1 and workers > 1:
        with ThreadPoolExecutor(max_workers=min(workers, len(keys))) as pool:
            results = list(pool.map(lambda key: _read_one(store, key), keys))
    else:
        results = [_read_one(store, key) for key in keys]
    by_group: dict[GroupKey, list[InstanceFacts]] = {}
    warnings: list[str] = []
    for result in results:
        if isinstance(result, str):
            warnings.append(result)
        elif result is not None:
            group_key, facts = result
            by_group.setdefault(group_key, []).append(facts)
    return by_group, warnings


# --- one shard -------------------------------------------------------------------------------------


def _stored_text(store: ObjectStore, key: str, source: str) -> str | None:
    try:
        data, _ = store.get(key)
    except ObjectNotFound:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"{source} is not UTF-8 text (byte {exc.start})") from None


def plan_shard(store: ObjectStore, shard: str, new_config: ServerConfig) -> ShardPlan:
    """Compare the shard's stored config with ``new_config``; NstanceError if the result would not load.

    The stored config must be valid (otherwise there is nothing to compare against); the new config
    must merge with the shard's dynamic groups, as the server will insist when it loads it.
    """
    base = f"shard/{shard}/"
    notes: list[str] = []
    warnings: list[str] = []
    groups_text = _stored_text(store, GROUPS_KEY, base + GROUPS_KEY)
    dynamic = load_groups_text(groups_text or "", base + GROUPS_KEY)
    config_text = _stored_text(store, CONFIG_KEY, base + CONFIG_KEY)
    old: dict[GroupKey, GroupHashes] = {}
    if config_text is None:
        notes.append(f"shard {shard} has no {base}{CONFIG_KEY} yet: every group is new")
    else:
        try:
            current = load_config_text(config_text, base + CONFIG_KEY)
        except ConfigError as exc:
            raise FailedPrecondition(
                f"cannot compare with the stored config, it is invalid: {exc} "
                "(the plan of a fix cannot be shown; `config validate` the new file and upload it)"
            ) from None
        old, broken = group_hashes(current, dynamic)
        warnings.extend(f"{base}{CONFIG_KEY}: {problem} (left out of the comparison)" for problem in broken)
    new, problems = group_hashes(new_config, dynamic)
    if problems:
        raise ConfigError(f"the new config with {base}{GROUPS_KEY}", problems)
    instances, record_warnings = instance_facts(store)
    warnings.extend(record_warnings)
    return ShardPlan(shard, plan_config_change(old, new, instances), notes, warnings)


def stored_shards(root: ObjectStore) -> list[str]:
    """Names of the shards that have a ``shard/{shard}/config.jsonc`` in the bucket."""
    names: set[str] = set()
    for key in root.list("shard/"):
        parts = key.split("/")
        if len(parts) == 3 and parts[2] == CONFIG_KEY and identifier_problem(parts[1]) is None:
            names.add(parts[1])
    return sorted(names)


# --- output ----------------------------------------------------------------------------------------


def plan_rows(plans: list[ShardPlan]) -> list[dict[str, Any]]:
    """One JSON-ready row per group and shard."""
    return [{"shard": plan.shard, **change.to_dict()} for plan in plans for change in plan.changes]


def _totals(rows: Sequence[Mapping[str, Any]]) -> str:
    changed = [row for row in rows if row["changes"] != ["unchanged"]]
    pushes = sum(1 for row in rows if "push_files" in row["changes"])
    rotate = sum(int(row["rotate"]) for row in rows)
    delete = sum(int(row["delete"]) for row in rows)
    return (
        f"{len(changed)} of {len(rows)} groups change; files pushed in {pushes}, "
        f"{rotate} instances rotated, {delete} deleted"
    )


COLUMNS = [
    ("SHARD", "shard"),
    ("TENANT", "tenant"),
    ("GROUP", "group"),
    ("INSTANCES", "instances"),
    ("PLAN", "summary"),
]


# --- command ---------------------------------------------------------------------------------------


def config_plan(
    file: Annotated[Path, typer.Argument(help="The new config.jsonc (not uploaded).")],
    shard: Annotated[
        str | None,
        typer.Option("--shard", help="Shard to compare with. Default: the file's shard.id."),
    ] = None,
    all_shards: Annotated[
        bool, typer.Option("--all-shards", help="Compare with every shard that has a stored config.")
    ] = False,
    output: Annotated[str, typer.Option("--output", "-o", help="Output format: table or json.")] = "table",
    storage_provider: StorageProviderOpt = "s3",
    storage_bucket: StorageBucketOpt = "",
) -> None:
    """Show what uploading FILE would do per group: push files, rotate instances, resize, add, remove.

    Reads the shard's stored config, dynamic groups and instance records; writes nothing.
    """
    if output not in OUTPUT_FORMATS:
        raise fail(f"--output {output!r} is not supported; use one of: {', '.join(OUTPUT_FORMATS)}")
    if shard is not None and all_shards:
        raise fail("use either --shard or --all-shards, not both")
    problems = validate_config_file(file)
    if problems:
        for problem in problems:
            typer.echo(f"{file}: {problem}", err=True)
        raise fail(f"{file} is invalid; nothing was planned")
    plans: list[ShardPlan] = []
    try:
        new_config = load_config_file(file)
        stores = open_cluster_stores(
            StorageOptions(storage_provider, storage_bucket, secrets_provider="memory")
        )
        if all_shards:
            names = stored_shards(stores.root)
            if not names:
                raise NotFound(f"no shard has a stored config under shard/ in {storage_bucket}")
        else:
            names = [shard or new_config.shard.id]
        for name in names:
            plans.append(plan_shard(stores.shard(name), name, new_config))
    except NstanceError as exc:
        raise fail(str(exc)) from None
    for plan in plans:
        for note in plan.notes:
            typer.echo(f"note: {note}", err=True)
        for warning in plan.warnings:
            typer.echo(f"warning: {warning}", err=True)
    rows = plan_rows(plans)
    if output == "json":
        typer.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    if not rows:
        typer.echo("no groups in either config")
        return
    print_table(rows, COLUMNS)
    typer.echo("")
    typer.echo(_totals(rows))


def register_plan(config_app: typer.Typer) -> None:
    """Attach ``config plan`` to nstance-admin's ``config`` typer app."""
    config_app.command("plan")(config_plan)
