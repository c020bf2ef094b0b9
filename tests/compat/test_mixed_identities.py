"""Mixed fleets: Ed25519 identities (what upstream's agents, operators and admins hold) on this server,
and this agent and admin against a server that presents an Ed25519 certificate (as upstream's do).

Each test runs a real server in this process (real TLS on loopback ports, file object storage) and,
where agents are involved, the local provider starts real ``nstance-agent`` processes. The upstream
binaries cannot be built here (the Go module proxy does not serve the module), so upstream's side is
played by what it puts on the wire: Ed25519 keys, certificates and server leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from google.protobuf.empty_pb2 import Empty
from typer.testing import CliRunner

from nstance.admin.cli import app as admin_app
from nstance.admin.client import load_identity, open_channel
from nstance.pki.keys import load_private_key_pem
from nstance.rpc import operator_pb2, operator_pb2_grpc
from nstance.server.app import ServerApp, ServerOptions
from nstance.testing.identities import make_identity
from nstance.testing.netprobe import tls_connect
from nstance.testing.procs import http_probe
from nstance.testing.shardproc import (
    ENCRYPTION_KEY_B64,
    LocalCluster,
    instance_state,
    server_addrs,
    shard_config,
)
from nstance.testing.waiting import eventually

pytestmark = pytest.mark.timeout(180)
SHARD = "zone-a"
CLUSTER = "mixed"
FILES = {
    "app.env": {"kind": "env", "template": {"GREETING": "{{ .Vars.greeting }}"}},
    # a workload certificate for a key pair the agent makes on request (a Go server certifies Ed25519 only)
    "tls.crt": {"kind": "certificate", "template": "workload", "key": {"source": "agent", "name": "tls.pub"}},
}
CALL_TIMEOUT = 10.0
CERT = "identity/identity.crt"
KEY = "identity/identity.key"


@dataclass
class Running:
    cluster: LocalCluster
    addrs: dict[str, str]
    root: Path

    def records(self) -> list[dict[str, Any]]:
        store = self.cluster.shard_store(SHARD)
        return [json.loads(store.get(key)[0]) for key in store.list("instance/")]

    def instance_dir(self, instance_id: str) -> Path:
        return self.root / "instances" / instance_id

    def registered(self, *, besides: str = "") -> dict[str, Any] | None:
        """A live instance (other than ``besides``) whose agent registered and stored its certificate."""
        for record in self.records():
            iid = record["instance_id"]
            if iid == besides or record["status"] in ("deleting", "deleted", "failed"):
                continue
            if record.get("registered_at") and (self.instance_dir(iid) / CERT).is_file():
                return record
        return None


def _config(root: Path, addrs: dict[str, str], size: int) -> dict[str, Any]:
    config = shard_config(
        cluster_id=CLUSTER,
        shard=SHARD,
        addrs=addrs,
        provider="local",
        election={"frequent_interval": "200ms", "infrequent_interval": "1s", "leader_timeout": "6s"},
        provider_options={"instances_dir": str(root / "instances"), "stop_instances_on_close": True},
        groups={"web": {"template": "app", "size": size}},
        shard_extra={"health_check_interval": "1s"},
        template_extra={"files": FILES, "vars": {"greeting": "hello"}},
    )
    config["certificates"] = {"workload": {"kind": "client", "cn": "{{ .Instance.ID }}"}}
    return config


@pytest.fixture(autouse=True)
def _agents_report_often(monkeypatch: pytest.MonkeyPatch) -> None:
    """Agents started by the local provider inherit this process's environment."""
    monkeypatch.setenv("NSTANCE_REPORT_INTERVAL", "300ms")


@contextlib.asynccontextmanager
async def _serving(running: Running, *, ca_key_type: str, leaf: str, size: int) -> AsyncIterator[Running]:
    cluster = running.cluster
    cluster.ca_key_type = ca_key_type
    cluster.init()
    cluster.write_config(SHARD, _config(running.root, running.addrs, size))
    options = ServerOptions(
        server_id="s1",
        shard=SHARD,
        storage="file",
        bucket=str(cluster.bucket),
        cachedir=running.root / "cache",
        health_addr=running.addrs["health_addr"],
        environ={"NSTANCE_ENCRYPTION_KEY": ENCRYPTION_KEY_B64, "NSTANCE_REPORT_INTERVAL": "300ms"},
        server_key_type=leaf,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(ServerApp(options).run(stop))

    async def leads() -> bool:  # a standby answers ListGroups but refuses a write (CI saw it once)
        return (await asyncio.to_thread(http_probe, running.addrs["health_addr"], "/leader/health"))[0] == 200

    try:
        await eventually(leads, within=60, what="the server to lead its shard")
        yield running
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0


def _new(tmp_path: Path) -> Running:
    return Running(LocalCluster(tmp_path / "bucket", cluster_id=CLUSTER), server_addrs(), tmp_path)


def _server_leaf(addr: str) -> x509.Certificate | None:
    """The certificate the server presents on ``addr`` (read with OpenSSL), None until it listens."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    tls = tls_connect(addr, ctx, server_name=None, timeout=5)
    if tls is None:
        return None
    with tls:
        der = tls.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der) if der else None


async def _call(fn: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(fn)


async def _value(fn: Callable[[], Any], *, within: float, what: str) -> Any:
    """The first truthy result of ``fn()`` (run in a thread; gRPC errors count as not yet)."""
    found: list[Any] = []

    async def check() -> bool:
        try:
            result = await _call(fn)
        except grpc.RpcError:
            return False
        if result:
            found.append(result)
        return bool(result)

    await eventually(check, within=within, what=what)
    return found[0]


# --- an Ed25519 operator identity on this server -----------------------------------------------------


async def test_an_ed25519_operator_identity_drives_the_operator_api_and_ecdsa_still_works(
    tmp_path: Path,
) -> None:
    running = _new(tmp_path)
    async with _serving(running, ca_key_type="ecdsa-p256", leaf="ecdsa-p256", size=0):
        ca = running.cluster.identity
        assert ca is not None
        go_style = make_identity(
            ca.ca, role="operator", tenant="default", client_id=CLUSTER, key_type="ed25519"
        )
        ours = make_identity(ca.ca, role="operator", tenant="default", client_id=CLUSTER)
        target = running.addrs["operator_addr"]
        with go_style.openssl_channel(target) as channel, ours.channel(target) as native:
            stub = operator_pb2_grpc.OperatorServiceStub(channel)

            reply = await _value(
                lambda: stub.ListGroups(Empty(), timeout=CALL_TIMEOUT),
                within=30,
                what="ListGroups with an Ed25519 identity",
            )
            assert [g.key for g in reply.groups] == ["web"]
            await _call(
                lambda: stub.UpsertGroup(
                    operator_pb2.UpsertGroupRequest(key="web", config=operator_pb2.GroupConfig(size=0)),
                    timeout=CALL_TIMEOUT,
                )
            )
            # The ECDSA P-256 identity on grpcio's own TLS keeps working on the same port.
            native_stub = operator_pb2_grpc.OperatorServiceStub(native)
            reply = await _call(lambda: native_stub.ListGroups(Empty(), timeout=CALL_TIMEOUT))
            assert [g.key for g in reply.groups] == ["web"]
            # grpcio as a client signs with an Ed25519 key when the server asks for it with OpenSSL's
            # list of signature algorithms (grpcio as a server never does): the front accepts it.
            with go_style.channel(target) as grpcio_ed25519:
                ed_stub = operator_pb2_grpc.OperatorServiceStub(grpcio_ed25519)
                reply = await _call(lambda: ed_stub.ListGroups(Empty(), timeout=CALL_TIMEOUT))
            assert [g.key for g in reply.groups] == ["web"]


async def test_nstance_admin_accepts_an_upstream_style_ed25519_identity_directory(tmp_path: Path) -> None:
    running = _new(tmp_path)
    async with _serving(running, ca_key_type="ed25519", leaf="ecdsa-p256", size=0):
        directory = running.cluster.operator_identity(tmp_path / "go-admin", key_type="ed25519")
        key = load_private_key_pem((directory / "identity.key").read_bytes())
        assert isinstance(key, ed25519.Ed25519PrivateKey)
        assert (directory / "identity.key").read_text().startswith("-----BEGIN PRIVATE KEY-----")
        common = ["--servers", f"{SHARD}={running.addrs['operator_addr']}", "--identity-dir", str(directory)]
        env = {"NSTANCE_ADMIN_SERVERS": None, "NSTANCE_ADMIN_IDENTITY_DIR": None, "NSTANCE_ADMIN_SHARD": None}

        def admin(*args: str) -> tuple[int, str, str]:
            result = CliRunner().invoke(admin_app, [*args, *common], env=env)
            return result.exit_code, result.stdout, result.stderr

        def listed() -> str | None:
            code, out, _ = admin("group", "list", "--shard", SHARD, "--output", "json")
            return out if code == 0 else None

        out = await _value(listed, within=30, what="nstance-admin group list")
        assert [g["group"] for g in json.loads(out)] == ["web"]
        code, out, err = await _call(lambda: admin("group", "scale", "web", "0", "--shard", SHARD))
        assert code == 0, err


# --- this agent with an Ed25519 identity, on this server and on one that presents an Ed25519 leaf ----


@pytest.mark.parametrize("leaf", ["ecdsa-p256", "ed25519"])
async def test_an_agent_under_an_ed25519_ca_registers_reports_and_receives_files(
    tmp_path: Path, leaf: str
) -> None:
    running = _new(tmp_path)
    async with _serving(running, ca_key_type="ed25519", leaf=leaf, size=1):
        presented = await _value(lambda: _server_leaf(running.addrs["agent_addr"]), within=30, what="TLS")
        expected = ed25519.Ed25519PublicKey if leaf == "ed25519" else ec.EllipticCurvePublicKey
        assert isinstance(presented.public_key(), expected)
        registration_leaf = await _value(
            lambda: _server_leaf(running.addrs["registration_addr"]), within=30, what="TLS"
        )
        assert isinstance(registration_leaf.public_key(), expected)

        record = await _value(lambda: running.registered(), within=60, what="the agent to register")
        iid = record["instance_id"]
        identity = running.instance_dir(iid) / "identity"
        key = load_private_key_pem((identity / "identity.key").read_bytes())
        assert isinstance(key, ed25519.Ed25519PrivateKey)
        cert = x509.load_pem_x509_certificate((identity / "identity.crt").read_bytes())
        assert isinstance(cert.public_key(), ed25519.Ed25519PublicKey)

        app_env = running.instance_dir(iid) / "recv" / "app.env"

        async def delivered() -> bool:
            return (
                app_env.is_file() and app_env.read_text() == "GREETING=hello"
            )  # as Go writes env files: no final newline

        await eventually(delivered, within=30, what="app.env pushed to the Ed25519 agent")

        # The key pair the server asked for is of the CA's type too, and its certificate arrives.
        tls_crt = running.instance_dir(iid) / "recv" / "tls.crt"
        await eventually(tls_crt.is_file, within=30, what="the workload certificate for the agent's key")
        workload_key = load_private_key_pem((running.instance_dir(iid) / "keys" / "tls.key").read_bytes())
        assert isinstance(workload_key, ed25519.Ed25519PrivateKey)
        assert x509.load_pem_x509_certificate(tls_crt.read_bytes()).public_key() == workload_key.public_key()

        operator = running.cluster.operator_identity(tmp_path / "op", key_type="ed25519")
        with open_channel(running.addrs["operator_addr"], load_identity(operator)) as channel:
            stub = operator_pb2_grpc.OperatorServiceStub(channel)

            def healthy() -> bool:
                return instance_state(stub, iid, timeout=CALL_TIMEOUT) == "healthy"

            await _value(healthy, within=30, what="health reports from the Ed25519 agent")


async def test_an_ed25519_agent_that_stops_reporting_is_replaced(tmp_path: Path) -> None:
    running = _new(tmp_path)
    async with _serving(running, ca_key_type="ed25519", leaf="ecdsa-p256", size=1):
        first = (await _value(lambda: running.registered(), within=60, what="the agent to register"))[
            "instance_id"
        ]
        info = json.loads((running.instance_dir(first) / "instance.json").read_text())
        pid = int(info["pid"])
        os.kill(pid, signal.SIGSTOP)  # the VM runs, its agent says nothing
        try:
            second = await _value(
                lambda: running.registered(besides=first),
                within=60,
                what="a replacement for the silent agent",
            )
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        key = load_private_key_pem(
            (running.instance_dir(second["instance_id"]) / "identity/identity.key").read_bytes()
        )
        assert isinstance(key, ed25519.Ed25519PrivateKey)

        def gone() -> bool:
            return all(
                r["instance_id"] != first or r["status"] in ("deleting", "deleted") for r in running.records()
            )

        await _value(gone, within=60, what="the silent instance to go")
