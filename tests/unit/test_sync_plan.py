"""The sync manager's pure decisions: aggregation across shards, import bodies, shard-group status."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nstance.operator.crds import names
from nstance.operator.crds.models import InvalidResource, NstanceMachinePool
from nstance.operator.sync_plan import (
    AggregatedGroup,
    GroupState,
    ShardObservation,
    aggregate,
    capi_machine_pool,
    existing_pool_groups,
    name_problem,
    nstance_machine_pool,
    pools_to_create,
    shard_group_status_patch,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def state(key: str, **fields: object) -> GroupState:
    return GroupState(key=key, **fields)  # type: ignore[arg-type]


def test_groups_with_one_key_are_summed_across_shards_in_config_order() -> None:
    cache = {
        "zone-b": {"web": state("web", size=2, provider_ids=("i-9", "i-1"), template="app")},
        "zone-a": {
            "web": state("web", size=3, provider_ids=("i-5",), is_static=True, template="app"),
            "jobs": state("jobs", size=1),
        },
    }
    groups = aggregate(cache, ["zone-a", "zone-b"])
    assert [g.key for g in groups] == ["jobs", "web"]
    web = groups[1]
    assert web.shards == ("zone-a", "zone-b")
    assert web.replicas == 5
    assert web.provider_ids == ("i-1", "i-5", "i-9")
    assert web.is_static
    assert web.conflicts == ()
    assert groups[0].shards == ("zone-a",)


def test_shards_no_longer_configured_are_left_out() -> None:
    cache = {"zone-a": {"web": state("web", size=3)}, "gone": {"web": state("web", size=7)}}
    (web,) = aggregate(cache, ["zone-a"])
    assert web.replicas == 3
    assert web.shards == ("zone-a",)


def test_disagreeing_shards_keep_the_first_value_and_say_so() -> None:
    cache = {
        "zone-a": {"web": state("web", template="", instance_type="small", vars={"tier": "a", "x": "1"})},
        "zone-b": {"web": state("web", template="app", instance_type="large", vars={"tier": "b", "y": "2"})},
    }
    (web,) = aggregate(cache, ["zone-a", "zone-b"])
    assert web.template == "app"  # the first shard that sets it
    assert web.instance_type == "small"
    assert dict(web.vars) == {"tier": "a", "x": "1", "y": "2"}
    assert any(
        "instance_type is 'small' on shard zone-a but 'large' on shard zone-b" in c for c in web.conflicts
    )
    assert any("var tier" in c for c in web.conflicts)


def test_negative_sizes_never_lower_the_sum() -> None:
    cache = {"a": {"web": state("web", size=-1)}, "b": {"web": state("web", size=2)}}
    assert aggregate(cache, ["a", "b"])[0].replicas == 2


@pytest.mark.parametrize(
    ("key", "ok"),
    [("web", True), ("web-1", True), ("Web", False), ("a--b", False), ("x" * 64, False), ("-web", False)],
)
def test_group_keys_must_be_valid_object_names(key: str, ok: bool) -> None:
    problem = name_problem(key)
    assert (problem is None) is ok
    if not ok:
        assert repr(key) in str(problem)


def test_only_groups_without_a_pool_are_created() -> None:
    pools: list[dict[str, Any]] = [{"spec": {"group": "web"}}, {"spec": {}}, {"metadata": {"name": "odd"}}]
    existing = existing_pool_groups(pools)
    assert existing == {"web"}
    groups = aggregate({"a": {"web": state("web"), "jobs": state("jobs")}}, ["a"])
    assert [g.key for g in pools_to_create(groups, existing)] == ["jobs"]


def group(**overrides: object) -> AggregatedGroup:
    base: dict[str, object] = {
        "key": "web",
        "shards": ("zone-a", "zone-b"),
        "replicas": 5,
        "provider_ids": ("i-1", "i-2"),
        "is_static": False,
        "template": "app",
        "instance_type": "small",
        "subnet_pool": "default",
        "vars": {"role": "web"},
    }
    base.update(overrides)
    return AggregatedGroup(**base)  # type: ignore[arg-type]


def test_capi_machine_pool_carries_the_summed_replicas_and_references_the_nstance_pool() -> None:
    body = capi_machine_pool(group(), namespace="ns", cluster_name="c1--default")
    assert body["apiVersion"] == "cluster.x-k8s.io/v1beta2"
    assert body["kind"] == "MachinePool"
    assert body["metadata"]["name"] == "web"
    assert body["metadata"]["namespace"] == "ns"
    assert body["metadata"]["annotations"] == {names.MANAGED_BY_ANNOTATION: names.MANAGED_BY_VALUE}
    spec = body["spec"]
    assert spec["clusterName"] == "c1--default"
    assert spec["replicas"] == 5
    assert spec["template"]["spec"] == {
        "clusterName": "c1--default",
        "bootstrap": {"dataSecretName": ""},
        "infrastructureRef": {"apiGroup": names.GROUP, "kind": "NstanceMachinePool", "name": "web"},
    }


def test_dynamic_pool_imports_template_and_subnet_pool_static_pool_does_not() -> None:
    dynamic = nstance_machine_pool(group(), namespace="ns", cluster_name="c")
    assert dynamic["spec"] == {
        "group": "web",
        "shards": ["zone-a", "zone-b"],
        "template": "app",
        "subnetPool": "default",
        "instanceType": "small",
        "vars": {"role": "web"},
        "providerIDList": ["i-1", "i-2"],
    }
    assert dynamic["metadata"]["annotations"][names.MANAGED_BY_ANNOTATION] == names.MANAGED_BY_VALUE
    NstanceMachinePool.from_k8s(dynamic)
    static = nstance_machine_pool(
        group(is_static=True, vars={}, provider_ids=()), namespace="ns", cluster_name="c"
    )
    assert static["spec"] == {"group": "web", "shards": ["zone-a", "zone-b"], "instanceType": "small"}


def test_a_pool_the_crd_would_refuse_is_reported_with_the_field() -> None:
    with pytest.raises(InvalidResource, match="subnetPool"):
        nstance_machine_pool(group(subnet_pool="Not_Valid"), namespace="ns", cluster_name="c")


def shard_group(status: dict[str, object] | None = None) -> dict[str, object]:
    return {"metadata": {"name": "web--zone-a", "resourceVersion": "17"}, "status": status or {}}


def test_status_patch_sets_counts_and_reachability_once() -> None:
    observed = ShardObservation(
        True, state("web", actual_size=2, provider_ids=("i-9", "i-1"), is_static=True)
    )
    patch = shard_group_status_patch(shard_group(), observed, shard="zone-a", now=NOW)
    assert patch is not None
    assert patch["metadata"] == {"resourceVersion": "17"}
    status = patch["status"]
    assert status["replicas"] == 2
    assert status["providerIDs"] == ["i-1", "i-9"]
    assert status["isStatic"] is True
    assert status["lastSyncTime"] == "2026-03-01T12:00:00Z"
    (condition,) = status["conditions"]
    assert condition["type"] == names.SHARD_REACHABLE
    assert condition["status"] == "True"
    # Written back, the same observation changes nothing: no write.
    current = shard_group({k: v for k, v in status.items() if k != "lastSyncTime"})
    assert shard_group_status_patch(current, observed, shard="zone-a", now=NOW + timedelta(minutes=1)) is None


def test_a_group_missing_on_a_reachable_shard_reads_as_zero() -> None:
    current = shard_group({"replicas": 3, "providerIDs": ["a", "b", "c"], "isStatic": True})
    patch = shard_group_status_patch(current, ShardObservation(True, None), shard="zone-a", now=NOW)
    assert patch is not None
    assert patch["status"]["replicas"] == 0
    assert patch["status"]["providerIDs"] == []
    assert "isStatic" not in patch["status"]  # unknown without the group: left alone


def test_lost_stream_only_flips_the_condition_and_keeps_the_counts() -> None:
    reachable = shard_group_status_patch(
        shard_group(),
        ShardObservation(True, state("web", actual_size=1, provider_ids=("i",))),
        shard="a",
        now=NOW,
    )
    assert reachable is not None
    current = shard_group(reachable["status"])
    lost = ShardObservation(False, error="UNAVAILABLE: connection refused")
    patch = shard_group_status_patch(current, lost, shard="zone-a", now=NOW + timedelta(seconds=5))
    assert patch is not None
    assert set(patch["status"]) == {"conditions"}
    (condition,) = patch["status"]["conditions"]
    assert condition["status"] == "False"
    assert condition["reason"] == "StreamLost"
    assert "UNAVAILABLE: connection refused" in condition["message"]
    assert condition["lastTransitionTime"] == "2026-03-01T12:00:05Z"
    again = shard_group(patch["status"])
    assert shard_group_status_patch(again, lost, shard="zone-a", now=NOW + timedelta(seconds=9)) is None


def test_a_true_condition_from_another_controller_is_not_rewritten() -> None:
    conditions = [
        {"type": names.READY, "status": "True", "reason": "SyncSucceeded", "lastTransitionTime": "x"},
        {
            "type": names.SHARD_REACHABLE,
            "status": "True",
            "reason": "UpsertSucceeded",
            "lastTransitionTime": "x",
        },
    ]
    current = shard_group({"replicas": 0, "providerIDs": [], "conditions": conditions})
    assert shard_group_status_patch(current, ShardObservation(True, None), shard="zone-a", now=NOW) is None
