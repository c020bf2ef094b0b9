"""What one seed runs: the scenario drawn from the seed, and the shard configuration it writes.

``Scenario.draw`` takes sizes, timings and fault rates from the scenario's own random stream;
``Scenario.config_document`` is the shard's ``config.jsonc`` for it. The names every simulated part
shares (cluster, shard, tenant, health interval) and the fault mix a seed draws from live here too.

Pure data: nothing here runs, touches the world or draws from any stream but the one it is given.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

from nstance.config.cluster import LeaderElectionConfig
from nstance.config.shard import DeletionBrakeConfig
from nstance.core.durations import parse_duration
from nstance.server.reconcile.reconciler import MISSED_REPORTS
from nstance.simulation.floods import MAX_GROUP_SIZE

CLUSTER = "sim"
SHARD = "zone-a"
TENANT = "default"
HEALTH_INTERVAL = 10.0
#: The templates (the static groups use the first; dynamic groups may switch between them).
TEMPLATES = ("app", "app2")
#: The templates' instance type.
INSTANCE_TYPE = "m7i.large"
#: ``shard.default_drain_timeout`` in seconds: the drain timeout of a group that sets none (dynamic ones).
DEFAULT_DRAIN_TIMEOUT_S = 30.0
#: Fault kinds and their weights (a kind listed twice is drawn twice as often).
FAULT_KINDS = (
    "crash",
    "fault-point",
    "fault-point",
    "partition",
    "agent-crash",
    "blip",
    "blip",
    "lost-create",
    "throttle",
    "pause",
    "provider-loss",
    "wall-step",
)

_ADDRS = ("health_addr", "election_addr", "registration_addr", "operator_addr", "agent_addr")


@dataclass
class Scenario:
    """What one seed runs: sizes, timings and fault rates, all drawn from the seed."""

    servers: int
    groups: dict[str, int]
    drain_timeouts: dict[str, str]
    with_lb: str
    boot_time: float
    not_found_after_create: float
    lb_deregistration_delay: float
    fault_phase: float
    calm_phase: float
    fault_mean_gap: float
    store_fault_rate: float
    store_timeout_rate: float
    #: The kinds of fault the fault phase draws from (tests narrow it to one class of fault).
    fault_kinds: tuple[str, ...] = FAULT_KINDS

    @classmethod
    def draw(cls, rng: random.Random) -> Scenario:
        groups = {f"g{i}": rng.randint(0, 3) for i in range(1, rng.randint(1, 3) + 1)}
        scenario = cls(
            servers=rng.choice((2, 3)),
            groups=groups,
            drain_timeouts={g: rng.choice(("0s", "20s", "45s")) for g in groups},
            with_lb=rng.choice([*groups, ""]),
            boot_time=rng.uniform(2.0, 15.0),
            not_found_after_create=rng.choice((0.0, 0.0, 3.0, 10.0)),
            lb_deregistration_delay=rng.choice((0.0, 5.0, 20.0)),
            fault_phase=rng.uniform(600.0, 900.0),
            calm_phase=420.0,
            fault_mean_gap=rng.uniform(25.0, 60.0),
            store_fault_rate=rng.choice((0.0, 0.01, 0.03)),
            store_timeout_rate=rng.choice((0.0, 0.005, 0.02)),
        )
        return dataclasses.replace(scenario, calm_phase=max(scenario.calm_phase, scenario.settle_time()))

    def settle_time(self) -> float:
        """Simulated seconds the calm phase needs before every group must be whole with working agents.

        Derived from the configuration, not guessed: a takeover (a dead leader's lock times out), the
        first missed-report window of the new leadership plus the silence limit itself, a mass-silence
        hold of the brake's full ``max_hold``, the longest drain timeout (a crashed agent never
        acknowledges its drain), a replacement's boot, and a margin for reconcile and provider latency.
        """
        election = LeaderElectionConfig()
        takeover = (election.infrequent_interval + election.leader_timeout).total_seconds()
        window = MISSED_REPORTS * HEALTH_INTERVAL
        max_hold = DeletionBrakeConfig().max_hold.total_seconds()
        return takeover + 2 * window + max_hold + self.longest_drain() + self.boot_time + 30.0

    def longest_drain(self) -> float:
        """The longest drain timeout of the static groups, in seconds."""
        return max((parse_duration(t).total_seconds() for t in self.drain_timeouts.values()), default=0.0)

    def config_document(self) -> dict[str, Any]:
        """The shard's ``config.jsonc`` for this scenario."""
        groups: dict[str, Any] = {}
        for name, size in self.groups.items():
            group: dict[str, Any] = {
                "template": "app",
                "size": size,
                "drain_timeout": self.drain_timeouts[name],
            }
            if name == self.with_lb:
                group["load_balancers"] = ["web"]
            groups[name] = group
        return {
            "cluster": {"id": CLUSTER, "secrets": {"provider": "memory"}},
            "shard": {
                "id": SHARD,
                "infra": {"provider": "sim", "region": "sim", "zone": SHARD},
                "bind": {a: f"0.0.0.0:{8990 + i}" for i, a in enumerate(_ADDRS)},
                "advertise": {a: f"leader:{8990 + i}" for i, a in enumerate(_ADDRS)},
                "subnet_pools": {"default": ["net-1"]},
                "health_check_interval": f"{int(HEALTH_INTERVAL)}s",
                "default_drain_timeout": f"{int(DEFAULT_DRAIN_TIMEOUT_S)}s",
                "garbage_collection": {
                    "interval": "30s",
                    "registration_timeout": "2m",
                    "deleted_record_retention": "5m",
                },
                "request_timeout": "10s",
                "limits": {"max_group_size": MAX_GROUP_SIZE},
                "shutdown_timeout": "2s",
            },
            "load_balancers": {
                "web": {"provider": "aws", "target_groups": [{"arn": "arn:sim:tg/web", "target_port": 80}]}
            },
            "templates": {
                name: {
                    "kind": "app",
                    "arch": "amd64",
                    "subnet_pool": "default",
                    "instance_type": INSTANCE_TYPE,
                    "userdata": {"content": f"#!/bin/sh\n# {name} {{{{ .Instance.ID }}}} {{{{ .Nonce }}}}\n"},
                }
                for name in TEMPLATES
            },
            "groups": {TENANT: groups},
        }
