"""Move the shard's leader network interface (an ENI holding the leader IP) to the leading server.

``attach`` makes the ENI ``interface_id`` an extra interface (device index 1 by default) of the given
EC2 instance: if it is attached elsewhere (a previous leader) it is force-detached first and we wait
until it is ``available``. The ENI must hold the configured ``shard.leader_network.ip``; otherwise the
request is refused naming that path. ``release`` detaches it from the given instance only, so a
former leader can never pull the ENI off the new one. Waits use the injected ``sleep``; this module
must not create or delete ENIs or touch anything but the one interface it is given.
"""

from __future__ import annotations

import asyncio
from typing import Any

from botocore.exceptions import ClientError

from nstance.providers.aws.calls import AwsCaller, Sleep, error_code, translate
from nstance.providers.base import ProviderInvalidRequest, ProviderUnavailable

_WHERE = "shard.leader_network.interface_id"


class LeaderNetwork:
    """Attach and release the leader ENI."""

    def __init__(
        self,
        ec2: Any,
        caller: AwsCaller,
        *,
        sleep: Sleep = asyncio.sleep,
        poll_interval: float = 1.0,
        timeout: float = 60.0,
        device_index: int = 1,
    ) -> None:
        self._ec2 = ec2
        self._caller = caller
        self._sleep = sleep
        self.poll_interval = poll_interval
        self.timeout = timeout
        self.device_index = device_index

    async def _describe(self, interface_id: str) -> dict[str, Any]:
        try:
            response = await self._caller.call(
                self._ec2, "describe_network_interfaces", NetworkInterfaceIds=[interface_id]
            )
        except ClientError as exc:
            if error_code(exc) in (
                "InvalidNetworkInterfaceID.NotFound",
                "InvalidNetworkInterfaceID.Malformed",
            ):
                raise ProviderInvalidRequest(f'{_WHERE}: no network interface "{interface_id}"') from exc
            raise translate(exc, "DescribeNetworkInterfaces", path=_WHERE) from exc
        interfaces = response.get("NetworkInterfaces", [])
        if not interfaces:
            raise ProviderInvalidRequest(f'{_WHERE}: no network interface "{interface_id}"')
        return dict(interfaces[0])

    async def attached_to(self, interface_id: str) -> str:
        """The instance the ENI is attached to (``""`` when it is free)."""
        eni = await self._describe(interface_id)
        attachment = eni.get("Attachment") or {}
        if attachment.get("Status") in ("attached", "attaching"):
            return str(attachment.get("InstanceId", ""))
        return ""

    async def attach(self, provider_id: str, interface_id: str, ip: str) -> None:
        """Attach the leader ENI to ``provider_id``, taking it from any other instance first."""
        eni = await self._describe(interface_id)
        addresses = {a.get("PrivateIpAddress") for a in eni.get("PrivateIpAddresses", [])}
        addresses.add(eni.get("PrivateIpAddress"))
        if ip and ip not in addresses:
            raise ProviderInvalidRequest(
                f'shard.leader_network.ip: "{ip}" is not an address of network interface {interface_id} '
                f"(it has {', '.join(sorted(a for a in addresses if a))})"
            )
        attachment = eni.get("Attachment") or {}
        holder = attachment.get("InstanceId", "")
        if attachment.get("Status") in ("attached", "attaching") and holder == provider_id:
            return
        if attachment.get("Status") in ("attached", "attaching", "detaching"):
            if attachment.get("Status") != "detaching":
                await self._detach(str(attachment["AttachmentId"]), force=True)
            await self._wait_available(interface_id)
        try:
            await self._caller.call(
                self._ec2,
                "attach_network_interface",
                NetworkInterfaceId=interface_id,
                InstanceId=provider_id,
                DeviceIndex=self.device_index,
            )
        except ClientError as exc:
            raise translate(exc, "AttachNetworkInterface", path=_WHERE) from exc

    async def release(self, provider_id: str, interface_id: str) -> None:
        """Detach the leader ENI if (and only if) it is attached to ``provider_id``."""
        eni = await self._describe(interface_id)
        attachment = eni.get("Attachment") or {}
        if attachment.get("InstanceId") != provider_id or attachment.get("Status") not in (
            "attached",
            "attaching",
        ):
            return
        await self._detach(str(attachment["AttachmentId"]), force=False)
        await self._wait_available(interface_id)

    async def _detach(self, attachment_id: str, *, force: bool) -> None:
        try:
            await self._caller.call(
                self._ec2, "detach_network_interface", AttachmentId=attachment_id, Force=force
            )
        except ClientError as exc:
            if error_code(exc) == "InvalidAttachmentID.NotFound":
                return
            raise translate(exc, "DetachNetworkInterface", path=_WHERE) from exc

    async def _wait_available(self, interface_id: str) -> None:
        waited = 0.0
        while True:
            eni = await self._describe(interface_id)
            attachment = eni.get("Attachment") or {}
            if eni.get("Status") == "available" or attachment.get("Status") in (None, "detached"):
                return
            if waited >= self.timeout:
                raise ProviderUnavailable(
                    f"network interface {interface_id} still {eni.get('Status')} after {waited:.0f}s"
                )
            await self._sleep(self.poll_interval)
            waited += self.poll_interval
