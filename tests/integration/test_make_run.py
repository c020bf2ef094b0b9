"""``make run`` (scripts/run_local.sh) as users would meet it: one copy at a time, Ctrl-C stops cleanly,
and so does closing its terminal.

The first copy runs the example shard on ephemeral ports with its state in a temporary directory. A
second copy with the same state must refuse (naming the first) and a third with other state but the
same ports must refuse too; neither may touch the first copy's agents. Ctrl-C (SIGINT to the first
copy's process group, as a terminal sends it) ends it with a "stopped" line, exit 0, and its agents
gone.

Closing the terminal is played with a pseudo-terminal: the run writes to it, the test closes its
master side (every later write fails) and sends SIGHUP to the run's process group, as the kernel does
on a hang-up. The server must stop in order (its log ends with ``stopped``) and take its agents with
it; before, SIGHUP killed the server at once and the agents outlived it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nstance.testing.procs import free_port, popen_as_terminal_job
from nstance.testing.waiting import eventually_sync

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "run_local.sh"
EXAMPLE = ROOT / "examples" / "local" / "config.jsonc"
SIZE = 2

pytestmark = pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc to tell agents apart")


def _config(tmp: Path) -> Path:
    text = EXAMPLE.read_text(encoding="utf-8")
    for port in range(8990, 8995):
        text = text.replace(f"127.0.0.1:{port}", f"127.0.0.1:{free_port()}")
    path = tmp / "config.jsonc"
    path.write_text(text, encoding="utf-8")
    return path


def _env(config: Path, state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSTANCE_")}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '')}"
    env.update(
        {
            "NSTANCE_RUN_STATE": str(state),
            "NSTANCE_RUN_CONFIG": str(config),
            "NSTANCE_RUN_SIZE": str(SIZE),
            "TERM": "dumb",
        }
    )
    return env


def _alive(pid: int, directory: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(directory).encode() in cmdline.split(b"\0")


def _agents(state: Path) -> dict[int, Path]:
    """pid -> instance directory of the live agents in ``state``."""
    out: dict[int, Path] = {}
    for path in (state / "cache" / "local-instances").glob("*/instance.json"):
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        pid = meta.get("pid")
        if isinstance(pid, int) and _alive(pid, path.parent):
            out[pid] = path.parent
    return out


def _foreground(config: Path, state: Path, stdin: Any, output: Any) -> subprocess.Popen[bytes]:
    """``make run`` as a terminal's foreground job: its own process group, with Ctrl-C and hang-up at
    their default actions (never inherited ignored), output (and errors) to ``output``."""
    return popen_as_terminal_job(
        ["bash", str(SCRIPT)],
        cwd=ROOT,
        env=_env(config, state),
        stdin=stdin,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait_running(run: subprocess.Popen[bytes], state: Path, log: Callable[[], str]) -> dict[int, Path]:
    """Wait until ``run`` has its instances running; pid -> instance directory of its agents."""
    eventually_sync(
        lambda: len(_agents(state)) >= SIZE or run.poll() is not None,
        within=240,
        what="make run to have its instances running",
        log=log,
    )
    assert run.poll() is None, log()
    return _agents(state)


@pytest.mark.timeout(900)  # a whole make run: cluster setup, a server, two agents, two refused copies
def test_second_copy_refuses_and_first_survives(tmp_path: Path) -> None:
    config = _config(tmp_path)
    state = tmp_path / "state"
    log = tmp_path / "first.out"
    with log.open("wb") as out:
        first = _foreground(config, state, subprocess.DEVNULL, out)
    try:
        agents = _wait_running(first, state, log.read_text)

        second = subprocess.run(
            ["bash", str(SCRIPT)],
            cwd=ROOT,
            env=_env(config, state),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 1, second.stdout + second.stderr
        assert f"make run is already running (pid {first.pid})" in second.stderr
        assert "Traceback" not in second.stdout + second.stderr

        other_state = tmp_path / "other-state"
        third = subprocess.run(
            ["bash", str(SCRIPT)],
            cwd=ROOT,
            env=_env(config, other_state),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert third.returncode == 1, third.stdout + third.stderr
        assert "is already in use" in third.stderr
        assert not (other_state / "storage").exists()  # refused before touching anything

        assert first.poll() is None
        assert all(_alive(pid, directory) for pid, directory in agents.items()), (
            "an agent of the first run died"
        )
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGINT)  # Ctrl-C
        code = first.wait(timeout=120)
    text = log.read_text()
    assert code == 0, text
    assert text.rstrip().splitlines()[-1].startswith("stopped"), text[-2000:]
    assert "Traceback" not in text
    eventually_sync(
        lambda: not _agents(state),
        within=60,
        what=lambda: f"the agents to stop with make run: {_agents(state)}",
    )


@pytest.mark.timeout(600)
def test_closing_the_terminal_stops_the_server_and_its_agents(tmp_path: Path) -> None:
    config = _config(tmp_path)
    state = tmp_path / "state"
    master, slave = os.openpty()
    received = bytearray()

    def drain() -> None:  # a terminal reads what the run writes; its live view must never block
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            received.extend(data)

    run = _foreground(config, state, slave, slave)
    os.close(slave)
    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    closed = False
    try:
        _wait_running(run, state, lambda: received.decode(errors="replace")[-3000:])
        os.close(master)  # the terminal window goes away: writes to it fail from now on
        closed = True
        os.killpg(run.pid, signal.SIGHUP)  # and the kernel hangs up its foreground process group
        code = run.wait(timeout=120)
        eventually_sync(
            lambda: not _agents(state),
            within=60,
            what=lambda: f"the agents to stop with the server: {_agents(state)}",
        )
        lines = (state / "server.log").read_text(encoding="utf-8").splitlines()
        assert json.loads(lines[-1])["msg"] == "stopped", lines[-5:]
        assert code == 0, f"make run ended with {code}"
        assert not (state / "run.pid").exists()
    finally:
        if not closed:
            os.close(master)
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGINT)
            run.wait(timeout=120)
        reader.join(timeout=5)
