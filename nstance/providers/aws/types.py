"""Check that an EC2 instance type runs the template's architecture (DescribeInstanceTypes, cached).

spec/groups-and-instances.md: whenever a group or instance names an instance type, it must match the
template's ``arch``. ``InstanceTypeArchs.check`` asks DescribeInstanceTypes once per type and caches
the answer for the life of the provider (a type's architectures never change); a failed lookup is not
cached. A mismatch or an unknown type is refused with ``ProviderInvalidRequest`` naming the config.
This module must not create or change anything in AWS.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from nstance.providers.aws.calls import AwsCaller, error_code, error_message, translate
from nstance.providers.base import ProviderInvalidRequest

#: Nstance ``arch`` -> the EC2 ``ProcessorInfo.SupportedArchitectures`` value it needs.
EC2_ARCH: Mapping[str, str] = {"amd64": "x86_64", "arm64": "arm64"}


class InstanceTypeArchs:
    """Cached architectures of EC2 instance types."""

    def __init__(self, ec2: Any, caller: AwsCaller) -> None:
        self._ec2 = ec2
        self._caller = caller
        self._cache: dict[str, frozenset[str]] = {}
        self._lock = asyncio.Lock()

    def cached(self, instance_type: str) -> frozenset[str] | None:
        """The architectures already known for ``instance_type``, or None."""
        return self._cache.get(instance_type)

    async def architectures(self, instance_type: str, *, where: str = "instance_type") -> frozenset[str]:
        """EC2 architectures ``instance_type`` supports (``x86_64``, ``arm64``, ...)."""
        known = self._cache.get(instance_type)
        if known is not None:
            return known
        async with self._lock:
            known = self._cache.get(instance_type)
            if known is not None:
                return known
            try:
                response = await self._caller.call(
                    self._ec2, "describe_instance_types", InstanceTypes=[instance_type]
                )
            except ClientError as exc:
                if error_code(exc) in ("InvalidInstanceType", "InvalidParameterValue"):
                    raise ProviderInvalidRequest(
                        f'{where}: "{instance_type}" is not an EC2 instance type in this region '
                        f"({error_message(exc)})"
                    ) from exc
                raise translate(exc, "DescribeInstanceTypes", path=where) from exc
            archs: set[str] = set()
            for info in response.get("InstanceTypes", []):
                if info.get("InstanceType") == instance_type:
                    archs.update(info.get("ProcessorInfo", {}).get("SupportedArchitectures", []))
            if not archs:
                raise ProviderInvalidRequest(
                    f'{where}: "{instance_type}" is not an EC2 instance type in this region'
                )
            result = frozenset(archs)
            self._cache[instance_type] = result
            return result

    async def check(self, instance_type: str, arch: str, *, where: str, template: str) -> None:
        """Refuse ``instance_type`` unless it supports the template's ``arch``."""
        if not arch:
            return
        wanted = EC2_ARCH.get(arch)
        if wanted is None:
            raise ProviderInvalidRequest(
                f'templates.{template}.arch: "{arch}" is not one of {", ".join(sorted(EC2_ARCH))}'
            )
        archs = await self.architectures(instance_type, where=where)
        if wanted not in archs:
            raise ProviderInvalidRequest(
                f'{where}: instance type "{instance_type}" runs {", ".join(sorted(archs))}, but template '
                f'"{template}" is {arch} ({wanted}); choose a {arch} instance type or another template'
            )
