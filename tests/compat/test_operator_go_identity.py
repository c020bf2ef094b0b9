"""This operator taking over from upstream's Go operator, and its own identities in upstream's clusters.

What an admin sees: after swapping the Go operator's image for this one, the operator keeps working
with the Go operator's identity: its Ed25519 certificate is used as it is (no new nonce needed; the Go
operator deleted its nonce after registering) and its key Secret is left untouched; when only the Go
key is left, registration uses that key. A new identity in a cluster with an Ed25519 CA is Ed25519,
which upstream's servers require, and reaches a server presenting an Ed25519 certificate (as upstream's
do) for registration and for the Operator API.

Each test runs a real shard server in this process (real TLS on loopback ports, file object storage)
and the Kubernetes API emulator. The Go operator cannot be built here, so its side is played by what it
leaves in the Secrets (upstream internal/operator/config: LoadOrGenerateKeypair, StoreCertificate):
``private.key``/``public.key`` (Ed25519, PKCS#8 / SPKI PEM) in a Secret without a type, ``tls.crt``/
``tls.key`` in another, and a certificate with upstream's fields (CN the cluster id, O the tenant, role
``operator``) from the cluster's Ed25519 CA.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from google.protobuf.empty_pb2 import Empty

from nstance.core.backoff import Backoff
from nstance.operator.config import OperatorConfig, ShardEndpoint
from nstance.operator.identity import Identity, IdentityManager
from nstance.operator.kube import CONFIGMAPS, SECRETS, Kube, load_configuration
from nstance.operator.renewal import CertificateRenewer
from nstance.operator.settings import build_settings
from nstance.operator.shards import ShardSet
from nstance.pki.certs import issue_client_certificate
from nstance.pki.keys import (
    PrivateKey,
    generate_private_key,
    load_private_key_pem,
    private_key_to_pem,
    public_key_to_pem,
)
from nstance.pki.nonce import operator_nonce_claims, sign_nonce
from nstance.pki.peer import verify_client_certificate
from nstance.server.app import ServerApp, ServerOptions
from nstance.testing.kubeapi import KubeAPIServer
from nstance.testing.shardproc import ENCRYPTION_KEY_B64, LocalCluster, server_addrs, shard_config
from nstance.testing.waiting import eventually

pytestmark = pytest.mark.timeout(120)
SHARD = "zone-a"
CLUSTER = "gofleet"
TENANT = "default"
NS = "default"
CALL_TIMEOUT = 10.0


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, *, leaf: str) -> AsyncIterator[tuple[LocalCluster, dict[str, str]]]:
    """One shard server of a cluster with an Ed25519 CA (upstream's), presenting a ``leaf`` certificate."""
    cluster = LocalCluster(tmp_path / "bucket", cluster_id=CLUSTER, ca_key_type="ed25519")
    cluster.init()
    addrs = server_addrs()
    config = shard_config(
        cluster_id=CLUSTER,
        shard=SHARD,
        addrs=addrs,
        election={"frequent_interval": "200ms", "infrequent_interval": "1s", "leader_timeout": "6s"},
    )
    cluster.write_config(SHARD, config)
    options = ServerOptions(
        server_id="s1",
        shard=SHARD,
        storage="file",
        bucket=str(cluster.bucket),
        cachedir=tmp_path / "cache",
        health_addr=addrs["health_addr"],
        environ={"NSTANCE_ENCRYPTION_KEY": ENCRYPTION_KEY_B64},
        server_key_type=leaf,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(ServerApp(options).run(stop))
    try:
        yield cluster, addrs
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[Kube]:
    async with KubeAPIServer() as server:
        configuration = await load_configuration(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
        client = Kube.from_configuration(configuration)
        try:
            yield client
        finally:
            await client.close()


def operator_config(addrs: dict[str, str]) -> OperatorConfig:
    endpoint = ShardEndpoint(addrs["registration_addr"], addrs["operator_addr"])
    return OperatorConfig(cluster_id=CLUSTER, tenant=TENANT, shards={SHARD: endpoint})


def manager(kube: Kube, **kwargs: Any) -> IdentityManager:
    settings = build_settings(namespace=NS, disable_webhooks=True, environ={}, holder_identity="test")
    return IdentityManager(kube, settings, backoff=Backoff(base=0.1, cap=0.5), **kwargs)


async def secret_data(kube: Kube, name: str) -> dict[str, bytes] | None:
    obj = await kube.get(SECRETS, name, NS)
    if obj is None:
        return None
    return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}


async def put_ca(kube: Kube, cluster: LocalCluster) -> None:
    assert cluster.identity is not None
    body = {
        "metadata": {"name": "nstance-cluster-ca"},
        "data": {"ca.crt": cluster.identity.ca.cert_pem.decode()},
    }
    await kube.create(CONFIGMAPS, body, NS)


async def put_go_key(kube: Kube, key_type: str = "ed25519") -> PrivateKey:
    """The key Secret as the Go operator creates it (no type: the API server makes it Opaque)."""
    key = generate_private_key(key_type)
    data = {"private.key": b64(private_key_to_pem(key)), "public.key": b64(public_key_to_pem(key))}
    await kube.create(SECRETS, {"metadata": {"name": "nstance-operator-key"}, "data": data}, NS)
    return key


async def put_go_certificate(
    kube: Kube, cluster: LocalCluster, key: PrivateKey, ttl: timedelta = timedelta(days=30)
) -> bytes:
    """The certificate Secret as the Go operator stores it after registering (no type either)."""
    assert cluster.identity is not None
    issued = issue_client_certificate(
        cluster.identity.ca, key.public_key(), client_id=CLUSTER, tenant=TENANT, role="operator", ttl=ttl
    )
    data = {"tls.crt": b64(issued.cert_pem), "tls.key": b64(private_key_to_pem(key))}
    await kube.create(SECRETS, {"metadata": {"name": "nstance-operator-cert"}, "data": data}, NS)
    return issued.cert_pem


async def put_nonce(kube: Kube, cluster: LocalCluster) -> None:
    assert cluster.identity is not None
    claims = operator_nonce_claims(cluster_id=CLUSTER, tenant=TENANT, ttl=timedelta(hours=3))
    token = sign_nonce(cluster.identity.nonce_key, claims)
    body = {"metadata": {"name": "nstance-operator-nonce"}, "data": {"nonce.jwt": b64(token.encode())}}
    await kube.create(SECRETS, body, NS)


async def drives_the_operator_api(identity: Identity, addrs: dict[str, str]) -> None:
    """ListGroups over the operator's own mTLS connection succeeds with ``identity``."""
    shards = ShardSet(identity.ca_pem, identity.cert_pem, identity.key_pem)
    shards.update(operator_config(addrs).shards)
    groups: list[list[str]] = []

    async def listed() -> bool:
        try:
            reply = await shards.stub(SHARD).ListGroups(Empty(), timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError:
            return False
        groups.append([g.key for g in reply.groups])
        return True

    try:
        await eventually(listed, within=30, what="ListGroups with the operator's identity")
    finally:
        await shards.close()
    assert groups[-1] == ["web"]


@pytest.mark.parametrize(
    ("leaf", "key_type"),
    [
        ("ed25519", "ed25519"),  # the Go operator's identity, a Go server (played by ours with its leaf)
        ("ecdsa-p256", "ed25519"),  # the Go operator's identity, this project's server
        # an earlier version of this operator (P-256 identity) under this project's default Ed25519 CA:
        # after the upgrade its connections run over OpenSSL, with the same identity
        ("ecdsa-p256", "ecdsa-p256"),
    ],
)
async def test_a_stored_identity_is_used_as_it_is_and_its_key_kept(
    tmp_path: Path, kube: Kube, leaf: str, key_type: str
) -> None:
    async with serving(tmp_path, leaf=leaf) as (cluster, addrs):
        await put_ca(kube, cluster)
        go_key = await put_go_key(kube, key_type)
        go_cert = await put_go_certificate(kube, cluster, go_key)
        key_secret = await kube.get(SECRETS, "nstance-operator-key", NS)
        # No nonce: the Go operator deleted it after registering.

        async def refuse(*_: Any) -> bytes:
            raise AssertionError("the Go operator's certificate is usable: no registration")

        identity = await asyncio.wait_for(manager(kube, registrar=refuse).ensure(operator_config(addrs)), 30)

        assert identity.cert_pem == go_cert
        assert load_private_key_pem(identity.key_pem).public_key() == go_key.public_key()
        assert await kube.get(SECRETS, "nstance-operator-key", NS) == key_secret  # untouched
        await drives_the_operator_api(identity, addrs)


async def test_registration_keeps_the_go_operators_key(tmp_path: Path, kube: Kube) -> None:
    async with serving(tmp_path, leaf="ed25519") as (cluster, addrs):
        await put_ca(kube, cluster)
        go_key = await put_go_key(kube)
        key_secret = await kube.get(SECRETS, "nstance-operator-key", NS)
        await put_nonce(kube, cluster)  # the Go operator's certificate is gone: register again

        identity = await asyncio.wait_for(manager(kube).ensure(operator_config(addrs)), 60)

        assert cluster.identity is not None
        peer = verify_client_certificate(identity.cert_pem, cluster.identity.ca)
        assert peer.certificate.public_key() == go_key.public_key()
        assert await kube.get(SECRETS, "nstance-operator-key", NS) == key_secret  # untouched
        assert await kube.get(SECRETS, "nstance-operator-nonce", NS) is None
        await drives_the_operator_api(identity, addrs)


async def test_a_new_identity_under_an_ed25519_ca_is_ed25519_and_reaches_an_ed25519_server(
    tmp_path: Path, kube: Kube
) -> None:
    async with serving(tmp_path, leaf="ed25519") as (cluster, addrs):
        await put_ca(kube, cluster)
        await put_nonce(kube, cluster)

        identity = await asyncio.wait_for(manager(kube).ensure(operator_config(addrs)), 60)

        stored = await secret_data(kube, "nstance-operator-key")
        assert stored is not None
        key = load_private_key_pem(stored["private.key"])
        assert isinstance(key, ed25519.Ed25519PrivateKey)  # what upstream's servers (and operator) take
        assert not isinstance(key, ec.EllipticCurvePrivateKey)
        assert stored["public.key"] == public_key_to_pem(key)
        assert load_private_key_pem(identity.key_pem).public_key() == key.public_key()
        await drives_the_operator_api(identity, addrs)


async def test_the_go_operators_certificate_is_renewed_for_its_key(tmp_path: Path, kube: Kube) -> None:
    async with serving(tmp_path, leaf="ed25519") as (cluster, addrs):
        await put_ca(kube, cluster)
        go_key = await put_go_key(kube)
        go_cert = await put_go_certificate(kube, cluster, go_key, ttl=timedelta(seconds=4))
        identities = manager(kube)
        first = await asyncio.wait_for(identities.ensure(operator_config(addrs)), 30)
        assert first.cert_pem == go_cert
        shards = ShardSet(first.ca_pem, first.cert_pem, first.key_pem, metrics=identities.metrics, grace=0.2)
        shards.update(operator_config(addrs).shards)
        renewer = CertificateRenewer(identities, shards, retry_base=0.2, retry_cap=0.5, min_delay=0.05)
        task = asyncio.create_task(renewer.run())
        try:
            await eventually(
                lambda: identities.current is not None and identities.current.serial != first.serial,
                within=20,
                what="the Go operator's certificate to be renewed",
            )
            renewed = identities.current
            assert renewed is not None
            assert cluster.identity is not None
            peer = verify_client_certificate(renewed.cert_pem, cluster.identity.ca)
            assert peer.certificate.public_key() == go_key.public_key()  # the same Ed25519 key
            stored = await secret_data(kube, "nstance-operator-cert")
            assert stored is not None
            assert stored["tls.crt"] == renewed.cert_pem
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await shards.close()
        await drives_the_operator_api(renewed, addrs)
