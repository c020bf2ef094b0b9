"""Command-line options shared by the nstance-admin command modules (storage and secrets flags).

Declared once so that `cluster init`, `cluster nonce` and `cluster register-operator` spell, document
and read their storage flags the same way. Only typer annotations here; no behaviour.
"""

from __future__ import annotations

from typing import Annotated

import typer

StorageProviderOpt = Annotated[
    str, typer.Option("--storage-provider", envvar="NSTANCE_STORAGE", help="Object storage: file, s3 or gcs.")
]
StorageBucketOpt = Annotated[
    str,
    typer.Option(
        "--storage-bucket", envvar="NSTANCE_BUCKET", help="Bucket name (s3) or directory (file). Required."
    ),
]
StoragePrefixOpt = Annotated[str, typer.Option("--storage-prefix", help="Key prefix of the cluster scope.")]
SecretsProviderOpt = Annotated[
    str,
    typer.Option(
        "--secrets-provider",
        envvar="NSTANCE_SECRETS_PROVIDER",
        help="object-storage (AES-256-GCM), aws-secrets-manager or memory.",
    ),
]
SecretsPrefixOpt = Annotated[str, typer.Option("--secrets-prefix", help="Name prefix of secrets.")]
KeyProviderOpt = Annotated[
    str, typer.Option("--key-provider", help="Where the object-storage encryption key is: env or file.")
]
KeySourceOpt = Annotated[
    str, typer.Option("--key-source", help="Environment variable name (env) or path (file) of the key.")
]
