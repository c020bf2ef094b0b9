"""Benchmark: scale one group from 0 to 1000 instances through the real shard server, on the sim provider.

Measured: an in-process ``ServerApp`` (file:// object storage and SQLite under ``/dev/shm`` when it
exists, sim provider with 100 ms per call, fast election) leads its shard; then ``Shard.upsert_group``
- the call the Operator API's ``UpsertGroup`` handler makes, without the gRPC hop (one RPC is a fixed
millisecond or two against seconds here; ``decision_latency.py`` measures the gRPC path) - raises the
static group ``web`` from 0 to 1000. The figure is the time from just before that call to the moment
the sim acknowledged the last create (``max(sim.create_times)`` minus the start, both
``time.monotonic()``). Every create goes the full crash-safe path: SQLite row, pending record in
object storage, limiter, provider call, record and row updated. The run checks ``launch_count == 1000``
and that no instance id was launched twice. Extras: ``first_ack_s`` / ``half_ack_s`` (first and 500th
create acknowledged), ``converged_s`` (the group view first reported 1000 serving instances with
provider ids: the cache updated), ``records_settled_s`` (every instance record in object storage
carries its provider id: the follow-up writes of ``nstance.server.reconcile.followups``, which wait for the
burst to end, are done), ``capacity_checks`` (subnet-capacity reads the server made)
and ``throttled_calls`` (calls the sim refused).

Cases, each against an analytic baseline computed from its parameters:

* ``scale_out_0_to_1000_buckets`` - EC2's RunInstances buckets sped up 100x: the sim refuses calls
  beyond a request bucket (capacity 5, 200/s) and an instance bucket (capacity 1000, 200/s); the
  server mirrors the request bucket client-side one token shallower (``ServerOptions.create_bucket=
  (4, 200)``): two buckets with equal settings drift apart by the scheduling jitter between the
  client's take and the cloud's, and that one-token margin is what an operator leaves so the cloud
  never throttles; ``max_concurrent_creates`` 64. Baseline: the buckets' lower bound for 1000
  single-instance calls, when a call's tokens are taken as it starts (as EC2 does): call k
  (1-based) starts no earlier than ``max over buckets of (k - capacity) / refill``, and is
  acknowledged one latency later: (1000 - 5) / 200 + 0.1 = 5.075 s (the instance bucket, 1000
  deep, does not bind). Target ratio <= 1.10; ``throttled_calls`` must be 0.
* ``scale_out_0_to_1000_concurrency`` - no buckets anywhere, ``max_concurrent_creates`` 64.
  Baseline: ceil(1000 / 64) waves of one 100 ms call = 1.6 s. Target ratio <= 1.20.

The server's GC interval is its default (2 min), so no GC re-list runs during a case, and there is no
``create_rate_limit`` spacing. Prints one JSON object per line with ``name, value, unit, baseline,
baseline_name, ratio, target, target_text, met`` and extras. Takes about 20 s.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass

from _shard import (
    bench_config,
    new_cluster,
    quiet_logging,
    running_server,
    scratch_dir,
    wait_until,
    where_tmp,
)

from nstance.config import GroupUpdate

INSTANCES = 1000
LATENCY_S = 0.1
MAX_CONCURRENT = 64
SPEEDUP = 100
#: EC2 RunInstances (perf-reliability-anchors.md §1.2): request bucket 5 / 2 per s, instances 1000 / 2 per s.
EC2_REQUEST_BUCKET = (5.0, 2.0)
EC2_INSTANCE_BUCKET = (1000.0, 2.0)
RUN_TIMEOUT_S = 90.0

Bucket = tuple[float, float]


def sped_up(bucket: Bucket) -> Bucket:
    """The bucket with its refill rate multiplied by SPEEDUP (capacity unchanged)."""
    return bucket[0], bucket[1] * SPEEDUP


def bucket_lower_bound(n: int, buckets: list[Bucket], latency: float) -> float:
    """Earliest time the last of ``n`` one-instance creates can be acknowledged, tokens taken at call start.

    Every bucket starts full; call k (1-based) needs k tokens from each bucket, so it cannot start
    before ``(k - capacity) / refill`` for any of them.
    """
    last_start = 0.0
    for capacity, refill in buckets:
        if n > capacity:
            last_start = max(last_start, (n - capacity) / refill if refill > 0 else math.inf)
    return last_start + latency


def concurrency_lower_bound(n: int, concurrent: int, latency: float) -> float:
    """``n`` calls of ``latency`` each, at most ``concurrent`` at once."""
    return math.ceil(n / concurrent) * latency


@dataclass
class Outcome:
    seconds: float
    first_ack_s: float
    half_ack_s: float
    converged_s: float
    records_settled_s: float
    launch_count: int
    throttled_calls: int
    create_calls: int
    capacity_checks: int


async def scale_once(
    *,
    provider_options: dict[str, object],
    create_bucket: Bucket | None,
    max_concurrent: int,
) -> Outcome:
    """Start a leading server, scale ``web`` 0 -> INSTANCES, and time it (see the module docstring)."""
    with scratch_dir("nstance-bench-scale-") as tmp:
        cluster, addrs = new_cluster(tmp)
        config = bench_config(
            addrs,
            provider_options=provider_options,
            groups={"web": {"template": "app", "size": 0}},
            max_concurrent_creates=max_concurrent,
        )
        async with running_server(
            tmp, config, cluster=cluster, addrs=addrs, create_bucket=create_bucket
        ) as r:
            sim = r.sim
            before = sim.launch_count
            start = time.monotonic()
            await r.shard.upsert_group("default", "web", GroupUpdate(size=INSTANCES))
            await wait_until(lambda: sim.launch_count - before >= INSTANCES, RUN_TIMEOUT_S, "1000 launches")
            acks = sorted(t - start for t in sim.create_times[-INSTANCES:])
            value = acks[-1]

            def converged() -> bool:
                view = r.shard.list_groups("default")[0]
                return view.actual_size == INSTANCES and len(view.provider_ids) == INSTANCES

            await wait_until(converged, RUN_TIMEOUT_S, "the group view to show 1000 instances", poll=0.02)
            converged_s = time.monotonic() - start
            followups = r.shard.ops.followups
            await wait_until(
                lambda: followups.pending == 0, RUN_TIMEOUT_S, "the records to be finished", poll=0.02
            )
            records_settled_s = time.monotonic() - start
            await asyncio.sleep(0.5)  # a late duplicate create would land here
            launched = [vm.instance_id for vm in sim.vms.values()]
            if len(launched) != INSTANCES or sim.launch_count != INSTANCES:
                raise AssertionError(f"expected {INSTANCES} launches, sim launched {sim.launch_count}")
            if len(set(launched)) != len(launched):
                raise AssertionError(f"duplicate instance ids: {len(launched) - len(set(launched))} extra")
            return Outcome(
                seconds=value,
                first_ack_s=acks[0],
                half_ack_s=acks[INSTANCES // 2 - 1],
                converged_s=converged_s,
                records_settled_s=records_settled_s,
                launch_count=sim.launch_count,
                throttled_calls=sim.throttled_calls,
                create_calls=sim.calls["create_instance"],
                capacity_checks=sim.calls["check_subnet_capacity"],
            )


def result(
    name: str,
    outcome: Outcome,
    baseline: float,
    baseline_name: str,
    target: float,
    *,
    no_throttling: bool = False,
    **extra: object,
) -> dict[str, object]:
    ratio = outcome.seconds / baseline
    met = ratio <= target and (outcome.throttled_calls == 0 or not no_throttling)
    return {
        "name": name,
        "value": round(outcome.seconds, 4),
        "unit": "s",
        "baseline": round(baseline, 4),
        "baseline_name": baseline_name,
        "ratio": round(ratio, 4),
        "target": target,
        "target_text": f"ratio ≤ {target:.2f}" + (", no throttled call" if no_throttling else ""),
        "met": met,
        "first_ack_s": round(outcome.first_ack_s, 4),
        "half_ack_s": round(outcome.half_ack_s, 4),
        "converged_s": round(outcome.converged_s, 4),
        "records_settled_s": round(outcome.records_settled_s, 4),
        "launch_count": outcome.launch_count,
        "create_calls": outcome.create_calls,
        "throttled_calls": outcome.throttled_calls,
        "capacity_checks": outcome.capacity_checks,
        "max_concurrent_creates": MAX_CONCURRENT,
        "latency_s": LATENCY_S,
        "tmp": where_tmp(),
        **extra,
    }


async def case_buckets() -> dict[str, object]:
    request, instance = sped_up(EC2_REQUEST_BUCKET), sped_up(EC2_INSTANCE_BUCKET)
    client = (request[0] - 1, request[1])  # one token of margin below the cloud's burst
    outcome = await scale_once(
        provider_options={
            "latency": f"{int(LATENCY_S * 1000)}ms",
            "request_bucket": {"capacity": request[0], "refill_per_second": request[1]},
            "instance_bucket": {"capacity": instance[0], "refill_per_second": instance[1]},
        },
        create_bucket=client,
        max_concurrent=MAX_CONCURRENT,
    )
    baseline = bucket_lower_bound(INSTANCES, [request, instance], LATENCY_S)
    return result(
        "scale_out_0_to_1000_buckets",
        outcome,
        baseline,
        "ec2_run_instances_buckets_x100_lower_bound",
        1.10,
        no_throttling=True,
        request_bucket=list(request),
        instance_bucket=list(instance),
        client_bucket=list(client),
    )


async def case_concurrency() -> dict[str, object]:
    outcome = await scale_once(
        provider_options={"latency": f"{int(LATENCY_S * 1000)}ms"},
        create_bucket=None,
        max_concurrent=MAX_CONCURRENT,
    )
    baseline = concurrency_lower_bound(INSTANCES, MAX_CONCURRENT, LATENCY_S)
    return result(
        "scale_out_0_to_1000_concurrency",
        outcome,
        baseline,
        "ceil_1000_over_64_x_100ms",
        1.20,
    )


async def amain() -> int:
    for case in (case_buckets, case_concurrency):
        print(json.dumps(await case()), flush=True)
    return 0


def main() -> int:
    quiet_logging()
    return asyncio.run(amain())


if __name__ == "__main__":
    raise SystemExit(main())
