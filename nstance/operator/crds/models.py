"""Typed models of the Nstance custom resources: the single source of truth for their schemas.

Responsible for: pydantic v2 models of every Nstance kind (spec, status, conditions) with the exact
camelCase JSON names of upstream Nstance (reference §5.4), the validation rules those fields carry
(identifiers, int32 ranges, at least one shard), and converting between Kubernetes objects (plain dicts
as the API returns them) and typed models with error messages that name the object and the field.
The CRD schemas in ``schema.py`` and the YAML in ``config/`` are generated from these classes.

Must not: talk to Kubernetes, import kopf, kubernetes_asyncio, grpc or nstance.rpc, or decide anything
about reconciliation; these are data shapes only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from nstance.core.ids import IDENTIFIER_MAX_LEN, identifier_problem
from nstance.operator.crds.names import (
    API_VERSION,
    KIND_CLUSTER,
    KIND_MACHINE,
    KIND_MACHINE_POOL,
    KIND_MACHINE_TEMPLATE,
    KIND_SHARD_GROUP,
)

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# The identifier rule of nstance.core.ids (lowercase alphanumerics separated by single dashes, no
# leading/trailing dash, no "--") written without look-arounds so the API server's regex engine takes it.
IDENTIFIER_PATTERN = r"^[a-z0-9]+(-[a-z0-9]+)*$"


def _identifier(value: str) -> str:
    problem = identifier_problem(value)
    if problem is not None:
        raise ValueError(f"{value!r} is not a valid Nstance identifier: {problem}")
    return value


Identifier = Annotated[
    str,
    AfterValidator(_identifier),
    Field(json_schema_extra={"pattern": IDENTIFIER_PATTERN, "minLength": 1, "maxLength": IDENTIFIER_MAX_LEN}),
]
"""A cluster, shard, group or subnet-pool name (``^[a-z0-9]+(-[a-z0-9]+)*$``, at most 32 characters)."""

_INT32_FORMAT: dict[str, Any] = {"format": "int32"}
_INT64_FORMAT: dict[str, Any] = {"format": "int64"}

Int32 = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX, json_schema_extra=_INT32_FORMAT)]
"""A Kubernetes int32 (Go ``int32``)."""

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX, json_schema_extra=_INT64_FORMAT)]
"""A Kubernetes int64 (Go ``int64``), e.g. a generation."""

NonNegativeInt32 = Annotated[int, Field(ge=0, le=INT32_MAX, json_schema_extra=_INT32_FORMAT)]
"""An int32 that is never negative (sizes, replica counts)."""

NonNegativeInt64 = Annotated[int, Field(ge=0, le=INT64_MAX, json_schema_extra=_INT64_FORMAT)]
"""An int64 that is never negative (generations)."""

Port = Annotated[int, Field(ge=1, le=65535, json_schema_extra=_INT32_FORMAT)]
"""A TCP port from 1 to 65535 (an int32 on the wire)."""

Vars = dict[str, str]

# Kubernetes list semantics for server-side apply, attached to list fields.
_ATOMIC_LIST: dict[str, Any] = {"x-kubernetes-list-type": "atomic"}
_SET_LIST: dict[str, Any] = {"x-kubernetes-list-type": "set"}
_CONDITIONS_LIST: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}


class InvalidResource(ValueError):
    """A Kubernetes object does not match its Nstance model; the message names the object and fields."""


class KubeModel(BaseModel):
    """Base of every model here: camelCase JSON names, Python names accepted too, unknown keys ignored.

    Unknown keys are ignored (not rejected) so that an operator reading objects written by a newer
    version keeps working; the API server prunes fields its schema does not know anyway.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        use_attribute_docstrings=True,
        validate_assignment=True,
    )

    def to_k8s(self) -> dict[str, Any]:
        """The object as the Kubernetes API wants it: camelCase keys, JSON types, unset fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# --- Shared pieces -------------------------------------------------------------------------------------


class Condition(KubeModel):
    """The observed state of one aspect of an object (Kubernetes metav1.Condition)."""

    type: str = Field(min_length=1, max_length=316)
    """Condition type in CamelCase: Ready, ShardReachable, ConfigValid, ServerDeleted, Draining."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds: True, False or Unknown."""
    reason: str | None = Field(default=None, max_length=1024)
    """Machine-readable CamelCase reason for the last transition (e.g. SyncSucceeded, ProviderError)."""
    message: str | None = Field(default=None, max_length=32768)
    """Human-readable details of the last transition."""
    last_transition_time: datetime
    """When the status last changed (RFC 3339)."""
    observed_generation: NonNegativeInt64 | None = None
    """The object's metadata.generation this condition was computed from."""


class OwnerReference(KubeModel):
    """A reference from an object to the object that owns it (Kubernetes metav1.OwnerReference)."""

    api_version: str
    """API version of the owner."""
    kind: str
    """Kind of the owner."""
    name: str
    """Name of the owner."""
    uid: str
    """UID of the owner."""
    controller: bool | None = None
    """True when the owner is the managing controller."""
    block_owner_deletion: bool | None = None
    """True when the owner cannot be deleted from storage before this object is removed."""


class ObjectMeta(KubeModel):
    """The metadata fields the operator reads or writes; every other metadata key is kept as-is."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    """Object name, unique within its namespace."""
    generate_name: str | None = None
    """Prefix the server uses to generate a name when name is empty."""
    namespace: str | None = None
    """Namespace of the object."""
    uid: str | None = None
    """Server-assigned unique id."""
    resource_version: str | None = None
    """Opaque version for optimistic concurrency."""
    generation: int | None = None
    """Sequence number of the desired state (bumped on spec changes)."""
    creation_timestamp: datetime | None = None
    """When the object was created."""
    deletion_timestamp: datetime | None = None
    """When deletion was requested; set while finalizers run."""
    labels: dict[str, str] | None = None
    """Labels."""
    annotations: dict[str, str] | None = None
    """Annotations."""
    finalizers: list[str] | None = None
    """Finalizers that must be removed before the object is deleted."""
    owner_references: list[OwnerReference] | None = None
    """Owners of the object."""


class Resource(KubeModel):
    """A whole Kubernetes object of one Nstance kind."""

    KIND: ClassVar[str] = ""

    api_version: str = API_VERSION
    """API group and version."""
    kind: str = ""
    """Kind of the object."""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    """Standard object metadata."""

    @model_validator(mode="before")
    @classmethod
    def _check_kind(cls, data: Any) -> Any:
        """Fill in apiVersion/kind when missing; refuse an object of another kind or version."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        kind = data.setdefault("kind", cls.KIND)
        if kind != cls.KIND:
            raise ValueError(f"kind is {kind!r}, expected {cls.KIND!r}")
        api_version = data.get("apiVersion", data.get("api_version", API_VERSION))
        if api_version != API_VERSION:
            raise ValueError(f"apiVersion is {api_version!r}, expected {API_VERSION!r}")
        return data

    @classmethod
    def from_k8s(cls, obj: dict[str, Any]) -> Self:
        """Parse an object returned by the API; raise InvalidResource naming the object and each bad field."""
        try:
            return cls.model_validate(obj)
        except ValidationError as exc:
            raise InvalidResource(describe_validation_error(cls.KIND, obj, exc)) from exc


def describe_validation_error(kind: str, obj: dict[str, Any], exc: ValidationError) -> str:
    """One message naming the object (``Kind namespace/name``) and every bad field by its JSON path."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name", "<unnamed>") if isinstance(meta, dict) else "<unnamed>"
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    who = f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"
    problems = []
    for error in exc.errors(include_url=False):
        path = ".".join(str(part) for part in error["loc"]) or "<object>"
        problems.append(f"{path}: {error['msg']}")
    return f"{who} is invalid: " + "; ".join(problems)


# --- NstanceCluster ------------------------------------------------------------------------------------


class APIEndpoint(KubeModel):
    """Where the workload cluster's API server listens."""

    host: str
    """Host name or IP address of the API server."""
    port: Port
    """TCP port of the API server."""


class NstanceClusterSpec(KubeModel):
    """Desired state of an NstanceCluster (a stub satisfying the Cluster API infrastructure contract)."""

    control_plane_endpoint: APIEndpoint | None = None
    """Endpoint of the workload cluster's API server."""


class ClusterInitialization(KubeModel):
    """Cluster API contract: provisioning progress of the infrastructure cluster."""

    provisioned: bool | None = None
    """True once the infrastructure is ready (Nstance sets it immediately)."""


class NstanceClusterStatus(KubeModel):
    """Observed state of an NstanceCluster."""

    initialization: ClusterInitialization | None = None
    """Cluster API initialization status."""
    conditions: list[Condition] | None = Field(default=None, json_schema_extra=_CONDITIONS_LIST)
    """Conditions; Ready is always True once reconciled."""


class NstanceCluster(Resource):
    """Infrastructure cluster for Cluster API; Nstance manages infrastructure per pool and machine."""

    KIND: ClassVar[str] = KIND_CLUSTER

    spec: NstanceClusterSpec = Field(default_factory=NstanceClusterSpec)
    """Desired state."""
    status: NstanceClusterStatus | None = None
    """Observed state."""


# --- NstanceMachinePool --------------------------------------------------------------------------------


class NstanceMachinePoolSpec(KubeModel):
    """Desired state of an NstanceMachinePool: an Nstance group spread over shards.

    The size is not here: it is the owning Cluster API MachinePool's spec.replicas (same name and
    namespace), distributed over the listed shards.
    """

    group: Identifier
    """Name of the Nstance group (as in the server's config or groups file)."""
    shards: list[Identifier] = Field(min_length=1, json_schema_extra=_SET_LIST)
    """Shards the group is spread across; one NstanceShardGroup is kept per shard."""
    template: str | None = None
    """Template for a new dynamic group; must not be set for a static group."""
    instance_type: str | None = None
    """Instance type override (must be allowed by the group)."""
    subnet_pool: Identifier | None = None
    """Subnet pool for a new dynamic group; template default when unset; not for static groups."""
    vars: Vars | None = None
    """Variables merged over the template's vars (for node labels and the like)."""
    provider_id_list: list[str] | None = Field(
        default=None, alias="providerIDList", json_schema_extra=_ATOMIC_LIST
    )
    """Cluster API contract: provider IDs of the pool's instances."""


class NstanceMachinePoolStatus(KubeModel):
    """Observed state of an NstanceMachinePool, aggregated from its NstanceShardGroups."""

    ready: bool | None = None
    """True when every shard group is Ready."""
    replicas: NonNegativeInt32 | None = None
    """Instances running across all shards."""
    is_static: bool | None = None
    """True when any shard backs the group with static server config (restricted editing)."""
    template: str | None = None
    """Template the servers actually use for the group."""
    subnet_pool: str | None = None
    """Subnet pool the servers actually use for the group."""
    observed_generation: NonNegativeInt64 | None = None
    """metadata.generation last reconciled."""
    observed_owner_generation: NonNegativeInt64 | None = None
    """Generation of the owning MachinePool last reconciled."""
    conditions: list[Condition] | None = Field(default=None, json_schema_extra=_CONDITIONS_LIST)
    """Conditions; Ready with reasons Invalid, DuplicateGroup, Reconciling, Reconciled."""


class NstanceMachinePool(Resource):
    """Cluster API infrastructure machine pool backed by one Nstance group on one or more shards."""

    KIND: ClassVar[str] = KIND_MACHINE_POOL

    spec: NstanceMachinePoolSpec
    """Desired state."""
    status: NstanceMachinePoolStatus | None = None
    """Observed state."""


# --- NstanceShardGroup ---------------------------------------------------------------------------------


class NstanceShardGroupSpec(KubeModel):
    """Desired state of one group on one shard (written by the NstanceMachinePool controller)."""

    group: Identifier
    """Name of the Nstance group."""
    shard: Identifier
    """Shard this object configures."""
    size: NonNegativeInt32
    """Desired instance count on this shard (the pool's share of the MachinePool replicas)."""
    template: str | None = None
    """Template name (copied from the NstanceMachinePool)."""
    instance_type: str | None = None
    """Instance type override (copied from the NstanceMachinePool)."""
    subnet_pool: Identifier | None = None
    """Subnet pool (copied from the NstanceMachinePool)."""
    vars: Vars | None = None
    """Variables (copied from the NstanceMachinePool)."""


class ShardGroupConfig(KubeModel):
    """The group configuration the shard server reports after merging static and dynamic config."""

    template: str | None = None
    """Template in use."""
    subnet_pool: str | None = None
    """Subnet pool in use."""
    instance_type: str | None = None
    """Instance type in use."""
    vars: Vars | None = None
    """Merged variables in use."""


class NstanceShardGroupStatus(KubeModel):
    """Observed state of one group on one shard."""

    observed_generation: NonNegativeInt64 | None = None
    """metadata.generation last applied to the shard."""
    replicas: NonNegativeInt32 | None = None
    """Instances the shard reports for the group."""
    provider_ids: list[str] | None = Field(default=None, alias="providerIDs", json_schema_extra=_ATOMIC_LIST)
    """Provider IDs of the group's instances on this shard, sorted."""
    is_static: bool | None = None
    """True when the shard's server config defines this group (restricted editing)."""
    config: ShardGroupConfig | None = None
    """Configuration the shard reports for the group."""
    last_sync_time: datetime | None = None
    """When this status was last synced from the shard."""
    conditions: list[Condition] | None = Field(default=None, json_schema_extra=_CONDITIONS_LIST)
    """Conditions: Ready, ShardReachable, ConfigValid."""


class NstanceShardGroup(Resource):
    """One Nstance group on one shard, named {group}--{shard} and owned by its NstanceMachinePool."""

    KIND: ClassVar[str] = KIND_SHARD_GROUP

    spec: NstanceShardGroupSpec
    """Desired state."""
    status: NstanceShardGroupStatus | None = None
    """Observed state."""


# --- NstanceMachine and NstanceMachineTemplate ---------------------------------------------------------


class NstanceMachineSpec(KubeModel):
    """Desired state of one (on-demand) instance."""

    group: Identifier
    """Nstance group the instance is created in."""
    instance_type: str | None = None
    """Instance type override (must be allowed by the group)."""
    vars: Vars | None = None
    """Variables merged over the group's vars."""
    provider_id: str | None = Field(default=None, alias="providerID")
    """Cluster API contract: provider ID of the instance once known."""


class MachineAddress(KubeModel):
    """One address of a machine (Cluster API MachineAddress)."""

    type: Literal["Hostname", "ExternalIP", "InternalIP", "ExternalDNS", "InternalDNS"]
    """Kind of address."""
    address: str
    """The address."""


class NstanceMachineStatus(KubeModel):
    """Observed state of one instance."""

    instance_id: str | None = Field(default=None, alias="instanceID")
    """Nstance instance ID (server-generated)."""
    shard: str | None = None
    """Shard that owns the instance."""
    provider_id: str | None = Field(default=None, alias="providerID")
    """Cloud provider's ID of the instance."""
    ready: bool | None = None
    """True when the instance is running."""
    addresses: list[MachineAddress] | None = Field(default=None, json_schema_extra=_ATOMIC_LIST)
    """Addresses of the instance."""
    conditions: list[Condition] | None = Field(default=None, json_schema_extra=_CONDITIONS_LIST)
    """Conditions, including ServerDeleted once the server removed the instance."""


class NstanceMachine(Resource):
    """Cluster API infrastructure machine: one Nstance instance (used for on-demand capacity)."""

    KIND: ClassVar[str] = KIND_MACHINE

    spec: NstanceMachineSpec
    """Desired state."""
    status: NstanceMachineStatus | None = None
    """Observed state."""


class NstanceMachineTemplateResource(KubeModel):
    """What Cluster API stamps into each new NstanceMachine."""

    spec: NstanceMachineSpec
    """Spec of the NstanceMachines created from this template."""


class NstanceMachineTemplateSpec(KubeModel):
    """Desired state of an NstanceMachineTemplate."""

    template: NstanceMachineTemplateResource
    """The machine template."""


class NstanceMachineTemplate(Resource):
    """Cluster API infrastructure machine template (immutable by convention) for NstanceMachines."""

    KIND: ClassVar[str] = KIND_MACHINE_TEMPLATE

    spec: NstanceMachineTemplateSpec
    """Desired state."""


RESOURCE_MODELS: tuple[type[Resource], ...] = (
    NstanceCluster,
    NstanceMachinePool,
    NstanceShardGroup,
    NstanceMachine,
    NstanceMachineTemplate,
)
"""Every Nstance kind's model, in the order the CRDs are listed."""
