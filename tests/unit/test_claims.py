"""Who claims a listed VM: foreign, claimed by an unreadable record, orphan, adoptable."""

from __future__ import annotations

from nstance.core.ids import new_instance_id
from nstance.providers.base import InstanceStatus, ProviderInstance
from nstance.server.reconcile.claims import Verdict, decide
from nstance.server.state.records import RecordProblem


def vm(**changes: object) -> ProviderInstance:
    values: dict[str, object] = {
        "instance_id": new_instance_id("web"),
        "provider_id": "i-0abc",
        "status": InstanceStatus.RUNNING,
        "cluster_id": "c1",
        "shard": "s1",
        "tenant": "default",
        "group": "web",
    }
    values.update(changes)
    return ProviderInstance(**values)  # type: ignore[arg-type]


def verdict(
    v: ProviderInstance, *, disclaimed: bool = False, unreadable: list[RecordProblem] | None = None
) -> Verdict:
    return decide(v, cluster_id="c1", shard="s1", disclaimed=disclaimed, unreadable=unreadable or []).verdict


def test_a_vm_not_tagged_for_this_shard_is_never_touched() -> None:
    assert verdict(vm(shard="s2")) is Verdict.FOREIGN
    assert verdict(vm(cluster_id="other"), disclaimed=True) is Verdict.FOREIGN
    assert verdict(vm(instance_id="not-an-id"), disclaimed=True) is Verdict.FOREIGN


def test_an_unreadable_record_claims_by_key_or_by_the_ids_in_its_bytes() -> None:
    v = vm()
    by_key = RecordProblem("bad", key="instance/x.json", tenant="default", instance_id=v.instance_id)
    by_bytes = RecordProblem("bad", key="instance/junk.json", raw=b'{"provider_instance_id": "i-0abc", ')
    other = RecordProblem("bad", key="instance/y.json", raw=b"")
    assert verdict(v, disclaimed=True, unreadable=[by_key]) is Verdict.CLAIMED
    assert verdict(v, disclaimed=True, unreadable=[other, by_bytes]) is Verdict.CLAIMED
    assert verdict(v, disclaimed=True, unreadable=[other]) is Verdict.ORPHAN


def test_a_vm_no_record_mentions_is_adopted_when_its_tags_allow() -> None:
    assert verdict(vm()) is Verdict.ADOPT
    assert verdict(vm(tenant="")) is Verdict.UNADOPTABLE
    assert verdict(vm(group="Bad Group")) is Verdict.UNADOPTABLE
