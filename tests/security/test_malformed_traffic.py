"""Oversized, malformed and hostile traffic against every port of the real server.

* A request larger than 4 MiB is RESOURCE_EXHAUSTED on each gRPC port (unary and streaming).
* Garbage bytes, a plain-HTTP request, a cleartext HTTP/2 preface, a TLS ClientHello followed by
  garbage, and garbage inside a completed TLS session: the server closes the connection without
  answering anything that looks like success, also when many arrive at once.
* Fields that break the API's rules get their documented code with a bounded message: identifiers
  with a trailing newline or 100 KB long, unknown instance ids of 100 KB (the message would
  otherwise exceed gRPC's header limit and reach the client as RESOURCE_EXHAUSTED).
* The health endpoint answers garbage with 400, oversized headers with 431, and hangs up on slowloris
  clients after ``READ_TIMEOUT`` with 408 while still answering ``/health`` at once (before any of
  them is hung up on).

After each batch the server is healthy: ``/health`` is 200 and a legitimate RPC succeeds.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import grpc
import pytest
from google.protobuf.empty_pb2 import Empty

from nstance.rpc import agent_pb2, operator_pb2, registration_pb2
from nstance.server.net.http import READ_TIMEOUT
from nstance.testing.netprobe import client_hello, exchange, tls_context, tls_exchange
from nstance.testing.securityshard import CALL_TIMEOUT, TENANT_A, SecurityShard
from nstance.testing.waiting import eventually

pytestmark = pytest.mark.timeout(60)
OVER_LIMIT = 4 * 1024 * 1024 + 1024
GRPC_PORTS = ("registration_addr", "operator_addr", "agent_addr")
SLOWLORIS = 30


def rpc_error(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_oversized_requests_are_resource_exhausted_on_every_port(shard: SecurityShard) -> None:
    huge = b"-----BEGIN PUBLIC KEY-----\n" + b"A" * OVER_LIMIT
    instance_id, _ = shard.create_instance(TENANT_A)
    agent = shard.agent(shard.agent_identity(instance_id))
    operator = shard.operator(TENANT_A)
    attempts: dict[str, Callable[[], object]] = {
        "UpsertGroup": lambda: operator.UpsertGroup(
            operator_pb2.UpsertGroupRequest(
                key="web", config=operator_pb2.GroupConfig(vars={"x": "y" * OVER_LIMIT})
            ),
            timeout=CALL_TIMEOUT,
        ),
        "SubmitPublicKeys": lambda: agent.SubmitPublicKeys(
            agent_pb2.PublicKeysRequest(
                keys=[agent_pb2.PublicKeySubmission(filename="a.pub", public_key_pem=huge)]
            ),
            timeout=CALL_TIMEOUT,
        ),
        "SubmitHealthReport (stream)": lambda: agent.SubmitHealthReport(
            iter([agent_pb2.HealthReportRequest(instance_id=instance_id, version="v" * OVER_LIMIT)]),
            timeout=CALL_TIMEOUT,
        ),
    }
    for name, attempt in attempts.items():
        err = rpc_error(attempt)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (name, err.details())
    shard.assert_healthy()


async def test_an_oversized_registration_is_resource_exhausted(shard: SecurityShard) -> None:
    async with shard.registration_channel() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await shard.registration(channel).RegisterAgent(
                registration_pb2.RegisterClientRequest(
                    registration_nonce_jwt="x", public_key_pem=b"A" * OVER_LIMIT
                ),
                timeout=CALL_TIMEOUT,
            )
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    shard.assert_healthy()


def looks_like_success(reply: bytes) -> bool:
    return reply.startswith((b"HTTP/1.1 2", b"HTTP/1.0 2"))


async def test_garbage_on_the_grpc_ports_is_dropped(shard: SecurityShard) -> None:
    rng = random.Random(9)
    payloads = {
        "random bytes": rng.randbytes(4096),
        "zero bytes": bytes(65536),
        "plain HTTP": b"GET / HTTP/1.1\r\nHost: nstance-server\r\n\r\n",
        "cleartext HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + rng.randbytes(512),
        "TLS ClientHello then garbage": client_hello() + rng.randbytes(2048),
    }
    for field in GRPC_PORTS:
        for name, payload in payloads.items():
            reply = await exchange(shard.addrs[field], payload, within=10)
            assert not looks_like_success(reply), (field, name, reply[:80])
    shard.assert_healthy()

    # Many at once: every connection is closed, and the server still serves.
    floods = [
        exchange(shard.addrs[field], payload, within=15)
        for field in GRPC_PORTS
        for payload in (rng.randbytes(1024), client_hello() + rng.randbytes(64))
        for _ in range(10)
    ]
    replies = await asyncio.gather(*floods)
    assert not any(looks_like_success(r) for r in replies)
    shard.assert_healthy()


async def test_garbage_inside_a_tls_session_is_dropped(shard: SecurityShard) -> None:
    ca_pem = shard.identity.ca.cert_pem
    operator = shard.operators[TENANT_A]
    contexts = {
        "registration_addr": tls_context(ca_pem),
        "operator_addr": tls_context(ca_pem, cert_pem=operator.cert_pem, key_pem=operator.key_pem),
        "agent_addr": tls_context(ca_pem, cert_pem=operator.cert_pem, key_pem=operator.key_pem),
    }
    for field, context in contexts.items():
        for payload in (random.Random(3).randbytes(4096), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"):
            reply = await tls_exchange(shard.addrs[field], context, payload, within=10)
            assert not looks_like_success(reply), (field, reply[:80])
    shard.assert_healthy()


def test_malformed_fields_get_their_documented_code_and_a_bounded_message(shard: SecurityShard) -> None:
    operator = shard.operator(TENANT_A)
    long_name = "a" * 100_000
    for key in ("web\n", "evil\n", "\nweb", "../web", "WEB", "", long_name):
        err = rpc_error(
            lambda key=key: operator.UpsertGroup(
                operator_pb2.UpsertGroupRequest(key=key, config=operator_pb2.GroupConfig(template="app")),
                timeout=CALL_TIMEOUT,
            )
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (key[:20], err.details())
        assert "group key" in (err.details() or "")
        shard.assert_no_secrets(err.details() or "")
    err = rpc_error(
        lambda: operator.GetInstanceStatus(
            operator_pb2.GetInstanceStatusRequest(instance_id=long_name), timeout=CALL_TIMEOUT
        )
    )
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert (err.details() or "").endswith("(message truncated)")
    shard.assert_no_secrets(err.details() or "")
    err = rpc_error(
        lambda: operator.UpsertGroup(
            operator_pb2.UpsertGroupRequest(key="web", config=operator_pb2.GroupConfig(size=-1)),
            timeout=CALL_TIMEOUT,
        )
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert {g.key for g in operator.ListGroups(Empty(), timeout=CALL_TIMEOUT).groups} == {"web", "needy"}
    shard.assert_healthy()


# --- the plain-HTTP health endpoint ------------------------------------------------------------------


def status_of(reply: bytes) -> int:
    """The status code of a raw HTTP/1.1 response (0 when the server sent none)."""
    parts = reply.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/") else 0


async def get_health(addr: str) -> int:
    reply = await exchange(addr, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", within=5)
    return status_of(reply)


async def test_the_health_endpoint_refuses_garbage_and_outlasts_slowloris(shard: SecurityShard) -> None:
    addr = shard.process.health_addr
    refused = {
        b"\x16\x03\x01garbage\r\n\r\n": 400,
        client_hello(): 400,
        b"GET /health\r\n\r\n": 400,
        b"GET /health HTTP/1.1\r\nX-Filler: " + b"a" * 9000 + b"\r\n\r\n": 431,
        b"GET /health HTTP/1.1\r\n" + b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n" * 300 + b"\r\n": 431,
        random.Random(5).randbytes(4096): 400,
    }
    for payload, expected in refused.items():
        reply = await exchange(addr, payload, half_close=True, within=10)
        assert status_of(reply) == expected, (payload[:30], reply[:80])

    # Slowloris: many clients send a header line now and then and never finish.
    dribble = [b"GET /health HTTP/1.1\r\n", b"Host: x\r\n", b"X-Slow: 1\r\n", b"X-Slow: 2\r\n"]
    written = [0] * SLOWLORIS

    def progress(client: int) -> Callable[[int], None]:
        return lambda count: written.__setitem__(client, count)

    slow = [
        asyncio.create_task(
            exchange(addr, dribble, pause=0.4, within=READ_TIMEOUT + 5, on_write=progress(client))
        )
        for client in range(SLOWLORIS)
    ]
    # Every slow client is connected and part-way through its request before /health is asked for.
    await eventually(lambda: min(written) >= 2, within=READ_TIMEOUT, what="every slow client to dribble")
    assert await get_health(addr) == 200
    # Answered while all of them still hold their connections: they hold nobody up.
    assert not [task for task in slow if task.done()], "/health was answered only after slow clients left"
    replies = await asyncio.gather(*slow)
    assert [status_of(r) for r in replies] == [408] * SLOWLORIS
    shard.assert_healthy()
