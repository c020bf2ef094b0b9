"""Register instances with ELBv2 target groups and deregister them, confirming before delete.

``load_balancers`` entries with provider ``aws`` list target groups (``arn`` and ``target_port``).
``register`` adds the instance to each target group on its port. ``deregister`` removes it and then
polls DescribeTargetHealth until every target group reports it gone (state ``unused``, or not listed),
so the caller terminates the VM only after the load balancer has stopped sending it traffic
(connection draining finished). A target group that no longer exists counts as deregistered. When
draining outlasts ``timeout`` the call raises ``ProviderUnavailable`` and the caller retries later.

Waiting uses the injected ``sleep`` and counts the time slept, so tests need no real time. This module
must not touch EC2 instances themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from nstance.config.resources import LoadBalancerConfig
from nstance.providers.aws.calls import AwsCaller, Sleep, error_code, translate
from nstance.providers.base import ProviderInvalidRequest, ProviderUnavailable

#: Target states in which the load balancer may still send the target traffic.
ATTACHED_STATES: frozenset[str] = frozenset(
    {"initial", "healthy", "unhealthy", "unhealthy.draining", "draining", "unavailable"}
)
_GONE_CODES: frozenset[str] = frozenset({"TargetGroupNotFound", "InvalidTarget"})


@dataclass(frozen=True, slots=True)
class TargetGroupRef:
    """One target group an instance belongs to, and the port traffic reaches it on."""

    arn: str
    port: int
    where: str = ""  # config path, for error messages


def target_groups_from_config(
    names: Iterable[str], load_balancers: Mapping[str, LoadBalancerConfig]
) -> list[TargetGroupRef]:
    """The target groups of the named ``load_balancers`` entries (provider ``aws`` only)."""
    out: list[TargetGroupRef] = []
    for name in names:
        lb = load_balancers.get(name)
        if lb is None:
            raise ProviderInvalidRequest(f"load_balancers.{name}: no such load balancer in the config")
        if lb.provider != "aws":
            raise ProviderInvalidRequest(
                f'load_balancers.{name}.provider: is "{lb.provider}"; an aws shard needs provider "aws"'
            )
        for i, tg in enumerate(lb.target_groups):
            out.append(TargetGroupRef(tg.arn, tg.target_port, f"load_balancers.{name}.target_groups[{i}]"))
    return out


class TargetGroups:
    """ELBv2 target registration for instances."""

    def __init__(
        self,
        elbv2: Any,
        caller: AwsCaller,
        *,
        sleep: Sleep = asyncio.sleep,
        poll_interval: float = 5.0,
        timeout: float = 600.0,
    ) -> None:
        self._elbv2 = elbv2
        self._caller = caller
        self._sleep = sleep
        self.poll_interval = poll_interval
        self.timeout = timeout

    async def register(self, provider_id: str, groups: Sequence[TargetGroupRef]) -> None:
        """Add the instance to every target group (registering twice is harmless)."""
        for group in groups:
            try:
                await self._caller.call(
                    self._elbv2,
                    "register_targets",
                    TargetGroupArn=group.arn,
                    Targets=[{"Id": provider_id, "Port": group.port}],
                )
            except ClientError as exc:
                raise translate(exc, "RegisterTargets", path=group.where or group.arn) from exc

    async def states(self, provider_id: str, groups: Sequence[TargetGroupRef]) -> dict[str, str]:
        """Target state by target group ARN (``healthy``, ``draining``, ``unused``; ``gone`` if absent)."""
        out: dict[str, str] = {}
        for group in groups:
            try:
                response = await self._caller.call(
                    self._elbv2,
                    "describe_target_health",
                    TargetGroupArn=group.arn,
                    Targets=[{"Id": provider_id, "Port": group.port}],
                )
            except ClientError as exc:
                if error_code(exc) in _GONE_CODES:
                    out[group.arn] = "gone"
                    continue
                raise translate(exc, "DescribeTargetHealth", path=group.where or group.arn) from exc
            state = "gone"
            for description in response.get("TargetHealthDescriptions", []):
                if description.get("Target", {}).get("Id") == provider_id:
                    state = str(description.get("TargetHealth", {}).get("State", "unknown"))
                    if state in ATTACHED_STATES:
                        break
            out[group.arn] = state
        return out

    async def deregister(self, provider_id: str, groups: Sequence[TargetGroupRef]) -> None:
        """Remove the instance from every target group and wait until each confirms it is gone."""
        for group in groups:
            try:
                await self._caller.call(
                    self._elbv2,
                    "deregister_targets",
                    TargetGroupArn=group.arn,
                    Targets=[{"Id": provider_id, "Port": group.port}],
                )
            except ClientError as exc:
                if error_code(exc) in _GONE_CODES:
                    continue  # not registered, or the target group is gone: nothing to drain
                raise translate(exc, "DeregisterTargets", path=group.where or group.arn) from exc
        waited = 0.0
        pending = list(groups)
        while True:
            states = await self.states(provider_id, pending)
            pending = [g for g in pending if states[g.arn] in ATTACHED_STATES]
            if not pending:
                return
            if waited >= self.timeout:
                listed = ", ".join(f"{g.arn} ({states[g.arn]})" for g in pending)
                raise ProviderUnavailable(
                    f"instance {provider_id} is still attached to target groups after {waited:.0f}s: "
                    f"{listed}; the delete waits until deregistration is confirmed"
                )
            await self._sleep(self.poll_interval)
            waited += self.poll_interval
