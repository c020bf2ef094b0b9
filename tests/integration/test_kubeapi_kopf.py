"""kopf 1.45 and kubernetes_asyncio, unmodified, drive custom resources on the Kubernetes API emulator.

Proves the emulator serves what an operator needs end to end: discovery and watches for kopf's
scanning, finalizers, status patches, events posted by kopf, deletion handlers, and a kopf-managed
validating webhook (kopf.WebhookServer over HTTPS with a self-signed certificate) that denies a bad create.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import kopf
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes_asyncio import client, config
from operator_harness import kopf_running

from nstance.testing.kubeapi import KubeAPIServer
from nstance.testing.procs import free_port
from nstance.testing.waiting import eventually

GROUP = "kopftest.nstance.dev"
FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"gadgets.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {"size": {"type": "integer"}},
                            },
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


def gadget(name: str, size: int) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1", "kind": "Gadget", "metadata": {"name": name}, "spec": {"size": size}}


async def wait_until(
    server: KubeAPIServer, check: Callable[[], bool], what: str, within: float = 10.0
) -> None:
    """Wait until ``check()`` holds, re-checking after every store change."""
    changed = asyncio.Event()
    unsubscribe = server.store.subscribe(lambda _event: changed.set())
    try:
        await eventually(check, within=within, what=what, wake=changed)
    finally:
        unsubscribe()


def stored_gadget(server: KubeAPIServer, name: str) -> dict[str, Any] | None:
    rtype = server.registry.lookup(GROUP, "v1", "gadgets")
    assert rtype is not None
    return server.store.find(rtype, "default", name)


@pytest.fixture
async def emulator(tmp_path: Path) -> AsyncIterator[tuple[KubeAPIServer, client.ApiClient]]:
    async with KubeAPIServer() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        api_config = client.Configuration()
        await config.load_kube_config(str(kubeconfig), client_configuration=api_config)
        async with client.ApiClient(api_config) as api:
            await client.ApiextensionsV1Api(api).create_custom_resource_definition(CRD)
            yield server, api


async def test_kopf_handlers_finalizer_status_and_deletion(
    emulator: tuple[KubeAPIServer, client.ApiClient],
) -> None:
    server, api = emulator
    registry = kopf.OperatorRegistry()
    calls: list[str] = []

    @kopf.on.create(GROUP, "v1", "gadgets", registry=registry, id="make")
    def on_create(spec: Any, body: Any, **_: Any) -> dict[str, Any]:
        calls.append(f"create:{spec['size']}")
        kopf.info(body, reason="Made", message=f"made a gadget of size {spec['size']}")
        return {"observed": spec["size"]}

    @kopf.on.update(GROUP, "v1", "gadgets", registry=registry, id="resize")
    def on_update(spec: Any, **_: Any) -> None:
        calls.append(f"update:{spec['size']}")

    @kopf.on.delete(GROUP, "v1", "gadgets", registry=registry, id="cleanup")
    def on_delete(**_: Any) -> None:
        calls.append("delete")

    settings = kopf.OperatorSettings()
    settings.posting.enabled = True
    custom = client.CustomObjectsApi(api)
    async with kopf_running(registry, server, settings=settings):
        created = await custom.create_namespaced_custom_object(
            GROUP, "v1", "default", "gadgets", gadget("g1", 3)
        )
        assert created["metadata"]["generation"] == 1

        def handled() -> bool:
            obj = stored_gadget(server, "g1")
            return obj is not None and obj.get("status", {}).get("make") == {"observed": 3}

        await wait_until(server, handled, "the handler's status on g1")
        obj = stored_gadget(server, "g1")
        assert obj is not None
        assert FINALIZER in obj["metadata"]["finalizers"]
        assert calls == ["create:3"]

        await custom.patch_namespaced_custom_object(
            GROUP,
            "v1",
            "default",
            "gadgets",
            "g1",
            {"spec": {"size": 5}},
            _content_type="application/merge-patch+json",
        )
        await wait_until(server, lambda: "update:5" in calls, "the update handler")

        await custom.delete_namespaced_custom_object(GROUP, "v1", "default", "gadgets", "g1")
        await wait_until(server, lambda: stored_gadget(server, "g1") is None, "g1 deleted")
        assert calls == ["create:3", "update:5", "delete"]

        # kopf posts events (kopf.info) through the core v1 events API, in the background.
        events_type = server.registry.lookup("", "v1", "events")
        assert events_type is not None

        def posted() -> bool:
            items = server.store.list_objects(events_type, "default")["items"]
            return any(e["involvedObject"].get("name") == "g1" and e.get("reason") == "Made" for e in items)

        await wait_until(server, posted, "the Made Event")
        events = await client.CoreV1Api(api).list_namespaced_event("default")
        made = [e for e in events.items if e.involved_object.name == "g1" and e.reason == "Made"]
        assert made[0].message == "made a gadget of size 3"
        assert made[0].involved_object.uid == created["metadata"]["uid"]


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path = tmp_path / "webhook.crt"
    key_path = tmp_path / "webhook.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def _free_port() -> int:
    return free_port()


async def test_kopf_managed_validating_webhook_denies_bad_create(
    emulator: tuple[KubeAPIServer, client.ApiClient], tmp_path: Path
) -> None:
    server, api = emulator
    registry = kopf.OperatorRegistry()

    @kopf.on.validate(GROUP, "v1", "gadgets", registry=registry, id="size-limit")
    def check_size(spec: Any, **_: Any) -> None:
        if spec.get("size", 0) > 10:
            raise kopf.AdmissionError("size must be at most 10", code=422)

    cert, key = _self_signed(tmp_path)
    settings = kopf.OperatorSettings()
    settings.admission.server = kopf.WebhookServer(
        addr="127.0.0.1", host="127.0.0.1", port=_free_port(), certfile=str(cert), pkeyfile=str(key)
    )
    settings.admission.managed = "gadgets.kopftest.nstance.dev"
    custom = client.CustomObjectsApi(api)
    configs = server.registry.lookup("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations")
    assert configs is not None

    def webhook_configured() -> bool:
        found = server.store.find(configs, None, "gadgets.kopftest.nstance.dev")
        return bool(found and found.get("webhooks") and found["webhooks"][0].get("rules"))

    async with kopf_running(registry, server, settings=settings):
        await wait_until(server, webhook_configured, "the webhook configuration")
        with pytest.raises(client.ApiException) as denied:
            await custom.create_namespaced_custom_object(GROUP, "v1", "default", "gadgets", gadget("big", 11))
        assert denied.value.status == 422
        assert "denied the request: size must be at most 10" in str(denied.value.body)
        assert stored_gadget(server, "big") is None

        ok = await custom.create_namespaced_custom_object(
            GROUP, "v1", "default", "gadgets", gadget("small", 2)
        )
        assert ok["spec"]["size"] == 2
