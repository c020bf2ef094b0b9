"""Command line of nstance-admin: cluster bootstrap, operator nonces and config checks.

Commands that touch storage take upstream's storage/secrets flags (see ``stores``). Every expected
failure (bad flag, invalid config, missing key, inconsistent cluster state) prints ``error: ...`` on
stderr and exits with status 1; nothing is written before every check that can fail has passed.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from nstance.config import validate_config_file
from nstance.core.atomicfile import write_atomic
from nstance.core.cli import DEBUG_ENV, VERSION_HELP, print_version, run_app
from nstance.core.durations import parse_duration
from nstance.core.errors import NstanceError
from nstance.core.ids import identifier_problem
from nstance.core.logformat import TEXT_FORMAT
from nstance.pki.nonce import operator_nonce_claims, sign_nonce
from nstance.secrets.cluster_identity import ensure_cluster_identity, identity_state, load_cluster_identity
from nstance.secrets.keys import generate_encryption_key

from .certs import register_certs
from .commands import register
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
from .plan import register_plan
from .stores import StorageOptions, open_cluster_stores
from .watch import register_watch

app = typer.Typer(
    add_completion=False, help="Nstance administration: cluster bootstrap, nonces, config checks."
)
cluster_app = typer.Typer(add_completion=False, help="Cluster bootstrap (direct storage access, no server).")
config_app = typer.Typer(add_completion=False, help="Shard config files: validate and upload.")
secrets_app = typer.Typer(add_completion=False, help="Secrets helpers.")
app.add_typer(cluster_app, name="cluster")
app.add_typer(config_app, name="config")
app.add_typer(secrets_app, name="secrets")

_state: dict[str, Path] = {"temp_dir": Path("./temp")}

ClusterIdOpt = Annotated[str, typer.Option("--cluster-id", help="Cluster identifier. Required.")]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


@contextmanager
def _expected_errors() -> Iterator[None]:
    """Turn domain errors into one clear line and exit status 1 (no traceback)."""
    try:
        yield
    except NstanceError as exc:
        raise _fail(str(exc)) from None


def _checked_identifier(value: str, flag: str) -> str:
    problem = identifier_problem(value)
    if problem:
        raise _fail(f"{flag} {value!r}: {problem}")
    return value


@app.callback()
def main_options(
    temp_dir: Annotated[
        Path, typer.Option("--temp-dir", help="Working directory for generated files (identity, nonces).")
    ] = Path("./temp"),
    version: Annotated[
        bool,
        typer.Option("--version", callback=print_version("nstance-admin"), is_eager=True, help=VERSION_HELP),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            "-v",
            envvar=DEBUG_ENV,
            help="Debug logs on stderr, and a traceback for an unexpected error.",
        ),
    ] = False,
) -> None:
    """Nstance administration."""
    _state["temp_dir"] = temp_dir
    if debug:
        os.environ[DEBUG_ENV] = "1"
        logging.basicConfig(level=logging.DEBUG, format=TEXT_FORMAT, stream=sys.stderr)


# --- config -----------------------------------------------------------------------------------


@config_app.command("validate")
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


@config_app.command("upload")
def config_upload(
    file: Annotated[Path, typer.Argument(help="config.jsonc to upload.")],
    shard: Annotated[str, typer.Option("--shard", help="Shard whose config this is. Required.")],
    storage_provider: StorageProviderOpt = "s3",
    storage_bucket: StorageBucketOpt = "",
) -> None:
    """Validate a config file, then store it as shard/{shard}/config.jsonc (nothing is written if invalid)."""
    _checked_identifier(shard, "--shard")
    problems = validate_config_file(file)
    if problems:
        for problem in problems:
            typer.echo(f"{file}: {problem}", err=True)
        raise _fail(f"{file} is invalid; nothing was uploaded")
    with _expected_errors():
        # Uploading config needs no secrets; the memory secrets provider avoids demanding a key.
        stores = open_cluster_stores(
            StorageOptions(storage_provider, storage_bucket, secrets_provider="memory")
        )
        etag = stores.shard(shard).put("config.jsonc", file.read_bytes())
    typer.echo(f"uploaded {file} to shard/{shard}/config.jsonc (etag {etag})")


# --- cluster ----------------------------------------------------------------------------------


@cluster_app.command("init")
def cluster_init(
    cluster_id: ClusterIdOpt,
    storage_provider: StorageProviderOpt = "s3",
    storage_bucket: StorageBucketOpt = "",
    storage_prefix: StoragePrefixOpt = "cluster/",
    secrets_provider: SecretsProviderOpt = "object-storage",
    secrets_prefix: SecretsPrefixOpt = "",
    secrets_project: SecretsProjectOpt = "",
    key_provider: KeyProviderOpt = "env",
    key_source: KeySourceOpt = "NSTANCE_ENCRYPTION_KEY",
    ca_key_type: Annotated[
        str,
        typer.Option(
            "--ca-key-type",
            help="Key type of a new CA: ed25519 (what upstream's Go server loads) or ecdsa-p256.",
        ),
    ] = "ed25519",
    exist_ok: Annotated[
        bool, typer.Option("--exist-ok", help="Succeed without changes when the cluster is already set up.")
    ] = False,
) -> None:
    """Create the cluster CA and the registration-nonce key. Refuses to overwrite an existing cluster."""
    _checked_identifier(cluster_id, "--cluster-id")
    if ca_key_type not in ("ecdsa-p256", "ed25519"):
        raise _fail(f"--ca-key-type {ca_key_type!r} is not supported; use ecdsa-p256 or ed25519")
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
        stores = open_cluster_stores(opts, create=True)
        state = identity_state(stores.cluster, stores.secrets)
        if state.complete:
            identity = load_cluster_identity(stores.cluster, stores.secrets)
            if not exist_ok:
                raise _fail(
                    "the cluster is already initialised (CA sha256 "
                    f"{identity.ca_fingerprint}); nothing was changed. Use --exist-ok to accept this."
                )
            typer.echo(f"cluster already initialised; CA sha256 {identity.ca_fingerprint}")
            return
        result = ensure_cluster_identity(
            stores.cluster, stores.secrets, cluster_id=cluster_id, key_type=ca_key_type
        )
    done = [
        label
        for label, flag in (
            ("created the CA", result.created_ca),
            ("re-created the missing CA certificate for the existing CA key", result.repaired_ca_cert),
            ("created the registration-nonce key", result.created_nonce_key),
        )
        if flag
    ]
    typer.echo(f"cluster {cluster_id}: {'; '.join(done) or 'nothing to do'}")
    typer.echo(f"CA sha256 {result.identity.ca_fingerprint} ({result.identity.ca.key_type})")


@cluster_app.command("nonce")
def cluster_nonce(
    cluster_id: ClusterIdOpt,
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant the operator acts for.")] = "default",
    expiry: Annotated[str, typer.Option("--expiry", help="Validity as a Go duration (3h, 90m).")] = "3h",
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            "-o",
            help="File to write; '-' prints to stdout. Default <temp-dir>/cli-operator-identity/nonce.jwt.",
        ),
    ] = None,
    storage_provider: StorageProviderOpt = "s3",
    storage_bucket: StorageBucketOpt = "",
    storage_prefix: StoragePrefixOpt = "cluster/",
    secrets_provider: SecretsProviderOpt = "object-storage",
    secrets_prefix: SecretsPrefixOpt = "",
    secrets_project: SecretsProjectOpt = "",
    key_provider: KeyProviderOpt = "env",
    key_source: KeySourceOpt = "NSTANCE_ENCRYPTION_KEY",
) -> None:
    """Sign an operator registration nonce (JWT) with the cluster's registration-nonce key."""
    _checked_identifier(cluster_id, "--cluster-id")
    _checked_identifier(tenant, "--tenant")
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
        ttl = parse_duration(expiry)
        if ttl.total_seconds() <= 0:
            raise _fail(f"--expiry {expiry!r} must be a positive duration")
        stores = open_cluster_stores(opts)
        identity = load_cluster_identity(stores.cluster, stores.secrets)
        token = sign_nonce(
            identity.nonce_key, operator_nonce_claims(cluster_id=cluster_id, tenant=tenant, ttl=ttl)
        )
    if output == "-":
        sys.stdout.write(token + "\n")
        return
    path = Path(output) if output else _state["temp_dir"] / "cli-operator-identity" / "nonce.jwt"
    write_atomic(path, (token + "\n").encode(), mode=0o600, dir_mode=None)
    typer.echo(f"wrote operator nonce for tenant {tenant} (valid {expiry}) to {path}")


# --- secrets ----------------------------------------------------------------------------------


@secrets_app.command("generate-key")
def secrets_generate_key() -> None:
    """Print a new random encryption key for the object-storage secrets provider: 32 letters and digits,
    used byte for byte (what upstream's Go server reads too)."""
    typer.echo(generate_encryption_key())


# --- shard commands and cluster register-operator (commands.py) --------------------------------

register(app, cluster_app, config_app)
register_plan(config_app)
register_certs(app)
register_watch(app)


def main() -> None:
    """Console-script entry point."""
    run_app(app, "nstance-admin")
