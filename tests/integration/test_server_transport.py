"""The shard server's transport, over real sockets: mTLS credentials, the auth/error interceptor, and
the HTTP health/metrics endpoint, as an operator, an agent or a load balancer sees them."""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import socket
import warnings
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from datetime import timedelta

import grpc
import grpc.aio
import pytest
from cryptography import x509
from google.protobuf.empty_pb2 import Empty

from nstance.core.clock import ManualClock
from nstance.core.errors import FailedPrecondition, NotFound
from nstance.pki.ca import CertificateAuthority, create_ca
from nstance.rpc import operator_pb2, operator_pb2_grpc
from nstance.server.identity.interceptors import ServerInterceptor, code_for, current_peer
from nstance.server.identity.tls import advertised_hosts, server_credentials
from nstance.server.net import http as health_http
from nstance.server.net.http import HealthServer
from nstance.server.state.metrics import Metrics
from nstance.testing.identities import ClientIdentity as Identity
from nstance.testing.identities import make_identity, real_now_clock
from nstance.testing.waiting import eventually

OPERATOR = "nstance.v1.OperatorService"
SERVER_NAME = "nstance-server"
CALL_TIMEOUT = 5.0


# --- PKI fixtures (real time: grpc's TLS checks validity against the real clock) -----------------


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return create_ca(cluster_id="transport-test", clock=real_now_clock())


@pytest.fixture(scope="module")
def other_ca() -> CertificateAuthority:
    return create_ca(cluster_id="someone-else", clock=real_now_clock())


# --- the server under test --------------------------------------------------------------------------


class DemoOperatorServicer(operator_pb2_grpc.OperatorServiceServicer):
    """A few OperatorService methods, each showing one interceptor behaviour."""

    async def ListGroups(  # noqa: N802 - name fixed by the proto
        self, request: Empty, context: grpc.aio.ServicerContext
    ) -> operator_pb2.ListGroupsResponse:
        peer = current_peer()
        group = operator_pb2.GroupStatus(key=f"group-of-{peer.tenant}", tenant=peer.tenant)
        return operator_pb2.ListGroupsResponse(groups=[group])

    async def GetConfigStatus(  # noqa: N802 - name fixed by the proto
        self, request: Empty, context: grpc.aio.ServicerContext
    ) -> operator_pb2.ConfigStatusResponse:
        raise FailedPrecondition("config not loaded yet: shard/s1/config.jsonc does not exist")

    async def DeleteGroup(  # noqa: N802 - name fixed by the proto
        self, request: operator_pb2.DeleteGroupRequest, context: grpc.aio.ServicerContext
    ) -> Empty:
        raise RuntimeError("database password hunter2 rejected")

    async def GetInstanceStatus(  # noqa: N802 - name fixed by the proto
        self, request: operator_pb2.GetInstanceStatusRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.InstanceStatusResponse:
        # A handler that sets its own status is left alone.
        await context.abort(grpc.StatusCode.OUT_OF_RANGE, "handler chose this status")
        raise AssertionError("unreachable")

    async def WatchGroups(  # noqa: N802 - name fixed by the proto
        self, request: Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[operator_pb2.GroupEvent]:
        tenant = current_peer().tenant
        yield operator_pb2.GroupEvent(
            type=operator_pb2.GroupEvent.TYPE_UPSERT, group=operator_pb2.GroupStatus(key="web", tenant=tenant)
        )
        raise NotFound("tenant acme has no more groups to watch")


@dataclass
class Running:
    port: int
    metrics: Metrics
    clock: ManualClock
    revoked: set[str] = field(default_factory=set)
    certificate: x509.Certificate | None = None

    def channel(self, identity: Identity, server_name: str = SERVER_NAME) -> grpc.aio.Channel:
        return grpc.aio.secure_channel(
            f"127.0.0.1:{self.port}",
            identity.credentials(),
            options=[("grpc.ssl_target_name_override", server_name)],
        )

    def rpc_count(self, method: str, code: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "nstance_rpc_total", {"method": f"{OPERATOR}/{method}", "code": code}
        )
        return value or 0.0


@pytest.fixture
async def server(ca: CertificateAuthority) -> AsyncIterator[Running]:
    metrics = Metrics()
    clock = real_now_clock()
    running = Running(port=0, metrics=metrics, clock=clock)
    interceptor = ServerInterceptor(
        ca=lambda: ca, clock=clock, is_revoked=lambda serial: serial in running.revoked, metrics=metrics
    )
    srv = grpc.aio.server(interceptors=[interceptor])
    # The stubs declare every method abstract; the rest answer UNIMPLEMENTED at run time (tested below).
    servicer = DemoOperatorServicer()  # type: ignore[abstract]
    operator_pb2_grpc.add_OperatorServiceServicer_to_server(servicer, srv)
    credentials, issued = server_credentials(
        ca, hosts=advertised_hosts(["0.0.0.0:8993", "shard-a.internal:8993"]), clock=clock
    )
    running.port = srv.add_secure_port("127.0.0.1:0", credentials)
    running.certificate = issued.certificate
    await srv.start()
    try:
        yield running
    finally:
        await srv.stop(None)


async def list_groups(running: Running, identity: Identity, server_name: str = SERVER_NAME) -> list[str]:
    async with running.channel(identity, server_name) as channel:
        stub = operator_pb2_grpc.OperatorServiceStub(channel)
        response = await stub.ListGroups(Empty(), timeout=CALL_TIMEOUT)
    return [f"{g.tenant}/{g.key}" for g in response.groups]


async def collect_until_error(call: grpc.aio.UnaryStreamCall, received: list[str]) -> None:
    async for event in call:
        received.append(f"{event.group.tenant}/{event.group.key}")


async def counted(server: Running, method: str, code: str, *, expect: float = 1) -> float:
    """The server's call count for (method, code), waiting up to 5 s for it to reach ``expect``.

    The interceptor counts a call as it unwinds, which can be just after the client saw the status.
    """
    await eventually(
        lambda: server.rpc_count(method, code) >= expect,
        within=5,
        what=lambda: f"{expect:g} {method} {code} counted (have {server.rpc_count(method, code):g})",
    )
    return server.rpc_count(method, code)


async def rpc_error(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


# --- TLS and identity -------------------------------------------------------------------------------


async def test_operator_certificate_is_accepted_and_its_tenant_reaches_the_handler(
    server: Running, ca: CertificateAuthority
) -> None:
    acme = make_identity(ca, role="operator", tenant="acme")
    globex = make_identity(ca, role="operator", tenant="globex")
    assert await list_groups(server, acme) == ["acme/group-of-acme"]
    assert await list_groups(server, globex) == ["globex/group-of-globex"]
    assert await counted(server, "ListGroups", "OK", expect=2) == 2


async def test_server_certificate_names_the_advertised_hosts(
    server: Running, ca: CertificateAuthority
) -> None:
    identity = make_identity(ca, role="operator", tenant="acme")
    # A client dialing the advertised DNS name verifies the server under that name ...
    assert await list_groups(server, identity, server_name="shard-a.internal") == ["acme/group-of-acme"]
    # ... but a name the certificate does not carry fails the handshake.
    async with server.channel(identity, "evil.example") as channel:
        stub = operator_pb2_grpc.OperatorServiceStub(channel)
        err = await rpc_error(stub.ListGroups(Empty(), timeout=CALL_TIMEOUT))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert server.certificate is not None
    sans = server.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "shard-a.internal" in sans.get_values_for_type(x509.DNSName)
    assert ipaddress.ip_address("0.0.0.0") not in sans.get_values_for_type(x509.IPAddress)


async def test_agent_certificate_may_not_call_the_operator_api(
    server: Running, ca: CertificateAuthority
) -> None:
    agent = make_identity(ca, role="agent", tenant="acme")
    async with server.channel(agent) as channel:
        err = await rpc_error(operator_pb2_grpc.OperatorServiceStub(channel).ListGroups(Empty()))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "role 'operator' required" in (err.details() or "")
    assert await counted(server, "ListGroups", "PERMISSION_DENIED") == 1


async def test_certificate_from_another_ca_fails_the_handshake(
    server: Running, ca: CertificateAuthority, other_ca: CertificateAuthority
) -> None:
    stranger = make_identity(other_ca, role="operator", tenant="acme", trust=ca)
    async with server.channel(stranger) as channel:
        err = await rpc_error(
            operator_pb2_grpc.OperatorServiceStub(channel).ListGroups(Empty(), timeout=CALL_TIMEOUT)
        )
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert server.rpc_count("ListGroups", "OK") == 0


async def test_revoked_serial_is_refused(server: Running, ca: CertificateAuthority) -> None:
    identity = make_identity(ca, role="operator", tenant="acme")
    assert await list_groups(server, identity) == ["acme/group-of-acme"]
    server.revoked.add(identity.serial)
    async with server.channel(identity) as channel:
        err = await rpc_error(operator_pb2_grpc.OperatorServiceStub(channel).ListGroups(Empty()))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert err.details() == f"certificate serial {identity.serial} has been revoked"


async def test_expiry_is_judged_by_the_injected_clock(server: Running, ca: CertificateAuthority) -> None:
    identity = make_identity(ca, role="operator", tenant="acme", ttl=timedelta(hours=1))
    assert await list_groups(server, identity) == ["acme/group-of-acme"]
    server.clock.advance(timedelta(hours=2))
    async with server.channel(identity) as channel:
        err = await rpc_error(operator_pb2_grpc.OperatorServiceStub(channel).ListGroups(Empty()))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "expired" in (err.details() or "")


# --- error mapping ----------------------------------------------------------------------------------


async def test_domain_error_maps_to_its_status_with_its_message(
    server: Running, ca: CertificateAuthority
) -> None:
    identity = make_identity(ca, role="operator", tenant="acme")
    async with server.channel(identity) as channel:
        err = await rpc_error(operator_pb2_grpc.OperatorServiceStub(channel).GetConfigStatus(Empty()))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.details() == "config not loaded yet: shard/s1/config.jsonc does not exist"
    assert await counted(server, "GetConfigStatus", "FAILED_PRECONDITION") == 1


async def test_unexpected_error_is_internal_with_a_ref_and_no_leak(
    server: Running, ca: CertificateAuthority, caplog: pytest.LogCaptureFixture
) -> None:
    identity = make_identity(ca, role="operator", tenant="acme")
    with caplog.at_level(logging.ERROR, logger="nstance.server.identity.interceptors"):
        async with server.channel(identity) as channel:
            stub = operator_pb2_grpc.OperatorServiceStub(channel)
            err = await rpc_error(stub.DeleteGroup(operator_pb2.DeleteGroupRequest(key="web")))
    assert err.code() == grpc.StatusCode.INTERNAL
    details = err.details() or ""
    assert details.startswith("internal error (ref ")
    assert details.endswith("); see the server log")
    assert "hunter2" not in details
    assert "RuntimeError" not in details
    ref = details.removeprefix("internal error (ref ").partition(")")[0]
    assert len(ref) == 8
    logged = [r for r in caplog.records if ref in r.getMessage()]
    assert len(logged) == 1
    assert logged[0].exc_info is not None
    assert "hunter2" in str(logged[0].exc_info[1])
    assert await counted(server, "DeleteGroup", "INTERNAL") == 1


async def test_unimplemented_method_stays_unimplemented(server: Running, ca: CertificateAuthority) -> None:
    identity = make_identity(ca, role="operator", tenant="acme")
    async with server.channel(identity) as channel:
        err = await rpc_error(operator_pb2_grpc.OperatorServiceStub(channel).RefreshConfig(Empty()))
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "RefreshConfig" in (err.details() or "")


async def test_handler_abort_keeps_its_own_status(server: Running, ca: CertificateAuthority) -> None:
    identity = make_identity(ca, role="operator", tenant="acme")
    request = operator_pb2.GetInstanceStatusRequest(instance_id="knd-1")
    async with server.channel(identity) as channel:
        err = await rpc_error(operator_pb2_grpc.OperatorServiceStub(channel).GetInstanceStatus(request))
    assert err.code() == grpc.StatusCode.OUT_OF_RANGE
    assert err.details() == "handler chose this status"
    assert await counted(server, "GetInstanceStatus", "OUT_OF_RANGE") == 1


async def test_streaming_error_is_mapped_after_the_events_already_sent(
    server: Running, ca: CertificateAuthority
) -> None:
    identity = make_identity(ca, role="operator", tenant="acme")
    received: list[str] = []
    async with server.channel(identity) as channel:
        call = operator_pb2_grpc.OperatorServiceStub(channel).WatchGroups(Empty(), timeout=CALL_TIMEOUT)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect_until_error(call, received)
    assert received == ["acme/web"]
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == "tenant acme has no more groups to watch"
    assert await counted(server, "WatchGroups", "NOT_FOUND") == 1


async def test_streaming_call_checks_the_role_too(server: Running, ca: CertificateAuthority) -> None:
    agent = make_identity(ca, role="agent", tenant="acme")
    received: list[str] = []
    async with server.channel(agent) as channel:
        call = operator_pb2_grpc.OperatorServiceStub(channel).WatchGroups(Empty(), timeout=CALL_TIMEOUT)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect_until_error(call, received)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert received == []


def test_code_for_follows_the_class_hierarchy() -> None:
    from nstance.providers.base import InstanceNotFound, ProviderThrottled

    assert code_for(InstanceNotFound("x")) == grpc.StatusCode.NOT_FOUND
    assert code_for(ProviderThrottled("x")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert code_for(KeyError("x")) == grpc.StatusCode.INTERNAL
    assert code_for(asyncio.CancelledError()) == grpc.StatusCode.CANCELLED


def test_advertised_hosts_strip_ports_brackets_and_wildcards() -> None:
    assert advertised_hosts(
        [
            "0.0.0.0:8993",
            "[::]:8994",
            ":8990",
            "[fd00::5]:8993",
            "shard-a.internal:8993",
            "shard-a.internal:8994",
            "10.0.0.5",
            "*:1",
        ]
    ) == ["fd00::5", "shard-a.internal", "10.0.0.5"]


# --- HTTP health and metrics ------------------------------------------------------------------------


@dataclass
class FakeSource:
    error: str | None = None
    leader: bool = True
    address: str = "10.0.0.5:8993"
    waiting: str | None = None
    network: str = ""
    degraded_reason: str | None = None

    def config_error(self) -> str | None:
        return self.error

    def degraded(self) -> str | None:
        return self.degraded_reason

    def starting(self) -> str | None:
        return self.waiting

    def is_leader(self) -> bool:
        return self.leader

    def leader_address(self) -> str:
        return self.address

    def leader_network_status(self) -> str:
        return self.network


@dataclass
class HttpFixture:
    port: int
    source: FakeSource
    metrics: Metrics


@pytest.fixture
async def health() -> AsyncIterator[HttpFixture]:
    source, metrics = FakeSource(), Metrics()
    srv = HealthServer(source, metrics)
    port = await srv.start("127.0.0.1", 0)
    try:
        yield HttpFixture(port, source, metrics)
    finally:
        await srv.close()


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


async def send(port: int, raw: bytes, *, close_write: bool = True) -> Response:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        if close_write:
            writer.write_eof()
        data = await asyncio.wait_for(reader.read(), CALL_TIMEOUT)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    return Response(int(status_line.split(" ")[1]), headers, body)


async def get(port: int, path: str, method: str = "GET") -> Response:
    return await send(port, f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())


async def test_health_reports_leader_and_standby_once_config_is_loaded(health: HttpFixture) -> None:
    for path in ("/health", "/", "/health?verbose=1"):
        response = await get(health.port, path)
        assert (response.status, response.body) == (200, b"ok: leader\n")
    assert response.headers["connection"] == "close"
    leader = await get(health.port, "/leader/health")
    assert (leader.status, leader.body) == (200, b"leader\n")
    health.source.network = "10.0.0.10 ready"
    leader = await get(health.port, "/leader/health")
    assert (leader.status, leader.body) == (200, b"leader\nleader network: 10.0.0.10 ready\n")

    health.source.leader = False
    standby = await get(health.port, "/health")
    assert (standby.status, standby.body) == (200, b"ok: standby (leader: 10.0.0.5:8993)\n")
    leader = await get(health.port, "/leader/health")
    assert (leader.status, leader.body) == (503, b"standby; leader: 10.0.0.5:8993\n")


async def test_a_degraded_server_stays_alive_and_says_why(health: HttpFixture) -> None:
    health.source.degraded_reason = "config: keeping the last good config: shard/s1/groups.jsonc is empty"
    response = await get(health.port, "/health")
    assert response.status == 200  # alive: a load balancer or supervisor must not kill it
    assert (
        response.body
        == b"degraded: leader; config: keeping the last good config: shard/s1/groups.jsonc is empty\n"
    )
    assert response.headers["x-nstance-health"] == "degraded"
    leader = await get(health.port, "/leader/health")
    assert (leader.status, leader.body) == (
        200,
        b"leader\ndegraded: config: keeping the last good config: shard/s1/groups.jsonc is empty\n",
    )
    health.source.leader = False
    standby = await get(health.port, "/health")
    assert standby.body.startswith(b"degraded: standby (leader: 10.0.0.5:8993); config: ")
    assert (await get(health.port, "/leader/health")).status == 503
    health.source.degraded_reason = None
    healthy = await get(health.port, "/health")
    assert (healthy.body, healthy.headers.get("x-nstance-health")) == (
        b"ok: standby (leader: 10.0.0.5:8993)\n",
        None,
    )


async def test_health_endpoint_closes_connections_beyond_its_cap() -> None:
    srv = HealthServer(FakeSource(), Metrics(), max_connections=2)
    port = await srv.start("127.0.0.1", 0)
    idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            answer = await asyncio.wait_for(reader.read(), CALL_TIMEOUT)
        except ConnectionResetError:
            answer = b""
        assert answer == b""  # closed unanswered
        writer.close()
        for _, idle_writer in idle:
            idle_writer.close()

        async def served() -> bool:
            try:
                return (await get(port, "/health")).status == 200
            except ConnectionResetError:
                return False

        await eventually(served, within=10, what="the slots to be free again")
    finally:
        await srv.close()


@pytest.mark.parametrize("turns", range(6))
async def test_a_probe_arriving_as_the_health_endpoint_closes_is_closed_with_it(turns: int) -> None:
    """The endpoint closes when its address moves (``shard.bind.health_addr``) and at stop: a probe
    that connects in the loop turns before is closed too, not left open for the garbage collector
    (asyncio's ``Server.close`` race, CPython gh-109564)."""
    srv = HealthServer(FakeSource(), Metrics())
    port = await srv.start("127.0.0.1", 0)
    probe = socket.create_connection(("127.0.0.1", port))  # in the backlog at once
    probe.setblocking(False)
    try:
        for _ in range(turns):
            await asyncio.sleep(0)
        await srv.close()
        try:
            answer = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(probe, 1), CALL_TIMEOUT)
        except ConnectionResetError:
            answer = b""
        assert answer == b""
    finally:
        probe.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert not [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


async def test_health_is_unavailable_with_the_exact_error_until_config_loads(health: HttpFixture) -> None:
    health.source.error = 'shard/s1/config.jsonc: line 3: unknown field "grups"'
    response = await get(health.port, "/health")
    assert response.status == 503
    assert response.body == b'config not loaded: shard/s1/config.jsonc: line 3: unknown field "grups"\n'


async def test_health_stays_unavailable_until_the_apis_listen(health: HttpFixture) -> None:
    health.source.waiting = "waiting for the cluster identity and opening the gRPC APIs"
    response = await get(health.port, "/health")
    assert (response.status, response.body) == (
        503,
        b"starting: waiting for the cluster identity and opening the gRPC APIs\n",
    )
    health.source.waiting = None
    assert (await get(health.port, "/health")).status == 200


async def test_metrics_endpoint_serves_prometheus_text(health: HttpFixture) -> None:
    health.metrics.set_instances({("acme", "web", "running"): 2})
    response = await get(health.port, "/metrics")
    assert response.status == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    text = response.body.decode()
    assert 'nstance_instances{group="web",state="running",tenant="acme"} 2.0' in text
    for name in (
        "nstance_leader",
        "nstance_config_loaded",
        "nstance_rpc_total",
        "nstance_reconcile_queue_depth",
    ):
        assert name in text
    assert int(response.headers["content-length"]) == len(response.body)


async def test_head_has_headers_but_no_body(health: HttpFixture) -> None:
    response = await get(health.port, "/health", method="HEAD")
    assert response.status == 200
    assert response.body == b""
    assert response.headers["content-length"] == str(len(b"ok: leader\n"))


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/healthz"),
        ("GET", "/nope/deeper?x=1"),
        ("POST", "/health"),
        ("POST", "/"),
        ("PUT", "/health"),
        ("DELETE", "/"),
        ("PATCH", "/x"),
        ("OPTIONS", "*"),
        ("M-SEARCH", "/"),
        ("get", "/"),  # another method to Go (case matters), served health all the same
        ("GET", "http://10.0.0.5:8990/healthz"),  # absolute form
        ("POST", "/metrics"),  # metrics and leader health are GET/HEAD only; the rest is health
        ("PUT", "/leader/health"),
    ],
)
async def test_every_other_path_and_method_is_health_as_upstreams_catch_all(
    health: HttpFixture, method: str, path: str
) -> None:
    # Upstream's health server routes "/" (every path) to the health handler for any method:
    # 200 when ready, 503 before, text/plain (internal/server/health/server_test.go).
    health.source.error = "not yet"
    before = await get(health.port, path, method=method)
    assert (before.status, before.body) == (503, b"config not loaded: not yet\n")
    health.source.error = None
    ready = await get(health.port, path, method=method)
    assert (ready.status, ready.body) == (200, b"ok: leader\n")
    assert ready.headers["content-type"] == "text/plain; charset=utf-8"


async def test_a_request_body_is_read_and_the_answer_arrives(health: HttpFixture) -> None:
    body = b'{"probe": true}'
    raw = b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    response = await send(health.port, raw, close_write=False)
    assert (response.status, response.body) == (200, b"ok: leader\n")
    chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    assert (await send(health.port, chunked)).status == 200


async def test_a_target_that_is_no_path_or_url_is_refused(health: HttpFixture) -> None:
    for target in ("health", "ftp://x/health", "http:///nohost"):
        assert (await get(health.port, target)).status == 400, target


async def test_garbage_and_oversized_requests_are_refused(health: HttpFixture) -> None:
    garbage = await send(health.port, b"\x16\x03\x01\x02\x00garbage\r\n\r\n")
    assert garbage.status == 400
    no_version = await send(health.port, b"GET /health\r\n\r\n")
    assert no_version.status == 400
    huge = b"GET /health HTTP/1.1\r\nX-Filler: " + b"a" * 9000 + b"\r\n\r\n"
    assert (await send(health.port, huge)).status == 431
    many = b"GET /health HTTP/1.1\r\n" + b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n" * 300 + b"\r\n"
    assert (await send(health.port, many)).status == 431
    # The server still answers normally afterwards.
    assert (await get(health.port, "/health")).status == 200


async def test_slow_client_times_out(health: HttpFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health_http, "READ_TIMEOUT", 0.2)
    response = await send(health.port, b"GET /health HTTP/1.1\r\n", close_write=False)
    assert response.status == 408
