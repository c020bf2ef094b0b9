"""Command-line options shared by the nstance-admin command modules (storage and secrets flags).

Declared once so that every storage command spells, documents and reads its storage flags the same way,
and the same way as nstance-server (``--storage-provider``/``--storage``, ``--storage-bucket``/``--bucket``,
environment ``NSTANCE_STORAGE`` and ``NSTANCE_BUCKET``). Only typer annotations here, and ``temp_dir``,
which reads the root ``--temp-dir``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

StorageProviderOpt = Annotated[
    str,
    typer.Option(
        "--storage-provider",
        "--storage",
        envvar="NSTANCE_STORAGE",
        help="Object storage: file, s3 or gcs (the same flag and variable as nstance-server's).",
    ),
]
StorageBucketOpt = Annotated[
    str,
    typer.Option(
        "--storage-bucket",
        "--bucket",
        envvar="NSTANCE_BUCKET",
        help="Bucket name (s3) or directory (file). Required.",
    ),
]
StoragePrefixOpt = Annotated[str, typer.Option("--storage-prefix", help="Key prefix of the cluster scope.")]
SecretsProviderOpt = Annotated[
    str,
    typer.Option(
        "--secrets-provider",
        envvar="NSTANCE_SECRETS_PROVIDER",
        help=(
            "object-storage (AES-256-GCM), aws-parameter-store, aws-secrets-manager, "
            "google-secret-manager or memory."
        ),
    ),
]
SecretsPrefixOpt = Annotated[
    str,
    typer.Option(
        "--secrets-prefix",
        help=(
            "Name prefix of secrets. Default: the provider's, as the server uses (secret/, /nstance/, "
            "nstance/, nstance-)."
        ),
    ),
]
SecretsProjectOpt = Annotated[
    str,
    typer.Option(
        "--secrets-project",
        envvar="NSTANCE_SECRETS_PROJECT",
        help="Google project of google-secret-manager secrets (and of a google-secret-manager key).",
    ),
]
KeyProviderOpt = Annotated[
    str,
    typer.Option(
        "--key-provider",
        help=(
            "Where the object-storage encryption key is: env, file, aws-parameter-store, "
            "aws-secrets-manager or google-secret-manager."
        ),
    ),
]
KeySourceOpt = Annotated[
    str,
    typer.Option(
        "--key-source",
        help="Environment variable name (env), path (file) or secret/parameter name of the key.",
    ),
]


def temp_dir(ctx: typer.Context) -> Path:
    """The ``--temp-dir`` given to ``nstance-admin`` (generated identities and nonces go below it)."""
    value = ctx.find_root().params.get("temp_dir")
    return Path(value) if value else Path("./temp")
