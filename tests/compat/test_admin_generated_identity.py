"""The operator identity `nstance-admin cluster register-operator` generates works against a real
server of this project over real TLS, under either CA type, and has the shape upstream's servers and
admin require (an Ed25519 key in PKCS#8 PEM, as Go's ``x509.MarshalPKCS8PrivateKey`` writes it).

The cluster is created and the identity issued with the CLI alone; the server runs in this process on
loopback ports with file object storage, as in ``test_mixed_identities``. The parameter
``ed25519-leaf`` makes the server present an Ed25519 certificate, as upstream's servers do, so the
admin takes its OpenSSL channel; with ``ecdsa-p256`` it takes grpcio's own TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from typer.testing import CliRunner

from nstance.admin.cli import app
from nstance.pki.keys import load_private_key_pem
from nstance.server.app import ServerApp, ServerOptions
from nstance.testing.procs import http_probe
from nstance.testing.shardproc import ENCRYPTION_KEY_B64, LocalCluster, server_addrs, shard_config
from nstance.testing.waiting import eventually

pytestmark = pytest.mark.timeout(120)
SHARD = "zone-a"
CLUSTER = "gen-id"
ENV: dict[str, str | None] = {
    "NSTANCE_ENCRYPTION_KEY": ENCRYPTION_KEY_B64,
    "NSTANCE_ADMIN_SERVERS": None,
    "NSTANCE_ADMIN_IDENTITY_DIR": None,
    "NSTANCE_ADMIN_SHARD": None,
    "NSTANCE_STORAGE": None,
    "NSTANCE_BUCKET": None,
}
#: The bytes before the 32-byte seed in Go's ``x509.MarshalPKCS8PrivateKey`` of an Ed25519 key, printed
#: by a scratch Go 1.26 program for ``ed25519.NewKeyFromSeed(0x00..0x1f)`` (its whole DER is this prefix
#: followed by the seed): what upstream's ``identity.Load`` parses as an ``ed25519.PrivateKey``.
GO_ED25519_PKCS8_PREFIX = bytes.fromhex("302e020100300506032b657004220420")


def admin(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env=ENV)
    assert "Traceback" not in result.stderr
    return result.exit_code, result.stdout, result.stderr


@contextlib.asynccontextmanager
async def serving(root: Path, addrs: dict[str, str], *, leaf: str) -> AsyncIterator[None]:
    options = ServerOptions(
        server_id="s1",
        shard=SHARD,
        storage="file",
        bucket=str(root / "bucket"),
        cachedir=root / "cache",
        health_addr=addrs["health_addr"],
        environ={"NSTANCE_ENCRYPTION_KEY": ENCRYPTION_KEY_B64},
        server_key_type=leaf,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(ServerApp(options).run(stop))
    try:
        yield
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0


@pytest.mark.parametrize(
    ("ca_key_type", "leaf"),
    [("ecdsa-p256", "ecdsa-p256"), ("ed25519", "ed25519")],
    ids=["ecdsa-ca", "ed25519-ca-ed25519-leaf"],
)
async def test_the_generated_identity_is_ed25519_and_drives_a_real_server(
    tmp_path: Path, ca_key_type: str, leaf: str
) -> None:
    storage = ["--storage-provider", "file", "--storage-bucket", str(tmp_path / "bucket")]
    code, _, err = admin("cluster", "init", "--cluster-id", CLUSTER, "--ca-key-type", ca_key_type, *storage)
    assert code == 0, err
    identity = tmp_path / "identity"
    code, _, err = admin("cluster", "register-operator", "--output-dir", str(identity), *storage)
    assert code == 0, err

    pem = (identity / "identity.key").read_bytes()
    assert pem.startswith(b"-----BEGIN PRIVATE KEY-----\n")
    key = load_private_key_pem(pem)
    assert isinstance(key, ed25519.Ed25519PrivateKey)
    der = key.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    seed = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    assert der == GO_ED25519_PKCS8_PREFIX + seed

    addrs = server_addrs()
    LocalCluster(tmp_path / "bucket", cluster_id=CLUSTER).write_config(
        SHARD, shard_config(cluster_id=CLUSTER, shard=SHARD, addrs=addrs)
    )
    shard_flags = ["--servers", f"{SHARD}={addrs['operator_addr']}", "--identity-dir", str(identity)]
    async with serving(tmp_path, addrs, leaf=leaf):

        async def leads() -> bool:  # a standby answers the list below but refuses the scale
            return (await asyncio.to_thread(http_probe, addrs["health_addr"], "/leader/health"))[0] == 200

        await eventually(leads, within=60, what="the server to lead its shard")
        listed: list[str] = []

        async def lists_groups() -> bool:
            code, out, _ = await asyncio.to_thread(admin, "group", "list", "-o", "json", *shard_flags)
            if code == 0:
                listed[:] = [g["group"] for g in json.loads(out)]
            return code == 0

        await eventually(lists_groups, within=60, what="group list with the generated identity")
        assert listed == ["web"]

        async def scales() -> bool:
            # A lease can lapse on a loaded machine (the fast test election, the admin's work in the
            # same process): the standby refusal is then retried, as a person would; anything else fails.
            code, _, err = await asyncio.to_thread(admin, "group", "scale", "web", "0", *shard_flags)
            assert code == 0 or "this server is a standby" in err, err
            return code == 0

        await eventually(scales, within=60, what="group scale with the generated identity")
