"""Schema of shared resources groups refer to: load balancers, images and certificate templates.

Load balancers use upstream's v2 shape (provider ``aws`` with ``target_groups``, ``google`` with
``network_endpoint_groups`` and ``frontends``, ``tunnel`` with ``listeners``; fields of another
provider are refused). Images describe a lookup (filters, owners, sort, fallback). Certificates
are issuance templates; ``ca``, ``agent`` and ``operator`` are reserved names. No I/O.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self
from urllib.parse import urlparse

from pydantic import AfterValidator, Field, model_validator

from nstance.config.fields import NonEmptyStr, Port, Rules, StrictModel, rule

SPECIAL_CERTIFICATES: frozenset[str] = frozenset({"ca", "agent", "operator"})


class TargetGroupConfig(StrictModel):
    """An AWS target group instances are registered with."""

    arn: NonEmptyStr
    listener_port: Port | None = None
    target_port: Port
    proxy_port: Port | None = None


class FrontendConfig(StrictModel):
    """A Google load balancer frontend (forwarding rule address and port)."""

    ip: NonEmptyStr
    port: Port


class ListenerConfig(StrictModel):
    """A tunnel listener: traffic for ``target_port`` (or ``proxy_port`` while asleep)."""

    target_port: Port
    proxy_port: Port | None = None


_LB_FIELDS: dict[str, tuple[str, ...]] = {
    "aws": ("target_groups",),
    "google": ("network_endpoint_groups", "frontends"),
    "tunnel": ("listeners",),
}
_LB_REQUIRED = {"aws": "target_groups", "google": "network_endpoint_groups", "tunnel": "listeners"}


class LoadBalancerConfig(StrictModel):
    """A load balancer group instances are registered with (v2 shape)."""

    provider: Literal["aws", "google", "tunnel"]
    target_groups: list[TargetGroupConfig] = Field(default_factory=list)
    network_endpoint_groups: list[NonEmptyStr] = Field(default_factory=list)
    frontends: list[FrontendConfig] = Field(default_factory=list)
    listeners: list[ListenerConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _rules(self) -> Self:
        rules = Rules()
        required = _LB_REQUIRED[self.provider]
        if not getattr(self, required):
            rules.add(required, f'must have at least one entry for provider "{self.provider}"')
        for provider, names in _LB_FIELDS.items():
            if provider == self.provider:
                continue
            for name in names:
                if getattr(self, name):
                    rules.add(name, f'is for provider "{provider}", not "{self.provider}"')
        rules.check()
        return self


class ImageFilterConfig(StrictModel):
    """One DescribeImages-style filter."""

    name: NonEmptyStr
    values: list[NonEmptyStr] = Field(min_length=1)


class ImageConfig(StrictModel):
    """A machine image resolved by lookup (newest match), exposed to templates as ``Image.<name>``."""

    provider: Literal["aws", "oci"]
    filters: list[ImageFilterConfig] = Field(min_length=1)
    owners: list[NonEmptyStr] = Field(default_factory=list)
    sort: Literal["creation-date", "name"] = "creation-date"
    order: Literal["asc", "desc"] = "desc"
    fallback: str = ""


def _absolute_uri(uri: str) -> str:
    if "{{" in uri:
        return uri
    parsed = urlparse(uri)
    if not parsed.scheme or not (parsed.netloc or parsed.path):
        raise rule(f'must be an absolute URI such as "spiffe://example/x" (got "{uri}")')
    return uri


AbsoluteUri = Annotated[str, AfterValidator(_absolute_uri)]


class CertConfig(StrictModel):
    """A certificate template; string fields may be templated (``{{ Instance.Hostname }}``)."""

    kind: Literal["client", "server"] | None = None
    cn: str = ""
    organization: list[str] = Field(default_factory=list)
    dns: list[str] = Field(default_factory=list)
    ip: list[str] = Field(default_factory=list)
    uri: list[AbsoluteUri] = Field(default_factory=list)
    country: list[str] = Field(default_factory=list)
    province: list[str] = Field(default_factory=list)
    locality: list[str] = Field(default_factory=list)
    street: list[str] = Field(default_factory=list)
    postal_code: list[str] = Field(default_factory=list)
    ttl: int = Field(default=8760, ge=1)
    """Validity in hours (default one year)."""
