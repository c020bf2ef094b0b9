"""The data a userdata/args/file/certificate template sees, as typed dataclasses.

Field names are Python style here; ``TemplateData.go_data()`` exposes them under upstream's Go
names (``.Instance.ID``, ``.Cluster.CACert``, ``.Server.RegistrationAddr``, ``.Provider.Zone``,
``.Vars.<name>``, ``.Image.<name>``, ``.Nonce``): structs whose unknown fields are errors, and maps
(``Vars``, whose missing keys are empty strings as Go's ``missingkey=zero`` makes them, and ``Image``,
whose missing keys are errors naming the image: an unresolved image must stop a create with its
reason rather than launch a VM without one). Pure data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nstance.config.goexec import GoStruct, RequiredKeys


@dataclass(frozen=True, slots=True)
class InstanceData:
    """``Instance.*``: the instance being created or configured."""

    id: str = ""
    kind: str = ""
    arch: str = ""
    instance_type: str = ""
    hostname: str = ""
    fqdn: str = ""
    ip4: str = ""
    ip6: str = ""


@dataclass(frozen=True, slots=True)
class ClusterData:
    """``Cluster.*``."""

    id: str = ""
    ca_cert: str = ""


@dataclass(frozen=True, slots=True)
class ServerData:
    """``Server.*``: where the agent reaches its shard server."""

    shard: str = ""
    registration_addr: str = ""
    agent_addr: str = ""
    operator_addr: str = ""


@dataclass(frozen=True, slots=True)
class ProviderData:
    """``Provider.*``."""

    kind: str = ""
    region: str = ""
    zone: str = ""


@dataclass(frozen=True, slots=True)
class TemplateData:
    """Everything a template may reference."""

    instance: InstanceData = field(default_factory=InstanceData)
    cluster: ClusterData = field(default_factory=ClusterData)
    server: ServerData = field(default_factory=ServerData)
    provider: ProviderData = field(default_factory=ProviderData)
    vars: Mapping[str, str] = field(default_factory=dict)
    image: Mapping[str, str] = field(default_factory=dict)
    nonce: str = ""

    def go_data(self) -> GoStruct:
        """The template's root value under upstream's (Go) field names."""
        i, c, s, p = self.instance, self.cluster, self.server, self.provider
        instance = {"ID": i.id, "Kind": i.kind, "Arch": i.arch, "Type": i.instance_type,
                    "Hostname": i.hostname, "FQDN": i.fqdn, "IP4": i.ip4, "IP6": i.ip6}  # fmt: skip
        server = {"Shard": s.shard, "RegistrationAddr": s.registration_addr, "AgentAddr": s.agent_addr,
                  "OperatorAddr": s.operator_addr}  # fmt: skip
        return GoStruct(
            "TemplateData",
            {
                "Instance": GoStruct("InstanceData", instance),
                "Cluster": GoStruct("ClusterData", {"ID": c.id, "CACert": c.ca_cert}),
                "Server": GoStruct("ServerData", server),
                "Provider": GoStruct("ProviderData", {"Kind": p.kind, "Region": p.region, "Zone": p.zone}),
                "Vars": dict(self.vars),
                "Image": RequiredKeys("Image", self.image),
                "Nonce": self.nonce,
            },
        )
