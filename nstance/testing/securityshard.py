"""The target of the security suite: a real ``nstance-server`` process with two tenants.

The server runs the sim provider on loopback ports with real TLS and mTLS, in a cluster whose CA,
registration-nonce key and encryption key the tests hold (``SecurityShard.identity``), so they can
forge what an attacker could and sign what only the cluster could. Two tenants share the shard:

* ``acme`` (tenant A): groups ``web`` and ``needy``;
* ``globex`` (tenant B): groups ``secret``, ``web`` (the same name as A's) and ``secret-needy``.

``needy`` and ``secret-needy`` use a template whose userdata needs an image no lookup resolves, so
scaling one up makes the reconciler publish an error event for that tenant (error events carry no
tenant, hence the distinct names). ``assert_healthy`` is the check every attack
batch ends with, and ``assert_no_secrets`` the check every error message a client receives must pass.
Nothing in the product imports this module.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from cryptography.hazmat.primitives import serialization
from google.protobuf.empty_pb2 import Empty

from nstance.core.ids import parse_puid
from nstance.pki.nonce import NonceClaims, agent_nonce_claims, sign_nonce
from nstance.rpc import agent_pb2_grpc, operator_pb2, operator_pb2_grpc, registration_pb2_grpc
from nstance.secrets.cluster_identity import ClusterIdentity
from nstance.testing.identities import SERVER_NAME_OPTIONS, ClientIdentity, make_identity
from nstance.testing.jwtforge import b64url
from nstance.testing.shardproc import (
    ENCRYPTION_KEY,
    ENCRYPTION_KEY_B64,
    LocalCluster,
    ServerProcess,
    server_addrs,
    shard_config,
    start_leader,
)

CLUSTER = "test"
SHARD = "zone-a"
TENANT_A = "acme"
TENANT_B = "globex"
CALL_TIMEOUT = 10.0
#: Longest error message the server sends (``nstance.server.identity.interceptors.MAX_DETAILS_BYTES``).
MAX_DETAILS_BYTES = 2048

_ELECTION = {"frequent_interval": "500ms", "infrequent_interval": "2s", "leader_timeout": "30s"}
_APP = {"template": "app", "size": 0}
_NEEDY = {"template": "needy", "size": 0}


class SecurityShard:
    """The running server, the cluster's secrets, and clients for each tenant and port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cluster = LocalCluster(root / "bucket", cluster_id=CLUSTER)
        self.identity: ClusterIdentity = self.cluster.init()
        self.addrs = server_addrs()
        config = shard_config(
            cluster_id=CLUSTER,
            shard=SHARD,
            addrs=self.addrs,
            provider_options={"latency": "2ms"},
            # One server, never replaced: a long lease keeps it leading while attack batches and a
            # busy machine starve it for a moment (the test default lets leadership lapse after 0.5 s).
            election=_ELECTION,
        )
        # The default registration_timeout (5 minutes) is also the lifetime of the nonces handed out.
        config["shard"]["garbage_collection"] = {"interval": "1s"}
        config["templates"]["needy"] = {
            **config["templates"]["app"],
            "userdata": {"content": "#!/bin/sh\n# {{ .Image.needed }}\n"},
        }
        config["groups"] = {
            TENANT_A: {"web": _APP, "needy": _NEEDY},
            TENANT_B: {"secret": _APP, "web": _APP, "secret-needy": _NEEDY},
        }
        self.cluster.write_config(SHARD, config)
        self.operators = {
            tenant: make_identity(self.identity.ca, role="operator", tenant=tenant, client_id=CLUSTER)
            for tenant in (TENANT_A, TENANT_B)
        }
        self._stubs: dict[str, operator_pb2_grpc.OperatorServiceStub] = {}
        self._channels: list[grpc.Channel] = []
        self.process: ServerProcess = start_leader(self.cluster, root / "server", shard=SHARD)

    # --- clients ---------------------------------------------------------------------------------

    def operator(self, tenant: str = TENANT_A) -> operator_pb2_grpc.OperatorServiceStub:
        """A blocking OperatorService stub with ``tenant``'s operator certificate."""
        if tenant not in self._stubs:
            channel = self.operators[tenant].channel(self.addrs["operator_addr"])
            self._channels.append(channel)
            self._stubs[tenant] = operator_pb2_grpc.OperatorServiceStub(channel)
        return self._stubs[tenant]

    def agent(self, identity: ClientIdentity) -> agent_pb2_grpc.AgentServiceStub:
        """A blocking AgentService stub with ``identity``."""
        channel = identity.channel(self.addrs["agent_addr"])
        self._channels.append(channel)
        return agent_pb2_grpc.AgentServiceStub(channel)

    def agent_identity(self, instance_id: str, tenant: str = TENANT_A) -> ClientIdentity:
        """An agent certificate for ``instance_id``, as registration would issue it."""
        return make_identity(self.identity.ca, role="agent", tenant=tenant, client_id=instance_id)

    def registration_channel(self) -> grpc.aio.Channel:
        """The registration port: server-authenticated TLS, no client certificate."""
        credentials = grpc.ssl_channel_credentials(root_certificates=self.identity.ca.cert_pem)
        return grpc.aio.secure_channel(
            self.addrs["registration_addr"], credentials, options=SERVER_NAME_OPTIONS
        )

    @staticmethod
    def registration(channel: grpc.aio.Channel) -> registration_pb2_grpc.RegistrationServiceStub:
        return registration_pb2_grpc.RegistrationServiceStub(channel)

    # --- instances and nonces ----------------------------------------------------------------------

    def create_instance(self, tenant: str = TENANT_A, group: str = "web") -> tuple[str, str]:
        """An on-demand instance of ``tenant``; returns its id and the nonce the server gave it."""
        response = self.operator(tenant).CreateInstance(
            operator_pb2.CreateInstanceRequest(config=operator_pb2.InstanceConfig(group=group)),
            timeout=CALL_TIMEOUT,
        )
        return response.instance_id, str(self.record(tenant, response.instance_id)["registration_jwt"])

    def record(self, tenant: str, instance_id: str) -> dict[str, Any]:
        """The instance record in object storage (``instance/{tenant}.{uuid}-{kind}.json``)."""
        key = f"instance/{tenant}.{parse_puid(instance_id).storage_key}.json"
        doc: dict[str, Any] = json.loads(self.cluster.shard_store(SHARD).get(key)[0])
        return doc

    def agent_claims(self, instance_id: str, tenant: str = TENANT_A, **changes: Any) -> NonceClaims:
        """Claims of an agent nonce for ``instance_id`` as the server writes them, with ``changes``."""
        claims = agent_nonce_claims(
            instance_id=instance_id, cluster_id=CLUSTER, shard=SHARD, group="web", tenant=tenant
        )
        return dataclasses.replace(claims, **changes)

    def sign(self, claims: NonceClaims) -> str:
        """Sign ``claims`` with the cluster's registration key (what only the cluster can do)."""
        return sign_nonce(self.identity.nonce_key, claims)

    # --- what must never leak, and what must always work ------------------------------------------

    def secret_spellings(self) -> list[str]:
        """The spellings of the cluster's private key material that no message may contain."""
        raw = [
            self.identity.nonce_key.private_bytes(
                serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
            ),
            self.identity.ca.private_key.private_bytes(
                serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
            ENCRYPTION_KEY,
        ]
        spellings = [ENCRYPTION_KEY_B64, "PRIVATE KEY"]
        for data in raw:
            spellings += [data.hex(), b64url(data)[-24:], base64.b64encode(data).decode()[-24:]]
        return spellings

    def assert_no_secrets(self, text: str) -> None:
        """``text`` (an error message) holds no key material, no traceback and no unbounded echo."""
        for spelling in self.secret_spellings():
            assert spelling not in text, f"secret material in {text[:200]!r}"
        assert "Traceback" not in text, text[:500]
        assert len(text.encode()) <= MAX_DETAILS_BYTES, f"a {len(text)}-character message"

    def assert_healthy(self) -> None:
        """The process runs, /health says it leads, and tenant A's operator can list its groups."""
        assert self.process.proc is not None
        assert self.process.proc.poll() is None, f"the server exited; log:\n{self.process.log()}"
        health = self.process.http("/health")
        assert health == (200, "ok: leader\n"), f"/health answered {health}; log:\n{self.process.log()}"
        groups = self.operator(TENANT_A).ListGroups(Empty(), timeout=CALL_TIMEOUT).groups
        assert {g.key for g in groups} >= {"web", "needy"}, groups

    def internal_errors(self) -> list[dict[str, Any]]:
        """Log entries of calls the server answered with INTERNAL (none may exist)."""
        return [e for e in self.process.log_entries() if "internal error" in str(e.get("msg", ""))]

    def stop(self) -> int:
        """Close the clients and stop the server; returns its exit status."""
        for channel in self._channels:
            channel.close()
        return self.process.stop()
