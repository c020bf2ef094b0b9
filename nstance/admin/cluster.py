"""``nstance-admin cluster init|nonce|register-operator`` and ``secrets generate-key``: the cluster's
identity, worked on directly in storage with the CA and nonce keys (no server needed).

``init`` creates the CA and the registration-nonce key and refuses to overwrite a cluster; ``nonce``
signs an operator registration JWT; ``register-operator`` issues an operator client certificate (for
a new Ed25519 key, as upstream's admin, unless given a public key) with the CA key, records it at
``operator/{tenant}.{cluster_id}.json`` in the cluster scope and writes the identity directory the
shard commands read. The only objects written are the cluster identity and that record.

The storage and secrets options belong to ``cluster`` and are accepted after each ``cluster`` command
too (``persistent``); the commands read them with ``storage_options``.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer
from cryptography.x509.oid import NameOID

from nstance.core.atomicfile import ensure_dir, write_atomic
from nstance.core.durations import parse_duration
from nstance.core.errors import NstanceError
from nstance.core.ids import new_puid
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
from nstance.pki.nonce import operator_nonce_claims, sign_nonce
from nstance.pki.operator_record import operator_record, operator_record_key
from nstance.secrets.cluster_identity import ensure_cluster_identity, identity_state, load_cluster_identity
from nstance.secrets.keys import generate_encryption_key

from .client import CA_FILE, CERT_FILE, IDENTITY_DIR_ENV, KEY_FILE, default_identity_dir
from .options import (
    KeyProviderOpt,
    KeySourceOpt,
    SecretsPrefixOpt,
    SecretsProjectOpt,
    SecretsProviderOpt,
    StorageBucketOpt,
    StoragePrefixOpt,
    StorageProviderOpt,
    temp_dir,
)
from .output import checked_identifier, expected_errors, fail, rfc3339
from .persistent import PersistentGroup, option_value
from .stores import StorageOptions, cluster_id_from_storage, open_cluster_stores

cluster_app = typer.Typer(
    cls=PersistentGroup, add_completion=False, help="Cluster bootstrap (direct storage access, no server)."
)
secrets_app = typer.Typer(add_completion=False, help="Secrets helpers.")

#: The key type of an identity register-operator generates: Ed25519, as upstream's admin generates, the
#: only type a Go server and a Go admin's identity loader accept (this server takes ECDSA P-256 too).
GENERATED_KEY_TYPE = "ed25519"
#: Modes of what upstream's admin writes: missing directories 0700; nonce, ca.crt, identity.* 0600.
PRIVATE_DIR_MODE = 0o700
IDENTITY_FILE_MODE = 0o600

ClusterIdOpt = Annotated[str, typer.Option("--cluster-id", help="Cluster identifier. Required.")]
STORAGE_OPTIONS = (
    "storage_provider",
    "storage_bucket",
    "storage_prefix",
    "secrets_provider",
    "secrets_prefix",
    "secrets_project",
    "key_provider",
    "key_source",
)


@cluster_app.callback()
def cluster_options(
    storage_provider: StorageProviderOpt = "s3",
    storage_bucket: StorageBucketOpt = "",
    storage_prefix: StoragePrefixOpt = "cluster/",
    secrets_provider: SecretsProviderOpt = "object-storage",
    secrets_prefix: SecretsPrefixOpt = "",
    secrets_project: SecretsProjectOpt = "",
    key_provider: KeyProviderOpt = "env",
    key_source: KeySourceOpt = "NSTANCE_ENCRYPTION_KEY",
) -> None:
    """Storage and secrets of the cluster: options of ``cluster`` and of each ``cluster`` command."""
    del storage_provider, storage_bucket, storage_prefix, secrets_provider
    del secrets_prefix, secrets_project, key_provider, key_source


def storage_options(ctx: typer.Context) -> StorageOptions:
    """The storage and secrets options given to ``cluster`` or to the running ``cluster`` command."""
    return StorageOptions(**{name: option_value(ctx, name) for name in STORAGE_OPTIONS})


@cluster_app.command("init")
def cluster_init(
    ctx: typer.Context,
    cluster_id: ClusterIdOpt,
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
    checked_identifier(cluster_id, "--cluster-id")
    if ca_key_type not in ("ecdsa-p256", "ed25519"):
        raise fail(f"--ca-key-type {ca_key_type!r} is not supported; use ecdsa-p256 or ed25519")
    opts = storage_options(ctx)
    with expected_errors():
        stores = open_cluster_stores(opts, create=True)
        state = identity_state(stores.cluster, stores.secrets)
        if state.complete:
            identity = load_cluster_identity(stores.cluster, stores.secrets)
            if not exist_ok:
                raise fail(
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
    ctx: typer.Context,
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
) -> None:
    """Sign an operator registration nonce (JWT) with the cluster's registration-nonce key."""
    checked_identifier(cluster_id, "--cluster-id")
    checked_identifier(tenant, "--tenant")
    opts = storage_options(ctx)
    with expected_errors():
        ttl = parse_duration(expiry)
        if ttl.total_seconds() <= 0:
            raise fail(f"--expiry {expiry!r} must be a positive duration")
        stores = open_cluster_stores(opts)
        identity = load_cluster_identity(stores.cluster, stores.secrets)
        token = sign_nonce(
            identity.nonce_key, operator_nonce_claims(cluster_id=cluster_id, tenant=tenant, ttl=ttl)
        )
    if output == "-":
        sys.stdout.write(token + "\n")
        return
    path = Path(output) if output else temp_dir(ctx) / "cli-operator-identity" / "nonce.jwt"
    if path.is_dir():
        raise fail(f"--output {path} is a directory; name the file to write (or '-' for stdout)")
    # As upstream's admin: the token alone (no newline), missing directories 0700, the file 0600.
    try:
        write_atomic(path, token.encode(), mode=0o600, dir_mode=PRIVATE_DIR_MODE)
    except OSError as exc:  # a parent that is a file, no permission, a full disk: nothing was written
        raise fail(f"cannot write the nonce to {path}: {exc.strerror or exc}") from None
    typer.echo(f"wrote operator nonce for tenant {tenant} (valid {expiry}) to {path}")


@secrets_app.command("generate-key")
def secrets_generate_key() -> None:
    """Print a new random encryption key for the object-storage secrets provider: 32 letters and digits,
    used byte for byte (what upstream's Go server reads too)."""
    typer.echo(generate_encryption_key())


def _operator_public_key(path: Path) -> PublicKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise fail(f"--public-key-file {path}: {exc.strerror or exc}") from None
    with expected_errors():
        key = load_any_public_key_pem(data, what=f"--public-key-file {path}")
    with expected_errors():
        return require_public_key(key, ("ecdsa-p256", "ed25519"), what=f"--public-key-file {path}")


def _check_output_dir(directory: Path, public_key: PublicKey | None, force: bool) -> None:
    """Refuse to clobber an identity, or to leave a key beside a certificate it does not match."""
    if directory.exists() and not directory.is_dir():
        raise fail(f"--output-dir {directory} exists and is not a directory")
    cert_path, key_path = directory / CERT_FILE, directory / KEY_FILE
    if not force and (cert_path.exists() or (public_key is None and key_path.exists())):
        raise fail(
            f"{directory} already holds an operator identity; use --force to replace it, "
            "or choose another --output-dir"
        )
    if public_key is not None and key_path.exists():
        try:
            existing = load_private_key_pem(key_path.read_bytes(), what=str(key_path))
        except (OSError, NstanceError):
            existing = None
        if existing is None or not public_keys_equal(existing, public_key):
            raise fail(
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
            help="Ed25519 or ECDSA P-256 public key (PEM) to certify. Default: generate an Ed25519 key pair.",
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
) -> None:
    """Issue an operator certificate with the cluster CA key (no server needed) and write the identity."""
    if cluster_id:
        checked_identifier(cluster_id, "--cluster-id")
    checked_identifier(tenant, "--tenant")
    op_id = operator_id if operator_id is not None else str(new_puid("opr"))
    checked_identifier(op_id, "--operator-id")
    if cert_ttl_hours <= 0:
        raise fail(f"--cert-ttl-hours {cert_ttl_hours} must be a positive number of hours")
    directory = output_dir or default_identity_dir(temp_dir(ctx))
    public_key = _operator_public_key(public_key_file) if public_key_file else None
    _check_output_dir(directory, public_key, force)
    private_key: PrivateKey | None = None
    if public_key is None:
        private_key = generate_private_key(GENERATED_KEY_TYPE)
        public_key = private_key.public_key()

    opts = storage_options(ctx)
    with expected_errors():
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
        ensure_dir(directory, PRIVATE_DIR_MODE)
    except OSError as exc:
        raise fail(f"cannot create --output-dir {directory}: {exc.strerror or exc}") from None

    record_key = operator_record_key(tenant, cluster_id)
    record = operator_record(
        cluster_id=cluster_id,
        tenant=tenant,
        operator_id=op_id,
        public_key_pem=public_key_to_pem(public_key).decode("ascii"),
        issued=issued,
        now=datetime.now(UTC),
    )
    with expected_errors():
        replaced = stores.cluster.exists(record_key)
        stores.cluster.put(record_key, record)

    written = [directory / CA_FILE]
    try:
        write_atomic(directory / CA_FILE, identity.ca.cert_pem, mode=IDENTITY_FILE_MODE, dir_mode=None)
        if private_key is not None:
            key_pem = private_key_to_pem(private_key)
            write_atomic(directory / KEY_FILE, key_pem, mode=IDENTITY_FILE_MODE, dir_mode=None)
            written.append(directory / KEY_FILE)
        write_atomic(directory / CERT_FILE, issued.cert_pem, mode=IDENTITY_FILE_MODE, dir_mode=None)
        written.append(directory / CERT_FILE)
    except OSError as exc:
        raise fail(
            f"the certificate was issued and recorded, but writing {directory} failed: {exc.strerror or exc}"
        ) from None

    typer.echo(
        f"registered operator {op_id} for tenant {tenant} in cluster {cluster_id} "
        f"(certificate serial {issued.serial_hex}, expires {rfc3339(issued.not_after)})"
    )
    typer.echo(f"wrote {', '.join(str(p) for p in written)}")
    verb = "replaced" if replaced else "wrote"
    typer.echo(f"{verb} registration record {opts.storage_prefix}{record_key}")
    if private_key is None:
        typer.echo(f"put the private key of {public_key_file} in {directory / KEY_FILE} to use this identity")


cluster_app.command("register-operator")(cluster_register_operator)
