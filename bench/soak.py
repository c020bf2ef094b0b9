"""Benchmark: a shard under churn - does the server give back what each VM's life took?

Setup: an in-process ``ServerApp`` (file:// object storage and SQLite under ``/dev/shm`` when it
exists) leads its shard on the ``local`` provider, so every instance is a real ``nstance-agent``
process: it registers with its nonce, gets its certificate, holds its mTLS streams through the TLS
front and reports health every 2 s. GC runs every 5 s with a deleted-record retention of 20 s, so
records and rows of deleted instances are purged within the run.

One cycle: the group ``web`` goes from 2 to 6 instances and waits until all six report health, then
back to 2 and waits until the four are deleted and their agent processes gone (about a second on 2
cores). ``--warmup`` cycles let caches, pools and the allocator reach their working size; then the
shard is left quiet until the deleted instances' records and rows are purged, and the process is
sampled: the baseline. ``--cycles`` more cycles and the same quiet wait give the sample at the end.
Both samples see the same state: the 2 live instances and nothing else to keep.

Figures (end against baseline, in the same run):
- ``soak_rss_kib``: RSS (``growth_per_vm_kib``: per instance created and deleted in the measured
  cycles). Target ratio <= 1.10: a leak of 20 KiB per VM over the default 150 cycles (600 VMs) would
  cross it. (The process also holds the benchmark's client side, which is small.)
- ``soak_py_blocks``: Python's allocated memory blocks (``sys.getallocatedblocks``), with
  ``growth_per_vm``; no target (bounded caches, such as the 4,096 verified client certificates of the
  interceptor, fill as new agents connect).
- ``soak_sockets_end``, ``soak_tasks_end``: open sockets and asyncio tasks. Target: no more than at
  the baseline. ``soak_fds_end`` and ``soak_threads_end`` are reported without one: SQLite's
  connection pool and the worker thread pools grow up to their limits when work happens to overlap.
- ``soak_live_agents_end``, ``soak_front_peers_end``: agent processes alive and mTLS connections in the
  TLS front's table. Target: exactly the 2 live instances.
- ``soak_rows_end``, ``soak_records_end``: SQLite rows (deleted ones included) and instance records
  in the bucket. Target: exactly the 2 live instances' (the deleted ones purged).

Prints one JSON object per cycle and one per figure; about 4 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from _shard import (
    ELECTION,
    SHARD,
    new_cluster,
    quiet_logging,
    running_app,
    scratch_dir,
    wait_until,
    where_tmp,
)

from nstance.config import GroupUpdate
from nstance.core.cli import Stopped, raise_on_stop_signals, stop_signal
from nstance.core.clock import SystemClock
from nstance.db import repo
from nstance.providers.local import LocalProvider
from nstance.server.app import ServerApp
from nstance.testing.shardproc import LocalCluster, shard_config

LOW, HIGH = 2, 6
WARMUP, CYCLES = 10, 150
REPORT_INTERVAL = "2s"
STEP_TIMEOUT_S = 180.0
#: GC every 5 s purges what was deleted over 20 s before: a quiet shard is back to its live instances
#: within about 25 s, and a sample waits up to this long for that.
QUIET_LIMIT_S = 90.0
RSS_TARGET = 1.10


def process_sample() -> dict[str, int]:
    """This process: RSS (KiB), Python's allocated memory blocks, threads, open file descriptors and how
    many of those are sockets."""
    fields = dict(
        line.split(":", 1) for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines()
    )
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone already
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    return {
        "rss_kib": int(fields["VmRSS"].split()[0]),
        "py_blocks": sys.getallocatedblocks(),
        "threads": int(fields["Threads"]),
        "fds": len(links),
        "sockets": sum(link.startswith("socket:") for link in links),
    }


class Churn:
    """Drives the cycles and reads what they leave behind in the running server."""

    def __init__(self, app: ServerApp, tmp: Path, bucket: Path) -> None:
        assert app.shard is not None
        assert app.tls_front is not None
        self.shard, self.front = app.shard, app.tls_front
        #: A second view of the server's instance directory, read only to count live agent processes.
        self.agents = LocalProvider(tmp / "cache" / "local-instances", clock=SystemClock())
        self.bucket = bucket

    def rows(self) -> tuple[int, int, int]:
        """(rows reporting health among the active ones, active rows, every row, deleted ones included)."""
        with self.shard.ctx.db.read_session() as db:
            active = repo.list_active_instances(db, tenant="default", group_key="web")
            every = repo.list_instances(db, include_deleted=True)
        return sum(row.health_at is not None for row in active), len(active), len(every)

    def records(self) -> int:
        """Instance records in the bucket (``.../instance/{tenant}.{id}.json``)."""
        return sum(1 for _ in self.bucket.rglob("instance/*.json"))

    def sample(self) -> dict[str, Any]:
        _, active, every = self.rows()
        return {
            **process_sample(),
            "tasks": len(asyncio.all_tasks()),
            "peers": len(self.front.peers),
            "agents": len(self.agents.running_agents()),
            "active": active,
            "rows": every,
            "records": self.records(),
        }

    async def cycle(self) -> dict[str, Any]:
        started = time.monotonic()
        await self.shard.upsert_group("default", "web", GroupUpdate(size=HIGH))
        await wait_until(lambda: self.rows()[0] >= HIGH, STEP_TIMEOUT_S, f"{HIGH} reporting instances", 0.1)
        await self.shard.upsert_group("default", "web", GroupUpdate(size=LOW))
        await wait_until(
            lambda: self.rows()[1] == LOW and len(self.agents.running_agents()) == LOW,
            STEP_TIMEOUT_S,
            f"the group back at {LOW} with {LOW} agent processes",
            0.1,
        )
        return {**self.sample(), "s": round(time.monotonic() - started, 1)}

    async def quiet_sample(self) -> dict[str, Any]:
        """The sample once the deleted instances are purged and their connections gone (or after
        ``QUIET_LIMIT_S``: what is left then is what the figures report)."""
        started = time.monotonic()

        def settled() -> bool:
            now = self.sample()
            return bool(now["rows"] == now["records"] == now["peers"] == LOW)

        with contextlib.suppress(TimeoutError):
            await wait_until(settled, QUIET_LIMIT_S, "the deleted instances to be purged", 0.5)
        return {**self.sample(), "quiet_s": round(time.monotonic() - started, 1)}


def figure(
    name: str, value: float, unit: str, baseline: float, baseline_name: str, **extra: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_name": baseline_name,
        "ratio": round(value / baseline, 4) if baseline else None,
        **extra,
    }


def report(base: dict[str, Any], end: dict[str, Any], cycles: int) -> list[dict[str, Any]]:
    """The figures: the quiet sample after the measured cycles against the one before them."""
    vms = (HIGH - LOW) * cycles  # created and deleted
    rss_ratio = end["rss_kib"] / base["rss_kib"]
    lines = [
        figure(
            "soak_rss_kib",
            end["rss_kib"],
            "KiB",
            base["rss_kib"],
            "process RSS after the warm-up, quiet",
            growth_per_vm_kib=round((end["rss_kib"] - base["rss_kib"]) / vms, 3),
            vms=vms,
            target=RSS_TARGET,
            target_text=f"ratio <= {RSS_TARGET:.2f} after {vms} VMs",
            met=rss_ratio <= RSS_TARGET,
        ),
        figure(
            "soak_py_blocks",
            end["py_blocks"],
            "blocks",
            base["py_blocks"],
            "Python's allocated memory blocks after the warm-up, quiet",
            growth_per_vm=round((end["py_blocks"] - base["py_blocks"]) / vms, 2),
            vms=vms,
        ),
    ]
    for key, what, bounded in (
        ("sockets", "open sockets", True),
        ("tasks", "asyncio tasks", True),
        ("fds", "open file descriptors (SQLite's pool opens connections as reads overlap)", False),
        ("threads", "threads (the worker pools start threads as work overlaps)", False),
    ):
        targets = {"target_text": "no more than after the warm-up", "met": end[key] <= base[key]}
        lines.append(
            figure(
                f"soak_{key}_end",
                end[key],
                key,
                base[key],
                f"{what} after the warm-up, quiet",
                **(targets if bounded else {}),
            )
        )
    for key, name, what in (
        ("agents", "live_agents", "agent processes alive"),
        ("peers", "front_peers", "connections in the TLS front's table"),
        ("rows", "rows", "SQLite rows, deleted ones included"),
        ("records", "records", "instance records in the bucket"),
    ):
        lines.append(
            figure(
                f"soak_{name}_end",
                end[key],
                key,
                base[key],
                f"{what} after the warm-up, quiet",
                target_text=f"exactly the {LOW} live instances",
                met=end[key] == LOW,
            )
        )
    return lines


async def churn_cycles(
    tmp: Path, config: dict[str, Any], cluster: LocalCluster, warmup: int, cycles: int
) -> list[dict[str, Any]]:
    """Run the server, its warm-up and measured cycles; the two quiet samples."""
    async with running_app(tmp, config, cluster=cluster) as app:
        churn = Churn(app, tmp, cluster.bucket)
        await wait_until(lambda: churn.rows()[0] >= LOW, STEP_TIMEOUT_S, f"{LOW} reporting instances", 0.1)
        quiet = []
        for number in range(1, warmup + cycles + 1):
            print(
                json.dumps({"cycle": number, "warmup": number <= warmup, **await churn.cycle()}), flush=True
            )
            if number in (warmup, warmup + cycles):
                quiet.append(await churn.quiet_sample())
                print(json.dumps({"quiet_after_cycle": number, **quiet[-1]}), flush=True)
    return quiet


async def amain(warmup: int, cycles: int) -> int:
    quiet_logging()
    os.environ["NSTANCE_REPORT_INTERVAL"] = REPORT_INTERVAL  # the agents inherit this process's environment
    with scratch_dir("nstance-bench-soak-") as tmp:
        cluster, addrs = new_cluster(tmp)
        config = shard_config(
            shard=SHARD,
            addrs=addrs,
            provider="local",
            provider_options={"stop_instances_on_close": True},
            election=ELECTION,
            groups={"web": {"template": "app", "size": LOW}},
            shard_extra={
                "health_check_interval": REPORT_INTERVAL,
                "garbage_collection": {
                    "interval": "5s",
                    "registration_timeout": "2m",
                    "deleted_record_retention": "20s",
                },
            },
        )
        try:
            quiet = await churn_cycles(tmp, config, cluster, warmup, cycles)
        finally:
            # The server stops its agents when it stops (stop_instances_on_close). Should it not have
            # (it was stopped twice, or failed), the ones its provider recorded here are stopped now:
            # they run in sessions of their own, out of reach of a signal to this process's group.
            leftover = LocalProvider(
                tmp / "cache" / "local-instances", clock=SystemClock(), stop_instances_on_close=True
            )
            await leftover.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    notes = {"cycles": cycles, "warmup_cycles": warmup, "cpu_s": round(usage.ru_utime + usage.ru_stime, 1)}
    for line in report(quiet[0], quiet[1], cycles):
        print(json.dumps({**line, **notes, "tmp": where_tmp()}), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--warmup", type=int, default=WARMUP, help=f"warm-up cycles (default {WARMUP})")
    parser.add_argument("--cycles", type=int, default=CYCLES, help=f"measured cycles (default {CYCLES})")
    args = parser.parse_args()
    if args.warmup < 1 or args.cycles < 1:
        parser.error("--warmup and --cycles must be at least 1")
    raise_on_stop_signals()  # SIGTERM (run_all's stop, a timeout) unwinds, so the agents are stopped
    try:
        return asyncio.run(amain(args.warmup, args.cycles))
    except (KeyboardInterrupt, Stopped) as exc:
        signum = stop_signal(exc)
        print(f"soak.py: stopped by {signum.name}; the server and its agents were stopped", file=sys.stderr)
        return 128 + signum


if __name__ == "__main__":
    raise SystemExit(main())
