"""Test and benchmark helpers: a cluster on file:// storage, shard configs, server processes.

``LocalCluster`` initialises a cluster directory (CA, nonce key, encryption key), writes shard configs,
and issues operator identities in the layout ``nstance-admin`` reads; given a ``store`` (an S3 bucket on
``moto_server``, say) it does the same there. ``ServerProcess`` runs a real ``nstance-server`` process
(``python -m nstance.server``, ``--storage file`` or ``s3``) on loopback ports and waits on its health
endpoint. Used by the integration tests and ``bench/``; nothing here is used by the server itself.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from nstance.objectstore.base import ObjectStore
from nstance.objectstore.file import FileObjectStore
from nstance.objectstore.scoped import ScopedObjectStore
from nstance.pki.certs import issue_client_certificate
from nstance.pki.keys import generate_private_key, private_key_to_pem
from nstance.rpc import agent_pb2_grpc, operator_pb2, operator_pb2_grpc
from nstance.secrets.cluster_identity import ClusterIdentity, ensure_cluster_identity
from nstance.secrets.objectstorage import ObjectStorageSecretStore
from nstance.testing.procs import free_port as free_port  # re-exported for tests
from nstance.testing.procs import http_probe, log_tail, log_text, spawn_logged, stop_process, wait_for_ok

ENCRYPTION_KEY = bytes(range(32))
ENCRYPTION_KEY_B64 = base64.b64encode(ENCRYPTION_KEY).decode("ascii")
ADDR_NAMES = ("health_addr", "election_addr", "registration_addr", "operator_addr", "agent_addr")


def server_addrs() -> dict[str, str]:
    """Five distinct loopback listener addresses for one server."""
    return {name: f"127.0.0.1:{free_port()}" for name in ADDR_NAMES}


def shard_config(
    *,
    cluster_id: str = "test",
    shard: str = "zone-a",
    addrs: Mapping[str, str],
    provider: str = "sim",
    provider_options: Mapping[str, Any] | None = None,
    groups: Mapping[str, Mapping[str, Any]] | None = None,
    election: Mapping[str, str] | None = None,
    shard_extra: Mapping[str, Any] | None = None,
    template_extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A complete config.jsonc document (as a dict) for tests: one template ``app`` of kind ``app``.

    ``shard_extra`` and ``template_extra`` are merged into the shard section and the template.
    """
    shard_doc: dict[str, Any] = {
        "id": shard,
        "infra": {
            "provider": provider,
            "region": "test",
            "zone": shard,
            "options": dict(provider_options or {}),
        },
        "bind": dict(addrs),
        "advertise": dict(addrs),
        "subnet_pools": {"default": ["net-1"]},
        "default_drain_timeout": "0s",
        "leader_election": dict(
            election or {"frequent_interval": "200ms", "infrequent_interval": "1s", "leader_timeout": "1s"}
        ),
        "garbage_collection": {"interval": "1s", "registration_timeout": "1h"},
        "shutdown_timeout": "5s",
    }
    shard_doc.update(shard_extra or {})
    return {
        "cluster": {
            "id": cluster_id,
            "secrets": {
                "provider": "object-storage",
                "encryption_key": {"provider": "env", "source": "NSTANCE_ENCRYPTION_KEY"},
            },
            "leader_election": shard_doc["leader_election"],
        },
        "shard": shard_doc,
        "templates": {
            "app": {
                "kind": "app",
                "arch": "amd64",
                "subnet_pool": "default",
                "userdata": {"content": "#!/bin/sh\n# {{ .Instance.ID }}\n"},
                **dict(template_extra or {}),
            }
        },
        "groups": {
            "default": {k: dict(v) for k, v in (groups or {"web": {"template": "app", "size": 0}}).items()}
        },
    }


@dataclass
class LocalCluster:
    """A cluster whose object storage is the directory ``bucket``, or ``store`` when one is given."""

    bucket: Path
    cluster_id: str = "test"
    identity: ClusterIdentity | None = None
    store: ObjectStore | None = None
    #: Key type of a CA this cluster creates (``ed25519``: a cluster created by upstream's servers).
    ca_key_type: str = "ecdsa-p256"

    def __post_init__(self) -> None:
        self.root: ObjectStore
        if self.store is not None:
            self.root = self.store
        else:
            self.bucket.mkdir(parents=True, exist_ok=True)
            self.root = FileObjectStore(self.bucket)
        self.cluster = ScopedObjectStore(self.root, "cluster/")

    def init(self) -> ClusterIdentity:
        """Create (or load) the CA and nonce key."""
        secrets = ObjectStorageSecretStore(self.cluster, "secret/", keys=[ENCRYPTION_KEY])
        self.identity = ensure_cluster_identity(
            self.cluster, secrets, cluster_id=self.cluster_id, key_type=self.ca_key_type
        ).identity
        return self.identity

    def shard_store(self, shard: str) -> ScopedObjectStore:
        return ScopedObjectStore(self.root, f"shard/{shard}/")

    def write_config(self, shard: str, config: Mapping[str, Any]) -> None:
        self.shard_store(shard).put("config.jsonc", json.dumps(config, indent=2).encode("utf-8"))

    def client_identity(
        self, directory: Path, *, client_id: str, tenant: str, role: str, key_type: str = "ecdsa-p256"
    ) -> Path:
        """Write ca.crt, identity.key, identity.crt for a client of ``role`` into ``directory``."""
        identity = self.identity or self.init()
        key = generate_private_key(key_type)
        issued = issue_client_certificate(
            identity.ca, key.public_key(), client_id=client_id, tenant=tenant, role=role
        )
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "ca.crt").write_bytes(identity.ca.cert_pem)
        (directory / "identity.key").write_bytes(private_key_to_pem(key))
        (directory / "identity.crt").write_bytes(issued.cert_pem)
        os.chmod(directory / "identity.key", 0o600)
        return directory

    def operator_identity(
        self, directory: Path, *, tenant: str = "default", key_type: str = "ecdsa-p256"
    ) -> Path:
        """An operator identity of ``tenant`` (CN = cluster id) in ``directory``."""
        return self.client_identity(
            directory, client_id=self.cluster_id, tenant=tenant, role="operator", key_type=key_type
        )

    def agent_identity(self, directory: Path, instance_id: str, *, tenant: str = "default") -> Path:
        """An agent identity for ``instance_id`` in ``directory``, as registration would issue it."""
        return self.client_identity(directory, client_id=instance_id, tenant=tenant, role="agent")

    @staticmethod
    def channel(directory: Path, target: str) -> grpc.Channel:
        """A synchronous mTLS channel with the identity in ``directory``."""
        credentials = grpc.ssl_channel_credentials(
            root_certificates=(directory / "ca.crt").read_bytes(),
            private_key=(directory / "identity.key").read_bytes(),
            certificate_chain=(directory / "identity.crt").read_bytes(),
        )
        return grpc.secure_channel(
            target, credentials, options=[("grpc.ssl_target_name_override", "nstance-server")]
        )

    def operator_stub(self, directory: Path, target: str) -> operator_pb2_grpc.OperatorServiceStub:
        """A synchronous OperatorService stub over mTLS with the identity in ``directory``."""
        return operator_pb2_grpc.OperatorServiceStub(self.channel(directory, target))

    def agent_stub(self, directory: Path, target: str) -> agent_pb2_grpc.AgentServiceStub:
        """A synchronous AgentService stub over mTLS with the identity in ``directory``."""
        return agent_pb2_grpc.AgentServiceStub(self.channel(directory, target))


def instance_state(
    stub: operator_pb2_grpc.OperatorServiceStub, instance_id: str, timeout: float = 10.0
) -> str:
    """The instance's word in ListInstances (``registered``, ``healthy``, ``draining``...); "gone"
    when it is not listed. GetInstanceStatus answers with the provider's word (``running``) instead."""
    reply = stub.ListInstances(operator_pb2.ListInstancesRequest(), timeout=timeout)
    return next((str(i.status) for i in reply.instances if i.instance_id == instance_id), "gone")


@dataclass
class ServerProcess:
    """One ``nstance-server`` child process; ``NSTANCE_SERVER_ID`` in its environment is ``server_id``.

    ``storage`` is ``file`` (``bucket`` is a directory) or ``s3`` (``bucket`` is the bucket name; the
    endpoint and credentials come from ``env``, e.g. ``AWS_ENDPOINT_URL``).
    """

    server_id: str
    shard: str
    bucket: Path | str
    cachedir: Path
    health_addr: str
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    storage: str = "file"
    #: Put before the server's command line, e.g. ``["prlimit", "--nofile=1024:1024"]``.
    launcher: list[str] = field(default_factory=list)

    def start(self) -> ServerProcess:
        env = {
            **os.environ,
            "NSTANCE_ENCRYPTION_KEY": ENCRYPTION_KEY_B64,
            "NSTANCE_SERVER_ID": self.server_id,
            **self.env,
        }
        log_path = self.log_path or self.cachedir.with_suffix(".log")
        self.log_path = log_path
        argv = [
            *self.launcher,
            sys.executable,
            "-m",
            "nstance.server",
            "--id",
            self.server_id,
            "--shard",
            self.shard,
            "--storage",
            self.storage,
            "--bucket",
            str(self.bucket),
            "--cachedir",
            str(self.cachedir),
            "--health-addr",
            self.health_addr,
            *self.args,
        ]
        self.proc = spawn_logged(argv, env, log_path)
        return self

    def http(self, path: str) -> tuple[int, str]:
        """GET ``path`` on the health endpoint: (status, body); (0, error) if unreachable."""
        return http_probe(self.health_addr, path)

    def wait_healthy(self, timeout: float = 60.0) -> str:
        """Wait until /health answers 200; return its body. The bound only catches a hang: on a busy
        2-core machine a server's start (imports, cache migration) has taken over 20 s."""
        return wait_for_ok(
            lambda: self.http("/health"),
            self.proc,
            what=f"server {self.server_id}",
            state="healthy",
            log=self.log,
            timeout=timeout,
            interval=0.05,
        )

    def is_leader(self) -> bool:
        return self.http("/leader/health")[0] == 200

    def log(self) -> str:
        """The log's last 8000 characters, for failure messages; ``log_text`` is all of it."""
        return log_tail(self.log_path, 8000)

    def log_text(self) -> str:
        """The whole log so far (what a test asserts on: a line may have scrolled out of ``log``)."""
        return log_text(self.log_path)

    def log_entries(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far."""
        out: list[dict[str, Any]] = []
        if self.log_path is None or not self.log_path.exists():
            return out
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Send ``sig`` and wait for the exit status."""
        return stop_process(self.proc, sig, timeout)

    def kill(self) -> int:
        return self.stop(signal.SIGKILL)


def start_leader(
    cluster: LocalCluster,
    root: Path,
    *,
    shard: str = "zone-a",
    env: Mapping[str, str] | None = None,
    timeout: float = 20.0,
) -> ServerProcess:
    """Start one server of ``shard`` on ``cluster`` (cache and log under ``root``) and wait until it leads."""
    process = ServerProcess(
        server_id="s1",
        shard=shard,
        bucket=cluster.bucket,
        cachedir=root / "cache",
        health_addr=f"127.0.0.1:{free_port()}",
        log_path=root / "server.log",
        env=dict(env or {}),
    ).start()
    try:
        process.wait_healthy()
        deadline = time.monotonic() + timeout
        while not process.is_leader():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server of shard {shard} did not lead within {timeout:g}s")
            time.sleep(0.05)
    except BaseException:
        process.stop()  # a server that never became healthy or leader must not outlive the test
        raise
    return process
