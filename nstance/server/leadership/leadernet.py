"""The shard's leader address (``shard.leader_network``), moved to this server's VM while it leads.

``LeaderAddress.hold`` runs as a leader task. It finds this server's VM (``--provider-instance-id``,
else the provider's metadata lookup), asks the provider to move the address to it (an ENI attach on
AWS, an alias IP range on Google; the provider takes it off the previous leader's VM first), then
waits until the address can be bound here, i.e. the operating system has configured it (polled every
``BIND_POLL`` seconds for up to ``BIND_TIMEOUT``). A failure is retried with backoff for as long as
this server leads. ``release`` takes the address off this VM only, so a former leader can never pull
it from a new one. The state is shown on ``/leader/health`` and as ``nstance_leader_network_ready``.

Reconciling does not wait for the address: agents and operators that use it retry their connections
until it arrives. This module never decides leadership; it follows it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Callable

from nstance.config.shard import LeaderNetworkConfig
from nstance.core.backoff import Backoff
from nstance.core.errors import FailedPrecondition, NstanceError
from nstance.providers.features import leader_networking, own_instance
from nstance.server.state.context import ShardContext

log = logging.getLogger(__name__)

BIND_POLL = 0.5
BIND_TIMEOUT = 30.0
#: Seconds a release may take at shutdown or on losing leadership.
RELEASE_TIMEOUT = 10.0


def can_bind(ip: str) -> bool:
    """Whether this host can bind a socket to ``ip`` (the address is configured on an interface)."""
    family = socket.AF_INET6 if ipaddress.ip_address(ip).version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((ip, 0))
        except OSError:
            return False
    return True


class LeaderAddress:
    """Holds the leader address while this server leads (see the module docstring)."""

    def __init__(
        self,
        ctx: ShardContext,
        *,
        bindable: Callable[[str], bool] = can_bind,
        backoff: Backoff | None = None,
        bind_poll: float = BIND_POLL,
        bind_timeout: float = BIND_TIMEOUT,
    ) -> None:
        self._ctx = ctx
        self._bindable = bindable
        self._backoff = backoff or Backoff(base=1.0, cap=30.0)
        self._bind_poll = bind_poll
        self._bind_timeout = bind_timeout
        self._held: tuple[str, LeaderNetworkConfig] | None = None  # (our provider id, config) once assigned
        #: What the address is doing, for /leader/health ("" when no leader network is configured).
        self.status = ""

    def _config(self) -> LeaderNetworkConfig | None:
        snapshot = self._ctx.config.snapshot()
        return snapshot.config.shard.leader_network if snapshot is not None else None

    async def _own_id(self) -> str:
        if self._ctx.own_provider_id:
            return self._ctx.own_provider_id
        finder = own_instance(self._ctx.provider)
        if finder is None:
            raise FailedPrecondition(
                f'the "{self._ctx.provider.kind}" provider cannot tell which VM this server runs on; '
                "start the server with --provider-instance-id (NSTANCE_PROVIDER_INSTANCE_ID)"
            )
        found = await finder.own_instance_id()
        self._ctx.own_provider_id = found
        return found

    async def hold(self) -> None:
        """Move the address here and keep retrying until that worked (runs until cancelled).

        The config is read again on every attempt, so fixing a wrong ``shard.leader_network`` (or
        removing it) takes effect without a restart.
        """
        mover = leader_networking(self._ctx.provider)
        attempt = 0
        while True:
            config = self._config()
            if config is None:
                self.status = ""
                return
            if mover is None:
                self.status = f'not supported by the "{self._ctx.provider.kind}" provider'
                log.error("shard.leader_network: %s; the address stays where it is", self.status)
                return
            self.status = f"assigning {config.ip}"
            try:
                own = await self._own_id()
                self._ctx.fence()
                await mover.assign_leader_network(own, config.ip, config.interface_id)
                self._held = (own, config)
                break
            except FailedPrecondition as exc:
                self.status = f"not assigned: {exc}"
                log.error("leader network %s: %s", config.ip, exc)
                return
            except NstanceError as exc:
                delay = self._backoff.delay(attempt)
                attempt += 1
                self.status = f"not assigned: {exc}"
                log.error("leader network %s: %s (retrying in %.1fs)", config.ip, exc, delay)
                await asyncio.sleep(delay)
        log.info("leader network: %s assigned to %s", config.ip, own)
        waited = 0.0
        while not await asyncio.to_thread(self._bindable, config.ip):
            if waited >= self._bind_timeout:
                self.status = (
                    f"{config.ip} assigned to {own}, but not bindable on this host after {waited:.0f}s"
                )
                log.warning("leader network: %s", self.status)
                return
            await asyncio.sleep(self._bind_poll)
            waited += self._bind_poll
        self.status = f"{config.ip} ready"
        self._ctx.metrics.set_leader_network_ready(True)

    async def release(self) -> None:
        """Take the address off this VM if this server assigned it (best effort, bounded)."""
        held, self._held = self._held, None
        self._ctx.metrics.set_leader_network_ready(False)
        if held is None:
            self.status = ""
            return
        own, config = held
        mover = leader_networking(self._ctx.provider)
        if mover is None:
            return
        try:
            async with asyncio.timeout(RELEASE_TIMEOUT):
                await mover.release_leader_network(own, config.ip, config.interface_id)
            log.info("leader network: %s released from %s", config.ip, own)
        except (NstanceError, TimeoutError) as exc:
            log.warning("leader network: %s not released from %s: %s", config.ip, own, exc or "timed out")
        self.status = ""
