"""The operator's identity against real shard servers and the Kubernetes API emulator.

What an admin sees: with the CA ConfigMap and a nonce Secret in place the operator registers (with the
cluster leader, whichever shard that is), stores its key and certificate in Secrets and deletes the
used nonce; on restart it reuses the certificate without registering again; when something is missing
the error says which object and how to create it, and registration proceeds once it appears; a
short-lived certificate is renewed and the new one is used without a restart. A key Secret holding a
usable key (Ed25519, as upstream's operator keeps it, or ECDSA P-256) is never replaced; a new key
has the type of the cluster CA's key. (Taking over from the Go operator against a server presenting
Ed25519 certificates: tests/compat/test_operator_go_identity.py.)
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from google.protobuf.empty_pb2 import Empty

from nstance.core.backoff import Backoff
from nstance.core.clock import ManualClock
from nstance.operator.config import OperatorConfig, ShardEndpoint
from nstance.operator.identity import IdentityManager, IdentityProblem
from nstance.operator.kube import CONFIGMAPS, SECRETS, Kube, KubeError, load_configuration
from nstance.operator.renewal import CertificateRenewer
from nstance.operator.settings import OperatorSettings, build_settings
from nstance.operator.shards import ShardSet
from nstance.pki.ca import create_ca
from nstance.pki.certs import issue_client_certificate
from nstance.pki.keys import generate_private_key, load_private_key_pem, private_key_to_pem, public_key_to_pem
from nstance.pki.nonce import operator_nonce_claims, sign_nonce
from nstance.pki.peer import verify_client_certificate
from nstance.rpc import registration_pb2, registration_pb2_grpc
from nstance.testing.kubeapi import KubeAPIServer
from nstance.testing.shardproc import LocalCluster, ServerProcess, server_addrs, shard_config, start_leader
from nstance.testing.waiting import eventually, eventually_sync

CLUSTER = "test"
TENANT = "team-a"
# Relaxed election timing: a leader stays fenced-in for leader_timeout/2 after each write, so a busy
# test machine does not make the cluster leadership flap under the tests.
ELECTION = {"frequent_interval": "200ms", "infrequent_interval": "1s", "leader_timeout": "6s"}


@pytest.fixture(scope="module")
def shards(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalCluster, dict[str, dict[str, str]]]]:
    """Two shards; zone-b starts first and holds the cluster lock, so zone-a answers as a standby."""
    root = tmp_path_factory.mktemp("shards")
    cluster = LocalCluster(root / "bucket", cluster_id=CLUSTER)
    cluster.init()
    addrs = {shard: server_addrs() for shard in ("zone-a", "zone-b")}
    processes: list[ServerProcess] = []
    try:
        for shard in ("zone-b", "zone-a"):
            config = shard_config(cluster_id=CLUSTER, shard=shard, addrs=addrs[shard], election=ELECTION)
            cluster.write_config(shard, config)
            processes.append(start_leader(cluster, root / shard, shard=shard))
        leader = json.loads((root / "bucket" / "cluster" / "leader.json").read_text())
        assert leader["leaderID"].startswith("zone-b"), leader
        wait_cluster_leader(addrs["zone-b"]["registration_addr"], cluster)
        yield cluster, addrs
    finally:
        for process in processes:
            process.stop()


def wait_cluster_leader(target: str, cluster: LocalCluster, within: float = 20.0) -> None:
    """Until ``target`` serves operator registration: a bogus nonce is then refused as such (the
    cluster-leader check comes first and answers UNAVAILABLE while leadership is still settling)."""
    assert cluster.identity is not None
    credentials = grpc.ssl_channel_credentials(root_certificates=cluster.identity.ca.cert_pem)
    options = [("grpc.ssl_target_name_override", "nstance-server")]
    with grpc.secure_channel(target, credentials, options=options) as channel:
        stub = registration_pb2_grpc.RegistrationServiceStub(channel)

        def leads() -> bool:
            request = registration_pb2.RegisterClientRequest(
                registration_nonce_jwt="x.y.z", public_key_pem=b""
            )
            try:
                stub.RegisterOperator(request, timeout=5)
            except grpc.RpcError as exc:
                return bool(exc.code() != grpc.StatusCode.UNAVAILABLE)
            return False

        eventually_sync(leads, within=within, what=f"{target} to become the cluster leader", every=0.1)


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[tuple[KubeAPIServer, Kube]]:
    async with KubeAPIServer() as server:
        configuration = await load_configuration(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
        client = Kube.from_configuration(configuration)
        try:
            yield server, client
        finally:
            await client.close()


def settings() -> OperatorSettings:
    return build_settings(namespace="default", disable_webhooks=True, environ={}, holder_identity="test")


def config_of(
    addrs: dict[str, dict[str, str]], order: tuple[str, ...] = ("zone-a", "zone-b")
) -> OperatorConfig:
    return OperatorConfig(
        cluster_id=CLUSTER,
        tenant=TENANT,
        shards={s: ShardEndpoint(addrs[s]["registration_addr"], addrs[s]["operator_addr"]) for s in order},
    )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def put_ca(kube: Kube, cluster: LocalCluster) -> None:
    assert cluster.identity is not None
    body = {
        "metadata": {"name": "nstance-cluster-ca"},
        "data": {"ca.crt": cluster.identity.ca.cert_pem.decode()},
    }
    await kube.create(CONFIGMAPS, body, "default")


_nonces = itertools.count()


async def put_nonce(kube: Kube, cluster: LocalCluster, *, tenant: str = TENANT) -> None:
    """A fresh nonce (a distinct expiry, so two nonces signed in the same second still differ)."""
    assert cluster.identity is not None
    ttl = timedelta(hours=3, seconds=next(_nonces))
    claims = operator_nonce_claims(cluster_id=CLUSTER, tenant=tenant, ttl=ttl)
    token = sign_nonce(cluster.identity.nonce_key, claims)
    body = {"metadata": {"name": "nstance-operator-nonce"}, "data": {"nonce.jwt": b64(token.encode())}}
    await kube.create(SECRETS, body, "default")


async def secret_data(kube: Kube, name: str) -> dict[str, bytes] | None:
    obj = await kube.get(SECRETS, name, "default")
    if obj is None:
        return None
    return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}


async def put_identity(
    kube: Kube,
    cluster: LocalCluster,
    *,
    ttl: timedelta = timedelta(days=30),
    issued_ago: timedelta = timedelta(0),
) -> bytes:
    """A certificate issued straight from the CA, stored as if registration had happened; its PEM."""
    assert cluster.identity is not None
    key = generate_private_key("ecdsa-p256")
    clock = ManualClock(datetime.now(UTC) - issued_ago)
    issued = issue_client_certificate(
        cluster.identity.ca,
        key.public_key(),
        client_id=CLUSTER,
        tenant=TENANT,
        role="operator",
        ttl=ttl,
        clock=clock,
    )
    data = {"tls.crt": b64(issued.cert_pem), "tls.key": b64(private_key_to_pem(key))}
    body = {"metadata": {"name": "nstance-operator-cert"}, "type": "kubernetes.io/tls", "data": data}
    await kube.create(SECRETS, body, "default")
    return issued.cert_pem


def metric(manager: IdentityManager, name: str, **labels: str) -> float:
    value = manager.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


async def test_registration_stores_key_and_certificate_and_deletes_the_nonce(
    shards: tuple[LocalCluster, dict[str, dict[str, str]]],
    kube: tuple[KubeAPIServer, Kube],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster, addrs = shards
    _, client = kube
    await put_ca(client, cluster)
    await put_nonce(client, cluster)
    manager = IdentityManager(client, settings(), backoff=Backoff(base=0.05, cap=0.2))

    with caplog.at_level("INFO", logger="nstance.operator.identity"):
        identity = await asyncio.wait_for(manager.ensure(config_of(addrs)), 30)

    # zone-a (first in the config) is not the cluster leader; zone-b registered us.
    assert metric(manager, "nstance_operator_registrations_total", result="standby") >= 1
    assert "shard zone-a (" in caplog.text
    assert "is not the cluster leader" in caplog.text
    assert f"registered with shard zone-b ({addrs['zone-b']['registration_addr']})" in caplog.text
    assert metric(manager, "nstance_operator_registrations_total", result="ok") == 1
    key = await secret_data(client, "nstance-operator-key")
    cert = await secret_data(client, "nstance-operator-cert")
    assert key is not None
    assert cert is not None
    assert key["private.key"].startswith(b"-----BEGIN PRIVATE KEY-----")
    assert key["public.key"].startswith(b"-----BEGIN PUBLIC KEY-----")
    # an ECDSA CA: the cluster has only this project's servers, where P-256 works with every version
    assert isinstance(load_private_key_pem(key["private.key"]), ec.EllipticCurvePrivateKey)
    assert cert["tls.key"] == key["private.key"]
    assert await client.get(SECRETS, "nstance-operator-nonce", "default") is None
    assert cluster.identity is not None
    peer = verify_client_certificate(cert["tls.crt"], cluster.identity.ca)
    assert (peer.role, peer.tenant, peer.client_id) == ("operator", TENANT, CLUSTER)
    assert identity.serial == peer.serial
    assert manager.problem == ""


async def test_a_nonce_secret_that_may_not_be_deleted_is_kept_and_the_identity_used(
    shards: tuple[LocalCluster, dict[str, dict[str, str]]],
    kube: tuple[KubeAPIServer, Kube],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # upstream's first Helm chart grants no delete on Secrets: the operator registered, then retried
    # for ever on 403 and never became ready
    cluster, addrs = shards
    _, client = kube
    await put_ca(client, cluster)
    await put_nonce(client, cluster)

    async def forbidden(*_: Any, **__: Any) -> bool:
        raise KubeError(403, "Forbidden", 'secrets "nstance-operator-nonce" is forbidden')

    monkeypatch.setattr(client, "delete", forbidden)
    manager = IdentityManager(client, settings(), backoff=Backoff(base=0.05, cap=0.2))
    with caplog.at_level("WARNING", logger="nstance.operator.identity"):
        identity = await asyncio.wait_for(manager.ensure(config_of(addrs)), 30)
        again = await manager.attempt(config_of(addrs))  # a restart: the stored certificate is used
    assert again.serial == identity.serial
    assert manager.problem == ""
    assert await client.get(SECRETS, "nstance-operator-nonce", "default") is not None
    assert caplog.text.count("cannot delete the used registration nonce Secret") == 1


async def test_a_restart_with_a_valid_certificate_does_not_register_again(
    shards: tuple[LocalCluster, dict[str, dict[str, str]]], kube: tuple[KubeAPIServer, Kube]
) -> None:
    cluster, addrs = shards
    _, client = kube
    await put_ca(client, cluster)
    stored = await put_identity(client, cluster)
    await put_nonce(client, cluster)  # a leftover nonce is cleaned up, not used

    async def refuse(*_: Any) -> bytes:
        raise AssertionError("a valid certificate must not trigger a registration")

    manager = IdentityManager(client, settings(), registrar=refuse)
    identity = await manager.ensure(config_of(addrs))
    assert identity.cert_pem == stored
    assert await client.get(SECRETS, "nstance-operator-nonce", "default") is None


async def test_missing_pieces_are_named_and_registration_follows_when_the_nonce_appears(
    shards: tuple[LocalCluster, dict[str, dict[str, str]]], kube: tuple[KubeAPIServer, Kube]
) -> None:
    cluster, addrs = shards
    _, client = kube
    manager = IdentityManager(client, settings(), backoff=Backoff(base=0.05, cap=0.1))
    with pytest.raises(IdentityProblem, match="ConfigMap default/nstance-cluster-ca not found"):
        await manager.attempt(config_of(addrs))
    await put_ca(client, cluster)
    with pytest.raises(IdentityProblem) as info:
        await manager.attempt(config_of(addrs))
    message = str(info.value)
    assert "registration nonce Secret default/nstance-operator-nonce does not exist" in message
    assert "nstance-admin cluster nonce --cluster-id test --tenant team-a" in message

    task = asyncio.create_task(manager.ensure(config_of(addrs)))
    await eventually(lambda: "nstance-operator-nonce" in manager.problem, what="the problem to be published")
    assert not task.done()
    await put_nonce(client, cluster)
    identity = await asyncio.wait_for(task, 30)
    assert identity.tenant == TENANT
    assert manager.problem == ""


async def test_a_nonce_for_another_tenant_is_not_spent(
    shards: tuple[LocalCluster, dict[str, dict[str, str]]], kube: tuple[KubeAPIServer, Kube]
) -> None:
    cluster, addrs = shards
    _, client = kube
    await put_ca(client, cluster)
    await put_nonce(client, cluster, tenant="team-b")
    calls: list[str] = []

    async def record(target: str, *_: Any) -> bytes:
        calls.append(target)
        raise AssertionError("not reached")

    manager = IdentityManager(client, settings(), registrar=record)
    with pytest.raises(IdentityProblem, match="has tenant 'team-b' but this operator needs 'team-a'"):
        await manager.attempt(config_of(addrs))
    assert calls == []
    assert await client.get(SECRETS, "nstance-operator-nonce", "default") is not None


async def test_an_expired_certificate_is_replaced_by_registering_with_the_nonce(
    shards: tuple[LocalCluster, dict[str, dict[str, str]]], kube: tuple[KubeAPIServer, Kube]
) -> None:
    cluster, addrs = shards
    _, client = kube
    await put_ca(client, cluster)
    old = await put_identity(client, cluster, ttl=timedelta(hours=1), issued_ago=timedelta(hours=2))
    await put_nonce(client, cluster)
    manager = IdentityManager(client, settings(), backoff=Backoff(base=0.05, cap=0.2))
    identity = await asyncio.wait_for(manager.ensure(config_of(addrs, ("zone-b", "zone-a"))), 30)
    assert identity.cert_pem != old
    assert metric(manager, "nstance_operator_registrations_total", result="ok") == 1
    assert metric(manager, "nstance_operator_registrations_total", result="standby") == 0


async def test_a_short_lived_certificate_is_renewed_and_used_without_a_restart(
    shards: tuple[LocalCluster, dict[str, dict[str, str]]], kube: tuple[KubeAPIServer, Kube]
) -> None:
    cluster, addrs = shards
    _, client = kube
    await put_ca(client, cluster)
    await put_identity(client, cluster, ttl=timedelta(seconds=3))
    manager = IdentityManager(client, settings())
    # zone-a first: it refuses (not the cluster leader) and names zone-b, which renews.
    config = config_of(addrs)
    first = await manager.ensure(config)
    connections = ShardSet(first.ca_pem, first.cert_pem, first.key_pem, metrics=manager.metrics, grace=0.2)
    connections.update(config.shards)
    renewer = CertificateRenewer(manager, connections, retry_base=0.2, retry_cap=0.5, min_delay=0.05)
    task = asyncio.create_task(renewer.run())
    try:
        await eventually(
            lambda: manager.current is not None and manager.current.serial != first.serial,
            within=10,
            what="the certificate to be renewed",
        )
        renewed = manager.current
        assert renewed is not None
        assert renewed.not_after > first.not_after + timedelta(hours=1)
        stored = await secret_data(client, "nstance-operator-cert")
        assert stored is not None
        assert stored["tls.crt"] == renewed.cert_pem
        assert metric(manager, "nstance_operator_certificate_renewals_total", result="ok") == 1
        # After the first certificate has expired, calls still work: the shards now see the new one
        # (the server checks the certificate's validity on every call).
        await asyncio.sleep((first.not_after - manager.clock.now()).total_seconds() + 0.2)
        assert manager.clock.now() > first.not_after
        for shard in ("zone-a", "zone-b"):
            response = await connections.stub(shard).ListGroups(Empty(), timeout=10)
            assert list(response.groups) == []  # authorised; tenant team-a has no groups yet
        # ...while the old certificate is refused now.
        stale = ShardSet(first.ca_pem, first.cert_pem, first.key_pem)
        stale.update({"zone-b": config.shards["zone-b"]})
        try:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stale.stub("zone-b").ListGroups(Empty(), timeout=10)
            assert refused.value.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE)
        finally:
            await stale.close()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await connections.close()


# --- the stored key ---------------------------------------------------------------------------------


async def put_ca_of_type(kube: Kube, key_type: str) -> None:
    ca = create_ca(key_type=key_type, cluster_id=CLUSTER)
    await kube.create(
        CONFIGMAPS,
        {"metadata": {"name": "nstance-cluster-ca"}, "data": {"ca.crt": ca.cert_pem.decode()}},
        "default",
    )


async def put_key_secret(kube: Kube, private_pem: bytes, public_pem: bytes = b"") -> Any:
    data = {"private.key": b64(private_pem), "public.key": b64(public_pem)}
    await kube.create(SECRETS, {"metadata": {"name": "nstance-operator-key"}, "data": data}, "default")
    return await kube.get(SECRETS, "nstance-operator-key", "default")


@pytest.mark.parametrize("key_type", ["ed25519", "ecdsa-p256"])
async def test_a_usable_stored_key_is_never_replaced(kube: tuple[KubeAPIServer, Kube], key_type: str) -> None:
    """Upstream's operator keeps an Ed25519 key here: it must survive while the nonce is awaited."""
    _, client = kube
    await put_ca_of_type(client, "ed25519" if key_type == "ecdsa-p256" else "ecdsa-p256")  # not the CA's type
    key = generate_private_key(key_type)
    before = await put_key_secret(client, private_key_to_pem(key), public_key_to_pem(key))
    manager = IdentityManager(client, settings())
    for _ in range(2):
        with pytest.raises(IdentityProblem, match="nstance-operator-nonce does not exist"):
            await manager.attempt(config_of({}, ()))
    assert await client.get(SECRETS, "nstance-operator-key", "default") == before


@pytest.mark.parametrize(
    ("ca_type", "expected"),
    [("ed25519", ed25519.Ed25519PrivateKey), ("ecdsa-p256", ec.EllipticCurvePrivateKey)],
)
async def test_a_missing_or_unreadable_key_is_replaced_by_one_of_the_cas_type(
    kube: tuple[KubeAPIServer, Kube], ca_type: str, expected: type, caplog: pytest.LogCaptureFixture
) -> None:
    """A new key is Ed25519 under an Ed25519 CA (upstream's servers certify only Ed25519 operator keys)."""
    _, client = kube
    await put_ca_of_type(client, ca_type)
    manager = IdentityManager(client, settings())
    with pytest.raises(IdentityProblem, match="nstance-operator-nonce does not exist"):
        await manager.attempt(config_of({}, ()))
    created = await secret_data(client, "nstance-operator-key")
    assert created is not None
    assert isinstance(load_private_key_pem(created["private.key"]), expected)
    assert created["public.key"] == public_key_to_pem(load_private_key_pem(created["private.key"]))

    await client.delete(SECRETS, "nstance-operator-key", "default")
    await put_key_secret(client, b"-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n")
    with caplog.at_level("WARNING", logger="nstance.operator.identity"), pytest.raises(IdentityProblem):
        await manager.attempt(config_of({}, ()))
    assert "replacing it with a new identity key" in caplog.text
    replaced = await secret_data(client, "nstance-operator-key")
    assert replaced is not None
    assert isinstance(load_private_key_pem(replaced["private.key"]), expected)
