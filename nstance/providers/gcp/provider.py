"""The ``gcp`` provider: Compute Engine VMs through ``google-cloud-compute`` (REST transport).

One provider serves one project and one zone (the shard's). A VM's GCE name is the Nstance instance
id and its ``nstance-*`` labels carry the rest of the metadata (see ``labels``); ``provider_id`` is
GCE's numeric instance id, so a VM recreated under the same name is told apart.

Besides the ``Provider`` protocol it has the optional capabilities of ``nstance.providers.features``
that GCE offers: ``LoadBalancing`` through zonal network endpoint groups (``loadbalancers``) or,
for upstream's v1 ``instance_group_name`` entries, an unmanaged instance group (``instancegroups``),
``LeaderNetworking`` with an alias IP range (``network``), ``OwnInstance`` from the metadata server
(``nstance.providers.metadata``) and ``InstanceTypeCheck`` (the machine type's architecture). It has
no ``ImageLookup``: GCE image families already resolve to the newest image at create time.

Calls and their failure handling (retries, error mapping and operation waits live in ``calls``):

* ``instances.insert`` carries ``requestId`` = UUIDv5 of the idempotency token, so a retried create
  (after a timeout, a crash, a 503) returns the first request's operation instead of launching again.
  If that operation names another instance, the token was reused: refused. If it already ended in an
  error (a stockout), the next request id is derived from the failed operation's name, so a retry can
  succeed while staying idempotent. A 409 ``alreadyExists`` returns the existing VM when its
  ``nstance-create-token`` label matches the token, and is refused otherwise.
* Operations are waited with ``zoneOperations.wait`` on this provider's own endpoint. ``op.result()``
  is never used: its internal operations client ignores ``client_options`` and would poll
  ``compute.googleapis.com`` even when the provider talks to another endpoint (a fake, a proxy).
* A 404 for a VM right after its insert finished is eventual consistency: ``get`` is retried with
  backoff, and if the VM stays invisible the create still returns it as ``pending``.
* 429 and 403 ``rateLimitExceeded`` are retried with ``Backoff`` (bounded attempts, then
  ``ProviderThrottled``); 500/502/503/504 and connection errors likewise (then ``ProviderUnavailable``).
* ``delete`` tolerates 404 and waits for its operation; ``list`` filters on the cluster and shard
  labels server-side and reads every page.
* The machine type is fetched (cached per provider) before a create so a type whose architecture is
  not the template's ``arch`` is refused with a clear error before anything is launched;
  ``check_instance_type`` runs the same check for config validation.

Every SDK call runs in a worker thread. This module must not decide whether to create or delete, and
must not call ``ExtendedOperation.result()``/``done()``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth import credentials as gauth_credentials
from google.auth import exceptions as gauth_exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from nstance.config.resources import LoadBalancerConfig
from nstance.config.shard import GOOGLE_PROJECT_KEYS, google_project
from nstance.core.backoff import Backoff
from nstance.core.clock import Clock
from nstance.core.errors import InvalidArgument
from nstance.providers import metadata
from nstance.providers import options as opt
from nstance.providers.base import (
    CreateRequest,
    InstanceNotFound,
    InstanceStatus,
    ProviderInstance,
    ProviderInvalidRequest,
    ProviderUnavailable,
)
from nstance.providers.features import LbTarget, TargetState
from nstance.providers.gcp import labels as lbl
from nstance.providers.gcp.calls import GceCalls, Sleep
from nstance.providers.gcp.instancegroups import InstanceGroupTargets
from nstance.providers.gcp.loadbalancers import DEFAULT_BATCH_SIZE, NegTargets
from nstance.providers.gcp.network import AliasLeaderNetwork
from nstance.providers.gcp.resources import build_instance, check_arch, short_subnet, subnetwork_path
from nstance.providers.gcp.status import map_status

OPTION_KEYS: tuple[str, ...] = (
    "project_id",
    "project",
    "endpoint",
    "credentials_file",
    "page_size",
    "max_attempts",
    "operation_timeout",
    "request_timeout",
)
#: Namespace of the UUIDv5 request ids derived from idempotency tokens.
REQUEST_ID_NAMESPACE = uuid.UUID("7b0c1f4e-2d7a-5e55-9a53-6e7374616e63")
_MAX_FAILED_CHAIN = 8


def request_id_for(token: str) -> str:
    """The ``requestId`` GCE deduplicates inserts by: a UUIDv5 of the idempotency token."""
    return str(uuid.uuid5(REQUEST_ID_NAMESPACE, token))


class GcpProvider:
    """Compute Engine VMs in one project and zone; see the module docstring."""

    def __init__(
        self,
        *,
        project: str,
        zone: str,
        clock: Clock,
        endpoint: str = "",
        credentials: gauth_credentials.Credentials | None = None,
        page_size: int = 500,
        max_attempts: int = 5,
        operation_timeout: float = 300.0,
        request_timeout: float = 30.0,
        not_found_retries: int = 5,
        backoff: Backoff | None = None,
        sleep: Sleep = asyncio.sleep,
        lb_batch_size: int = DEFAULT_BATCH_SIZE,  # VMs per NEG attach/detach or group add/remove call
    ) -> None:
        if not project or not zone:
            raise InvalidArgument("gcp: a project and a zone are required")
        self._project = project
        self._zone = zone
        self._region = zone.rsplit("-", 1)[0]
        self._clock = clock
        self._page_size = page_size
        self._request_timeout = request_timeout
        self._not_found_retries = not_found_retries
        self._backoff = backoff or Backoff(base=0.5, cap=20.0)
        self._sleep = sleep
        self._machine_types: dict[str, compute_v1.MachineType] = {}
        self._deleting: set[str] = set()
        options = ClientOptions(api_endpoint=endpoint) if endpoint else None
        kwargs: dict[str, Any] = {"client_options": options, "transport": "rest"}
        if credentials is not None:
            kwargs["credentials"] = credentials
        try:
            self._instances = compute_v1.InstancesClient(**kwargs)
            self._operations = compute_v1.ZoneOperationsClient(**kwargs)
            self._machine_type_client = compute_v1.MachineTypesClient(**kwargs)
            self._subnetworks = compute_v1.SubnetworksClient(**kwargs)
            self._neg_client = compute_v1.NetworkEndpointGroupsClient(**kwargs)
            self._rule_client = compute_v1.ForwardingRulesClient(**kwargs)
            self._group_client = compute_v1.InstanceGroupsClient(**kwargs)
        except gauth_exceptions.DefaultCredentialsError as exc:
            raise InvalidArgument(
                "shard.infra.options.credentials_file: no Google credentials found "
                f"({exc}); set credentials_file, GOOGLE_APPLICATION_CREDENTIALS, or run on GCE "
                "with a service account"
            ) from exc
        self._api = GceCalls(
            project=project,
            zone=zone,
            clock=clock,
            operations=self._operations,
            max_attempts=max_attempts,
            backoff=self._backoff,
            sleep=sleep,
            request_timeout=request_timeout,
            operation_timeout=operation_timeout,
        )
        self._negs = NegTargets(
            self._neg_client,
            self._api,
            instances=self._instances,
            forwarding_rules=self._rule_client,
            page_size=page_size,
            batch_size=lb_batch_size,
        )
        self._groups = InstanceGroupTargets(
            self._group_client, self._api, page_size=page_size, batch_size=lb_batch_size
        )
        self._leader = AliasLeaderNetwork(
            self._instances,
            self._api,
            lambda key: self._get("", key),
            credentials=credentials,
            page_size=page_size,
        )

    @property
    def kind(self) -> str:
        return "gcp"

    @property
    def project(self) -> str:
        return self._project

    @property
    def zone(self) -> str:
        return self._zone

    # ---- the Provider protocol -------------------------------------------------------------

    async def create_instance(self, request: CreateRequest) -> ProviderInstance:
        if not request.instance_type:
            raise ProviderInvalidRequest(
                f"templates.{request.template}.instance_type: required for gcp (a machine type such as "
                "e2-standard-2)"
            )
        await self.check_instance_type(
            request.instance_type,
            request.arch,
            template=request.template,
            where=f"groups.{request.tenant}.{request.group}.instance_type",
        )
        body = build_instance(request, project=self._project, zone=self._zone)
        token = request.idempotency_token or request.instance_id
        request_id = request_id_for(token)
        for _ in range(_MAX_FAILED_CHAIN):
            try:
                op = await self._api.call(
                    "instances.insert",
                    functools.partial(self._insert_blocking, body, request_id),
                )
            except gexc.Conflict:
                return await self._existing_for_retry(request)
            except gexc.NotFound as exc:
                raise ProviderInvalidRequest(
                    f"gcp: create {request.instance_id}: a resource it references does not exist: "
                    f"{exc.message}; check shard.subnet_pools and templates.{request.template}.args"
                ) from exc
            except gexc.GoogleAPICallError as exc:
                raise self._api.map_error(exc, f"create {request.instance_id}") from exc
            target = op.target_link.rsplit("/", 1)[-1]
            if target and target != request.instance_id:
                raise ProviderInvalidRequest(
                    f"gcp: idempotency token {request.idempotency_token!r} was already used to create "
                    f"instance {target}; a new instance needs a new token"
                )
            if self._api.is_done(op) and op.error.errors:
                # A replay of an insert that already failed: chain to a new, still-deterministic id.
                request_id = str(uuid.uuid5(REQUEST_ID_NAMESPACE, f"{token}:{op.name}"))
                continue
            done = await self._api.wait(op, f"create {request.instance_id}")
            self._api.raise_op_error(done, f"create {request.instance_id}")
            return await self._fetch_new(request, str(done.target_id or op.target_id))
        raise ProviderUnavailable(
            f"gcp: create {request.instance_id}: {_MAX_FAILED_CHAIN} inserts with this idempotency token "
            "have failed; try again later or in another zone"
        )

    async def delete_instance(self, instance_id: str, provider_id: str) -> None:
        try:
            found = await self._get(instance_id, provider_id)
        except InstanceNotFound:
            return
        name = found.name
        request_id = str(uuid.uuid4())
        try:
            op = await self._api.call(
                "instances.delete",
                lambda: self._instances.delete_unary(
                    request=compute_v1.DeleteInstanceRequest(
                        project=self._project, zone=self._zone, instance=name, request_id=request_id
                    ),
                    retry=None,
                    timeout=self._request_timeout,
                ),
            )
        except gexc.NotFound:
            return
        except gexc.GoogleAPICallError as exc:
            raise self._api.map_error(exc, f"delete {name}") from exc
        self._deleting.add(name)
        done = await self._api.wait(op, f"delete {name}")
        if self._api.is_done(done):
            self._deleting.discard(name)
            self._api.raise_op_error(done, f"delete {name}")

    async def get_instance(self, instance_id: str, provider_id: str) -> ProviderInstance:
        return self._to_instance(await self._get(instance_id, provider_id))

    async def list_instances(self, cluster_id: str, shard: str) -> list[ProviderInstance]:
        flt = (
            f'labels.{lbl.MANAGED} = "true" AND labels.{lbl.CLUSTER_ID} = "{lbl.label_value(cluster_id)}" '
            f'AND labels.{lbl.SHARD} = "{lbl.label_value(shard)}"'
        )
        out: list[ProviderInstance] = []
        token = ""
        seen: set[str] = set()
        while True:
            try:
                page = await self._api.call(
                    "instances.list",
                    functools.partial(self._list_blocking, flt, token),
                )
            except gexc.GoogleAPICallError as exc:
                raise self._api.map_error(
                    exc, f"list instances of cluster {cluster_id} shard {shard}"
                ) from exc
            # Only this page: iterating the pager itself would fetch the next pages outside call().
            for item in page.items:
                if item.name in seen:
                    continue
                seen.add(item.name)
                labels = dict(item.labels)
                if labels.get(lbl.CLUSTER_ID) != lbl.label_value(cluster_id):
                    continue  # defence in depth: the filter is the API's, check what came back
                if labels.get(lbl.SHARD) != lbl.label_value(shard):
                    continue
                out.append(self._to_instance(item))
            token = page.next_page_token
            if not token:
                return out

    async def check_subnet_capacity(self, subnet_id: str) -> bool:
        """Whether the subnetwork exists (GCE reports no free-address count; its ranges can be expanded)."""
        path = subnetwork_path(subnet_id, project=self._project, region=self._region)
        parts = path.split("/")
        project, region, name = parts[1], parts[3], parts[5]
        try:
            await self._api.call(
                "subnetworks.get",
                lambda: self._subnetworks.get(
                    project=project, region=region, subnetwork=name, retry=None, timeout=self._request_timeout
                ),
            )
        except gexc.NotFound as exc:
            raise ProviderInvalidRequest(
                f"shard.subnet_pools: subnetwork {path} does not exist (or the service account cannot see it)"
            ) from exc
        except gexc.GoogleAPICallError as exc:
            raise self._api.map_error(exc, f"read subnetwork {path}") from exc
        return True

    # ---- capabilities (nstance.providers.features) -------------------------------------------

    def _lb_members(self, lb: LoadBalancerConfig) -> NegTargets | InstanceGroupTargets:
        """The instance group of an ``instance_group_name`` entry, else the entry's NEGs."""
        return self._groups if lb.instance_group_name is not None else self._negs

    async def register_targets(self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]) -> None:
        """Add the VMs to every NEG (or the instance group) of ``load_balancers.<name>``."""
        await self._lb_members(lb).register(name, lb, targets)

    async def deregister_targets(
        self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> None:
        """Take the VMs out of every NEG (or the instance group) of ``name``; waits for the operation."""
        await self._lb_members(lb).deregister(name, lb, targets)

    async def target_states(
        self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> dict[str, TargetState]:
        """Each VM's state across the NEGs (or in the instance group) of ``name``, keyed by instance id."""
        return await self._lb_members(lb).states(name, lb, targets)

    async def assign_leader_network(self, provider_id: str, ip: str, interface_id: str) -> None:
        """Give VM ``provider_id`` (GCE id or name) the alias range ``ip/32`` on ``interface_id`` (nic0)."""
        await self._leader.assign(provider_id, ip, interface_id)

    async def release_leader_network(self, provider_id: str, ip: str, interface_id: str) -> None:
        """Remove the alias range ``ip/32`` from VM ``provider_id`` if it holds it."""
        await self._leader.release(provider_id, ip, interface_id)

    async def own_instance_id(self) -> str:
        """The numeric GCE id of the VM this process runs on, from the metadata server."""
        found = await metadata.google_instance_field("id")
        if not found.isdigit():
            raise ProviderUnavailable(
                f"gcp: the metadata server answered {found[:40]!r} for instance/id, not a numeric GCE id; "
                "check GCE_METADATA_HOST, or give the id with --provider-instance-id "
                "(NSTANCE_PROVIDER_INSTANCE_ID)"
            )
        return found

    async def check_instance_type(self, instance_type: str, arch: str, *, template: str, where: str) -> None:
        """Refuse (naming ``where``) a machine type that is unknown here or does not run ``arch``."""
        machine_type = await self._machine_type(instance_type, template=template, where=where)
        check_arch(machine_type, arch, template=template, where=where, zone=self._zone)

    async def close(self) -> None:
        clients = (
            self._instances,
            self._operations,
            self._machine_type_client,
            self._subnetworks,
            self._neg_client,
            self._rule_client,
            self._group_client,
        )
        for client in clients:
            await asyncio.to_thread(client.transport.close)
        await asyncio.to_thread(self._leader.close_blocking)

    # ---- blocking SDK calls (run through GceCalls.call) -------------------------------------

    def _insert_blocking(self, body: compute_v1.Instance, request_id: str) -> compute_v1.Operation:
        return self._instances.insert_unary(
            request=compute_v1.InsertInstanceRequest(
                project=self._project, zone=self._zone, instance_resource=body, request_id=request_id
            ),
            retry=None,
            timeout=self._request_timeout,
        )

    def _list_blocking(self, flt: str, page_token: str) -> Any:
        """One page of ``instances.list`` (the pager object; its ``items`` are this page's only)."""
        return self._instances.list(
            request=compute_v1.ListInstancesRequest(
                project=self._project,
                zone=self._zone,
                filter=flt,
                max_results=self._page_size,
                page_token=page_token,
            ),
            retry=None,
            timeout=self._request_timeout,
        )

    # ---- lookups ----------------------------------------------------------------------------

    async def _machine_type(self, name: str, *, template: str, where: str) -> compute_v1.MachineType:
        """Machine type ``name`` of this zone (cached); refused naming ``where`` when it is not one."""
        cached = self._machine_types.get(name)
        if cached is not None:
            return cached
        if not name:
            raise ProviderInvalidRequest(f"{where}: required for gcp (a machine type such as e2-standard-2)")
        try:
            found = await self._api.call(
                "machineTypes.get",
                lambda: self._machine_type_client.get(
                    project=self._project,
                    zone=self._zone,
                    machine_type=name,
                    retry=None,
                    timeout=self._request_timeout,
                ),
            )
        except gexc.NotFound as exc:
            hint = (
                ""
                if where.startswith("templates.")
                else f"; set it there or in templates.{template}.instance_type"
            )
            raise ProviderInvalidRequest(
                f"{where}: {name!r} is not a machine type in zone {self._zone} (see `gcloud compute "
                f"machine-types list --zones {self._zone}`){hint}"
            ) from exc
        except gexc.GoogleAPICallError as exc:
            raise self._api.map_error(exc, f"read machine type {name}") from exc
        self._machine_types[name] = found
        return found

    async def _get(self, instance_id: str, provider_id: str) -> compute_v1.Instance:
        """The VM by name (instance id) or numeric id; InstanceNotFound when gone or replaced."""
        if not instance_id and not provider_id:
            raise ProviderInvalidRequest("gcp: give an instance id or a provider id")
        key = instance_id or provider_id
        try:
            found = await self._api.call(
                "instances.get",
                lambda: self._instances.get(
                    project=self._project,
                    zone=self._zone,
                    instance=key,
                    retry=None,
                    timeout=self._request_timeout,
                ),
            )
        except gexc.NotFound as exc:
            raise InstanceNotFound(
                f"gcp: no instance {key} in projects/{self._project}/zones/{self._zone}"
            ) from exc
        except gexc.GoogleAPICallError as exc:
            raise self._api.map_error(exc, f"get {key}") from exc
        if provider_id and instance_id and str(found.id) != provider_id:
            raise InstanceNotFound(
                f"gcp: instance {instance_id} is now GCE id {found.id}, not {provider_id}; that VM is gone"
            )
        return found

    async def _existing_for_retry(self, request: CreateRequest) -> ProviderInstance:
        """A 409 on insert: the VM exists. Return it for a retry with the same token, else refuse."""
        found = await self._get(request.instance_id, "")
        expected = lbl.token_hash(request.idempotency_token or request.instance_id)
        if dict(found.labels).get(lbl.CREATE_TOKEN) != expected:
            raise ProviderInvalidRequest(
                f"gcp: instance {request.instance_id} already exists in zone {self._zone}, created with "
                "another idempotency token (or not by Nstance); retry with its original token or choose a "
                "new instance id"
            )
        return self._to_instance(found)

    async def _fetch_new(self, request: CreateRequest, target_id: str) -> ProviderInstance:
        """The VM just created; a 404 right after the insert is eventual consistency, not absence."""
        for attempt in range(self._not_found_retries + 1):
            try:
                return self._to_instance(await self._get(request.instance_id, ""))
            except InstanceNotFound:
                if attempt < self._not_found_retries:
                    await self._sleep(self._backoff.delay(attempt))
        return ProviderInstance(
            instance_id=request.instance_id,
            provider_id=target_id,
            status=InstanceStatus.PENDING,
            cluster_id=request.cluster_id,
            shard=request.shard,
            group=request.group,
            kind=request.kind,
            tenant=request.tenant,
            template=request.template,
            on_demand=request.on_demand,
            instance_type=request.instance_type,
            subnet_id=request.subnet_id,
            hostname=self._hostname(request.instance_id),
            zone=self._zone,
            launched_at=self._clock.now(),
        )

    def _hostname(self, name: str) -> str:
        return f"{name}.{self._zone}.c.{self._project}.internal"

    def _to_instance(self, item: compute_v1.Instance) -> ProviderInstance:
        labels: Mapping[str, str] = dict(item.labels)
        status = map_status(item.status)
        if item.name in self._deleting:
            status = InstanceStatus.DELETING
        nic = item.network_interfaces[0] if item.network_interfaces else None
        launched: datetime | None = None
        if item.creation_timestamp:
            try:
                launched = datetime.fromisoformat(item.creation_timestamp)
            except ValueError:
                launched = None
        return ProviderInstance(
            instance_id=labels.get(lbl.INSTANCE_ID, item.name),
            provider_id=str(item.id),
            status=status,
            cluster_id=labels.get(lbl.CLUSTER_ID, ""),
            shard=labels.get(lbl.SHARD, ""),
            group=labels.get(lbl.GROUP, ""),
            kind=labels.get(lbl.KIND, ""),
            tenant=labels.get(lbl.TENANT, ""),
            template=labels.get(lbl.TEMPLATE, ""),
            on_demand=labels.get(lbl.ON_DEMAND) == "true",
            instance_type=item.machine_type.rsplit("/", 1)[-1],
            subnet_id=short_subnet(nic.subnetwork, project=self._project, region=self._region) if nic else "",
            ip4=nic.network_i_p if nic else "",
            ip6=nic.ipv6_address if nic else "",
            hostname=item.hostname or self._hostname(item.name),
            zone=self._zone,
            launched_at=launched,
        )


# ---- construction from config ------------------------------------------------------------------


def gcp_provider_from_options(
    options: Mapping[str, Any], *, clock: Clock, base_dir: Path, zone: str = ""
) -> GcpProvider:
    """Build a GcpProvider from ``shard.infra.options``; refuse unknown keys and bad values by path."""
    prefix = opt.PREFIX
    opt.check_known(options, OPTION_KEYS, "gcp")
    if not zone:
        raise InvalidArgument("shard.infra.zone: required for the gcp provider (for example us-central1-a)")
    named = {key: opt.text(options, key) for key in GOOGLE_PROJECT_KEYS if key in options}
    if len(set(named.values())) > 1:
        raise InvalidArgument(
            f"{prefix}.project: {named['project']!r} differs from project_id {named['project_id']!r}; "
            "set one of them"
        )
    project = google_project(options) or os.environ.get("GOOGLE_CLOUD_PROJECT", "")
    if not project:
        raise InvalidArgument(
            f"{prefix}.project_id: the GCP project id is required (or set GOOGLE_CLOUD_PROJECT); "
            "project_id is upstream's name, project also works"
        )
    endpoint = options.get("endpoint", "")
    if not isinstance(endpoint, str) or (endpoint and not endpoint.startswith(("http://", "https://"))):
        raise InvalidArgument(f"{prefix}.endpoint: must be an http:// or https:// URL (got {endpoint!r})")
    credentials: gauth_credentials.Credentials | None = None
    credentials_path = opt.path(options, "credentials_file", base_dir)
    if credentials_path is not None:
        credentials = _load_credentials(credentials_path, f"{prefix}.credentials_file")
    elif endpoint.startswith("http://"):
        # Plain HTTP is only ever a local emulator or fake; never send real tokens to it.
        credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    return GcpProvider(
        project=project,
        zone=zone,
        clock=clock,
        endpoint=endpoint,
        credentials=credentials,
        page_size=opt.whole(options, "page_size", 500, 1, 500),
        max_attempts=opt.whole(options, "max_attempts", 5, 1, 20),
        operation_timeout=opt.seconds(options, "operation_timeout", 300.0),
        request_timeout=opt.seconds(options, "request_timeout", 30.0),
    )


def _load_credentials(path: Path, option: str) -> gauth_credentials.Credentials:
    from google.oauth2 import service_account

    try:
        loaded: gauth_credentials.Credentials = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
            str(path), scopes=["https://www.googleapis.com/auth/cloud-platform"]
        )
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"{option}: cannot load service-account key {path}: {exc}") from exc
    return loaded
