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
from nstance.config.workloads import DefaultsConfig, GroupConfig, TemplateConfig

DynamicGroups = dict[str, dict[str, GroupConfig]]
"""Dynamic groups as stored in ``groups.jsonc``: tenant → group → GroupConfig."""

UNSUPPORTED_SECTIONS: dict[str, str] = {
    "nat": "Nstance-managed NAT",
    "tunnels": "tunnel pods",
}


class ServerConfig(StrictModel):
    """One shard server's static configuration."""

    cluster: ClusterConfig
    shard: ShardConfig
    load_balancers: dict[str, LoadBalancerConfig] = Field(default_factory=dict)
    images: dict[ImageName, ImageConfig] = Field(default_factory=dict)
    certificates: dict[str, CertConfig] = Field(default_factory=dict)
    defaults: DefaultsConfig = DefaultsConfig()
    templates: dict[str, TemplateConfig]
    groups: dict[TenantName, dict[GroupName, GroupConfig]] = Field(default_factory=dict)
