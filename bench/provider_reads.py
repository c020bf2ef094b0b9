"""Benchmark: steady-state provider reads at 5,000 instances, as a share of EC2's Describe budget.

Measured: an in-process ``ServerApp`` (file:// storage and SQLite under ``/dev/shm`` when it exists)
on the sim provider with EC2's RunInstances buckets (request 5 + 2/s, instances 1000 + 2/s) sped up
100x so the fill takes seconds, scales the static group ``web`` to 5,000. Once every instance runs,
the sim's call counters are read at the start and end of a window as long as the GC interval
(production's default, 2 min) plus 10 s, so the window holds at least one full GC cycle (the
re-list of every VM the server makes to find leaks and vanished VMs) and every periodic resync.

Reads are counted as EC2 requests: ``get_instance`` and ``check_subnet_capacity`` are one
DescribeInstances / DescribeSubnets call each, and ``list_instances`` is one filtered DescribeInstances
call per page of 1,000 (the maximum page size), so 5 per re-list at 5,000 instances.

Budget (reference/perf-reliability-anchors.md §1.2 and goal 7): EC2's non-mutating bucket refills
20 requests/s = 1,200 per minute; the target is reads ≤ 10 % of it (≤ 120 per minute) with no throttled
call. The instances never register (no agents on the sim), and ``registration_timeout`` is 1 h, so
nothing is replaced during the window: this is the read load of a fleet at rest, which is what the
budget must leave room beside. One JSON object per line with ``name, value, unit, budget, ratio,
target, target_text, met`` and the raw counts. Takes about three minutes.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter

from _shard import (
    bench_config,
    new_cluster,
    quiet_logging,
    running_server,
    scratch_dir,
    wait_until,
)

from nstance.config import GroupUpdate

INSTANCES = 5000
SPEEDUP = 100
EC2_REQUEST_BUCKET = (5.0, 2.0 * SPEEDUP)
EC2_INSTANCE_BUCKET = (1000.0, 2.0 * SPEEDUP)
GC_INTERVAL_S = 120.0
WINDOW_S = GC_INTERVAL_S + 10.0
PAGE_SIZE = 1000
#: EC2 non-mutating refill (20 requests/s) per minute.
BUDGET_PER_MINUTE = 20.0 * 60.0
TARGET_RATIO = 0.10


def ec2_requests(calls: Counter[str], instances: int) -> float:
    """The EC2 API requests these provider calls amount to (a re-list is one call per page)."""
    pages = max(1, math.ceil(instances / PAGE_SIZE))
    return calls["get_instance"] + calls["check_subnet_capacity"] + calls["list_instances"] * pages


async def run() -> dict[str, object]:
    with scratch_dir("nstance-bench-reads-") as tmp:
        cluster, addrs = new_cluster(tmp)
        config = bench_config(
            addrs,
            provider_options={
                "latency": "5ms",
                "request_bucket": {
                    "capacity": EC2_REQUEST_BUCKET[0],
                    "refill_per_second": EC2_REQUEST_BUCKET[1],
                },
                "instance_bucket": {
                    "capacity": EC2_INSTANCE_BUCKET[0],
                    "refill_per_second": EC2_INSTANCE_BUCKET[1],
                },
            },
            groups={"web": {"template": "app", "size": 0}},
            max_concurrent_creates=64,
            gc={"interval": f"{int(GC_INTERVAL_S)}s", "registration_timeout": "1h"},
        )
        async with running_server(
            tmp, config, cluster=cluster, addrs=addrs, create_bucket=(4.0, EC2_REQUEST_BUCKET[1])
        ) as server:
            await server.shard.upsert_group("default", "web", GroupUpdate(size=INSTANCES))
            await wait_until(
                lambda: server.sim.launch_count >= INSTANCES, 300, f"{INSTANCES} instances launched", poll=0.2
            )

            def settled() -> bool:
                views = server.shard.list_groups("default")
                return any(v.key == "web" and v.actual_size == INSTANCES for v in views)

            await wait_until(settled, 300, "the group to report every instance", poll=0.5)
            before = Counter(server.sim.calls)
            throttled_before = server.sim.throttled_calls
            started = time.monotonic()
            await asyncio.sleep(WINDOW_S)
            elapsed = time.monotonic() - started
            during = Counter(server.sim.calls)
            during.subtract(before)
            throttled = server.sim.throttled_calls - throttled_before
            launches = server.sim.launch_count
    reads = ec2_requests(during, INSTANCES)
    per_minute = reads / (elapsed / 60.0)
    ratio = per_minute / BUDGET_PER_MINUTE
    return {
        "name": "provider_reads_per_minute_5000_instances",
        "value": round(per_minute, 2),
        "unit": "EC2 read requests per minute",
        "budget": BUDGET_PER_MINUTE,
        "ratio": round(ratio, 4),
        "target": TARGET_RATIO,
        "target_text": f"ratio ≤ {TARGET_RATIO:.2f}, no throttled call",
        "met": ratio <= TARGET_RATIO and throttled == 0,
        "window_s": round(elapsed, 1),
        "calls": {k: v for k, v in sorted(during.items()) if v},
        "throttled_calls": throttled,
        "launches": launches,
    }


def main() -> None:
    quiet_logging()
    print(json.dumps(asyncio.run(run())), flush=True)


if __name__ == "__main__":
    main()
