"""A shard on Compute Engine (the GCE REST fake): upstream v1's instance-group load balancer end to end.

The same in-process harness as ``test_shard_cloud_features`` (real SQLite, injected clock), but the
provider is the real ``GcpProvider`` on google-cloud-compute talking to ``nstance.testing.gcefake``,
and the load balancer is upstream v1's shape as a v1 config wrote it (``provider: "gcp"`` with
``backend_service_name`` and ``instance_group_name``): VMs join the unmanaged instance group once
their agents report, and a scale-down takes the VM out of the group before it deletes it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials
from shard_helpers import no_sleep
from test_shard_cloud_features import Harness

from nstance.config import GroupUpdate
from nstance.core.backoff import Backoff
from nstance.core.clock import ManualClock
from nstance.providers.gcp import GcpProvider
from nstance.testing.gcefake import GceFake

ZONE = "us-central1-a"


@pytest.fixture
def fake() -> Iterator[GceFake]:
    with GceFake(project="proj-1", zones=(ZONE,)) as running:
        running.add_subnetwork("workers", cidr="10.20.0.0/24")
        running.add_instance_group("web-ig", named_ports={"http": 30080})
        yield running


def _harness(tmp_path: Path, fake: GceFake) -> Harness:
    clock = ManualClock()
    return Harness(
        tmp_path,
        infra={"provider": "gcp"},
        template_extra={
            "instance_type": "e2-medium",
            "args": {"SourceImage": "projects/debian-cloud/global/images/family/debian-12"},
        },
        config_extra={
            "load_balancers": {
                "web-lb": {
                    "provider": "gcp",
                    "backend_service_name": "web-backend",
                    "instance_group_name": "web-ig",
                }
            },
        },
        shard_extra={"subnet_pools": {"default": ["workers"]}},
        provider=GcpProvider(
            project=fake.project,
            zone=ZONE,
            clock=clock,
            endpoint=fake.endpoint,
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            sleep=no_sleep,
            backoff=Backoff(base=0.01, cap=0.02, rng=random.Random(1)),
        ),
        clock=clock,
    )


async def test_a_shard_on_gce_keeps_a_v1_instance_group_in_step_with_its_group(
    tmp_path: Path, fake: GceFake
) -> None:
    h = _harness(tmp_path, fake)
    try:
        await h.reconcile()
        rows = h.rows()
        assert len(rows) == 2
        assert fake.instance_group_members("web-ig") == []  # not before the agents report

        await h.report(*(r.id for r in rows))
        assert sorted(fake.instance_group_members("web-ig")) == sorted(r.id for r in rows)

        await h.shard.upsert_group("default", "web", GroupUpdate(size=1))
        await h.reconcile()
        (kept,) = h.rows()
        assert fake.instance_group_members("web-ig") == [kept.id]
        assert [vm["name"] for vm in fake.instances()] == [kept.id]
        methods = [c.method for c in fake.calls()]
        assert "instanceGroups.removeInstances" in methods, "taken out of the group, not only deleted"
        assert methods.index("instanceGroups.removeInstances") < methods.index("instances.delete")
        assert h.errors == []
    finally:
        h.db.close()
        await h.ctx.provider.close()
