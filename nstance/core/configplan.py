"""What a new shard config would do to each group, decided from config hashes and instance facts.

``plan_config_change`` compares each group's hashes under the current config with those under the new
one and says what the shard server would do after the upload (spec "Push Updates & Instance
Rotation"):

* runtime hash changed → **push files**: every active instance of the group gets regenerated files
  and the new hash; no VM is replaced;
* infra hash changed → **rotate N instances**: N is the number of active managed (not on-demand)
  instances whose recorded infra hash differs from the new one (and from the new config's legacy
  hash, which earlier versions of this project recorded: the reconciler keeps those), or, for an
  instance recorded without a hash, whose instance type or template differs from the new config's
  (``plan.visibly_differs``, the reconciler's rule); they are replaced one at a time;
* size changed → **resize a→b**;
* a group only in the new config → **new group** (its size is created);
* a group only in the current config → **removed group** (its active managed instances are deleted);
* otherwise **unchanged**.

Several of the first three can apply to one group at once. This module is pure: it reads nothing,
writes nothing and imports nothing outside ``nstance.core``; callers compute the hashes and gather
the instance facts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from nstance.core.ids import GroupKey
from nstance.core.plan import visibly_differs

"""``(tenant, group)``."""

INACTIVE_STATUSES = frozenset({"failed", "deleting", "deleted", "pending_deletion", "terminated"})
"""Instance record statuses of instances that are gone or leaving: they are neither pushed to,
rotated nor deleted by a config change."""


@dataclass(frozen=True, slots=True)
class GroupHashes:
    """One group's config hashes and desired size under one config."""

    runtime_hash: str
    infra_hash: str
    size: int
    #: The infra hash as earlier versions of this project computed it ("": unknown).
    legacy_infra_hash: str = ""
    #: The group's instance type and template, for instances recorded without a hash.
    instance_type: str = ""
    template: str = ""


@dataclass(frozen=True, slots=True)
class InstanceFacts:
    """What the plan needs to know about one instance (from its record)."""

    instance_id: str
    status: str = "pending"
    infra_hash: str = ""
    on_demand: bool = False
    #: What it runs ("": unknown); judged only when ``infra_hash`` is "".
    instance_type: str = ""
    template: str = ""

    @property
    def active(self) -> bool:
        """Whether the instance still runs or is being created (not failed, deleted or leaving)."""
        return self.status not in INACTIVE_STATUSES


class ChangeKind(StrEnum):
    """One effect of a config change on a group."""

    NEW_GROUP = "new_group"
    REMOVED_GROUP = "removed_group"
    PUSH_FILES = "push_files"
    ROTATE = "rotate"
    RESIZE = "resize"
    UNCHANGED = "unchanged"


@dataclass(frozen=True, slots=True)
class GroupChange:
    """What the new config does to one group.

    ``instances`` counts the group's active instances now (on-demand included); ``rotate`` the
    managed ones that would be replaced; ``delete`` the managed ones a removed group loses.
    """

    tenant: str
    group: str
    kinds: tuple[ChangeKind, ...]
    old_size: int | None
    new_size: int | None
    instances: int = 0
    rotate: int = 0
    delete: int = 0

    @property
    def key(self) -> GroupKey:
        return (self.tenant, self.group)

    @property
    def summary(self) -> str:
        """One line a person reads, e.g. ``push files to 3 instances; rotate 3 instances``."""
        parts: list[str] = []
        for kind in self.kinds:
            if kind is ChangeKind.NEW_GROUP:
                parts.append(f"new group (size {self.new_size})")
            elif kind is ChangeKind.REMOVED_GROUP:
                parts.append(f"removed group ({_instances(self.delete)} deleted)")
            elif kind is ChangeKind.PUSH_FILES:
                parts.append(f"push files to {_instances(self.instances)}")
            elif kind is ChangeKind.ROTATE:
                parts.append(f"rotate {_instances(self.rotate)}")
            elif kind is ChangeKind.RESIZE:
                parts.append(f"resize {self.old_size}→{self.new_size}")
            else:
                parts.append("unchanged")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``changes`` lists the kinds; ``summary`` is the human line)."""
        return {
            "tenant": self.tenant,
            "group": self.group,
            "changes": [kind.value for kind in self.kinds],
            "summary": self.summary,
            "old_size": self.old_size,
            "new_size": self.new_size,
            "instances": self.instances,
            "rotate": self.rotate,
            "delete": self.delete,
        }


def _instances(count: int) -> str:
    return f"{count} instance" if count == 1 else f"{count} instances"


def _one(
    key: GroupKey, old: GroupHashes | None, new: GroupHashes | None, members: Sequence[InstanceFacts]
) -> GroupChange:
    tenant, group = key
    active = [m for m in members if m.active]
    managed = [m for m in active if not m.on_demand]
    old_size = old.size if old else None
    new_size = new.size if new else None
    if new is None:
        kinds: tuple[ChangeKind, ...] = (ChangeKind.REMOVED_GROUP,)
        return GroupChange(tenant, group, kinds, old_size, new_size, len(active), delete=len(managed))
    if old is None:
        return GroupChange(tenant, group, (ChangeKind.NEW_GROUP,), old_size, new_size, len(active))
    found: list[ChangeKind] = []
    rotate = 0
    if old.runtime_hash != new.runtime_hash:
        found.append(ChangeKind.PUSH_FILES)
    if old.infra_hash != new.infra_hash:
        found.append(ChangeKind.ROTATE)
        rotate = sum(1 for m in managed if _drifted(m, new))
    if old.size != new.size:
        found.append(ChangeKind.RESIZE)
    kinds = tuple(found) or (ChangeKind.UNCHANGED,)
    return GroupChange(tenant, group, kinds, old_size, new_size, len(active), rotate=rotate)


def _drifted(member: InstanceFacts, new: GroupHashes) -> bool:
    """Whether the reconciler would rotate ``member`` under ``new`` (``plan.has_drifted``'s rule)."""
    if not member.infra_hash:
        return visibly_differs(member.instance_type, member.template, new.instance_type, new.template)
    return member.infra_hash not in {new.infra_hash, new.legacy_infra_hash} - {""}


def plan_config_change(
    old: Mapping[GroupKey, GroupHashes],
    new: Mapping[GroupKey, GroupHashes],
    instances: Mapping[GroupKey, Sequence[InstanceFacts]],
) -> list[GroupChange]:
    """One ``GroupChange`` per group in either config, sorted by (tenant, group).

    ``instances`` holds the instance facts per group; groups without an entry have no instances.
    Instances of groups in neither config are ignored (they are not this change's doing).
    """
    keys = sorted(set(old) | set(new))
    return [_one(key, old.get(key), new.get(key), instances.get(key, ())) for key in keys]
