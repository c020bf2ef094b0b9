"""What every part of a running shard shares: stores, cache, provider, identity, clock, limits, events.

``ShardContext`` is plain wiring (built once, by ``nstance.server.shard.build``); ``fence`` is the
single leadership check that guards every state-changing step. The context holds its object store
and provider only through the fenced handles of ``fencing`` (a non-leader's writes and provider
mutations raise ``NotLeader`` right before they would happen), and its clock is a
``leadertime.LeaderClock`` (time that moves with the monotonic clock within a leadership, so a
wall-clock step decides nothing).

Test-only fault points (``ShardContext.fault_point``) let crash tests kill the process at a precise
step (``NSTANCE_FAULT`` names it); they are inert unless that variable is set, or unless the context
was given a ``faults`` callback (the deterministic simulator crashes one simulated server there).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nstance.core.clock import Clock
from nstance.db.engine import Database
from nstance.objectstore.base import ObjectStore
from nstance.pki.ca import CertificateAuthority
from nstance.providers.base import Provider
from nstance.secrets.base import SecretStore
from nstance.server.state.configstate import ConfigState
from nstance.server.state.degraded import Degradations
from nstance.server.state.events import Events
from nstance.server.state.fencing import FencedProvider, FencedStore, NotLeader
from nstance.server.state.leadertime import LeaderClock
from nstance.server.state.limits import CreateLimiter
from nstance.server.state.metrics import Metrics
from nstance.server.state.provisioning import ShardIdentity

log = logging.getLogger(__name__)

FAULT_ENV = "NSTANCE_FAULT"
#: Exit status of a process killed by a fault point (crash tests look for it).
FAULT_EXIT_CODE = 86


class Leadership(Protocol):
    """Who leads the shard, as the elector sees it."""

    def is_leader(self) -> bool: ...

    def leader_address(self) -> str: ...


def exit_at_fault_point(name: str) -> None:
    """Die here, at once and without cleanup, when ``NSTANCE_FAULT`` names this point (tests only)."""
    if os.environ.get(FAULT_ENV) == name:
        log.error("fault point %s reached: exiting with status %d", name, FAULT_EXIT_CODE)
        logging.shutdown()
        os._exit(FAULT_EXIT_CODE)


@dataclass
class ShardContext:
    """Shared state of one shard server."""

    identity: ShardIdentity
    store: ObjectStore  # shard scope: config, groups, leader.json, instance records
    cluster_store: ObjectStore  # cluster scope: ca.crt, operator records
    db: Database
    config: ConfigState
    provider: Provider
    nonce_key: Ed25519PrivateKey
    ca: CertificateAuthority
    clock: Clock
    limiter: CreateLimiter
    leadership: Leadership
    metrics: Metrics
    events: Events = field(default_factory=Events)
    cluster_leadership: Leadership | None = None
    #: The cluster's secret store (``secret`` files pushed to agents); None where no secrets are used.
    secrets: SecretStore | None = None
    #: ``Image.<name>`` values for templates, kept current by ``images.ImageService`` while leading.
    resolved_images: dict[str, str] = field(default_factory=dict)
    #: Why an image has no value (by name); see ``images.explain_missing_image``.
    image_errors: dict[str, str] = field(default_factory=dict)
    #: The provider id of the VM this server runs on ("" = ask the provider's metadata service).
    own_provider_id: str = ""
    #: Why this server runs degraded (shown on ``/health``); see ``nstance.server.state.degraded``.
    degraded: Degradations = field(default_factory=Degradations)
    #: Called at every fault point (the simulator's crash injection); None in a real server.
    faults: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.store, FencedStore):
            self.store = FencedStore(self.store, self.fence)
        if not isinstance(self.provider, FencedProvider):
            self.provider = FencedProvider(self.provider, self.fence)
        if not isinstance(self.clock, LeaderClock):
            self.clock = LeaderClock(self.clock)

    @property
    def leader_clock(self) -> LeaderClock:
        """The shard's clock as a LeaderClock (``restart`` it when leadership is acquired)."""
        assert isinstance(self.clock, LeaderClock), "__post_init__ wraps the clock"
        return self.clock

    def is_leader(self) -> bool:
        return self.leadership.is_leader()

    def fault_point(self, name: str) -> None:
        """A named step where crash tests stop this server (see the module docstring)."""
        if self.faults is not None:
            self.faults(name)
        exit_at_fault_point(name)

    def fence(self) -> None:
        """Raise NotLeader (an Unavailable) unless this server holds fenced shard leadership now."""
        if not self.leadership.is_leader():
            addr = self.leadership.leader_address()
            where = f"; the shard leader is at {addr}" if addr else ""
            raise NotLeader(f"this server is no longer the shard leader{where}; retry there")
