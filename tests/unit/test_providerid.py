"""A server's provider instance ID finds its Node whatever form the cloud controller wrote."""

from __future__ import annotations

import pytest

from nstance.core.providerid import instance_key, last_segment, matches, node_keys


@pytest.mark.parametrize(
    ("raw", "node"),
    [
        ("i-0abc123", "aws:///us-west-2a/i-0abc123"),
        ("i-0abc123", "aws://us-west-2a/i-0abc123"),
        ("web-01", "gce://my-project/us-central1-a/web-01"),
        ("10042", "proxmox://region-1/10042"),
        ("10042", "proxmox:///10042"),
        ("pve1/10042", "proxmox://region-1/10042"),
        ("lcl01J9", "local:///lcl01J9"),
        ("lcl01J9", "lcl01J9"),
    ],
)
def test_server_id_matches_every_node_form(raw: str, node: str) -> None:
    assert matches(raw, node)
    assert instance_key(raw) in node_keys(node)


@pytest.mark.parametrize(
    ("raw", "node"),
    [
        ("i-0abc123", "aws:///us-west-2a/i-0abc1234"),
        ("web-01", "gce://my-project/us-central1-a/web-02"),
        ("", "aws:///us-west-2a/i-0abc123"),
        ("i-0abc123", ""),
    ],
)
def test_different_machines_do_not_match(raw: str, node: str) -> None:
    assert not matches(raw, node)


def test_last_segment_ignores_trailing_slashes_and_spaces() -> None:
    assert last_segment(" aws:///us-west-2a/i-1/ ") == "i-1"
    assert node_keys("") == set()
