"""``plan_connection_caps``: client connections never take the descriptors reserved for the server."""

from __future__ import annotations

from nstance.config.limits import LimitsConfig
from nstance.server.net.fdbudget import MIN_PORT_CONNECTIONS, plan_connection_caps


def test_a_generous_open_file_limit_gives_every_port_its_configured_cap() -> None:
    caps = plan_connection_caps(LimitsConfig(), 524_288)
    assert (caps.registration, caps.operator, caps.agent, caps.scaled) == (1_000, 1_000, 10_000, False)


def test_a_small_open_file_limit_scales_the_ports_down_and_keeps_the_reserve() -> None:
    limits = LimitsConfig()
    caps = plan_connection_caps(limits, 1_024)
    assert caps.scaled
    total = caps.health + caps.registration + caps.operator + caps.agent
    assert total <= 1_024 - limits.reserved_file_descriptors
    assert caps.agent > caps.registration >= MIN_PORT_CONNECTIONS


def test_max_connections_caps_the_total() -> None:
    limits = LimitsConfig(max_connections=600)
    caps = plan_connection_caps(limits, 524_288)
    assert caps.health + caps.registration + caps.operator + caps.agent <= 600
