"""Command line of nstance-server.

This release ships the flags and the config check (``--validate FILE``); the shard daemon itself
(leader election, reconciler, gRPC services) is built on this foundation in the next release, and
until then running without ``--validate`` says so and exits with status 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nstance.config import validate_config_file

app = typer.Typer(add_completion=False, help="Per-shard Nstance server: keeps groups of VMs at their size.")

EXIT_NOT_AVAILABLE = 2

IdOpt = Annotated[str | None, typer.Option("--id", envvar="NSTANCE_SERVER_ID", help="This server's id.")]
ShardOpt = Annotated[str | None, typer.Option(envvar="NSTANCE_SHARD", help="Shard (zone) this server runs.")]
StorageOpt = Annotated[str, typer.Option(envvar="NSTANCE_STORAGE", help="Object storage kind: file or s3.")]
BucketOpt = Annotated[
    str | None, typer.Option(envvar="NSTANCE_BUCKET", help="Bucket name (s3) or directory (file).")
]
PrefixOpt = Annotated[str | None, typer.Option(envvar="NSTANCE_PREFIX", help="Key prefix of the cluster.")]
CacheOpt = Annotated[
    Path, typer.Option(envvar="NSTANCE_CACHEDIR", help="Local cache directory (SQLite, config copies).")
]
ValidateOpt = Annotated[
    Path | None,
    typer.Option("--validate", help="Validate a config.jsonc file, print every problem, and exit."),
]


@app.command()
def main_command(
    server_id: IdOpt = None,
    shard: ShardOpt = None,
    storage: StorageOpt = "file",
    bucket: BucketOpt = None,
    prefix: PrefixOpt = None,
    cachedir: CacheOpt = Path("./cache"),
    validate: ValidateOpt = None,
) -> None:
    """Run the shard server, or validate a config file with --validate."""
    if validate is not None:
        problems = validate_config_file(validate)
        if problems:
            for problem in problems:
                typer.echo(f"{validate}: {problem}", err=True)
            raise typer.Exit(1)
        typer.echo(f"{validate}: OK")
        return
    typer.echo(
        "nstance-server: the shard daemon is not part of this release yet; "
        "use --validate FILE to check a config, or nstance-admin for cluster setup.",
        err=True,
    )
    raise typer.Exit(EXIT_NOT_AVAILABLE)


def main() -> None:
    """Console-script entry point."""
    app()
