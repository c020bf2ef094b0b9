"""Single use of registration nonces on the real server: replays, races, and operator key binding.

An agent nonce registers one agent once: a replay (same key or another) gets ALREADY_EXISTS and the
first certificate stays the instance's one; of N registrations racing with one nonce exactly one
wins. An operator nonce is bound to the first public key that registers with it: that key may come
back for a fresh certificate, any other key gets ALREADY_EXISTS, also when they race
(docs/registration.md, "Single use" and "Nonce binding").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import grpc
import grpc.aio
import pytest
from google.protobuf.empty_pb2 import Empty

from nstance.pki.keys import generate_private_key, private_key_to_pem, public_key_to_pem
from nstance.pki.nonce import operator_nonce_claims
from nstance.pki.peer import PeerIdentity, verify_client_certificate
from nstance.rpc import agent_pb2, operator_pb2_grpc, registration_pb2
from nstance.server.identity.operatorreg import operator_nonce_key
from nstance.testing.identities import ClientIdentity
from nstance.testing.securityshard import CALL_TIMEOUT, CLUSTER, TENANT_A, TENANT_B, SecurityShard
from nstance.testing.waiting import eventually

pytestmark = pytest.mark.timeout(60)
RACERS = 8


async def register(
    shard: SecurityShard, method: str, nonce: str, public_key_pem: bytes
) -> registration_pb2.RegisterClientResponse:
    """One registration on its own connection (so racing calls really run in parallel)."""
    async with shard.registration_channel() as channel:
        call = getattr(shard.registration(channel), method)
        request = registration_pb2.RegisterClientRequest(
            registration_nonce_jwt=nonce, public_key_pem=public_key_pem
        )
        response: registration_pb2.RegisterClientResponse = await call(request, timeout=CALL_TIMEOUT)
        return response


async def register_operator(
    shard: SecurityShard, nonce: str, public_key_pem: bytes
) -> tuple[bytes, PeerIdentity]:
    """RegisterOperator, waiting (briefly) for the server to lead the cluster as well as the shard."""

    async def registered() -> registration_pb2.RegisterClientResponse | None:
        try:
            return await register(shard, "RegisterOperator", nonce, public_key_pem)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return None  # not leading the cluster yet

    response = await eventually(registered, within=15, every=0.1, what="RegisterOperator past UNAVAILABLE")
    pem = response.client_certificate_pem
    return pem, verify_client_certificate(pem, shard.identity.ca)


async def refused(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


def p256() -> tuple[bytes, bytes]:
    key = generate_private_key("ecdsa-p256")
    return private_key_to_pem(key), public_key_to_pem(key)


async def test_replayed_agent_nonce_is_already_exists_and_the_first_certificate_stays(
    shard: SecurityShard,
) -> None:
    instance_id, nonce = shard.create_instance(TENANT_A)
    key_pem, public_pem = p256()
    first = await register(shard, "RegisterAgent", nonce, public_pem)
    peer = verify_client_certificate(first.client_certificate_pem, shard.identity.ca)
    assert (peer.role, peer.client_id, peer.tenant) == ("agent", instance_id, TENANT_A)

    for replay_key in (public_pem, p256()[1]):  # the same key, then an attacker's
        err = await refused(register(shard, "RegisterAgent", nonce, replay_key))
        assert err.code() == grpc.StatusCode.ALREADY_EXISTS
        assert "nonce already used" in (err.details() or "")
        assert instance_id in (err.details() or "")
        shard.assert_no_secrets(err.details() or "")
    assert shard.record(TENANT_A, instance_id)["cert_serial"] == peer.serial

    # The first certificate is still the instance's: it works on the agent port.
    identity = ClientIdentity(key_pem, first.client_certificate_pem, peer.serial, shard.identity.ca.cert_pem)
    shard.agent(identity).SubmitPublicKeys(
        agent_pb2.PublicKeysRequest(
            instance_id=instance_id,
            keys=[agent_pb2.PublicKeySubmission(filename="app.pub", public_key_pem=p256()[1])],
        ),
        timeout=CALL_TIMEOUT,
    )
    shard.assert_healthy()


async def race(shard: SecurityShard, method: str, nonce: str) -> PeerIdentity:
    """RACERS registrations with one nonce and as many keys at once: exactly one wins, the rest
    get ALREADY_EXISTS. Returns the winner's certificate."""
    keys = [p256()[1] for _ in range(RACERS)]
    results = await asyncio.gather(
        *(register(shard, method, nonce, key) for key in keys), return_exceptions=True
    )
    winners = [r for r in results if isinstance(r, registration_pb2.RegisterClientResponse)]
    losers = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(winners) == 1, results
    assert [e.code() for e in losers] == [grpc.StatusCode.ALREADY_EXISTS] * (RACERS - 1)
    return verify_client_certificate(winners[0].client_certificate_pem, shard.identity.ca)


async def test_concurrent_agent_registrations_with_one_nonce_exactly_one_wins(shard: SecurityShard) -> None:
    instance_id, nonce = shard.create_instance(TENANT_A)
    winner = await race(shard, "RegisterAgent", nonce)
    assert shard.record(TENANT_A, instance_id)["cert_serial"] == winner.serial
    shard.assert_healthy()


async def test_operator_nonce_is_bound_to_the_first_key(shard: SecurityShard) -> None:
    nonce = shard.sign(operator_nonce_claims(cluster_id=CLUSTER, tenant=TENANT_B))
    key_pem, public_pem = p256()
    _, first = await register_operator(shard, nonce, public_pem)
    assert (first.role, first.client_id, first.tenant) == ("operator", CLUSTER, TENANT_B)

    cert_pem, again = await register_operator(shard, nonce, public_pem)  # the same key: a retry
    assert again.serial != first.serial

    err = await refused(register(shard, "RegisterOperator", nonce, p256()[1]))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "different public key" in (err.details() or "")
    shard.assert_no_secrets(err.details() or "")

    # The certificate works, for its own tenant only.
    identity = ClientIdentity(key_pem, cert_pem, again.serial, shard.identity.ca.cert_pem)
    with identity.channel(shard.addrs["operator_addr"]) as channel:
        groups = (
            operator_pb2_grpc.OperatorServiceStub(channel).ListGroups(Empty(), timeout=CALL_TIMEOUT).groups
        )
    assert {(g.tenant, g.key) for g in groups} == {
        (TENANT_B, "secret"),
        (TENANT_B, "web"),
        (TENANT_B, "secret-needy"),
    }


async def test_concurrent_operator_registrations_with_one_nonce_bind_exactly_one_key(
    shard: SecurityShard,
) -> None:
    nonce = shard.sign(operator_nonce_claims(cluster_id=CLUSTER, tenant=TENANT_A))
    leading = shard.sign(operator_nonce_claims(cluster_id=CLUSTER, tenant="warmup"))
    await register_operator(shard, leading, p256()[1])  # the server leads the cluster by now
    winner = await race(shard, "RegisterOperator", nonce)
    binding, _ = shard.cluster.cluster.get(operator_nonce_key(nonce))
    assert binding == public_key_to_pem(winner.certificate.public_key())  # type: ignore[arg-type]
    shard.assert_healthy()
