"""The ``aws`` provider: EC2 instances through boto3.

create: the instance type must run the template's arch (DescribeInstanceTypes, cached); then one
DescribeInstances looks for an instance already carrying this instance id or this request's client
token (a retried create returns it; a token reused for another instance is refused), then RunInstances
with the merged args, the ``nstance:*`` tags and a ClientToken derived from the idempotency token, so
even a retry the pre-check cannot see (EC2 is eventually consistent) never launches a second VM.
get/list: DescribeInstances by id, or filtered by the ``nstance:*`` tags, every page read. delete:
TerminateInstances; an instance EC2 does not know is already gone. Right after a create EC2 may answer
``InvalidInstanceID.NotFound`` for the new id: within ``consistency_window`` seconds of our own create,
get returns the instance as created (pending) and delete retries until EC2 sees it. Throttling and
transient failures are retried with backoff inside every call (``calls.AwsCaller``).

Also here, the optional capabilities of ``nstance.providers.features``: image lookup (``images``),
instance-type architectures (``types``), target-group registration (``loadbalancers``), the leader
ENI (``network``) and this VM's own id (IMDSv2, ``nstance.providers.metadata``); and subnet capacity
(DescribeSubnets, more than 10 free addresses). Blocking boto3 calls run in worker threads. This
module must not decide whether to create or delete anything, and never touches instances without
asking for them by id or by the cluster's tags.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from nstance.config.resources import ImageConfig, LoadBalancerConfig
from nstance.core.backoff import Backoff
from nstance.core.clock import Clock
from nstance.core.errors import InvalidArgument
from nstance.providers import options as opt
from nstance.providers.aws.args import (
    TAG_CLIENT_TOKEN,
    TAG_CLUSTER,
    TAG_GROUP,
    TAG_INSTANCE_ID,
    TAG_KIND,
    TAG_MANAGED,
    TAG_ON_DEMAND,
    TAG_SHARD,
    TAG_TEMPLATE,
    TAG_TENANT,
    args_path,
    run_instances_params,
)
from nstance.providers.aws.calls import AwsCaller, Sleep, client_config, error_code, error_message, translate
from nstance.providers.aws.images import ImageFinder
from nstance.providers.aws.loadbalancers import TargetGroups
from nstance.providers.aws.network import LeaderNetwork
from nstance.providers.aws.status import LISTED_STATE_NAMES, status_from_state
from nstance.providers.aws.types import InstanceTypeArchs
from nstance.providers.base import (
    CreateRequest,
    InstanceNotFound,
    InstanceStatus,
    ProviderInstance,
    ProviderInvalidRequest,
    ProviderUnavailable,
)
from nstance.providers.features import LbTarget, TargetState
from nstance.providers.metadata import aws_instance_id

#: A subnet has room for one more VM when it has more than this many free addresses.
MIN_FREE_ADDRESSES = 10

OPTION_KEYS: tuple[str, ...] = (
    "region",
    "endpoint_url",
    "profile",
    "max_attempts",
    "page_size",
    "consistency_window",
)

_NOT_FOUND_CODES = frozenset({"InvalidInstanceID.NotFound"})
_MALFORMED_CODES = frozenset({"InvalidInstanceID.Malformed"})
_ZONE_RE = re.compile(r"^([a-z]{2}(?:-[a-z]+)+-\d+)[a-z]$")


@dataclass(slots=True)
class _Recent:
    """An instance we created lately, for tolerating EC2's eventual consistency."""

    created_mono: float
    instance: ProviderInstance
    client_token: str


class AwsProvider:
    """VMs as EC2 instances; see the module docstring."""

    def __init__(
        self,
        *,
        ec2: Any,
        clock: Clock,
        elbv2: Any = None,
        zone: str = "",
        sleep: Sleep = asyncio.sleep,
        backoff: Backoff | None = None,
        max_attempts: int = 5,
        page_size: int = 500,
        consistency_window: float = 300.0,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if not 5 <= page_size <= 1000:
            raise InvalidArgument(f"aws provider: page_size must be between 5 and 1000 (got {page_size})")
        if consistency_window < 0:
            raise InvalidArgument(
                f"aws provider: consistency_window must not be negative ({consistency_window})"
            )
        self._ec2 = ec2
        self._elbv2 = elbv2
        self._clock = clock
        self._zone = zone
        self._sleep = sleep
        self._page_size = page_size
        self._consistency_window = consistency_window
        self.caller = AwsCaller(sleep=sleep, backoff=backoff, max_attempts=max_attempts)
        self.instance_types = InstanceTypeArchs(ec2, self.caller)
        self.images = ImageFinder(ec2, self.caller)
        self.target_groups = TargetGroups(elbv2, self.caller)
        self._environ = environ
        self.leader_network = LeaderNetwork(ec2, self.caller, sleep=sleep)
        self._recent: dict[str, _Recent] = {}  # provider id -> our create
        self._create_locks: dict[str, tuple[asyncio.Lock, int]] = {}  # instance id -> (lock, users)

    @property
    def kind(self) -> str:
        return "aws"

    @property
    def ec2(self) -> Any:
        """The boto3 EC2 client."""
        return self._ec2

    @property
    def elbv2(self) -> Any:
        """The boto3 ELBv2 client (None when the provider was built without one)."""
        return self._elbv2

    # ---- the Provider protocol -------------------------------------------------------------

    async def create_instance(self, request: CreateRequest) -> ProviderInstance:
        params = run_instances_params(request)
        where = (
            f"groups.{request.tenant}.{request.group}.instance_type"
            if request.tenant and request.group
            else f"templates.{request.template}.instance_type"
        )
        await self.instance_types.check(
            request.instance_type, request.arch, where=where, template=request.template
        )
        # One create per instance id at a time in this process: the pre-check and the launch are one step.
        key = request.instance_id
        lock, users = self._create_locks.get(key, (asyncio.Lock(), 0))
        self._create_locks[key] = (lock, users + 1)
        try:
            async with lock:
                return await self._create_locked(request, params)
        finally:
            lock, users = self._create_locks[key]
            if users <= 1:
                del self._create_locks[key]
            else:
                self._create_locks[key] = (lock, users - 1)

    async def _create_locked(self, request: CreateRequest, params: dict[str, Any]) -> ProviderInstance:
        recent = self._recent_by_instance_id(request.instance_id)
        if recent is not None and recent.client_token == params["ClientToken"]:
            return recent.instance  # made moments ago by this process; EC2 may not list it yet
        response = await self._launch(request, params)
        if isinstance(response, ProviderInstance):
            return response
        instances = response.get("Instances", [])
        if not instances:
            raise ProviderUnavailable(
                f"AWS RunInstances for {request.instance_id} returned no instance; retry the create "
                "(its client token prevents a second launch)"
            )
        made = self._to_instance(instances[0])
        if not made.instance_id:  # RunInstances echoes tags, but do not rely on it
            made = replace(
                made,
                instance_id=request.instance_id,
                cluster_id=request.cluster_id,
                shard=request.shard,
                group=request.group,
                kind=request.kind,
            )
        self._remember(made, str(params["ClientToken"]))
        return made

    async def delete_instance(self, instance_id: str, provider_id: str) -> None:
        if provider_id:
            targets = [provider_id]
        else:
            if not instance_id:
                raise ProviderInvalidRequest("aws: delete needs an instance id or a provider id")
            found = await self._find(instance_id)
            targets = [
                str(raw["InstanceId"])
                for raw in found
                if status_from_state(raw.get("State")) != InstanceStatus.DELETED
            ]
            if not targets:
                recent = self._recent_by_instance_id(instance_id)
                if recent is None:
                    return
                targets = [recent.instance.provider_id]
        for target in targets:
            await self._terminate(target)

    async def get_instance(self, instance_id: str, provider_id: str) -> ProviderInstance:
        if provider_id:
            try:
                found = await self._describe(instance_ids=[provider_id])
            except ClientError as exc:
                code = error_code(exc)
                if code in _NOT_FOUND_CODES or code in _MALFORMED_CODES:
                    found = []
                else:
                    raise translate(exc, "DescribeInstances") from exc
        else:
            if not instance_id:
                raise ProviderInvalidRequest("aws: get needs an instance id or a provider id")
            found = await self._find(instance_id)
        if not found:
            recent = (
                self._recent.get(provider_id) if provider_id else self._recent_by_instance_id(instance_id)
            )
            if recent is not None and self._fresh(recent):
                return recent.instance  # created moments ago; EC2 does not show it yet
            raise InstanceNotFound(
                f"aws: no EC2 instance {provider_id or '(no provider id)'} for instance "
                f"{instance_id or '(any)'}"
            )
        # Several VMs for one instance id only after manual launches; prefer a live, then the newest.
        found.sort(
            key=lambda raw: (
                status_from_state(raw.get("State")) != InstanceStatus.DELETED,
                str(raw.get("LaunchTime", "")),
            )
        )
        instance = self._to_instance(found[-1])
        if instance_id and instance.instance_id and instance.instance_id != instance_id:
            raise ProviderInvalidRequest(
                f"aws: EC2 instance {instance.provider_id} belongs to instance {instance.instance_id}, "
                f"not {instance_id}"
            )
        return instance

    async def list_instances(self, cluster_id: str, shard: str) -> list[ProviderInstance]:
        raws = await self._describe(
            filters=[
                {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
                {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster_id]},
                {"Name": f"tag:{TAG_SHARD}", "Values": [shard]},
                {"Name": "instance-state-name", "Values": list(LISTED_STATE_NAMES)},
            ]
        )
        return [self._to_instance(raw) for raw in raws]

    async def check_subnet_capacity(self, subnet_id: str) -> bool:
        try:
            response = await self.caller.call(self._ec2, "describe_subnets", SubnetIds=[subnet_id])
        except ClientError as exc:
            if error_code(exc) in ("InvalidSubnetID.NotFound", "InvalidSubnetID.Malformed"):
                raise ProviderInvalidRequest(
                    f'shard.subnet_pools: subnet "{subnet_id}" does not exist in this region '
                    f"({error_message(exc)}); fix the subnet pool"
                ) from exc
            raise translate(exc, "DescribeSubnets", path="shard.subnet_pools") from exc
        subnets = response.get("Subnets", [])
        if not subnets:
            raise ProviderInvalidRequest(
                f'shard.subnet_pools: subnet "{subnet_id}" does not exist in this region'
            )
        free = subnets[0].get("AvailableIpAddressCount", 0)
        return isinstance(free, int) and free > MIN_FREE_ADDRESSES

    async def close(self) -> None:
        """Close the boto3 clients' connection pools."""
        for client in (self._ec2, self._elbv2):
            closer = getattr(client, "close", None)
            if callable(closer):
                await asyncio.to_thread(closer)

    # ---- capabilities (nstance.providers.features) -------------------------------------------

    async def lookup_image(self, name: str, image: ImageConfig) -> str:
        """The AMI that best matches ``images.<name>`` now (DescribeImages)."""
        return await self.images.lookup(name, image)

    async def check_instance_type(self, instance_type: str, arch: str, *, template: str, where: str) -> None:
        """Refuse an instance type that does not run the template's arch (DescribeInstanceTypes, cached)."""
        await self.instance_types.check(instance_type, arch, where=where, template=template)

    async def register_targets(self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]) -> None:
        """Register the instances with every target group of entry ``name``."""
        self._need_elbv2()
        await self.target_groups.register(name, lb, targets)

    async def deregister_targets(
        self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> None:
        """Start deregistering the instances from every target group of ``name`` (no waiting)."""
        self._need_elbv2()
        await self.target_groups.deregister(name, lb, targets)

    async def target_states(
        self, name: str, lb: LoadBalancerConfig, targets: Sequence[LbTarget]
    ) -> dict[str, TargetState]:
        """Where each instance stands in entry ``name`` (by instance id)."""
        self._need_elbv2()
        return await self.target_groups.states(name, lb, targets)

    async def assign_leader_network(self, provider_id: str, ip: str, interface_id: str) -> None:
        """Attach the leader ENI (holding ``ip``) to the leading server's instance."""
        if not interface_id:
            raise ProviderInvalidRequest(
                "shard.leader_network.interface_id: AWS moves the leader IP with an ENI; set its id (eni-...)"
            )
        await self.leader_network.attach(provider_id, interface_id, ip)

    async def release_leader_network(self, provider_id: str, ip: str, interface_id: str) -> None:
        """Detach the leader ENI from this instance, if it holds it."""
        if interface_id:
            await self.leader_network.release(provider_id, interface_id)

    async def own_instance_id(self) -> str:
        """This EC2 instance's id, from IMDSv2."""
        return await aws_instance_id(self._environ)

    # ---- internals -------------------------------------------------------------------------

    def _need_elbv2(self) -> None:
        if self._elbv2 is None:
            raise ProviderInvalidRequest("aws: this provider was built without an ELBv2 client")

    async def _launch(
        self, request: CreateRequest, params: dict[str, Any]
    ) -> dict[str, Any] | ProviderInstance:
        """RunInstances, unless an earlier attempt already launched the VM (then that VM).

        A failure with unknown outcome (timeout, 5xx) is retried only after looking again, and with
        the same ClientToken, so the retry cannot launch a second VM.
        """
        token = str(params["ClientToken"])
        attempt = 0
        while True:
            existing = await self._replay(request, token)
            if existing is not None:
                return existing
            try:
                return await self.caller.call(
                    self._ec2, "run_instances", retry_transient=False, path=args_path(request), **params
                )
            except ClientError as exc:
                raise self._create_error(exc, request) from exc
            except ProviderUnavailable:
                attempt += 1
                if attempt >= self.caller.max_attempts:
                    raise
            await self._sleep(self.caller.backoff.delay(attempt - 1))

    async def _replay(self, request: CreateRequest, token: str) -> ProviderInstance | None:
        """The VM an earlier create of this instance made, or None; refuse a token reused elsewhere."""
        found = await self._describe(
            filters=[
                {"Name": f"tag:{TAG_CLUSTER}", "Values": [request.cluster_id]},
                {"Name": "tag-value", "Values": [request.instance_id, token]},
            ]
        )
        for raw in found:
            tags = _tags(raw)
            if tags.get(TAG_CLIENT_TOKEN) == token and tags.get(TAG_INSTANCE_ID) != request.instance_id:
                raise ProviderInvalidRequest(
                    f"idempotency token {request.idempotency_token!r} was already used to create instance "
                    f"{tags.get(TAG_INSTANCE_ID)} ({raw.get('InstanceId')}); a new instance needs a new token"
                )
        mine = [raw for raw in found if _tags(raw).get(TAG_INSTANCE_ID) == request.instance_id]
        if not mine:
            return None
        for raw in mine:
            if _tags(raw).get(TAG_CLIENT_TOKEN, token) != token:
                raise ProviderInvalidRequest(
                    f"aws: instance {request.instance_id} already exists as {raw.get('InstanceId')}, created "
                    "with another idempotency token; retry with its original token or choose a new "
                    "instance id"
                )
        mine.sort(key=lambda raw: str(raw.get("LaunchTime", "")))
        return self._to_instance(mine[-1])

    def _create_error(self, exc: ClientError, request: CreateRequest) -> Exception:
        code = error_code(exc)
        path = args_path(request)
        if code == "IdempotentParameterMismatch":
            return ProviderInvalidRequest(
                f"idempotency token {request.idempotency_token!r} was already used by EC2 for a different "
                f"RunInstances request (instance {request.instance_id}); a new instance needs a new token"
            )
        if code.startswith("InvalidSubnet"):
            return ProviderInvalidRequest(
                f'shard.subnet_pools: subnet "{request.subnet_id}" was refused by EC2 ({code}: '
                f"{error_message(exc)})"
            )
        if code.startswith("InvalidAMIID"):
            return ProviderInvalidRequest(f"{path}.ImageId: {error_message(exc)} ({code})")
        if code == "InvalidParameterValue" and "instance type" in error_message(exc).lower():
            return ProviderInvalidRequest(
                f"templates.{request.template}.instance_type: {error_message(exc)} ({code})"
            )
        return translate(exc, "RunInstances", path=path)

    async def _terminate(self, provider_id: str) -> None:
        attempt = 0
        while True:
            try:
                await self.caller.call(self._ec2, "terminate_instances", InstanceIds=[provider_id])
                return
            except ClientError as exc:
                code = error_code(exc)
                if code in _MALFORMED_CODES:
                    raise ProviderInvalidRequest(
                        f"aws: {provider_id!r} is not an EC2 instance id ({error_message(exc)})"
                    ) from exc
                if code not in _NOT_FOUND_CODES:
                    raise translate(exc, "TerminateInstances") from exc
            recent = self._recent.get(provider_id)
            if recent is None or not self._fresh(recent):
                self._recent.pop(provider_id, None)
                return  # EC2 does not know it: already gone
            attempt += 1
            if attempt >= self.caller.max_attempts:
                raise ProviderUnavailable(
                    f"aws: EC2 does not show instance {provider_id} yet (created moments ago); "
                    "retry the delete"
                )
            await self._sleep(self.caller.backoff.delay(attempt - 1))

    async def _find(self, instance_id: str) -> list[dict[str, Any]]:
        """Every EC2 instance tagged with this instance id (terminated ones included)."""
        return await self._describe(
            filters=[
                {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
                {"Name": f"tag:{TAG_INSTANCE_ID}", "Values": [instance_id]},
            ]
        )

    async def _describe(
        self, *, filters: list[dict[str, Any]] | None = None, instance_ids: list[str] | None = None
    ) -> list[dict[str, Any]]:
        """DescribeInstances, every page read; ClientErrors other than throttling propagate."""
        params: dict[str, Any] = {}
        if filters:
            params["Filters"] = filters
        if instance_ids:
            params["InstanceIds"] = instance_ids
        else:
            params["MaxResults"] = self._page_size
        out: list[dict[str, Any]] = []
        token = ""
        while True:
            page = dict(params, NextToken=token) if token else params
            try:
                response = await self.caller.call(self._ec2, "describe_instances", **page)
            except ClientError as exc:
                if instance_ids:
                    raise
                raise translate(exc, "DescribeInstances") from exc
            for reservation in response.get("Reservations", []):
                out.extend(dict(raw) for raw in reservation.get("Instances", []))
            token = str(response.get("NextToken") or "")
            if not token:
                return out

    def _remember(self, instance: ProviderInstance, token: str) -> None:
        now = self._clock.monotonic()
        for key in [k for k, r in self._recent.items() if now - r.created_mono > self._consistency_window]:
            del self._recent[key]
        self._recent[instance.provider_id] = _Recent(now, instance, token)

    def _recent_by_instance_id(self, instance_id: str) -> _Recent | None:
        for recent in self._recent.values():
            if recent.instance.instance_id == instance_id and self._fresh(recent):
                return recent
        return None

    def _fresh(self, recent: _Recent) -> bool:
        return self._clock.monotonic() - recent.created_mono <= self._consistency_window

    def _to_instance(self, raw: Mapping[str, Any]) -> ProviderInstance:
        tags = _tags(raw)
        ip6 = ""
        for interface in raw.get("NetworkInterfaces", []) or []:
            for address in interface.get("Ipv6Addresses", []) or []:
                ip6 = str(address.get("Ipv6Address", ""))
                break
            if ip6:
                break
        launched = raw.get("LaunchTime")
        return ProviderInstance(
            instance_id=tags.get(TAG_INSTANCE_ID, ""),
            provider_id=str(raw.get("InstanceId", "")),
            status=status_from_state(raw.get("State")),
            cluster_id=tags.get(TAG_CLUSTER, ""),
            shard=tags.get(TAG_SHARD, ""),
            group=tags.get(TAG_GROUP, ""),
            kind=tags.get(TAG_KIND, ""),
            tenant=tags.get(TAG_TENANT, ""),
            template=tags.get(TAG_TEMPLATE, ""),
            on_demand=tags.get(TAG_ON_DEMAND) == "true",
            instance_type=str(raw.get("InstanceType", "")),
            subnet_id=str(raw.get("SubnetId", "")),
            ip4=str(raw.get("PrivateIpAddress", "") or ""),
            ip6=ip6 or str(raw.get("Ipv6Address", "") or ""),
            hostname=str(raw.get("PrivateDnsName", "") or ""),
            zone=str(raw.get("Placement", {}).get("AvailabilityZone", "") or self._zone),
            launched_at=launched if isinstance(launched, datetime) else None,
        )


def _tags(raw: Mapping[str, Any]) -> dict[str, str]:
    return {str(t.get("Key")): str(t.get("Value", "")) for t in raw.get("Tags", []) or []}


# ---- construction from config ------------------------------------------------------------------


def region_from_zone(zone: str) -> str:
    """``us-east-1a`` -> ``us-east-1``; ``""`` when the zone does not look like an AWS zone."""
    match = _ZONE_RE.match(zone)
    return match.group(1) if match else ""


def aws_provider_from_options(
    options: Mapping[str, Any], *, clock: Clock, base_dir: Path, zone: str = "", sleep: Sleep = asyncio.sleep
) -> AwsProvider:
    """Build an AwsProvider from ``shard.infra.options``; refuse unknown keys and bad values by path.

    Credentials come from boto3's default chain (instance profile, environment, shared config; the
    ``profile`` option picks a named profile). ``region`` defaults to the zone's region; ``endpoint_url``
    points EC2 and ELBv2 at another endpoint (moto_server in tests). ``base_dir`` is unused: the
    provider keeps no files. ``sleep`` is how backoff and polling wait (tests inject a fake).
    """
    import boto3  # only when an aws shard is configured

    opt.check_known(options, OPTION_KEYS, "aws")
    region = opt.text(options, "region") or region_from_zone(zone)
    if not region:
        raise InvalidArgument(
            f'{opt.PREFIX}.region: cannot tell the AWS region from zone "{zone}"; '
            'set it (for example "us-east-1")'
        )
    endpoint = opt.text(options, "endpoint_url") or None
    profile = opt.text(options, "profile") or None
    max_attempts = opt.whole(options, "max_attempts", 5, 1)
    page_size = opt.whole(options, "page_size", 500, 5, 1000)
    session = boto3.session.Session(profile_name=profile, region_name=region)
    config = client_config()
    return AwsProvider(
        ec2=session.client("ec2", endpoint_url=endpoint, config=config),
        elbv2=session.client("elbv2", endpoint_url=endpoint, config=config),
        clock=clock,
        zone=zone,
        sleep=sleep,
        max_attempts=max_attempts,
        page_size=page_size,
        consistency_window=opt.seconds(options, "consistency_window", 300.0),
    )
