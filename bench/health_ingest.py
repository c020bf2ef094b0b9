"""Benchmark: health reports per second into one shard server from 2,000 concurrent agent streams.

Setup: an in-process ``ServerApp`` (file:// object storage and SQLite under ``/dev/shm`` when it
exists, sim provider with 0 latency, GC every hour) leads its shard; ``Shard.upsert_group`` raises the
static group ``web`` to 2,000 instances through the normal create path, and the benchmark waits
until every create is recorded. Each instance then gets an agent certificate (ECDSA P-256, CN = its
instance id, role ``agent``) issued directly from the cluster CA - registration is measured by
``registration.py``, not here.

Client: a separate process (``bench/_agents.py``, plain grpc.aio, no server code) opens **one mTLS
channel per agent** (2,000 TCP connections and TLS handshakes, each with its own certificate, the
agent's keepalive options), one ``SubmitHealthReport`` client stream per agent, writes one report on
each, and waits until the server has all 2,000 streams open. A stream the server ends while they
open (grpc's pending-call limit refuses some of a burst of new calls when the event loop is slow to
accept them) is reopened with the agent's backoff (0.5 s doubling); those are counted in
``*_reconnects_while_opening``. Then (``go``) every stream writes reports as fast as each ``write``
returns: grpc's HTTP/2 flow control is the only pacing. A report is what
``nstance.agent.health.build_report`` makes (version, instance id, timestamp, sequence, uptime, CPU
and memory metrics) with the group's current runtime config hash, so the server sees agents in sync
and pushes no files (pushing is not what this measures).

Measured: once every stream is open on the server and after a 2 s warm-up, the reports the server
*processed* during a 10 s window: ``AgentHub.reports`` (incremented per report after it was decoded,
checked against the certificate, buffered for the batched SQLite write and compared with the
group's hashes), read on the server's event loop at the start and end of the window, divided by the
window's length. The client counts what it wrote in the same window (``client_*`` extras, per-agent
minimum and median show every stream made progress). After the run the benchmark checks that every
report the client wrote reached the hub, and that every instance's ``health_at`` is set in SQLite
once the hub flushed (``sqlite_rows_with_health``).

A second measurement, between the two: the same counting sink behind the OpenSSL front process the
server's mTLS ports use (``nstance.server.net.frontproc``): ``front_sink`` and ``front_sink_ratio``
(front / bare) show what terminating TLS in Python's ``ssl`` costs by itself.

Baseline, in the same run and before the real case (the server is up but idle): the same client
process against a bare grpc.aio server on the server's event loop - the same mTLS server credentials
(server certificate from the same CA, client certificate required), the agent API's grpc options, no
interceptor - whose ``SubmitHealthReport`` only counts the messages it reads. Targets (issue #4):
``ratio = nstance / bare >= 0.5`` and ``value >= 2,000 reports/s``; ``met`` requires both.

Client and server share this 2-core machine; ``*_server_process_cores`` (the server process plus its
TLS front process, where there is one) and ``*_client_process_cores`` give the CPU each side used
during the window (1.0 = one core).
The load phase is kept short (2 s warm-up + 10 s): under a sustained flood the server's keepalive
pings (every 20 s, 10 s to answer) go unanswered behind queued data and the server closes the
connections, which a real agent would see as a reconnect. Prints one JSON object per line; takes
about 1.5 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from _agents import ClientProcess, bare_server, cpu_seconds, progress, write_plan
from _shard import (
    Running,
    bench_config,
    new_cluster,
    quiet_logging,
    running_server,
    scratch_dir,
    wait_until,
    where_tmp,
)
from google.protobuf.empty_pb2 import Empty

from nstance.config import GroupUpdate, runtime_hash
from nstance.config.limits import LimitsConfig
from nstance.core.clock import SystemClock
from nstance.db import repo
from nstance.pki.ca import CertificateAuthority
from nstance.pki.certs import issue_client_certificate, issue_server_certificate
from nstance.pki.keys import generate_private_key, private_key_to_pem
from nstance.pki.tlspipe import private_directory
from nstance.rpc import agent_pb2_grpc
from nstance.server.identity.tls import server_credentials
from nstance.server.net.frontproc import FrontProcess, Listener
from nstance.server.net.grpcopts import server_options
from nstance.server.net.tlsfront import PeerTable, listening_socket

AGENTS = 2000
WINDOW_S = 10.0
WARMUP_S = 2.0
MAX_CONCURRENT = 64
TARGET_RATIO = 0.5
TARGET_RATE = 2000.0
FILL_TIMEOUT_S = 120.0
OPEN_TIMEOUT_S = 180.0
#: The agent port's grpc options with the default ``shard.limits`` (what the server uses).
AGENT_SERVER_OPTIONS = server_options(
    LimitsConfig(), streams=True, max_connections=LimitsConfig().max_agent_connections
)


class CountingSink(agent_pb2_grpc.AgentServiceServicer):
    """The baseline servicer: SubmitHealthReport reads and counts messages, nothing else."""

    def __init__(self) -> None:
        self.reports = 0
        self.open = 0

    async def SubmitHealthReport(  # noqa: N802 - gRPC method name
        self,
        request_iterator: Any,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> Empty:
        self.open += 1
        try:
            async for _ in request_iterator:
                self.reports += 1
        finally:
            self.open -= 1
        return Empty()


@dataclass
class Window:
    """One case: server-side reports per second over the window, and what the client said."""

    rate: float
    seconds: float
    reports: int
    per_second: list[int]
    open_s: float
    client: dict[str, Any]
    reconnects_before_load: int
    server_cores: float
    client_cores: float
    server_total: int


async def fronted_server(
    add: Callable[[grpc.aio.Server], None], ca: CertificateAuthority
) -> tuple[grpc.aio.Server, str, FrontProcess]:
    """A plain grpc.aio server on a Unix socket behind the server's OpenSSL front process (``frontproc``)."""
    server = grpc.aio.server(options=AGENT_SERVER_OPTIONS)
    add(server)
    directory = private_directory()
    backend = directory / "sink.sock"
    server.add_insecure_port(f"unix:{backend}")
    await server.start()
    issued = issue_server_certificate(ca, hosts=["127.0.0.1"], clock=SystemClock())
    assert issued.key_pem is not None
    front = FrontProcess(
        PeerTable(), directory=directory, key_pem=issued.key_pem, cert_pem=issued.cert_pem, ca_pem=ca.cert_pem
    )
    sock = listening_socket("127.0.0.1", 0)
    front.add(Listener(sock, backend, "sink"))
    await front.start()
    return server, f"127.0.0.1:{sock.getsockname()[1]}", front


def server_cpu_seconds(client_pid: int) -> float:
    """CPU seconds of this process and its children except the client (the TLS front process)."""
    children: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            children.update(int(pid) for pid in (task / "children").read_text().split())
    total = cpu_seconds()
    for pid in children - {client_pid}:
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


async def measure(
    plan: Path,
    *,
    reports: Callable[[], int],
    open_streams: Callable[[], int],
    window_s: float,
) -> Window:
    """Run the client process on ``plan`` and count what the server processed in the window."""
    base = reports()
    started = time.monotonic()
    client = await ClientProcess.start(plan)
    try:
        ready = await client.event("ready", OPEN_TIMEOUT_S)
        if ready["opened"] != AGENTS or ready["errors"]:
            raise AssertionError(
                f"the client opened {ready['opened']} of {AGENTS} streams: {ready['error_details']}"
            )
        await wait_until(
            lambda: open_streams() >= AGENTS, 90.0, "every stream to be open on the server", 0.05
        )
        open_s = time.monotonic() - started
        progress(f"{AGENTS} streams open after {open_s:.1f}s (client: {ready['seconds']}s)")
        await client.send("go")
        going = await client.event("going", 30.0)
        await asyncio.sleep(WARMUP_S)
        await client.send("mark")
        t0, c0 = time.perf_counter(), reports()
        cpu0 = server_cpu_seconds(client.pid), cpu_seconds(client.pid)
        per_second: list[int] = []
        last = c0
        end = t0 + window_s
        while (now := time.perf_counter()) < end:
            await asyncio.sleep(min(1.0, end - now))
            current = reports()
            per_second.append(current - last)
            last = current
        t1, c1 = time.perf_counter(), reports()
        cpu1 = server_cpu_seconds(client.pid), cpu_seconds(client.pid)
        await client.send("stop")
        result = await client.event("result", 120.0)
        progress(f"window done: {(c1 - c0) / (t1 - t0):.0f} reports/s")
    finally:
        await client.close()
    await wait_until(lambda: open_streams() == 0, 30.0, "every stream to be closed on the server", 0.05)
    return Window(
        rate=(c1 - c0) / (t1 - t0),
        seconds=t1 - t0,
        reports=c1 - c0,
        per_second=per_second,
        open_s=open_s,
        client=result,
        reconnects_before_load=going["reconnects"],
        server_total=reports() - base,
        server_cores=(cpu1[0] - cpu0[0]) / (t1 - t0),
        client_cores=(cpu1[1] - cpu0[1]) / (t1 - t0),
    )


def agent_identities(running: Running, ids: list[str]) -> Iterator[dict[str, str]]:
    """One agent key and certificate per instance, issued by the cluster CA as registration would."""
    identity = running.cluster.identity
    assert identity is not None
    for instance_id in ids:
        key = generate_private_key("ecdsa-p256")
        issued = issue_client_certificate(
            identity.ca, key.public_key(), client_id=instance_id, tenant="default", role="agent"
        )
        yield {
            "id": instance_id,
            "key_pem": private_key_to_pem(key).decode("ascii"),
            "cert_pem": issued.cert_pem.decode("ascii"),
        }


async def create_instances(running: Running, count: int) -> list[str]:
    """Scale ``web`` to ``count`` through the server and wait until every create is recorded."""
    shard, sim = running.shard, running.sim
    await shard.upsert_group("default", "web", GroupUpdate(size=count))
    await wait_until(
        lambda: sim.launch_count >= count and not shard.ops.in_flight,
        FILL_TIMEOUT_S,
        f"{count} creates",
        0.05,
    )
    await wait_until(lambda: shard.ops.followups.pending == 0, FILL_TIMEOUT_S, "the records to settle", 0.05)
    with shard.ctx.db.read_session() as db:
        ids = [row.id for row in repo.list_instances(db)]
    if len(ids) != count:
        raise AssertionError(f"expected {count} instances in SQLite, found {len(ids)}")
    return ids


def health_rows(running: Running) -> int:
    with running.shard.ctx.db.read_session() as db:
        return sum(1 for row in repo.list_instances(db) if row.health_at is not None)


def client_extras(prefix: str, window: Window) -> dict[str, object]:
    c = window.client
    return {
        f"{prefix}_client_sent_in_window": c["sent_in_window"],
        f"{prefix}_client_per_agent_min": c["per_agent_min"],
        f"{prefix}_client_per_agent_median": c["per_agent_median"],
        f"{prefix}_per_second": window.per_second,
        f"{prefix}_server_process_cores": round(window.server_cores, 2),
        f"{prefix}_client_process_cores": round(window.client_cores, 2),
        f"{prefix}_streams_open_s": round(window.open_s, 2),
        f"{prefix}_reports_lost": c["sent_total"] - window.server_total,
        f"{prefix}_client_errors": c["errors"],
        f"{prefix}_reconnects_while_opening": window.reconnects_before_load,
        f"{prefix}_refusals_while_opening": c["open_failures"],
    }


async def amain(window_s: float) -> int:
    with scratch_dir("nstance-bench-health-") as tmp:
        cluster, addrs = new_cluster(tmp)
        config = bench_config(
            addrs,
            provider_options={},
            groups={"web": {"template": "app", "size": 0}},
            max_concurrent_creates=MAX_CONCURRENT,
            gc={"interval": "1h", "registration_timeout": "2h"},
        )
        async with running_server(tmp, config, cluster=cluster, addrs=addrs) as running:
            shard = running.shard
            progress("server leads; creating instances")
            ids = await create_instances(running, AGENTS)
            progress(f"{len(ids)} instances created; issuing agent certificates")
            snapshot = shard.ctx.config.snapshot()
            merged = snapshot.merged("default", "web") if snapshot is not None else None
            assert merged is not None
            identity = cluster.identity
            assert identity is not None
            plan_doc: dict[str, Any] = {
                "mode": "health",
                "ca_pem": identity.ca.cert_pem.decode("ascii"),
                "config_hash": runtime_hash(merged),
                "agents": list(agent_identities(running, ids)),
            }

            progress("baseline: bare counting sink")
            sink = CountingSink()  # type: ignore[abstract]
            creds, _ = server_credentials(identity.ca, hosts=["127.0.0.1"], clock=SystemClock())
            server, bare_addr = await bare_server(
                lambda s: agent_pb2_grpc.add_AgentServiceServicer_to_server(sink, s),
                creds,
                AGENT_SERVER_OPTIONS,
            )
            try:
                plan = write_plan(tmp / "bare.json", {**plan_doc, "target": bare_addr})
                bare = await measure(
                    plan, reports=lambda: sink.reports, open_streams=lambda: sink.open, window_s=window_s
                )
            finally:
                await server.stop(grace=1.0)

            progress("the same sink behind the OpenSSL front of the mTLS ports")
            front_sink = CountingSink()  # type: ignore[abstract]
            front_server, front_addr, front = await fronted_server(
                lambda s: agent_pb2_grpc.add_AgentServiceServicer_to_server(front_sink, s), identity.ca
            )
            try:
                plan = write_plan(tmp / "front.json", {**plan_doc, "target": front_addr})
                fronted = await measure(
                    plan,
                    reports=lambda: front_sink.reports,
                    open_streams=lambda: front_sink.open,
                    window_s=window_s,
                )
            finally:
                await front_server.stop(grace=1.0)
                await front.close()

            hub = shard.agents

            def hub_open() -> int:
                return sum(1 for s in hub.sessions.values() if s.health_streams > 0)

            progress("nstance AgentService")
            plan = write_plan(tmp / "nstance.json", {**plan_doc, "target": addrs["agent_addr"]})
            real = await measure(plan, reports=lambda: hub.reports, open_streams=hub_open, window_s=window_s)
            await hub.flushed()
            rows = health_rows(running)
            pushed = sum(1 for s in hub.sessions.values() if s.pushed_hash is not None)

    ratio = real.rate / bare.rate
    line: dict[str, object] = {
        "name": f"health_ingest_{AGENTS}_streams",
        "value": round(real.rate, 1),
        "unit": "reports/s",
        "baseline": round(bare.rate, 1),
        "baseline_name": "grpc_aio_mtls_client_stream_counting_sink",
        "ratio": round(ratio, 3),
        "target": TARGET_RATIO,
        "target_value": TARGET_RATE,
        "target_text": f"ratio ≥ {TARGET_RATIO}, ≥ {TARGET_RATE:,.0f} reports/s",
        "met": ratio >= TARGET_RATIO and real.rate >= TARGET_RATE,
        "streams": AGENTS,
        "channels": AGENTS,
        "window_s": round(real.seconds, 3),
        "baseline_window_s": round(bare.seconds, 3),
        "reports_in_window": real.reports,
        "baseline_reports_in_window": bare.reports,
        "sqlite_rows_with_health": rows,
        "sessions_with_pushes": pushed,
        "front_sink": round(fronted.rate, 1),
        "front_sink_ratio": round(fronted.rate / bare.rate, 3),
        **client_extras("nstance", real),
        **client_extras("bare", bare),
        **client_extras("front", fronted),
        "tmp": where_tmp(),
    }
    print(json.dumps(line), flush=True)
    problems = []
    if rows != AGENTS:
        problems.append(f"{AGENTS - rows} instances have no health_at in SQLite")
    for name, window in (("nstance", real), ("bare", bare), ("front", fronted)):
        lost = window.client["sent_total"] - window.server_total
        if lost or window.client["errors"] or window.client["per_agent_min"] <= 0:
            slowest = window.client["per_agent_min"]
            problems.append(f"{name}: lost {lost}, errors {window.client['errors']}, slowest {slowest}")
    if problems:
        raise AssertionError("; ".join(problems))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--window", type=float, default=WINDOW_S, help="measurement window in s (default 10)")
    args = parser.parse_args()
    quiet_logging()
    return asyncio.run(amain(args.window))


if __name__ == "__main__":
    raise SystemExit(main())
