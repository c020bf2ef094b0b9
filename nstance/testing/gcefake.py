"""A small local fake of the Google Compute Engine REST API (``compute/v1``), for provider tests.

It answers the calls the ``gcp`` provider makes, shaped the way the real API shapes them, so that the
real ``google-cloud-compute`` client (REST transport) parses them: ``instances`` insert, get (by name or
numeric id), list (``filter``, ``maxResults``, ``pageToken``), delete and ``updateNetworkInterface``
(``PATCH``; alias IP ranges only); zone ``operations`` get and wait, with **numeric-string** ``id``
fields (a hex id makes the client fail to parse); machine types get (with ``architecture``); regional
subnetworks get; regional ``forwardingRules`` list (paged); zonal ``networkEndpointGroups`` get,
``attachNetworkEndpoints``, ``detachNetworkEndpoints`` (both return zone operations) and
``listNetworkEndpoints`` (paged, with ``healthStatus: SHOW`` giving each endpoint's ``healths``);
zonal unmanaged
``instanceGroups`` get, ``addInstances``, ``removeInstances`` (both return zone operations) and
``listInstances`` (paged, ``instanceState`` ``ALL`` or ``RUNNING``). Errors use Google's JSON error
body (``{"error": {"code", "message", "errors": [{"domain", "reason", "message"}]}}``) with the real
HTTP codes: 404 ``notFound``, 409 ``alreadyExists``, 400 ``invalid``, 429 ``rateLimitExceeded``, 503
``backendError``. Validation follows the real service where the provider depends on it: instance names
(RFC 1035), label keys and values, a boot disk, known machine types and subnetworks, and spot /
preemptible scheduling that cannot restart automatically. A repeated ``requestId`` returns the first
request's operation (what makes inserts idempotent).

Network interfaces carry ``fingerprint`` and (when not empty) ``aliasIpRanges``.
``updateNetworkInterface`` needs the current fingerprint (412 ``conditionNotMet`` when stale; every
change makes a new one), changes only ``aliasIpRanges`` (``name``, ``network``, ``subnetwork`` and
``networkIP`` may be sent unchanged; any other field is refused as not updatable), keeps the ranges when
``aliasIpRanges`` is left out and clears them when it is ``[]``, and refuses (400) a range outside the
subnetwork's primary range or an address another VM of the subnetwork uses: "IP address '...' is already
being used by another resource" (or, after ``report_ip_conflicts_in_operations``, an operation ending in
``IP_IN_USE_BY_ANOTHER_RESOURCE``). Network endpoint groups (``add_network_endpoint_group``) are
``GCE_VM_IP_PORT`` (endpoints get the default port unless they name one) or ``GCE_VM_IP`` (no ports). An
endpoint must name a VM of the NEG's zone (400 otherwise) with an interface in the NEG's subnetwork
(when the NEG has one; else in its network); its ``ipAddress`` defaults to that interface's primary
address and must be it or one of its alias addresses. The fake is strict where the real service's
leniency is not documented: attaching an endpoint that is already attached, or detaching one that is
not, is refused with 400. Attach and detach take effect when their operation finishes; an unknown NEG
answers 404. Tests set endpoint health with ``set_endpoint_health``: one entry per forwarding rule
that reaches the NEG (``healths[]`` with ``forwardingRule``, the rule's ``backendService`` and
``healthState``, as a passthrough load balancer reports them), or an entry without a forwarding rule
for the NEG's own backend service ``global/backendServices/<NEG>-backend``. Forwarding rules
(``add_forwarding_rule``) have an address, a protocol, ``ports``, a ``portRange`` or ``allPorts``, and a
regional backend service.

Instance groups (``add_instance_group``) hold VM names. A member is referenced as the real API takes
it: a full URL, ``projects/P/zones/Z/instances/N`` or ``zones/Z/instances/N`` of the group's project
and zone (400 otherwise); adding a VM that does not exist answers 404, one without an interface in the
group's network 400, and one that is already a member 400 ``memberAlreadyExists`` ("Resource '...' is
already a member of '...'"), refusing the whole call, as GCE does. Removing a VM that is not a member
is refused with 400 (the fake's strictness again). Changes take effect when their operation finishes;
a finished VM delete also drops the VM from its groups, as GCE does.

Operations start ``RUNNING``; ``wait`` finishes them at once (the real ``wait`` blocks up to two
minutes), while ``get`` finishes them after ``operation_polls`` polls. A finished insert makes the
instance ``RUNNING``; a finished delete removes it. Tests inject faults: ``inject_error`` (an HTTP
error on the next calls of one method), ``hide_after_insert`` (a freshly inserted VM answers 404 to
``get`` a few times - eventual consistency), ``fail_next_operation`` (an operation that ends with an
``error`` such as ``ZONE_RESOURCE_POOL_EXHAUSTED``), ``set_status`` and ``bump_fingerprint_on_update``
(the next updates find the interface changed since it was read).

It is a ``ThreadingHTTPServer`` on 127.0.0.1 in a daemon thread; all state sits behind one lock. It
uses only the standard library, must never listen beyond loopback, and is not a general GCE emulator:
anything it does not know answers 404 (unknown path) or 400 (unsupported field value).
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

SELF_LINK_ROOT = "https://www.googleapis.com/compute/v1/"
DEFAULT_MACHINE_TYPES: dict[str, tuple[int, int, str]] = {
    # name: (guestCpus, memoryMb, architecture)
    "e2-micro": (2, 1024, "X86_64"),
    "e2-medium": (2, 4096, "X86_64"),
    "e2-standard-2": (2, 8192, "X86_64"),
    "n2-standard-4": (4, 16384, "X86_64"),
    "t2a-standard-1": (1, 4096, "ARM64"),
    "c4a-standard-4": (4, 16384, "ARM64"),
}
_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_PATH = re.compile(
    r"^/compute/v1/projects/(?P<project>[^/]+)/(?P<scope>zones|regions)/(?P<where>[^/]+)"
    r"/(?P<collection>instances|operations|machineTypes|subnetworks|networkEndpointGroups|instanceGroups"
    r"|forwardingRules)"
    r"(?:/(?P<name>[^/]+))?"
    r"(?:/(?P<verb>wait|attachNetworkEndpoints|detachNetworkEndpoints|listNetworkEndpoints"
    r"|updateNetworkInterface|addInstances|removeInstances|listInstances))?$"
)
_NEG_TYPES = frozenset({"GCE_VM_IP_PORT", "GCE_VM_IP"})
_HEALTH_STATES = frozenset({"HEALTHY", "UNHEALTHY", "DRAINING", "UNKNOWN"})
#: Fields of a network interface that ``updateNetworkInterface`` may carry unchanged.
_NIC_IDENTITY_FIELDS = ("name", "kind", "network", "subnetwork", "networkIP")
_FILTER_TERM = re.compile(r'\(?\s*([A-Za-z0-9_.-]+)\s*(=|!=)\s*("(?:[^"\\]|\\.)*"|[^\s()]+)\s*\)?')
_STATUS_VALUES = frozenset(
    {
        "PROVISIONING",
        "STAGING",
        "RUNNING",
        "STOPPING",
        "STOPPED",
        "SUSPENDING",
        "SUSPENDED",
        "REPAIRING",
        "TERMINATED",
        "PENDING_STOP",
    }
)


class FakeHttpError(Exception):
    """An error the fake answers with, in Google's JSON error format."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "code": self.code,
                "message": self.message,
                "errors": [{"message": self.message, "domain": "global", "reason": self.reason}],
            }
        }


@dataclass(slots=True)
class _Operation:
    doc: dict[str, Any]
    polls_left: int
    on_done: str  # the operationType: "insert", "delete", "attachNetworkEndpoints", ...
    target: str  # instance (or network endpoint group) name
    zone: str
    error: dict[str, Any] | None = None
    effect: Callable[[], None] | None = None  # applied when the operation finishes without error


@dataclass(slots=True)
class _Neg:
    """A zonal network endpoint group and its endpoints (``{"instance", "ipAddress"[, "port"]}``)."""

    name: str
    zone: str
    id: str
    type: str
    default_port: int | None
    network: str
    subnetwork: str  # "" or the subnetwork's name in the zone's region
    created: str
    endpoints: list[dict[str, Any]] = field(default_factory=list)
    #: instance name -> forwarding rule name ("": the NEG's own backend, no rule) -> healthState
    health: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass(slots=True)
class _ForwardingRule:
    """A regional forwarding rule: where a load balancer listens and the backend service behind it."""

    name: str
    region: str
    id: str
    ip_address: str
    ip_protocol: str
    ports: list[str]
    port_range: str
    all_ports: bool
    backend_service: str  # regional backend service name
    created: str


@dataclass(slots=True)
class _InstanceGroup:
    """A zonal unmanaged instance group and its members (VM names, in the order they were added)."""

    name: str
    zone: str
    id: str
    network: str
    named_ports: list[dict[str, Any]]
    created: str
    fingerprint: str
    members: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Injected:
    code: int
    reason: str
    message: str
    times: int


@dataclass(slots=True)
class _Subnetwork:
    network: str
    cidr: ipaddress.IPv4Network
    next_host: int = 2


@dataclass(slots=True)
class RecordedCall:
    """One request the fake answered: ``method`` is the API method (``instances.insert``, ...)."""

    method: str
    path: str
    query: dict[str, str]
    status: int


@dataclass(slots=True)
class _State:
    project: str
    zones: tuple[str, ...]
    instances: dict[str, dict[str, dict[str, Any]]]  # zone -> name -> instance
    operations: dict[str, _Operation] = field(default_factory=dict)
    request_ids: dict[str, str] = field(default_factory=dict)  # requestId -> operation name
    machine_types: dict[str, dict[str, tuple[int, int, str]]] = field(default_factory=dict)
    subnetworks: dict[tuple[str, str], _Subnetwork] = field(default_factory=dict)
    injected: dict[str, list[_Injected]] = field(default_factory=dict)
    op_failures: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    hidden: dict[str, int] = field(default_factory=dict)  # instance name -> 404s left for get
    hide_next_inserts: int = 0
    negs: dict[tuple[str, str], _Neg] = field(default_factory=dict)  # (zone, name) -> NEG
    groups: dict[tuple[str, str], _InstanceGroup] = field(default_factory=dict)  # (zone, name) -> group
    rules: dict[tuple[str, str], _ForwardingRule] = field(default_factory=dict)  # (region, name) -> rule
    fingerprint_bumps: int = 0  # updates left that find the interface changed since it was read
    ip_conflicts_in_operations: bool = False
    calls: list[RecordedCall] = field(default_factory=list)


def region_of(zone: str) -> str:
    """``us-central1-a`` -> ``us-central1``."""
    return zone.rsplit("-", 1)[0]


class GceFake:
    """A local Compute Engine REST fake for one project; see the module docstring."""

    def __init__(
        self,
        *,
        project: str = "nstance-test",
        zones: tuple[str, ...] = ("us-central1-a",),
        operation_polls: int = 1,
        seed: int = 0,
    ) -> None:
        self._state = _State(project=project, zones=zones, instances={z: {} for z in zones})
        for zone in zones:
            self._state.machine_types[zone] = dict(DEFAULT_MACHINE_TYPES)
            # Like a project's auto-mode "default" network: one subnetwork per region.
            self._state.subnetworks[(region_of(zone), "default")] = _Subnetwork(
                "default", ipaddress.IPv4Network("10.128.0.0/20")
            )
        self._operation_polls = operation_polls
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ---------------------------------------------------------------------------

    @property
    def project(self) -> str:
        return self._state.project

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` (the ``endpoint`` option of the gcp provider)."""
        if self._server is None:
            raise RuntimeError("GceFake is not started; call start() first")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> GceFake:
        if self._server is not None:
            return self
        fake = self

        class Handler(_Handler):
            owner = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="gcefake", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> GceFake:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- test controls -----------------------------------------------------------------------

    def add_machine_type(
        self, name: str, *, guest_cpus: int = 2, memory_mb: int = 4096, architecture: str = "X86_64"
    ) -> None:
        """Make ``name`` a machine type in every zone (``architecture``: ``X86_64`` or ``ARM64``)."""
        with self._lock:
            for zone in self._state.zones:
                self._state.machine_types[zone][name] = (guest_cpus, memory_mb, architecture)

    def add_subnetwork(
        self, name: str, *, region: str | None = None, cidr: str = "10.0.0.0/20", network: str = "default"
    ) -> None:
        """Create subnetwork ``name`` in ``region`` (default: the first zone's region)."""
        region = region or region_of(self._state.zones[0])
        with self._lock:
            self._state.subnetworks[(region, name)] = _Subnetwork(network, ipaddress.IPv4Network(cidr))

    def inject_error(self, method: str, *, code: int, reason: str, message: str = "", times: int = 1) -> None:
        """The next ``times`` calls of ``method`` (``instances.insert``, ``zoneOperations.wait`` ...) fail."""
        text = message or {
            429: "Rate Limit Exceeded",
            503: "The service is currently unavailable.",
            500: "Internal error. Please try again or contact Google Support.",
        }.get(code, f"injected {reason}")
        with self._lock:
            self._state.injected.setdefault(method, []).append(_Injected(code, reason, text, times))

    def hide_after_insert(self, gets: int = 1) -> None:
        """The next inserted VM answers 404 to its first ``gets`` get calls (eventual consistency)."""
        with self._lock:
            self._state.hide_next_inserts = gets

    def fail_next_operation(self, method: str, *, code: str, message: str) -> None:
        """The next ``method`` operation ends DONE with this error.

        ``method`` is an ``operationType``: ``insert``, ``delete``, ``attachNetworkEndpoints``,
        ``detachNetworkEndpoints``, ``addInstances``, ``removeInstances`` or ``updateNetworkInterface``.
        """
        with self._lock:
            self._state.op_failures.setdefault(method, []).append((code, message))

    def forget_request_ids(self) -> None:
        """Drop remembered ``requestId``s (the real service keeps them for a limited time only)."""
        with self._lock:
            self._state.request_ids.clear()

    def set_status(self, name: str, status: str, *, zone: str | None = None) -> None:
        if status not in _STATUS_VALUES:
            raise ValueError(f"unknown GCE status {status!r}")
        with self._lock:
            self._state.instances[zone or self._state.zones[0]][name]["status"] = status

    def set_alias_ranges(
        self, name: str, ranges: list[str], *, nic: str = "nic0", zone: str | None = None
    ) -> None:
        """Give a VM's interface these alias ranges (as if set outside Nstance); a new fingerprint."""
        with self._lock:
            interface = self._nic(self._find(zone or self._state.zones[0], name), nic)
            self._set_aliases(interface, [{"ipCidrRange": r} for r in ranges])

    def bump_fingerprint_on_update(self, times: int = 1) -> None:
        """The next ``times`` updateNetworkInterface calls find the interface changed since it was read.

        The interface gets a new fingerprint just before the call is checked, as if another client had
        updated it in between, so the call fails with 412 ``conditionNotMet``.
        """
        with self._lock:
            self._state.fingerprint_bumps = times

    def report_ip_conflicts_in_operations(self, enabled: bool = True) -> None:
        """Report an alias address in use as a failed operation instead of a 400 on the request."""
        with self._lock:
            self._state.ip_conflicts_in_operations = enabled

    def add_network_endpoint_group(
        self,
        name: str,
        *,
        zone: str | None = None,
        type: str = "GCE_VM_IP_PORT",
        default_port: int | None = 80,
        network: str = "default",
        subnetwork: str = "",
    ) -> None:
        """Create zonal NEG ``name`` (``type`` ``GCE_VM_IP_PORT`` or ``GCE_VM_IP``, which has no port)."""
        if type not in _NEG_TYPES:
            raise ValueError(f"unsupported network endpoint type {type!r}")
        zone = zone or self._state.zones[0]
        with self._lock:
            if zone not in self._state.zones:
                raise ValueError(f"unknown zone {zone!r}")
            self._state.negs[(zone, name)] = _Neg(
                name=name,
                zone=zone,
                id=str(self._rng.randrange(10**18, 2**63)),
                type=type,
                default_port=(default_port or None) if type == "GCE_VM_IP_PORT" else None,
                network=network,
                subnetwork=subnetwork,
                created=_timestamp(),
            )

    def delete_network_endpoint_group(self, name: str, *, zone: str | None = None) -> None:
        """Delete NEG ``name`` (with its endpoints), as an operator might behind Nstance's back."""
        with self._lock:
            self._state.negs.pop((zone or self._state.zones[0], name), None)

    def network_endpoints(self, name: str, *, zone: str | None = None) -> list[dict[str, Any]]:
        """Copies of NEG ``name``'s endpoints (``{"instance", "ipAddress"[, "port"]}``)."""
        with self._lock:
            neg = self._neg(zone or self._state.zones[0], name)
            return [dict(e) for e in neg.endpoints]

    def set_endpoint_health(
        self,
        name: str,
        instance: str,
        state: str | None,
        *,
        zone: str | None = None,
        forwarding_rule: str | None = None,
    ) -> None:
        """The ``healthState`` the NEG reports for ``instance``'s endpoints through ``forwarding_rule``
        (a rule of the NEG's region, reported with its backend service) or, without one, through the
        NEG's own backend service. None removes that entry; None without a rule removes them all."""
        if state is not None and state not in _HEALTH_STATES:
            raise ValueError(f"unknown health state {state!r}")
        with self._lock:
            neg = self._neg(zone or self._state.zones[0], name)
            if (
                forwarding_rule is not None
                and (region_of(neg.zone), forwarding_rule) not in self._state.rules
            ):
                raise ValueError(f"unknown forwarding rule {forwarding_rule!r} in {region_of(neg.zone)}")
            entries = neg.health.setdefault(instance, {})
            if state is not None:
                entries[forwarding_rule or ""] = state
            elif forwarding_rule is None:
                entries.clear()
            else:
                entries.pop(forwarding_rule, None)
            if not entries:
                del neg.health[instance]

    def add_forwarding_rule(
        self,
        name: str,
        *,
        ip_address: str,
        backend_service: str,
        region: str | None = None,
        ip_protocol: str = "TCP",
        ports: list[str] | None = None,
        port_range: str = "",
        all_ports: bool = False,
    ) -> None:
        """Create regional forwarding rule ``name`` for regional backend service ``backend_service``."""
        region = region or region_of(self._state.zones[0])
        with self._lock:
            self._state.rules[(region, name)] = _ForwardingRule(
                name=name,
                region=region,
                id=str(self._rng.randrange(10**18, 2**63)),
                ip_address=ip_address,
                ip_protocol=ip_protocol,
                ports=list(ports or []),
                port_range=port_range,
                all_ports=all_ports,
                backend_service=backend_service,
                created=_timestamp(),
            )

    def add_instance_group(
        self,
        name: str,
        *,
        zone: str | None = None,
        network: str = "default",
        named_ports: dict[str, int] | None = None,
    ) -> None:
        """Create unmanaged instance group ``name`` (its VMs must have an interface in ``network``)."""
        zone = zone or self._state.zones[0]
        with self._lock:
            if zone not in self._state.zones:
                raise ValueError(f"unknown zone {zone!r}")
            self._state.groups[(zone, name)] = _InstanceGroup(
                name=name,
                zone=zone,
                id=str(self._rng.randrange(10**18, 2**63)),
                network=network,
                named_ports=[{"name": k, "port": v} for k, v in (named_ports or {}).items()],
                created=_timestamp(),
                fingerprint=_fingerprint(self._rng),
            )

    def delete_instance_group(self, name: str, *, zone: str | None = None) -> None:
        """Delete instance group ``name`` (its VMs stay), as an operator might behind Nstance's back."""
        with self._lock:
            self._state.groups.pop((zone or self._state.zones[0], name), None)

    def instance_group_members(self, name: str, *, zone: str | None = None) -> list[str]:
        """The names of the VMs in instance group ``name``, in the order they were added."""
        with self._lock:
            return list(self._group(zone or self._state.zones[0], name).members)

    def instances(self, zone: str | None = None) -> list[dict[str, Any]]:
        """Copies of the VMs in ``zone`` (default: the first zone), as the API would return them."""
        with self._lock:
            return [
                json.loads(json.dumps(i))
                for i in self._state.instances[zone or self._state.zones[0]].values()
            ]

    def calls(self, method: str | None = None) -> list[RecordedCall]:
        """Requests answered so far (optionally only one API method)."""
        with self._lock:
            return [c for c in self._state.calls if method is None or c.method == method]

    # ---- request handling (called from the server threads) ----------------------------------

    def handle(
        self, verb: str, path: str, query: dict[str, str], body: dict[str, Any] | None
    ) -> tuple[int, dict[str, Any], str]:
        """Answer one request: (HTTP status, JSON body, API method name)."""
        match = _PATH.match(path)
        method = "unknown"
        try:
            if match is None:
                raise FakeHttpError(
                    404, "notFound", f"The requested URL {path} was not found on this server."
                )
            method = _method_name(verb, match)
            with self._lock:
                self._maybe_inject(method)
                return 200, self._dispatch(method, match, query, body), method
        except FakeHttpError as exc:
            return exc.code, exc.body(), method

    def record(self, method: str, path: str, query: dict[str, str], status: int) -> None:
        with self._lock:
            self._state.calls.append(RecordedCall(method, path, query, status))

    def _maybe_inject(self, method: str) -> None:
        queue = self._state.injected.get(method)
        if not queue:
            return
        injected = queue[0]
        injected.times -= 1
        if injected.times <= 0:
            queue.pop(0)
        raise FakeHttpError(injected.code, injected.reason, injected.message)

    def _dispatch(
        self, method: str, match: re.Match[str], query: dict[str, str], body: dict[str, Any] | None
    ) -> dict[str, Any]:
        project, where, name = match["project"], match["where"], match["name"]
        if project != self._state.project:
            raise FakeHttpError(404, "notFound", f"The resource 'projects/{project}' was not found")
        if method == "subnetworks.get":
            return self._get_subnetwork(where, name or "")
        if method == "forwardingRules.list":
            return self._list_rules(where, query)
        if where not in self._state.zones:
            raise FakeHttpError(
                404, "notFound", f"The resource 'projects/{project}/zones/{where}' was not found"
            )
        zone = where
        if method == "instances.insert":
            return self._insert(zone, body or {}, query.get("requestId", ""))
        if method == "instances.list":
            return self._list(zone, query)
        if method == "instances.get":
            return self._get_instance(zone, name or "")
        if method == "instances.delete":
            return self._delete(zone, name or "", query.get("requestId", ""))
        if method in ("zoneOperations.get", "zoneOperations.wait"):
            return self._poll(zone, name or "", finish=method == "zoneOperations.wait")
        if method == "machineTypes.get":
            return self._machine_type(zone, name or "")
        if method == "instances.updateNetworkInterface":
            return self._update_network_interface(zone, name or "", query, body or {})
        if method == "networkEndpointGroups.get":
            return self._neg_doc(self._neg(zone, name or ""))
        if method == "networkEndpointGroups.listNetworkEndpoints":
            return self._list_endpoints(zone, name or "", query, body or {})
        if method in (
            "networkEndpointGroups.attachNetworkEndpoints",
            "networkEndpointGroups.detachNetworkEndpoints",
        ):
            verb = method.split(".", 1)[1]
            return self._change_endpoints(zone, name or "", verb, body or {}, query.get("requestId", ""))
        if method == "instanceGroups.get":
            return self._group_doc(self._group(zone, name or ""))
        if method == "instanceGroups.listInstances":
            return self._list_members(zone, name or "", query, body or {})
        if method in ("instanceGroups.addInstances", "instanceGroups.removeInstances"):
            verb = method.split(".", 1)[1]
            return self._change_members(zone, name or "", verb, body or {}, query.get("requestId", ""))
        raise FakeHttpError(404, "notFound", f"method {method} is not supported by the fake")

    # ---- instances ---------------------------------------------------------------------------

    def _nf(self, resource: str) -> FakeHttpError:
        """Google's 404 for ``projects/{project}/{resource}``."""
        return FakeHttpError(
            404, "notFound", f"The resource 'projects/{self._state.project}/{resource}' was not found"
        )

    def _net(self, region: str, subnet: str, network: str) -> tuple[str, str]:
        base = f"{SELF_LINK_ROOT}projects/{self._state.project}"
        return f"{base}/global/networks/{network}", f"{base}/regions/{region}/subnetworks/{subnet}"

    def _link(self, zone: str, collection: str, name: str) -> str:
        return f"{SELF_LINK_ROOT}projects/{self._state.project}/zones/{zone}/{collection}/{name}"

    def _find(self, zone: str, name_or_id: str) -> dict[str, Any]:
        instances = self._state.instances[zone]
        found = instances.get(name_or_id)
        if found is None:
            found = next((i for i in instances.values() if i["id"] == name_or_id), None)
        if found is None:
            raise self._nf(f"zones/{zone}/instances/{name_or_id}")
        return found

    def _get_instance(self, zone: str, name: str) -> dict[str, Any]:
        hidden = self._state.hidden.get(name, 0)
        if hidden > 0:
            self._state.hidden[name] = hidden - 1
            raise self._nf(f"zones/{zone}/instances/{name}")
        return self._find(zone, name)

    def _list(self, zone: str, query: dict[str, str]) -> dict[str, Any]:
        terms = _parse_filter(query.get("filter", ""))
        items = [i for i in self._state.instances[zone].values() if all(_matches(i, t) for t in terms)]
        items.sort(key=lambda i: str(i["name"]))
        return _paged(
            {
                "kind": "compute#instanceList",
                "id": f"projects/{self._state.project}/zones/{zone}/instances",
                "selfLink": f"{SELF_LINK_ROOT}projects/{self._state.project}/zones/{zone}/instances",
            },
            items,
            query,
        )

    def _insert(self, zone: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        replay = self._replay(request_id)
        if replay is not None:
            return replay
        name = str(body.get("name", ""))
        if not _NAME.match(name):
            raise FakeHttpError(
                400,
                "invalid",
                f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
                "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?|[1-9][0-9]{0,19})'",
            )
        if name in self._state.instances[zone]:
            raise FakeHttpError(
                409,
                "alreadyExists",
                f"The resource 'projects/{self._state.project}/zones/{zone}/instances/{name}' already exists",
            )
        self._check_machine_type(zone, str(body.get("machineType", "")))
        self._check_labels(body.get("labels") or {})
        self._check_disks(body.get("disks") or [])
        self._check_scheduling(body.get("scheduling") or {})
        interfaces = self._network_interfaces(zone, body.get("networkInterfaces") or [])
        instance_id = str(self._rng.randrange(10**18, 2**63))
        now = _timestamp()
        instance: dict[str, Any] = {
            "kind": "compute#instance",
            "id": instance_id,
            "creationTimestamp": now,
            "name": name,
            "machineType": self._link(zone, "machineTypes", str(body["machineType"]).rsplit("/", 1)[-1]),
            "status": "PROVISIONING",
            "zone": f"{SELF_LINK_ROOT}projects/{self._state.project}/zones/{zone}",
            "networkInterfaces": interfaces,
            "disks": [
                {
                    "kind": "compute#attachedDisk",
                    "type": "PERSISTENT",
                    "mode": "READ_WRITE",
                    "source": self._link(zone, "disks", name if i == 0 else f"{name}-{i}"),
                    "deviceName": d.get(
                        "deviceName", "persistent-disk-0" if i == 0 else f"persistent-disk-{i}"
                    ),
                    "index": i,
                    "boot": bool(d.get("boot", False)),
                    "autoDelete": bool(d.get("autoDelete", False)),
                    "interface": "SCSI",
                    "diskSizeGb": str((d.get("initializeParams") or {}).get("diskSizeGb", "10")),
                }
                for i, d in enumerate(body.get("disks") or [])
            ],
            "metadata": {
                "kind": "compute#metadata",
                "fingerprint": _fingerprint(self._rng),
                "items": list((body.get("metadata") or {}).get("items") or []),
            },
            "labels": dict(body.get("labels") or {}),
            "labelFingerprint": _fingerprint(self._rng),
            "tags": {
                "items": list((body.get("tags") or {}).get("items") or []),
                "fingerprint": _fingerprint(self._rng),
            },
            "scheduling": _scheduling_out(body.get("scheduling") or {}),
            "serviceAccounts": list(body.get("serviceAccounts") or []),
            "cpuPlatform": "Unknown CPU Platform",
            "selfLink": self._link(zone, "instances", name),
            "fingerprint": _fingerprint(self._rng),
            "startRestricted": False,
            "deletionProtection": False,
            "canIpForward": bool(body.get("canIpForward", False)),
        }
        if body.get("minCpuPlatform"):
            instance["minCpuPlatform"] = body["minCpuPlatform"]
        self._state.instances[zone][name] = instance
        if self._state.hide_next_inserts:
            self._state.hidden[name] = self._state.hide_next_inserts
            self._state.hide_next_inserts = 0
        return self._new_operation(zone, "insert", name, instance_id, request_id)

    def _delete(self, zone: str, name: str, request_id: str) -> dict[str, Any]:
        replay = self._replay(request_id)
        if replay is not None:
            return replay
        instance = self._find(zone, name)
        instance["status"] = "STOPPING"
        return self._new_operation(zone, "delete", str(instance["name"]), str(instance["id"]), request_id)

    def _replay(self, request_id: str) -> dict[str, Any] | None:
        if not request_id:
            return None
        if not re.fullmatch(
            r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", request_id
        ):
            raise FakeHttpError(
                400, "invalid", f"Invalid value for field 'requestId': '{request_id}'. Must be a UUID."
            )
        if request_id == "00000000-0000-0000-0000-000000000000":
            raise FakeHttpError(
                400, "invalid", "Invalid value for field 'requestId': the zero UUID is not allowed."
            )
        op_name = self._state.request_ids.get(request_id)
        return None if op_name is None else self._state.operations[op_name].doc

    def _check_machine_type(self, zone: str, value: str) -> None:
        name = value.rsplit("/", 1)[-1]
        known = self._state.machine_types[zone].get(name)
        if known is None:
            raise FakeHttpError(
                400,
                "invalid",
                f"Invalid value for field 'resource.machineType': '{value}'. Machine type with name '{name}' "
                f"does not exist in zone '{zone}'.",
            )

    @staticmethod
    def _check_labels(labels: dict[str, Any]) -> None:
        if len(labels) > 64:
            raise FakeHttpError(
                400, "invalid", "Invalid value for field 'resource.labels': at most 64 labels."
            )
        for key, value in labels.items():
            if not _LABEL_KEY.match(str(key)) or not isinstance(value, str) or not _LABEL_VALUE.match(value):
                raise FakeHttpError(
                    400,
                    "invalid",
                    f"Invalid value for field 'resource.labels': '{key}: {value}'. Label keys must start "
                    "with a lowercase letter and keys and values may contain only lowercase letters, "
                    "digits, '_' and '-' (at most 63 characters).",
                )

    @staticmethod
    def _check_disks(disks: list[dict[str, Any]]) -> None:
        if not disks:
            raise FakeHttpError(
                400, "invalid", "Invalid value for field 'resource.disks': ''. No disks are specified."
            )
        boot = [d for d in disks if d.get("boot")]
        if len(boot) != 1:
            raise FakeHttpError(
                400, "invalid", "Invalid value for field 'resource.disks': exactly one boot disk is required."
            )
        params = boot[0].get("initializeParams") or {}
        if not boot[0].get("source") and not params.get("sourceImage") and not params.get("sourceSnapshot"):
            raise FakeHttpError(
                400,
                "invalid",
                "Invalid value for field 'resource.disks[0].initializeParams.sourceImage': ''. "
                "Source image must be specified.",
            )

    @staticmethod
    def _check_scheduling(scheduling: dict[str, Any]) -> None:
        spot = scheduling.get("provisioningModel") == "SPOT" or bool(scheduling.get("preemptible"))
        if spot and scheduling.get("automaticRestart", False):
            raise FakeHttpError(
                400,
                "invalid",
                "Invalid value for field 'resource.scheduling.automaticRestart': 'true'. "
                "Preemptible and Spot instances cannot be automatically restarted.",
            )
        if spot and scheduling.get("onHostMaintenance", "TERMINATE") != "TERMINATE":
            raise FakeHttpError(
                400,
                "invalid",
                "Invalid value for field 'resource.scheduling.onHostMaintenance': Preemptible and Spot "
                "instances must terminate on host maintenance.",
            )

    def _network_interfaces(self, zone: str, interfaces: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for index, nic in enumerate(interfaces or [{}]):
            subnet_ref = str(nic.get("subnetwork", ""))
            region = region_of(zone)
            name = "default"
            if subnet_ref:
                parts = subnet_ref.split("/")
                if "subnetworks" not in parts or "regions" not in parts:
                    raise FakeHttpError(
                        400,
                        "invalid",
                        f"Invalid value for field 'resource.networkInterfaces[{index}].subnetwork': "
                        f"'{subnet_ref}'.",
                    )
                name = parts[parts.index("subnetworks") + 1]
                region = parts[parts.index("regions") + 1]
            subnet = self._state.subnetworks.get((region, name))
            if subnet is None:
                raise self._nf(f"regions/{region}/subnetworks/{name}")
            network_link, subnet_link = self._net(region, name, subnet.network)
            ip = subnet.cidr.network_address + subnet.next_host
            subnet.next_host += 1
            while self._address_user(region, name, ipaddress.IPv4Network(ip)):
                ip = subnet.cidr.network_address + subnet.next_host  # never hand out an alias IP in use
                subnet.next_host += 1
            interface: dict[str, Any] = {
                "kind": "compute#networkInterface",
                "network": network_link,
                "subnetwork": subnet_link,
                "networkIP": str(ip),
                "name": f"nic{index}",
                "fingerprint": _fingerprint(self._rng),
                "stackType": "IPV4_ONLY",
            }
            if nic.get("aliasIpRanges"):
                interface["aliasIpRanges"] = list(nic["aliasIpRanges"])
            out.append(interface)
        return out

    # ---- network interfaces: alias IP ranges -------------------------------------------------

    @staticmethod
    def _nic(instance: dict[str, Any], name: str) -> dict[str, Any]:
        found: dict[str, Any] | None = next(
            (n for n in instance.get("networkInterfaces", []) if n.get("name") == name), None
        )
        if found is None:
            raise FakeHttpError(
                400,
                "invalid",
                f"Invalid value for field 'networkInterface': '{name}'. Network interface '{name}' does not "
                f"exist on instance '{instance['name']}'.",
            )
        return found

    def _set_aliases(self, nic: dict[str, Any], ranges: list[dict[str, Any]]) -> None:
        if ranges:
            nic["aliasIpRanges"] = ranges
        else:
            nic.pop("aliasIpRanges", None)  # the real API omits an empty list
        nic["fingerprint"] = _fingerprint(self._rng)

    @staticmethod
    def _subnet_key(nic: dict[str, Any]) -> tuple[str, str]:
        parts = str(nic.get("subnetwork", "")).split("/")
        return parts[parts.index("regions") + 1], parts[parts.index("subnetworks") + 1]

    def _address_user(self, region: str, subnet: str, net: ipaddress.IPv4Network, *, skip: str = "") -> str:
        """The VM (other than ``skip``) of a subnetwork whose primary or alias addresses overlap ``net``."""
        for zone in self._state.zones:
            if region_of(zone) != region:
                continue
            for instance in self._state.instances[zone].values():
                if instance["name"] == skip:
                    continue
                for nic in instance.get("networkInterfaces", []):
                    if self._subnet_key(nic) != (region, subnet):
                        continue
                    if ipaddress.IPv4Address(nic["networkIP"]) in net:
                        return str(instance["name"])
                    for alias in nic.get("aliasIpRanges", []):
                        if ipaddress.IPv4Network(alias["ipCidrRange"], strict=False).overlaps(net):
                            return str(instance["name"])
        return ""

    def _update_network_interface(
        self, zone: str, name: str, query: dict[str, str], body: dict[str, Any]
    ) -> dict[str, Any]:
        replay = self._replay(query.get("requestId", ""))
        if replay is not None:
            return replay
        instance = self._find(zone, name)
        nic_name = query.get("networkInterface", "")
        if not nic_name:
            raise FakeHttpError(400, "required", "Required field 'networkInterface' not specified")
        nic = self._nic(instance, nic_name)
        for key, value in body.items():
            if key in ("aliasIpRanges", "fingerprint"):
                continue
            if key not in _NIC_IDENTITY_FIELDS or value != nic.get(key, value if key == "kind" else None):
                raise FakeHttpError(
                    400,
                    "invalid",
                    f"Invalid value for field 'resource.{key}': '{value}'. "
                    "Updating this field is not supported.",
                )
        if self._state.fingerprint_bumps > 0:
            self._state.fingerprint_bumps -= 1
            nic["fingerprint"] = _fingerprint(self._rng)  # someone else changed it after the caller read it
        supplied = str(body.get("fingerprint", ""))
        if not supplied:
            raise FakeHttpError(
                400,
                "invalid",
                "Invalid value for field 'resource.fingerprint': ''. A fingerprint is required.",
            )
        if supplied != nic["fingerprint"]:
            raise FakeHttpError(
                412,
                "conditionNotMet",
                "Supplied fingerprint does not match current network interface fingerprint.",
            )
        error: dict[str, Any] | None = None
        ranges: list[dict[str, Any]] | None = None
        if "aliasIpRanges" in body:
            ranges, conflict = self._check_alias_ranges(instance, nic, body.get("aliasIpRanges") or [])
            if conflict and self._state.ip_conflicts_in_operations:
                error = {"errors": [{"code": "IP_IN_USE_BY_ANOTHER_RESOURCE", "message": conflict}]}
            elif conflict:
                raise FakeHttpError(400, "invalid", conflict)

        def apply() -> None:
            self._set_aliases(nic, nic.get("aliasIpRanges", []) if ranges is None else ranges)

        return self._new_operation(
            zone,
            "updateNetworkInterface",
            str(instance["name"]),
            str(instance["id"]),
            query.get("requestId", ""),
            effect=apply,
            error=error,
        )

    def _check_alias_ranges(
        self, instance: dict[str, Any], nic: dict[str, Any], ranges: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], str]:
        """The normalised ranges, and a conflict message when another VM uses one of their addresses."""
        region, subnet_name = self._subnet_key(nic)
        subnet = self._state.subnetworks[(region, subnet_name)]
        out: list[dict[str, Any]] = []
        nets: list[ipaddress.IPv4Network] = []
        conflict = ""
        for index, item in enumerate(ranges):
            field_name = f"resource.aliasIpRanges[{index}].ipCidrRange"
            raw = str(item.get("ipCidrRange", "")) if isinstance(item, dict) else ""
            if isinstance(item, dict) and item.get("subnetworkRangeName"):
                raise FakeHttpError(
                    400, "invalid", "the fake supports alias ranges from the subnetwork's primary range only"
                )
            try:
                net = ipaddress.IPv4Network(raw if "/" in raw else f"{raw}/32")
            except ValueError:
                raise FakeHttpError(
                    400, "invalid", f"Invalid value for field '{field_name}': '{raw}'. Invalid IP CIDR range."
                ) from None
            if not net.subnet_of(subnet.cidr):
                raise FakeHttpError(
                    400,
                    "invalid",
                    f"Invalid value for field '{field_name}': '{raw}'. The alias IP range must be within the "
                    f"primary range {subnet.cidr} of subnetwork '{subnet_name}'.",
                )
            if ipaddress.IPv4Address(nic["networkIP"]) in net:
                raise FakeHttpError(
                    400,
                    "invalid",
                    f"Invalid value for field '{field_name}': '{raw}'. The range contains the primary IP "
                    f"address {nic['networkIP']} of this network interface.",
                )
            if any(net.overlaps(n) for n in nets):
                raise FakeHttpError(
                    400,
                    "invalid",
                    f"Invalid value for field '{field_name}': '{raw}'. The range overlaps another range of "
                    "this network interface.",
                )
            nets.append(net)
            out.append({"ipCidrRange": str(net)})
            if not conflict and self._address_user(region, subnet_name, net, skip=str(instance["name"])):
                shown = net.network_address if net.prefixlen == 32 else net
                conflict = (
                    f"Invalid value for field '{field_name}': '{raw}'. IP address '{shown}' is already being "
                    "used by another resource."
                )
        return out, conflict

    # ---- network endpoint groups -------------------------------------------------------------

    def _neg(self, zone: str, name: str) -> _Neg:
        neg = self._state.negs.get((zone, name))
        if neg is None:
            raise self._nf(f"zones/{zone}/networkEndpointGroups/{name}")
        return neg

    def _neg_doc(self, neg: _Neg) -> dict[str, Any]:
        region = region_of(neg.zone)
        network_link, subnet_link = self._net(region, neg.subnetwork or "default", neg.network)
        doc: dict[str, Any] = {
            "kind": "compute#networkEndpointGroup",
            "id": neg.id,
            "creationTimestamp": neg.created,
            "selfLink": self._link(neg.zone, "networkEndpointGroups", neg.name),
            "name": neg.name,
            "networkEndpointType": neg.type,
            "size": len(neg.endpoints),
            "zone": f"{SELF_LINK_ROOT}projects/{self._state.project}/zones/{neg.zone}",
            "network": network_link,
        }
        if neg.subnetwork:
            doc["subnetwork"] = subnet_link
        if neg.default_port is not None:
            doc["defaultPort"] = neg.default_port
        return doc

    def _list_endpoints(
        self, zone: str, name: str, query: dict[str, str], body: dict[str, Any]
    ) -> dict[str, Any]:
        neg = self._neg(zone, name)
        mode = str(body.get("healthStatus", "SKIP"))
        if mode not in ("SHOW", "SKIP"):
            raise FakeHttpError(
                400,
                "invalid",
                f"Invalid value for field 'resource.healthStatus': '{mode}'. Must be SHOW or SKIP.",
            )
        items: list[dict[str, Any]] = []
        for endpoint in sorted(
            neg.endpoints, key=lambda e: (e["instance"], e["ipAddress"], e.get("port", 0))
        ):
            item: dict[str, Any] = {"networkEndpoint": dict(endpoint)}
            entries = neg.health.get(endpoint["instance"], {})
            if mode == "SHOW" and entries:
                item["healths"] = [self._health_doc(neg, rule, entries[rule]) for rule in sorted(entries)]
            items.append(item)
        return _paged({"kind": "compute#networkEndpointGroupsListNetworkEndpoints"}, items, query)

    def _health_doc(self, neg: _Neg, rule_name: str, state: str) -> dict[str, Any]:
        """One ``healths[]`` entry: through forwarding rule ``rule_name``, or the NEG's own backend."""
        base = f"{SELF_LINK_ROOT}projects/{self._state.project}"
        if not rule_name:
            return {
                "backendService": {"backendService": f"{base}/global/backendServices/{neg.name}-backend"},
                "healthCheck": {"healthCheck": f"{base}/global/healthChecks/{neg.name}-hc"},
                "healthState": state,
            }
        rule = self._state.rules[(region_of(neg.zone), rule_name)]
        regional = f"{base}/regions/{rule.region}"
        return {
            "forwardingRule": {"forwardingRule": f"{regional}/forwardingRules/{rule.name}"},
            "backendService": {"backendService": f"{regional}/backendServices/{rule.backend_service}"},
            "healthCheck": {"healthCheck": f"{regional}/healthChecks/{rule.backend_service}-hc"},
            "healthState": state,
        }

    # ---- forwarding rules --------------------------------------------------------------------

    def _list_rules(self, region: str, query: dict[str, str]) -> dict[str, Any]:
        if region not in {region_of(z) for z in self._state.zones}:
            raise FakeHttpError(
                404,
                "notFound",
                f"The resource 'projects/{self._state.project}/regions/{region}' was not found",
            )
        base = f"{SELF_LINK_ROOT}projects/{self._state.project}/regions/{region}"
        items: list[dict[str, Any]] = []
        for (rule_region, _), rule in sorted(self._state.rules.items()):
            if rule_region != region:
                continue
            doc: dict[str, Any] = {
                "kind": "compute#forwardingRule",
                "id": rule.id,
                "creationTimestamp": rule.created,
                "name": rule.name,
                "region": base,
                "IPAddress": rule.ip_address,
                "IPProtocol": rule.ip_protocol,
                "backendService": f"{base}/backendServices/{rule.backend_service}",
                "loadBalancingScheme": "EXTERNAL",
                "networkTier": "PREMIUM",
                "selfLink": f"{base}/forwardingRules/{rule.name}",
            }
            if rule.ports:
                doc["ports"] = list(rule.ports)
            if rule.port_range:
                doc["portRange"] = rule.port_range
            if rule.all_ports:
                doc["allPorts"] = True
            items.append(doc)
        return _paged(
            {"kind": "compute#forwardingRuleList", "selfLink": f"{base}/forwardingRules"}, items, query
        )

    def _change_endpoints(
        self, zone: str, name: str, verb: str, body: dict[str, Any], request_id: str
    ) -> dict[str, Any]:
        replay = self._replay(request_id)
        if replay is not None:
            return replay
        neg = self._neg(zone, name)
        given = body.get("networkEndpoints")
        if not isinstance(given, list) or not given:
            raise FakeHttpError(
                400, "invalid", "Invalid value for field 'resource.networkEndpoints': ''. No endpoints given."
            )
        wanted: list[dict[str, Any]] = []
        for index, item in enumerate(given):
            endpoint = self._endpoint(
                neg, item if isinstance(item, dict) else {}, index, attach=verb.startswith("attach")
            )
            attached = _endpoint_key(endpoint) in {_endpoint_key(e) for e in neg.endpoints}
            repeated = _endpoint_key(endpoint) in {_endpoint_key(e) for e in wanted}
            if verb.startswith("attach") and (attached or repeated):
                raise FakeHttpError(
                    400,
                    "invalid",
                    f"Invalid value for field 'resource.networkEndpoints[{index}]': "
                    f"'{_endpoint_text(endpoint)}'. The network endpoint is already attached to network "
                    f"endpoint group '{neg.name}'.",
                )
            if verb.startswith("detach") and not attached:
                raise FakeHttpError(
                    400,
                    "invalid",
                    f"Invalid value for field 'resource.networkEndpoints[{index}]': "
                    f"'{_endpoint_text(endpoint)}'. The network endpoint is not attached to network "
                    f"endpoint group '{neg.name}'.",
                )
            wanted.append(endpoint)
        keys = {_endpoint_key(e) for e in wanted}

        def apply() -> None:
            if verb.startswith("attach"):
                present = {_endpoint_key(e) for e in neg.endpoints}
                neg.endpoints.extend(e for e in wanted if _endpoint_key(e) not in present)
                return
            neg.endpoints[:] = [e for e in neg.endpoints if _endpoint_key(e) not in keys]
            remaining = {e["instance"] for e in neg.endpoints}
            for instance in list(neg.health):
                if instance not in remaining:
                    del neg.health[instance]

        return self._new_operation(
            zone, verb, neg.name, neg.id, request_id, collection="networkEndpointGroups", effect=apply
        )

    def _on_neg_net(self, neg: _Neg, nic: dict[str, Any]) -> bool:
        """Whether interface ``nic`` is in the NEG's subnetwork (or, for a NEG without one, its network)."""
        if neg.subnetwork:
            return self._subnet_key(nic) == (region_of(neg.zone), neg.subnetwork)
        return str(nic.get("network", "")).rsplit("/", 1)[-1] == neg.network

    def _endpoint(self, neg: _Neg, item: dict[str, Any], index: int, *, attach: bool) -> dict[str, Any]:
        """A requested endpoint as the NEG stores it (VM name, address, port); refuses bad ones."""
        field_name = f"resource.networkEndpoints[{index}]"
        ref = str(item.get("instance", ""))
        if not ref:
            raise FakeHttpError(
                400,
                "invalid",
                f"Invalid value for field '{field_name}.instance': ''. An instance is required for network "
                f"endpoints of type {neg.type}.",
            )
        vm_name = ref.rsplit("/", 1)[-1]
        if neg.type == "GCE_VM_IP":
            if "port" in item:
                raise FakeHttpError(
                    400,
                    "invalid",
                    f"Invalid value for field '{field_name}.port': '{item['port']}'. GCE_VM_IP network "
                    "endpoints have no port.",
                )
            port = None
        else:
            port = item.get("port", neg.default_port)
            if port is None:
                raise FakeHttpError(
                    400,
                    "invalid",
                    f"Invalid value for field '{field_name}.port': ''. A port is required: network endpoint "
                    f"group '{neg.name}' has no default port.",
                )
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise FakeHttpError(400, "invalid", f"Invalid value for field '{field_name}.port': '{port}'.")
        instance = self._state.instances[neg.zone].get(vm_name)
        address = str(item.get("ipAddress", ""))
        if instance is None:
            if attach or not address:
                raise FakeHttpError(
                    400,
                    "invalid",
                    f"Invalid value for field '{field_name}.instance': '{ref}'. The resource "
                    f"'projects/{self._state.project}/zones/{neg.zone}/instances/{vm_name}' was not found",
                )
        else:
            nic = next((n for n in instance.get("networkInterfaces", []) if self._on_neg_net(neg, n)), None)
            if nic is None:
                where = f"subnetwork '{neg.subnetwork}'" if neg.subnetwork else f"network '{neg.network}'"
                raise FakeHttpError(
                    400,
                    "invalid",
                    f"Invalid value for field '{field_name}.instance': '{ref}'. The instance has no network "
                    f"interface in {where} of the network endpoint group.",
                )
            address = address or str(nic["networkIP"])
            own = [ipaddress.IPv4Network(nic["networkIP"])] + [
                ipaddress.IPv4Network(a["ipCidrRange"], strict=False) for a in nic.get("aliasIpRanges", [])
            ]
            try:
                belongs = any(ipaddress.IPv4Address(address) in net for net in own)
            except ValueError:
                belongs = False
            if not belongs:
                raise FakeHttpError(
                    400,
                    "invalid",
                    f"Invalid value for field '{field_name}.ipAddress': '{address}'. The IP address does not "
                    f"belong to instance '{vm_name}' in network '{neg.network}'.",
                )
        endpoint: dict[str, Any] = {"instance": vm_name, "ipAddress": address}
        if port is not None:
            endpoint["port"] = port
        return endpoint

    # ---- unmanaged instance groups -----------------------------------------------------------

    def _group(self, zone: str, name: str) -> _InstanceGroup:
        group = self._state.groups.get((zone, name))
        if group is None:
            raise self._nf(f"zones/{zone}/instanceGroups/{name}")
        return group

    def _group_doc(self, group: _InstanceGroup) -> dict[str, Any]:
        network_link, _ = self._net(region_of(group.zone), "default", group.network)
        doc: dict[str, Any] = {
            "kind": "compute#instanceGroup",
            "id": group.id,
            "creationTimestamp": group.created,
            "name": group.name,
            "description": "",
            "network": network_link,
            "fingerprint": group.fingerprint,
            "zone": f"{SELF_LINK_ROOT}projects/{self._state.project}/zones/{group.zone}",
            "selfLink": self._link(group.zone, "instanceGroups", group.name),
            "size": len(group.members),
        }
        if group.named_ports:
            doc["namedPorts"] = [dict(p) for p in group.named_ports]
        return doc

    def _list_members(
        self, zone: str, name: str, query: dict[str, str], body: dict[str, Any]
    ) -> dict[str, Any]:
        group = self._group(zone, name)
        state = str(body.get("instanceState", "ALL"))
        if state not in ("ALL", "RUNNING"):
            raise FakeHttpError(
                400,
                "invalid",
                f"Invalid value for field 'resource.instanceState': '{state}'. Must be ALL or RUNNING.",
            )
        items: list[dict[str, Any]] = []
        for member in group.members:
            instance = self._state.instances[group.zone].get(member)
            status = str(instance["status"]) if instance is not None else "TERMINATED"
            if state == "RUNNING" and status != "RUNNING":
                continue
            item: dict[str, Any] = {"instance": self._link(group.zone, "instances", member), "status": status}
            if group.named_ports:
                item["namedPorts"] = [dict(p) for p in group.named_ports]
            items.append(item)
        out = {
            "kind": "compute#instanceGroupsListInstances",
            "id": f"{self._link(group.zone, 'instanceGroups', group.name)}/listInstances",
            "selfLink": f"{self._link(group.zone, 'instanceGroups', group.name)}/listInstances",
        }
        return _paged(out, items, query)

    def _change_members(
        self, zone: str, name: str, verb: str, body: dict[str, Any], request_id: str
    ) -> dict[str, Any]:
        replay = self._replay(request_id)
        if replay is not None:
            return replay
        group = self._group(zone, name)
        given = body.get("instances")
        if not isinstance(given, list) or not given:
            raise FakeHttpError(
                400, "invalid", "Invalid value for field 'resource.instances': ''. No instances given."
            )
        adding = verb == "addInstances"
        group_path = f"projects/{self._state.project}/zones/{group.zone}/instanceGroups/{group.name}"
        wanted: list[str] = []
        for index, item in enumerate(given):
            vm_name = self._member_ref(group, item if isinstance(item, dict) else {}, index, check=adding)
            vm_path = f"projects/{self._state.project}/zones/{group.zone}/instances/{vm_name}"
            if vm_name in wanted:
                raise FakeHttpError(
                    400,
                    "invalid",
                    f"Invalid value for field 'resource.instances[{index}].instance': '{vm_path}'. "
                    "The instance is listed more than once.",
                )
            if adding and vm_name in group.members:
                raise FakeHttpError(
                    400, "memberAlreadyExists", f"Resource '{vm_path}' is already a member of '{group_path}'."
                )
            if not adding and vm_name not in group.members:
                raise FakeHttpError(
                    400, "invalid", f"Resource '{vm_path}' is not a member of '{group_path}'."
                )
            wanted.append(vm_name)

        def apply() -> None:
            if adding:
                group.members.extend(m for m in wanted if m not in group.members)
            else:
                group.members[:] = [m for m in group.members if m not in wanted]
            group.fingerprint = _fingerprint(self._rng)

        return self._new_operation(
            zone, verb, group.name, group.id, request_id, collection="instanceGroups", effect=apply
        )

    def _member_ref(self, group: _InstanceGroup, item: dict[str, Any], index: int, *, check: bool) -> str:
        """The VM name an ``instances[i]`` reference names (a URL, ``projects/...`` or ``zones/...`` path).

        When adding (``check``), the VM must exist in the group's zone, with an interface in its network.
        """
        field_name = f"resource.instances[{index}].instance"
        ref = str(item.get("instance", ""))
        path = ref
        for prefix in (SELF_LINK_ROOT, "https://compute.googleapis.com/compute/v1/"):
            path = path.removeprefix(prefix)
        parts = path.split("/")
        if len(parts) == 4:
            parts = ["projects", self._state.project, *parts]
        if len(parts) != 6 or parts[0] != "projects" or parts[2] != "zones" or parts[4] != "instances":
            raise FakeHttpError(
                400,
                "invalid",
                f"Invalid value for field '{field_name}': '{ref}'. The URL is malformed.",
            )
        project, zone, vm_name = parts[1], parts[3], parts[5]
        if project != self._state.project or zone != group.zone:
            raise FakeHttpError(
                400,
                "invalid",
                f"Invalid value for field '{field_name}': '{ref}'. Instance must be in the same project and "
                f"zone as the instance group (zone '{group.zone}').",
            )
        if not check:
            return vm_name
        instance = self._state.instances[group.zone].get(vm_name)
        if instance is None:
            raise self._nf(f"zones/{zone}/instances/{vm_name}")
        networks = {
            str(n.get("network", "")).rsplit("/", 1)[-1] for n in instance.get("networkInterfaces", [])
        }
        if group.network not in networks:
            raise FakeHttpError(
                400,
                "invalid",
                f"Resource 'projects/{project}/zones/{zone}/instances/{vm_name}' is expected to be in the "
                f"network 'projects/{project}/global/networks/{group.network}'.",
            )
        return vm_name

    # ---- operations --------------------------------------------------------------------------

    def _new_operation(
        self,
        zone: str,
        kind: str,
        target: str,
        target_id: str,
        request_id: str,
        *,
        collection: str = "instances",
        effect: Callable[[], None] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        millis = int(time.time() * 1000)
        name = (
            f"operation-{millis}-{self._rng.getrandbits(52):013x}-"
            f"{self._rng.getrandbits(32):08x}-{self._rng.getrandbits(32):08x}"
        )
        now = _timestamp()
        doc: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(self._rng.randrange(10**18, 2**63)),  # numeric, as the real API (and the client) need
            "name": name,
            "zone": f"{SELF_LINK_ROOT}projects/{self._state.project}/zones/{zone}",
            "operationType": kind,
            "targetLink": self._link(zone, collection, target),
            "targetId": target_id,
            "status": "RUNNING",
            "user": "fake@nstance.test",
            "progress": 0,
            "insertTime": now,
            "startTime": now,
            "selfLink": self._link(zone, "operations", name),
        }
        failures = self._state.op_failures.get(kind)
        if failures and error is None:
            code, message = failures.pop(0)
            error = {"errors": [{"code": code, "message": message}]}
        self._state.operations[name] = _Operation(
            doc, self._operation_polls, kind, target, zone, error, effect
        )
        if request_id:
            self._state.request_ids[request_id] = name
        return doc

    def _poll(self, zone: str, name: str, *, finish: bool) -> dict[str, Any]:
        op = self._state.operations.get(name)
        if op is None or op.zone != zone:
            raise self._nf(f"zones/{zone}/operations/{name}")
        if op.doc["status"] != "DONE":
            op.polls_left -= 1
            if finish or op.polls_left <= 0:
                self._finish(op)
        return op.doc

    def _finish(self, op: _Operation) -> None:
        op.doc.update(status="DONE", progress=100, endTime=_timestamp())
        instances = self._state.instances[op.zone]
        if op.error is not None:
            op.doc["error"] = op.error
            op.doc["httpErrorStatusCode"] = 503 if "EXHAUSTED" in op.error["errors"][0]["code"] else 400
            op.doc["httpErrorMessage"] = (
                "SERVICE UNAVAILABLE" if op.doc["httpErrorStatusCode"] == 503 else "BAD REQUEST"
            )
            if op.on_done == "insert":
                instances.pop(op.target, None)
            elif op.on_done == "delete" and op.target in instances:
                instances[op.target]["status"] = "RUNNING"
            return
        if op.effect is not None:
            op.effect()
        if op.on_done == "insert" and op.target in instances:
            instance = instances[op.target]
            instance["status"] = "RUNNING"
            arch = self._state.machine_types[op.zone][str(instance["machineType"]).rsplit("/", 1)[-1]][2]
            instance["cpuPlatform"] = "Ampere Altra" if arch == "ARM64" else "Intel Cascade Lake"
            instance["lastStartTimestamp"] = _timestamp()
        elif op.on_done == "delete":
            instances.pop(op.target, None)
            for group in self._state.groups.values():  # GCE drops a deleted VM from its groups
                if group.zone == op.zone and op.target in group.members:
                    group.members.remove(op.target)

    # ---- machine types and subnetworks -------------------------------------------------------

    def _machine_type(self, zone: str, name: str) -> dict[str, Any]:
        known = self._state.machine_types[zone].get(name)
        if known is None:
            raise self._nf(f"zones/{zone}/machineTypes/{name}")
        cpus, memory, arch = known
        return {
            "kind": "compute#machineType",
            "id": str(abs(hash((zone, name))) % 10**12 + 1),
            "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
            "name": name,
            "description": f"{cpus} vCPUs, {memory / 1024:g} GB RAM",
            "guestCpus": cpus,
            "memoryMb": memory,
            "maximumPersistentDisks": 128,
            "maximumPersistentDisksSizeGb": "263168",
            "zone": zone,
            "selfLink": self._link(zone, "machineTypes", name),
            "isSharedCpu": name.startswith(("e2-micro", "e2-small", "e2-medium")),
            "architecture": arch,
        }

    def _get_subnetwork(self, region: str, name: str) -> dict[str, Any]:
        subnet = self._state.subnetworks.get((region, name))
        if subnet is None:
            raise self._nf(f"regions/{region}/subnetworks/{name}")
        return {
            "kind": "compute#subnetwork",
            "id": str(abs(hash((region, name))) % 10**12 + 1),
            "name": name,
            "network": f"{SELF_LINK_ROOT}projects/{self._state.project}/global/networks/{subnet.network}",
            "ipCidrRange": str(subnet.cidr),
            "gatewayAddress": str(subnet.cidr.network_address + 1),
            "region": f"{SELF_LINK_ROOT}projects/{self._state.project}/regions/{region}",
            "selfLink": f"{SELF_LINK_ROOT}projects/{self._state.project}/regions/{region}/subnetworks/{name}",
            "stackType": "IPV4_ONLY",
            "purpose": "PRIVATE",
            "fingerprint": "AAAAAAAAAAA=",
        }


def _method_name(verb: str, match: re.Match[str]) -> str:
    regional = _regional_list_method(verb, match)
    if regional:
        return regional
    collection, name, action = match["collection"], match["name"], match["verb"]
    zonal = match["scope"] == "zones"
    if collection == "instances" and zonal:
        if name is None:
            return {"POST": "instances.insert", "GET": "instances.list"}.get(verb, "unknown")
        if action == "updateNetworkInterface" and verb == "PATCH":
            return "instances.updateNetworkInterface"
        if action is None:
            return {"GET": "instances.get", "DELETE": "instances.delete"}.get(verb, "unknown")
        return "unknown"
    if collection == "operations" and name is not None and zonal:
        if action == "wait":
            return "zoneOperations.wait" if verb == "POST" else "unknown"
        return "zoneOperations.get" if verb == "GET" and action is None else "unknown"
    if collection == "networkEndpointGroups" and name is not None and zonal:
        if action in ("attachNetworkEndpoints", "detachNetworkEndpoints", "listNetworkEndpoints"):
            return f"networkEndpointGroups.{action}" if verb == "POST" else "unknown"
        return "networkEndpointGroups.get" if verb == "GET" and action is None else "unknown"
    if collection == "instanceGroups" and name is not None and zonal:
        if action in ("addInstances", "removeInstances", "listInstances"):
            return f"instanceGroups.{action}" if verb == "POST" else "unknown"
        return "instanceGroups.get" if verb == "GET" and action is None else "unknown"
    if action is not None or name is None or verb != "GET":
        return "unknown"
    if collection == "machineTypes" and zonal:
        return "machineTypes.get"
    if collection == "subnetworks" and not zonal:
        return "subnetworks.get"
    return "unknown"


def _regional_list_method(verb: str, match: re.Match[str]) -> str:
    """Regional collections listed without a name (``forwardingRules.list``)."""
    if match["collection"] == "forwardingRules" and match["scope"] == "regions" and verb == "GET":
        return "forwardingRules.list" if match["name"] is None and match["verb"] is None else "unknown"
    return ""


def _endpoint_key(endpoint: dict[str, Any]) -> tuple[str, str, int]:
    return str(endpoint["instance"]), str(endpoint["ipAddress"]), int(endpoint.get("port") or 0)


def _endpoint_text(endpoint: dict[str, Any]) -> str:
    port = f":{endpoint['port']}" if "port" in endpoint else ""
    return f"{endpoint['instance']} {endpoint['ipAddress']}{port}"


def _parse_filter(text: str) -> list[tuple[str, str, str]]:
    """``labels.a = "x" AND (labels.b != y)`` -> [(field, op, value), ...]; only AND is supported."""
    terms: list[tuple[str, str, str]] = []
    rest = text.strip()
    while rest:
        match = _FILTER_TERM.match(rest)
        if match is None:
            raise FakeHttpError(
                400, "invalid", f"Invalid value for field 'filter': '{text}'. Invalid list filter expression."
            )
        value = match[3]
        if value.startswith('"'):
            value = json.loads(value)
        terms.append((match[1], match[2], value))
        rest = rest[match.end() :].strip()
        if rest.upper().startswith("AND "):
            rest = rest[4:].strip()
        elif rest.upper().startswith("OR "):
            raise FakeHttpError(400, "invalid", "the fake supports only AND in list filters")
    return terms


def _matches(instance: dict[str, Any], term: tuple[str, str, str]) -> bool:
    path, op, value = term
    current: Any = instance
    for part in path.split("."):
        current = current.get(part) if isinstance(current, dict) else None
    if isinstance(current, bool):
        equal = str(current).lower() == value.lower()
    else:
        equal = current is not None and str(current) == value
    return equal if op == "=" else not equal


def _scheduling_out(scheduling: dict[str, Any]) -> dict[str, Any]:
    spot = scheduling.get("provisioningModel") == "SPOT"
    preemptible = bool(scheduling.get("preemptible", False))
    out: dict[str, Any] = {
        "onHostMaintenance": scheduling.get(
            "onHostMaintenance", "TERMINATE" if spot or preemptible else "MIGRATE"
        ),
        "automaticRestart": scheduling.get("automaticRestart", not (spot or preemptible)),
        "preemptible": preemptible,
        "provisioningModel": scheduling.get("provisioningModel", "STANDARD"),
    }
    if spot:
        out["instanceTerminationAction"] = scheduling.get("instanceTerminationAction", "STOP")
    return out


def _paged(out: dict[str, Any], items: list[Any], query: dict[str, str]) -> dict[str, Any]:
    """``out`` with the page of ``items`` that ``maxResults`` and ``pageToken`` ask for."""
    try:
        size = min(int(query.get("maxResults", "500")), 500)
        start = int(base64.urlsafe_b64decode(query["pageToken"]).decode()) if query.get("pageToken") else 0
    except (ValueError, UnicodeDecodeError) as exc:
        raise FakeHttpError(400, "invalid", f"Invalid value for pageToken or maxResults: {exc}") from exc
    if size < 0:
        raise FakeHttpError(400, "invalid", "Invalid value for field 'maxResults': must be >= 0")
    page = items[start : start + size]
    if page:
        out["items"] = page  # the real API omits an empty list
    if start + size < len(items):
        out["nextPageToken"] = base64.urlsafe_b64encode(str(start + size).encode()).decode()
    return out


def _timestamp() -> str:
    now = datetime.now(UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}-00:00"


def _fingerprint(rng: random.Random) -> str:
    return base64.b64encode(rng.getrandbits(64).to_bytes(8, "big")).decode()


class _Handler(BaseHTTPRequestHandler):
    owner: GceFake
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes; no 40 ms delayed-ACK stalls

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _serve(self, verb: str) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        body: dict[str, Any] | None = None
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        status: int
        payload: dict[str, Any]
        method = "unknown"
        try:
            if raw:
                parsed = json.loads(raw)
                body = parsed if isinstance(parsed, dict) else None
            status, payload, method = self.owner.handle(verb, parts.path, query, body)
        except ValueError as exc:
            err = FakeHttpError(400, "parseError", f"Invalid JSON payload received. {exc}")
            status, payload = err.code, err.body()
        self.owner.record(method, parts.path, query, status)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_PATCH(self) -> None:
        self._serve("PATCH")


@contextlib.contextmanager
def running_gce_fake(**kwargs: Any) -> Iterator[GceFake]:
    """``with running_gce_fake(project=...) as fake:`` - a started fake, stopped on exit."""
    fake = GceFake(**kwargs).start()
    try:
        yield fake
    finally:
        fake.stop()
