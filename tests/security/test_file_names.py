"""Path traversal through file and key names, on both ends of the Agent API.

Agent side: a compromised (or buggy) server pushes files and key requests whose names try to escape
the agent's directories (``../x``, ``/etc/passwd``, ``a/../../b``, NUL bytes, backslashes, symlinks,
names too long for the file system). The real agent stream code (``receive_files_once``,
``receive_key_requests_once`` over its own mTLS channel) must refuse each one, write nothing outside
its receive and keys directories, still apply the good files of the same commit, and report the
refused names in its health report. A property test throws arbitrary names at ``FileReceiver``.

Server side: SubmitPublicKeys with a key name that is not a bare file name is INVALID_ARGUMENT, with a
bounded message even for a huge name, and a proper name is accepted.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from unittest import mock

import grpc
import grpc.aio
import pytest
from google.protobuf.empty_pb2 import Empty
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nstance.agent.channels import agent_channel
from nstance.agent.files import Delivery, FileReceiver
from nstance.agent.keys import KeyStore
from nstance.agent.state import AgentState
from nstance.agent.streams import receive_files_once, receive_key_requests_once
from nstance.core import atomicfile
from nstance.core.ids import new_instance_id
from nstance.pki.ca import create_ca
from nstance.pki.keys import generate_private_key, public_key_to_pem
from nstance.rpc import agent_pb2, agent_pb2_grpc
from nstance.server.identity.tls import server_credentials
from nstance.testing.identities import make_identity, real_now_clock
from nstance.testing.securityshard import CALL_TIMEOUT, TENANT_A, SecurityShard

pytestmark = pytest.mark.timeout(60)

#: Names a server might push, each of which must stay out of the file system.
ESCAPING_NAMES = [
    "../outside.txt",
    "../../../../outside.txt",
    "/etc/passwd",
    "/tmp/nstance-security-absolute.txt",
    "a/../../outside.txt",
    "a/..",
    "..",
    ".",
    "./a.txt",
    "a//b.txt",
    "a/",
    "evil\x00.txt",
    "\x00",
    "..\\outside.txt",
    "a\\..\\..\\outside.txt",
    "link/escaped.txt",  # "link" is a symlink to a directory outside
    "x" * 2000,
    "dir/" + "y" * 300,
    ".nstance-tmp-app.env",
    "sub/.nstance-tmp-x",
]
GOOD = {"app/app.env": b"GREETING=hello\n", "ca.crt.txt": b"plain text is fine\n"}
KEY_NAMES = ["../stolen", "/etc/ssh/ssh_host", "a/b", "..", ".hidden/..", "x\x00y", "z" * 300, "good.pub"]


class HostileAgentService(agent_pb2_grpc.AgentServiceServicer):
    """Pushes every escaping name (then the good files and a commit), and asks for hostile key names."""

    def __init__(self) -> None:
        self.submitted: list[list[str]] = []

    async def ReceiveFiles(  # noqa: N802 - name fixed by the proto
        self, request: Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[agent_pb2.FileTransfer]:
        for name in ESCAPING_NAMES:
            yield agent_pb2.FileTransfer(filename=name, content=b"pwned\n", config_hash="h1")
        for name, content in GOOD.items():
            yield agent_pb2.FileTransfer(filename=name, content=content, config_hash="h1")
        yield agent_pb2.FileTransfer(config_hash="h1")  # commit

    async def ReceiveKeyRequests(  # noqa: N802 - name fixed by the proto
        self, request: Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[agent_pb2.KeyGenerationRequest]:
        yield agent_pb2.KeyGenerationRequest(key_names=KEY_NAMES)

    async def SubmitPublicKeys(  # noqa: N802 - name fixed by the proto
        self, request: agent_pb2.PublicKeysRequest, context: grpc.aio.ServicerContext
    ) -> Empty:
        self.submitted.append([key.filename for key in request.keys])
        return Empty()


def tree(root: Path) -> set[str]:
    """Every file and symlink below ``root``, relative to it."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def assert_only_good_files(root: Path, before: set[str]) -> None:
    """Below ``root``: the good files, the keys, config.hash and the completion marker were written,
    nothing else anywhere."""
    assert tree(root) - before == {
        *(f"var/lib/nstance/recv/{name}" for name in GOOD),
        "var/lib/nstance/identity/config.hash",
        "var/lib/nstance/recv/write-files.last",  # the completion marker (upstream's name)
        "var/lib/nstance/keys/good.key",
        "var/lib/nstance/keys/good.pub",
    }
    assert list((root / "outside").iterdir()) == []
    assert not Path("/tmp/nstance-security-absolute.txt").exists()
    # The good files of the commit were applied despite the refused ones.
    assert (root / "var/lib/nstance/identity/config.hash").read_text() == "h1"  # no newline, as upstream


async def test_hostile_file_and_key_names_stay_out_of_the_file_system(tmp_path: Path) -> None:
    clock = real_now_clock()
    ca = create_ca(cluster_id="hostile", clock=clock)
    credentials, _ = server_credentials(ca, hosts=["127.0.0.1"], clock=clock)
    service = HostileAgentService()
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(service, server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()

    home = tmp_path / "var" / "lib" / "nstance"  # deep enough for every "../" to stay inside tmp_path
    recv, keys, config_hash = home / "recv", home / "keys", home / "identity" / "config.hash"
    outside = tmp_path / "outside"
    outside.mkdir()
    recv.mkdir(parents=True)
    (recv / "link").symlink_to(outside, target_is_directory=True)
    before = tree(tmp_path)
    instance_id = str(new_instance_id("app"))
    identity = make_identity(ca, role="agent", tenant=TENANT_A, client_id=instance_id)
    receiver = FileReceiver(recv, config_hash)
    try:
        async with agent_channel(
            f"127.0.0.1:{port}", ca.cert_pem, identity.key_pem, identity.cert_pem
        ) as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            await receive_files_once(stub, receiver, AgentState())
            await receive_key_requests_once(stub, KeyStore(keys), instance_id)
    finally:
        await server.stop(None)

    assert_only_good_files(tmp_path, before)
    statuses = receiver.statuses()
    refused = {name for name in ESCAPING_NAMES if statuses.get(name) and statuses[name].error}
    assert refused == set(ESCAPING_NAMES)  # each one is reported to the server as an error
    assert all(len(statuses[name].error or "") <= 2048 for name in ESCAPING_NAMES)
    assert service.submitted[-1] == ["good"]


#: Pieces that path-traversal names are made of; "link" is a symlink out of the receive directory.
NAME_PIECES = ["a", ".", "..", "/", "\\", "\x00", "é", "link", "b" * 120]
names = st.one_of(st.lists(st.sampled_from(NAME_PIECES), max_size=12).map("".join), st.text(max_size=30))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(names, min_size=1, max_size=4))
def test_no_file_name_writes_outside_the_receive_directory(names: list[str]) -> None:
    # Durability is not the question here: skip fsync, which makes each example slow.
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(atomicfile.os, "fsync", return_value=None):
        root = Path(tmp)
        recv = root / "a" / "b" / "recv"
        recv.mkdir(parents=True)
        (recv / "link").symlink_to(root, target_is_directory=True)
        receiver = FileReceiver(recv, root / "config.hash")
        for name in names:
            receiver.receive(Delivery(name, b"x"))
        receiver.commit("h")
        outside = {p for p in walk(root) if not p.is_relative_to(recv) and p != root / "config.hash"}
        assert outside == {recv.parent, recv.parent.parent}  # the directories above recv, nothing else


def walk(root: Path) -> Iterator[Path]:
    for directory, dirs, files in os.walk(root):  # os.walk does not follow the symlink
        for name in [*dirs, *files]:
            yield Path(directory, name)


# --- the server's side: key names an agent submits --------------------------------------------------


def test_submitted_key_names_must_be_bare_file_names(shard: SecurityShard) -> None:
    instance_id, _ = shard.create_instance(TENANT_A)
    stub = shard.agent(shard.agent_identity(instance_id))
    pem = public_key_to_pem(generate_private_key("ecdsa-p256"))

    def submit(name: str) -> None:
        request = agent_pb2.PublicKeysRequest(
            instance_id=instance_id, keys=[agent_pb2.PublicKeySubmission(filename=name, public_key_pem=pem)]
        )
        stub.SubmitPublicKeys(request, timeout=CALL_TIMEOUT)

    for name in [
        "../kubelet.pub",
        "../../etc/ssh/key.pub",
        "/etc/passwd",
        "a/b.pub",
        "..",
        ".",
        "",
        "a\\b",
        "x\x00y",
    ]:
        with pytest.raises(grpc.RpcError) as info:
            submit(name)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert "must be a bare file name" in (info.value.details() or ""), name
    with pytest.raises(grpc.RpcError) as info:
        submit("../" + "a" * 100_000)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    shard.assert_no_secrets(info.value.details() or "")
    submit("kubelet.pub")  # a proper name is stored
    shard.assert_healthy()
