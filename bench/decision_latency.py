"""Benchmark: decision latency - an UpsertGroup RPC to the first provider create call it causes.

Setup: an in-process ``ServerApp`` (file:// object storage and SQLite under ``/dev/shm`` when it
exists, sim provider with 0 latency, ``max_concurrent_creates`` 64) starts with 1,000 *dynamic* groups
of 10 instances each, written into ``groups.jsonc`` before it starts (the config.jsonc also has its
usual empty static group ``web``). On leading, the server creates the 10,000 instances through its
normal path (reconciler, SQLite rows, pending records, provider calls, record updates);
``decision_latency_initial_fill_10000`` reports how long that took, from leadership to the last create
recorded (no analytic baseline: with a 0-latency provider the bound is 0, so baseline and ratio are
null).

Measured: for each of 200 samples a distinct group, chosen by a seeded RNG, is raised from its size
by 1 with ``UpsertGroup`` over real mTLS gRPC (a grpc.aio client using an operator identity issued by
the cluster CA, through the server's auth interceptor). The latency runs from just before the RPC to
the moment the sim provider's ``create_instance`` is *entered* for that group (the method is wrapped
on the sim instance to record ``time.perf_counter()`` at entry). Client and server share one process
and one event loop: that keeps one clock and no cross-thread hand-off in the figure, and the baseline
is measured the same way, so both include the client's share of the loop. After each sample the
benchmark waits until the create has finished (record and cache updated), so samples do not overlap.

Baseline, measured in the same run and interleaved with the samples: a bare grpc.aio unary round trip
over the same kind of mTLS channel (server certificate from the same CA, client certificate
required) to a trivial ``OperatorService`` whose ``GetConfigStatus`` returns a constant - no
interceptor, no work. Lines ``decision_latency_p50`` / ``decision_latency_p99`` compare p50 with p50
and p99 with p99 (nearest-rank percentiles). No target ratio is set by the issue; the absolute targets
are goal 2 of ``reference/perf-reliability-anchors.md`` (p50 <= 50 ms, p99 <= 500 ms with 1,000 groups
and 10,000 instances in the SQLite cache), carried as ``target`` (seconds, on ``value``) and ``met``.

The server runs its leader loops as in production (reconciler resync every 60 s, instance-metrics
scan every 5 s) except GC, whose interval is set to 1 h so a provider re-list does not land in the
samples. Prints one JSON object per line; takes about 80 s on the 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from _shard import (
    SHARD,
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

from nstance.core.clock import SystemClock
from nstance.providers.base import CreateRequest, ProviderInstance
from nstance.rpc import operator_pb2, operator_pb2_grpc
from nstance.server.tls import server_credentials

GROUPS = 1000
PER_GROUP = 10
#: perf-reliability-anchors.md goal 2: desired-size change -> first provider create, p50 / p99.
TARGET_P50_S = 0.050
TARGET_P99_S = 0.500
SAMPLES = 200
WARMUP = 10
MAX_CONCURRENT = 64
SEED = 20261122
FILL_TIMEOUT_S = 600.0
SAMPLE_TIMEOUT_S = 30.0
TARGET_NAME = "nstance-server"  # a name every server certificate carries


def group_name(i: int) -> str:
    return f"g{i:04d}"


def dynamic_groups_doc(groups: int, size: int) -> bytes:
    """``groups.jsonc``: tenant ``default`` with ``groups`` dynamic groups of template ``app``."""
    doc = {"default": {group_name(i): {"template": "app", "size": size} for i in range(groups)}}
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")


def nearest_rank(values: list[float], pct: float) -> float:
    """The nearest-rank percentile (``pct`` in 0..100) of ``values``."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


class ConstantOperator(operator_pb2_grpc.OperatorServiceServicer):
    """The baseline servicer: GetConfigStatus answers a constant, nothing else is called."""

    RESPONSE = operator_pb2.ConfigStatusResponse(etag='"bench"', size=1)

    async def GetConfigStatus(  # noqa: N802 - gRPC method name
        self, request: Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> operator_pb2.ConfigStatusResponse:
        return self.RESPONSE


def client_channel(identity_dir: Path, target: str) -> grpc.aio.Channel:
    """A grpc.aio mTLS channel with the operator identity in ``identity_dir``."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(identity_dir / "ca.crt").read_bytes(),
        private_key=(identity_dir / "identity.key").read_bytes(),
        certificate_chain=(identity_dir / "identity.crt").read_bytes(),
    )
    return grpc.aio.secure_channel(
        target, credentials, options=[("grpc.ssl_target_name_override", TARGET_NAME)]
    )


class CreateEntries:
    """Wraps the sim's ``create_instance`` to record when a create is entered, per group."""

    def __init__(self, running: Running) -> None:
        self._sim = running.sim
        self._inner: Callable[[CreateRequest], Awaitable[ProviderInstance]] = running.sim.create_instance
        self._waiting: dict[str, asyncio.Future[float]] = {}
        self.entered = 0
        self._sim.create_instance = self._create  # type: ignore[method-assign]

    async def _create(self, request: CreateRequest) -> ProviderInstance:
        now = time.perf_counter()
        self.entered += 1
        future = self._waiting.pop(request.group, None)
        if future is not None and not future.done():
            future.set_result(now)
        return await self._inner(request)

    def expect(self, group: str) -> asyncio.Future[float]:
        """A future resolved with the perf_counter time of the next create entered for ``group``."""
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiting[group] = future
        return future


async def fill(running: Running, lead_at: float) -> dict[str, object]:
    """Wait until the server has created and recorded every starting instance."""
    total = GROUPS * PER_GROUP
    sim, ops = running.sim, running.shard.ops
    await wait_until(
        lambda: sim.launch_count >= total and not ops.in_flight, FILL_TIMEOUT_S, f"{total} creates", 0.05
    )
    seconds = time.monotonic() - lead_at
    if sim.launch_count != total:
        raise AssertionError(f"expected {total} launches at start, the sim saw {sim.launch_count}")
    return {
        "name": f"decision_latency_initial_fill_{total}",
        "value": round(seconds, 3),
        "unit": "s",
        "baseline": None,
        "baseline_name": "none (0-latency provider: no analytic bound)",
        "ratio": None,
        "instances": total,
        "groups": GROUPS,
        "per_instance_ms": round(1000 * seconds / total, 3),
        "creates_per_s": round(total / seconds, 1),
        "max_concurrent_creates": MAX_CONCURRENT,
        "tmp": where_tmp(),
    }


async def bare_rtt(stub: operator_pb2_grpc.OperatorServiceStub) -> float:
    start = time.perf_counter()
    await stub.GetConfigStatus(Empty(), timeout=10)
    return time.perf_counter() - start


async def decision(
    running: Running,
    entries: CreateEntries,
    stub: operator_pb2_grpc.OperatorServiceStub,
    group: str,
    size: int,
) -> tuple[float, float]:
    """(UpsertGroup -> create entered, UpsertGroup round trip) in seconds; waits for the create to finish."""
    sim, ops = running.sim, running.shard.ops
    launched = sim.launch_count
    entered = entries.expect(group)
    request = operator_pb2.UpsertGroupRequest(
        key=group, config=operator_pb2.GroupConfig(template="app", size=size)
    )
    start = time.perf_counter()
    await stub.UpsertGroup(request, timeout=10)
    rpc = time.perf_counter() - start
    at = await asyncio.wait_for(entered, SAMPLE_TIMEOUT_S)
    await wait_until(
        lambda: sim.launch_count > launched and not ops.in_flight, SAMPLE_TIMEOUT_S, f"{group}'s create"
    )
    return at - start, rpc


def pair(
    name: str,
    value: float,
    baseline: float,
    pct: str,
    samples: int,
    target: float,
    extra: dict[str, object],
) -> dict[str, object]:
    return {
        "name": name,
        "value": round(value, 6),
        "unit": "s",
        "baseline": round(baseline, 6),
        "baseline_name": f"grpc_aio_mtls_unary_rtt_{pct}",
        "ratio": round(value / baseline, 2),
        "target": target,
        "target_text": f"≤ {target * 1000:g} ms (anchors goal 2)",
        "met": value <= target,
        "samples": samples,
        **extra,
    }


async def amain(samples: int) -> int:
    with scratch_dir("nstance-bench-decision-") as tmp:
        cluster, addrs = new_cluster(tmp)
        identity_dir = cluster.operator_identity(tmp / "operator")
        config = bench_config(
            addrs,
            provider_options={},
            groups={"web": {"template": "app", "size": 0}},
            max_concurrent_creates=MAX_CONCURRENT,
            gc={"interval": "1h", "registration_timeout": "2h"},
        )
        async with running_server(
            tmp,
            config,
            cluster=cluster,
            addrs=addrs,
            dynamic_groups=dynamic_groups_doc(GROUPS, PER_GROUP),
        ) as running:
            lead_at = time.monotonic()
            print(json.dumps(await fill(running, lead_at)), flush=True)
            entries = CreateEntries(running)

            bare_server = grpc.aio.server()
            operator_pb2_grpc.add_OperatorServiceServicer_to_server(ConstantOperator(), bare_server)  # type: ignore[abstract]
            assert cluster.identity is not None
            creds, _ = server_credentials(cluster.identity.ca, hosts=["127.0.0.1"], clock=SystemClock())
            bare_port = bare_server.add_secure_port("127.0.0.1:0", creds)
            await bare_server.start()
            real_channel = client_channel(identity_dir, addrs["operator_addr"])
            bare_channel = client_channel(identity_dir, f"127.0.0.1:{bare_port}")
            try:
                real = operator_pb2_grpc.OperatorServiceStub(real_channel)
                bare = operator_pb2_grpc.OperatorServiceStub(bare_channel)
                rng = random.Random(SEED)
                chosen = rng.sample(range(GROUPS), WARMUP + samples)
                for i in chosen[:WARMUP]:  # connections, TLS sessions, code paths
                    await bare_rtt(bare)
                    await decision(running, entries, real, group_name(i), PER_GROUP + 1)
                decisions: list[float] = []
                rpcs: list[float] = []
                rtts: list[float] = []
                for i in chosen[WARMUP:]:
                    rtts.append(await bare_rtt(bare))
                    took, rpc = await decision(running, entries, real, group_name(i), PER_GROUP + 1)
                    decisions.append(took)
                    rpcs.append(rpc)
                    rtts.append(await bare_rtt(bare))
            finally:
                await real_channel.close()
                await bare_channel.close()
                await bare_server.stop(grace=1.0)
            instances = running.sim.launch_count
    extra: dict[str, object] = {
        "upsert_rpc_p50_s": round(statistics.median(rpcs), 6),
        "upsert_rpc_p99_s": round(nearest_rank(rpcs, 99), 6),
        "decision_max_s": round(max(decisions), 6),
        "baseline_samples": len(rtts),
        "groups": GROUPS + 1,
        "instances": instances,
        "tmp": where_tmp(),
        "shard": SHARD,
    }
    print(
        json.dumps(pair("decision_latency_p50", statistics.median(decisions), statistics.median(rtts), "p50",
                        len(decisions), TARGET_P50_S, extra)),
        flush=True,
    )  # fmt: skip
    print(
        json.dumps(pair("decision_latency_p99", nearest_rank(decisions, 99), nearest_rank(rtts, 99), "p99",
                        len(decisions), TARGET_P99_S, extra)),
        flush=True,
    )  # fmt: skip
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--samples", type=int, default=SAMPLES, help="UpsertGroup samples (default 200)")
    args = parser.parse_args()
    if not 1 <= args.samples <= GROUPS - WARMUP:
        parser.error(f"--samples must be between 1 and {GROUPS - WARMUP}")
    quiet_logging()
    return asyncio.run(amain(args.samples))


if __name__ == "__main__":
    raise SystemExit(main())
