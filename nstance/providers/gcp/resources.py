"""Turning a CreateRequest into a GCE ``Instance`` body: args, scheduling, subnetwork paths, arch check.

Template ``args`` (merged defaults -> template -> group) use the upstream names of the Compute
``Instance`` fields Nstance lets users set (see docs/provider-gcp.md for the reference):
``SourceImage``, ``DiskSizeGb``, ``DiskType``, ``ServiceAccount``, ``Scopes``, ``Labels``,
``NetworkTags``, ``Network``, ``ExternalIP``, ``Preemptible``, ``ProvisioningModel``,
``InstanceTerminationAction``, ``OnHostMaintenance``, ``AutomaticRestart``, ``MinCpuPlatform``,
``Metadata``, ``ShieldedInstanceConfig``, ``ConfidentialCompute``, ``GuestAccelerators``,
``ResourcePolicies``, ``CanIpForward``. Nstance owns the name, machine type, subnetwork, the
``user-data`` metadata item and the ``nstance-*`` labels. Unknown keys and wrong types are refused
with the config path (``templates.<template>.args.<Key>``).

Also here: resource references (a bare name, ``regions/R/subnetworks/N`` or ``zones/Z/...``, a
``projects/...`` path or a full URL) to the path GCE wants (``scoped_path``, ``subnetwork_path``,
``zonal_ref`` for the NEGs and instance groups of load balancers), and
the architecture of a machine type (its ``architecture`` field when the API reports one, else the
family: ``t2a``, ``c4a``, ``n4a`` and ``a4x`` are Arm) checked against a template's ``arch``.
Pure functions on SDK message types; no API calls.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.cloud import compute_v1

from nstance.providers.base import CreateRequest, ProviderInvalidRequest
from nstance.providers.gcp.labels import merge_labels

ARG_KEYS: tuple[str, ...] = (
    "SourceImage",
    "DiskSizeGb",
    "DiskType",
    "ServiceAccount",
    "Scopes",
    "Labels",
    "NetworkTags",
    "Network",
    "ExternalIP",
    "Preemptible",
    "ProvisioningModel",
    "InstanceTerminationAction",
    "OnHostMaintenance",
    "AutomaticRestart",
    "MinCpuPlatform",
    "Metadata",
    "ShieldedInstanceConfig",
    "ConfidentialCompute",
    "GuestAccelerators",
    "ResourcePolicies",
    "CanIpForward",
)
DEFAULT_SCOPES: tuple[str, ...] = ("https://www.googleapis.com/auth/cloud-platform",)
USERDATA_KEY = "user-data"
MAX_METADATA_VALUE = 256 * 1024
ARM_FAMILIES: frozenset[str] = frozenset({"t2a", "c4a", "n4a", "a4x"})
_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
_URL_PREFIXES = ("https://www.googleapis.com/compute/v1/", "https://compute.googleapis.com/compute/v1/")
_GCE_ARCH = {"X86_64": "amd64", "ARM64": "arm64"}


def args_path(request: CreateRequest) -> str:
    """Where the user wrote this request's args (the merged template args)."""
    return f"templates.{request.template}.args"


def check_instance_name(name: str) -> None:
    """GCE instance names are RFC 1035 labels; Nstance uses the instance id as the name."""
    if not _NAME.match(name):
        raise ProviderInvalidRequest(
            f"gcp: instance id {name!r} cannot be a GCE instance name (lowercase letter first, then "
            "lowercase letters, digits and '-', at most 63 characters)"
        )


def strip_api_url(ref: str) -> str:
    """A resource reference without a leading ``https://.../compute/v1/`` API URL."""
    ref = ref.strip()
    for prefix in _URL_PREFIXES:
        if ref.startswith(prefix):
            return ref[len(prefix) :]
    return ref


def scoped_path(ref: str, *, project: str, scope: str, location: str, collection: str) -> str:
    """``projects/P/{scope}/L/{collection}/N`` of a reference, or ``""`` when it is not one.

    A reference is a bare name (in ``project`` and ``location``), ``{scope}/L/{collection}/N``,
    ``projects/P/{scope}/L/{collection}/N`` or that path as a full API URL.
    """
    parts = strip_api_url(ref).split("/")
    if not all(parts):
        return ""
    if len(parts) == 1:
        path = f"projects/{project}/{scope}/{location}/{collection}/{parts[0]}"
    elif len(parts) == 4 and parts[0] == scope and parts[2] == collection:
        path = f"projects/{project}/{'/'.join(parts)}"
    elif len(parts) == 6 and parts[0] == "projects" and parts[2] == scope and parts[4] == collection:
        path = "/".join(parts)
    else:
        return ""
    return path if _NAME.match(path.rsplit("/", 1)[-1]) else ""


@dataclass(frozen=True, slots=True)
class ZonalRef:
    """A zonal resource a ``load_balancers`` entry names (a NEG, an instance group), and where."""

    project: str
    zone: str
    collection: str  # "networkEndpointGroups", "instanceGroups"
    name: str
    where: str  # config path, for error messages

    @property
    def path(self) -> str:
        return f"projects/{self.project}/zones/{self.zone}/{self.collection}/{self.name}"


def zonal_ref(
    ref: str, *, where: str, project: str, zone: str, collection: str, noun: str, holder: str
) -> ZonalRef:
    """The ``collection`` resource ``ref`` names, which must be in ``zone`` (its members are VMs of it).

    ``noun`` names the kind in errors ("network endpoint group"); ``holder`` says why the zone must
    match ("a zonal NEG holds only VMs of its own zone").
    """
    path = scoped_path(ref, project=project, scope="zones", location=zone, collection=collection)
    if not path:
        raise ProviderInvalidRequest(
            f"{where}: {ref!r} is not a zonal {noun}; use its name (in zone {zone}), "
            f"zones/ZONE/{collection}/NAME, projects/PROJECT/zones/ZONE/{collection}/NAME or its URL"
        )
    parts = path.split("/")
    if parts[3] != zone:
        raise ProviderInvalidRequest(
            f"{where}: {noun} {path} is in zone {parts[3]}, but this shard's VMs are in zone {zone}; "
            f"{holder}, so name the {noun} of zone {zone}"
        )
    return ZonalRef(project=parts[1], zone=parts[3], collection=collection, name=parts[5], where=where)


def subnetwork_path(subnet_id: str, *, project: str, region: str) -> str:
    """The ``projects/P/regions/R/subnetworks/N`` path of a configured subnet reference."""
    path = scoped_path(subnet_id, project=project, scope="regions", location=region, collection="subnetworks")
    if not path:
        raise ProviderInvalidRequest(
            f"shard.subnet_pools: {subnet_id!r} is not a GCE subnetwork; use its name (in region {region}), "
            "regions/REGION/subnetworks/NAME or projects/PROJECT/regions/REGION/subnetworks/NAME"
        )
    return path


def short_subnet(link: str, *, project: str, region: str) -> str:
    """A VM's subnetwork URL as configured most often: the bare name when in this project and region."""
    path = strip_api_url(link)
    if path.startswith(f"projects/{project}/regions/{region}/subnetworks/"):
        return path.rsplit("/", 1)[-1]
    return path


def machine_type_arch(machine_type: compute_v1.MachineType) -> str:
    """``amd64`` or ``arm64`` for a machine type (the API's ``architecture``, else its family)."""
    reported = _GCE_ARCH.get(machine_type.architecture or "")
    if reported:
        return reported
    family = machine_type.name.split("-", 1)[0]
    return "arm64" if family in ARM_FAMILIES else "amd64"


def check_arch(
    machine_type: compute_v1.MachineType, arch: str, *, template: str, where: str, zone: str
) -> None:
    """Refuse a machine type whose CPU architecture is not ``arch`` (template ``template``'s).

    ``where`` is the config path of the instance type (``groups.T.G.instance_type``, ...).
    """
    actual = machine_type_arch(machine_type)
    wanted = (arch or "amd64").lower()
    if actual != wanted:
        example = (
            "t2a-standard-4 or c4a-standard-4" if wanted == "arm64" else "n2-standard-4 or e2-standard-4"
        )
        raise ProviderInvalidRequest(
            f"{where}: machine type {machine_type.name!r} in zone {zone} is {actual}, but template "
            f"{template!r} has arch {wanted!r} (templates.{template}.arch); choose a {wanted} machine type "
            f"such as {example}"
        )


def userdata_metadata(userdata: bytes, *, path: str) -> list[compute_v1.Items]:
    """The ``user-data`` metadata item (base64 with ``user-data-encoding`` when not UTF-8)."""
    try:
        items = [compute_v1.Items(key=USERDATA_KEY, value=userdata.decode("utf-8"))]
    except UnicodeDecodeError:
        items = [
            compute_v1.Items(key=USERDATA_KEY, value=base64.b64encode(userdata).decode("ascii")),
            compute_v1.Items(key="user-data-encoding", value="base64"),
        ]
    if len(items[0].value) > MAX_METADATA_VALUE:
        raise ProviderInvalidRequest(
            f"{path}: the rendered userdata is {len(items[0].value)} bytes as GCE metadata, more than the "
            f"{MAX_METADATA_VALUE} a metadata value may hold; fetch large files with template files instead"
        )
    return items


def build_instance(request: CreateRequest, *, project: str, zone: str) -> compute_v1.Instance:
    """The Instance body for ``instances.insert``; refuses bad args naming their config path."""
    path = args_path(request)
    args = _Args(request.args, path)
    region = zone.rsplit("-", 1)[0]
    check_instance_name(request.instance_id)

    disk_type = args.string("DiskType")
    source_image = args.string("SourceImage")
    if not source_image:
        raise ProviderInvalidRequest(
            f"{path}.SourceImage: required for gcp (for example projects/debian-cloud/global/images/family/"
            "debian-12); set it in the template's args or defaults.args"
        )
    init = compute_v1.AttachedDiskInitializeParams(source_image=source_image)
    size = args.integer("DiskSizeGb", minimum=1)
    if size is not None:
        init.disk_size_gb = size
    if disk_type:
        init.disk_type = disk_type if "/" in disk_type else f"zones/{zone}/diskTypes/{disk_type}"
    boot = compute_v1.AttachedDisk(boot=True, auto_delete=True, type_="PERSISTENT", initialize_params=init)

    nic = compute_v1.NetworkInterface()
    if request.subnet_id:  # no subnet pool: the network's (or the default network's) subnet of the region
        nic.subnetwork = subnetwork_path(request.subnet_id, project=project, region=region)
    network = args.string("Network")
    if network:
        nic.network = network if "/" in network else f"projects/{project}/global/networks/{network}"
    if args.boolean("ExternalIP"):
        nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]

    metadata_items = userdata_metadata(request.userdata, path=f"templates.{request.template}.userdata")
    for key, value in args.string_map("Metadata").items():
        if key in (USERDATA_KEY, "user-data-encoding"):
            raise ProviderInvalidRequest(
                f"{path}.Metadata.{key}: Nstance writes the rendered userdata here; set the template's "
                "userdata instead"
            )
        metadata_items.append(compute_v1.Items(key=key, value=value))

    instance = compute_v1.Instance(
        name=request.instance_id,
        machine_type=f"zones/{zone}/machineTypes/{request.instance_type}",
        disks=[boot],
        network_interfaces=[nic],
        metadata=compute_v1.Metadata(items=metadata_items),
        labels=merge_labels(request, args.string_map("Labels", allow_any=True), args_path=path),
        scheduling=_scheduling(request, args),
    )
    tags = args.string_list("NetworkTags")
    if tags:
        instance.tags = compute_v1.Tags(items=tags)
    account = args.string("ServiceAccount")
    scopes = args.string_list("Scopes")
    if account:
        instance.service_accounts = [
            compute_v1.ServiceAccount(email=account, scopes=scopes or list(DEFAULT_SCOPES))
        ]
    elif scopes:
        raise ProviderInvalidRequest(
            f"{path}.Scopes: needs {path}.ServiceAccount (the account they apply to)"
        )
    min_cpu = args.string("MinCpuPlatform")
    if min_cpu:
        instance.min_cpu_platform = min_cpu
    shielded = args.bool_map(
        "ShieldedInstanceConfig", ("EnableSecureBoot", "EnableVtpm", "EnableIntegrityMonitoring")
    )
    if shielded:
        instance.shielded_instance_config = compute_v1.ShieldedInstanceConfig(
            enable_secure_boot=shielded.get("EnableSecureBoot", False),
            enable_vtpm=shielded.get("EnableVtpm", False),
            enable_integrity_monitoring=shielded.get("EnableIntegrityMonitoring", False),
        )
    if args.boolean("ConfidentialCompute"):
        instance.confidential_instance_config = compute_v1.ConfidentialInstanceConfig(
            enable_confidential_compute=True
        )
    accelerators = args.accelerators(zone)
    if accelerators:
        instance.guest_accelerators = accelerators
    policies = args.string_list("ResourcePolicies")
    if policies:
        instance.resource_policies = policies
    if args.boolean("CanIpForward"):
        instance.can_ip_forward = True
    return instance


def _scheduling(request: CreateRequest, args: _Args) -> compute_v1.Scheduling:
    """Spot (``request.spot`` or ``ProvisioningModel: SPOT``) and legacy preemptible scheduling."""
    path = args.path
    model = (args.string("ProvisioningModel") or ("SPOT" if request.spot else "STANDARD")).upper()
    if model not in ("SPOT", "STANDARD"):
        raise ProviderInvalidRequest(f"{path}.ProvisioningModel: must be SPOT or STANDARD (got {model!r})")
    if request.spot and model != "SPOT":
        raise ProviderInvalidRequest(
            f"{path}.ProvisioningModel: is STANDARD but this instance was requested as spot; remove the arg"
        )
    preemptible = bool(args.boolean("Preemptible"))
    interruptible = model == "SPOT" or preemptible
    restart = args.boolean("AutomaticRestart")
    maintenance = (args.string("OnHostMaintenance") or ("TERMINATE" if interruptible else "MIGRATE")).upper()
    if maintenance not in ("MIGRATE", "TERMINATE"):
        raise ProviderInvalidRequest(
            f"{path}.OnHostMaintenance: must be MIGRATE or TERMINATE (got {maintenance!r})"
        )
    if interruptible and restart:
        raise ProviderInvalidRequest(
            f"{path}.AutomaticRestart: spot and preemptible VMs cannot restart automatically; remove it "
            "or set it to false"
        )
    if interruptible and maintenance != "TERMINATE":
        raise ProviderInvalidRequest(
            f"{path}.OnHostMaintenance: spot and preemptible VMs must use TERMINATE (got {maintenance})"
        )
    scheduling = compute_v1.Scheduling(
        provisioning_model=model,
        preemptible=preemptible,
        automatic_restart=(not interruptible) if restart is None else restart,
        on_host_maintenance=maintenance,
    )
    action = args.string("InstanceTerminationAction")
    if model == "SPOT":
        action = (action or "DELETE").upper()
        if action not in ("DELETE", "STOP"):
            raise ProviderInvalidRequest(
                f"{path}.InstanceTerminationAction: must be DELETE or STOP (got {action!r})"
            )
        scheduling.instance_termination_action = action
    elif action:
        raise ProviderInvalidRequest(f"{path}.InstanceTerminationAction: applies only to spot VMs")
    return scheduling


class _Args:
    """Typed, path-reporting access to the merged args mapping."""

    def __init__(self, args: Mapping[str, Any], path: str) -> None:
        self.path = path
        unknown = sorted(set(args) - set(ARG_KEYS))
        if unknown:
            raise ProviderInvalidRequest(
                f"{path}.{unknown[0]}: not a gcp arg; allowed: {', '.join(ARG_KEYS)} "
                "(see docs/provider-gcp.md)"
            )
        self._args = args

    def string(self, key: str) -> str:
        value = self._args.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise ProviderInvalidRequest(f"{self.path}.{key}: must be a string (got {value!r})")
        return value

    def boolean(self, key: str) -> bool | None:
        value = self._args.get(key)
        if value is None or isinstance(value, bool):
            return value
        raise ProviderInvalidRequest(f"{self.path}.{key}: must be true or false (got {value!r})")

    def integer(self, key: str, *, minimum: int) -> int | None:
        value = self._args.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ProviderInvalidRequest(
                f"{self.path}.{key}: must be a whole number >= {minimum} (got {value!r})"
            )
        return value

    def string_list(self, key: str) -> list[str]:
        value = self._args.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ProviderInvalidRequest(f"{self.path}.{key}: must be a list of strings (got {value!r})")
        return list(value)

    def string_map(self, key: str, *, allow_any: bool = False) -> dict[str, Any]:
        value = self._args.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise ProviderInvalidRequest(f"{self.path}.{key}: must be an object (got {value!r})")
        if not allow_any:
            for k, v in value.items():
                if not isinstance(v, str):
                    raise ProviderInvalidRequest(f"{self.path}.{key}.{k}: must be a string (got {v!r})")
        return dict(value)

    def bool_map(self, key: str, allowed: tuple[str, ...]) -> dict[str, bool]:
        value = self.string_map(key, allow_any=True)
        for k, v in value.items():
            if k not in allowed:
                raise ProviderInvalidRequest(
                    f"{self.path}.{key}.{k}: unknown key; allowed: {', '.join(allowed)}"
                )
            if not isinstance(v, bool):
                raise ProviderInvalidRequest(f"{self.path}.{key}.{k}: must be true or false (got {v!r})")
        return value

    def accelerators(self, zone: str) -> list[compute_v1.AcceleratorConfig]:
        value = self._args.get("GuestAccelerators")
        if value is None:
            return []
        path = f"{self.path}.GuestAccelerators"
        if not isinstance(value, list):
            raise ProviderInvalidRequest(f"{path}: must be a list of {{AcceleratorType, AcceleratorCount}}")
        out: list[compute_v1.AcceleratorConfig] = []
        for index, item in enumerate(value):
            kind = item.get("AcceleratorType") if isinstance(item, Mapping) else None
            count = item.get("AcceleratorCount", 1) if isinstance(item, Mapping) else None
            if not isinstance(kind, str) or not kind or isinstance(count, bool) or not isinstance(count, int):
                raise ProviderInvalidRequest(
                    f"{path}[{index}]: needs AcceleratorType (string) and AcceleratorCount (whole number)"
                )
            full = kind if "/" in kind else f"zones/{zone}/acceleratorTypes/{kind}"
            out.append(compute_v1.AcceleratorConfig(accelerator_type=full, accelerator_count=count))
        return out
