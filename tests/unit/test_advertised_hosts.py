"""shard.advertise addresses without a host that can be dialled get this host's primary IP."""

from __future__ import annotations

from nstance.server.app import fill_advertised_hosts


def test_empty_and_wildcard_hosts_are_replaced_and_real_ones_kept() -> None:
    addrs = {
        "registration_addr": ":8992",
        "agent_addr": "0.0.0.0:8994",
        "operator_addr": "[::]:8993",
        "health_addr": "10.1.1.1:8990",
    }
    assert fill_advertised_hosts(addrs, lambda: "10.0.0.5") == {
        "registration_addr": "10.0.0.5:8992",
        "agent_addr": "10.0.0.5:8994",
        "operator_addr": "10.0.0.5:8993",
        "health_addr": "10.1.1.1:8990",
    }


def test_an_ipv6_primary_address_is_bracketed_and_no_address_changes_nothing() -> None:
    assert fill_advertised_hosts({"agent_addr": ":8994"}, lambda: "fd00::5") == {
        "agent_addr": "[fd00::5]:8994"
    }
    assert fill_advertised_hosts({"agent_addr": ":8994"}, lambda: "") == {"agent_addr": ":8994"}


def test_the_host_is_detected_once_and_only_when_needed() -> None:
    calls: list[int] = []

    def detect() -> str:
        calls.append(1)
        return "10.0.0.5"

    fill_advertised_hosts({"a": "10.1.1.1:1"}, detect)
    assert calls == []
    fill_advertised_hosts({"a": ":1", "b": ":2"}, detect)
    assert calls == [1]
