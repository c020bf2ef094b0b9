"""Command line of nstance-agent: flags, logging, signals and exit codes around ``Agent.run``.

Configuration comes from ``NSTANCE_*`` variables (config.py). ``--instance-dir DIR`` (or
``NSTANCE_INSTANCE_DIR``) is the local provider's contract: the identity, keys and receive directories
default to ``DIR/identity``, ``DIR/keys`` and ``DIR/recv``, and ``DIR/instance.json`` fills in the server
addresses and instance ID when the environment lacks them. Exit codes: 0 after SIGTERM/SIGINT/SIGHUP, 2 for a
configuration or bootstrap problem (the message names the variable or file), 1 for anything unexpected.
This module holds no agent logic.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from nstance import __version__
from nstance.agent.config import AgentConfig, ConfigError, load_config
from nstance.agent.run import Agent
from nstance.core.cli import VERSION_HELP, print_version, run_app, stop_signals
from nstance.core.errors import FailedPrecondition, InvalidArgument
from nstance.core.logformat import TEXT_FORMAT

log = logging.getLogger("nstance.agent")

app = typer.Typer(
    add_completion=False,
    help=(
        "Nstance agent: registers this VM with its shard server using the nonce from userdata, then "
        "streams health reports and receives files over mTLS. Configured with NSTANCE_* variables "
        "(NSTANCE_SERVER_REGISTRATION_ADDR, NSTANCE_SERVER_AGENT_ADDR, NSTANCE_INSTANCE_ID, "
        "NSTANCE_IDENTITY_DIR, NSTANCE_REPORT_INTERVAL, ...); see docs/agent.md."
    ),
)

IDENTITY_FILES: tuple[str, ...] = ("nonce.jwt", "ca.crt")


def check_instance_dir(instance_dir: Path, identity_dir: Path | None = None) -> str | None:
    """Why ``instance_dir`` cannot be used by the agent, or None when it can."""
    if not instance_dir.is_dir():
        return f"instance directory {instance_dir} does not exist (or is not a directory)"
    identity = identity_dir or instance_dir / "identity"
    missing = [str(identity / name) for name in IDENTITY_FILES if not (identity / name).is_file()]
    if missing:
        lacking = ", ".join(missing)
        return f"instance directory {instance_dir} lacks {lacking} (the provider writes them at create)"
    return None


def read_instance_info(instance_dir: Path) -> dict[str, object]:
    """``DIR/instance.json`` as a dict ({} when absent or unreadable)."""
    try:
        data = json.loads((instance_dir / "instance.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class _EarlySignals:
    """Records a stop signal that arrives before the event loop installs its handlers; ``signals`` are
    the stop signals (``stop_signals``), decided once, before any handler is installed."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self.signals = stop_signals()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum)


async def run_until_signal(config: AgentConfig, early: _EarlySignals) -> int:
    """Run the agent until SIGTERM/SIGINT/SIGHUP (exit 0) or a bootstrap problem (exit 2)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    received: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        stop.set()

    for sig in early.signals:
        loop.add_signal_handler(sig, on_signal, sig)
    if early.received is not None:
        on_signal(early.received)

    agent = Agent(config)
    agent_task = asyncio.create_task(agent.run(), name="agent")
    stop_task = asyncio.create_task(stop.wait(), name="stop")
    await asyncio.wait({agent_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    if stop_task.done():
        log.info("received %s; exiting", received[0].name)
        agent_task.cancel()
        try:
            await asyncio.wait_for(agent_task, timeout=5)
        except (asyncio.CancelledError, TimeoutError):
            pass
        except Exception:
            log.exception("error while stopping")
        return 0
    stop_task.cancel()
    try:
        agent_task.result()
    except (FailedPrecondition, InvalidArgument) as exc:
        typer.echo(f"nstance-agent: {exc}", err=True)
        return 2
    return 1  # pragma: no cover - run() only returns by raising


@app.command()
def main_command(
    instance_dir: Annotated[
        Path | None,
        typer.Option(
            "--instance-dir",
            envvar="NSTANCE_INSTANCE_DIR",
            help="Directory the local provider prepared for this instance (identity/, instance.json).",
        ),
    ] = None,
    debug: Annotated[
        bool, typer.Option("--debug", "-v", envvar="NSTANCE_DEBUG", help="Verbose logs.")
    ] = False,
    version: Annotated[
        bool,
        typer.Option("--version", callback=print_version("nstance-agent"), is_eager=True, help=VERSION_HELP),
    ] = False,
) -> None:
    """Run the agent."""
    early = _EarlySignals()
    for sig in early.signals:
        signal.signal(sig, early)
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format=TEXT_FORMAT,
        stream=sys.stderr,
    )
    env = dict(os.environ)
    info: dict[str, object] = {}
    if instance_dir is not None:
        identity_env = env.get("NSTANCE_IDENTITY_DIR", "").strip()
        problem = check_instance_dir(instance_dir, Path(identity_env) if identity_env else None)
        if problem is not None:
            typer.echo(f"nstance-agent: {problem}", err=True)
            raise typer.Exit(2)
        info = read_instance_info(instance_dir)
    try:
        config = load_config(env, instance_dir=instance_dir, instance_info=info)
    except ConfigError as exc:
        typer.echo(f"nstance-agent: {exc}", err=True)
        raise typer.Exit(2) from exc
    if early.received is not None:
        log.info("received %s; exiting", early.received.name)
        raise typer.Exit(0)
    log.info(
        "nstance-agent %s for %s: registration %s, agent %s, identity %s",
        __version__,
        config.instance_id,
        config.registration_addr,
        config.agent_addr,
        config.identity_dir,
    )
    code = asyncio.run(run_until_signal(config, early))
    raise typer.Exit(code)


def main() -> None:
    """Console-script entry point."""
    run_app(app, "nstance-agent")
