"""The config-change planner: which groups push files, rotate, resize, appear or disappear."""

from __future__ import annotations

from nstance.core.configplan import (
    ChangeKind,
    GroupChange,
    GroupHashes,
    GroupKey,
    InstanceFacts,
    plan_config_change,
)

WEB: GroupKey = ("default", "web")
OLD = GroupHashes(runtime_hash="sha256:r1", infra_hash="sha256:i1", size=3)


def _members(count: int, *, infra: str = "sha256:i1", on_demand: bool = False) -> list[InstanceFacts]:
    return [
        InstanceFacts(f"app{index:023d}", status="running", infra_hash=infra, on_demand=on_demand)
        for index in range(count)
    ]


def _only(changes: list[GroupChange]) -> GroupChange:
    assert len(changes) == 1
    return changes[0]


def test_var_change_pushes_files_and_replaces_nothing() -> None:
    new = GroupHashes("sha256:r2", OLD.infra_hash, OLD.size)
    change = _only(plan_config_change({WEB: OLD}, {WEB: new}, {WEB: _members(3)}))
    assert change.kinds == (ChangeKind.PUSH_FILES,)
    assert change.rotate == 0
    assert change.summary == "push files to 3 instances"


def test_instance_type_change_rotates_every_active_managed_instance() -> None:
    new = GroupHashes(OLD.runtime_hash, "sha256:i2", OLD.size)
    members = [
        *_members(3),
        InstanceFacts("gone", status="deleted", infra_hash="sha256:i1"),
        InstanceFacts("broken", status="failed", infra_hash="sha256:i1"),
        InstanceFacts("adhoc", status="running", infra_hash="sha256:i1", on_demand=True),
    ]
    change = _only(plan_config_change({WEB: OLD}, {WEB: new}, {WEB: members}))
    assert change.kinds == (ChangeKind.ROTATE,)
    assert change.rotate == 3
    assert change.instances == 4  # on-demand counts as active, but is never rotated
    assert change.summary == "rotate 3 instances"


def test_instances_already_on_the_new_infra_hash_are_not_counted() -> None:
    new = GroupHashes(OLD.runtime_hash, "sha256:i2", OLD.size)
    members = [*_members(2), *_members(1, infra="sha256:i2")]
    change = _only(plan_config_change({WEB: OLD}, {WEB: new}, {WEB: members}))
    assert change.rotate == 2


def test_instances_recorded_with_the_new_configs_legacy_hash_are_not_counted() -> None:
    # Earlier versions of this project recorded the legacy hash; the reconciler keeps such instances.
    new = GroupHashes(OLD.runtime_hash, "sha256:i2", OLD.size, legacy_infra_hash="sha256:legacy-i2")
    members = [*_members(2), *_members(1, infra="sha256:legacy-i2")]
    change = _only(plan_config_change({WEB: OLD}, {WEB: new}, {WEB: members}))
    assert change.rotate == 2


def test_instances_recorded_without_a_hash_are_counted_when_their_instance_type_differs() -> None:
    # The reconciler's rule (plan.visibly_differs): a record without a hash (a VM adopted from its
    # tags) rotates when what is known of it is not the new config's, and only then.
    new = GroupHashes(OLD.runtime_hash, "sha256:i2", OLD.size, instance_type="m7i.xlarge", template="app")
    members = [
        InstanceFacts("adopted-old", status="running", instance_type="m7i.large", template="app"),
        InstanceFacts("adopted-new", status="running", instance_type="m7i.xlarge", template="app"),
        InstanceFacts("unknown", status="running"),
    ]
    change = _only(plan_config_change({WEB: OLD}, {WEB: new}, {WEB: members}))
    assert change.rotate == 1


def test_size_change_resizes() -> None:
    new = GroupHashes(OLD.runtime_hash, OLD.infra_hash, 5)
    change = _only(plan_config_change({WEB: OLD}, {WEB: new}, {WEB: _members(3)}))
    assert change.kinds == (ChangeKind.RESIZE,)
    assert (change.old_size, change.new_size) == (3, 5)
    assert change.summary == "resize 3→5"


def test_several_effects_on_one_group_are_all_listed() -> None:
    new = GroupHashes("sha256:r2", "sha256:i2", 1)
    change = _only(plan_config_change({WEB: OLD}, {WEB: new}, {WEB: _members(1)}))
    assert change.kinds == (ChangeKind.PUSH_FILES, ChangeKind.ROTATE, ChangeKind.RESIZE)
    assert change.summary == "push files to 1 instance; rotate 1 instance; resize 3→1"


def test_new_and_removed_groups() -> None:
    batch: GroupKey = ("team-b", "batch")
    new_group = GroupHashes("sha256:r9", "sha256:i9", 2)
    members = {WEB: [*_members(2), InstanceFacts("x", status="deleting"), *_members(1, on_demand=True)]}
    changes = plan_config_change({WEB: OLD}, {batch: new_group}, members)
    assert [c.key for c in changes] == [WEB, batch]
    removed, added = changes
    assert removed.kinds == (ChangeKind.REMOVED_GROUP,)
    assert removed.delete == 2
    assert removed.summary == "removed group (2 instances deleted)"
    assert added.kinds == (ChangeKind.NEW_GROUP,)
    assert added.summary == "new group (size 2)"
    assert added.to_dict()["changes"] == ["new_group"]


def test_unchanged_group_and_json_form() -> None:
    change = _only(plan_config_change({WEB: OLD}, {WEB: OLD}, {}))
    assert change.kinds == (ChangeKind.UNCHANGED,)
    assert change.to_dict() == {
        "tenant": "default",
        "group": "web",
        "changes": ["unchanged"],
        "summary": "unchanged",
        "old_size": 3,
        "new_size": 3,
        "instances": 0,
        "rotate": 0,
        "delete": 0,
    }


def test_instances_of_groups_in_neither_config_are_ignored() -> None:
    assert plan_config_change({}, {}, {WEB: _members(2)}) == []
