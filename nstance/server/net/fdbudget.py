"""How many client connections each listener may hold, so a flood cannot take the server's files.

Every accepted connection costs a file descriptor, and so do object-storage sockets, SQLite, the
election's lock file and the log. ``raise_open_file_limit`` lifts the soft ``RLIMIT_NOFILE`` to the
hard limit (systemd's default soft limit is 1,024); ``plan_connection_caps`` then splits what is left
after ``shard.limits.reserved_file_descriptors`` between the health endpoint and the three gRPC
ports, never above ``max_connections`` or each port's own limit. When the limits ask for more than
the budget holds, every port is scaled down in proportion (at least ``MIN_PORT_CONNECTIONS`` each) and
``ConnectionCaps.scaled`` says so, for a warning at start-up. Pure except for the rlimit calls.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from nstance.config.limits import LimitsConfig

#: Concurrent connections the plain-HTTP health endpoint serves (probes and metrics scrapes).
HEALTH_CONNECTIONS = 32
#: The fewest connections a port is ever given, however small the budget.
MIN_PORT_CONNECTIONS = 8


@dataclass(frozen=True, slots=True)
class ConnectionCaps:
    """Connections each listener may hold."""

    health: int
    registration: int
    operator: int
    agent: int
    budget: int
    scaled: bool


def raise_open_file_limit() -> int:
    """Lift the soft open-file limit to the hard one (where allowed); return the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def plan_connection_caps(limits: LimitsConfig, open_files: int) -> ConnectionCaps:
    """Split ``open_files`` minus the reserve between the listeners (see the module docstring)."""
    budget = max(0, min(limits.max_connections, open_files - limits.reserved_file_descriptors))
    health = min(HEALTH_CONNECTIONS, max(1, budget // 8))
    wanted = (
        limits.max_registration_connections,
        limits.max_operator_connections,
        limits.max_agent_connections,
    )
    room = max(0, budget - health)
    if sum(wanted) <= room:
        return ConnectionCaps(health, *wanted, budget=budget, scaled=False)
    share = [max(MIN_PORT_CONNECTIONS, want * room // sum(wanted)) for want in wanted]
    return ConnectionCaps(health, share[0], share[1], share[2], budget=budget, scaled=True)
