"""Server metrics: what an operator scraping /metrics sees for instances, leadership and provider calls."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest

from nstance.providers.base import (
    CreateRequest,
    InstanceNotFound,
    InstanceStatus,
    ProviderInstance,
    ProviderThrottled,
)
from nstance.server.state.metrics import InstrumentedProvider, Metrics, watch_event_loop_lag
from nstance.testing.waiting import eventually


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_set_instances_replaces_series_and_drops_vanished_label_sets() -> None:
    metrics = Metrics()
    metrics.set_instances({("acme", "web", "running"): 3, ("acme", "db", "pending"): 1})
    assert sample(metrics, "nstance_instances", tenant="acme", group="web", state="running") == 3
    assert sample(metrics, "nstance_instances", tenant="acme", group="db", state="pending") == 1

    metrics.set_instances({("acme", "web", "running"): 2, ("acme", "web", "draining"): 1})

    assert sample(metrics, "nstance_instances", tenant="acme", group="web", state="running") == 2
    assert sample(metrics, "nstance_instances", tenant="acme", group="web", state="draining") == 1
    assert sample(metrics, "nstance_instances", tenant="acme", group="db", state="pending") is None
    text = metrics.render().decode()
    assert 'group="db"' not in text

    metrics.set_instances({})
    assert "nstance_instances{" not in metrics.render().decode()


def test_registries_are_independent_per_server() -> None:
    a, b = Metrics(), Metrics()
    a.set_leader("shard", True)
    a.set_config_loaded(True)
    a.record_rpc("nstance.v1.OperatorService/ListGroups", "OK")
    assert sample(a, "nstance_leader", scope="shard") == 1
    assert sample(b, "nstance_leader", scope="shard") == 0
    assert sample(b, "nstance_leader", scope="cluster") == 0
    assert sample(a, "nstance_config_loaded") == 1
    assert sample(b, "nstance_config_loaded") == 0
    assert sample(b, "nstance_rpc_total", method="nstance.v1.OperatorService/ListGroups", code="OK") is None


def test_render_exposes_every_metric_family() -> None:
    metrics = Metrics()
    metrics.set_reconcile_queue_depth(4)
    metrics.record_reconcile("ok")
    text = metrics.render().decode()
    for name in (
        "nstance_instances",
        "nstance_reconcile_queue_depth 4.0",
        "nstance_provider_call_seconds",
        "nstance_provider_call_errors_total",
        "nstance_rpc_total",
        'nstance_leader{scope="cluster"} 0.0',
        "nstance_config_loaded 0.0",
        'nstance_reconcile_total{result="ok"} 1.0',
        "nstance_provider_creates_total 0.0",
    ):
        assert name in text


def test_leader_changes_count_each_acquisition_once() -> None:
    metrics = Metrics()
    for leading in (True, True, False, True):
        metrics.set_leader("shard", leading)
    assert sample(metrics, "nstance_leader_changes_total", scope="shard") == 2
    assert sample(metrics, "nstance_leader_changes_total", scope="cluster") == 0


def test_only_replacing_retirements_count_as_replacements() -> None:
    metrics = Metrics()
    for reason in ("unhealthy", "config-drift", "unhealthy", "scale-down", "drain-complete", "group-deleted"):
        metrics.record_retirement(reason)
    assert sample(metrics, "nstance_replacements_total", reason="unhealthy") == 2
    assert sample(metrics, "nstance_replacements_total", reason="config-drift") == 1
    assert sample(metrics, "nstance_replacements_total", reason="scale-down") is None


async def test_event_loop_lag_is_measured_until_stopped() -> None:
    metrics = Metrics()
    stop = asyncio.Event()
    task = asyncio.create_task(watch_event_loop_lag(metrics, stop, interval=0.01))
    await asyncio.sleep(0.05)
    time.sleep(0.3)  # noqa: ASYNC251 - blocks the loop on purpose: the next tick wakes late
    await eventually(
        lambda: (
            (sample(metrics, "nstance_event_loop_lag_seconds_bucket", le="0.1") or 0)
            < (sample(metrics, "nstance_event_loop_lag_seconds_count") or 0)
        ),
        what="a tick later than 0.1 s to be recorded",
    )
    stop.set()
    await asyncio.wait_for(task, 5)


def test_unknown_leader_scope_is_refused() -> None:
    with pytest.raises(ValueError, match="shard, cluster"):
        Metrics().set_leader("zone", True)


# --- InstrumentedProvider ---------------------------------------------------------------------------


class FakeProvider:
    """Answers get_instance with InstanceNotFound for unknown ids; list_instances can be throttled."""

    def __init__(self) -> None:
        self.throttled = False
        self.closed = False
        self.created: list[str] = []

    @property
    def kind(self) -> str:
        return "fake"

    async def create_instance(self, request: CreateRequest) -> ProviderInstance:
        await asyncio.sleep(0.02)  # a provider call that takes measurable time
        self.created.append(request.instance_id)
        return ProviderInstance(request.instance_id, "vm-1", InstanceStatus.PENDING)

    async def delete_instance(self, instance_id: str, provider_id: str) -> None:
        return None

    async def get_instance(self, instance_id: str, provider_id: str) -> ProviderInstance:
        raise InstanceNotFound(f"no VM {provider_id}")

    async def list_instances(self, cluster_id: str, shard: str) -> list[ProviderInstance]:
        if self.throttled:
            raise ProviderThrottled("slow down")
        return []

    async def check_subnet_capacity(self, subnet_id: str) -> bool:
        return True

    async def close(self) -> None:
        self.closed = True


def _request() -> CreateRequest:
    return CreateRequest(
        cluster_id="c1",
        shard="s1",
        tenant="acme",
        group="web",
        template="knd",
        kind="knd",
        instance_id="knd-1",
        instance_type="small",
        subnet_id="subnet-1",
        arch="amd64",
        userdata=b"",
        idempotency_token="tok",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


async def test_instrumented_provider_records_latency() -> None:
    metrics = Metrics()
    inner = FakeProvider()
    provider = InstrumentedProvider(inner, metrics)

    instance = await provider.create_instance(_request())

    assert instance.provider_id == "vm-1"
    assert inner.created == ["knd-1"]
    assert provider.kind == "fake"
    labels = {"provider": "fake", "method": "create_instance"}
    assert sample(metrics, "nstance_provider_call_seconds_count", **labels) == 1
    total = sample(metrics, "nstance_provider_call_seconds_sum", **labels)
    assert total is not None
    assert 0.015 <= total < 5
    assert sample(metrics, "nstance_provider_call_errors_total", code="ProviderThrottled", **labels) is None
    # Creates are counted once by the create path (which may retry), never by the wrapper.
    assert sample(metrics, "nstance_provider_creates_total") == 0
    metrics.record_provider_create()
    assert sample(metrics, "nstance_provider_creates_total") == 1


async def test_instrumented_provider_counts_errors_by_class_and_reraises() -> None:
    metrics = Metrics()
    inner = FakeProvider()
    provider = InstrumentedProvider(inner, metrics)

    with pytest.raises(InstanceNotFound, match="no VM vm-9"):
        await provider.get_instance("knd-9", "vm-9")
    inner.throttled = True
    for _ in range(2):
        with pytest.raises(ProviderThrottled):
            await provider.list_instances("c1", "s1")
    inner.throttled = False
    assert await provider.list_instances("c1", "s1") == []

    errors = "nstance_provider_call_errors_total"
    assert sample(metrics, errors, provider="fake", method="get_instance", code="InstanceNotFound") == 1
    assert sample(metrics, errors, provider="fake", method="list_instances", code="ProviderThrottled") == 2
    # failed calls are timed too: 3 list calls observed in all
    assert (
        sample(metrics, "nstance_provider_call_seconds_count", provider="fake", method="list_instances") == 3
    )

    await provider.close()
    assert inner.closed


def test_certificate_expiry_is_published_per_certificate() -> None:
    metrics = Metrics()
    metrics.set_certificate_expiry("server-mtls", datetime(2027, 1, 1, tzinfo=UTC))
    metrics.set_certificate_expiry("ca", datetime(2036, 1, 1, tzinfo=UTC))
    text = metrics.render().decode()
    assert 'nstance_certificate_expiry_timestamp_seconds{certificate="server-mtls"} 1.7987616e+09' in text
    assert 'nstance_certificate_expiry_timestamp_seconds{certificate="ca"} 2.0827584e+09' in text
