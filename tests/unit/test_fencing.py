"""The fenced handles: a non-leader can read through them but cannot write or mutate anything."""

from __future__ import annotations

import pytest

from nstance.config.resources import ImageConfig
from nstance.core.clock import ManualClock
from nstance.objectstore.memory import MemoryObjectStore
from nstance.providers.features import image_lookup, leader_networking, load_balancing
from nstance.providers.local import LocalProvider
from nstance.providers.sim import SimProvider
from nstance.server.state.fencing import FencedProvider, FencedStore, NotLeader
from nstance.server.state.metrics import InstrumentedProvider, Metrics
from nstance.testing.requests import sample_create_request

IMAGE = ImageConfig.model_validate({"provider": "aws", "filters": [{"name": "name", "values": ["x"]}]})


class Switch:
    """A fence that holds while ``leading`` is True."""

    def __init__(self) -> None:
        self.leading = True
        self.checks = 0

    def __call__(self) -> None:
        self.checks += 1
        if not self.leading:
            raise NotLeader("not the shard leader")


def test_a_store_write_is_checked_immediately_before_it_happens() -> None:
    inner = MemoryObjectStore()
    fence = Switch()
    store = FencedStore(inner, fence)
    etag = store.put("a", b"1")
    store.put_if_match("a", b"2", etag)
    assert inner.get("a")[0] == b"2"
    assert fence.checks == 2

    fence.leading = False
    for write in (
        lambda: store.put("b", b"1"),
        lambda: store.put_if_match("a", b"3", None),
        lambda: store.delete("a"),
    ):
        with pytest.raises(NotLeader):
            write()
    assert inner.list() == ["a"]
    assert inner.get("a")[0] == b"2"
    # Followers read records and config: reads are not fenced.
    assert store.get("a")[0] == b"2"
    assert store.exists("a")
    assert store.list() == ["a"]
    assert store.head("a").size == 1


async def test_a_provider_mutation_is_refused_to_a_non_leader_and_reads_pass() -> None:
    clock = ManualClock()
    sim = SimProvider(clock=clock, latency=0.0)
    fence = Switch()
    provider = FencedProvider(InstrumentedProvider(sim, Metrics()), fence)
    vm = await provider.create_instance(sample_create_request(cluster_id="c", shard="s", token="t-1"))

    fence.leading = False
    with pytest.raises(NotLeader):
        await provider.create_instance(sample_create_request(cluster_id="c", shard="s", token="t-2"))
    with pytest.raises(NotLeader):
        await provider.delete_instance(vm.instance_id, vm.provider_id)
    with pytest.raises(NotLeader):
        await provider.assign_leader_network(vm.provider_id, "10.0.0.9", "")
    with pytest.raises(NotLeader):
        await provider.lookup_image("base", IMAGE)
    assert [v.instance_id for v in await provider.list_instances("c", "s")] == [vm.instance_id]
    assert (await provider.get_instance(vm.instance_id, vm.provider_id)).provider_id == vm.provider_id
    # A former leader must still be able to take the leader address off its own VM.
    await provider.release_leader_network(vm.provider_id, "10.0.0.9", "")


def test_capabilities_are_those_of_the_innermost_provider() -> None:
    fence = Switch()
    sim = FencedProvider(InstrumentedProvider(SimProvider(clock=ManualClock()), Metrics()), fence)
    local = FencedProvider(InstrumentedProvider(LocalProvider.__new__(LocalProvider), Metrics()), fence)
    assert load_balancing(sim) is sim
    assert leader_networking(sim) is sim
    assert image_lookup(sim) is sim
    assert load_balancing(local) is None
    assert leader_networking(local) is None
    assert image_lookup(local) is None
