"""RegistrationService over a real grpc.aio server (server-auth TLS) and agent certificate renewal.

The shard is built in-process (memory object store, real SQLite file, injected clock starting at the
real time, because grpc's TLS checks certificate validity against the real clock). Instances are put
in place the way the create path leaves them: a pending SQLite row holding the nonce JWT and a
pending instance record in object storage.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from google.protobuf.empty_pb2 import Empty
from shard_helpers import Leader, sample_shard_identity

from nstance.core.clock import ManualClock
from nstance.core.errors import PermissionDenied, Unavailable
from nstance.core.ids import new_instance_id
from nstance.core.ratelimit import TokenBucket
from nstance.db import repo
from nstance.db.engine import Database, open_database
from nstance.db.models import Operator
from nstance.db.rows import InstanceRow
from nstance.objectstore.base import ObjectInfo
from nstance.objectstore.memory import MemoryObjectStore
from nstance.pki.ca import CertificateAuthority, create_ca
from nstance.pki.certs import IssuedCertificate, issue_client_certificate
from nstance.pki.keys import generate_private_key, private_key_to_pem, public_key_to_pem
from nstance.pki.nonce import agent_nonce_claims, operator_nonce_claims, sign_nonce
from nstance.pki.peer import PeerIdentity, verify_client_certificate
from nstance.providers.sim import SimProvider
from nstance.rpc import operator_pb2, operator_pb2_grpc, registration_pb2, registration_pb2_grpc
from nstance.server.identity.interceptors import ServerInterceptor, current_peer
from nstance.server.identity.operatorreg import operator_nonce_key
from nstance.server.identity.registration import Registrar
from nstance.server.identity.tls import server_credentials
from nstance.server.services.registration import RegistrationServicer
from nstance.server.shard.build import build_shard
from nstance.server.state import records
from nstance.server.state.configstate import ConfigState
from nstance.server.state.limits import CreateLimiter
from nstance.server.state.metrics import Metrics
from nstance.testing.shardproc import server_addrs, shard_config
from nstance.testing.waiting import eventually

pytestmark = pytest.mark.timeout(30)

CLUSTER = "test"
SHARD = "zone-a"
TENANT = "default"
SERVER_NAME = "nstance-server"
AGENT_TTL_HOURS = 48
OPERATOR_TTL_HOURS = 24
CALL_TIMEOUT = 10.0


class FlakyStore:
    """A shard store whose instance-record writes can be made to fail (object storage outage)."""

    def __init__(self, inner: MemoryObjectStore) -> None:
        self.inner = inner
        self.fail_records = False
        self.fail_keys: set[str] = set()
        #: Writes to these keys land, then report a failure (a timeout after the store took the write).
        self.land_then_fail_keys: set[str] = set()

    def _check(self, key: str) -> None:
        if (self.fail_records and key.startswith("instance/")) or key in self.fail_keys:
            raise Unavailable("object storage unreachable (test)")

    def get(self, key: str) -> tuple[bytes, str]:
        return self.inner.get(key)

    def head(self, key: str) -> ObjectInfo:
        return self.inner.head(key)

    def put(self, key: str, data: bytes) -> str:
        self._check(key)
        return self.inner.put(key, data)

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        self._check(key)
        written = self.inner.put_if_match(key, data, etag)
        if key in self.land_then_fail_keys:
            raise Unavailable("object storage timed out (test; the write landed)")
        return written

    def delete(self, key: str, if_match: str | None = None) -> None:
        self.inner.delete(key, if_match)

    def list(self, prefix: str = "") -> list[str]:
        return self.inner.list(prefix)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)


def now_clock() -> ManualClock:
    return ManualClock(datetime.now(UTC).replace(microsecond=0))


def p256_pem() -> tuple[ec.EllipticCurvePrivateKey, bytes]:
    key = generate_private_key("ecdsa-p256")
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key, public_key_to_pem(key)


class Harness:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.clock = now_clock()
        self.ca = create_ca(cluster_id=CLUSTER, clock=self.clock)
        self.memory = MemoryObjectStore()
        self.store = FlakyStore(self.memory)
        self.cluster_store = MemoryObjectStore()
        config = shard_config(cluster_id=CLUSTER, shard=SHARD, addrs=server_addrs())
        config["certificates"] = {"agent": {"ttl": AGENT_TTL_HOURS}, "operator": {"ttl": OPERATOR_TTL_HOURS}}
        self.memory.put("config.jsonc", json.dumps(config).encode())
        self.db: Database = open_database(tmp_path / "db" / "nstance.db")
        state = ConfigState(self.store, tmp_path / "config", clock=self.clock)
        state.load()
        self.leader = Leader("10.0.0.1:8992")
        self.cluster_leader = Leader("10.0.0.9:8992")
        nonce_key = generate_private_key("ed25519")
        assert isinstance(nonce_key, ed25519.Ed25519PrivateKey)
        self.nonce_key = nonce_key
        built = build_shard(
            identity=sample_shard_identity(self.ca.cert_pem, cluster_id=CLUSTER, shard=SHARD),
            store=self.store,
            cluster_store=self.cluster_store,
            db=self.db,
            config=state,
            provider=SimProvider(clock=self.clock),
            nonce_key=nonce_key,
            ca=self.ca,
            clock=self.clock,
            limiter=CreateLimiter(
                clock=self.clock, max_concurrent=8, bucket=TokenBucket(100, 100, self.clock)
            ),
            leadership=self.leader,
            metrics=Metrics(),
            cluster_leadership=self.cluster_leader,
        )
        self.ctx = built.ctx
        self.registrar = built.registrar
        self.port = 0
        self.server: grpc.aio.Server | None = None

    async def start(self) -> None:
        server = grpc.aio.server(interceptors=[ServerInterceptor(ca=self.ca, clock=self.clock)])
        registration_pb2_grpc.add_RegistrationServiceServicer_to_server(
            RegistrationServicer(self.registrar), server
        )
        credentials, _ = server_credentials(
            self.ca, hosts=["127.0.0.1"], clock=self.clock, require_client_cert=False
        )
        self.port = server.add_secure_port("127.0.0.1:0", credentials)
        await server.start()
        self.server = server

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)
        self.db.close()

    # --- fixtures of the create path -----------------------------------------------------------

    def create_instance(self, *, group: str = "web") -> tuple[str, str]:
        """A pending instance as the create path leaves it: SQLite row + record. Returns (id, nonce)."""
        instance_id = str(new_instance_id("app"))
        nonce = self.agent_nonce(instance_id)
        now = self.clock.now()
        with self.db.session() as session:
            repo.insert_instance(
                session,
                instance_id=instance_id,
                tenant=TENANT,
                group_key=group,
                kind="app",
                nonce=nonce,
                now=now,
                issued_at=now,
            )
        records.write_record(
            self.store,
            records.InstanceRecord(
                instance_id=instance_id,
                tenant=TENANT,
                group=group,
                created_at=now,
                last_updated=now,
                registration_jwt=nonce,
            ),
            create_only=True,
        )
        return instance_id, nonce

    def agent_nonce(self, instance_id: str, *, shard: str = SHARD, **overrides: Any) -> str:
        claims = agent_nonce_claims(
            instance_id=instance_id,
            cluster_id=CLUSTER,
            shard=shard,
            group="web",
            tenant=TENANT,
            clock=overrides.pop("clock", self.clock),
        )
        return sign_nonce(overrides.pop("key", self.nonce_key), claims)

    def operator_nonce(self, tenant: str = TENANT) -> str:
        return sign_nonce(
            self.nonce_key, operator_nonce_claims(cluster_id=CLUSTER, tenant=tenant, clock=self.clock)
        )

    def row(self, instance_id: str) -> InstanceRow:
        with self.db.read_session() as session:
            row = repo.get_instance(session, instance_id)
        assert row is not None
        return row

    def record(self, instance_id: str) -> tuple[bytes, str]:
        return self.memory.get(records.record_key(TENANT, instance_id))

    def operators(self) -> list[Operator]:
        with self.db.read_session() as session:
            return repo.list_operators(session)

    # --- client --------------------------------------------------------------------------------

    def channel(self) -> grpc.aio.Channel:
        return grpc.aio.secure_channel(
            f"127.0.0.1:{self.port}",
            grpc.ssl_channel_credentials(root_certificates=self.ca.cert_pem),
            options=[("grpc.ssl_target_name_override", SERVER_NAME)],
        )

    async def register_agent(
        self, nonce: str, public_key_pem: bytes, **reported: str
    ) -> registration_pb2.RegisterClientResponse:
        async with self.channel() as channel:
            stub = registration_pb2_grpc.RegistrationServiceStub(channel)
            request = registration_pb2.RegisterClientRequest(
                registration_nonce_jwt=nonce, public_key_pem=public_key_pem, **reported
            )
            response: registration_pb2.RegisterClientResponse = await stub.RegisterAgent(
                request, timeout=CALL_TIMEOUT
            )
            return response

    async def register_operator(
        self, nonce: str, public_key_pem: bytes
    ) -> registration_pb2.RegisterClientResponse:
        async with self.channel() as channel:
            stub = registration_pb2_grpc.RegistrationServiceStub(channel)
            request = registration_pb2.RegisterClientRequest(
                registration_nonce_jwt=nonce, public_key_pem=public_key_pem
            )
            response: registration_pb2.RegisterClientResponse = await stub.RegisterOperator(
                request, timeout=CALL_TIMEOUT
            )
            return response

    def peer(self, cert_pem: bytes) -> PeerIdentity:
        return verify_client_certificate(cert_pem, self.ca, clock=self.clock)


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    harness = Harness(tmp_path)
    await harness.start()
    try:
        yield harness
    finally:
        await harness.stop()


def held(write: Callable[..., Any], started: threading.Event, release: threading.Event) -> Callable[..., Any]:
    """``write`` (run in a worker thread) that first says it ``started`` and waits for ``release``."""

    def waiting(*args: Any, **kwargs: Any) -> Any:
        started.set()
        release.wait(10)
        return write(*args, **kwargs)

    return waiting


async def rpc_error(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


# --- agents ------------------------------------------------------------------------------------------


async def test_agent_registers_and_gets_a_certificate_for_its_instance(h: Harness) -> None:
    instance_id, nonce = h.create_instance()
    _, pem = p256_pem()
    response = await h.register_agent(
        nonce, pem, private_ipv4="10.1.2.3", private_ipv6="fd00::7", hostname="ip-10-1-2-3"
    )

    peer = h.peer(response.client_certificate_pem)  # chains to the cluster CA, EKU clientAuth
    assert (peer.role, peer.client_id, peer.tenant) == ("agent", instance_id, TENANT)
    assert public_key_to_pem(peer.certificate.public_key()) == pem  # type: ignore[arg-type]
    assert response.expires_at.ToDatetime(tzinfo=UTC) == peer.not_after
    assert peer.not_after == h.clock.now() + timedelta(hours=AGENT_TTL_HOURS)  # certificates.agent.ttl

    row = h.row(instance_id)
    assert row.registered_at == h.clock.now()
    assert row.cert_serial == peer.serial
    assert (row.ip4, row.ip6, row.hostname) == ("10.1.2.3", "fd00::7", "ip-10-1-2-3")
    record = json.loads(h.record(instance_id)[0])
    assert record["cert_serial"] == peer.serial
    assert record["public_key_pem"] == pem.decode()
    assert record["registered_at"] == records.format_time(h.clock.now())
    assert record["cert_expires_at"] == records.format_time(peer.not_after)
    assert (record["private_ipv4"], record["private_ipv6"], record["hostname"]) == (
        "10.1.2.3",
        "fd00::7",
        "ip-10-1-2-3",
    )


async def test_replayed_nonce_is_refused_and_leaves_the_instance_untouched(h: Harness) -> None:
    instance_id, nonce = h.create_instance()
    _, pem = p256_pem()
    first = await h.register_agent(nonce, pem)
    row_before = h.row(instance_id)
    record_before = h.record(instance_id)

    h.clock.advance(30)
    _, attacker_pem = p256_pem()
    err = await rpc_error(h.register_agent(nonce, attacker_pem, hostname="evil"))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "nonce already used" in (err.details() or "")
    assert instance_id in (err.details() or "")

    row_after = h.row(instance_id)
    assert row_after.cert_serial == row_before.cert_serial == h.peer(first.client_certificate_pem).serial
    assert row_after.instance_pub == row_before.instance_pub
    assert row_after.updated_at == row_before.updated_at
    assert row_after.hostname is None
    assert h.record(instance_id) == record_before  # same bytes, same ETag: not rewritten


async def test_concurrent_registrations_with_one_nonce_exactly_one_wins(h: Harness) -> None:
    instance_id, nonce = h.create_instance()
    keys = [p256_pem()[1] for _ in range(6)]
    results = await asyncio.gather(*(h.register_agent(nonce, k) for k in keys), return_exceptions=True)
    winners = [r for r in results if isinstance(r, registration_pb2.RegisterClientResponse)]
    losers = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(winners) == 1, results
    assert len(losers) == len(keys) - 1
    assert all(e.code() == grpc.StatusCode.ALREADY_EXISTS for e in losers)
    winner = h.peer(winners[0].client_certificate_pem)
    assert h.row(instance_id).cert_serial == winner.serial
    assert json.loads(h.record(instance_id)[0])["cert_serial"] == winner.serial


async def test_bad_nonces_are_unauthenticated_and_consume_nothing(h: Harness) -> None:
    instance_id, good = h.create_instance()
    _, pem = p256_pem()
    other_key = generate_private_key("ed25519")
    header, payload, _ = good.split(".")
    unsigned = b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    attacks = {
        "expired": h.agent_nonce(instance_id, clock=ManualClock(h.clock.now() - timedelta(hours=1))),
        "wrong shard": h.agent_nonce(instance_id, shard="zone-b"),
        "wrong kind": h.operator_nonce(),
        "forged signature": h.agent_nonce(instance_id, key=other_key),
        "alg none": f"{unsigned}.{payload}.",
        "altered payload": f"{header}.{b64(json.dumps({'sub': instance_id}).encode())}.{good.split('.')[2]}",
        "garbage": "not-a-jwt",
    }
    for name, token in attacks.items():
        err = await rpc_error(h.register_agent(token, pem))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED, (name, err.details())
        assert "registration nonce" in (err.details() or ""), (name, err.details())
    assert h.row(instance_id).registered_at is None
    await h.register_agent(good, pem)  # the genuine nonce still works


def spki_pem(key: PublicKeyTypes) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@pytest.mark.parametrize(
    ("make_pem", "named"),
    [
        (
            lambda: spki_pem(rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()),
            "rsa-2048",
        ),
        (lambda: spki_pem(ec.generate_private_key(ec.SECP384R1()).public_key()), "ecdsa-p384"),
        (lambda: b"hello, I am a key", "not PEM"),
        (lambda: b"", "empty"),
    ],
    ids=["rsa", "p384", "garbage", "empty"],
)
async def test_identity_keys_other_than_p256_and_ed25519_are_invalid_arguments(
    h: Harness, make_pem: Callable[[], bytes], named: str
) -> None:
    instance_id, nonce = h.create_instance()
    err = await rpc_error(h.register_agent(nonce, make_pem()))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.details() or ""
    assert named in details
    assert "ECDSA P-256" in details
    assert "Ed25519" in details
    assert h.row(instance_id).registered_at is None  # the nonce is still usable
    await h.register_agent(nonce, p256_pem()[1])


async def test_an_ed25519_identity_key_registers_as_upstream_agents_send_it(h: Harness) -> None:
    instance_id, nonce = h.create_instance()
    private = ed25519.Ed25519PrivateKey.generate()
    response = await h.register_agent(nonce, spki_pem(private.public_key()))
    peer = h.peer(response.client_certificate_pem)
    assert peer.certificate.public_key() == private.public_key()
    assert h.row(instance_id).registered_at is not None


async def test_deleted_and_unknown_instances_cannot_register(h: Harness) -> None:
    instance_id, nonce = h.create_instance()
    with h.db.session() as session:
        repo.soft_delete(session, instance_id, now=h.clock.now())
    err = await rpc_error(h.register_agent(nonce, p256_pem()[1]))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "deleted" in (err.details() or "")

    stranger = str(new_instance_id("app"))
    err = await rpc_error(h.register_agent(h.agent_nonce(stranger), p256_pem()[1]))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert stranger in (err.details() or "")


async def test_an_instance_whose_create_failed_cannot_register(h: Harness) -> None:
    # The leader decided the create failed (its answer was lost): the VM its nonce reached is deleted
    # when a provider listing finds it, and must not join before that.
    instance_id, nonce = h.create_instance()
    with h.db.session() as session:
        assert repo.mark_create_failed(session, instance_id, now=h.clock.now())
    err = await rpc_error(h.register_agent(nonce, p256_pem()[1]))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "provider create failed" in (err.details() or "")
    assert h.row(instance_id).registered_at is None


async def test_failed_record_write_undoes_the_claim_so_the_agent_can_retry(h: Harness) -> None:
    instance_id, nonce = h.create_instance()
    record_before = h.record(instance_id)
    h.store.fail_records = True
    err = await rpc_error(h.register_agent(nonce, p256_pem()[1]))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "retry with the same nonce" in (err.details() or "")
    assert h.row(instance_id).registered_at is None
    assert h.row(instance_id).cert_serial is None
    assert h.record(instance_id) == record_before

    h.store.fail_records = False
    response = await h.register_agent(nonce, p256_pem()[1])
    assert h.row(instance_id).cert_serial == h.peer(response.client_certificate_pem).serial


@pytest.mark.parametrize("leaves_at", ["claim", "record"])
async def test_a_registration_whose_caller_left_is_released_for_the_agents_retry(
    h: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, leaves_at: str
) -> None:
    # The agent went away (a deadline, a reboot, a dropped connection) while its claim or its record
    # write was under way: its certificate was never handed out. The registration finishes or fails
    # as a whole, is then released, and the agent's retry with the same nonce registers. A retry that
    # arrives while the first is still under way is told to retry (UNAVAILABLE), not that the nonce
    # is used (ALREADY_EXISTS), on which an agent stops calling.
    instance_id, nonce = h.create_instance()
    started, release = threading.Event(), threading.Event()
    if leaves_at == "claim":
        agents = h.registrar.agents
        monkeypatch.setattr(agents._claims, "_write_many", held(agents._claim_many, started, release))
    else:
        monkeypatch.setattr(records, "modify_record", held(records.modify_record, started, release))

    def register() -> asyncio.Future[IssuedCertificate]:
        return asyncio.ensure_future(
            h.registrar.register_agent(
                nonce_jwt=nonce, public_key_pem=p256_pem()[1], private_ipv4="", private_ipv6="", hostname=""
            )
        )

    call = register()
    await eventually(started.is_set, what="the registration's write to start")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    early = register()  # while the first is still under way
    await asyncio.sleep(0.05)
    assert not early.done()  # it waits for the first to be over
    release.set()
    with pytest.raises(Unavailable, match="retry with the same nonce"):
        await early
    await eventually(
        lambda: any("released" in r.getMessage() for r in caplog.records),
        what="the left registration's release",
    )
    assert h.row(instance_id).registered_at is None
    released = json.loads(h.record(instance_id)[0])
    assert not released.get("cert_serial")
    assert not released.get("registered_at")
    monkeypatch.undo()
    response = await h.register_agent(nonce, p256_pem()[1])
    serial = h.peer(response.client_certificate_pem).serial
    assert h.row(instance_id).cert_serial == serial
    assert json.loads(h.record(instance_id)[0])["cert_serial"] == serial


async def test_a_claim_on_a_cache_row_behind_its_record_is_refused_when_the_record_holds_another_registration(
    h: Harness,
) -> None:
    # Sim seed 952005298: another leader registered the agent while this server could not read the
    # record, so this server's row still said "unregistered" and a replay of the nonce was accepted.
    instance_id, nonce = h.create_instance()
    first = h.peer((await h.register_agent(nonce, p256_pem()[1])).client_certificate_pem)
    with h.db.write_connection() as conn:  # the row as that server held it
        assert repo.unmark_registered(
            conn, instance_id=instance_id, cert_serial=first.serial, now=h.clock.now()
        )
    record_before = h.record(instance_id)

    h.clock.advance(30)
    err = await rpc_error(h.register_agent(nonce, p256_pem()[1], hostname="evil"))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "nonce already used" in (err.details() or "")
    assert h.record(instance_id) == record_before  # the registration in the record stands
    row = h.row(instance_id)  # the row takes the record's word, not the caller's
    assert (row.cert_serial, row.registered_at) == (first.serial, h.clock.now() - timedelta(seconds=30))
    assert row.hostname is None


async def test_a_record_write_that_landed_but_failed_is_overwritten_by_the_agents_retry(h: Harness) -> None:
    # The failed call's certificate was never handed out, so its registration in the record does not
    # use the nonce up: the retry with the same nonce registers.
    instance_id, nonce = h.create_instance()
    h.store.land_then_fail_keys = {records.record_key(TENANT, instance_id)}
    err = await rpc_error(h.register_agent(nonce, p256_pem()[1]))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    landed = json.loads(h.record(instance_id)[0])["cert_serial"]
    assert landed
    assert h.row(instance_id).registered_at is None

    h.store.land_then_fail_keys = set()
    response = await h.register_agent(nonce, p256_pem()[1])
    serial = h.peer(response.client_certificate_pem).serial
    assert serial != landed
    assert h.row(instance_id).cert_serial == serial
    assert json.loads(h.record(instance_id)[0])["cert_serial"] == serial


async def test_records_of_registrations_in_one_loop_turn_are_one_job_and_a_failed_one_fails_alone(
    h: Harness,
) -> None:
    made = [h.create_instance() for _ in range(6)]
    failing = {made[1][0], made[4][0]}
    h.store.fail_keys = {records.record_key(TENANT, iid) for iid in failing}
    before = {iid: h.record(iid) for iid in failing}
    results = await asyncio.gather(
        *(
            h.registrar.register_agent(
                nonce_jwt=nonce, public_key_pem=p256_pem()[1], private_ipv4="", private_ipv6="", hostname=""
            )
            for _, nonce in made
        ),
        return_exceptions=True,
    )
    batcher = h.registrar.agents.record_writes  # the memory store under the test's wrapper is local
    assert batcher is not None
    assert (batcher.batches, batcher.items) == (1, 6)
    for (iid, _), result in zip(made, results, strict=True):
        row = h.row(iid)
        if iid in failing:
            assert isinstance(result, Unavailable), result
            assert (row.registered_at, row.cert_serial) == (None, None)  # the claim was undone
            assert h.record(iid) == before[iid]
        else:
            assert isinstance(result, IssuedCertificate), result
            assert row.cert_serial == result.serial_hex
            assert json.loads(h.record(iid)[0])["cert_serial"] == result.serial_hex


async def test_standby_refuses_with_unavailable_naming_the_leader(h: Harness) -> None:
    instance_id, nonce = h.create_instance()
    h.leader.leading = False
    err = await rpc_error(h.register_agent(nonce, p256_pem()[1]))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "10.0.0.1:8992" in (err.details() or "")
    assert h.row(instance_id).registered_at is None

    h.cluster_leader.leading = False
    err = await rpc_error(h.register_operator(h.operator_nonce(), p256_pem()[1]))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "cluster leader is at 10.0.0.9:8992" in (err.details() or "")
    assert h.operators() == []


# --- operators ---------------------------------------------------------------------------------------


async def test_operator_nonce_is_bound_to_the_first_key(h: Harness) -> None:
    nonce = h.operator_nonce()
    _, pem = p256_pem()
    first = await h.register_operator(nonce, pem)
    peer = h.peer(first.client_certificate_pem)
    assert (peer.role, peer.client_id, peer.tenant) == ("operator", CLUSTER, TENANT)
    assert peer.not_after == h.clock.now() + timedelta(hours=OPERATOR_TTL_HOURS)
    binding, _ = h.cluster_store.get(operator_nonce_key(nonce))
    assert binding == pem

    h.clock.advance(60)
    retry = await h.register_operator(nonce, pem)  # same key: a retry, fresh certificate
    again = h.peer(retry.client_certificate_pem)
    assert again.serial != peer.serial

    err = await rpc_error(h.register_operator(nonce, p256_pem()[1]))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "different public key" in (err.details() or "")

    [row] = h.operators()
    assert (row.tenant, row.cluster_id, row.public_key, row.nonce) == (TENANT, CLUSTER, pem.decode(), nonce)
    assert row.cert_serial == again.serial
    record = json.loads(h.cluster_store.get(f"operator/{TENANT}.{CLUSTER}.json")[0])
    assert record["cert_serial"] == again.serial
    assert record["public_key"] == pem.decode()
    assert record["operator_id"] == row.id
    assert record["tenant"] == TENANT


async def test_operator_registration_refuses_agent_nonces_and_other_keys(h: Harness) -> None:
    _, agent_nonce = h.create_instance()
    err = await rpc_error(h.register_operator(agent_nonce, p256_pem()[1]))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    err = await rpc_error(
        h.register_operator(
            h.operator_nonce(), spki_pem(ec.generate_private_key(ec.SECP384R1()).public_key())
        )
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ecdsa-p384" in (err.details() or "")
    assert h.operators() == []
    assert h.cluster_store.list("operator-nonce/") == []


async def test_backfill_restores_operators_from_storage_into_an_empty_cache(h: Harness) -> None:
    await h.register_operator(h.operator_nonce("acme"), p256_pem()[1])
    await h.register_operator(h.operator_nonce("globex"), p256_pem()[1])
    registered = {(o.tenant, o.cert_serial, o.public_key) for o in h.operators()}
    assert await h.registrar.backfill_operators() == 0  # the cache is not empty: nothing to do

    # A new leader with an empty cache (fresh SQLite file).
    fresh = open_database(h.tmp_path / "other" / "nstance.db")
    try:
        registrar = Registrar(dataclasses.replace(h.ctx, db=fresh))
        assert await registrar.backfill_operators() == 2
        with fresh.read_session() as session:
            restored = repo.list_operators(session)
        assert {(o.tenant, o.cert_serial, o.public_key) for o in restored} == registered
        assert all(o.cert_expires_at is not None for o in restored)
        assert await registrar.backfill_operators() == 0
    finally:
        fresh.close()


async def test_backfill_reads_an_operator_record_in_upstreams_registration_shape(h: Harness) -> None:
    # What upstream's RegisterOperator writes (json.Marshal of its map: sorted keys, RFC 3339 nanos).
    pem = p256_pem()[1].decode()
    record = {
        "cert_serial": "1764104400123456789",
        "client_id": CLUSTER,
        "expires_at": "2027-11-25T21:00:00.123456789Z",
        "public_key_pem": pem,
        "registered_at": "2026-11-25T21:00:00.123456789Z",
        "tenant": "acme",
    }
    h.cluster_store.put(f"operator/acme.{CLUSTER}.json", json.dumps(record, separators=(",", ":")).encode())
    assert await h.registrar.backfill_operators() == 1
    (restored,) = h.operators()
    assert (restored.tenant, restored.public_key, restored.cert_serial) == (
        "acme",
        pem,
        "1764104400123456789",
    )
    assert restored.cert_expires_at == datetime(2027, 11, 25, 21, 0, 0, 123456, tzinfo=UTC)


async def test_backfill_reads_a_record_of_upstreams_admin_register_operator(h: Harness) -> None:
    pem = p256_pem()[1].decode()
    record = {
        "cert_serial": "42",
        "client_id": "opr01jq6z8c8w9x2m4r5t7v9y1b3d",
        "expires_at": "2027-11-25T21:00:00Z",
        "public_key_pem": pem,
        "registered_at": "2026-11-25T21:00:00Z",
        "registered_by": "nstance-admin",
        "tenant": "acme",
    }
    h.cluster_store.put("operator/acme.y1b3d.json", json.dumps(record, indent=2).encode())
    assert await h.registrar.backfill_operators() == 1
    (restored,) = h.operators()
    assert (restored.tenant, restored.public_key, restored.cert_serial) == ("acme", pem, "42")


# --- renewal -----------------------------------------------------------------------------------------


async def test_renewal_needs_the_current_certificate(h: Harness) -> None:
    instance_id, nonce = h.create_instance()
    first = h.peer((await h.register_agent(nonce, p256_pem()[1])).client_certificate_pem)

    h.clock.advance(timedelta(hours=1))
    _, new_pem = p256_pem()
    renewed = await h.registrar.renew_agent(first, new_pem)
    second = h.peer(renewed.cert_pem)
    assert (second.client_id, second.role, second.tenant) == (instance_id, "agent", TENANT)
    assert second.serial != first.serial
    assert public_key_to_pem(second.certificate.public_key()) == new_pem  # type: ignore[arg-type]
    row = h.row(instance_id)
    assert (row.cert_serial, row.instance_pub, row.cert_expires_at) == (
        second.serial,
        new_pem.decode(),
        second.not_after,
    )
    record = json.loads(h.record(instance_id)[0])
    assert (record["cert_serial"], record["public_key_pem"]) == (second.serial, new_pem.decode())

    with pytest.raises(PermissionDenied, match="superseded"):
        await h.registrar.renew_agent(first, p256_pem()[1])
    assert h.row(instance_id).cert_serial == second.serial

    third = await h.registrar.renew_agent(second, p256_pem()[1])
    assert h.row(instance_id).cert_serial == h.peer(third.cert_pem).serial


@pytest.mark.parametrize("leaves_at", ["swap", "record"])
async def test_a_renewal_whose_caller_left_is_given_back(
    h: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, leaves_at: str
) -> None:
    # The agent went away while its renewal was under way, so it still holds the certificate it renewed
    # with. The renewal finishes, is then given back, and the agent's retry with that certificate renews.
    instance_id, nonce = h.create_instance()
    first = h.peer((await h.register_agent(nonce, p256_pem()[1])).client_certificate_pem)
    started, release = threading.Event(), threading.Event()
    renewal = h.registrar.renewal
    if leaves_at == "swap":
        monkeypatch.setattr(renewal, "_swap_certificate", held(renewal._swap_certificate, started, release))
    else:
        monkeypatch.setattr(records, "modify_record", held(records.modify_record, started, release))
    call = asyncio.ensure_future(renewal.renew_agent(first, p256_pem()[1]))
    await eventually(started.is_set, what="the renewal's write to start")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    release.set()
    await eventually(
        lambda: any("current again" in r.getMessage() for r in caplog.records), what="the renewal given back"
    )
    monkeypatch.undo()
    assert h.row(instance_id).cert_serial == first.serial
    assert json.loads(h.record(instance_id)[0])["cert_serial"] == first.serial
    renewed = h.peer((await renewal.renew_agent(first, p256_pem()[1])).cert_pem)
    assert h.row(instance_id).cert_serial == renewed.serial
    assert json.loads(h.record(instance_id)[0])["cert_serial"] == renewed.serial


async def test_renewal_refuses_deleted_instances_and_storage_failures_keep_the_old_certificate(
    h: Harness,
) -> None:
    instance_id, nonce = h.create_instance()
    peer = h.peer((await h.register_agent(nonce, p256_pem()[1])).client_certificate_pem)

    h.store.fail_records = True
    with pytest.raises(Unavailable):
        await h.registrar.renew_agent(peer, p256_pem()[1])
    assert h.row(instance_id).cert_serial == peer.serial  # swapped back: the old cert still renews
    h.store.fail_records = False
    renewed = h.peer((await h.registrar.renew_agent(peer, p256_pem()[1])).cert_pem)

    with h.db.session() as session:
        repo.soft_delete(session, instance_id, now=h.clock.now())
    with pytest.raises(PermissionDenied, match="not an active instance"):
        await h.registrar.renew_agent(renewed, p256_pem()[1])


# --- the certificate's role decides where it may call ---------------------------------------------------


class TenantEcho(operator_pb2_grpc.OperatorServiceServicer):
    async def ListGroups(  # noqa: N802 - name fixed by the proto
        self, request: Empty, context: grpc.aio.ServicerContext
    ) -> operator_pb2.ListGroupsResponse:
        return operator_pb2.ListGroupsResponse(
            groups=[operator_pb2.GroupStatus(tenant=current_peer().tenant)]
        )


async def test_issued_certificates_on_the_operator_port(h: Harness) -> None:
    """Agent certificate -> PERMISSION_DENIED; foreign CA -> handshake refused (UNAVAILABLE)."""
    server = grpc.aio.server(interceptors=[ServerInterceptor(ca=h.ca, clock=h.clock)])
    operator_pb2_grpc.add_OperatorServiceServicer_to_server(TenantEcho(), server)  # type: ignore[abstract]
    credentials, _ = server_credentials(h.ca, hosts=["127.0.0.1"], clock=h.clock, require_client_cert=True)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()

    async def list_groups(key_pem: bytes, cert_pem: bytes) -> operator_pb2.ListGroupsResponse:
        creds = grpc.ssl_channel_credentials(
            root_certificates=h.ca.cert_pem, private_key=key_pem, certificate_chain=cert_pem
        )
        async with grpc.aio.secure_channel(
            f"127.0.0.1:{port}", creds, options=[("grpc.ssl_target_name_override", SERVER_NAME)]
        ) as channel:
            stub = operator_pb2_grpc.OperatorServiceStub(channel)
            response: operator_pb2.ListGroupsResponse = await stub.ListGroups(Empty(), timeout=CALL_TIMEOUT)
            return response

    try:
        _, nonce = h.create_instance()
        agent_key, agent_pem = p256_pem()
        agent = await h.register_agent(nonce, agent_pem)
        err = await rpc_error(list_groups(private_key_to_pem(agent_key), agent.client_certificate_pem))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "role 'operator' required" in (err.details() or "")

        operator_key, operator_pem = p256_pem()
        operator = await h.register_operator(h.operator_nonce(), operator_pem)
        ok = await list_groups(private_key_to_pem(operator_key), operator.client_certificate_pem)
        assert [g.tenant for g in ok.groups] == [TENANT]

        # Same names and role, but signed by another CA: the TLS handshake (which verifies client
        # certificates against the cluster CA) fails: the client sees UNAVAILABLE ("Socket closed");
        # UNAUTHENTICATED is what the interceptor would answer if a handshake ever let it through.
        other_ca: CertificateAuthority = create_ca(cluster_id="someone-else", clock=h.clock)
        rogue_key, rogue_pem = p256_pem()
        rogue = issue_client_certificate(
            other_ca, rogue_pem, client_id=CLUSTER, tenant=TENANT, role="operator", clock=h.clock
        )
        err = await rpc_error(list_groups(private_key_to_pem(rogue_key), rogue.cert_pem))
        assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)
    finally:
        await server.stop(None)
