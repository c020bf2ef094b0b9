"""A cluster whose secrets are in Google Secret Manager, as upstream v2 runs on Google: ``nstance-admin
cluster init`` writes the CA key and nonce key there, a real ``nstance-server`` starts from them and leads,
and an object-storage encryption key can itself come from Secret Manager. The Secret Manager is
``GsmFake`` over real gRPC, reached through the unmodified client library."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nstance.admin.cli import app
from nstance.objectstore.file import FileObjectStore
from nstance.objectstore.scoped import ScopedObjectStore
from nstance.secrets.keys import generate_encryption_key
from nstance.testing.gsmfake import GsmFake
from nstance.testing.shardproc import LocalCluster, ServerProcess, free_port, server_addrs, shard_config


@pytest.fixture
def gsm() -> Iterator[GsmFake]:
    with GsmFake() as fake:
        yield fake


def _server(cluster: LocalCluster, root: Path, env: dict[str, str]) -> ServerProcess:
    return ServerProcess(
        server_id="s1",
        shard="zone-a",
        bucket=cluster.bucket,
        cachedir=root / "cache",
        health_addr=f"127.0.0.1:{free_port()}",
        log_path=root / "server.log",
        env={"NSTANCE_ENCRYPTION_KEY": "", **env},  # no object-storage key anywhere in reach
    ).start()


def test_admin_init_then_a_server_runs_from_secret_manager(gsm: GsmFake, tmp_path: Path) -> None:
    project = f"p-{uuid.uuid4().hex[:8]}"
    bucket = tmp_path / "bucket"
    env = {"SECRET_MANAGER_EMULATOR_HOST": gsm.endpoint, "NSTANCE_ENCRYPTION_KEY": ""}
    flags = ["--storage-provider", "file", "--storage-bucket", str(bucket)]
    google = ["--secrets-provider", "google-secret-manager", "--secrets-project", project]
    result = CliRunner().invoke(app, ["cluster", "init", "--cluster-id", "test", *flags, *google], env=env)
    assert result.exit_code == 0, result.stdout + result.stderr
    # Upstream's secret ids: the default prefix, the name's dot as a dash.
    assert gsm.versions(project, "nstance-ca-key")
    assert gsm.versions(project, "nstance-registration-nonce-key")
    assert (bucket / "cluster" / "ca.crt").is_file()
    assert not (bucket / "cluster" / "secret").exists()  # nothing of the secrets in the bucket

    cluster = LocalCluster(bucket)
    config = shard_config(addrs=server_addrs())
    config["cluster"]["secrets"] = {"provider": "google-secret-manager", "project_id": project}
    cluster.write_config("zone-a", config)
    server = _server(cluster, tmp_path, {"SECRET_MANAGER_EMULATOR_HOST": gsm.endpoint})
    try:
        assert server.wait_healthy(timeout=60).startswith("ok")
    finally:
        assert server.stop() == 0

    nonce = CliRunner().invoke(
        app, ["cluster", "nonce", "--cluster-id", "test", "-o", "-", *flags, *google], env=env
    )
    assert nonce.exit_code == 0, nonce.stderr
    assert nonce.stdout.count(".") == 2  # a JWT


def test_an_object_storage_key_from_secret_manager(gsm: GsmFake, tmp_path: Path) -> None:
    project = f"p-{uuid.uuid4().hex[:8]}"
    key = generate_encryption_key()
    gsm.put(project, "fleet-encryption-key", key.encode())
    bucket = tmp_path / "bucket"
    env = {"SECRET_MANAGER_EMULATOR_HOST": gsm.endpoint, "NSTANCE_ENCRYPTION_KEY": ""}
    flags = ["--storage-provider", "file", "--storage-bucket", str(bucket)]
    keyflags = ["--key-provider", "google-secret-manager", "--key-source", "fleet-encryption-key"]
    result = CliRunner().invoke(
        app,
        ["cluster", "init", "--cluster-id", "test", *flags, *keyflags, "--secrets-project", project],
        env=env,
    )
    assert result.exit_code == 0, result.stdout + result.stderr
    assert (bucket / "cluster" / "secret" / "ca.key").is_file()  # encrypted in the bucket

    cluster = LocalCluster(bucket)
    config = shard_config(addrs=server_addrs())
    config["cluster"]["secrets"] = {
        "provider": "object-storage",
        "encryption_key": {
            "provider": "google-secret-manager",
            "source": "fleet-encryption-key",
            "project_id": project,
        },
    }
    cluster.write_config("zone-a", config)
    server = _server(cluster, tmp_path, {"SECRET_MANAGER_EMULATOR_HOST": gsm.endpoint})
    try:
        assert server.wait_healthy(timeout=60).startswith("ok")
    finally:
        assert server.stop() == 0
    assert ScopedObjectStore(FileObjectStore(bucket), "cluster/").exists("ca.crt")
