"""Floods: bursts of forged, replayed and over-limit calls at the leader (an attacker, a runaway client).

The simulation has no sockets, so a flood here is what reaches the server's logic past the transport:
on a third of the seeds of the default fault mix (drawn from the seed, so the other faults of a seed are
unchanged), and whenever a run names ``flood`` among its fault kinds, a burst of 20-60 concurrent calls
at the leader, each one of:

* **forged registration** - a nonce that is not a JWT, one signed by a key that is not the shard's, an
  expired nonce of this shard, a nonce for an instance this shard never made (a purged one), an agent
  nonce replayed with a new key after its agent registered (nonces stay readable in user data), or a
  forged operator nonce;
* **over-limit UpsertGroup** - a size above ``shard.limits.max_group_size`` (up to 2^31 - 1) for an
  existing group or a new one, or more vars than ``shard.limits.max_vars`` allows;
* **refused CreateInstance** - vars beyond the limits, or a group that does not exist;
* **health storm** - streams from identities the shard does not know (an instance id it never made,
  an instance it has deleted: a certificate that outlived its VM) and short streams that end at once
  from a healthy agent's own identity (a cloned VM, a reconnect loop).

The promises (``check`` and the checks made during the run), beside the usual end-state invariants:

* no forged or replayed registration succeeds, and no over-limit or unknown-group call is accepted;
* no size above ``max_group_size`` is ever written to ``groups.jsonc`` and the cloud is never asked to
  run more VMs for a group than ``QUOTA_FACTOR`` times that limit (the simulated account's quota:
  a create beyond it is refused and reported);
* a health stream from an identity the shard does not know is refused;
* a flood costs the leader nothing: when nothing else disturbed the shard around a burst, the server
  that led before it still leads, in the same term, ``LEASE_CHECK_AFTER`` seconds after it;
* a flood replaces nothing healthy: an instance whose agent was registered and reporting when a burst
  began is not drained or deleted for being unhealthy, silent, drifted or spot-terminated while its
  agent is still alive (drift after the operator changed an instance type or template,
  ``group_edits``, is the operator's doing).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nstance.config import GroupUpdate
from nstance.core.errors import NstanceError
from nstance.core.ids import PuidGenerator
from nstance.db import repo
from nstance.objectstore.base import ObjectNotFound
from nstance.pki.keys import generate_private_key, public_key_to_pem
from nstance.pki.nonce import agent_nonce_claims, operator_nonce_claims, sign_nonce
from nstance.providers.base import InstanceStatus
from nstance.server.agents.hub import HealthReport
from nstance.server.shard.api import InstanceRequest

if TYPE_CHECKING:
    from nstance.simulation.servers import Incarnation
    from nstance.simulation.world import World

#: ``shard.limits.max_group_size`` in the simulated shard's config (the operator asks for 0-4).
MAX_GROUP_SIZE = 8
#: The simulated account runs at most this many times ``MAX_GROUP_SIZE`` VMs per group (replacements and
#: drains overlap); a create beyond it is refused and is a broken promise.
QUOTA_FACTOR = 3
#: Sizes an over-limit UpsertGroup asks for.
OVER_LIMIT_SIZES = (MAX_GROUP_SIZE + 1, 100, 1_000_000, 2**31 - 1)
#: Seconds after a burst at which the leader must still lead (a renewal or two later).
LEASE_CHECK_AFTER = 20.0
#: Seconds without any other fault before a burst for its leadership check to apply.
QUIET_BEFORE = 90.0
#: Seconds after a burst's start in which replacing an instance healthy at its start is the flood's doing.
REPLACE_WINDOW = 120.0
#: Reasons that replace an instance because of what it (or its agent) seems to be.
REPLACING = frozenset(
    {"unhealthy", "health-reports-missed", "spot-termination", "config-drift", "registration-timeout"}
)
CALL_KINDS = (
    "register-garbage",
    "register-wrong-key",
    "register-expired",
    "register-purged",
    "register-replay",
    "register-replay",
    "register-operator",
    "upsert-size",
    "upsert-size",
    "upsert-new-group",
    "upsert-vars",
    "create-vars",
    "create-unknown-group",
    "health-unknown",
    "health-deleted",
    "health-clone",
    "health-clone",
)


@dataclass
class _Burst:
    started: float
    leader: Incarnation | None
    leader_changes: int
    disturbances: int
    quiet: bool


class FloodNemesis:
    """One seed's floods and the promises they must not break."""

    def __init__(self, world: World, *, drawn: bool = True) -> None:
        self.world = world
        self.rng = random.Random(f"{world.seed}:flood")
        self.enabled = drawn and self.rng.random() < 1 / 3
        self.ids = PuidGenerator(
            now_ms=lambda: int(world.clock.now().timestamp() * 1000), randbytes=self.rng.randbytes
        )
        self.stranger_key = Ed25519PrivateKey.generate()
        self.problems: list[str] = []
        #: instance id -> monotonic time of the first burst it was healthy at.
        self.protected: dict[str, float] = {}
        self.leader_checks = 0

    async def run(self, until: float) -> None:
        """A burst every 40-120 s of virtual time until ``until`` (monotonic seconds), when drawn."""
        while self.enabled:
            await asyncio.sleep(self.rng.uniform(40.0, 120.0))
            if self.world.clock.monotonic() >= until:
                return
            await self.burst()

    def strike(self) -> None:
        """One burst now, in the background (the ``flood`` fault kind)."""
        self.world.spawn(None, self.burst(), "flood")

    async def burst(self) -> None:
        world = self.world
        now = world.clock.monotonic()
        burst = _Burst(
            started=now,
            leader=world.leader(),
            leader_changes=world.leader_changes,
            disturbances=_disturbances(world),
            quiet=now - world.disrupted_at >= QUIET_BEFORE and world.armed is None,
        )
        self._protect_healthy(now)
        kinds = [self.rng.choice(CALL_KINDS) for _ in range(self.rng.randint(20, 60))]
        calls = [self._call(kind) for kind in kinds]
        world.stats["floods"] += 1
        world.stats["flood_calls"] += len(calls)
        world.trace(f"flood: {len(calls)} calls at {burst.leader.name if burst.leader else 'no leader'}")
        await asyncio.gather(*calls)
        self._check_groups_document()
        await asyncio.sleep(LEASE_CHECK_AFTER)
        self._check_leadership(burst)

    # --- the calls ------------------------------------------------------------------------------

    async def _call(self, kind: str) -> None:
        """Make one call of ``kind``; a call that should have been refused and was not is a problem."""
        world = self.world
        attempt = self._attempt(kind)
        if attempt is None:
            return
        what, call = attempt
        try:
            await world.call_leader(call)
        except NstanceError:
            return
        if what:
            self.problems.append(f"t={world.now():.2f}: flood: {what} was accepted")

    def _attempt(self, kind: str) -> tuple[str, Callable[[Incarnation], Awaitable[object]]] | None:
        if kind.startswith("register-operator"):
            nonce = sign_nonce(
                self.stranger_key,
                operator_nonce_claims(cluster_id=self.world.identity.cluster_id, tenant="default"),
            )
            return "a forged operator registration", lambda inc: inc.registration().register_operator(
                nonce_jwt=nonce, public_key_pem=_fresh_key()
            )
        if kind.startswith("register-"):
            return self._registration(kind)
        if kind.startswith("upsert-"):
            return self._upsert(kind)
        if kind.startswith("create-"):
            return self._create(kind)
        return self._health(kind)

    def _registration(self, kind: str) -> tuple[str, Callable[[Incarnation], Awaitable[object]]] | None:
        world = self.world
        if kind == "register-garbage":
            nonce, what = self.rng.choice(("", "x", "a.b.c", "eyJhbGciOiJub25lIn0.e30.")), "a garbage nonce"
        elif kind == "register-replay":
            registered = sorted(a.instance_id for a in world.agents.values() if a.registered)
            if not registered:
                return None
            iid = self.rng.choice(registered)
            nonce, what = world.nonces[iid], f"a replay of the nonce of registered instance {iid}"
        else:
            iid = str(self.ids.new("app"))
            key, ttl, what = world.nonce_key, timedelta(minutes=10), f"a nonce of purged instance {iid}"
            if kind == "register-wrong-key":
                key, what = self.stranger_key, f"a nonce for {iid} signed by another key"
            elif kind == "register-expired":
                registered = sorted(a.instance_id for a in world.agents.values() if a.registered)
                iid = self.rng.choice(registered) if registered else iid
                ttl, what = timedelta(seconds=1), f"an expired nonce for {iid}"
            claims = agent_nonce_claims(
                instance_id=iid,
                cluster_id=world.identity.cluster_id,
                shard=world.identity.shard,
                group="g1",
                tenant="default",
                ttl=ttl,
                clock=world.clock,
            )
            if kind == "register-expired":
                hour = timedelta(hours=1)
                claims = replace(claims, exp=claims.exp - hour, nbf=claims.nbf - hour, iat=claims.iat - hour)
            nonce = sign_nonce(key, claims)
        return f"registration with {what}", lambda inc: inc.registration().register_agent(
            nonce_jwt=nonce, public_key_pem=_fresh_key(), private_ipv4="", private_ipv6="", hostname=""
        )

    def _upsert(self, kind: str) -> tuple[str, Callable[[Incarnation], Awaitable[object]]]:
        groups = sorted(self.world.scenario.groups)
        group = self.rng.choice(groups)
        if kind == "upsert-vars":
            update = GroupUpdate(vars={f"v{i}": "x" for i in range(self.rng.choice((101, 500)))})
            what = f"UpsertGroup {group} with too many vars"
        else:
            if kind == "upsert-new-group":
                group = f"flood{self.rng.randint(1, 2)}"
            size = self.rng.choice(OVER_LIMIT_SIZES)
            update = GroupUpdate(size=size, template="app" if group not in groups else None)
            what = f"UpsertGroup {group} to size {size}"
        return what, lambda inc: inc.api().upsert_group("default", group, update)

    def _create(self, kind: str) -> tuple[str, Callable[[Incarnation], Awaitable[object]]]:
        if kind == "create-vars":
            group = self.rng.choice(sorted(self.world.scenario.groups))
            request = InstanceRequest(group=group, vars={"big": "x" * 20_000})
            what = f"CreateInstance in {group} with a 20 kB var"
        else:
            request = InstanceRequest(group=f"nogroup{self.rng.randint(1, 5)}")
            what = f"CreateInstance in unknown group {request.group}"
        return what, lambda inc: inc.api().create_instance("default", request)

    def _health(self, kind: str) -> tuple[str, Callable[[Incarnation], Awaitable[object]]] | None:
        world = self.world
        if kind == "health-unknown":
            iid = str(self.ids.new("app"))
            return f"a health stream from unknown instance {iid}", lambda inc: inc.api().agents.health(
                iid, _one_report(iid)
            )
        if kind == "health-deleted":
            gone = sorted(a.instance_id for a in world.agents.values() if a.vm_gone_at is not None)
            if not gone:
                return None
            iid = self.rng.choice(gone)
        else:
            healthy = sorted(self._healthy())
            if not healthy:
                return None
            iid = self.rng.choice(healthy)
            world.stats["flood_clone_streams"] += 1

        async def stream(inc: Incarnation) -> None:
            # An identity may still be active (a deleting instance's agent reports until its VM goes):
            # only a stream the leader accepted for an instance it holds as deleted is a problem.
            await inc.api().agents.health(iid, _one_report(iid))
            if not _active(inc, iid):
                self.problems.append(
                    f"t={world.now():.2f}: flood: a health stream from {iid}, which the leader does not "
                    "hold as an active instance, was accepted"
                )

        return "", stream

    # --- checks -------------------------------------------------------------------------------

    def _healthy(self) -> list[str]:
        world = self.world
        out = []
        for vm in world.cloud.vms.values():
            agent = world.agents.get(vm.instance_id)
            alive = agent is not None and agent.registered and not agent.crashed and not agent.stuck
            if vm.status is InstanceStatus.RUNNING and alive and agent is not None and agent.reports > 0:
                out.append(vm.instance_id)
        return out

    def _protect_healthy(self, now: float) -> None:
        for iid in self._healthy():
            self.protected.setdefault(iid, now)

    def _check_groups_document(self) -> None:
        world = self.world
        from nstance.simulation.scenario import SHARD

        try:
            raw, _ = world.base_store.get(f"shard/{SHARD}/groups.jsonc")
        except ObjectNotFound:
            return
        try:
            doc = json.loads(raw)
        except ValueError:
            return
        for tenant, groups in doc.items() if isinstance(doc, dict) else ():
            for group, entry in groups.items() if isinstance(groups, dict) else ():
                size = entry.get("size") if isinstance(entry, dict) else None
                if isinstance(size, int) and size > MAX_GROUP_SIZE:
                    self.problems.append(
                        f"t={world.now():.2f}: groups.jsonc holds size {size} for {tenant}/{group}, above "
                        f"shard.limits.max_group_size {MAX_GROUP_SIZE}"
                    )

    def _check_leadership(self, burst: _Burst) -> None:
        world = self.world
        leader = burst.leader
        if (
            leader is None
            or not burst.quiet
            or world.disrupted_at >= burst.started
            or _disturbances(world) != burst.disturbances
        ):
            return
        self.leader_checks += 1
        if world.leader_changes != burst.leader_changes or not leader.leads():
            self.problems.append(
                f"t={world.now():.2f}: {leader.name} led when a flood began at "
                f"t={burst.started - world.start_mono:.2f} and lost leadership with no other fault"
            )
        else:
            world.trace(f"flood: {leader.name} still leads")

    def check(self) -> list[str]:
        """Problems found during the run, and healthy instances a flood replaced (module docstring)."""
        problems = list(self.problems)
        start = self.world.start_mono
        for at, iid, status, reason in self.world.events:
            since = self.protected.get(iid)
            if since is None or reason not in REPLACING or not 0 <= at + start - since <= REPLACE_WINDOW:
                continue
            agent = self.world.agents.get(iid)
            if agent is None or agent.crashed or agent.stuck:
                continue
            if agent.vm_gone_at is not None and agent.vm_gone_at <= at:
                continue
            if reason == "config-drift" and any(t <= at for t in self.world.group_edits.drift_edits):
                continue  # the operator changed a config: rotations are its doing, not the flood's
            problems.append(
                f"t={at:.2f}: instance {iid} was healthy when a flood began and was {status} for {reason}"
            )
        return problems


def _fresh_key() -> bytes:
    return public_key_to_pem(generate_private_key("ecdsa-p256"))


def _disturbances(world: World) -> int:
    """Crashes and storage faults so far: a leadership lost around any of them is not the flood's doing."""
    return sum(world.stats[k] for k in ("crashes", "store_faults", "store_timeouts"))


def _active(inc: Incarnation, instance_id: str) -> bool:
    """Whether ``inc``'s SQLite cache holds ``instance_id`` as an instance not deleted."""
    with inc.api().ctx.db.read_session() as session:
        row = repo.get_instance(session, instance_id)
    return row is not None and row.deleted_at is None


async def _one_report(instance_id: str) -> AsyncIterator[HealthReport]:
    yield HealthReport(instance_id=instance_id, count=1)
