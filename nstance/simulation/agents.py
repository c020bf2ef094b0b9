"""The simulated agents: one per VM that boots, registering with the leader and reporting health.

``manage_agents`` starts an agent for every VM the cloud runs (once per instance: a crashed agent
stays down). An agent registers with the leader using the nonce from its VM's create request,
retrying with backoff while there is no leader, then streams a health report every
``HEALTH_INTERVAL`` to whichever server leads. It stops when its VM is deleted (``vm_gone_at``), when
it crashed, or when the shard refuses its registration for good (``stuck``). Its stream ends as a
real one would: when a paused server's keepalive window runs out or the server stops leading.

``AgentState`` is what the faults (crash, blip), the nemeses and the invariants read and set. An agent
must not reach into a server: it only makes the calls its real counterpart makes, through
``World.call_leader``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nstance.core.errors import AlreadyExists, NstanceError, Unauthenticated
from nstance.pki.keys import generate_private_key, public_key_to_pem
from nstance.providers.base import InstanceStatus
from nstance.server.agents.hub import HealthReport
from nstance.simulation import leader_faults
from nstance.simulation.scenario import HEALTH_INTERVAL
from nstance.simulation.servers import STREAMING, Incarnation

if TYPE_CHECKING:
    from nstance.simulation.world import World


@dataclass
class AgentState:
    instance_id: str
    crashed: bool = False
    stuck: bool = False  # refused for good (e.g. its nonce was claimed by a registration it never saw)
    registered: bool = False
    blip_until: float = -math.inf
    reports: int = 0
    vm_gone_at: float | None = None  # when the agent stopped because its VM was deleted


async def manage_agents(world: World) -> None:
    """Start an agent for every VM that boots (once per instance; a crashed agent stays down)."""
    while True:
        for vm in world.cloud.vms.values():
            iid = vm.instance_id
            if vm.status != InstanceStatus.RUNNING or iid in world.agents or iid not in world.nonces:
                continue
            state = AgentState(iid)
            world.agents[iid] = state
            world.spawn(None, run_agent(world, state, vm.provider_id), f"agent-{iid}")
        await asyncio.sleep(1.0)


def _vm_alive(world: World, provider_id: str) -> bool:
    vm = world.cloud.vms.get(provider_id)
    return vm is not None and vm.status not in (InstanceStatus.DELETED, InstanceStatus.DELETING)


async def run_agent(world: World, state: AgentState, provider_id: str) -> None:
    """One agent, from its VM's boot to its VM's deletion or its crash."""
    iid = state.instance_id
    key = generate_private_key("ecdsa-p256")
    pem = public_key_to_pem(key)
    nonce = world.nonces[iid]
    delay = 1.0
    while not state.registered:
        if not _vm_alive(world, provider_id) or state.crashed:
            state.vm_gone_at = None if state.crashed else world.now()
            return
        try:
            await world.call_leader(
                lambda inc: inc.registration().register_agent(
                    nonce_jwt=nonce, public_key_pem=pem, private_ipv4="", private_ipv6="", hostname=""
                )
            )
            state.registered = True
        except (AlreadyExists, Unauthenticated) as exc:
            state.stuck = True
            world.trace(f"agent {iid} cannot register: {exc}")
            return
        except NstanceError:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 15.0)
    while _vm_alive(world, provider_id) and not state.crashed:
        if world.clock.monotonic() < state.blip_until:
            await asyncio.sleep(state.blip_until - world.clock.monotonic())
            continue
        inc = world.leader()
        if inc is None:
            await asyncio.sleep(1.0)
            continue
        with contextlib.suppress(NstanceError):
            await world.call_leader(lambda leader: _stream(world, state, leader, provider_id))
        await asyncio.sleep(1.0)
    if not state.crashed:
        state.vm_gone_at = world.now()  # the agent stopped because its VM was deleted


async def _stream(world: World, state: AgentState, inc: Incarnation, provider_id: str) -> None:
    token = STREAMING.set(True)  # the agent's end of the stream is not stopped with a paused server
    try:
        await inc.api().agents.health(state.instance_id, _reports(world, state, inc, provider_id))
    finally:
        STREAMING.reset(token)


async def _reports(
    world: World, state: AgentState, inc: Incarnation, provider_id: str
) -> AsyncIterator[HealthReport]:
    while _vm_alive(world, provider_id) and not state.crashed and world.clock.monotonic() >= state.blip_until:
        if not await leader_faults.reachable(world, inc):
            return  # keepalive gave up on a stopped server: the agent reconnects to the leader
        if not inc.leads():
            return
        state.reports += 1
        yield HealthReport(instance_id=state.instance_id, count=state.reports)
        await asyncio.sleep(HEALTH_INTERVAL)
