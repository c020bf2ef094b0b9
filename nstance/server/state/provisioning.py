"""Preparing one VM: instance id, registration nonce, rendered userdata and args, subnet choice.

``prepare_instance`` turns a group's merged config into a ``CreateRequest`` plus what the record and
the SQLite row need. It asks about subnet capacity through the given check, and fetches
``userdata.source: url`` content with a timeout (in a worker thread). Writing the intent and calling
the provider is the job of ``nstance.server.reconcile.create``, so that the crash-safe ordering
lives in one place.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nstance.config import (
    ClusterData,
    InstanceData,
    MergedGroupConfig,
    ProviderData,
    ServerData,
    TemplateData,
    decode_userdata,
    infra_hash,
    render_args,
    render_template,
    runtime_hash,
)
from nstance.core.clock import Clock
from nstance.core.errors import FailedPrecondition, InvalidArgument, Unavailable
from nstance.core.ids import new_instance_id, parse_puid
from nstance.pki.nonce import agent_nonce_claims, sign_nonce
from nstance.providers.base import CreateRequest

USERDATA_FETCH_TIMEOUT = 10.0
USERDATA_FETCH_LIMIT = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ShardIdentity:
    """Facts about this shard that every instance's templates and tags need."""

    cluster_id: str
    shard: str
    provider_kind: str
    region: str
    zone: str
    registration_addr: str
    agent_addr: str
    operator_addr: str
    ca_pem: bytes


@dataclass(frozen=True, slots=True)
class PreparedInstance:
    """A create request and the facts recorded before it is sent."""

    request: CreateRequest
    nonce: str
    infra_hash: str
    runtime_hash: str
    on_demand: bool


def _fetch_url(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # the URL comes from the config
            data: bytes = response.read(USERDATA_FETCH_LIMIT + 1)
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise Unavailable(f"cannot fetch userdata from {url}: {exc}") from exc
    if len(data) > USERDATA_FETCH_LIMIT:
        raise InvalidArgument(f"userdata at {url} is larger than {USERDATA_FETCH_LIMIT} bytes")
    return data


async def render_userdata(
    merged: MergedGroupConfig, data: TemplateData, *, fetch_timeout: float = USERDATA_FETCH_TIMEOUT
) -> bytes:
    """The group's userdata, fetched when it is a URL, decoded per its encoding, then rendered."""
    userdata = merged.userdata
    if userdata is None:
        return b""
    name = f"templates.{merged.template}.userdata"
    if userdata.source == "url":
        raw = await asyncio.to_thread(_fetch_url, userdata.content, fetch_timeout)
    else:
        raw = userdata.content.encode("utf-8")
    try:
        text = decode_userdata(raw, userdata.encoding).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"{name}: decoded userdata is not UTF-8 text (byte {exc.start})") from exc
    return render_template(name, text, data).encode("utf-8")


CapacityCheck = Callable[[str], Awaitable[bool]]


async def choose_subnet(has_capacity: CapacityCheck, subnet_pools: dict[str, list[str]], pool: str) -> str:
    """The first subnet of ``pool`` with room for one more VM; ``""`` when the group has no pool.

    Without a pool the provider places the VM (upstream allows a template and group without one):
    EC2 in the default VPC, GCE in the default network, Proxmox on the template's ``Bridge``.
    A pool of one subnet leaves nothing to choose, so the provider is not asked: its create call
    reports a full subnet just as clearly, and a burst of creates saves a (rate-limited) read.
    """
    if not pool:
        return ""
    subnets = subnet_pools.get(pool)
    if not subnets:
        raise FailedPrecondition(f'subnet pool "{pool}" is not defined in shard.subnet_pools')
    if len(subnets) == 1:
        return subnets[0]
    for subnet in subnets:
        if await has_capacity(subnet):
            return subnet
    raise Unavailable(f'every subnet of pool "{pool}" is full ({", ".join(subnets)})')


async def prepare_instance(
    merged: MergedGroupConfig,
    *,
    shard: ShardIdentity,
    nonce_key: Ed25519PrivateKey,
    has_capacity: CapacityCheck,
    subnet_pools: dict[str, list[str]],
    registration_timeout: timedelta,
    clock: Clock,
    on_demand: bool = False,
    instance_id: str = "",
    images: Mapping[str, str] | None = None,
) -> PreparedInstance:
    """Everything needed to create one instance of ``merged`` (id chosen here unless given).

    ``images`` are the resolved ``Image.<name>`` values the templates may use.
    """
    if instance_id:
        try:
            puid = parse_puid(instance_id)
        except InvalidArgument as exc:
            raise InvalidArgument(f"instance_id {instance_id!r}: {exc}") from exc
        if puid.kind != merged.kind:
            raise InvalidArgument(
                f"instance_id {instance_id!r} has prefix {puid.kind!r}, but template "
                f'"{merged.template}" creates instances of kind "{merged.kind}"'
            )
    else:
        instance_id = str(new_instance_id(merged.kind))
    rt_hash = runtime_hash(merged)
    nonce = sign_nonce(
        nonce_key,
        agent_nonce_claims(
            instance_id=instance_id,
            cluster_id=shard.cluster_id,
            shard=shard.shard,
            group=merged.group,
            tenant=merged.tenant,
            config_hash=rt_hash,
            on_demand=on_demand,
            ttl=registration_timeout,
            clock=clock,
        ),
    )
    data = TemplateData(
        instance=InstanceData(
            id=instance_id, kind=merged.kind, arch=merged.arch, instance_type=merged.instance_type
        ),
        cluster=ClusterData(id=shard.cluster_id, ca_cert=shard.ca_pem.decode("ascii")),
        server=ServerData(
            shard=shard.shard,
            registration_addr=shard.registration_addr,
            agent_addr=shard.agent_addr,
            operator_addr=shard.operator_addr,
        ),
        provider=ProviderData(kind=shard.provider_kind, region=shard.region, zone=shard.zone),
        vars=merged.vars,
        image=dict(images or {}),
        nonce=nonce,
    )
    userdata = await render_userdata(merged, data)
    args = render_args(merged.args, data, name=f"templates.{merged.template}.args")
    subnet = await choose_subnet(has_capacity, subnet_pools, merged.subnet_pool)
    now: datetime = clock.now()
    request = CreateRequest(
        cluster_id=shard.cluster_id,
        shard=shard.shard,
        tenant=merged.tenant,
        group=merged.group,
        template=merged.template,
        kind=merged.kind,
        instance_id=instance_id,
        instance_type=merged.instance_type,
        subnet_id=subnet,
        arch=merged.arch,
        userdata=userdata,
        idempotency_token=instance_id,
        created_at=now,
        args=args,
        on_demand=on_demand,
        ca_pem=shard.ca_pem,
        nonce=nonce,
        server_registration_addr=shard.registration_addr,
        server_agent_addr=shard.agent_addr,
    )
    return PreparedInstance(
        request=request, nonce=nonce, infra_hash=infra_hash(merged), runtime_hash=rt_hash, on_demand=on_demand
    )
