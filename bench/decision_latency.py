"""Benchmark: decision latency - an UpsertGroup RPC to the first provider create call it causes.

Runs once per group count (``--groups``, default 1,000 and 10,000), each with a fresh in-process
``ServerApp`` (file:// object storage and SQLite under ``/dev/shm`` when it exists, sim provider with 0
latency, ``max_concurrent_creates`` 64) started with that many *dynamic* groups in one tenant,
written into ``groups.jsonc`` before it starts, sized so that every run holds 10,000 instances
(1,000 groups of 10, 10,000 groups of 1): the runs differ in the number of groups only. One tenant
holds them all, so ``shard.limits.max_groups_per_tenant`` (2,000 by default) is raised to 20,000 in
the benchmark's config: the worst case for anything that scales with a tenant's groups, which
spreading them over tenants would hide. The config.jsonc also has its usual empty static group
``web``. On leading, the server creates the 10,000 instances through its normal path (reconciler,
SQLite rows, pending records, provider calls, record updates); ``decision_latency_initial_fill_*``
reports how long that took, from leadership to the last create recorded (no analytic baseline: with
a 0-latency provider the bound is 0, so baseline and ratio are null). Sampling starts once the
records' follow-ups (``server/reconcile/followups.py``: the provider's answer written into each
record, deferred while creates run) have all been written too; the fill line says how many were
left when the last create was recorded and when they were done (``followups_settled_s``, from
leadership). Before, the samples at 1,000 groups ran while about 7,700 of them were still being
written.

Measured: for each of 200 samples a distinct group, chosen by a seeded RNG, is raised from its size
by 1 with ``UpsertGroup`` over real mTLS gRPC (a grpc.aio client using an operator identity issued by
the cluster CA, through the server's auth interceptor). The latency runs from just before the RPC to
the moment the sim provider's ``create_instance`` is *entered* for that group (the method is wrapped
on the sim instance to record ``time.perf_counter()`` at entry). Client and server share one process
and one event loop: that keeps one clock and no cross-thread hand-off in the figure, and the baseline
is measured the same way, so both include the client's share of the loop. After each sample the
benchmark waits until the create has finished (record and cache updated), so samples do not overlap.
A lag probe (``server/state/looplag.py``, every 25 ms) reports the largest event-loop stall during the
samples (wall time) and the most CPU the loop thread spent in one turn (what a loaded machine does
not inflate).

Baseline, measured in the same run and interleaved with the samples: a bare grpc.aio unary round trip
over the same kind of mTLS channel (server certificate from the same CA, client certificate
required) to a trivial ``OperatorService`` whose ``GetConfigStatus`` returns a constant - no
interceptor, no work. Lines ``decision_latency_p50_<G>_groups`` / ``..._p99_...`` compare p50 with p50
and p99 with p99 (nearest-rank percentiles). Targets: p50 <= 5x the bare round trip (issue 15 goal
4), p99 <= 500 ms (goal 2 of ``reference/perf-reliability-anchors.md``; its p50 <= 50 ms is carried
as ``anchors_p50_met``). With two or more group counts, ``decision_latency_p50_growth_<A>_to_<B>_groups``
is the p50 at the largest count over the p50 at the smallest (target <= 1.5, issue 15 goal 4).

The server runs its leader loops as in production (reconciler resync every 60 s, instance-metrics
scan every 5 s) except GC, whose interval is set to 1 h so a provider re-list does not land in the
samples. Prints one JSON object per line; takes about 5 minutes on the 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from nstance.server.identity.tls import server_credentials
from nstance.server.state.looplag import LagProbe

GROUP_COUNTS = (1000, 10_000)
#: Instances at start in every run (groups x size): the runs differ only in how many groups hold them.
INSTANCES = 10_000
#: Raised from the default 2,000 so that every group fits in one tenant (see the module docstring).
MAX_GROUPS_PER_TENANT = 20_000
#: perf-reliability-anchors.md goal 2: desired-size change -> first provider create, p50 / p99.
ANCHORS_P50_S = 0.050
TARGET_P99_S = 0.500
#: Issue 15 goal 4: p50 <= 5x the bare mTLS round trip; p50 at the largest group count <= 1.5x the smallest.
TARGET_RTT_RATIO = 5.0
TARGET_GROWTH = 1.5
SAMPLES = 200
WARMUP = 10
MAX_CONCURRENT = 64
SEED = 20261122
FILL_TIMEOUT_S = 600.0
SAMPLE_TIMEOUT_S = 30.0
TARGET_NAME = "nstance-server"  # a name every server certificate carries


def group_name(i: int) -> str:
    return f"g{i:05d}"


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


async def fill(running: Running, lead_at: float, groups: int) -> dict[str, object]:
    """Wait until the server has created and recorded every starting instance."""
    total = INSTANCES
    sim, ops = running.sim, running.shard.ops
    await wait_until(
        lambda: sim.launch_count >= total and not ops.in_flight, FILL_TIMEOUT_S, f"{total} creates", 0.05
    )
    seconds = time.monotonic() - lead_at
    if sim.launch_count != total:
        raise AssertionError(f"expected {total} launches at start, the sim saw {sim.launch_count}")
    # The records' follow-ups (provider id, addresses) of the last bursts are still being written:
    # thousands of them at 1,000 groups. Samples taken meanwhile would time that, not a decision.
    followups = running.shard.ops.creator.followups
    left_at_fill = followups.pending
    async with asyncio.timeout(FILL_TIMEOUT_S):
        await followups.settled()
    return {
        "name": f"decision_latency_initial_fill_{groups}_groups",
        "value": round(seconds, 3),
        "unit": "s",
        "baseline": None,
        "baseline_name": "none (0-latency provider: no analytic bound)",
        "ratio": None,
        "instances": total,
        "groups": groups,
        "per_instance_ms": round(1000 * seconds / total, 3),
        "followups_left_at_fill": left_at_fill,
        "followups_settled_s": round(time.monotonic() - lead_at, 3),
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


def figure(
    name: str, value: float, baseline: float, baseline_name: str, extra: dict[str, object]
) -> dict[str, object]:
    return {
        "name": name,
        "value": round(value, 6),
        "unit": "s",
        "baseline": round(baseline, 6),
        "baseline_name": baseline_name,
        "ratio": round(value / baseline, 2),
        **extra,
    }


async def measure(
    groups: int, samples: int
) -> tuple[list[float], list[float], list[float], dict[str, object]]:
    """One server with ``groups`` groups: (decisions, UpsertGroup round trips, bare round trips, notes)."""
    per_group = INSTANCES // groups
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
        config["shard"]["limits"] = {"max_groups_per_tenant": MAX_GROUPS_PER_TENANT}
        async with running_server(
            tmp,
            config,
            cluster=cluster,
            addrs=addrs,
            dynamic_groups=dynamic_groups_doc(groups, per_group),
        ) as running:
            lead_at = time.monotonic()
            print(json.dumps(await fill(running, lead_at, groups)), flush=True)
            entries = CreateEntries(running)

            bare_server = grpc.aio.server()
            operator_pb2_grpc.add_OperatorServiceServicer_to_server(ConstantOperator(), bare_server)  # type: ignore[abstract]
            assert cluster.identity is not None
            creds, _ = server_credentials(cluster.identity.ca, hosts=["127.0.0.1"], clock=SystemClock())
            bare_port = bare_server.add_secure_port("127.0.0.1:0", creds)
            await bare_server.start()
            real_channel = client_channel(identity_dir, addrs["operator_addr"])
            bare_channel = client_channel(identity_dir, f"127.0.0.1:{bare_port}")
            probe = LagProbe()
            probing = asyncio.create_task(probe.run())
            try:
                real = operator_pb2_grpc.OperatorServiceStub(real_channel)
                bare = operator_pb2_grpc.OperatorServiceStub(bare_channel)
                rng = random.Random(SEED)
                chosen = rng.sample(range(groups), WARMUP + samples)
                for i in chosen[:WARMUP]:  # connections, TLS sessions, code paths
                    await bare_rtt(bare)
                    await decision(running, entries, real, group_name(i), per_group + 1)
                probe.reset()
                decisions: list[float] = []
                rpcs: list[float] = []
                rtts: list[float] = []
                for i in chosen[WARMUP:]:
                    rtts.append(await bare_rtt(bare))
                    took, rpc = await decision(running, entries, real, group_name(i), per_group + 1)
                    decisions.append(took)
                    rpcs.append(rpc)
                    rtts.append(await bare_rtt(bare))
            finally:
                probing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await probing
                await real_channel.close()
                await bare_channel.close()
                await bare_server.stop(grace=1.0)
            instances = running.sim.launch_count
    notes: dict[str, object] = {
        "samples": len(decisions),
        "upsert_rpc_p50_s": round(statistics.median(rpcs), 6),
        "upsert_rpc_p99_s": round(nearest_rank(rpcs, 99), 6),
        "decision_max_s": round(max(decisions), 6),
        "loop_lag_max_s": round(probe.max_lag, 4),
        "loop_busy_max_s": round(probe.max_busy, 4),  # loop-thread CPU in its longest turn
        "baseline_samples": len(rtts),
        "groups": groups + 1,
        "groups_per_tenant_limit": MAX_GROUPS_PER_TENANT,
        "instances": instances,
        "tmp": where_tmp(),
        "shard": SHARD,
    }
    return decisions, rpcs, rtts, notes


async def amain(group_counts: list[int], samples: int) -> int:
    p50s: dict[int, float] = {}
    for groups in group_counts:
        decisions, _, rtts, notes = await measure(groups, samples)
        p50, rtt50 = statistics.median(decisions), statistics.median(rtts)
        p99, rtt99 = nearest_rank(decisions, 99), nearest_rank(rtts, 99)
        p50s[groups] = p50
        line = figure(
            f"decision_latency_p50_{groups}_groups", p50, rtt50, "grpc_aio_mtls_unary_rtt_p50", notes
        )
        line.update(
            target=TARGET_RTT_RATIO,
            target_text=f"≤ {TARGET_RTT_RATIO:g}× bare mTLS RTT (issue 15)",
            met=p50 <= TARGET_RTT_RATIO * rtt50,
            anchors_p50_target_s=ANCHORS_P50_S,
            anchors_p50_met=p50 <= ANCHORS_P50_S,
        )
        print(json.dumps(line), flush=True)
        line = figure(
            f"decision_latency_p99_{groups}_groups", p99, rtt99, "grpc_aio_mtls_unary_rtt_p99", notes
        )
        line.update(
            target=TARGET_P99_S,
            target_text=f"≤ {TARGET_P99_S * 1000:g} ms (anchors goal 2)",
            met=p99 <= TARGET_P99_S,
        )
        print(json.dumps(line), flush=True)
    if len(p50s) >= 2:
        low, high = min(p50s), max(p50s)
        line = figure(
            f"decision_latency_p50_growth_{low}_to_{high}_groups",
            p50s[high],
            p50s[low],
            f"decision_latency_p50_{low}_groups (same run)",
            {"groups_from": low, "groups_to": high, "instances": INSTANCES},
        )
        line.update(
            target=TARGET_GROWTH,
            target_text=f"ratio ≤ {TARGET_GROWTH:g} (issue 15)",
            met=p50s[high] <= TARGET_GROWTH * p50s[low],
        )
        print(json.dumps(line), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument(
        "--samples", type=int, default=SAMPLES, help="UpsertGroup samples per run (default 200)"
    )
    parser.add_argument(
        "--groups",
        type=int,
        nargs="+",
        default=list(GROUP_COUNTS),
        help="group counts, one run each (default 1000 10000); each must divide 10,000",
    )
    args = parser.parse_args()
    for groups in args.groups:
        if groups < 1 or INSTANCES % groups or groups > INSTANCES:
            parser.error(f"--groups: {groups} does not divide {INSTANCES:,} instances into equal groups")
        if not 1 <= args.samples <= groups - WARMUP:
            parser.error(f"--samples must be between 1 and {groups - WARMUP} for {groups} groups")
    quiet_logging()
    return asyncio.run(amain(args.groups, args.samples))


if __name__ == "__main__":
    raise SystemExit(main())
