"""The real nstance-agent (in-process) against a RegistrationService + AgentService written in this test.

Real TLS: a CA from nstance.pki, server certificates from nstance.server.identity.tls, mTLS on the agent port.
The test server checks what a shard server would see: the nonce and an ECDSA P-256 key at registration,
health reports on the stream, files applied on commit, public keys for a key request, a certificate
renewal, and an agent that stays idle (no retry storm) after a permanent registration refusal.
"""

from __future__ import annotations

import asyncio
import base64
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from google.protobuf.empty_pb2 import Empty

from nstance.agent.config import AgentConfig
from nstance.agent.identity import ensure_identity_key
from nstance.agent.run import Agent
from nstance.core.backoff import Backoff
from nstance.core.clock import ManualClock
from nstance.core.errors import FailedPrecondition
from nstance.pki.ca import CertificateAuthority, create_ca
from nstance.pki.certs import issue_client_certificate
from nstance.pki.keys import (
    generate_private_key,
    load_any_public_key_pem,
    load_private_key_pem,
    public_key_to_der,
)
from nstance.pki.nonce import agent_nonce_claims, sign_nonce
from nstance.rpc import agent_pb2, agent_pb2_grpc, registration_pb2, registration_pb2_grpc
from nstance.server.identity.tls import server_credentials
from nstance.testing.waiting import eventually

pytestmark = pytest.mark.timeout(60)

INSTANCE_ID = "web-test-instance"


def peer_serial(context: grpc.aio.ServicerContext[Any, Any]) -> int:
    pem = context.auth_context()["x509_pem_cert"][0]
    return x509.load_pem_x509_certificate(pem).serial_number


class Registration(registration_pb2_grpc.RegistrationServiceServicer):
    def __init__(self, ca: CertificateAuthority, nonce: str) -> None:
        self.ca = ca
        self.nonce = nonce
        self.requests: list[registration_pb2.RegisterClientRequest] = []
        self.refuse: tuple[grpc.StatusCode, str] | None = None

    async def RegisterAgent(  # noqa: N802 - name fixed by the proto
        self,
        request: registration_pb2.RegisterClientRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> registration_pb2.RegisterClientResponse:
        self.requests.append(request)
        if self.refuse is not None:
            await context.abort(*self.refuse)
        if request.registration_nonce_jwt != self.nonce:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown nonce")
        # Issued "two hours ago" with five minutes left: past 2/3 of its life, so the agent renews it.
        past = ManualClock(datetime.now(UTC) - timedelta(hours=2))
        issued = issue_client_certificate(
            self.ca,
            request.public_key_pem,
            client_id=INSTANCE_ID,
            tenant="default",
            role="agent",
            ttl=timedelta(hours=2, minutes=5),
            clock=past,
        )
        response = registration_pb2.RegisterClientResponse(client_certificate_pem=issued.cert_pem)
        response.expires_at.FromDatetime(issued.not_after)
        return response

    async def RegisterOperator(  # noqa: N802 - name fixed by the proto
        self,
        request: registration_pb2.RegisterClientRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> registration_pb2.RegisterClientResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in this test")
        raise AssertionError("abort returned")


class AgentApi(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, ca: CertificateAuthority) -> None:
        self.ca = ca
        self.reports: list[tuple[int, agent_pb2.HealthReportRequest]] = []  # (peer cert serial, report)
        self.files: asyncio.Queue[agent_pb2.FileTransfer] = asyncio.Queue()
        self.key_requests: asyncio.Queue[agent_pb2.KeyGenerationRequest] = asyncio.Queue()
        self.submitted: list[agent_pb2.PublicKeysRequest] = []
        self.renewed: list[int] = []  # serials issued by RenewAgentCertificate
        self.open_streams = {"files": 0, "keys": 0}
        self.renew_unimplemented = False
        self.renew_calls = 0

    async def SubmitHealthReport(  # noqa: N802 - name fixed by the proto
        self,
        request_iterator: AsyncIterator[agent_pb2.HealthReportRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> Empty:
        serial = peer_serial(context)
        async for report in request_iterator:
            self.reports.append((serial, report))
        return Empty()

    async def ReceiveFiles(  # noqa: N802 - name fixed by the proto
        self, request: Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[agent_pb2.FileTransfer]:
        self.open_streams["files"] += 1
        try:
            while True:
                yield await self.files.get()
        finally:
            self.open_streams["files"] -= 1

    async def ReceiveKeyRequests(  # noqa: N802 - name fixed by the proto
        self, request: Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[agent_pb2.KeyGenerationRequest]:
        self.open_streams["keys"] += 1
        try:
            while True:
                yield await self.key_requests.get()
        finally:
            self.open_streams["keys"] -= 1

    async def SubmitPublicKeys(  # noqa: N802 - name fixed by the proto
        self, request: agent_pb2.PublicKeysRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Empty:
        self.submitted.append(request)
        return Empty()

    async def RenewAgentCertificate(  # noqa: N802 - name fixed by the proto
        self, request: agent_pb2.RenewAgentCertificateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> agent_pb2.RenewAgentCertificateResponse:
        self.renew_calls += 1
        if self.renew_unimplemented:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method")
        cn = context.auth_context()["x509_common_name"][0].decode()
        issued = issue_client_certificate(
            self.ca,
            request.public_key_pem,
            client_id=cn,
            tenant="default",
            role="agent",
            ttl=timedelta(days=30),
        )
        self.renewed.append(issued.serial)
        response = agent_pb2.RenewAgentCertificateResponse(client_certificate_pem=issued.cert_pem)
        response.expires_at.FromDatetime(issued.not_after)
        return response


@dataclass
class Harness:
    root: Path
    config: AgentConfig
    registration: Registration
    api: AgentApi
    nonce: str


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    ca = create_ca(cluster_id="c1")
    nonce_key = generate_private_key("ed25519")
    claims = agent_nonce_claims(
        instance_id=INSTANCE_ID, cluster_id="c1", shard="s1", group="web", tenant="default", config_hash="h1"
    )
    nonce = sign_nonce(nonce_key, claims)  # type: ignore[arg-type]
    identity = tmp_path / "identity"
    identity.mkdir()
    (identity / "ca.crt").write_bytes(ca.cert_pem)
    (identity / "nonce.jwt").write_text(nonce + "\n")

    registration = Registration(ca, nonce)
    api = AgentApi(ca)
    server = grpc.aio.server()
    registration_pb2_grpc.add_RegistrationServiceServicer_to_server(registration, server)
    agent_pb2_grpc.add_AgentServiceServicer_to_server(api, server)
    clock = ManualClock(datetime.now(UTC))
    reg_creds, _ = server_credentials(ca, hosts=["127.0.0.1"], clock=clock, require_client_cert=False)
    agent_creds, _ = server_credentials(ca, hosts=["127.0.0.1"], clock=clock, require_client_cert=True)
    reg_port = server.add_secure_port("127.0.0.1:0", reg_creds)
    agent_port = server.add_secure_port("127.0.0.1:0", agent_creds)
    await server.start()
    config = AgentConfig(
        instance_id=INSTANCE_ID,
        registration_addr=f"127.0.0.1:{reg_port}",
        agent_addr=f"127.0.0.1:{agent_port}",
        identity_dir=identity,
        keys_dir=tmp_path / "keys",
        recv_dir=tmp_path / "recv",
        report_interval=0.2,
        provider="local",
        health_addr="127.0.0.1:0",
    )
    try:
        yield Harness(tmp_path, config, registration, api, nonce)
    finally:
        await server.stop(grace=None)


IDLE_CHECK = 0.03
"""How often an agent refused for good looks for a new nonce here (no backoff delay is this short)."""


class Pauses:
    """The agent's sleep: a real pause, counting those of ``IDLE_CHECK`` (its looks for a new nonce)."""

    def __init__(self) -> None:
        self.idle_checks = 0

    async def __call__(self, delay: float) -> None:
        if delay == IDLE_CHECK:
            self.idle_checks += 1
        await asyncio.sleep(delay)


def start_agent(config: AgentConfig, pauses: Pauses | None = None) -> tuple[Agent, asyncio.Task[None]]:
    agent = Agent(
        config,
        sleep=pauses or Pauses(),
        stream_backoff=Backoff(base=0.05, cap=0.2),
        register_backoff=Backoff(base=0.05, cap=0.2),
        renew_backoff=Backoff(base=0.05, cap=0.2),
        idle_check=IDLE_CHECK,
    )
    return agent, asyncio.create_task(agent.run())


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_agent_registers_reports_applies_files_makes_keys_and_renews(harness: Harness) -> None:
    config, api, registration = harness.config, harness.api, harness.registration
    agent, task = start_agent(config)
    try:
        # Registration: the nonce from userdata and an ECDSA P-256 key that is the stored identity key.
        await eventually(lambda: config.cert_path.exists(), what="identity.crt", within=10)
        assert len(registration.requests) == 1
        sent = registration.requests[0]
        assert sent.registration_nonce_jwt == harness.nonce
        public = load_any_public_key_pem(sent.public_key_pem)
        assert isinstance(public, ec.EllipticCurvePublicKey)
        assert public.curve.name == "secp256r1"
        identity_key = load_private_key_pem(config.key_path.read_bytes())
        assert identity_key.public_key() == public
        assert stat.S_IMODE(config.key_path.stat().st_mode) == 0o600

        # Renewal: the short-lived certificate is renewed over mTLS and the streams reconnect with it.
        await eventually(lambda: len(api.renewed) == 1, what="certificate renewal", within=10)
        await eventually(
            lambda: any(serial == api.renewed[0] for serial, _ in api.reports),
            what="report on new cert",
            within=10,
        )
        stored = x509.load_pem_x509_certificate(config.cert_path.read_bytes())
        assert stored.serial_number == api.renewed[0]

        # Health: reports keep coming, numbered, carrying the nonce's config hash before any commit.
        await eventually(lambda: len(api.reports) >= 3, what="three health reports", within=10)
        first = api.reports[0][1]
        assert first.instance_id == INSTANCE_ID
        assert first.version
        assert first.count in (1, 2)  # report 1 may be lost when renewal closes the first channel
        assert first.config_hash == "h1"
        assert first.uptime.endswith("s")
        counts = [report.count for _, report in api.reports]
        assert counts == sorted(counts)
        assert len(set(counts)) == len(counts)

        # Files: staged until the commit, a '../' name refused and reported, nothing written outside.
        await eventually(
            lambda: api.open_streams == {"files": 1, "keys": 1},
            what="streams of the renewed session",
            within=10,
        )
        await api.files.put(agent_pb2.FileTransfer(filename="app/config.json", content=b'{"a": 1}'))
        await api.files.put(agent_pb2.FileTransfer(filename="../escape.env", content=b"A=1\n"))
        # Deliveries are handled in order: once the second is refused, the first has been staged.
        await eventually(
            lambda: "../escape.env" in agent.receiver.statuses(), what="the '../' name refused", within=10
        )
        assert agent.receiver.staged == ["app/config.json"]
        assert not (config.recv_dir / "app" / "config.json").exists(), "written before the commit"
        await api.files.put(agent_pb2.FileTransfer(config_hash="h2"))
        await eventually(lambda: config.config_hash_path.exists(), what="config.hash", within=10)
        assert config.config_hash_path.read_text().strip() == "h2"
        written = config.recv_dir / "app" / "config.json"
        assert written.read_bytes() == b'{"a": 1}'
        assert stat.S_IMODE(written.stat().st_mode) == 0o640
        assert not (harness.root / "escape.env").exists()

        def reported_commit() -> bool:
            last = api.reports[-1][1]
            return last.config_hash == "h2" and "../escape.env" in last.files

        await eventually(reported_commit, what="a report with the new hash and the refused file", within=10)
        last = api.reports[-1][1]
        assert "'..'" in last.files["../escape.env"].error
        assert last.files["app/config.json"].HasField("last_modified")

        # Key requests: an ECDSA P-256 pair is made and every public key is submitted.
        await api.key_requests.put(agent_pb2.KeyGenerationRequest(key_names=["kubelet.server"]))
        await eventually(
            lambda: any(k.filename == "kubelet.server" for r in api.submitted for k in r.keys),
            what="keys",
            within=10,
        )
        submission = next(k for r in api.submitted for k in r.keys if k.filename == "kubelet.server")
        assert api.submitted[-1].instance_id == INSTANCE_ID
        key = load_private_key_pem((config.keys_dir / "kubelet.server.key").read_bytes())
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        # base64 of the DER, as upstream's agents send it (a Go server decodes the field so)
        assert submission.public_key_pem == base64.b64encode(public_key_to_der(key))

        # /healthz says ok while registered with the health stream up.
        assert agent.state.healthz() == (True, "ok")
        assert not task.done()
    finally:
        await stop(task)


def store_a_usable_certificate(harness: Harness) -> int:
    """identity.key and an identity.crt for it from the cluster CA, as a registered machine holds them;
    returns the certificate's serial."""
    key_obj = ensure_identity_key(harness.config.key_path)
    issued = issue_client_certificate(
        harness.api.ca,
        key_obj.public_key(),
        client_id=INSTANCE_ID,
        tenant="default",
        role="agent",
        ttl=timedelta(days=1),
    )
    harness.config.cert_path.write_bytes(issued.cert_pem)
    return issued.serial


async def reports_without_registering(harness: Harness, serial: int) -> None:
    """The agent reports on the stored certificate ``serial`` and never calls RegisterAgent."""
    _, task = start_agent(harness.config)
    try:
        await eventually(lambda: len(harness.api.reports) >= 1, what="a health report", within=10)
        assert harness.registration.requests == []
        assert harness.api.reports[0][0] == serial
        assert harness.api.renewed == []
    finally:
        await stop(task)


async def test_agent_reuses_a_valid_certificate_instead_of_registering(harness: Harness) -> None:
    await reports_without_registering(harness, store_a_usable_certificate(harness))


async def test_an_agent_replacing_a_go_agent_starts_without_the_nonce_it_deleted(harness: Harness) -> None:
    # Upstream's agent deletes nonce.jwt once registered (pkg/client/registration): a machine whose Go
    # agent is replaced by this one holds ca.crt, the key pair and identity.crt, and no nonce.
    config = harness.config
    (config.identity_dir / "nonce.jwt").unlink()
    await reports_without_registering(harness, store_a_usable_certificate(harness))

    # Without a usable certificate the nonce is needed after all: the agent stops and names it.
    config.cert_path.unlink()
    _, task = start_agent(config)
    with pytest.raises(FailedPrecondition, match=r"nonce\.jwt is missing"):
        await asyncio.wait_for(task, 10)
    assert harness.registration.requests == []


async def test_agent_keeps_its_certificate_when_the_server_cannot_renew(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    api = harness.api
    api.renew_unimplemented = True
    agent, task = start_agent(harness.config)
    try:
        await eventually(lambda: api.renew_calls == 1, what="the renewal attempt", within=10)
        await eventually(lambda: len(api.reports) >= 3, what="reports on the old certificate", within=10)
        assert api.renew_calls == 1, "asked again after UNIMPLEMENTED"
        assert agent.sessions == 1
        stored = x509.load_pem_x509_certificate(harness.config.cert_path.read_bytes())
        assert {serial for serial, _ in api.reports} == {stored.serial_number}
        assert "does not implement RenewAgentCertificate" in caplog.text
        assert "90% of its lifetime" in caplog.text  # this certificate is already that old
    finally:
        await stop(task)


async def test_agent_stays_up_idle_after_a_permanent_refusal(harness: Harness) -> None:
    harness.registration.refuse = (grpc.StatusCode.UNAUTHENTICATED, "nonce already used")
    pauses = Pauses()
    agent, task = start_agent(harness.config, pauses)
    try:
        await eventually(
            lambda: len(harness.registration.requests) == 1, what="the registration attempt", within=10
        )
        # Three looks at the unchanged nonce (counted, not timed) and no second attempt.
        await eventually(lambda: pauses.idle_checks >= 3, what="three looks for a new nonce", within=10)
        assert len(harness.registration.requests) == 1, "retried a permanent refusal"
        assert not task.done()
        ok, reason = agent.state.healthz()
        assert not ok
        assert "UNAUTHENTICATED" in reason
        assert "nonce already used" in reason
        assert not harness.config.cert_path.exists()
        # Those looks are real: a new nonce is tried at the next one.
        harness.config.nonce_path.write_text("another.nonce.jwt\n")
        await eventually(
            lambda: len(harness.registration.requests) == 2, what="an attempt with the new nonce", within=10
        )
        assert harness.registration.requests[1].registration_nonce_jwt == "another.nonce.jwt"
    finally:
        await stop(task)


async def test_agent_retries_transient_registration_failures(harness: Harness) -> None:
    harness.registration.refuse = (grpc.StatusCode.UNAVAILABLE, "not ready")
    _, task = start_agent(harness.config)
    try:
        await eventually(lambda: len(harness.registration.requests) >= 3, what="retries", within=10)
        harness.registration.refuse = None
        await eventually(
            lambda: harness.config.cert_path.exists(), what="registration after the retries", within=10
        )
    finally:
        await stop(task)
