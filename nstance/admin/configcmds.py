"""``nstance-admin config validate|upload|status|refresh``: shard config files. ``validate`` and
``upload`` work on files and storage (nothing is uploaded that does not validate); ``status`` and
``refresh`` ask the shard servers through the Operator API what they have loaded, and to load again.
(``config plan`` is in ``plan``.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nstance.config import validate_config_file

from .client import ShardClient
from .options import StorageBucketOpt, StorageProviderOpt
from .output import Row, View, checked_identifier, expected_errors, fail, timestamp
from .shardcalls import (
    OutputOpt,
    execute,
    group_target,
)
from .stores import StorageOptions, open_cluster_stores


def config_validate(
    files: Annotated[list[Path], typer.Argument(help="config.jsonc files to check.")],
) -> None:
    """Check config files; print OK or every problem (JSON path and rule). Exit 1 on any problem."""
    failed = False
    for path in files:
        problems = validate_config_file(path)
        if problems:
            failed = True
            noun = "problem" if len(problems) == 1 else "problems"
            typer.echo(f"{path}: {len(problems)} {noun}", err=True)
            for problem in problems:
                typer.echo(f"  {problem}", err=True)
        else:
            typer.echo(f"{path}: OK")
    if failed:
        raise typer.Exit(1)


def config_upload(
    file: Annotated[Path, typer.Argument(help="config.jsonc to upload.")],
    shard: Annotated[str, typer.Option("--shard", help="Shard whose config this is. Required.")],
    storage_provider: StorageProviderOpt = "s3",
    storage_bucket: StorageBucketOpt = "",
) -> None:
    """Validate a config file, then store it as shard/{shard}/config.jsonc (nothing is written if invalid)."""
    checked_identifier(shard, "--shard")
    problems = validate_config_file(file)
    if problems:
        for problem in problems:
            typer.echo(f"{file}: {problem}", err=True)
        raise fail(f"{file} is invalid; nothing was uploaded")
    with expected_errors():
        # Uploading config needs no secrets; the memory secrets provider avoids demanding a key.
        stores = open_cluster_stores(
            StorageOptions(storage_provider, storage_bucket, secrets_provider="memory")
        )
        etag = stores.shard(shard).put("config.jsonc", file.read_bytes())
    typer.echo(f"uploaded {file} to shard/{shard}/config.jsonc (etag {etag})")


def config_status(
    ctx: typer.Context,
    output: OutputOpt = "table",
) -> None:
    """Show the config.jsonc each shard server has loaded (etag, last modified, size)."""
    target = group_target(ctx, output)

    def action(client: ShardClient) -> list[Row]:
        status = client.get_config_status()
        return [
            {
                "shard": client.shard,
                "etag": status.etag,
                "last_modified": timestamp(status, "last_modified"),
                "size": status.size,
            }
        ]

    columns = [("SHARD", "shard"), ("ETAG", "etag"), ("LAST_MODIFIED", "last_modified"), ("SIZE", "size")]
    execute(target, action, View(columns))


def config_refresh(
    ctx: typer.Context,
    output: OutputOpt = "table",
) -> None:
    """Make shard servers download their config again and apply it without a restart."""
    target = group_target(ctx, output)

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
    execute(target, action, View(columns))


def register_config(config_app: typer.Typer) -> None:
    """Attach ``config validate``, ``upload``, ``status`` and ``refresh`` to the ``config`` group."""
    config_app.command("validate")(config_validate)
    config_app.command("upload")(config_upload)
    config_app.command("status")(config_status)
    config_app.command("refresh")(config_refresh)
