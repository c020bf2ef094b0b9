"""The root of the server config (``config.jsonc``) and of dynamic groups (``groups.jsonc``).

``ServerConfig`` assembles the sections defined in ``cluster``, ``shard``, ``resources`` and
``workloads``. Use ``nstance.config.loader`` to build one from text: it validates section by section
so every problem is reported at once, and adds the rules that cross sections. No I/O here.
"""

from __future__ import annotations

from pydantic import Field

from nstance.config.cluster import ClusterConfig
from nstance.config.fields import GroupName, ImageName, StrictModel, TenantName
from nstance.config.resources import CertConfig, ImageConfig, LoadBalancerConfig
from nstance.config.shard import ShardConfig
from nstance.config.workloads import DefaultsConfig, DynamicGroupConfig, GroupConfig, TemplateConfig

DynamicGroups = dict[str, dict[str, DynamicGroupConfig]]
"""Dynamic groups as stored in ``groups.jsonc``: tenant → group → GroupConfig."""

UNSUPPORTED_SECTIONS: dict[str, str] = {
    "nat": "Nstance-managed NAT",
    "tunnels": "tunnel pods",
}

EMPTY_ONLY_SECTIONS: dict[str, str] = {
    "server": "files for services local to nstance-server",
    "proxy": "the load balancer proxy",
}
"""Upstream v2 sections that its own JSON encoder writes as ``{}`` when unused (Go's ``omitempty``
keeps an empty struct): accepted empty or null, refused with content, like ``UNSUPPORTED_SECTIONS``."""


class ServerConfig(StrictModel):
    """One shard server's static configuration."""

    cluster: ClusterConfig
    """Cluster-wide settings; the same in every shard's file."""
    shard: ShardConfig
    """This shard: provider, listeners, subnet pools and timings."""
    load_balancers: dict[str, LoadBalancerConfig] = Field(default_factory=dict)
    """Load balancers that groups register their instances with, by name."""
    images: dict[ImageName, ImageConfig] = Field(default_factory=dict)
    """Machine images the leader looks up, by name (`Image.<name>` in templates)."""
    certificates: dict[str, CertConfig] = Field(default_factory=dict)
    """Certificate templates, by name. `ca`, `agent` and `operator` are reserved names."""
    defaults: DefaultsConfig = DefaultsConfig()
    """What every template starts from."""
    templates: dict[str, TemplateConfig]
    """Instance templates, by name (may be empty)."""
    groups: dict[TenantName, dict[GroupName, GroupConfig]] = Field(default_factory=dict)
    """Static groups: tenant to group name to group."""
