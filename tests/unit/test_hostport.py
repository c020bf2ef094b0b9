"""``host:port`` parsing shared by the server's config, the server and the agent, and reported host names."""

from __future__ import annotations

import pytest

from nstance.core.hostport import hostname_problem, split_host_port


@pytest.mark.parametrize(
    ("addr", "parsed"),
    [
        ("127.0.0.1:8992", ("127.0.0.1", 8992)),
        (":8990", ("", 8990)),
        ("[fd00::5]:8993", ("[fd00::5]", 8993)),
        ("shard-a.internal:65535", ("shard-a.internal", 65535)),
        ("8080", None),
        ("::1:8080", None),
        ("fd00::5:8993", None),
        ("localhost:0", None),
        ("localhost:65536", None),
        ("localhost:http", None),
        ("localhost:", None),
        ("localhost:\u0661\u0662", None),  # Arabic-Indic digits: int() reads them, no resolver does
    ],
)
def test_split_host_port(addr: str, parsed: tuple[str, int] | None) -> None:
    assert split_host_port(addr) == parsed


def test_port_zero_only_when_asked_for() -> None:
    assert split_host_port("127.0.0.1:0", any_port=True) == ("127.0.0.1", 0)
    assert split_host_port("127.0.0.1:0") is None


@pytest.mark.parametrize(
    ("hostname", "ok"),
    [
        ("agent-host", True),
        ("web-1.example.com", True),
        ("agent host", False),
        ("tab\there", False),
        ("x" * 254, False),
    ],
)
def test_hostname_problem(hostname: str, ok: bool) -> None:
    assert (hostname_problem(hostname) is None) == ok
