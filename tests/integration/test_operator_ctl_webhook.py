"""The operator's validating webhook served by kopf and called by the API server (the emulator).

kopf runs ``handlers.register``'s admission handler behind an HTTPS webhook server it manages (it
writes the ValidatingWebhookConfiguration itself); an update of a static pool's template is refused
with 422 and the message naming the field, while its vars stay editable.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import kopf
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from operator_harness import CRDS, api_changes, connect, kopf_running, operator_context

from nstance.operator import handlers
from nstance.operator.context import ShardNotConfigured, Timings
from nstance.operator.controllers.resources import NSTANCE_MACHINE_POOLS
from nstance.operator.kube import Kube, KubeError
from nstance.operator.nodes import NodeIndex
from nstance.rpc import operator_pb2_grpc
from nstance.testing.kubeapi import KubeAPIServer
from nstance.testing.shardproc import free_port
from nstance.testing.waiting import eventually

pytestmark = pytest.mark.timeout(60)

MANAGED = "test.operator.nstance.dev"


class NoShards:
    """A ShardAccess with no shards configured (the webhook needs none)."""

    def configured(self) -> Sequence[str]:
        return []

    def stub(self, shard: str) -> operator_pb2_grpc.OperatorServiceStub:
        raise ShardNotConfigured(shard)

    def reachable(self, shard: str) -> bool:
        return False

    def report(self, shard: str, ok: bool, error: str = "") -> None:
        return None

    async def wait_changed(self) -> None:
        await asyncio.Event().wait()


def serving_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed P-256 certificate for 127.0.0.1 (also its own CA, as kopf passes it as caBundle)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nstance-operator-webhook")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@contextlib.asynccontextmanager
async def operator_with_webhook(tmp_path: Path) -> AsyncIterator[tuple[KubeAPIServer, Kube]]:
    with KubeAPIServer.in_thread(crds=[CRDS]) as server:
        kube = await connect(server, tmp_path / "kc")
        ctx = operator_context(kube, NoShards(), Timings(unreachable_retry=5.0), NodeIndex(kube))
        registry = kopf.OperatorRegistry()
        handlers.register(registry)
        cert, key = serving_certificate(tmp_path)
        settings = kopf.OperatorSettings()
        settings.admission.server = kopf.WebhookServer(
            addr="127.0.0.1", host="127.0.0.1", port=free_port(), certfile=str(cert), pkeyfile=str(key)
        )
        settings.admission.managed = MANAGED
        try:
            async with kopf_running(registry, server, ctx, settings):
                yield server, kube
        finally:
            await kube.close()


async def wait_for_webhook(server: KubeAPIServer) -> None:
    """Until kopf has written its webhook configuration (re-checked on every API change)."""
    configs = server.registry.lookup("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations")
    assert configs is not None

    def configured() -> bool:
        found = server.call(lambda: server.store.find(configs, None, MANAGED))
        return bool(found and any(w.get("rules") for w in found.get("webhooks") or []))

    with api_changes(server) as changed:
        await eventually(configured, within=15, what="kopf's webhook configuration", wake=changed)


async def test_a_static_pools_template_cannot_change_but_its_vars_can(tmp_path: Path) -> None:
    async with operator_with_webhook(tmp_path) as (server, kube):
        await wait_for_webhook(server)
        spec = {"group": "control-plane", "shards": ["zone-a"], "template": "cp"}
        await kube.create(NSTANCE_MACHINE_POOLS, {"metadata": {"name": "cp"}, "spec": spec}, "default")
        await kube.patch(NSTANCE_MACHINE_POOLS, "cp", {"status": {"isStatic": True}}, "default", status=True)

        with pytest.raises(KubeError) as refused:
            await kube.patch(NSTANCE_MACHINE_POOLS, "cp", {"spec": {"template": "other"}}, "default")
        assert refused.value.status == 422
        assert "spec.template cannot change while the group is static" in refused.value.message
        stored = await kube.get(NSTANCE_MACHINE_POOLS, "cp", "default")
        assert stored is not None
        assert stored["spec"]["template"] == "cp"

        with pytest.raises(KubeError) as reordered:
            await kube.patch(
                NSTANCE_MACHINE_POOLS, "cp", {"spec": {"shards": ["zone-a", "zone-b"]}}, "default"
            )
        assert "spec.shards cannot change" in reordered.value.message

        updated = await kube.patch(NSTANCE_MACHINE_POOLS, "cp", {"spec": {"vars": {"role": "cp"}}}, "default")
        assert updated["spec"]["vars"] == {"role": "cp"}
