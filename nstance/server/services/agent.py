"""AgentService handlers (mTLS, role ``agent``; the caller is the instance named by the certificate's CN).

Translation only: protobuf in, ``AgentHub`` / ``Registrar`` call, protobuf out. Agents talk to the
shard leader; a standby refuses with UNAVAILABLE naming the leader, and the agent retries with
backoff. A report or key submission naming another instance than the certificate is refused with
PERMISSION_DENIED.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf.empty_pb2 import Empty
from google.protobuf.timestamp_pb2 import Timestamp

from nstance.core.errors import InvalidArgument, PermissionDenied
from nstance.pki.keys import load_public_key_wire, public_key_to_pem
from nstance.rpc import agent_pb2, agent_pb2_grpc
from nstance.server.agents.hub import AgentHub, FileReport, HealthReport, TerminationNotice
from nstance.server.identity.interceptors import current_peer
from nstance.server.identity.registration import Registrar

#: Largest number of public keys one SubmitPublicKeys call may carry.
MAX_KEYS = 64


def _stamp(moment: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(moment.astimezone(UTC))
    return stamp


def _when(stamp: Timestamp) -> datetime:
    return stamp.ToDatetime(tzinfo=UTC)


def _caller(instance_id: str) -> str:
    """The certificate's instance id; a message naming another instance is refused."""
    peer = current_peer().client_id
    if instance_id and instance_id != peer:
        raise PermissionDenied(
            f"this certificate belongs to instance {peer}; it cannot act for instance {instance_id}"
        )
    return peer


def _metrics(m: agent_pb2.Metrics) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if m.HasField("cpu_usage"):
        out["cpu_usage"] = m.cpu_usage
    if m.cpu_core_usage:
        out["cpu_core_usage"] = list(m.cpu_core_usage)
    if m.HasField("memory_usage"):
        out["memory_usage"] = m.memory_usage
    return out


def health_report(msg: agent_pb2.HealthReportRequest, instance_id: str) -> HealthReport:
    """Decode one report."""
    files = {}
    for name, status in msg.files.items():
        which = status.WhichOneof("status")
        if which == "error":
            files[name] = FileReport(error=status.error or "error")
        elif which == "last_modified":
            files[name] = FileReport(last_modified=_when(status.last_modified))
        else:
            files[name] = FileReport()
    notice = None
    if msg.HasField("termination_notice"):
        tn = msg.termination_notice
        notice = TerminationNotice(
            action=tn.action or "terminate", deadline=_when(tn.deadline) if tn.HasField("deadline") else None
        )
    return HealthReport(
        instance_id=instance_id,
        count=msg.count,
        uptime=msg.uptime,
        metrics=_metrics(msg.metrics) if msg.HasField("metrics") else {},
        files=files,
        termination=notice,
        config_hash=msg.config_hash,
    )


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    """The Agent API of the shard leader."""

    def __init__(self, hub: AgentHub, registrar: Registrar) -> None:
        self._hub = hub
        self._registrar = registrar

    async def SubmitHealthReport(
        self,
        request_iterator: AsyncIterator[agent_pb2.HealthReportRequest],
        context: grpc.aio.ServicerContext,
    ) -> Empty:
        instance_id = _caller("")

        async def reports() -> AsyncIterator[HealthReport]:
            async for msg in request_iterator:
                yield health_report(msg, _caller(msg.instance_id))

        await self._hub.health(instance_id, reports())
        return Empty()

    async def ReceiveFiles(
        self, request: Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[agent_pb2.FileTransfer]:
        instance_id = _caller("")
        async for delivery in self._hub.files(instance_id):
            if not delivery.name:
                # The commit: the config hash alone. Upstream's newest agent drops the stream when a
                # commit carries anything else (a name, content or a time).
                yield agent_pb2.FileTransfer(config_hash=delivery.config_hash)
                continue
            yield agent_pb2.FileTransfer(
                filename=delivery.name,
                content=delivery.content,
                last_modified=_stamp(datetime.now(UTC)),
                config_hash=delivery.config_hash,
            )

    async def ReceiveKeyRequests(
        self, request: Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[agent_pb2.KeyGenerationRequest]:
        instance_id = _caller("")
        async for names in self._hub.key_requests(instance_id):
            yield agent_pb2.KeyGenerationRequest(key_names=names)

    async def SubmitPublicKeys(
        self, request: agent_pb2.PublicKeysRequest, context: grpc.aio.ServicerContext
    ) -> Empty:
        instance_id = _caller(request.instance_id)
        if len(request.keys) > MAX_KEYS:
            raise InvalidArgument(f"at most {MAX_KEYS} public keys per call; got {len(request.keys)}")
        keys: dict[str, bytes] = {}
        for key in request.keys:
            name = key.filename
            if not name or "/" in name or "\\" in name or name in (".", "..") or "\x00" in name:
                raise InvalidArgument(f"public key file name {name!r} must be a bare file name")
            # Upstream's agents send base64 of the DER in this field; this project's agents sent PEM.
            submitted = load_public_key_wire(key.public_key_pem, what=f"public key {name!r}")
            keys[name] = public_key_to_pem(submitted)
        await self._hub.submit_public_keys(instance_id, keys)
        return Empty()

    async def RenewAgentCertificate(
        self, request: agent_pb2.RenewAgentCertificateRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.RenewAgentCertificateResponse:
        issued = await self._registrar.renew_agent(current_peer(), request.public_key_pem)
        return agent_pb2.RenewAgentCertificateResponse(
            client_certificate_pem=issued.cert_pem, expires_at=_stamp(issued.expires_at)
        )
