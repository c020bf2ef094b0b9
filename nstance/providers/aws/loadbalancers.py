"""ELBv2 target groups: register instances, start deregistering them, and read where they stand.

A ``load_balancers`` entry with provider ``aws`` lists target groups (``arn`` and ``target_port``).
``register`` adds a batch of instances to each target group on its port (one RegisterTargets call per
target group and chunk). ``deregister`` starts removing them and returns at once: connection draining
(the target group's deregistration delay) runs at AWS while the caller polls ``states``, which reads
each target group's members with one DescribeTargetHealth call and folds the target groups of the
entry into one ``TargetState`` per instance. A target group that no longer exists counts as holding
nothing, so a deleted target group never blocks a VM's deletion.

This module must not touch EC2 instances themselves and never waits: the caller owns the timing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from nstance.config.resources import LoadBalancerConfig
from nstance.providers.aws.calls import AwsCaller, error_code, translate
from nstance.providers.base import ProviderInvalidRequest
from nstance.providers.features import LbTarget, TargetState, combine_states

#: DescribeTargetHealth states -> where the target stands in that target group.
ELB_STATES: Mapping[str, TargetState] = {
    "initial": TargetState.REGISTERED,
    "healthy": TargetState.HEALTHY,
    "unhealthy": TargetState.REGISTERED,
    "unavailable": TargetState.REGISTERED,
    "draining": TargetState.DRAINING,
    "unhealthy.draining": TargetState.DRAINING,
    "unused": TargetState.DEREGISTERED,
}
_GONE_CODES: frozenset[str] = frozenset({"TargetGroupNotFound", "InvalidTarget"})
#: Targets per RegisterTargets / DeregisterTargets call.
CHUNK = 100


@dataclass(frozen=True, slots=True)
class TargetGroupRef:
    """One target group of an entry, the port its targets get, and where the config names it."""

    arn: str
    port: int | None  # None: the target group's default port (upstream's v1 target_group_arns)
    where: str

    @property
    def arn_path(self) -> str:
        """Config path of the ARN itself."""
        return self.where if self.port is None else f"{self.where}.arn"


def target_groups_from_config(name: str, lb: LoadBalancerConfig) -> list[TargetGroupRef]:
    """The target groups of entry ``name``; refuse an entry of another provider."""
    if lb.provider != "aws":
        raise ProviderInvalidRequest(
            f'load_balancers.{name}.provider: is "{lb.provider}"; an aws shard needs provider "aws"'
        )
    refs = [
        TargetGroupRef(tg.arn, tg.target_port, f"load_balancers.{name}.target_groups[{i}]")
        for i, tg in enumerate(lb.target_groups)
    ]
    refs.extend(
        TargetGroupRef(arn, None, f"load_balancers.{name}.target_group_arns[{i}]")
        for i, arn in enumerate(lb.target_group_arns)
    )
    return refs


def _target(provider_id: str, port: int | None) -> dict[str, Any]:
    return {"Id": provider_id} if port is None else {"Id": provider_id, "Port": port}


def _chunks(targets: Sequence[LbTarget]) -> Iterator[Sequence[LbTarget]]:
    for start in range(0, len(targets), CHUNK):
        yield targets[start : start + CHUNK]


class TargetGroups:
    """ELBv2 target registration for instances (batched, never waiting)."""

    def __init__(self, elbv2: Any, caller: AwsCaller) -> None:
        self._elbv2 = elbv2
        self._caller = caller

    async def register(self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]) -> None:
        """Add every target to every target group of entry ``name`` (registering twice is harmless)."""
        await self._each_batch("register_targets", "RegisterTargets", name, lb, targets)

    async def deregister(self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]) -> None:
        """Start removing every target from every target group of ``name``; do not wait for draining."""
        await self._each_batch("deregister_targets", "DeregisterTargets", name, lb, targets)

    async def _each_batch(
        self, method: str, action: str, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> None:
        """One ``method`` call per target group of ``name`` and chunk of targets.

        A target group that does not exist refuses a registration (naming its config path) and is
        nothing to deregister from; so is a target that is not registered.
        """
        registering = method == "register_targets"
        for group in target_groups_from_config(name, lb):
            for chunk in _chunks(targets):
                try:
                    await self._caller.call(
                        self._elbv2,
                        method,
                        TargetGroupArn=group.arn,
                        Targets=[_target(t.provider_id, group.port) for t in chunk],
                    )
                except ClientError as exc:
                    code = error_code(exc)
                    if registering and code == "TargetGroupNotFound":
                        raise ProviderInvalidRequest(
                            f"{group.arn_path}: target group {group.arn} does not exist"
                        ) from exc
                    if not registering and code in _GONE_CODES:
                        continue
                    raise translate(exc, action, path=group.where) from exc

    async def members(self, group: TargetGroupRef) -> dict[str, TargetState]:
        """Every target of one target group on its configured port, by EC2 instance id."""
        try:
            response = await self._caller.call(
                self._elbv2, "describe_target_health", TargetGroupArn=group.arn
            )
        except ClientError as exc:
            if error_code(exc) in _GONE_CODES:
                return {}
            raise translate(exc, "DescribeTargetHealth", path=group.where) from exc
        out: dict[str, TargetState] = {}
        for description in response.get("TargetHealthDescriptions", []):
            target = description.get("Target", {})
            port = target.get("Port")
            if port is not None and group.port is not None and port != group.port:
                continue
            raw = str(description.get("TargetHealth", {}).get("State", ""))
            out[str(target.get("Id", ""))] = ELB_STATES.get(raw, TargetState.REGISTERED)
        return out

    async def states(
        self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> dict[str, TargetState]:
        """Each target's state in entry ``name`` as a whole, by instance id."""
        per_group = [await self.members(group) for group in target_groups_from_config(name, lb)]
        return {
            t.instance_id: combine_states(
                [members.get(t.provider_id, TargetState.DEREGISTERED) for members in per_group]
            )
            for t in targets
        }
