"""Scale-down, DeleteGroup and lost leadership stop a burst of creates within a second; concurrent creates.

In-process leader (real SQLite file, in-memory object store) on a sim provider that takes 50 ms per
create, with 8 creates in flight at most: a 5,000-instance burst would take half a minute. Creates
already sent to the provider complete and are then handled like any other instance; those still
waiting for the limiter are called off. A create pipeline whose fencing fails ends at once and
yields to the event loop (it used to spin through the whole burst without ever yielding). Concurrent
``CreateInstance`` calls with one instance id share one create and all get that instance.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_shard_cloud_features import Harness, RecordingSim

from nstance.config import GroupUpdate
from nstance.core.clock import ManualClock, SystemClock
from nstance.core.errors import FailedPrecondition
from nstance.core.ids import new_instance_id
from nstance.server.shard.api import InstanceRequest
from nstance.server.state.limits import CreateLimiter
from nstance.testing.shardproc import LocalCluster, server_addrs, shard_config, start_leader
from nstance.testing.waiting import eventually

pytestmark = pytest.mark.timeout(60)
BURST = ("default", "burst")
MAX_IN_FLIGHT = 8


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    clock = ManualClock()
    harness = Harness(tmp_path, size=0, clock=clock, sim=RecordingSim(clock=clock, latency=0.05))
    harness.ctx.limiter = CreateLimiter(clock=SystemClock(), max_concurrent=MAX_IN_FLIGHT)
    yield harness
    harness.db.close()


async def start_burst(h: Harness) -> None:
    await h.shard.start_leading()
    await h.shard.upsert_group(*BURST, GroupUpdate(template="app", size=5_000))
    await eventually(lambda: len(h.vms.requests) >= 20, within=10, what="the burst under way")


@pytest.mark.parametrize("how", ["delete-group", "scale-down"])
async def test_a_smaller_group_calls_off_queued_creates_within_a_second(h: Harness, how: str) -> None:
    await start_burst(h)
    try:
        if how == "delete-group":
            await h.shard.delete_group(*BURST)
        else:
            await h.shard.upsert_group(*BURST, GroupUpdate(size=10))
        sent_when_told = len(h.vms.requests)
        # The call-off itself is immediate (checked before every provider call, polled every 250 ms);
        # the wait is generous only because a loaded CI machine can stall this test's own event loop.
        await eventually(lambda: not h.shard.ops.in_flight, within=5.0, what="creates called off")
        assert len(h.vms.requests) == sent_when_told  # not one provider create started after the change
        want = 0 if how == "delete-group" else 10
        await eventually(lambda: len(h.live()) == want, within=30, what=f"the group settled at {want}")
        assert not [e for e in h.errors if "called off" in e.error]  # a smaller group is not an error
    finally:
        await h.shard.stop_leading(grace=1)


async def test_losing_leadership_calls_off_queued_creates(h: Harness) -> None:
    await start_burst(h)
    try:
        h.leader.leading = False
        sent_when_lost = len(h.vms.requests)
        await eventually(lambda: not h.shard.ops.in_flight, within=5.0, what="creates called off")
        assert len(h.vms.requests) == sent_when_lost
    finally:
        await h.shard.stop_leading(grace=1)


async def test_a_create_burst_whose_fencing_fails_ends_at_once_and_yields(h: Harness) -> None:
    await h.shard.start_leading()
    merged = h.state.merged("default", "web")
    assert merged is not None
    await h.shard.stop_leading(grace=1)
    h.leader.leading = False
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(ticker())
    try:
        started = time.monotonic()
        results = await h.shard.ops.create_many(merged, 2_147_483_647)
        assert time.monotonic() - started < 1.0
    finally:
        other.cancel()
    assert ticks > 0  # the event loop got a turn: /health and SIGTERM are served meanwhile
    assert 0 < len(results) <= MAX_IN_FLIGHT
    assert all(isinstance(r, Exception) and "no longer the shard leader" in str(r) for r in results)
    assert not h.vms.requests


async def test_sigterm_ends_a_server_in_the_middle_of_a_ten_thousand_instance_burst(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "bucket")
    cluster.init()
    config = shard_config(
        addrs=server_addrs(),
        provider_options={"latency": "20ms"},
        groups={"web": {"template": "app", "size": 10_000}},
    )
    cluster.write_config("zone-a", config)
    process = start_leader(cluster, tmp_path)
    try:

        def creates() -> float:
            status, body = process.http("/metrics")
            for line in body.splitlines() if status == 200 else []:
                if line.startswith("nstance_provider_creates_total "):
                    return float(line.split()[1])
            return 0.0

        await eventually(lambda: creates() >= 20, within=20, what="the burst under way")
        started = time.monotonic()
        status, body = process.http("/health")
        assert (status, body.strip()) == (200, "ok: leader")
        assert time.monotonic() - started < 1.0
    finally:
        started = time.monotonic()
        code = process.stop(timeout=20)
    assert code == 0, process.log()
    assert time.monotonic() - started < 5 + 5  # shutdown_timeout of shard_config plus start-up slack


async def test_concurrent_create_instance_with_one_id_all_get_the_existing_instance(h: Harness) -> None:
    await h.shard.start_leading()
    try:
        iid = str(new_instance_id("app"))
        request = InstanceRequest(group="web", instance_id=iid)
        answers = await asyncio.gather(*(h.shard.create_instance("default", request) for _ in range(5)))
        assert {answer[0] for answer in answers} == {iid}
        assert len(h.vms.requests) == 1
        with pytest.raises(FailedPrecondition, match="already used by another instance"):
            await h.shard.create_instance("other", request)
    finally:
        await h.shard.stop_leading(grace=1)
