"""nstance-admin's connection to shard servers' Operator API: addresses, identity, channels, errors.

* ``parse_servers`` reads ``--servers "shard1=host:port,shard2=host:port"`` (env
  ``NSTANCE_ADMIN_SERVERS``) and ``select_shards`` turns ``--shard X`` / ``--all-shards`` into the
  list of shards to call, with errors that name the flag and the known shards.
* ``load_identity`` reads the operator identity directory (``ca.crt``, ``identity.key``,
  ``identity.crt``, as ``cluster register-operator`` here or upstream's admin writes it; the key
  may be ECDSA P-256 or Ed25519) and checks it before any connection:
  the certificate must be an unexpired operator certificate issued by that CA for that key, so a
  broken identity is reported in words rather than as a TLS handshake failure.
* ``open_channel`` opens a synchronous mTLS ``grpc.secure_channel``; server certificates carry the
  DNS SAN ``nstance-server`` (and localhost/127.0.0.1), so the channel verifies that name whatever
  address it dials.
* ``ShardClient`` wraps one shard's ``OperatorServiceStub`` with a per-call timeout;
  ``describe_rpc_error`` turns a ``grpc.RpcError`` into one line (status code name and the server's
  details, e.g. a standby's FAILED_PRECONDITION naming the leader's address).
* ``run_on_shards`` calls a function against each selected shard in order, one at a time, and keeps
  going after a failure; callers exit non-zero when any shard failed.

This module does no printing and no exit-code policy (that is ``output`` and ``shardcalls``), and
never writes the identity: it only reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import grpc
from google.protobuf.empty_pb2 import Empty

from nstance.core.clock import Clock
from nstance.core.errors import FailedPrecondition, InvalidArgument, NotFound, NstanceError, Unauthenticated
from nstance.core.ids import identifier_problem
from nstance.pki.ca import parse_certificate
from nstance.pki.keys import load_private_key_pem, public_keys_equal, require_public_key
from nstance.pki.peer import verify_client_certificate
from nstance.pki.tlsclient import forwarded_channel, needs_openssl
from nstance.rpc import operator_pb2, operator_pb2_grpc

SERVERS_ENV = "NSTANCE_ADMIN_SERVERS"
IDENTITY_DIR_ENV = "NSTANCE_ADMIN_IDENTITY_DIR"
SHARD_ENV = "NSTANCE_ADMIN_SHARD"
IDENTITY_DIR_NAME = "cli-operator-identity"
CA_FILE = "ca.crt"
KEY_FILE = "identity.key"
CERT_FILE = "identity.crt"
SERVER_NAME = "nstance-server"
NO_SERVER_HINT = (
    f"is nstance-server running there? (`make run` starts a local one; check --servers or {SERVERS_ENV})"
)
DEFAULT_TIMEOUT_SECONDS = 30.0
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
LIST_PAGE_SIZE = 2000
"""Instances asked for per ListInstances call (about 180 KB per answer)."""

T = TypeVar("T")


# --- addresses -----------------------------------------------------------------------------------


def _target_problem(target: str) -> str | None:
    host, sep, port = target.rpartition(":")
    if not sep or not host:
        return "expected host:port"
    if host.startswith("[") != host.endswith("]"):
        return "an IPv6 address must be written in brackets, e.g. [::1]:8993"
    if not host.startswith("[") and ":" in host:
        return "an IPv6 address must be written in brackets, e.g. [::1]:8993"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"port {port!r} is not a number between 1 and 65535"
    return None


def parse_servers(text: str) -> dict[str, str]:
    """Parse ``shard1=host:port,shard2=host:port`` into ``{shard: target}`` in the order given.

    Raise InvalidArgument naming the entry that is wrong: empty list, missing ``=``, invalid shard
    name, a shard named twice, or an address that is not ``host:port``.
    """
    entries = [part.strip() for part in text.split(",")]
    if not any(entries):
        raise InvalidArgument(
            f'--servers is required (or set {SERVERS_ENV}), e.g. "shard1=10.0.0.5:8993,shard2=10.0.1.5:8993"'
        )
    servers: dict[str, str] = {}
    for entry in entries:
        if not entry:
            continue
        shard, sep, target = (p.strip() for p in entry.partition("="))
        if not sep:
            raise InvalidArgument(f"--servers entry {entry!r}: expected SHARD=HOST:PORT")
        problem = identifier_problem(shard)
        if problem:
            raise InvalidArgument(f"--servers entry {entry!r}: shard name {shard!r} {problem}")
        if shard in servers:
            raise InvalidArgument(f"--servers names shard {shard!r} twice")
        problem = _target_problem(target)
        if problem:
            raise InvalidArgument(f"--servers entry {entry!r}: address {target!r}: {problem}")
        servers[shard] = target
    return servers


def select_shards(servers: Mapping[str, str], shard: str | None, all_shards: bool) -> list[str]:
    """The shards a command runs against: ``--shard X``, every shard (``--all-shards``), or the only one.

    With neither flag and exactly one server configured, that server's shard is used.
    """
    known = ", ".join(servers) or "none"
    if shard and all_shards:
        raise InvalidArgument("--shard and --all-shards exclude each other; give one of them")
    if all_shards:
        return list(servers)
    if shard:
        if shard not in servers:
            raise InvalidArgument(f"--shard {shard!r} is not in --servers (known shards: {known})")
        return [shard]
    if len(servers) == 1:
        return list(servers)
    raise InvalidArgument(
        f"choose a shard with --shard NAME (or set {SHARD_ENV}) or use --all-shards (known shards: {known})"
    )


# --- identity ------------------------------------------------------------------------------------


def default_identity_dir(temp_dir: Path) -> Path:
    """``<temp-dir>/cli-operator-identity``: where ``cluster register-operator`` writes by default."""
    return temp_dir / IDENTITY_DIR_NAME


@dataclass(frozen=True, slots=True)
class OperatorIdentity:
    """The PEM files of an operator identity and what its certificate says."""

    directory: Path
    ca_pem: bytes
    key_pem: bytes
    cert_pem: bytes
    client_id: str
    tenant: str
    serial: str


def load_identity(directory: Path, *, clock: Clock | None = None) -> OperatorIdentity:
    """Read and check ``ca.crt``, ``identity.key`` and ``identity.crt`` in ``directory``.

    Raise FailedPrecondition saying which file is missing or what is wrong with the identity.
    """
    missing = [name for name in (CA_FILE, KEY_FILE, CERT_FILE) if not (directory / name).is_file()]
    if missing:
        raise FailedPrecondition(
            f"no usable operator identity in {directory} (missing {', '.join(missing)}); create one with "
            f"`nstance-admin cluster register-operator`, or point --identity-dir / {IDENTITY_DIR_ENV} at it"
        )
    try:
        ca_pem = (directory / CA_FILE).read_bytes()
        key_pem = (directory / KEY_FILE).read_bytes()
        cert_pem = (directory / CERT_FILE).read_bytes()
    except OSError as exc:
        raise FailedPrecondition(f"cannot read the operator identity in {directory}: {exc}") from exc
    try:
        ca_cert = parse_certificate(ca_pem, what=f"{directory / CA_FILE}")
        key = load_private_key_pem(key_pem, what=f"{directory / KEY_FILE}")
        peer = verify_client_certificate(cert_pem, ca_cert, clock=clock)
        cert_key = require_public_key(
            peer.certificate.public_key(), what=f"the key in {directory / CERT_FILE}"
        )
    except (InvalidArgument, Unauthenticated) as exc:
        raise FailedPrecondition(f"operator identity in {directory} is unusable: {exc}") from exc
    if peer.role != "operator":
        raise FailedPrecondition(
            f"{directory / CERT_FILE} is an {peer.role} certificate; an operator certificate is required"
        )
    if not public_keys_equal(cert_key, key):
        raise FailedPrecondition(
            f"{directory / KEY_FILE} does not belong to {directory / CERT_FILE} (different public keys)"
        )
    return OperatorIdentity(
        directory=directory,
        ca_pem=ca_pem,
        key_pem=key_pem,
        cert_pem=cert_pem,
        client_id=peer.client_id,
        tenant=peer.tenant,
        serial=peer.serial,
    )


# --- channels and errors ---------------------------------------------------------------------------


def open_channel(target: str, identity: OperatorIdentity) -> grpc.Channel:
    """A synchronous mTLS channel to ``target`` that verifies the server as ``nstance-server``.

    An Ed25519 cluster CA (whose upstream servers present Ed25519 certificates) needs OpenSSL TLS
    (``pki.tlsclient``); otherwise grpcio's TLS, which also signs with an Ed25519 identity key
    (upstream's admin writes one) when the server offers Ed25519, as OpenSSL servers do.
    """
    options = [
        ("grpc.ssl_target_name_override", SERVER_NAME),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]
    if needs_openssl(identity.ca_pem):
        return forwarded_channel(
            target, identity.ca_pem, identity.key_pem, identity.cert_pem, options=options
        )
    credentials = grpc.ssl_channel_credentials(
        root_certificates=identity.ca_pem,
        private_key=identity.key_pem,
        certificate_chain=identity.cert_pem,
    )
    return grpc.secure_channel(target, credentials, options=options)


def describe_rpc_error(exc: grpc.RpcError, *, timeout: float | None = None) -> str:
    """One line: the status code name and the server's details, e.g.
    ``FAILED_PRECONDITION: this server is a standby ...; the shard leader is at 10.0.0.5:8993``."""
    code_fn = getattr(exc, "code", None)
    details_fn = getattr(exc, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = details_fn() if callable(details_fn) else None
    name = getattr(code, "name", None) or "UNKNOWN"
    text = " ".join(str(details).split()) if details else ""
    if name == "DEADLINE_EXCEEDED" and timeout is not None:
        text = f"no answer within {timeout:g}s" + (f" ({text})" if text else "")
    if name == "UNAVAILABLE" and ("Connection refused" in text or "failed to connect" in text):
        text += f"; {NO_SERVER_HINT}"
    return f"{name}: {text}" if text else name


class ShardClient:
    """The Operator API of one shard, every call bounded by ``timeout`` seconds."""

    def __init__(self, shard: str, target: str, channel: grpc.Channel, timeout: float) -> None:
        self.shard = shard
        self.target = target
        self.timeout = timeout
        self._stub = operator_pb2_grpc.OperatorServiceStub(channel)

    def list_groups(self) -> list[operator_pb2.GroupStatus]:
        response: operator_pb2.ListGroupsResponse = self._stub.ListGroups(Empty(), timeout=self.timeout)
        return list(response.groups)

    def get_group(self, key: str) -> operator_pb2.GroupStatus:
        """The group ``key`` from ListGroups; NotFound when this shard has no such group."""
        for group in self.list_groups():
            if group.key == key:
                return group
        raise NotFound(f"group {key!r} does not exist on this shard")

    def upsert_group(self, key: str, config: operator_pb2.GroupConfig) -> operator_pb2.GroupStatus:
        request = operator_pb2.UpsertGroupRequest(key=key, config=config)
        result: operator_pb2.GroupStatus = self._stub.UpsertGroup(request, timeout=self.timeout)
        return result

    def delete_group(self, key: str) -> None:
        self._stub.DeleteGroup(operator_pb2.DeleteGroupRequest(key=key), timeout=self.timeout)

    def create_instance(
        self, config: operator_pb2.InstanceConfig, instance_id: str = ""
    ) -> operator_pb2.CreateInstanceResponse:
        request = operator_pb2.CreateInstanceRequest(instance_id=instance_id, config=config)
        result: operator_pb2.CreateInstanceResponse = self._stub.CreateInstance(request, timeout=self.timeout)
        return result

    def delete_instance(self, instance_id: str) -> operator_pb2.DeleteInstanceResponse:
        request = operator_pb2.DeleteInstanceRequest(instance_id=instance_id)
        result: operator_pb2.DeleteInstanceResponse = self._stub.DeleteInstance(request, timeout=self.timeout)
        return result

    def list_instances(
        self, group: str = "", *, limit: int | None = None
    ) -> list[operator_pb2.InstanceSummary]:
        """ListInstances (this implementation's addition; an upstream server answers UNIMPLEMENTED),
        page by page (``LIST_PAGE_SIZE``): a large shard's instances do not fit in one message. A server
        from before pages answers everything at once, without a token. With ``limit``, only the oldest
        ``limit`` instances are asked for."""
        found: list[operator_pb2.InstanceSummary] = []
        token = ""
        while True:
            page_size = LIST_PAGE_SIZE if limit is None else max(1, min(LIST_PAGE_SIZE, limit - len(found)))
            request = operator_pb2.ListInstancesRequest(group=group, page_size=page_size, page_token=token)
            response: operator_pb2.ListInstancesResponse = self._stub.ListInstances(
                request, timeout=self.timeout
            )
            found.extend(response.instances)
            token = response.next_page_token
            if limit is not None and len(found) >= limit:
                return found[:limit]
            if not token:
                return found

    def get_instance_status(self, instance_id: str) -> operator_pb2.InstanceStatusResponse:
        request = operator_pb2.GetInstanceStatusRequest(instance_id=instance_id)
        result: operator_pb2.InstanceStatusResponse = self._stub.GetInstanceStatus(
            request, timeout=self.timeout
        )
        return result

    def get_instance_statuses(
        self, instance_ids: Sequence[str]
    ) -> dict[str, operator_pb2.InstanceStatusResponse | str]:
        """GetInstanceStatus for every id at once over this one channel; an error becomes its one line."""
        futures = {
            instance_id: self._stub.GetInstanceStatus.future(
                operator_pb2.GetInstanceStatusRequest(instance_id=instance_id), timeout=self.timeout
            )
            for instance_id in instance_ids
        }
        out: dict[str, operator_pb2.InstanceStatusResponse | str] = {}
        for instance_id, future in futures.items():
            try:
                out[instance_id] = future.result()
            except grpc.RpcError as exc:
                out[instance_id] = describe_rpc_error(exc, timeout=self.timeout)
        return out

    def get_config_status(self) -> operator_pb2.ConfigStatusResponse:
        result: operator_pb2.ConfigStatusResponse = self._stub.GetConfigStatus(Empty(), timeout=self.timeout)
        return result

    def refresh_config(self) -> operator_pb2.RefreshConfigResponse:
        result: operator_pb2.RefreshConfigResponse = self._stub.RefreshConfig(Empty(), timeout=self.timeout)
        return result


# --- running against shards ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShardOutcome(Generic[T]):
    """What one shard returned, or the one-line reason it failed (``error``)."""

    shard: str
    target: str
    value: T | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def run_on_shards(
    servers: Mapping[str, str],
    shards: Sequence[str],
    identity: OperatorIdentity,
    action: Callable[[ShardClient], T],
    *,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    channel_factory: Callable[[str, OperatorIdentity], grpc.Channel] = open_channel,
) -> list[ShardOutcome[T]]:
    """Run ``action`` against each shard in turn; a failure is recorded and the next shard still runs.

    gRPC errors and domain errors (NstanceError, e.g. NotFound from ``get_group``) become the
    outcome's ``error``; anything else is a bug and propagates.
    """
    outcomes: list[ShardOutcome[T]] = []
    for shard in shards:
        target = servers[shard]
        channel = channel_factory(target, identity)
        try:
            value = action(ShardClient(shard, target, channel, timeout))
        except grpc.RpcError as exc:
            outcomes.append(ShardOutcome(shard, target, error=describe_rpc_error(exc, timeout=timeout)))
        except NstanceError as exc:
            outcomes.append(ShardOutcome(shard, target, error=str(exc)))
        else:
            outcomes.append(ShardOutcome(shard, target, value=value))
        finally:
            channel.close()
    return outcomes
