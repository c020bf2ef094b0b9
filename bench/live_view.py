"""Benchmark: one redraw of the live view (``nstance-admin watch``) with 50 instances.

A real ``nstance-server`` process (sim provider, file storage) leads its shard; 50 on-demand instances
are created through the Operator API, so the view has 50 instance IDs to show. Measured:

* ``live_view_redraw_50`` — seconds for one redraw's data as ``watch`` gathers it (``collect``: one
  ListGroups, then one ListInstances for at most ``DEFAULT_MAX_INSTANCES`` instances, on one mTLS
  channel) plus ``render``; the median of 30 redraws. Target: at most 1 s, so the view can redraw
  every second.
* Baseline (same run): the previous live view's cost for the same 50 instances, one
  ``nstance-admin instance show ID -o json`` process per instance. Measured for 5 instances and
  multiplied by 10 (the processes run one after the other, so the cost is linear).

Prints one JSON object per line: ``{"name", "value", "unit": "s", "baseline", "baseline_name",
"ratio", "target", "met"}`` (``ratio`` is baseline / value, the speed-up).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from _shard import SHARD, quiet_logging, scratch_dir

from nstance.admin.client import ShardClient, load_identity, open_channel
from nstance.admin.watch import DEFAULT_MAX_INSTANCES, collect, render
from nstance.rpc import operator_pb2
from nstance.testing.shardproc import LocalCluster, ServerProcess, free_port, server_addrs, shard_config

INSTANCES = 50
BASELINE_SAMPLE = 5
REDRAWS = 30
TARGET_S = 1.0


def main() -> None:
    quiet_logging()
    with scratch_dir("nstance-bench-live-") as tmp:
        cluster = LocalCluster(tmp / "bucket")
        cluster.init()
        addrs = server_addrs()
        config = shard_config(shard=SHARD, addrs=addrs, groups={"app": {"template": "app", "size": 0}})
        cluster.write_config(SHARD, config)
        identity_dir = cluster.operator_identity(tmp / "identity")
        server = ServerProcess(
            server_id="bench-1",
            shard=SHARD,
            bucket=cluster.bucket,
            cachedir=tmp / "cache",
            health_addr=f"127.0.0.1:{free_port()}",
        ).start()
        try:
            deadline = time.monotonic() + 120
            while not server.is_leader():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the server did not lead within 120 s:\n{server.log()[-2000:]}")
                time.sleep(0.1)
            target = addrs["operator_addr"]
            identity = load_identity(identity_dir)
            channel = open_channel(target, identity)
            client = ShardClient(SHARD, target, channel, 10.0)
            ids = [
                client.create_instance(operator_pb2.InstanceConfig(group="app")).instance_id
                for _ in range(INSTANCES)
            ]
            local = dict.fromkeys(ids, "app")

            times: list[float] = []
            for _ in range(REDRAWS):
                started = time.perf_counter()
                view = collect(client, local, datetime.now(UTC), DEFAULT_MAX_INSTANCES)
                render("bench", [view], "00:00:00", DEFAULT_MAX_INSTANCES)
                times.append(time.perf_counter() - started)
                assert not view.error, view.error
                assert len(view.instances) == INSTANCES, view
            channel.close()

            env = {
                **os.environ,
                "NSTANCE_ADMIN_SERVERS": f"{SHARD}={target}",
                "NSTANCE_ADMIN_IDENTITY_DIR": str(identity_dir),
            }
            admin = [str(Path(sys.executable).parent / "nstance-admin")]
            started = time.perf_counter()
            for instance_id in ids[:BASELINE_SAMPLE]:
                subprocess.run(
                    [*admin, "instance", "show", instance_id, "-o", "json"],
                    env=env,
                    check=True,
                    capture_output=True,
                )
            baseline = (time.perf_counter() - started) / BASELINE_SAMPLE * INSTANCES
        finally:
            server.stop()
    value = statistics.median(times)
    print(
        json.dumps(
            {
                "name": "live_view_redraw_50",
                "value": round(value, 4),
                "unit": "s",
                "baseline": round(baseline, 2),
                "baseline_name": "one nstance-admin instance show process per instance (5 measured, x10)",
                "ratio": round(baseline / value, 1),
                "target": TARGET_S,
                "met": value <= TARGET_S,
                "spread_s": [round(min(times), 4), round(max(times), 4)],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
