"""Client certificates on the mTLS ports (Operator and Agent APIs) of the real server.

What the caller sees (docs/registration.md, "What an issued certificate may call"): a certificate
from another CA, no certificate, an expired or not-yet-valid one, or a server certificate fails the
TLS handshake, so the client sees UNAVAILABLE; a certificate of the wrong role gets PERMISSION_DENIED;
a certificate that chains but is no client identity (the CA's own) gets UNAUTHENTICATED; and a
serial put on the deny list (``nstance-admin cert revoke``) is refused with UNAUTHENTICATED within
one deny-list sync interval, while other certificates keep working.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import grpc.aio
import pytest
from google.protobuf.empty_pb2 import Empty

from nstance.admin.certs import revoke_serial
from nstance.core.clock import ManualClock
from nstance.pki.ca import create_ca
from nstance.pki.certs import issue_server_certificate
from nstance.rpc import agent_pb2, agent_pb2_grpc, operator_pb2_grpc
from nstance.server import app as server_app
from nstance.server.app import ServerApp, ServerOptions
from nstance.testing.identities import SERVER_NAME_OPTIONS, make_identity
from nstance.testing.securityshard import CALL_TIMEOUT, CLUSTER, SHARD, TENANT_A, SecurityShard
from nstance.testing.shardproc import ENCRYPTION_KEY_B64, LocalCluster, server_addrs, shard_config
from nstance.testing.waiting import eventually

pytestmark = pytest.mark.timeout(60)
SYNC_INTERVAL = 0.5


def call_operator(credentials: grpc.ChannelCredentials, target: str) -> grpc.RpcError:
    """ListGroups with ``credentials``; returns the error (a success fails the test)."""
    with (
        grpc.secure_channel(target, credentials, options=SERVER_NAME_OPTIONS) as channel,
        pytest.raises(grpc.RpcError) as info,
    ):
        operator_pb2_grpc.OperatorServiceStub(channel).ListGroups(Empty(), timeout=CALL_TIMEOUT)
    return info.value


def call_agent(credentials: grpc.ChannelCredentials, target: str) -> grpc.RpcError:
    """SubmitPublicKeys (no keys) with ``credentials``; returns the error."""
    with (
        grpc.secure_channel(target, credentials, options=SERVER_NAME_OPTIONS) as channel,
        pytest.raises(grpc.RpcError) as info,
    ):
        agent_pb2_grpc.AgentServiceStub(channel).SubmitPublicKeys(
            agent_pb2.PublicKeysRequest(), timeout=CALL_TIMEOUT
        )
    return info.value


def both_ports(shard: SecurityShard) -> list[tuple[Callable[..., grpc.RpcError], str]]:
    return [(call_operator, shard.addrs["operator_addr"]), (call_agent, shard.addrs["agent_addr"])]


def test_certificates_the_handshake_refuses_give_unavailable(shard: SecurityShard) -> None:
    ca = shard.identity.ca
    foreign = create_ca(cluster_id="someone-else")
    two_days_ago = ManualClock(datetime.now(UTC) - timedelta(days=2))
    tomorrow = ManualClock(datetime.now(UTC) + timedelta(days=1))
    server = issue_server_certificate(ca, hosts=["10.0.0.1"])
    assert server.key_pem is not None
    refused: dict[str, grpc.ChannelCredentials] = {
        "no client certificate": grpc.ssl_channel_credentials(root_certificates=ca.cert_pem),
        "another CA's operator certificate": make_identity(
            foreign, role="operator", tenant=TENANT_A, client_id=CLUSTER, trust=ca
        ).credentials(),
        "another CA's agent certificate": make_identity(
            foreign, role="agent", tenant=TENANT_A, trust=ca
        ).credentials(),
        "expired": make_identity(
            ca,
            role="operator",
            tenant=TENANT_A,
            client_id=CLUSTER,
            ttl=timedelta(hours=1),
            clock=two_days_ago,
        ).credentials(),
        "not valid yet": make_identity(
            ca, role="operator", tenant=TENANT_A, client_id=CLUSTER, clock=tomorrow
        ).credentials(),
        "a server certificate of the cluster CA": grpc.ssl_channel_credentials(
            root_certificates=ca.cert_pem, private_key=server.key_pem, certificate_chain=server.cert_pem
        ),
    }
    for name, credentials in refused.items():
        for call, target in both_ports(shard):
            err = call(credentials, target)
            assert err.code() == grpc.StatusCode.UNAVAILABLE, (name, call.__name__, err.details())
    shard.assert_healthy()


def test_the_ca_certificate_itself_is_not_a_client_identity(shard: SecurityShard) -> None:
    ca = shard.identity.ca
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.cert_pem, private_key=ca.key_pem, certificate_chain=ca.cert_pem
    )
    for call, target in both_ports(shard):
        err = call(credentials, target)
        if ca.key_type == "ed25519":
            # An Ed25519 CA (the default, as upstream) cannot even sign a TLS handshake here.
            assert err.code() == grpc.StatusCode.UNAVAILABLE
            assert "NO_COMMON_SIGNATURE_ALGORITHMS" in (err.details() or "")
        else:
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "is a CA certificate" in (err.details() or "")
    shard.assert_healthy()


def test_a_certificate_of_the_wrong_role_is_permission_denied(shard: SecurityShard) -> None:
    instance_id, _ = shard.create_instance(TENANT_A)
    agent = shard.agent_identity(instance_id)
    err = call_operator(agent.credentials(), shard.addrs["operator_addr"])
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "role 'operator' required" in (err.details() or "")

    operator = shard.operators[TENANT_A]
    err = call_agent(operator.credentials(), shard.addrs["agent_addr"])
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "role 'agent' required" in (err.details() or "")

    # Streams are checked too: the agent cannot watch the operator's groups, nor the operator
    # receive an agent's files.
    with agent.channel(shard.addrs["operator_addr"]) as channel:
        watch = operator_pb2_grpc.OperatorServiceStub(channel).WatchGroups(Empty(), timeout=CALL_TIMEOUT)
        with pytest.raises(grpc.RpcError) as info:
            list(watch)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with operator.channel(shard.addrs["agent_addr"]) as channel:
        files = agent_pb2_grpc.AgentServiceStub(channel).ReceiveFiles(Empty(), timeout=CALL_TIMEOUT)
        with pytest.raises(grpc.RpcError) as info:
            list(files)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    shard.assert_healthy()


# --- the deny list, on a server in this process (its sync interval shortened) ----------------------


def start_in_process(
    cluster: LocalCluster, addrs: dict[str, str], cachedir: Path, stop: asyncio.Event
) -> asyncio.Task[int]:
    """A server of ``cluster`` in this process (so its sync interval can be patched), until ``stop``."""
    options = ServerOptions(
        server_id="s1",
        shard=SHARD,
        storage="file",
        bucket=str(cluster.bucket),
        cachedir=cachedir,
        health_addr=addrs["health_addr"],
        environ={"NSTANCE_ENCRYPTION_KEY": ENCRYPTION_KEY_B64},
    )
    return asyncio.create_task(ServerApp(options).run(stop))


async def refusal(stub: operator_pb2_grpc.OperatorServiceStub) -> grpc.aio.AioRpcError | None:
    try:
        await stub.ListGroups(Empty(), timeout=CALL_TIMEOUT)
    except grpc.aio.AioRpcError as exc:
        return exc
    return None


async def test_a_revoked_serial_is_refused_within_the_sync_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_app, "REVOCATION_SYNC_INTERVAL", SYNC_INTERVAL)
    cluster = LocalCluster(tmp_path / "bucket", cluster_id=CLUSTER)
    identity = cluster.init()
    addrs = server_addrs()
    cluster.write_config(SHARD, shard_config(cluster_id=CLUSTER, shard=SHARD, addrs=addrs))
    stop = asyncio.Event()
    running = start_in_process(cluster, addrs, tmp_path / "cache", stop)
    victim, bystander = (
        make_identity(identity.ca, role="operator", tenant="default", client_id=CLUSTER) for _ in range(2)
    )
    try:
        async with (
            victim.aio_channel(addrs["operator_addr"]) as mine,
            bystander.aio_channel(addrs["operator_addr"]) as theirs,
        ):
            stub, other = (
                operator_pb2_grpc.OperatorServiceStub(mine),
                operator_pb2_grpc.OperatorServiceStub(theirs),
            )
            await eventually(lambda: _serves(stub), within=20, what="the in-process server to serve")

            assert revoke_serial(cluster.cluster, victim.serial, now=datetime.now(UTC), reason="key leaked")
            revoked_at = time.monotonic()
            await eventually(lambda: refusal(stub), within=SYNC_INTERVAL + 5, what="the revocation")
            assert time.monotonic() - revoked_at <= SYNC_INTERVAL + 3

            err = await refusal(stub)
            assert err is not None
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            assert err.details() == f"certificate serial {victim.serial} has been revoked"
            assert await refusal(other) is None  # only that serial
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0


async def _serves(stub: operator_pb2_grpc.OperatorServiceStub) -> bool:
    return await refusal(stub) is None


async def test_a_corrupt_deny_list_entry_still_refuses_its_serial_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail closed: the object's name is the serial, so a garbled body must not let the certificate in."""
    monkeypatch.setattr(server_app, "REVOCATION_SYNC_INTERVAL", 3600.0)  # only the start-up sync counts
    cluster = LocalCluster(tmp_path / "bucket", cluster_id=CLUSTER)
    identity = cluster.init()
    addrs = server_addrs()
    cluster.write_config(SHARD, shard_config(cluster_id=CLUSTER, shard=SHARD, addrs=addrs))
    victim, bystander = (
        make_identity(identity.ca, role="operator", tenant="default", client_id=CLUSTER) for _ in range(2)
    )
    assert revoke_serial(cluster.cluster, victim.serial, now=datetime.now(UTC), reason="key leaked")
    key = f"revoked/{victim.serial}.json"
    cluster.cluster.put(key, cluster.cluster.get(key)[0][:7])  # a torn write: not JSON any more
    stop = asyncio.Event()
    running = start_in_process(cluster, addrs, tmp_path / "fresh-cache", stop)
    try:
        async with (
            victim.aio_channel(addrs["operator_addr"]) as mine,
            bystander.aio_channel(addrs["operator_addr"]) as theirs,
        ):
            other = operator_pb2_grpc.OperatorServiceStub(theirs)
            await eventually(lambda: _serves(other), within=20, what="the in-process server to serve")
            err = await refusal(operator_pb2_grpc.OperatorServiceStub(mine))
            assert err is not None
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0
