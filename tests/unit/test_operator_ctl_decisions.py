"""Pure decisions of the operator's controllers: shard choice, instance-ID kind, pool aggregation."""

from __future__ import annotations

from typing import Any

import pytest

from nstance.operator.controllers.machine.placement import (
    NoShard,
    choose_shard,
    expected_kind,
    instance_kind,
    shard_counts,
)
from nstance.operator.controllers.machinepool.check_duplicate_group import group_owner
from nstance.operator.controllers.machinepool.update_status import aggregate
from nstance.operator.controllers.ondemand.names import machine_name, on_demand_group, on_demand_instance_type
from nstance.operator.controllers.ondemand.pin_pod import pin_patch

CONFIGURED = ["zone-a", "zone-b", "zone-c"]


def test_the_failure_domain_wins_when_configured() -> None:
    assert choose_shard(CONFIGURED, [], {}, "zone-c") == "zone-c"


def test_an_unconfigured_failure_domain_is_refused_by_name() -> None:
    with pytest.raises(NoShard, match="'zone-x' is not a configured shard"):
        choose_shard(CONFIGURED, CONFIGURED, {}, "zone-x")


def test_the_reachable_shard_with_fewest_machines_is_chosen_ties_in_config_order() -> None:
    assert choose_shard(CONFIGURED, CONFIGURED, {"zone-a": 2, "zone-b": 1, "zone-c": 1}) == "zone-b"
    assert choose_shard(CONFIGURED, CONFIGURED, {}) == "zone-a"
    # zone-b has fewest but does not answer: never "any" shard.
    assert choose_shard(CONFIGURED, ["zone-a", "zone-c"], {"zone-a": 5, "zone-b": 0, "zone-c": 6}) == "zone-a"


def test_no_reachable_shard_is_an_error() -> None:
    with pytest.raises(NoShard, match="no configured shard is reachable"):
        choose_shard(CONFIGURED, [], {})


def machine(group: str, instance_id: str = "", shard: str = "") -> dict[str, Any]:
    return {"spec": {"group": group}, "status": {"instanceID": instance_id, "shard": shard}}


def test_the_kind_of_an_earlier_instance_of_the_group_is_reused() -> None:
    machines = [
        machine("other", "gpu01h0000000000000000000000"),
        machine("web", "app01h0000000000000000000000"),
    ]
    assert instance_kind(machines, "web") == "app"
    assert instance_kind(machines, "batch") == "ins"


def test_the_expected_kind_is_read_from_the_servers_refusal() -> None:
    message = (
        "instance_id 'ins06h0jtn6pxta745kbvczahtrdc' has prefix 'ins', but template \"app\" creates "
        'instances of kind "app"'
    )
    assert expected_kind(message) == "app"
    assert expected_kind('group "web" of tenant "default" does not exist') is None


def test_machines_are_counted_per_shard() -> None:
    counts = shard_counts([machine("w", shard="zone-a"), machine("w", shard="zone-a"), machine("w")])
    assert counts == {"zone-a": 2}


def test_the_oldest_pool_owns_a_group() -> None:
    def pool(name: str, created: str, group: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created},
            "spec": {"group": group},
        }

    pools = [pool("new", "2026-01-02T00:00:00Z", "g"), pool("old", "2026-01-01T00:00:00Z", "g")]
    owner = group_owner(pools, "g")
    assert owner is not None
    assert owner["metadata"]["name"] == "old"
    assert group_owner(pools, "h") is None


def shard_group(replicas: int, ready: bool, ids: list[str], *, static: bool = False) -> dict[str, Any]:
    condition = {"type": "Ready", "status": "True" if ready else "False", "reason": "R", "message": "m"}
    return {
        "status": {
            "replicas": replicas,
            "isStatic": static,
            "providerIDs": ids,
            "config": {"template": "app", "subnetPool": "default"},
            "conditions": [condition],
        }
    }


def test_the_pool_aggregates_its_shard_groups() -> None:
    result = aggregate(
        ["zone-a", "zone-b"],
        {
            "zone-a": shard_group(2, True, ["i-2", "i-1"]),
            "zone-b": shard_group(1, True, ["i-0"], static=True),
        },
    )
    assert result.replicas == 3
    assert result.ready
    assert result.is_static
    assert result.provider_ids == ["i-0", "i-1", "i-2"]
    assert (result.template, result.subnet_pool) == ("app", "default")


def test_the_pool_is_not_ready_and_says_which_shard_waits() -> None:
    result = aggregate(["zone-a", "zone-b"], {"zone-a": shard_group(2, False, [])})
    assert not result.ready
    assert result.waiting == ["zone-a (R: m)", "zone-b (no shard group yet)"]


def test_both_on_demand_annotation_spellings_are_read() -> None:
    documented = {"metadata": {"annotations": {"on-demand.nstance.dev/group": "gpu"}}}
    upstream = {
        "metadata": {
            "annotations": {
                "nstance.dev/on-demand-group": "gpu",
                "nstance.dev/on-demand-instance-type": "g5.xlarge",
            }
        }
    }
    assert on_demand_group(documented) == on_demand_group(upstream) == "gpu"
    assert on_demand_instance_type(upstream) == "g5.xlarge"


def test_machine_names_stay_within_kubernetes_limits() -> None:
    assert machine_name("job") == "on-demand-job"
    long = machine_name("p" * 250)
    assert len(long) == 253
    assert long != machine_name("p" * 249 + "q")


def test_pinning_selects_the_node_and_drops_only_our_gate() -> None:
    pod = {
        "metadata": {"resourceVersion": "7"},
        "spec": {"schedulingGates": [{"name": "nstance.dev/on-demand"}, {"name": "other/gate"}]},
    }
    ops = pin_patch(pod, "node-1")
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert {"op": "add", "path": "/spec/nodeSelector", "value": {"kubernetes.io/hostname": "node-1"}} in ops
    assert {"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": "other/gate"}]} in ops
