"""The shard's leader address as an alias IP range (``ip/32``) on the leading server's VM.

``assign`` adds ``shard.leader_network.ip`` as the alias range ``ip/32`` to the network interface
``shard.leader_network.interface_id`` (``nic0`` when empty) of the given VM, with
``instances.updateNetworkInterface``, the fingerprint it just read and the interface's other alias
ranges kept. If GCE refuses because another resource of the subnetwork uses the address (the former
leader's VM), that VM is found by listing the zone's VMs (every page, every interface's alias ranges),
the range is removed there, and the assign is tried again. A stale fingerprint (412 ``conditionNotMet``:
the interface changed since it was read) is re-read and retried a few times. ``release`` removes the
range only from the VM it is given and only if that VM holds it, so a former leader can never take
the address off the new one. A VM that already holds (or does not hold) the address gets no call.

Only ``aliasIpRanges`` and ``fingerprint`` are sent: GCE refuses updates of the interface's other
fields. The client library leaves an empty list out of the request body, and GCE then keeps the ranges
as they are, so taking an interface's last alias range away is sent as a plain ``PATCH`` with
``"aliasIpRanges": []`` through an authorised session on the same endpoint
(googleapis/google-cloud-python#11931). Operations are waited with ``GceCalls.wait``; every call runs in
a worker thread through ``GceCalls.call``.

This module must not change any interface but the one named, nor any alias range but the leader's.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import re
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import google.auth
from google.api_core import exceptions as gexc
from google.auth import credentials as gauth_credentials
from google.auth import exceptions as gauth_exceptions
from google.auth.transport.requests import AuthorizedSession
from google.cloud import compute_v1

from nstance.providers.base import InstanceNotFound, ProviderInvalidRequest, ProviderUnavailable
from nstance.providers.gcp.calls import GceCalls, error_reasons
from nstance.providers.gcp.resources import strip_api_url

LEADER_IP = "shard.leader_network.ip"
LEADER_INTERFACE = "shard.leader_network.interface_id"
DEFAULT_INTERFACE = "nic0"
#: Reads and updates of one interface before a fingerprint that keeps changing is given up on.
FINGERPRINT_ATTEMPTS = 5
_IN_USE_CODES = frozenset({"IP_IN_USE_BY_ANOTHER_RESOURCE", "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE"})
_IN_USE_TEXT = ("already being used", "already in use")
_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)

GetVm = Callable[[str], Awaitable[compute_v1.Instance]]


class _Stale(Exception):
    """The interface's fingerprint changed since it was read."""


class _InUse(Exception):
    """GCE refused the range: another resource of the subnetwork uses the address."""


def leader_range(ip: str) -> str:
    """The alias range ``ip/32`` for the leader address; refuses what is not an IPv4 address."""
    try:
        address = ipaddress.ip_address(ip.strip())
    except ValueError:
        raise ProviderInvalidRequest(f'{LEADER_IP}: "{ip}" is not an IP address') from None
    if address.version != 4:
        raise ProviderInvalidRequest(
            f"{LEADER_IP}: {ip} is IPv6; GCE alias IP ranges (the leader address on gcp) are IPv4"
        )
    return f"{address}/32"


def _same_range(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_network(a, strict=False) == ipaddress.ip_network(b, strict=False)
    except ValueError:
        return False


def holds(nic: compute_v1.NetworkInterface, cidr: str) -> bool:
    """Whether interface ``nic`` has exactly the alias range ``cidr``."""
    return any(_same_range(r.ip_cidr_range, cidr) for r in nic.alias_ip_ranges)


def _in_use(text: str) -> bool:
    lowered = text.lower()
    return any(phrase in lowered for phrase in _IN_USE_TEXT)


class AliasLeaderNetwork:
    """Moves the leader alias IP between VMs of one zone; see the module docstring."""

    def __init__(
        self,
        instances: compute_v1.InstancesClient,
        api: GceCalls,
        get_vm: GetVm,
        *,
        credentials: gauth_credentials.Credentials | None,
        page_size: int = 500,
    ) -> None:
        self._instances = instances
        self._api = api
        self._get_vm = get_vm
        self._credentials = credentials
        self._page_size = page_size
        endpoint = str(instances.api_endpoint).rstrip("/")
        self._base_url = endpoint if re.match(r"^https?://", endpoint) else f"https://{endpoint}"
        self._session: AuthorizedSession | None = None
        self._session_lock = threading.Lock()

    async def assign(self, provider_id: str, ip: str, interface_id: str) -> None:
        """Give VM ``provider_id`` the range ``ip/32``, taking it from the VM that holds it now."""
        cidr = leader_range(ip)
        nic_name = interface_id or DEFAULT_INTERFACE
        stale = 0
        freed = False
        while True:
            vm = await self._get_vm(provider_id)
            nic = self._nic(vm, nic_name)
            if nic is None:
                names = ", ".join(n.name for n in vm.network_interfaces) or "none"
                raise ProviderInvalidRequest(
                    f'{LEADER_INTERFACE}: VM {vm.name} has no network interface "{nic_name}" (it has '
                    f"{names}); name one of them, or leave it empty for {DEFAULT_INTERFACE}"
                )
            if holds(nic, cidr):
                return
            ranges = [*nic.alias_ip_ranges, compute_v1.AliasIpRange(ip_cidr_range=cidr)]
            what = f"{LEADER_IP}: add {cidr} to {vm.name} {nic_name}"
            try:
                await self._update(vm.name, nic, ranges, what)
                return
            except _Stale:
                stale += 1
                if stale >= FINGERPRINT_ATTEMPTS:
                    raise self._busy(vm.name, nic_name) from None
            except _InUse as exc:
                if freed:
                    raise ProviderUnavailable(
                        f"gcp: {what}: {cidr} is still in use after it was taken off the VM that held it "
                        f"(another server may be claiming it too); retry later ({exc})"
                    ) from None
                await self._take_from_others(vm, nic, cidr, str(exc))
                freed = True

    async def release(self, provider_id: str, ip: str, interface_id: str) -> None:
        """Remove the range ``ip/32`` from VM ``provider_id`` if, and only if, it holds it."""
        cidr = leader_range(ip)
        try:
            await self._remove(provider_id, interface_id or DEFAULT_INTERFACE, cidr)
        except InstanceNotFound:
            return  # a VM that is gone holds nothing

    def close_blocking(self) -> None:
        """Close the plain-request session, if one was opened."""
        with self._session_lock:
            session, self._session = self._session, None
        if session is not None:
            session.close()  # type: ignore[no-untyped-call]

    # ---- steps --------------------------------------------------------------------------------

    @staticmethod
    def _nic(vm: compute_v1.Instance, name: str) -> compute_v1.NetworkInterface | None:
        return next((n for n in vm.network_interfaces if n.name == name), None)

    @staticmethod
    def _busy(vm: str, nic: str) -> ProviderUnavailable:
        return ProviderUnavailable(
            f"gcp: {LEADER_INTERFACE}: the fingerprint of {vm} {nic} changed {FINGERPRINT_ATTEMPTS} times "
            "while the leader address was being moved (something else keeps updating it); retry later"
        )

    async def _remove(self, key: str, nic_name: str, cidr: str) -> None:
        """Take ``cidr`` off interface ``nic_name`` of VM ``key`` (name or id) if it has it."""
        for _ in range(FINGERPRINT_ATTEMPTS):
            vm = await self._get_vm(key)
            nic = self._nic(vm, nic_name)
            if nic is None or not holds(nic, cidr):
                return
            ranges = [r for r in nic.alias_ip_ranges if not _same_range(r.ip_cidr_range, cidr)]
            try:
                await self._update(
                    vm.name, nic, ranges, f"{LEADER_IP}: remove {cidr} from {vm.name} {nic_name}"
                )
                return
            except _Stale:
                continue
            except _InUse as exc:  # not expected for a removal; report it as it came
                raise ProviderInvalidRequest(
                    f"gcp: {LEADER_IP}: remove {cidr} from {vm.name}: {exc}"
                ) from None
        raise self._busy(key, nic_name)

    async def _take_from_others(
        self, vm: compute_v1.Instance, nic: compute_v1.NetworkInterface, cidr: str, refusal: str
    ) -> None:
        """Remove ``cidr`` from every other VM of the zone whose interface in ``nic``'s subnetwork has it."""
        subnetwork = strip_api_url(nic.subnetwork)
        holders: list[tuple[str, str]] = []
        token = ""
        while True:
            try:
                page = await self._api.call("instances.list", functools.partial(self._list_blocking, token))
            except gexc.GoogleAPICallError as exc:
                raise self._api.map_error(
                    exc, f"{LEADER_IP}: list the VMs of zone {self._api.zone} to find who holds {cidr}"
                ) from exc
            for item in page.items:
                if item.name == vm.name:
                    continue
                for other in item.network_interfaces:
                    if strip_api_url(other.subnetwork) == subnetwork and holds(other, cidr):
                        holders.append((item.name, other.name))
            token = page.next_page_token
            if not token:
                break
        if not holders:
            raise ProviderInvalidRequest(
                f"gcp: {LEADER_IP}: GCE refuses {cidr} for {vm.name} ({refusal}), but no other VM of zone "
                f"{self._api.zone} has it as an alias IP; it is used by something Nstance does not move "
                "(a VM's primary address, a VM in another zone, an internal forwarding rule or a reserved "
                "address): free it, or choose another address"
            )
        for name, nic_name in holders:
            with contextlib.suppress(InstanceNotFound):  # deleted meanwhile: it holds nothing now
                await self._remove(name, nic_name, cidr)

    def _list_blocking(self, page_token: str) -> Any:
        """One page of the zone's VMs (the pager object; its ``items`` are this page's only)."""
        return self._instances.list(
            request=compute_v1.ListInstancesRequest(
                project=self._api.project,
                zone=self._api.zone,
                max_results=self._page_size,
                page_token=page_token,
            ),
            retry=None,
            timeout=self._api.request_timeout,
        )

    async def _update(
        self,
        name: str,
        nic: compute_v1.NetworkInterface,
        ranges: list[compute_v1.AliasIpRange],
        what: str,
    ) -> None:
        """Set the interface's alias ranges to ``ranges`` and wait; _Stale / _InUse when refused so."""
        request_id = str(uuid.uuid4())  # the same for every retry of this update
        if ranges:
            fn: Callable[[], compute_v1.Operation] = functools.partial(
                self._update_blocking, name, nic.name, ranges, nic.fingerprint, request_id
            )
        else:
            fn = functools.partial(self._clear_blocking, name, nic.name, nic.fingerprint, request_id)
        try:
            op = await self._api.call("instances.updateNetworkInterface", fn)
        except gexc.GoogleAPICallError as exc:
            if isinstance(exc, gexc.PreconditionFailed) or "conditionNotMet" in error_reasons(exc):
                raise _Stale(exc.message) from exc
            if isinstance(exc, gexc.BadRequest | gexc.Conflict) and _in_use(str(exc.message)):
                raise _InUse(exc.message) from exc
            raise self._api.map_error(exc, what) from exc
        done = await self._api.wait(op, what)
        if not self._api.is_done(done):
            raise ProviderUnavailable(
                f"gcp: {what}: operation {op.name} is still running after the operation timeout; retry later"
            )
        for error in done.error.errors:
            if error.code in _IN_USE_CODES or _in_use(error.message):
                raise _InUse(f"{error.code}: {error.message}")
            if error.code == "CONDITION_NOT_MET":
                raise _Stale(error.message)
        self._api.raise_op_error(done, what)

    def _update_blocking(
        self,
        name: str,
        nic_name: str,
        ranges: list[compute_v1.AliasIpRange],
        fingerprint: str,
        request_id: str,
    ) -> compute_v1.Operation:
        return self._instances.update_network_interface_unary(
            request=compute_v1.UpdateNetworkInterfaceInstanceRequest(
                project=self._api.project,
                zone=self._api.zone,
                instance=name,
                network_interface=nic_name,
                network_interface_resource=compute_v1.NetworkInterface(
                    alias_ip_ranges=ranges, fingerprint=fingerprint
                ),
                request_id=request_id,
            ),
            retry=None,
            timeout=self._api.request_timeout,
        )

    def _clear_blocking(
        self, name: str, nic_name: str, fingerprint: str, request_id: str
    ) -> compute_v1.Operation:
        """``updateNetworkInterface`` with an explicit empty ``aliasIpRanges`` (see the module docstring)."""
        url = (
            f"{self._base_url}/compute/v1/projects/{self._api.project}/zones/{self._api.zone}"
            f"/instances/{name}/updateNetworkInterface"
        )
        response = self._authorised().request(  # type: ignore[no-untyped-call]
            "PATCH",
            url,
            params={"networkInterface": nic_name, "requestId": request_id},
            json={"aliasIpRanges": [], "fingerprint": fingerprint},
            timeout=self._api.request_timeout,
        )
        if response.status_code >= 400:
            raise gexc.from_http_response(response)  # type: ignore[no-untyped-call]
        op: compute_v1.Operation = compute_v1.Operation.from_json(response.text, ignore_unknown_fields=True)
        return op

    def _authorised(self) -> AuthorizedSession:
        """The session for plain requests, with the provider's credentials (or the default ones)."""
        with self._session_lock:
            if self._session is None:
                credentials = self._credentials
                if credentials is None:
                    try:
                        credentials, _ = google.auth.default(scopes=list(_SCOPES))
                    except gauth_exceptions.DefaultCredentialsError as exc:
                        raise ProviderInvalidRequest(f"gcp: no Google credentials found: {exc}") from exc
                self._session = AuthorizedSession(credentials)  # type: ignore[no-untyped-call]
            return self._session
