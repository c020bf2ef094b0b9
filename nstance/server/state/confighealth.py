"""Turn the shard config's load outcome into what operators see: ``/health``, metrics, ``WatchErrors``.

After every load attempt the caller hands ``ConfigState.fault`` to ``report_config``: a fault marks
the ``config`` component degraded (``/health`` says why), sets ``nstance_config_loaded`` to 0 and
``nstance_degraded{component="config",kind=...}`` to 1, and - only when the fault is new or its text
changed, so a 30-second check does not repeat it - sends one ``WatchErrors`` event per tenant of the
last good config. Success clears all of that. Decides nothing about the config itself.
"""

from __future__ import annotations

import logging

from nstance.server.state.configstate import ConfigFault
from nstance.server.state.context import ShardContext
from nstance.server.state.events import ErrorEventData

log = logging.getLogger(__name__)

COMPONENT = "config"


def _tenants(ctx: ShardContext) -> list[str]:
    snapshot = ctx.config.snapshot()
    if snapshot is None:
        return []
    return sorted(
        set(snapshot.config.groups) | set(snapshot.dynamic) | {t for t, _ in snapshot.merged_groups}
    )


def report_config(ctx: ShardContext, fault: ConfigFault | None) -> None:
    """Publish the outcome of the latest config load (see the module docstring)."""
    ctx.metrics.set_config_loaded(fault is None)
    ctx.metrics.set_degraded(COMPONENT, fault.kind if fault is not None else None)
    if fault is None:
        if ctx.degraded.clear(COMPONENT):
            log.info("the shard config in object storage loads again; no longer degraded")
        return
    reason = f"keeping the last good config: {fault.message}"
    if not ctx.degraded.set(COMPONENT, fault.kind, reason):
        return
    log.error("shard config degraded (%s): %s", fault.kind, fault.message)
    now = ctx.clock.now()
    for tenant in _tenants(ctx):
        ctx.events.errors.publish(
            ErrorEventData(tenant=tenant, group="", instance_id="", error=f"config: {reason}", timestamp=now)
        )
