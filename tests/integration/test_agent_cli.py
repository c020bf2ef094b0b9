"""The nstance-agent command: exit 2 naming a bad variable or missing file, exit 0 promptly on SIGTERM
and on SIGHUP (its terminal closed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nstance.core.clock import ManualClock
from nstance.pki.ca import create_ca
from nstance.testing.procs import popen_as_terminal_job


def agent_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSTANCE_")}
    env.update(extra)
    return env


def instance_dir(tmp_path: Path) -> Path:
    identity = tmp_path / "identity"
    identity.mkdir()
    (identity / "ca.crt").write_bytes(create_ca(clock=ManualClock()).cert_pem)
    (identity / "nonce.jwt").write_text("a.b.c")
    return tmp_path


def test_bad_variable_exits_2_and_names_it(tmp_path: Path) -> None:
    directory = instance_dir(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "nstance.agent", "--instance-dir", str(directory)],
        env=agent_env(
            NSTANCE_INSTANCE_ID="web06h1me03z9srk7h6t0f09cb1f4",
            NSTANCE_SERVER_REGISTRATION_ADDR="127.0.0.1:1",
            NSTANCE_SERVER_AGENT_ADDR="127.0.0.1:2",
            NSTANCE_REPORT_INTERVAL="ten seconds",
        ),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "NSTANCE_REPORT_INTERVAL" in result.stderr


def test_missing_nonce_exits_2_and_names_the_file(tmp_path: Path) -> None:
    directory = instance_dir(tmp_path)
    (directory / "identity" / "nonce.jwt").unlink()
    result = subprocess.run(
        [sys.executable, "-m", "nstance.agent", "--instance-dir", str(directory)],
        env=agent_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "identity/nonce.jwt" in result.stderr


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_stop_signal_while_registering_exits_0(tmp_path: Path, stop: signal.Signals) -> None:
    directory = instance_dir(tmp_path)
    info = {
        "instance_id": "web06h1me03z9srk7h6t0f09cb1f4",
        "server_registration_addr": "127.0.0.1:1",
        "server_agent_addr": "127.0.0.1:1",
    }
    (directory / "instance.json").write_text(json.dumps(info))
    agent = popen_as_terminal_job(  # SIGHUP at its default even when the tests run under nohup
        [sys.executable, "-m", "nstance.agent", "--instance-dir", str(directory)],
        env=agent_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert agent.stderr is not None
        lines: list[str] = []
        deadline = time.monotonic() + 20
        while not any("registration with" in line for line in lines):  # the first (refused) attempt
            assert time.monotonic() < deadline, "".join(lines)
            assert agent.poll() is None, "".join(lines)
            lines.append(agent.stderr.readline())
        assert (directory / "identity" / "identity.key").exists()
        started = time.monotonic()
        agent.send_signal(stop)
        assert agent.wait(timeout=10) == 0
        assert time.monotonic() - started < 5
        assert f"received {stop.name}; exiting" in agent.stderr.read()
    finally:
        agent.kill()
        agent.wait()
        if agent.stderr is not None:
            agent.stderr.close()
