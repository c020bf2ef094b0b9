"""Schema of shared resources groups refer to: load balancers, images and certificate templates.

Load balancers use upstream's v2 shape (provider ``aws`` with ``target_groups``, ``google`` with
``network_endpoint_groups`` and ``frontends``, ``tunnel`` with ``listeners``; fields of another
provider are refused) and its v1 shape (``aws`` with ``target_group_arns``; ``gcp``, the v1 name of
``google``, with ``instance_group_name`` and ``backend_service_name``; one entry is either shape, not
both). Images describe a lookup (filters, owners, sort, fallback). Certificates are issuance templates;
``ca``, ``agent`` and ``operator`` are reserved names. No I/O.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal, Self
from urllib.parse import urlparse

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from nstance.config.fields import NonEmptyStr, Port, Rules, StrictModel, rule

SPECIAL_CERTIFICATES: frozenset[str] = frozenset({"ca", "agent", "operator"})


class TargetGroupConfig(StrictModel):
    """An AWS target group instances are registered with."""

    arn: NonEmptyStr
    """The target group's ARN."""
    listener_port: Port | None = None
    """Upstream's listener port; accepted and not used."""
    target_port: Port
    """Port the instance is registered on."""
    proxy_port: Port | None = None
    """Upstream's wake-proxy port; accepted and not used."""


def _ip_address(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise rule(f'must be an IPv4 or IPv6 address (got "{value}")') from None
    return value


class FrontendConfig(StrictModel):
    """A Google load balancer frontend (forwarding rule address and port)."""

    ip: Annotated[str, AfterValidator(_ip_address)]
    """Forwarding-rule address (an IP address); documentation only, not used."""
    port: Port
    """Forwarding-rule port; documentation only, not used."""


class ListenerConfig(StrictModel):
    """A tunnel listener: traffic for ``target_port`` (or ``proxy_port`` while asleep)."""

    target_port: Port
    """Port traffic is sent to."""
    proxy_port: Port | None = None
    """Port of upstream's wake proxy."""


_LB_FIELDS: dict[str, tuple[str, ...]] = {
    "aws": ("target_groups", "target_group_arns"),
    "google": ("network_endpoint_groups", "frontends", "instance_group_name", "backend_service_name"),
    "tunnel": ("listeners",),
}
_LB_REQUIRED = {
    "aws": ("target_groups", "target_group_arns"),
    "google": ("network_endpoint_groups", "instance_group_name"),
    "tunnel": ("listeners",),
}


def _lb_provider_alias(value: object) -> object:
    return "google" if value == "gcp" else value


class LoadBalancerConfig(StrictModel):
    """A load balancer that a group's instances are registered with (upstream's newer shape).

    ``provider`` picks the kind; only that provider's list may be set, and it must have an entry.
    """

    provider: Annotated[Literal["aws", "google", "tunnel"], BeforeValidator(_lb_provider_alias)]
    """`aws` (target groups) or `google` (zonal network endpoint groups, or upstream v1's unmanaged
    instance group; `gcp` is upstream's v1 name); must be the shard's provider. `tunnel` is accepted
    by the schema and refused by validation (not supported yet)."""
    target_groups: list[TargetGroupConfig] = Field(default_factory=list)
    """`aws`: target groups; at least one of `target_groups` and `target_group_arns`, and only for
    `aws`."""
    target_group_arns: list[NonEmptyStr] = Field(default_factory=list)
    """`aws`, upstream's v1 shape: target group ARNs; instances are registered without a port, so each
    gets its target group's default port."""
    network_endpoint_groups: list[NonEmptyStr] = Field(default_factory=list)
    """`google`: zonal NEGs of the shard's zone (a name, `zones/Z/networkEndpointGroups/N`,
    `projects/P/zones/Z/networkEndpointGroups/N` or its URL); only for `google`, which needs at least one
    of them or an `instance_group_name`."""
    frontends: list[FrontendConfig] = Field(default_factory=list)
    """`google`: forwarding-rule addresses and ports; only the health of the backends behind those rules
    counts, and each must be healthy (as upstream reads it). Unset: every backend's health counts."""
    instance_group_name: NonEmptyStr | None = None
    """`google`, upstream's v1 shape (`provider: "gcp"`): an unmanaged instance group of the shard's
    zone (a name, `zones/Z/instanceGroups/N`, `projects/P/zones/Z/instanceGroups/N` or its URL) that
    each VM of the group is added to; instead of `network_endpoint_groups`, not with them."""
    backend_service_name: NonEmptyStr | None = None
    """`google`, upstream's v1 shape: the backend service the instance group serves. Upstream v1
    requires it next to `instance_group_name`; neither implementation calls it, so it is documentation."""
    listeners: list[ListenerConfig] = Field(default_factory=list)
    """`tunnel`: listeners (not supported yet)."""

    @model_validator(mode="after")
    def _rules(self) -> Self:
        rules = Rules()
        required = _LB_REQUIRED[self.provider]
        if not any(getattr(self, name) for name in required):
            also = f" (or set {required[1]})" if self.provider == "google" else ""
            rules.add(required[0], f'must have at least one entry for provider "{self.provider}"{also}')
        for provider, names in _LB_FIELDS.items():
            if provider == self.provider:
                continue
            for name in names:
                if getattr(self, name):
                    rules.add(name, f'is for provider "{provider}", not "{self.provider}"')
        if self.instance_group_name is not None and self.network_endpoint_groups:
            rules.add(
                "instance_group_name",
                "cannot be combined with network_endpoint_groups (upstream's v1 reads only the instance "
                "group and v2 only the NEGs); make them two load_balancers entries",
            )
        rules.check()
        return self


class ImageFilterConfig(StrictModel):
    """One DescribeImages-style filter."""

    name: NonEmptyStr
    """Filter name, as DescribeImages takes it (`name`, `architecture`, ...)."""
    values: list[NonEmptyStr] = Field(min_length=1)
    """Accepted values; wildcards as the provider allows them."""


class ImageConfig(StrictModel):
    """A machine image resolved by lookup (newest match), exposed to templates as ``Image.<name>``."""

    provider: Literal["aws", "oci"]
    """`aws` (DescribeImages). `oci` is accepted by the schema, but no provider implements it. Must match
    `shard.infra.provider`."""
    filters: list[ImageFilterConfig] = Field(min_length=1)
    """Lookup filters; at least one."""
    owners: list[NonEmptyStr] = Field(default_factory=list)
    """Image owners (account IDs or aliases such as `amazon`)."""
    sort: Literal["creation-date", "name"] = "creation-date"
    """What `order` sorts by: `creation-date` or `name`."""
    order: Literal["asc", "desc"] = "desc"
    """`desc` picks the newest (or last by name), `asc` the oldest (or first)."""
    fallback: str = ""
    """Image ID used when no lookup has succeeded yet."""


def _absolute_uri(uri: str) -> str:
    if "{{" in uri:
        return uri
    parsed = urlparse(uri)
    if not parsed.scheme or not (parsed.netloc or parsed.path):
        raise rule(f'must be an absolute URI such as "spiffe://example/x" (got "{uri}")')
    return uri


AbsoluteUri = Annotated[str, AfterValidator(_absolute_uri)]


class CertConfig(StrictModel):
    """A certificate template; string fields may be templated (``{{ .Instance.Hostname }}``).

    Three names are reserved. ``agent`` sets the lifetime (``ttl``) of agent certificates issued at
    registration and renewal; ``operator`` that of operator certificates issued at registration
    (renewals get 8760 hours); ``ca`` is accepted for upstream compatibility but changes nothing: the
    CA's name and ten-year lifetime are fixed when the cluster is initialised.
    """

    kind: Literal["client", "server"] | None = None
    """`client` (EKU clientAuth) or `server` (EKU serverAuth). Required except in the reserved entries
    `ca`, `agent` and `operator`."""
    cn: str = ""
    """Subject common name (templated). Empty: the entry's name."""
    organization: list[str] = Field(default_factory=list)
    """Subject organizations (templated)."""
    dns: list[str] = Field(default_factory=list)
    """DNS names (templated); an entry that renders empty is dropped."""
    ip: list[str] = Field(default_factory=list)
    """IP addresses (templated); an entry that renders empty is dropped."""
    uri: list[AbsoluteUri] = Field(default_factory=list)
    """URIs such as `spiffe://...` (templated); an entry that renders empty is dropped."""
    country: list[str] = Field(default_factory=list)
    """Subject countries (templated)."""
    province: list[str] = Field(default_factory=list)
    """Subject provinces or states (templated)."""
    locality: list[str] = Field(default_factory=list)
    """Subject localities (templated)."""
    street: list[str] = Field(default_factory=list)
    """Subject street addresses (templated)."""
    postal_code: list[str] = Field(default_factory=list)
    """Subject postal codes (templated)."""
    ttl: int = Field(default=8760, ge=1)
    """Validity in hours (default one year), never beyond the CA's expiry."""
