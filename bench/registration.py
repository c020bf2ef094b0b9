"""Benchmark: agent registrations per second through the shard server, with concurrent clients.

Setup: an in-process ``ServerApp`` (file:// object storage and SQLite under ``/dev/shm`` when it
exists, sim provider with 0 latency, GC every hour) leads its shard; ``Shard.upsert_group`` raises
the static group ``web`` to 1,000 instances through the normal create path (each gets its nonce JWT,
SQLite row and pending record), and the benchmark waits until every create is recorded, then reads
the instances' nonces from SQLite.

Client: a separate process (``bench/_agents.py``, plain grpc.aio, no server code) with 32 workers,
each on its own server-auth TLS channel to the RegistrationService (the agent's channel options:
server verified against the cluster CA, no client certificate), connected before timing starts. A
fresh ECDSA P-256 key per registration is generated before timing starts too. On ``go`` the workers
take the 1,000 nonces from a shared queue and call ``RegisterAgent`` (nonce, public key, a private
IPv4 and a host name, as the agent sends them) one call at a time each.

Measured: registrations per second = successful registrations / the client's time from ``go`` to the
last answer. Every registration is the server's full path: nonce JWT verified, instance row read,
certificate signed, nonce claimed by the conditional SQLite UPDATE, the instance record rewritten in
object storage (compare-and-swap), the reported addresses stored. The run checks that all 1,000
succeeded exactly once: every answer is a certificate for the key that was sent with CN = the
instance id, every SQLite row has ``registered_at`` and the serial the client received, and every
instance record in object storage carries that serial.

Baseline, in the same run and before the real case (the server is up but idle): the same client
process shape (32 workers on their own channels, the same requests, 3 passes over the 1,000 so the
window is not too short to time) against a bare grpc.aio server on the server's event loop with the
same kind of server-auth TLS credentials (server certificate from the same CA, no client
certificate) and the server's grpc options, no interceptor, whose ``RegisterAgent`` returns a
constant response carrying a real certificate (the same size on the wire). Target (issue 15, goal 2):
ratio ≥ 0.3 and p99 ≤ 100 ms. Prints one JSON object per line; takes about 30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
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

from nstance.config import GroupUpdate
from nstance.config.limits import LimitsConfig
from nstance.core.clock import SystemClock
from nstance.db import repo
from nstance.pki.certs import issue_client_certificate
from nstance.pki.keys import generate_private_key, public_key_to_pem
from nstance.rpc import registration_pb2, registration_pb2_grpc
from nstance.server.identity.tls import server_credentials
from nstance.server.net.grpcopts import server_options
from nstance.server.state import records

INSTANCES = 1000
WORKERS = 32
#: The registration port's grpc options with the default ``shard.limits`` (what the server uses).
REGISTRATION_SERVER_OPTIONS = server_options(
    LimitsConfig(), streams=False, max_connections=LimitsConfig().max_registration_connections
)
BARE_PASSES = 3
MAX_CONCURRENT = 64
FILL_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 300.0
#: Issue 15, goal 2: at least this fraction of the bare TLS unary call's rate, and this p99.
TARGET_RATIO = 0.3
TARGET_P99_S = 0.100


class ConstantRegistration(registration_pb2_grpc.RegistrationServiceServicer):
    """The baseline servicer: RegisterAgent answers a constant response, nothing else is called."""

    def __init__(self, response: registration_pb2.RegisterClientResponse) -> None:
        self.response = response
        self.calls = 0

    async def RegisterAgent(  # noqa: N802 - gRPC method name
        self,
        request: registration_pb2.RegisterClientRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> registration_pb2.RegisterClientResponse:
        self.calls += 1
        return self.response


async def run_client(plan: Path) -> tuple[dict[str, Any], float, float]:
    """Run the client process on ``plan``: (its result, server-process cores, client cores) while it ran."""
    client = await ClientProcess.start(plan)
    try:
        await client.event("ready", READY_TIMEOUT_S)
        start, cpu0 = time.perf_counter(), cpu_seconds()
        await client.send("go")
        result = await client.event("result", RUN_TIMEOUT_S)
        took = time.perf_counter() - start
        cpu1 = cpu_seconds()
    finally:
        await client.close()
    # The client reports its own CPU time: it may have exited (and its /proc entry gone) by now.
    return result, (cpu1 - cpu0) / took, float(result["cpu_seconds"]) / max(float(result["seconds"]), 1e-9)


async def create_instances(running: Running, count: int) -> list[tuple[str, str]]:
    """Scale ``web`` to ``count`` and wait until every create is recorded; (instance id, nonce) pairs."""
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
        pairs = [(row.id, row.nonce) for row in repo.list_instances(db)]
    if len(pairs) != count:
        raise AssertionError(f"expected {count} instances in SQLite, found {len(pairs)}")
    return pairs


def verify(running: Running, certificates: dict[str, str], ids: list[str]) -> list[str]:
    """Problems with the registrations: SQLite rows and object-storage records vs what the client got."""
    problems: list[str] = []
    shard = running.shard
    with shard.ctx.db.read_session() as db:
        rows = {row.id: row for row in repo.list_instances(db)}
    for instance_id in ids:
        row = rows.get(instance_id)
        got = certificates.get(instance_id)
        if row is None or got is None:
            problems.append(f"{instance_id}: {'no row' if row is None else 'no certificate received'}")
            continue
        if row.registered_at is None or repo.normalize_serial(row.cert_serial or "0") != got:
            problems.append(f"{instance_id}: SQLite serial {row.cert_serial} != received {got}")
        found = records.read_record(shard.ctx.store, row.tenant, instance_id)
        if found is None or repo.normalize_serial(found[0].cert_serial or "0") != got:
            serial = found[0].cert_serial if found else None
            problems.append(f"{instance_id}: record serial {serial} != received {got}")
    return problems


async def amain(instances: int, workers: int) -> int:
    with scratch_dir("nstance-bench-register-") as tmp:
        cluster, addrs = new_cluster(tmp)
        config = bench_config(
            addrs,
            provider_options={},
            groups={"web": {"template": "app", "size": 0}},
            max_concurrent_creates=MAX_CONCURRENT,
            gc={"interval": "1h", "registration_timeout": "2h"},
        )
        async with running_server(tmp, config, cluster=cluster, addrs=addrs) as running:
            progress("server leads; creating instances")
            pairs = await create_instances(running, instances)
            progress(f"{len(pairs)} instances created")
            identity = cluster.identity
            assert identity is not None
            plan_doc: dict[str, Any] = {
                "mode": "register",
                "ca_pem": identity.ca.cert_pem.decode("ascii"),
                "workers": workers,
                "registrations": [{"id": i, "nonce": n} for i, n in pairs],
            }

            sample = issue_client_certificate(
                identity.ca,
                generate_private_key("ecdsa-p256").public_key(),
                client_id=pairs[0][0],
                tenant="default",
                role="agent",
            )
            response = registration_pb2.RegisterClientResponse(client_certificate_pem=sample.cert_pem)
            response.expires_at.FromDatetime(sample.not_after)
            servicer = ConstantRegistration(response)  # type: ignore[abstract]
            creds, _ = server_credentials(
                identity.ca, hosts=["127.0.0.1"], clock=SystemClock(), require_client_cert=False
            )
            server, bare_addr = await bare_server(
                lambda s: registration_pb2_grpc.add_RegistrationServiceServicer_to_server(servicer, s),
                creds,
                REGISTRATION_SERVER_OPTIONS,
            )
            try:
                progress("baseline: bare constant RegisterAgent")
                plan = write_plan(
                    tmp / "bare.json",
                    {**plan_doc, "target": bare_addr, "repeat": BARE_PASSES, "check_certificates": False},
                )
                bare, bare_server_cores, bare_client_cores = await run_client(plan)
            finally:
                await server.stop(grace=1.0)
            progress("nstance RegistrationService")
            plan = write_plan(tmp / "nstance.json", {**plan_doc, "target": addrs["registration_addr"]})
            real, server_cores, client_cores = await run_client(plan)
            progress(f"{real['ok']} registrations in {real['seconds']:.2f}s; verifying")
            ids = [i for i, _ in pairs]
            problems = verify(running, real["certificates"], ids)
            replay = await replay_one(addrs["registration_addr"], identity.ca.cert_pem, pairs[0][1])

    value = real["ok"] / real["seconds"]
    baseline = bare["ok"] / bare["seconds"]
    line: dict[str, object] = {
        "name": f"registration_{instances}_agents_{workers}_clients",
        "value": round(value, 1),
        "unit": "registrations/s",
        "baseline": round(baseline, 1),
        "baseline_name": "grpc_aio_tls_unary_constant_response",
        "ratio": round(value / baseline, 4),
        "target": TARGET_RATIO,
        "target_value": TARGET_P99_S,
        "target_text": f"ratio ≥ {TARGET_RATIO}, p99 ≤ {TARGET_P99_S * 1000:.0f} ms (issue 15 goal 2)",
        "met": value / baseline >= TARGET_RATIO and real["latency_p99_s"] <= TARGET_P99_S,
        "registrations": real["ok"],
        "seconds": round(real["seconds"], 3),
        "latency_p50_s": round(real["latency_p50_s"], 5),
        "latency_p99_s": round(real["latency_p99_s"], 5),
        "errors": real["errors"],
        "baseline_calls": bare["ok"],
        "baseline_seconds": round(bare["seconds"], 3),
        "baseline_latency_p50_s": round(bare["latency_p50_s"], 5),
        "baseline_latency_p99_s": round(bare["latency_p99_s"], 5),
        "server_process_cores": round(server_cores, 2),
        "client_process_cores": round(client_cores, 2),
        "baseline_server_process_cores": round(bare_server_cores, 2),
        "baseline_client_process_cores": round(bare_client_cores, 2),
        "verified": not problems,
        "replay_refused_with": replay,
        "workers": workers,
        "tmp": where_tmp(),
    }
    print(json.dumps(line), flush=True)
    if real["ok"] != instances or real["errors"] or real["wrong_count"]:
        problems.insert(
            0, f"{real['ok']} of {instances} succeeded; errors {real['errors']} {real['error_messages']}"
        )
    if bare["errors"]:
        problems.append(f"baseline errors {bare['errors']} {bare['error_messages']}")
    if replay != "ALREADY_EXISTS":
        problems.append(f"replaying a used nonce gave {replay}, expected ALREADY_EXISTS")
    if problems:
        raise AssertionError(f"{len(problems)} problems, first ones: {problems[:5]}")
    return 0


async def replay_one(target: str, ca_pem: bytes, nonce: str) -> str:
    """Register once more with an already used nonce; the status code name the server answers."""
    credentials = grpc.ssl_channel_credentials(root_certificates=ca_pem)
    async with grpc.aio.secure_channel(
        target, credentials, options=[("grpc.ssl_target_name_override", "nstance-server")]
    ) as channel:
        stub = registration_pb2_grpc.RegistrationServiceStub(channel)
        request = registration_pb2.RegisterClientRequest(
            registration_nonce_jwt=nonce,
            public_key_pem=public_key_to_pem(generate_private_key("ecdsa-p256").public_key()),
        )
        try:
            await stub.RegisterAgent(request, timeout=30)
        except grpc.aio.AioRpcError as exc:
            return str(exc.code().name)
    return "OK"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--instances", type=int, default=INSTANCES, help="registrations (default 1000)")
    parser.add_argument("--workers", type=int, default=WORKERS, help="concurrent clients (default 32)")
    args = parser.parse_args()
    if args.instances < 1 or args.workers < 1:
        parser.error("--instances and --workers must be at least 1")
    quiet_logging()
    return asyncio.run(amain(args.instances, args.workers))


if __name__ == "__main__":
    raise SystemExit(main())
