"""Benchmark: a MachinePool replica change reaching every shard through nstance-operator.

Set-up, all real processes on loopback: the Kubernetes API emulator (``python -m
nstance.testing.kubeapi``, its own process), three ``nstance-server`` processes (shards s1, s2, s3; sim
provider with 1 ms calls), and ``nstance-operator`` bootstrapped as the Helm chart would (config and CA
ConfigMaps, nonce Secret). The bench creates 100 NstanceMachinePools, each spread over the three
shards with a CAPI MachinePool of 3 replicas, and waits until every shard carries every group at size 1.

Measured: the time from just before the ``PATCH`` of ``MachinePool.spec.replicas`` (3 → 6, then back)
to the moment the last of the three shards announces the group at its new size on its ``WatchGroups``
stream (the server emits the event when ``UpsertGroup`` has been applied). That path is the whole
operator: MachinePool watch → NstanceMachinePool steps → three NstanceShardGroup patches → three
shard-group steps → ``UpsertGroup`` on each shard.

* ``operator_sync_single_p50_s`` / ``_p99_s`` - 40 changes one at a time (each waits for the last).
* ``operator_sync_burst_p50_s`` / ``_p99_s`` - all 100 pools changed at once, as an autoscaler reacting
  to a traffic spike might; latency of each pool's change. Target (issue #5): p99 <= 1 s.

* ``operator_sync_single_kube_calls_per_change`` / ``operator_sync_burst_kube_calls_per_change`` -
  the operator's Kubernetes API requests (every verb but WATCH, counted by the emulator and read from
  its ``/metrics``; this process's own calls carry another User-Agent and are left out) from just
  before the first change until the operator has made no call for ``QUIET_S``, divided by the number
  of changes, with the split by verb and resource in ``calls``. Baseline: the design minimum
  ``MIN_CALLS_PER_CHANGE`` (docs/benchmarks.md derives it); target ≤ 1.5 × that.
* ``operator_sync_burst_cpu_s`` - the CPU seconds every process of the benchmark (API emulator, operator,
  the three servers, this process) used from the burst's first ``PATCH`` until its last change was
  announced, split by process in ``by_process``; baseline: the CPU the machine had meanwhile (wall time
  x cores), so the ratio is how busy the machine was. ``floor_s`` (CPU / cores) is the shortest the
  burst could have taken here with that much work: when it exceeds the p99 target, the target cannot be
  met on this machine by waiting less, only by doing less.
* ``operator_sync_upsert_failures`` - Warning Events recording an UpsertGroup a server refused or
  failed; target 0 (``unreachable`` counts ShardUnreachable events apart: lost leases, deadlines).

The operator runs with ``--resync-interval 10s``: the servers announce group config changes only, and
instances that appear after an UpsertGroup reach the shard groups' status through the periodic list,
so a shorter interval than production's 30 s (with ``QUIET_S`` above it) puts those status updates
into the phase of the change that caused them.

Baseline, measured in the same run: the same change made by calling ``UpsertGroup`` on the three shards
directly from this process (concurrently, in a tenant the operator does not manage), p50 over 40
changes - the floor without Kubernetes and the operator. ``ratio`` = value / baseline. One JSON
object per line with ``name, value, unit, target, target_text, baseline, baseline_name, ratio, met``
(``target`` and ``met`` are null on the p50 lines, which have no target). Takes about a minute.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Final

import aiohttp
import grpc
from _agents import cpu_seconds, progress
from google.protobuf.empty_pb2 import Empty

from nstance.operator.crds import names
from nstance.operator.kube import (
    CONFIGMAPS,
    EVENTS,
    SECRETS,
    SERVICE_ACCOUNTS,
    Kube,
    Resource,
    load_configuration,
)
from nstance.rpc import operator_pb2, operator_pb2_grpc
from nstance.testing.kubeapi.metrics import RequestKey, parse
from nstance.testing.operatorproc import OperatorProcess, bootstrap_objects, capi_machine_pool
from nstance.testing.shardproc import LocalCluster, ServerProcess, server_addrs, shard_config, start_leader

REPO = Path(__file__).resolve().parents[1]
SHARDS = ("s1", "s2", "s3")
POOLS = 100
SINGLE_CHANGES = 40
TARGET_P99_S = 1.0
MIN_CALLS_PER_CHANGE = 11
"""Kubernetes API calls one pool change needs at least (see docs/benchmarks.md for the count)."""
CALLS_TARGET_RATIO = 1.5
RESYNC = "10s"
NAMESPACE = "default"
BENCH_AGENT = "nstance-bench"
"""The User-Agent of this process's own Kubernetes calls (not counted as the operator's)."""
QUIET_S = 12.0
"""The operator has finished reacting once it made no API call for this long (longer than ``RESYNC``,
so the status updates of instances that appear after an UpsertGroup are counted)."""
SHARD_GROUP_KIND = "NstanceShardGroup"
FAILURE_REASONS = ("ProviderError", "ConfigInvalid")
"""Warning Event reasons the shard-group controller records when a server refused or failed an
UpsertGroup (a groups-document conflict that exhausted its retries would be one of these).
ShardUnreachable - a server that lost its lease under the machine's load, or a call past its
deadline - is reported apart (``unreachable`` on the same line)."""
POOL_RES = Resource(names.GROUP, names.VERSION, names.NSTANCE_MACHINE_POOLS, names.KIND_MACHINE_POOL)
BOOTSTRAP_RESOURCES = {"ConfigMap": CONFIGMAPS, "Secret": SECRETS, "ServiceAccount": SERVICE_ACCOUNTS}
"""Where each kind of ``bootstrap_objects`` is created (the API server refuses a kind sent elsewhere)."""
CAPI_POOL_RES = Resource(
    names.CAPI_GROUP, names.CAPI_VERSION, names.MACHINE_POOLS, names.CAPI_KIND_MACHINE_POOL
)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


@contextmanager
def emulator(root: Path) -> Iterator[tuple[Path, str, int]]:
    """The Kubernetes API emulator in its own process; yields its kubeconfig, URL and process id."""
    kubeconfig = root / "kubeconfig"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nstance.testing.kubeapi",
            "--port",
            "0",
            "--crds",
            str(REPO / "config" / "crd" / "bases"),
            str(REPO / "config" / "crd" / "capi"),
            "--kubeconfig",
            str(kubeconfig),
        ],
        stdout=subprocess.PIPE,
        stderr=(root / "kubeapi.log").open("wb"),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the emulator did not start: {(root / 'kubeapi.log').read_text()}")
        yield kubeconfig, str(json.loads(line)["url"]), proc.pid
    finally:
        proc.terminate()
        with suppress(subprocess.TimeoutExpired):
            proc.wait(10)


Calls = Counter[RequestKey]


class ApiCalls:
    """The emulator's request counters (its ``/metrics``): what the operator asked the API server."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def snapshot(self) -> Calls:
        async with aiohttp.ClientSession() as session, session.get(f"{self.url}/metrics") as response:
            response.raise_for_status()
            counts = parse(await response.text())
        # Watches are opened once per kind and renewed on a timer, not per change: left out.
        return Counter({k: n for k, n in counts.items() if k.client != BENCH_AGENT and k.verb != "WATCH"})

    async def settle(self, limit: float = 120.0) -> Calls:
        """The counts once the operator made no call for ``QUIET_S`` (its reaction is complete)."""
        deadline = time.monotonic() + limit
        last = await self.snapshot()
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < QUIET_S:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the operator kept calling the API server for {limit:g} s")
            await asyncio.sleep(0.5)
            now = await self.snapshot()
            if now != last:
                last, quiet_since = now, time.monotonic()
        return last


RETRIED: Final = (
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
)
"""A server between leases (it lost its lease under the machine's load): call again, as the operator
does; the wait counts in the baseline."""


async def upsert(stub: operator_pb2_grpc.OperatorServiceStub, request: Any) -> None:
    for _ in range(30):
        try:
            await stub.UpsertGroup(request, timeout=10)
            return
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in RETRIED:
                raise
            progress(f"baseline UpsertGroup: {exc.code().name}; calling again")
            await asyncio.sleep(1.0)
    raise TimeoutError("the baseline UpsertGroup kept failing")


def per_change(before: Calls, after: Calls, changes: int) -> tuple[float, dict[str, float]]:
    """Operator calls per change between two snapshots, in total and by verb and resource."""
    diff = after - before
    split: dict[str, float] = {}
    for key, count in sorted(diff.items()):
        what = f"{key.verb} {key.resource}" + (f"/{key.subresource}" if key.subresource else "")
        split[what] = split.get(what, 0.0) + count / changes
    return sum(diff.values()) / changes, {k: round(v, 2) for k, v in split.items()}


class Watcher:
    """WatchGroups on every shard: the moment each (shard, group) was last announced at each size."""

    def __init__(self, stubs: dict[str, operator_pb2_grpc.OperatorServiceStub]) -> None:
        self.stubs = stubs
        self.seen: dict[tuple[str, str, int], float] = {}
        self.changed = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._follow(shard, stub)) for shard, stub in self.stubs.items()]

    async def _follow(self, shard: str, stub: operator_pb2_grpc.OperatorServiceStub) -> None:
        # A server that lost its lease under load ends the stream: reconnect and list what changed
        # meanwhile (stamped when seen, so a gap makes a change look slower, never faster).
        while True:
            try:
                listed = await stub.ListGroups(Empty(), timeout=30)
                now = time.monotonic()
                for group in listed.groups:
                    self.seen.setdefault((shard, group.key, group.size), now)
                self.changed.set()
                async for event in stub.WatchGroups(Empty()):
                    self.seen[(shard, event.group.key, event.group.size)] = time.monotonic()
                    self.changed.set()
            except grpc.aio.AioRpcError as exc:
                progress(f"WatchGroups on {shard} ended ({exc.code().name}); reconnecting")
            await asyncio.sleep(1.0)

    async def wait_all(self, group: str, size: int, limit: float = 300.0) -> float:
        """When the last shard announced ``group`` at ``size`` (waits for it)."""
        deadline = time.monotonic() + limit
        while True:
            times = [self.seen.get((shard, group, size)) for shard in self.stubs]
            if all(t is not None for t in times):
                return max(t for t in times if t is not None)
            if time.monotonic() > deadline:
                raise TimeoutError(f"group {group} never reached size {size} on every shard")
            self.changed.clear()
            with suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 1.0)

    def forget(self, group: str) -> None:
        for key in [k for k in self.seen if k[1] == group]:
            del self.seen[key]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def measure(
    kubeconfig: Path,
    api_url: str,
    cluster: LocalCluster,
    stubs: dict[str, Any],
    baseline_stubs: dict[str, Any],
    pids: dict[str, int],
) -> list[dict[str, Any]]:
    kube = Kube.from_configuration(await load_configuration(str(kubeconfig)), user_agent=BENCH_AGENT)
    calls = ApiCalls(api_url)
    watcher = Watcher(stubs)
    watcher.start()
    capi_cluster = f"{cluster.cluster_id}--default"
    groups = [f"pool-{i:03d}" for i in range(POOLS)]
    try:
        for group in groups:
            await kube.create(CAPI_POOL_RES, capi_machine_pool(group, NAMESPACE, capi_cluster, 3), NAMESPACE)
            await kube.create(
                POOL_RES,
                {
                    "metadata": {"name": group, "namespace": NAMESPACE},
                    "spec": {"group": group, "shards": list(SHARDS), "template": "app"},
                },
                NAMESPACE,
            )
        progress(f"{POOLS} pools created; waiting for every shard to carry every group")
        for group in groups:
            await watcher.wait_all(group, 1, limit=300)
        progress("initial sync done; waiting for the operator to settle")
        before_single = await calls.settle()
        progress("measuring single changes")

        current = dict.fromkeys(groups, 3)

        async def change(group: str, replicas: int) -> float:
            assert current[group] != replicas, "a change must change something"
            watcher.forget(group)
            started = time.monotonic()
            await kube.patch(CAPI_POOL_RES, group, {"spec": {"replicas": replicas}}, NAMESPACE)
            current[group] = replicas
            return await watcher.wait_all(group, replicas // len(SHARDS)) - started

        # Each single change flips one pool between 3 and 6 replicas (1 and 2 per shard).
        single = [await change(groups[i], 6) for i in range(SINGLE_CHANGES)]
        single_calls = per_change(before_single, await calls.settle(), SINGLE_CHANGES)
        await asyncio.gather(*(change(groups[i], 3) for i in range(SINGLE_CHANGES)))
        before_burst = await calls.settle()
        progress(f"measuring a burst of {POOLS} changes")
        cpu_before, burst_started = cpu_of(pids), time.monotonic()
        burst = list(await asyncio.gather(*(change(g, 6) for g in groups)))
        burst_cpu = burst_cpu_figure(cpu_before, cpu_of(pids), time.monotonic() - burst_started)
        burst_calls = per_change(before_burst, await calls.settle(), POOLS)
        failures, unreachable = await upsert_failures(kube)
        progress("measuring the direct-UpsertGroup baseline")
        # The baseline's groups live in a tenant the operator does not manage: groups of its own
        # tenant that it does not know, it imports as MachinePools and then sets their sizes itself.
        direct_watcher = Watcher(baseline_stubs)
        direct_watcher.start()

        async def direct(group: str, size: int) -> float:
            direct_watcher.forget(group)
            started = time.monotonic()
            request = operator_pb2.UpsertGroupRequest(
                key=group, config=operator_pb2.GroupConfig(template="app", size=size)
            )
            await asyncio.gather(*(upsert(stub, request) for stub in baseline_stubs.values()))
            return await direct_watcher.wait_all(group, size) - started

        try:
            baseline = [await direct(f"direct-{i % 5}", 1 + i % 2) for i in range(SINGLE_CHANGES)]
        finally:
            await direct_watcher.stop()
    finally:
        await watcher.stop()
        await kube.close()
    base = statistics.median(baseline)
    results = []
    for name, values in (("operator_sync_single", single), ("operator_sync_burst", burst)):
        for label, q in (("p50", 0.5), ("p99", 0.99)):
            value = percentile(values, q)
            target = TARGET_P99_S if label == "p99" else None  # the issue sets no p50 target
            results.append(
                {
                    "name": f"{name}_{label}_s",
                    "value": round(value, 4),
                    "unit": "s",
                    "target": target,
                    "target_text": f"≤ {TARGET_P99_S:g} s" if target is not None else None,
                    "baseline": round(base, 4),
                    "baseline_name": "direct UpsertGroup on 3 shards, p50",
                    "ratio": round(value / base, 2),
                    "met": value <= target if target is not None else None,
                    "samples": len(values),
                    "pools": POOLS,
                    "shards": len(SHARDS),
                }
            )
    limit = CALLS_TARGET_RATIO * MIN_CALLS_PER_CHANGE
    for name, (value, split) in (
        ("operator_sync_single", single_calls),
        ("operator_sync_burst", burst_calls),
    ):
        results.append(
            {
                "name": f"{name}_kube_calls_per_change",
                "value": round(value, 2),
                "unit": "calls",
                "target": limit,
                "target_text": f"≤ {CALLS_TARGET_RATIO:g} × the design minimum ({limit:g})",
                "baseline": MIN_CALLS_PER_CHANGE,
                "baseline_name": "design minimum per pool change (docs/benchmarks.md)",
                "ratio": round(value / MIN_CALLS_PER_CHANGE, 2),
                "met": value <= limit,
                "calls": split,
                "pools": POOLS,
                "shards": len(SHARDS),
            }
        )
    results.append(burst_cpu)
    results.append(
        {
            "name": "operator_sync_upsert_failures",
            "value": failures,
            "unit": "failures",
            "target": 0,
            "target_text": "0",
            "baseline": None,
            "baseline_name": None,
            "ratio": None,
            "met": failures == 0,
            "unreachable": unreachable,
        }
    )
    return results


def pid_of(proc: subprocess.Popen[bytes] | None) -> int:
    if proc is None:
        raise RuntimeError("a process of the benchmark did not start")
    return proc.pid


def cpu_of(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds each process has used so far."""
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def burst_cpu_figure(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, Any]:
    """The CPU every process of the benchmark used from the burst's first PATCH until its last change
    was announced, against the CPU the machine had meanwhile (``wall`` x cores): what the burst cost,
    and whether the machine, not waiting, set its length. ``floor_s`` = CPU / cores is the shortest the
    burst could have been on this machine with that much work."""
    used = {name: round(after[name] - before[name], 2) for name in before}
    total = sum(used.values())
    cores = os.cpu_count() or 1
    return {
        "name": "operator_sync_burst_cpu_s",
        "value": round(total, 2),
        "unit": "CPU s",
        "target": None,
        "target_text": None,
        "baseline": round(wall * cores, 2),
        "baseline_name": f"the burst's wall time x {cores} cores",
        "ratio": round(total / (wall * cores), 2),
        "met": None,
        "floor_s": round(total / cores, 2),
        "wall_s": round(wall, 2),
        "by_process": used,
    }


async def upsert_failures(kube: Kube) -> tuple[int, int]:
    """Warning Events on shard groups: (UpsertGroup refused or failed, shard unreachable)."""
    reasons = [
        event.get("reason")
        for event in await kube.list(EVENTS, NAMESPACE)
        if (event.get("involvedObject") or {}).get("kind") == SHARD_GROUP_KIND
        and event.get("type") == "Warning"
    ]
    return sum(r in FAILURE_REASONS for r in reasons), reasons.count("ShardUnreachable")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="nstance-bench-opsync-") as tmp:
        root = Path(tmp)
        cluster = LocalCluster(root / "bucket")
        cluster.init()
        addrs = {shard: server_addrs() for shard in SHARDS}
        servers: list[ServerProcess] = []
        operator: OperatorProcess | None = None
        try:
            for shard in SHARDS:
                config = shard_config(
                    shard=shard,
                    addrs=addrs[shard],
                    provider="sim",
                    provider_options={"latency": "1ms"},
                    groups={},
                    shard_extra={"create_rate_limit": "0s"},
                    # Production's leader timeout: three servers, the operator and the API emulator
                    # share two cores here, and a 1 s lease would flap under that load.
                    election={
                        "frequent_interval": "1s",
                        "infrequent_interval": "5s",
                        "leader_timeout": "15s",
                    },
                )
                cluster.write_config(shard, config)
                servers.append(start_leader(cluster, root / shard, shard=shard))
            identity = cluster.operator_identity(root / "bench-identity")
            baseline_identity = cluster.operator_identity(root / "baseline-identity", tenant="bench")
            with emulator(root) as (kubeconfig, api_url, api_pid):

                async def bootstrap() -> None:
                    kube = Kube.from_configuration(
                        await load_configuration(str(kubeconfig)), user_agent=BENCH_AGENT
                    )
                    try:
                        for obj in bootstrap_objects(cluster, addrs, namespace=NAMESPACE):
                            res = BOOTSTRAP_RESOURCES[obj["kind"]]
                            await kube.create(res, obj, NAMESPACE)
                    finally:
                        await kube.close()

                asyncio.run(bootstrap())
                operator = OperatorProcess(
                    kubeconfig=kubeconfig,
                    namespace=NAMESPACE,
                    log_path=root / "operator.log",
                    args=[
                        "--log-format",
                        "text",
                        "--no-leader-elect",
                        "--disable-webhooks",
                        # Group events come from config changes only: instances that appear after
                        # an UpsertGroup reach the shard groups' status through the periodic list.
                        # 10 s here, so a change's status updates land in its own phase's count
                        # (each phase waits QUIET_S > 10 s without a call before it is counted).
                        "--resync-interval",
                        RESYNC,
                    ],
                    env={"PYTHONUNBUFFERED": "1"},
                ).start()
                operator.wait_ready(60)

                def stubs_for(directory: Path) -> dict[str, Any]:
                    stubs = {}
                    for shard in SHARDS:
                        creds = grpc.ssl_channel_credentials(
                            root_certificates=(directory / "ca.crt").read_bytes(),
                            private_key=(directory / "identity.key").read_bytes(),
                            certificate_chain=(directory / "identity.crt").read_bytes(),
                        )
                        channel = grpc.aio.secure_channel(
                            addrs[shard]["operator_addr"],
                            creds,
                            options=[("grpc.ssl_target_name_override", "nstance-server")],
                        )
                        stubs[shard] = operator_pb2_grpc.OperatorServiceStub(channel)
                    return stubs

                pids = {"api emulator": api_pid, "nstance-operator": pid_of(operator.proc)}
                for shard, server in zip(SHARDS, servers, strict=True):
                    pids[f"nstance-server {shard}"] = pid_of(server.proc)
                pids["benchmark (clients, watchers)"] = os.getpid()

                async def run() -> list[dict[str, Any]]:
                    return await measure(
                        kubeconfig, api_url, cluster, stubs_for(identity), stubs_for(baseline_identity), pids
                    )

                try:
                    for result in asyncio.run(run()):
                        print(json.dumps(result), flush=True)
                except BaseException:
                    sys.stderr.write(operator.log())
                    raise
        finally:
            if operator is not None:
                operator.stop()
            for server in servers:
                server.stop()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
