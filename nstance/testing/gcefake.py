"""A small local fake of the Google Compute Engine REST API (``compute/v1``), for provider tests.

It answers the calls the ``gcp`` provider makes, shaped the way the real API shapes them, so that the
real ``google-cloud-compute`` client (REST transport) parses them: ``instances`` insert, get (by name
or numeric id), list (``filter``, ``maxResults``, ``pageToken``) and delete; zone ``operations`` get
and wait, with **numeric-string** ``id`` fields (a hex id makes the client fail to parse); machine
types get (with ``architecture``); regional subnetworks get. Errors use Google's JSON error body
(``{"error": {"code", "message", "errors": [{"domain", "reason", "message"}]}}``) with the real HTTP
codes: 404 ``notFound``, 409 ``alreadyExists``, 400 ``invalid``, 429 ``rateLimitExceeded``, 503
``backendError``. Validation follows the real service where the provider depends on it: instance names
(RFC 1035), label keys and values, a boot disk, known machine types and subnetworks, and spot /
preemptible scheduling that cannot restart automatically. A repeated ``requestId`` returns the first
request's operation (what makes inserts idempotent).

Operations start ``RUNNING``; ``wait`` finishes them at once (the real ``wait`` blocks up to two
minutes), while ``get`` finishes them after ``operation_polls`` polls. A finished insert makes the
instance ``RUNNING``; a finished delete removes it. Tests inject faults: ``inject_error`` (an HTTP
error on the next calls of one method), ``hide_after_insert`` (a freshly inserted VM answers 404 to
``get`` a few times - eventual consistency), ``fail_next_operation`` (an operation that ends with an
``error`` such as ``ZONE_RESOURCE_POOL_EXHAUSTED``) and ``set_status``.

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
from collections.abc import Iterator
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
    r"/(?P<collection>instances|operations|machineTypes|subnetworks)(?:/(?P<name>[^/]+))?(?:/(?P<verb>wait))?$"
)
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
    on_done: str  # "insert" or "delete"
    target: str  # instance name
    zone: str
    error: dict[str, Any] | None = None


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
        """The next ``method`` (``insert`` or ``delete``) operation ends DONE with this error."""
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
        try:
            size = min(int(query.get("maxResults", "500")), 500)
            start = (
                int(base64.urlsafe_b64decode(query["pageToken"]).decode()) if query.get("pageToken") else 0
            )
        except (ValueError, UnicodeDecodeError) as exc:
            raise FakeHttpError(400, "invalid", f"Invalid value for pageToken or maxResults: {exc}") from exc
        if size < 0:
            raise FakeHttpError(400, "invalid", "Invalid value for field 'maxResults': must be >= 0")
        page = items[start : start + size]
        out: dict[str, Any] = {
            "kind": "compute#instanceList",
            "id": f"projects/{self._state.project}/zones/{zone}/instances",
            "items": page,
            "selfLink": f"{SELF_LINK_ROOT}projects/{self._state.project}/zones/{zone}/instances",
        }
        if start + size < len(items):
            out["nextPageToken"] = base64.urlsafe_b64encode(str(start + size).encode()).decode()
        if not page:
            del out["items"]  # the real API omits an empty list
        return out

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
            out.append(
                {
                    "kind": "compute#networkInterface",
                    "network": network_link,
                    "subnetwork": subnet_link,
                    "networkIP": str(ip),
                    "name": f"nic{index}",
                    "fingerprint": _fingerprint(self._rng),
                    "stackType": "IPV4_ONLY",
                    "aliasIpRanges": list(nic.get("aliasIpRanges") or []),
                }
            )
        return out

    # ---- operations --------------------------------------------------------------------------

    def _new_operation(
        self, zone: str, kind: str, target: str, target_id: str, request_id: str
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
            "targetLink": self._link(zone, "instances", target),
            "targetId": target_id,
            "status": "RUNNING",
            "user": "fake@nstance.test",
            "progress": 0,
            "insertTime": now,
            "startTime": now,
            "selfLink": self._link(zone, "operations", name),
        }
        failures = self._state.op_failures.get(kind)
        error = None
        if failures:
            code, message = failures.pop(0)
            error = {"errors": [{"code": code, "message": message}]}
        self._state.operations[name] = _Operation(doc, self._operation_polls, kind, target, zone, error)
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
            elif op.target in instances:
                instances[op.target]["status"] = "RUNNING"
            return
        if op.on_done == "insert" and op.target in instances:
            instance = instances[op.target]
            instance["status"] = "RUNNING"
            arch = self._state.machine_types[op.zone][str(instance["machineType"]).rsplit("/", 1)[-1]][2]
            instance["cpuPlatform"] = "Ampere Altra" if arch == "ARM64" else "Intel Cascade Lake"
            instance["lastStartTimestamp"] = _timestamp()
        elif op.on_done == "delete":
            instances.pop(op.target, None)

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
    collection, name, wait = match["collection"], match["name"], match["verb"]
    if collection == "instances":
        if name is None:
            return {"POST": "instances.insert", "GET": "instances.list"}.get(verb, "unknown")
        return {"GET": "instances.get", "DELETE": "instances.delete"}.get(verb, "unknown")
    if collection == "operations" and name is not None:
        if wait:
            return "zoneOperations.wait" if verb == "POST" else "unknown"
        return "zoneOperations.get" if verb == "GET" else "unknown"
    if collection == "machineTypes" and name is not None and verb == "GET":
        return "machineTypes.get"
    if collection == "subnetworks" and name is not None and verb == "GET" and match["scope"] == "regions":
        return "subnetworks.get"
    return "unknown"


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


@contextlib.contextmanager
def running_gce_fake(**kwargs: Any) -> Iterator[GceFake]:
    """``with running_gce_fake(project=...) as fake:`` - a started fake, stopped on exit."""
    fake = GceFake(**kwargs).start()
    try:
        yield fake
    finally:
        fake.stop()
