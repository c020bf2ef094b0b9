"""The data a userdata/args/file/certificate template sees, as typed dataclasses.

Field names are Python style here; ``TemplateData.context()`` exposes them under upstream's Go
names (``Instance.ID``, ``Cluster.CACert``, ``Server.RegistrationAddr``, ``Provider.Zone``,
``Vars.<name>``, ``Image.<name>``, ``Nonce``) so existing templates keep working. Pure data.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field


class Namespace:
    """A read-only name → value lookup that knows its own path (``Vars``) for error messages.

    It deliberately has no public attributes or methods, so a key such as ``items`` or ``keys``
    is always the user's value and never a Python method.
    """

    __slots__ = ("_data", "_path")

    def __init__(self, path: str, data: Mapping[str, object]) -> None:
        self._path = path
        self._data = dict(data)

    @property
    def path(self) -> str:
        return self._path

    def __getitem__(self, key: object) -> object:
        if not isinstance(key, str):
            raise KeyError(key)
        return self._data[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._data))

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"<{self._path}>"


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

    def context(self) -> dict[str, object]:
        """The template context under upstream's (Go) names."""
        i, c, s, p = self.instance, self.cluster, self.server, self.provider
        return {
            "Instance": Namespace(
                "Instance",
                {
                    "ID": i.id,
                    "Kind": i.kind,
                    "Arch": i.arch,
                    "Type": i.instance_type,
                    "Hostname": i.hostname,
                    "FQDN": i.fqdn,
                    "IP4": i.ip4,
                    "IP6": i.ip6,
                },
            ),
            "Cluster": Namespace("Cluster", {"ID": c.id, "CACert": c.ca_cert}),
            "Server": Namespace(
                "Server",
                {
                    "Shard": s.shard,
                    "RegistrationAddr": s.registration_addr,
                    "AgentAddr": s.agent_addr,
                    "OperatorAddr": s.operator_addr,
                },
            ),
            "Provider": Namespace("Provider", {"Kind": p.kind, "Region": p.region, "Zone": p.zone}),
            "Vars": Namespace("Vars", self.vars),
            "Image": Namespace("Image", self.image),
            "Nonce": self.nonce,
        }
