"""ConnectionLimiter: a cap per port and per client address, addresses grouped as clients can vary them."""

from __future__ import annotations

import pytest

from nstance.server.net.connlimit import ConnectionLimiter, address_key


def test_one_address_gets_its_share_and_others_still_get_in() -> None:
    limiter = ConnectionLimiter(total=10, per_address=3)
    keys = [limiter.admit("192.0.2.1") for _ in range(3)]
    assert all(keys)
    assert limiter.admit("192.0.2.1") is None
    assert limiter.admit("192.0.2.2") is not None
    assert (limiter.open, limiter.held_by("192.0.2.1"), limiter.refused_address) == (4, 3, 1)
    limiter.release(keys[0] or "")
    assert limiter.admit("192.0.2.1") is not None


def test_the_port_cap_applies_to_every_address_together() -> None:
    limiter = ConnectionLimiter(total=2, per_address=None)
    assert limiter.admit("192.0.2.1") is not None
    assert limiter.admit("192.0.2.2") is not None
    assert limiter.admit("192.0.2.3") is None
    assert limiter.refused_total == 1


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("::ffff:192.0.2.7", "192.0.2.7"),  # a dual-stack listener's IPv4 client
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),  # the same /64: the same client
        ("fe80::1%eth0", "fe80::/64"),
        ("not-an-address", "not-an-address"),
    ],
)
def test_addresses_are_grouped_as_a_client_can_vary_them(host: str, key: str) -> None:
    assert address_key(host) == key


def test_limits_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ConnectionLimiter(total=0, per_address=None)
    with pytest.raises(ValueError, match="at least 1"):
        ConnectionLimiter(total=5, per_address=0)
