"""What this server announces (shard.advertise) and where it listens (shard.bind), with the host flags.

Addresses without a host that can be dialled get this host's primary IP; ``--advertise-host`` sets the
host of the per-server addresses only, as upstream does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nstance.config import load_config_file
from nstance.core.errors import InvalidArgument
from nstance.server.net.addresses import (
    advertised_addresses,
    apply_advertise_host,
    bound_addresses,
    fill_advertised_hosts,
)


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


# --- --advertise-host and --bind-host (upstream: internal/server/config/loader.go) -------------------

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upstream"


def test_advertise_host_sets_only_this_servers_addresses_in_upstreams_terraform_config() -> None:
    # Terraform writes health and election port-only (per server) and the shard's floating leader IP
    # for the rest: agents must be told the leader IP, never this server's own.
    config = load_config_file(FIXTURES / "tf-aws-shard.json")
    advertise = advertised_addresses(
        config.shard.advertise.addrs(), advertise_host="10.0.1.23", detect=lambda: "10.0.1.99"
    )
    assert advertise == {
        "health_addr": "10.0.1.23:8990",
        "election_addr": "10.0.1.23:8991",
        "registration_addr": "10.0.1.10:8992",
        "operator_addr": "10.0.1.10:8993",
        "agent_addr": "10.0.1.10:8994",
    }
    # Without the flag the per-server ones get the detected address, as upstream fills them.
    assert advertised_addresses(config.shard.advertise.addrs(), detect=lambda: "10.0.1.99") == {
        **advertise,
        "health_addr": "10.0.1.99:8990",
        "election_addr": "10.0.1.99:8991",
    }


@pytest.mark.parametrize("field", ["health_addr", "election_addr"])
def test_advertise_host_refuses_an_address_that_already_names_a_host(field: str) -> None:
    addrs = {"health_addr": ":8990", "election_addr": "0.0.0.0:8991", "agent_addr": "10.0.1.10:8994"}
    addrs[field] = "10.0.0.5:8999"
    with pytest.raises(InvalidArgument) as refused:
        apply_advertise_host(addrs, "10.0.1.23")
    assert str(refused.value) == (
        f"--advertise-host cannot be used when shard.advertise.{field} already names a host "
        '("10.0.0.5:8999"); write it port-only (":8999")'
    )


def test_wildcard_hosts_are_per_server_too_and_an_ipv6_flag_is_bracketed() -> None:
    addrs = {"health_addr": "[::]:8990", "election_addr": "0.0.0.0:8991"}
    assert apply_advertise_host(addrs, "fd00::7") == {
        "health_addr": "[fd00::7]:8990",
        "election_addr": "[fd00::7]:8991",
    }
    assert apply_advertise_host(addrs, "[fd00::7]") == apply_advertise_host(addrs, "fd00::7")


def test_a_bind_host_fills_the_hosts_the_config_leaves_open() -> None:
    # Several servers of a shard on one machine (each on its own loopback address): what the config
    # leaves open is where this server listens, not the machine's primary IP.
    addrs = {"health_addr": ":1", "election_addr": ":2", "operator_addr": ":3", "agent_addr": "10.0.1.10:4"}
    assert advertised_addresses(addrs, advertise_host="127.0.0.2", bind_host="127.0.0.2") == {
        "health_addr": "127.0.0.2:1",
        "election_addr": "127.0.0.2:2",
        "operator_addr": "127.0.0.2:3",
        "agent_addr": "10.0.1.10:4",
    }
    assert advertised_addresses(addrs, bind_host="0.0.0.0", detect=lambda: "10.0.0.5")["operator_addr"] == (
        "10.0.0.5:3"
    )
    assert bound_addresses({"health_addr": "0.0.0.0:8990", "agent_addr": "10.0.1.10:8994"}, "127.0.0.2") == {
        "health_addr": "127.0.0.2:8990",
        "agent_addr": "127.0.0.2:8994",
    }
