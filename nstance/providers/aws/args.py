"""Build the RunInstances parameters for one CreateRequest: merged template args plus what Nstance owns.

The config has already deep-merged ``defaults.args`` -> template -> group and rendered the templates
inside them; this module checks the result and adds the fields Nstance owns: ``InstanceType``,
``SubnetId``, ``UserData``, ``MinCount``, ``MaxCount`` and ``ClientToken`` (setting any of them in
``args`` is refused with an error naming the path), the ``nstance:*`` tags (identifier, association and
annotation metadata, spec/groups-and-instances.md) and, for spot requests, ``InstanceMarketOptions``.

``client_token`` derives EC2's idempotency token from the request's idempotency token, so a retried
RunInstances (our retry loop, or a server that crashed and asks again) never launches a second VM.
Pure functions, no I/O; this module must not call AWS.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from typing import Any

from nstance.providers.base import CreateRequest, ProviderInvalidRequest

#: RunInstances fields Nstance sets itself; a template or group may not set them in ``args``.
OWNED_ARGS: tuple[str, ...] = ("InstanceType", "SubnetId", "UserData", "MinCount", "MaxCount", "ClientToken")

TAG_PREFIX = "nstance:"
TAG_MANAGED = "nstance:managed"
TAG_INSTANCE_ID = "nstance:instance-id"
TAG_CLUSTER = "nstance:cluster-id"
TAG_SHARD = "nstance:shard"
TAG_TENANT = "nstance:tenant"
TAG_GROUP = "nstance:group"
TAG_TEMPLATE = "nstance:template"
TAG_KIND = "nstance:kind"
TAG_CREATED_AT = "nstance:created-at"
TAG_ON_DEMAND = "nstance:on-demand"
#: Records the ClientToken, so a retried create is recognised before RunInstances.
TAG_CLIENT_TOKEN = "nstance:client-token"

#: EC2 limits: tags per resource, tag key and value lengths, raw userdata bytes (before base64).
MAX_TAGS = 50
MAX_TAG_KEY = 128
MAX_TAG_VALUE = 256
MAX_USERDATA_BYTES = 16384

_SPOT_DEFAULTS: Mapping[str, Any] = {
    "SpotInstanceType": "one-time",
    "InstanceInterruptionBehavior": "terminate",
}


def args_path(request: CreateRequest) -> str:
    """The config path the request's args came from, for error messages."""
    return f"templates.{request.template}.args" if request.template else "args"


def client_token(request: CreateRequest) -> str:
    """EC2 ClientToken for the request: 64 hex characters, the same for every retry of one create.

    Derived from the idempotency token (the instance id when there is none), scoped by cluster and
    shard so two clusters in one account never collide.
    """
    token = request.idempotency_token or request.instance_id
    digest = hashlib.sha256(f"{request.cluster_id}\0{request.shard}\0{token}".encode()).hexdigest()
    return digest[:64]


def nstance_tags(request: CreateRequest) -> dict[str, str]:
    """The ``nstance:*`` tags every instance carries (identifier, association, annotation)."""
    tags = {
        TAG_MANAGED: "true",
        TAG_INSTANCE_ID: request.instance_id,
        TAG_CLUSTER: request.cluster_id,
        TAG_SHARD: request.shard,
        TAG_GROUP: request.group,
        TAG_KIND: request.kind,
        TAG_CREATED_AT: request.created_at.isoformat(),
        TAG_CLIENT_TOKEN: client_token(request),
    }
    if request.tenant:
        tags[TAG_TENANT] = request.tenant
    if request.template:
        tags[TAG_TEMPLATE] = request.template
    if request.on_demand:
        tags[TAG_ON_DEMAND] = "true"
    return tags


def _check_tag(key: str, value: str, where: str) -> None:
    if not key or len(key) > MAX_TAG_KEY:
        raise ProviderInvalidRequest(f"{where}: tag key {key!r} must be 1 to {MAX_TAG_KEY} characters")
    if len(value) > MAX_TAG_VALUE:
        raise ProviderInvalidRequest(f"{where}: tag {key!r} has a value over {MAX_TAG_VALUE} characters")
    if key.lower().startswith("aws:"):
        raise ProviderInvalidRequest(f"{where}: tag {key!r} uses the reserved aws: prefix")


def _user_instance_tags(request: CreateRequest, path: str) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """Tags for the instance from ``request.tags`` and args' TagSpecifications, and the other specs."""
    tags: dict[str, str] = {}
    for key, value in request.tags.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ProviderInvalidRequest(f"tags: {key!r} must map a string key to a string value")
        if key.startswith(TAG_PREFIX):
            raise ProviderInvalidRequest(
                f"tags.{key}: the nstance: prefix is reserved for Nstance's own tags"
            )
        _check_tag(key, value, "tags")
        tags[key] = value
    others: list[dict[str, Any]] = []
    specs = request.args.get("TagSpecifications", [])
    if not isinstance(specs, list):
        raise ProviderInvalidRequest(f"{path}.TagSpecifications: must be a list of {{ResourceType, Tags}}")
    for i, spec in enumerate(specs):
        where = f"{path}.TagSpecifications[{i}]"
        if not isinstance(spec, Mapping) or not isinstance(spec.get("ResourceType"), str):
            raise ProviderInvalidRequest(f"{where}: must be an object with ResourceType and Tags")
        spec_tags = spec.get("Tags", [])
        if not isinstance(spec_tags, list):
            raise ProviderInvalidRequest(f"{where}.Tags: must be a list of {{Key, Value}}")
        if spec["ResourceType"] != "instance":
            others.append(copy.deepcopy(dict(spec)))
            continue
        for j, tag in enumerate(spec_tags):
            if not isinstance(tag, Mapping) or not isinstance(tag.get("Key"), str):
                raise ProviderInvalidRequest(f"{where}.Tags[{j}]: must be {{Key, Value}} with a string Key")
            key, value = tag["Key"], tag.get("Value", "")
            if not isinstance(value, str):
                raise ProviderInvalidRequest(f"{where}.Tags[{j}].Value: must be a string")
            if key.startswith(TAG_PREFIX):
                raise ProviderInvalidRequest(
                    f"{where}.Tags[{j}]: the nstance: prefix is reserved for Nstance's own tags"
                )
            _check_tag(key, value, f"{where}.Tags[{j}]")
            tags[key] = value
    return tags, others


def _market_options(request: CreateRequest, path: str) -> dict[str, Any] | None:
    given = request.args.get("InstanceMarketOptions")
    if given is not None and not isinstance(given, Mapping):
        raise ProviderInvalidRequest(f"{path}.InstanceMarketOptions: must be an object")
    if not request.spot:
        return copy.deepcopy(dict(given)) if given is not None else None
    options: dict[str, Any] = copy.deepcopy(dict(given)) if given is not None else {}
    market = options.setdefault("MarketType", "spot")
    if market != "spot":
        raise ProviderInvalidRequest(
            f'{path}.InstanceMarketOptions.MarketType: is "{market}" but this instance is spot; '
            'remove MarketType or set it to "spot"'
        )
    spot = options.get("SpotOptions", {})
    if not isinstance(spot, Mapping):
        raise ProviderInvalidRequest(f"{path}.InstanceMarketOptions.SpotOptions: must be an object")
    options["SpotOptions"] = {**_SPOT_DEFAULTS, **spot}
    return options


def run_instances_params(request: CreateRequest) -> dict[str, Any]:
    """The keyword arguments for ``ec2.run_instances`` creating the VM ``request`` describes."""
    path = args_path(request)
    for key in request.args:
        if not isinstance(key, str):
            raise ProviderInvalidRequest(f"{path}: keys must be strings (got {key!r})")
        if key in OWNED_ARGS:
            raise ProviderInvalidRequest(
                f"{path}.{key}: Nstance sets {key} itself; remove it from args (use instance_type, "
                "subnet_pool and userdata in the template or group instead)"
            )
    if not request.instance_type:
        raise ProviderInvalidRequest(
            f"templates.{request.template}.instance_type: an instance type is required"
        )
    image = request.args.get("ImageId")
    if "LaunchTemplate" not in request.args and (not isinstance(image, str) or not image):
        raise ProviderInvalidRequest(
            f'{path}.ImageId: RunInstances needs an AMI id (for example "{{{{ .Image.debian }}}}" from '
            "the images section, or a literal ami-...)"
        )
    if len(request.userdata) > MAX_USERDATA_BYTES:
        raise ProviderInvalidRequest(
            f"templates.{request.template}.userdata: {len(request.userdata)} bytes after rendering; EC2 "
            f"accepts at most {MAX_USERDATA_BYTES} (use gzip encoding or a url source)"
        )

    params: dict[str, Any] = {
        k: copy.deepcopy(v)
        for k, v in request.args.items()
        if k not in ("TagSpecifications", "InstanceMarketOptions")
    }
    params.update(
        InstanceType=request.instance_type,
        MinCount=1,
        MaxCount=1,
        ClientToken=client_token(request),
    )
    if request.userdata:
        params["UserData"] = request.userdata
    if request.subnet_id:  # no subnet pool: EC2 places the VM in the default VPC, as upstream does
        _place_in_subnet(params, request.subnet_id, path)

    user_tags, other_specs = _user_instance_tags(request, path)
    tags = {"Name": request.instance_id, **user_tags, **nstance_tags(request)}
    if len(tags) > MAX_TAGS:
        raise ProviderInvalidRequest(
            f"tags: {len(tags)} tags for instance {request.instance_id}; EC2 allows {MAX_TAGS} "
            f"including Nstance's {len(nstance_tags(request))}"
        )
    params["TagSpecifications"] = [
        {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]},
        *other_specs,
    ]
    market = _market_options(request, path)
    if market is not None:
        params["InstanceMarketOptions"] = market
    return params


def _place_in_subnet(params: dict[str, Any], subnet_id: str, path: str) -> None:
    """Put the subnet at the top level, or into the primary interface when args define interfaces."""
    interfaces = params.get("NetworkInterfaces")
    if interfaces is None:
        params["SubnetId"] = subnet_id
        return
    if not isinstance(interfaces, list) or not all(isinstance(i, dict) for i in interfaces):
        raise ProviderInvalidRequest(f"{path}.NetworkInterfaces: must be a list of objects")
    primary = next((i for i in interfaces if i.get("DeviceIndex", 0) == 0), None)
    if primary is None:
        primary = {"DeviceIndex": 0}
        interfaces.insert(0, primary)
    if "SubnetId" in primary or "NetworkInterfaceId" in primary:
        raise ProviderInvalidRequest(
            f"{path}.NetworkInterfaces: the primary interface (DeviceIndex 0) must not set SubnetId or "
            "NetworkInterfaceId; Nstance places it in the subnet pool's subnet"
        )
    primary["SubnetId"] = subnet_id
