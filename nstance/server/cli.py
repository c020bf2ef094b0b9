"""Command line of nstance-server: flags and environment variables in, ``app.serve`` out.

Every flag has an environment variable (``NSTANCE_SERVER_ID``, ``NSTANCE_SHARD``, ``NSTANCE_STORAGE``,
``NSTANCE_BUCKET``, ``NSTANCE_PREFIX``, ``NSTANCE_CACHEDIR``, ``NSTANCE_HEALTH_ADDR``,
``NSTANCE_PROVIDER_INSTANCE_ID``, ...). ``--validate FILE`` checks a config file, and a bare
``--validate`` the shard's documents in object storage, and exits without starting anything.

Upstream's command lines work unchanged: every flag of upstream's root command is accepted (v2's
``--proxy-socket``, ``--tunnel-socket`` and ``--server-files-dir`` serve features not implemented
here: they are logged as ignored), and Go's forms click does not take are rewritten before parsing -
a bool flag with a value (``--debug=false``, ``-v=1``, ``--version=true``, in every spelling Go's
``strconv.ParseBool`` takes) and a bare ``--validate``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from nstance.config import validate_config_file
from nstance.core.cli import VERSION_HELP, print_version, run_app
from nstance.core.errors import NstanceError
from nstance.objectstore.factory import check_bucket_directory, open_scopes
from nstance.objectstore.scoped import ScopedObjectStore
from nstance.server.app import ServerOptions, serve, setup_logging
from nstance.server.validate import remote_config_problems

app = typer.Typer(
    add_completion=False,
    help="Per-shard Nstance server: keeps groups of VMs at their size.",
    context_settings={"help_option_names": ["-h", "--help"]},  # -h as upstream's cobra
)
log = logging.getLogger("nstance.server")

EXIT_USAGE = 2

IdOpt = Annotated[str | None, typer.Option("--id", envvar="NSTANCE_SERVER_ID", help="This server's id.")]
ShardOpt = Annotated[str | None, typer.Option(envvar="NSTANCE_SHARD", help="Shard (zone) this server runs.")]
StorageOpt = Annotated[
    str,
    typer.Option(
        "--storage-provider",
        "--storage",
        envvar="NSTANCE_STORAGE",
        help="Object storage: s3 (default), gcs or file (flag, variable and default as nstance-admin's).",
    ),
]
BucketOpt = Annotated[
    str | None,
    typer.Option(
        "--storage-bucket",
        "--bucket",
        envvar="NSTANCE_BUCKET",
        help="Bucket (s3, gcs) or an existing directory (file; `nstance-admin cluster init` creates it).",
    ),
]
PrefixOpt = Annotated[
    str | None,
    typer.Option(
        envvar="NSTANCE_PREFIX",
        help="Key prefix of this shard's objects, {shard} replaced (default shard/{shard}/), as upstream.",
    ),
]
CacheOpt = Annotated[
    Path, typer.Option(envvar="NSTANCE_CACHEDIR", help="Local cache directory (SQLite, config copies).")
]
HealthOpt = Annotated[
    str | None,
    typer.Option(
        envvar="NSTANCE_HEALTH_ADDR",
        help="host:port of the health/metrics endpoint. Default: shard.bind.health_addr, as upstream "
        "(:8990 until the config is loaded, so a config that will not load shows on /health).",
    ),
]
BindHostOpt = Annotated[
    str,
    typer.Option(envvar="NSTANCE_BIND_HOST", help="Override the host of every shard.bind address."),
]
AdvertiseHostOpt = Annotated[
    str,
    typer.Option(
        envvar="NSTANCE_ADVERTISE_HOST",
        help="This server's host in shard.advertise.health_addr and election_addr, which must then be "
        'port-only (":8991"), as upstream.',
    ),
]
#: Upstream v2's flags for features not implemented here: flag -> the feature (logged when given).
IGNORED_FLAGS = {
    "--proxy-socket": "wake proxy's control socket",
    "--tunnel-socket": "tunnel supervisor's control socket",
    "--server-files-dir": "server-local files",
}
_IGNORED = "Accepted and ignored: upstream v2's {} (default there {}) is not implemented here."
ProxySocketOpt = Annotated[
    str | None,
    typer.Option(
        envvar="NSTANCE_PROXY_SOCKET",
        help=_IGNORED.format("wake proxy", "/run/nstance/nstance-server.sock"),
    ),
]
TunnelSocketOpt = Annotated[
    str | None,
    typer.Option(
        envvar="NSTANCE_TUNNEL_SOCKET",
        help=_IGNORED.format("tunnel supervisor", "/run/nstance/nstance-tunnel.sock"),
    ),
]
ServerFilesDirOpt = Annotated[
    str | None,
    typer.Option(
        envvar="NSTANCE_SERVER_FILES_DIR",
        help=_IGNORED.format("server-local files", "/run/nstance/files"),
    ),
]
ProviderIdOpt = Annotated[
    str,
    typer.Option(
        envvar="NSTANCE_PROVIDER_INSTANCE_ID",
        help="The provider's id of the VM this server runs on, for shard.leader_network "
        "(default: asked from the cloud's metadata service).",
    ),
]
VerboseOpt = Annotated[
    bool,
    typer.Option(
        "--debug/--no-debug",
        "--verbose",
        "-v",
        envvar="NSTANCE_DEBUG",
        help="Debug logging, and every start-up step (--debug=false as upstream is --no-debug).",
    ),
]
VersionOpt = Annotated[
    bool,
    typer.Option("--version", callback=print_version("nstance-server"), is_eager=True, help=VERSION_HELP),
]
#: ``--validate`` given without a file: validate the shard's config in object storage.
REMOTE = "-"
ValidateOpt = Annotated[
    str | None,
    typer.Option(
        "--validate",
        help="Validate a config.jsonc file, or without a file the shard's config.jsonc and groups.jsonc in "
        "object storage (needs --shard, --storage, --bucket); print every problem and exit.",
    ),
]


@app.command()
def main_command(
    server_id: IdOpt = None,
    shard: ShardOpt = None,
    storage: StorageOpt = "s3",
    bucket: BucketOpt = None,
    prefix: PrefixOpt = None,
    cachedir: CacheOpt = Path("./cache"),
    health_addr: HealthOpt = None,
    bind_host: BindHostOpt = "",
    advertise_host: AdvertiseHostOpt = "",
    provider_instance_id: ProviderIdOpt = "",
    proxy_socket: ProxySocketOpt = None,
    tunnel_socket: TunnelSocketOpt = None,
    server_files_dir: ServerFilesDirOpt = None,
    verbose: VerboseOpt = False,
    validate: ValidateOpt = None,
    version: VersionOpt = False,
) -> None:
    """Run the shard server, or validate a config file with --validate."""
    if validate is not None:
        _validate(validate, storage=storage, bucket=bucket, prefix=prefix, shard=shard)
        return
    missing = [
        flag
        for flag, value in (("--id", server_id), ("--shard", shard), ("--storage-bucket", bucket))
        if not value
    ]
    if missing:
        typer.echo(
            f"nstance-server: {', '.join(missing)} required (or the matching NSTANCE_* variable)", err=True
        )
        raise typer.Exit(EXIT_USAGE)
    setup_logging(verbose)
    for (flag, feature), value in zip(
        IGNORED_FLAGS.items(), (proxy_socket, tunnel_socket, server_files_dir), strict=True
    ):
        if value is not None:
            log.info("%s %s: ignored (upstream v2's %s is not implemented here)", flag, value, feature)
    opts = ServerOptions(
        server_id=server_id or "",
        shard=shard or "",
        storage=storage,
        bucket=bucket or "",
        prefix=prefix or "",
        cachedir=cachedir,
        health_addr=health_addr,
        bind_host=bind_host,
        advertise_host=advertise_host,
        provider_instance_id=provider_instance_id,
    )
    try:
        if storage == "file":
            check_bucket_directory(bucket or "")
        code = asyncio.run(serve(opts))
    except NstanceError as exc:
        typer.echo(f"nstance-server: {exc}", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


def _validate(
    target: str, *, storage: str, bucket: str | None, prefix: str | None, shard: str | None
) -> None:
    if target != REMOTE:
        lines = [f"{target}: {problem}" for problem in validate_config_file(target)]
        where = target
    else:
        if not shard or not bucket:
            typer.echo("nstance-server: --validate without a file needs --shard and --bucket", err=True)
            raise typer.Exit(EXIT_USAGE)
        try:
            scopes = open_scopes(storage, bucket, shard=shard, prefix=prefix or None)
            scope = scopes.shard.prefix if isinstance(scopes.shard, ScopedObjectStore) else ""
            where = f"{storage}://{bucket}/{scope}"
            lines = remote_config_problems(scopes.shard, where)
        except NstanceError as exc:
            typer.echo(f"nstance-server: {exc}", err=True)
            raise typer.Exit(1) from None
    for line in lines:
        typer.echo(line, err=True)
    if lines:
        raise typer.Exit(1)
    typer.echo(f"{where}: OK")


#: Go's ``strconv.ParseBool`` spellings, which upstream's bool flags take as ``--flag=value``.
GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
#: Upstream's bool flags: the argument for true and for false (None: leave the flag out).
BOOL_FLAGS: dict[str, tuple[str, str | None]] = {
    "--debug": ("--debug", "--no-debug"),
    "--verbose": ("--debug", "--no-debug"),
    "-v": ("--debug", "--no-debug"),
    "--version": ("--version", None),
}


def with_go_bool_values(argv: Sequence[str]) -> list[str]:
    """``argv`` with upstream's ``--flag=VALUE`` bool flags rewritten to click's flags.

    Raises ValueError (one line) for a value Go would refuse too.
    """
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":
            out.extend(argv[i:])
            break
        name, sep, value = arg.partition("=")
        if not sep or name not in BOOL_FLAGS:
            out.append(arg)
            continue
        when_true, when_false = BOOL_FLAGS[name]
        if value in GO_TRUE:
            out.append(when_true)
        elif value in GO_FALSE:
            out.extend([when_false] if when_false else [])
        else:
            raise ValueError(f'invalid argument "{value}" for {name}: use true or false (or 1, 0, t, f)')
    return out


def _with_remote_validate(argv: list[str]) -> list[str]:
    """Upstream's bare ``--validate`` (no file): give it the value meaning "the shard's remote config"."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--validate" and (i + 1 == len(out) or out[i + 1].startswith("-")):
            out[i] = f"--validate={REMOTE}"
    return out


def main() -> None:
    """Console-script entry point."""
    try:
        sys.argv[1:] = _with_remote_validate(with_go_bool_values(sys.argv[1:]))
    except ValueError as exc:
        print(f"nstance-server: {exc}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    run_app(app, "nstance-server")
