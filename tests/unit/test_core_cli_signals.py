"""``stop_signals``: the daemons stop on SIGHUP as on SIGTERM and SIGINT, unless started under nohup."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from nstance.core.cli import stop_signals


@pytest.fixture
def sighup_restored() -> Iterator[None]:
    before = signal.getsignal(signal.SIGHUP)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, before)


@pytest.mark.usefixtures("sighup_restored")
def test_sighup_stops_a_daemon_started_from_a_terminal() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    assert stop_signals() == (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@pytest.mark.usefixtures("sighup_restored")
def test_sighup_ignored_at_start_stays_ignored() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
    assert stop_signals() == (signal.SIGTERM, signal.SIGINT)
