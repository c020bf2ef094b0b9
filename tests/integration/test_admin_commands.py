"""nstance-admin's shard commands and `cluster register-operator`, as a user runs them.

The cluster is initialised on file:// storage, an operator identity is registered through the CLI,
and the shard commands talk over real mTLS gRPC to in-memory OperatorService test doubles on
127.0.0.1 (server certificates from the same cluster CA, client certificates required).
"""

from __future__ import annotations

import base64
import json
import re
import stat
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google.protobuf.empty_pb2 import Empty
from google.protobuf.timestamp_pb2 import Timestamp
from typer.testing import CliRunner

from nstance.admin.cli import app
from nstance.admin.watch import CLEAR_BELOW, HOME, paint
from nstance.objectstore.file import FileObjectStore
from nstance.objectstore.scoped import ScopedObjectStore
from nstance.pki.ca import CertificateAuthority, create_ca
from nstance.pki.certs import issue_client_certificate, issue_server_certificate
from nstance.pki.keys import load_private_key_pem, private_key_to_pem, public_key_to_pem, public_keys_equal
from nstance.pki.peer import verify_client_certificate
from nstance.rpc import operator_pb2, operator_pb2_grpc
from nstance.secrets.cluster_identity import load_cluster_identity
from nstance.secrets.objectstorage import ObjectStorageSecretStore
from nstance.testing.procs import free_port

KEY = bytes(range(32))
KEY_B64 = base64.b64encode(KEY).decode()
LEADER_MESSAGE = "not the leader; leader is 10.0.0.5:8993"
# Keep the caller's environment out of the CLI's flag defaults.
CLEAN_ENV: dict[str, str | None] = {
    "NSTANCE_ENCRYPTION_KEY": KEY_B64,
    "NSTANCE_ADMIN_SERVERS": None,
    "NSTANCE_ADMIN_IDENTITY_DIR": None,
    "NSTANCE_ADMIN_SHARD": None,
    "NSTANCE_STORAGE": None,
    "NSTANCE_BUCKET": None,
    "NSTANCE_SECRETS_PROVIDER": None,
}


@dataclass
class Result:
    code: int
    out: str
    err: str


def run(*args: str) -> Result:
    result = CliRunner().invoke(app, list(args), env=CLEAN_ENV)
    assert "Traceback" not in result.stderr
    return Result(result.exit_code, result.stdout, result.stderr)


def store_flags(bucket: Path) -> list[str]:
    return ["--storage-provider", "file", "--storage-bucket", str(bucket)]


def cluster_ca(bucket: Path) -> CertificateAuthority:
    cluster = ScopedObjectStore(FileObjectStore(bucket), "cluster/")
    return load_cluster_identity(cluster, ObjectStorageSecretStore(cluster, "secret/", keys=[KEY])).ca


# --- OperatorService test double -------------------------------------------------------------------


@dataclass
class FakeShard(operator_pb2_grpc.OperatorServiceServicer):  # type: ignore[misc]
    """An in-memory OperatorService of one shard."""

    groups: dict[str, operator_pb2.GroupStatus] = field(default_factory=dict)
    instances: dict[str, operator_pb2.InstanceStatusResponse] = field(default_factory=dict)
    upserts: list[operator_pb2.UpsertGroupRequest] = field(default_factory=list)
    creates: list[operator_pb2.CreateInstanceRequest] = field(default_factory=list)
    peers: list[str] = field(default_factory=list)
    standby: bool = False
    etag: str = '"etag-1"'
    static_sizes: dict[str, int] = field(default_factory=dict)
    """Static groups and their config size: DeleteGroup resets them, as the real server does."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _enter(self, context: grpc.ServicerContext) -> None:
        self.peers.extend(i.decode() for i in context.peer_identities() or [])
        if self.standby:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, LEADER_MESSAGE)

    def ListGroups(  # noqa: N802 - name fixed by the proto
        self, request: Empty, context: grpc.ServicerContext
    ) -> operator_pb2.ListGroupsResponse:
        self._enter(context)
        with self.lock:
            return operator_pb2.ListGroupsResponse(groups=list(self.groups.values()))

    def UpsertGroup(  # noqa: N802 - name fixed by the proto
        self, request: operator_pb2.UpsertGroupRequest, context: grpc.ServicerContext
    ) -> operator_pb2.GroupStatus:
        self._enter(context)
        with self.lock:
            self.upserts.append(request)
            old = self.groups.get(request.key)
            cfg = request.config
            status = operator_pb2.GroupStatus(
                key=request.key,
                tenant="default",
                template=cfg.template,
                size=cfg.size,
                instance_type=cfg.instance_type,
                subnet_pool=cfg.subnet_pool,
                vars=dict(cfg.vars),
                etag=f"etag-{request.key}-{cfg.size}",
                actual_size=old.actual_size if old else 0,
                provider_ids=list(old.provider_ids) if old else [],
            )
            self.groups[request.key] = status
            return status

    def DeleteGroup(  # noqa: N802 - name fixed by the proto
        self, request: operator_pb2.DeleteGroupRequest, context: grpc.ServicerContext
    ) -> Empty:
        self._enter(context)
        with self.lock:
            if request.key not in self.groups:
                context.abort(grpc.StatusCode.NOT_FOUND, f"group {request.key!r} not found")
            if request.key in self.static_sizes:
                self.groups[request.key].size = self.static_sizes[request.key]
            else:
                del self.groups[request.key]
        return Empty()

    def CreateInstance(  # noqa: N802 - name fixed by the proto
        self, request: operator_pb2.CreateInstanceRequest, context: grpc.ServicerContext
    ) -> operator_pb2.CreateInstanceResponse:
        self._enter(context)
        self.creates.append(request)
        if request.config.group not in self.groups:
            context.abort(grpc.StatusCode.NOT_FOUND, f"group {request.config.group!r} not found")
        instance_id = request.instance_id or f"tst{len(self.instances):026d}"
        created = Timestamp()
        created.FromDatetime(datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC))
        self.instances[instance_id] = operator_pb2.InstanceStatusResponse(
            instance_id=instance_id, tenant="default", status="pending", created_at=created
        )
        return operator_pb2.CreateInstanceResponse(instance_id=instance_id, status="pending")

    def DeleteInstance(  # noqa: N802 - name fixed by the proto
        self, request: operator_pb2.DeleteInstanceRequest, context: grpc.ServicerContext
    ) -> operator_pb2.DeleteInstanceResponse:
        self._enter(context)
        status = "deleting" if self.instances.pop(request.instance_id, None) else "unknown"
        return operator_pb2.DeleteInstanceResponse(status=status)

    def GetInstanceStatus(  # noqa: N802 - name fixed by the proto
        self, request: operator_pb2.GetInstanceStatusRequest, context: grpc.ServicerContext
    ) -> operator_pb2.InstanceStatusResponse:
        self._enter(context)
        found = self.instances.get(request.instance_id)
        if found is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"instance {request.instance_id} not found")
        return found

    def GetConfigStatus(  # noqa: N802 - name fixed by the proto
        self, request: Empty, context: grpc.ServicerContext
    ) -> operator_pb2.ConfigStatusResponse:
        self._enter(context)
        modified = Timestamp()
        modified.FromDatetime(datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC))
        return operator_pb2.ConfigStatusResponse(etag=self.etag, last_modified=modified, size=1234)

    def RefreshConfig(  # noqa: N802 - name fixed by the proto
        self, request: Empty, context: grpc.ServicerContext
    ) -> operator_pb2.RefreshConfigResponse:
        self._enter(context)
        previous, self.etag = self.etag, '"etag-2"'
        return operator_pb2.RefreshConfigResponse(
            updated=previous != self.etag, prev_etag=previous, etag=self.etag
        )


def start_server(servicer: FakeShard, ca: CertificateAuthority) -> tuple[grpc.Server, int]:
    issued = issue_server_certificate(ca)
    assert issued.key_pem is not None
    credentials = grpc.ssl_server_credentials(
        [(issued.key_pem, issued.cert_pem)], root_certificates=ca.cert_pem, require_client_auth=True
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    operator_pb2_grpc.add_OperatorServiceServicer_to_server(servicer, server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, port


def unused_port() -> int:
    return free_port()


# --- fixtures ------------------------------------------------------------------------------------


@dataclass
class Cluster:
    bucket: Path
    identity: Path
    operator_id: str
    ca: CertificateAuthority


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    base = tmp_path_factory.mktemp("admin")
    bucket = base / "store"
    result = run("cluster", "init", "--cluster-id", "demo", *store_flags(bucket))
    assert result.code == 0, result.err
    # The test doubles serve grpcio's own TLS, which never asks a client for an Ed25519 signature (the
    # real server terminates TLS in OpenSSL), so the shard tests certify an ECDSA P-256 key of their own
    # instead of the Ed25519 key register-operator generates (tests/compat/test_admin_generated_identity.py).
    identity = base / "identity"
    identity.mkdir()
    key = ec.generate_private_key(ec.SECP256R1())
    (identity / "identity.key").write_bytes(private_key_to_pem(key))
    (base / "operator.pub").write_bytes(public_key_to_pem(key))
    result = run(
        "cluster", "register-operator", "--cluster-id", "demo", "--operator-id", "opr-admin-test",
        "--public-key-file", str(base / "operator.pub"), "--output-dir", str(identity), *store_flags(bucket),
    )  # fmt: skip
    assert result.code == 0, result.err
    return Cluster(bucket, identity, "opr-admin-test", cluster_ca(bucket))


@dataclass
class Shards:
    a: FakeShard
    b: FakeShard
    servers: str
    identity: Path

    def run(self, *args: str) -> Result:
        return run(*args, "--servers", self.servers, "--identity-dir", str(self.identity))


@pytest.fixture
def shards(cluster: Cluster) -> Iterator[Shards]:
    a, b = FakeShard(), FakeShard()
    server_a, port_a = start_server(a, cluster.ca)
    server_b, port_b = start_server(b, cluster.ca)
    try:
        yield Shards(a, b, f"a=127.0.0.1:{port_a},b=127.0.0.1:{port_b}", cluster.identity)
    finally:
        server_a.stop(None)
        server_b.stop(None)


def seed_group(shard: FakeShard, key: str = "web", size: int = 2) -> None:
    shard.groups[key] = operator_pb2.GroupStatus(
        key=key,
        tenant="default",
        template="knd",
        size=size,
        instance_type="m7g.large",
        subnet_pool="private",
        vars={"role": "worker", "zone": "a"},
        etag="etag-seeded",
        actual_size=2,
        provider_ids=["i-0aaa", "i-0bbb"],
    )


# --- cluster register-operator ---------------------------------------------------------------------


def test_register_operator_writes_identity_and_record(cluster: Cluster, tmp_path: Path) -> None:
    identity = tmp_path / "new" / "identity"  # missing directories are made 0700, as upstream's admin
    result = run(
        "cluster", "register-operator", "--cluster-id", "demo", "--tenant", "team-gen",
        "--operator-id", "opr-generated", "--output-dir", str(identity), *store_flags(cluster.bucket),
    )  # fmt: skip
    assert result.code == 0, result.err
    assert (identity / "ca.crt").read_bytes() == cluster.ca.cert_pem
    # 0700 directories and 0600 files, as upstream's admin writes them (ca.crt and identity.crt too)
    assert [stat.S_IMODE(d.stat().st_mode) for d in (identity.parent, identity)] == [0o700, 0o700]
    for name in ("ca.crt", "identity.key", "identity.crt"):
        assert stat.S_IMODE((identity / name).stat().st_mode) == 0o600, name
    # Ed25519, as upstream's admin generates: the only key type a Go server and a Go admin accept
    key = load_private_key_pem((identity / "identity.key").read_bytes())
    assert isinstance(key, Ed25519PrivateKey)
    peer = verify_client_certificate((identity / "identity.crt").read_bytes(), cluster.ca)
    assert (peer.client_id, peer.tenant, peer.role) == ("opr-generated", "team-gen", "operator")
    assert public_keys_equal(peer.certificate.public_key(), key)  # type: ignore[arg-type]
    lifetime = peer.not_after - peer.certificate.not_valid_before_utc
    assert 8759 * 3600 < lifetime.total_seconds() <= 8760 * 3600 + 600

    record = json.loads((cluster.bucket / "cluster" / "operator" / "team-gen.demo.json").read_text())
    # the union of upstream's registration and renewal record shapes (docs/files.md)
    assert set(record) == {
        "cluster_id", "client_id", "tenant", "operator_id", "public_key", "public_key_pem",
        "cert_serial", "expires_at", "registered_at", "renewed_at", "type",
    }  # fmt: skip
    assert (record["client_id"], record["public_key_pem"]) == (record["cluster_id"], record["public_key"])
    assert record["type"] == "operator"
    assert record["operator_id"] == "opr-generated"
    assert (record["cluster_id"], record["tenant"]) == ("demo", "team-gen")
    assert record["cert_serial"] == peer.serial
    assert record["public_key"] == public_key_to_pem(key).decode()
    assert record["expires_at"] == peer.not_after.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert datetime.fromisoformat(record["renewed_at"]) <= datetime.now(UTC)


def test_register_operator_default_id_and_given_public_key(cluster: Cluster, tmp_path: Path) -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    pub_file = tmp_path / "op.pub"
    pub_file.write_bytes(public_key_to_pem(private))
    out = tmp_path / "id"
    result = run(
        "cluster", "register-operator", "--cluster-id", "demo", "--tenant", "team-b",
        "--public-key-file", str(pub_file), "--cert-ttl-hours", "24", "--output-dir", str(out),
        *store_flags(cluster.bucket),
    )  # fmt: skip
    assert result.code == 0, result.err
    assert not (out / "identity.key").exists()  # the caller keeps their private key
    assert "put the private key" in result.out
    peer = verify_client_certificate((out / "identity.crt").read_bytes(), cluster.ca)
    assert peer.tenant == "team-b"
    assert peer.client_id.startswith("opr")
    assert len(peer.client_id) == 29
    assert peer.client_id in result.out
    assert public_keys_equal(peer.certificate.public_key(), private)  # type: ignore[arg-type]
    assert (peer.not_after - peer.certificate.not_valid_before_utc).total_seconds() <= 24 * 3600 + 600
    assert (cluster.bucket / "cluster" / "operator" / "team-b.demo.json").is_file()


def test_register_operator_reads_the_cluster_id_from_storage(cluster: Cluster, tmp_path: Path) -> None:
    # from the CA's organization, which `cluster init` wrote
    result = run(
        "cluster", "register-operator", "--tenant", "team-c", "--output-dir", str(tmp_path / "c"),
        *store_flags(cluster.bucket),
    )  # fmt: skip
    assert result.code == 0, result.err
    assert "in cluster demo" in result.out
    assert (cluster.bucket / "cluster" / "operator" / "team-c.demo.json").is_file()


def test_register_operator_reads_the_cluster_id_from_the_shard_configs_when_the_ca_has_none(
    tmp_path: Path,
) -> None:
    # An upstream CA says "Nstance Cluster Unknown"; the shard configs in the bucket name the cluster.
    bucket = tmp_path / "store"
    assert run("cluster", "init", "--cluster-id", "demo", *store_flags(bucket)).code == 0
    cluster_store = ScopedObjectStore(FileObjectStore(bucket), "cluster/")
    secrets = ObjectStorageSecretStore(cluster_store, keys=[KEY])
    upstream_ca = create_ca(key_type="ed25519", private_key=load_private_key_pem(secrets.get("ca.key")))
    cluster_store.put("ca.crt", upstream_ca.cert_pem)
    flags = ("--output-dir", str(tmp_path / "id"), *store_flags(bucket))
    result = run("cluster", "register-operator", *flags)
    assert result.code == 1
    assert "cannot tell the cluster id from storage" in result.err
    (bucket / "shard" / "zone-a").mkdir(parents=True)
    (bucket / "shard" / "zone-a" / "config.jsonc").write_text('// upstream\n{"cluster": {"id": "prod"}}')
    result = run("cluster", "register-operator", *flags)
    assert result.code == 0, result.err
    assert (bucket / "cluster" / "operator" / "default.prod.json").is_file()


def test_register_operator_certifies_an_ed25519_key_as_upstream_admins_hold(
    cluster: Cluster, tmp_path: Path
) -> None:
    private = Ed25519PrivateKey.generate()
    pub_file = tmp_path / "ed.pub"
    pub_file.write_bytes(public_key_to_pem(private.public_key()))
    out = tmp_path / "id"
    result = run(
        "cluster", "register-operator", "--cluster-id", "demo", "--tenant", "team-ed",
        "--public-key-file", str(pub_file), "--output-dir", str(out), *store_flags(cluster.bucket),
    )  # fmt: skip
    assert result.code == 0, result.err
    peer = verify_client_certificate((out / "identity.crt").read_bytes(), cluster.ca)
    assert public_keys_equal(peer.certificate.public_key(), private)  # type: ignore[arg-type]
    assert (cluster.bucket / "cluster" / "operator" / "team-ed.demo.json").is_file()


def test_register_operator_refuses_other_key_types(cluster: Cluster, tmp_path: Path) -> None:
    pub_file = tmp_path / "p384.pub"
    pub_file.write_bytes(public_key_to_pem(ec.generate_private_key(ec.SECP384R1()).public_key()))
    out = tmp_path / "id"
    result = run(
        "cluster", "register-operator", "--cluster-id", "demo", "--tenant", "team-p384",
        "--public-key-file", str(pub_file), "--output-dir", str(out), *store_flags(cluster.bucket),
    )  # fmt: skip
    assert result.code == 1
    assert result.err.startswith("error: ")
    assert "ecdsa-p384" in result.err
    assert not out.exists()
    assert not (cluster.bucket / "cluster" / "operator" / "team-p384.demo.json").exists()


def test_register_operator_keeps_an_existing_identity(cluster: Cluster) -> None:
    before = (cluster.identity / "identity.crt").read_bytes()
    result = run(
        "cluster", "register-operator", "--cluster-id", "demo", "--output-dir", str(cluster.identity),
        *store_flags(cluster.bucket),
    )  # fmt: skip
    assert result.code == 1
    assert "already holds an operator identity" in result.err
    assert "--force" in result.err
    assert (cluster.identity / "identity.crt").read_bytes() == before


def test_register_operator_needs_an_initialised_cluster(tmp_path: Path) -> None:
    result = run(
        "cluster", "register-operator", "--cluster-id", "demo", "--output-dir", str(tmp_path / "id"),
        *store_flags(tmp_path / "empty"),
    )  # fmt: skip
    assert result.code == 1
    assert "cluster init" in result.err
    assert not (tmp_path / "id").exists()


# --- group -----------------------------------------------------------------------------------------


def test_group_create_list_status_delete(shards: Shards, cluster: Cluster) -> None:
    result = shards.run(
        "group", "create", "web", "--template", "knd", "--size", "3", "--instance-type", "m7g.large",
        "--var", "role=worker", "--var", "zone=a", "--shard", "a",
    )  # fmt: skip
    assert result.code == 0, result.err
    assert result.out.splitlines()[0].split() == [
        "SHARD", "GROUP", "SIZE", "ACTUAL", "TEMPLATE", "INSTANCE_TYPE", "STATIC",
    ]  # fmt: skip
    assert result.out.splitlines()[1].split() == ["a", "web", "3", "0", "knd", "m7g.large", "no"]
    sent = shards.a.upserts[-1]
    assert (sent.key, sent.config.template, sent.config.size) == ("web", "knd", 3)
    assert dict(sent.config.vars) == {"role": "worker", "zone": "a"}
    assert not shards.b.upserts
    assert cluster.operator_id in shards.a.peers  # the client certificate was presented

    seed_group(shards.a, "api", size=1)
    result = shards.run("group", "list", "--shard", "a")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert [line.split()[:3] for line in lines[1:]] == [["a", "api", "1"], ["a", "web", "3"]]

    result = shards.run("group", "list", "--shard", "a", "--output", "json")
    assert result.code == 0
    listed = json.loads(result.out)
    assert [g["group"] for g in listed] == ["api", "web"]
    assert listed[0] == {
        "shard": "a", "group": "api", "tenant": "default", "template": "knd", "size": 1, "actual_size": 2,
        "instance_type": "m7g.large", "subnet_pool": "private", "vars": {"role": "worker", "zone": "a"},
        "is_static": False, "etag": "etag-seeded", "provider_ids": ["i-0aaa", "i-0bbb"],
    }  # fmt: skip

    result = shards.run("group", "status", "api", "--shard", "a")
    assert result.code == 0
    assert "subnet pool:" in result.out
    assert "private" in result.out
    assert "role=worker,zone=a" in result.out
    assert "i-0aaa,i-0bbb" in result.out

    result = shards.run("group", "delete", "api", "--shard", "a")
    assert result.code == 0
    assert result.out.splitlines()[1].split() == ["a", "api", "deleted"]
    assert "api" not in shards.a.groups

    result = shards.run("group", "status", "api", "--shard", "a")
    assert result.code == 1
    assert "error: shard a (127.0.0.1:" in result.err
    assert "group 'api' does not exist" in result.err


def test_group_scale_keeps_the_other_settings(shards: Shards) -> None:
    seed_group(shards.a, "web", size=2)
    result = shards.run("group", "scale", "web", "5", "--shard", "a")
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        "SHARD   GROUP   PREVIOUS   SIZE",
        "a       web     2          5",
    ]
    sent = shards.a.upserts[-1]
    assert sent.key == "web"
    assert sent.config.size == 5
    assert (sent.config.template, sent.config.instance_type, sent.config.subnet_pool) == (
        "knd",
        "m7g.large",
        "private",
    )
    assert dict(sent.config.vars) == {"role": "worker", "zone": "a"}


def test_group_delete_of_a_static_group_is_refused_or_reported(shards: Shards) -> None:
    seed_group(shards.a, "app", size=5)
    shards.a.groups["app"].is_static = True
    shards.a.static_sizes["app"] = 1
    result = shards.run("group", "delete", "app", "--shard", "a")
    assert result.code == 1
    assert "group 'app' is static" in result.err
    assert "--reset-static" in result.err
    assert shards.a.groups["app"].size == 5  # nothing was sent

    result = shards.run("group", "delete", "app", "--shard", "a", "--reset-static")
    assert result.code == 0, result.err
    assert "reset to its config (size 5 -> 1)" in result.out
    assert "deleted" not in result.out


def test_group_scale_to_a_negative_size_says_why(shards: Shards) -> None:
    seed_group(shards.a, "app", size=2)
    result = shards.run("group", "scale", "app", "-1", "--shard", "a")
    assert result.code == 1
    assert "SIZE -1: the size must be 0 or more" in result.err
    assert not shards.a.upserts


def test_instance_delete_of_an_unknown_id_fails(shards: Shards) -> None:
    result = shards.run("instance", "delete", "tstnope", "--shard", "b")
    assert result.code == 1
    assert "instance 'tstnope' is not known to this shard" in result.err


def test_group_scale_of_a_missing_group_changes_nothing(shards: Shards) -> None:
    result = shards.run("group", "scale", "nope", "1", "--shard", "b")
    assert result.code == 1
    assert "group 'nope' does not exist" in result.err
    assert not shards.b.upserts


def test_all_shards_continues_past_a_dead_shard(shards: Shards, cluster: Cluster) -> None:
    seed_group(shards.a)
    dead = unused_port()
    servers = f"{shards.servers.split(',')[0]},down=127.0.0.1:{dead}"
    for output in ("table", "json"):
        result = run(
            "group", "list", "--all-shards", "--servers", servers, "--identity-dir", str(cluster.identity),
            "--timeout", "5s", "--output", output,
        )  # fmt: skip
        assert result.code == 1
        if output == "json":
            assert [row["shard"] for row in json.loads(result.out)] == ["a"]
        else:
            assert result.out.splitlines()[1].split()[:2] == ["a", "web"]
        assert f"error: shard down (127.0.0.1:{dead}): UNAVAILABLE" in result.err
        assert "1 of 2 shards failed: down" in result.err

    # The dead shard first: the live one still runs and is printed.
    servers = f"down=127.0.0.1:{dead},{shards.servers.split(',')[0]}"
    result = run(
        "group", "scale", "web", "4", "--all-shards", "--servers", servers,
        "--identity-dir", str(cluster.identity), "--timeout", "5s",
    )  # fmt: skip
    assert result.code == 1
    assert result.out.splitlines()[1].split() == ["a", "web", "2", "4"]
    assert shards.a.groups["web"].size == 4


def test_all_shards_success_prints_every_shard(shards: Shards) -> None:
    seed_group(shards.a)
    seed_group(shards.b, size=7)
    result = shards.run("group", "list", "--all-shards")
    assert result.code == 0, result.err
    assert [line.split()[:3] for line in result.out.splitlines()[1:]] == [
        ["a", "web", "2"],
        ["b", "web", "7"],
    ]
    assert result.err == ""


def test_standby_refusal_names_the_leader(shards: Shards) -> None:
    shards.a.standby = True
    result = shards.run("group", "create", "web", "--template", "knd", "--shard", "a")
    assert result.code == 1
    assert result.out == ""
    assert (
        result.err.strip()
        == f"error: shard a ({shards.servers.split(',')[0][2:]}): FAILED_PRECONDITION: {LEADER_MESSAGE}"
    )


# --- instance ------------------------------------------------------------------------------------


def test_instance_create_show_list_delete(shards: Shards) -> None:
    seed_group(shards.b)
    result = shards.run(
        "instance", "create", "--group", "web", "--instance-id", "tstabc", "--var", "x=1", "--shard", "b"
    )
    assert result.code == 0, result.err
    assert result.out.splitlines()[1].split() == ["b", "tstabc", "pending"]

    result = shards.run("instance", "show", "tstabc", "--shard", "b")
    assert result.code == 0
    assert re.search(r"^provider status:\s+pending$", result.out, re.M), result.out
    assert "2025-01-02T03:04:05Z" in result.out
    result = shards.run("instance", "show", "tstabc", "--shard", "b", "-o", "json")
    shown = json.loads(result.out)
    assert shown == [
        {
            "shard": "b", "instance_id": "tstabc", "tenant": "default", "status": "pending",
            "provider_instance_id": "", "created_at": "2025-01-02T03:04:05Z", "last_seen": None,
        }
    ]  # fmt: skip

    # These test doubles, like upstream's servers, have no ListInstances: the list falls back to the
    # provider IDs of running managed instances, and says so.
    result = shards.run("instance", "list", "--shard", "b", "--group", "web")
    assert result.code == 0
    assert [line.split() for line in result.out.splitlines()] == [
        ["SHARD", "INSTANCE_ID", "GROUP", "STATUS", "ON_DEMAND", "PROVIDER_ID"],
        ["b", "-", "web", "running", "no", "i-0aaa"],
        ["b", "-", "web", "running", "no", "i-0bbb"],
    ]
    assert "shard b has no ListInstances (an upstream server?)" in result.err
    result = shards.run("instance", "list", "--shard", "a")
    assert result.code == 0
    assert result.out.strip() == "no instances"

    result = shards.run("instance", "delete", "tstabc", "--shard", "b", "-o", "json")
    assert json.loads(result.out) == [{"shard": "b", "instance_id": "tstabc", "status": "deleting"}]
    result = shards.run("instance", "show", "tstabc", "--shard", "b")
    assert result.code == 1
    assert "NOT_FOUND: instance tstabc not found" in result.err


def test_instance_create_refuses_one_id_on_every_shard(shards: Shards) -> None:
    result = shards.run("instance", "create", "--group", "web", "--instance-id", "tstabc", "--all-shards")
    assert result.code == 1
    assert "--instance-id" in result.err


# --- config --------------------------------------------------------------------------------------


def test_config_status_and_refresh(shards: Shards) -> None:
    result = shards.run("config", "status", "--all-shards")
    assert result.code == 0, result.err
    assert [line.split() for line in result.out.splitlines()] == [
        ["SHARD", "ETAG", "LAST_MODIFIED", "SIZE"],
        ["a", '"etag-1"', "2025-03-04T05:06:07Z", "1234"],
        ["b", '"etag-1"', "2025-03-04T05:06:07Z", "1234"],
    ]
    result = shards.run("config", "refresh", "--shard", "a")
    assert result.code == 0
    assert result.out.splitlines()[1].split() == ["a", "updated", '"etag-1"', '"etag-2"']
    result = shards.run("config", "refresh", "--shard", "a", "-o", "json")
    assert json.loads(result.out) == [
        {"shard": "a", "updated": False, "result": "unchanged", "prev_etag": '"etag-2"', "etag": '"etag-2"'}
    ]


# --- errors a user makes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--servers", ""], "--servers is required"),
        (["--servers", "a"], "--servers entry 'a': expected SHARD=HOST:PORT"),
        (["--servers", "a=host"], "expected host:port"),
        (["--servers", "a=h:1,a=h:2"], "names shard 'a' twice"),
        (["--servers", "A=h:1"], "shard name 'A'"),
        (["--servers", "a=h:1,b=h:2"], "--shard NAME"),
        (
            ["--servers", "a=h:1,b=h:2", "--shard", "c"],
            "--shard 'c' is not in --servers (known shards: a, b)",
        ),
        (["--servers", "a=h:1", "--shard", "a", "--all-shards"], "exclude each other"),
        (["--servers", "a=h:1", "--timeout", "0s"], "--timeout"),
        (["--servers", "a=h:1", "--output", "yaml"], "--output 'yaml'"),
    ],
)
def test_bad_flags_are_named(cluster: Cluster, args: list[str], message: str) -> None:
    result = run("group", "list", "--identity-dir", str(cluster.identity), *args)
    assert result.code == 1
    assert result.err.startswith("error: ")
    assert message in result.err


def test_bad_var_and_size(cluster: Cluster) -> None:
    flags = ["--servers", "a=h:1", "--identity-dir", str(cluster.identity)]
    result = run("group", "create", "web", "--template", "knd", "--var", "novalue", *flags)
    assert result.code == 1
    assert "--var 'novalue': expected KEY=VALUE" in result.err
    result = run("group", "create", "Web", "--template", "knd", *flags)
    assert result.code == 1
    assert "group 'Web'" in result.err
    result = run("group", "create", "web", "--template", "knd", "--size", "-1", *flags)
    assert result.code == 1
    assert "--size -1" in result.err


def test_missing_identity_says_how_to_get_one(tmp_path: Path) -> None:
    result = run("group", "list", "--servers", "a=127.0.0.1:1", "--identity-dir", str(tmp_path / "none"))
    assert result.code == 1
    assert "missing ca.crt, identity.key, identity.crt" in result.err
    assert "register-operator" in result.err


def test_default_identity_dir_is_under_temp_dir(cluster: Cluster, shards: Shards, tmp_path: Path) -> None:
    temp = tmp_path / "work"
    target = temp / "cli-operator-identity"
    target.mkdir(parents=True)
    for name in ("ca.crt", "identity.key", "identity.crt"):
        (target / name).write_bytes((cluster.identity / name).read_bytes())
    seed_group(shards.a)
    result = run("--temp-dir", str(temp), "group", "list", "--servers", shards.servers, "--shard", "a")
    assert result.code == 0, result.err
    assert "web" in result.out


def test_identity_from_another_ca_is_refused_before_connecting(cluster: Cluster, tmp_path: Path) -> None:
    other = create_ca(cluster_id="other")
    key = ec.generate_private_key(ec.SECP256R1())
    issued = issue_client_certificate(
        other, key.public_key(), client_id="opr-x", tenant="default", role="operator"
    )
    (tmp_path / "ca.crt").write_bytes(cluster.ca.cert_pem)
    (tmp_path / "identity.key").write_bytes(private_key_to_pem(key))
    (tmp_path / "identity.crt").write_bytes(issued.cert_pem)
    result = run("group", "list", "--servers", "a=127.0.0.1:1", "--identity-dir", str(tmp_path))
    assert result.code == 1
    assert "is unusable" in result.err
    assert "not issued by this cluster's CA" in result.err


def test_server_from_another_ca_fails_the_handshake(cluster: Cluster) -> None:
    other = create_ca(cluster_id="other")
    fake = FakeShard()
    server, port = start_server(fake, other)
    try:
        result = run(
            "group", "list", "--servers", f"x=127.0.0.1:{port}", "--identity-dir", str(cluster.identity),
            "--timeout", "5s",
        )  # fmt: skip
    finally:
        server.stop(None)
    assert result.code == 1
    assert f"error: shard x (127.0.0.1:{port}): UNAVAILABLE" in result.err
    assert not fake.peers


def test_env_vars_supply_servers_identity_and_shard(cluster: Cluster, shards: Shards) -> None:
    seed_group(shards.b, size=9)
    env: dict[str, Any] = {
        **CLEAN_ENV,
        "NSTANCE_ADMIN_SERVERS": shards.servers,
        "NSTANCE_ADMIN_IDENTITY_DIR": str(cluster.identity),
        "NSTANCE_ADMIN_SHARD": "b",
    }
    result = CliRunner().invoke(app, ["group", "list"], env=env)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[1].split()[:3] == ["b", "web", "9"]


def test_shard_options_work_on_their_group_and_after_its_commands(shards: Shards, tmp_path: Path) -> None:
    # upstream declares --servers, --identity-dir, --shard, --all-shards and --timeout persistent on
    # `group` and `config` (cobra): accepted on the group and after any of its commands
    seed_group(shards.a, size=4)
    seed_group(shards.b, size=6)
    where = ["--servers", shards.servers, "--identity-dir", str(shards.identity)]
    result = run("group", *where, "--shard", "a", "list")
    assert result.code == 0, result.err
    assert result.out.splitlines()[1].split()[:3] == ["a", "web", "4"]
    result = run("group", *where, "--shard", "a", "list", "--shard", "b")  # the later value wins
    assert result.out.splitlines()[1].split()[:3] == ["b", "web", "6"]
    result = run("group", "--servers", shards.servers, "scale", "web", "5", "--shard", "b",
                 "--identity-dir", str(shards.identity), "--timeout", "10s")  # fmt: skip
    assert result.code == 0, result.err
    assert shards.b.groups["web"].size == 5
    result = run("config", *where, "--all-shards", "status", "-o", "json")
    assert result.code == 0, result.err
    assert [row["shard"] for row in json.loads(result.out)] == ["a", "b"]
    result = run("instance", *where, "list", "--shard", "a")
    assert result.code == 0, result.err
    assert "i-0aaa" in result.out

    # the root's --temp-dir (where the default identity is) and -v after a subcommand
    temp = tmp_path / "work"
    (temp / "cli-operator-identity").mkdir(parents=True)
    for name in ("ca.crt", "identity.key", "identity.crt"):
        (temp / "cli-operator-identity" / name).write_bytes((shards.identity / name).read_bytes())
    result = run("group", "list", "--servers", shards.servers, "--shard", "a", "--temp-dir", str(temp), "-v")
    assert result.code == 0, result.err
    assert "web" in result.out


def test_options_before_the_command_that_takes_them_as_upstreams_e2e_script_runs_them(shards: Shards) -> None:
    # upstream's scripts/test-e2e-admin.sh runs `nstance-admin --servers S --identity-dir D group ...`:
    # cobra finds a command's options anywhere on the line, before its name too
    seed_group(shards.a, size=4)
    seed_group(shards.b, size=6)
    where = ["--servers", shards.servers, "--identity-dir", str(shards.identity)]
    result = run(*where, "group", "list", "--all-shards")
    assert result.code == 0, result.err
    assert [line.split()[:3] for line in result.out.splitlines()[1:]] == [
        ["a", "web", "4"],
        ["b", "web", "6"],
    ]
    result = run(*where, "group", "scale", "web", "0", "--all-shards")
    assert result.code == 0, result.err
    assert (shards.a.groups["web"].size, shards.b.groups["web"].size) == (0, 0)
    result = run(f"--servers={shards.servers}", "-v", "--identity-dir", str(shards.identity), "group", "list")
    assert result.code != 0
    assert "--shard" in result.err  # the options reached `group list`, which asks for a shard
    result = run("--no-such-option", "group", "list")
    assert result.code == 2
    assert "No such option: --no-such-option" in result.err


def test_var_is_comma_separated_as_upstreams_string_slice(shards: Shards) -> None:
    # upstream's --var is a pflag StringSlice: each value is a CSV record of KEY=VALUE items
    result = shards.run(
        "group", "create", "web", "--template", "knd", "--shard", "a",
        "--var", "role=worker,zone=a", "--var", '"motd=hello, world","quote=say ""hi"""', "--var", "x=1",
    )  # fmt: skip
    assert result.code == 0, result.err
    assert dict(shards.a.upserts[-1].config.vars) == {
        "role": "worker", "zone": "a", "motd": "hello, world", "quote": 'say "hi"', "x": "1",
    }  # fmt: skip
    result = shards.run("instance", "create", "--group", "web", "--shard", "a", "--var", "a=1,b=2")
    assert result.code == 0, result.err
    assert dict(shards.a.creates[-1].config.vars) == {"a": "1", "b": "2"}

    for bad, message in [
        ("a=1,b", "--var 'b': expected KEY=VALUE"),
        ("a=1,a=2", "--var 'a' is given twice"),
        ('k=say "hi"', 'bare " in unquoted item'),
        ('"k=1', 'no closing "'),
    ]:
        result = shards.run("group", "create", "web", "--template", "knd", "--shard", "a", "--var", bad)
        assert result.code == 1, bad
        assert result.err.startswith("error: ")
        assert message in result.err


def test_help_lists_the_new_commands() -> None:
    result = run("--help")
    assert "group" in result.out
    assert "instance" in result.out
    result = run("cluster", "--help")
    assert "register-operator" in result.out
    result = run("config", "--help")
    assert "status" in result.out
    assert "refresh" in result.out
    result = run("instance", "list", "--help")
    assert "managed and on-demand - with their instance IDs" in " ".join(result.out.split())


# --- watch (the live view) -----------------------------------------------------------------------


def _local_instance(directory: Path, instance_id: str, group: str, status: str = "running") -> None:
    (directory / instance_id).mkdir(parents=True)
    meta = {
        "instance_id": instance_id,
        "group": group,
        "status": status,
        "provider_id": f"local-{instance_id}",
    }
    (directory / instance_id / "instance.json").write_text(json.dumps(meta))


def test_watch_once_shows_groups_and_every_local_instance(shards: Shards, tmp_path: Path) -> None:
    seed_group(shards.a, "app", size=2)
    seen = Timestamp()
    seen.FromDatetime(datetime.now(UTC))
    shards.a.instances["app01"] = operator_pb2.InstanceStatusResponse(
        instance_id="app01", status="healthy", last_seen=seen
    )
    shards.a.instances["app02"] = operator_pb2.InstanceStatusResponse(
        instance_id="app02", status="registered"
    )
    local = tmp_path / "instances"
    _local_instance(local, "app01", "app")
    _local_instance(local, "app02", "app")
    _local_instance(local, "app03", "app")  # created by the provider, not yet known to the server
    _local_instance(local, "app04", "app", status="deleted")  # a tombstone: not shown
    result = shards.run("watch", "--once", "--shard", "a", "--instances-dir", str(local), "--title", "T")
    assert result.code == 0, result.err
    lines = [line.split() for line in result.out.splitlines()]
    assert ["a", "app", "2", "2", "dynamic"] in lines
    rows = {line[2]: line[3:] for line in lines if len(line) >= 4 and line[2].startswith("app0")}
    assert rows["app01"][0] == "healthy"
    assert rows["app01"][1].endswith("s")  # "0s ago"
    assert rows["app02"] == ["registered", "-"]
    assert rows["app03"] == ["starting", "-"]
    assert "app04" not in rows
    assert "\033" not in result.out  # no terminal, no escape codes


def test_watch_without_a_server_says_so(cluster: Cluster) -> None:
    result = run(
        "watch",
        "--once",
        "--servers",
        f"x=127.0.0.1:{unused_port()}",
        "--identity-dir",
        str(cluster.identity),
    )
    assert result.code == 1
    assert "UNAVAILABLE" in result.out
    assert "is nstance-server running there?" in result.out


def test_watch_refuses_a_bad_interval(cluster: Cluster) -> None:
    result = run("watch", "--interval", "0s", "--servers", "x=h:1", "--identity-dir", str(cluster.identity))
    assert result.code == 1
    assert "--interval '0s' must be a positive duration" in result.err


def test_watch_frames_overwrite_in_place() -> None:
    frame = paint(["title", "row 1"], terminal=True)
    assert frame.startswith(HOME)
    assert "\033[2J" not in frame  # never clears the whole screen (that is what flickers)
    assert frame.endswith(CLEAR_BELOW)
    assert frame.count("\033[K") == 2
