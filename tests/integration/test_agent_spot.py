"""Spot and preemption notices read from the local fake metadata server (AWS IMDSv2 and Google)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from nstance.agent.spot import AwsMetadata, GoogleMetadata, SpotPoller, detect_platform, http_request
from nstance.agent.state import TerminationNotice
from nstance.testing.metadata import MetadataServer


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    with MetadataServer() as server:
        yield server


async def poll(server: MetadataServer, provider: str, flip: dict[str, object]) -> TerminationNotice | None:
    """Run the poller; its first sleep applies ``flip`` to the server (the notice appears later)."""
    notices: list[TerminationNotice] = []
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        assert len(sleeps) < 5, "poller kept polling after the notice"
        for name, value in flip.items():
            setattr(server, name, value)

    poller = SpotPoller(
        provider=provider, metadata_url=server.url, interval=2.0, on_notice=notices.append, sleep=sleep
    )
    result = await poller.run()
    assert notices == ([result] if result else [])
    if result is not None:
        assert sleeps
        assert sleeps[0] == 2.0
    return result


async def test_aws_spot_notice_with_deadline(metadata: MetadataServer) -> None:
    metadata.aws_life_cycle = "spot"
    notice = await poll(metadata, "", {"aws_action": {"action": "stop", "time": "2026-02-01T08:22:00Z"}})
    assert notice == TerminationNotice("stop", datetime(2026, 2, 1, 8, 22, tzinfo=UTC))
    assert ("PUT", "/latest/api/token") in metadata.requests


async def test_aws_on_demand_machine_is_not_polled(metadata: MetadataServer) -> None:
    metadata.aws_life_cycle = "on-demand"
    assert await poll(metadata, "aws", {}) is None
    assert ("GET", "/latest/meta-data/spot/instance-action") not in metadata.requests


async def test_google_preempted_notice_without_deadline(metadata: MetadataServer) -> None:
    metadata.google_preemptible = True
    notice = await poll(metadata, "", {"google_preempted": True})
    assert notice == TerminationNotice("terminate", None)


async def test_no_metadata_service_means_no_poller(metadata: MetadataServer) -> None:
    assert await poll(metadata, "", {}) is None
    assert await poll(metadata, "local", {}) is None


def test_endpoints_demand_their_headers(metadata: MetadataServer) -> None:
    metadata.aws_life_cycle = "spot"
    metadata.google_preemptible = False
    assert http_request(f"{metadata.url}/latest/meta-data/instance-life-cycle").status == 401
    assert http_request(f"{metadata.url}/computeMetadata/v1/instance/preempted").status == 403
    aws = AwsMetadata(metadata.url)
    assert aws.is_spot()
    assert aws.notice() is None
    metadata.aws_action = {"action": "terminate", "time": "2026-02-01T08:22:00Z"}
    assert aws.notice() == TerminationNotice("terminate", datetime(2026, 2, 1, 8, 22, tzinfo=UTC))
    google = GoogleMetadata(metadata.url)
    assert not google.is_spot()
    assert google.notice() is None
    assert detect_platform("google", metadata.url) is None  # reachable but not preemptible
