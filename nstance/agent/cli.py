"""Command line of nstance-agent.

The agent is configured through ``NSTANCE_*`` environment variables, as upstream's is. Registration and
the mTLS streams arrive with the agent release. Until then the command is a well-behaved placeholder for
the ``local`` provider: given ``--instance-dir DIR`` it checks the directory and its identity files
(exit 2 with a message naming what is missing), logs that it is waiting for the registration feature,
and blocks until SIGTERM or SIGINT, then exits 0. Without ``--instance-dir`` it says the agent is not
available yet and exits 2. It must not touch anything outside the instance directory.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

log = logging.getLogger("nstance.agent")

app = typer.Typer(
    add_completion=False,
    help=(
        "Nstance agent: registers this VM with its shard server using the nonce from userdata, then "
        "streams health reports and receives files over mTLS. Configured with NSTANCE_* variables "
        "(NSTANCE_SERVER_REGISTRATION_ADDR, NSTANCE_SERVER_AGENT_ADDR, NSTANCE_INSTANCE_ID, "
        "NSTANCE_IDENTITY_DIR, NSTANCE_REPORT_INTERVAL, ...)."
    ),
)

IDENTITY_FILES: tuple[str, ...] = ("identity/nonce.jwt", "identity/ca.crt")


def check_instance_dir(instance_dir: Path) -> str | None:
    """Why ``instance_dir`` cannot be used by the agent, or None when it can."""
    if not instance_dir.is_dir():
        return f"instance directory {instance_dir} does not exist (or is not a directory)"
    missing = [name for name in IDENTITY_FILES if not (instance_dir / name).is_file()]
    if missing:
        lacking = ", ".join(missing)
        return f"instance directory {instance_dir} lacks {lacking} (the provider writes them at create)"
    return None


STOP_SIGNALS: frozenset[signal.Signals] = frozenset({signal.SIGTERM, signal.SIGINT})


def hold_stop_signals() -> None:
    """Hold SIGTERM and SIGINT pending from now on, so one sent early is not lost or fatal."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def wait_for_stop_signal() -> int:
    """Block until SIGTERM or SIGINT arrives (held since ``hold_stop_signals``); return its number."""
    return int(signal.sigwait(STOP_SIGNALS))


@app.command()
def main_command(
    instance_dir: Annotated[
        Path | None,
        typer.Option(
            "--instance-dir",
            envvar="NSTANCE_INSTANCE_DIR",
            help="Directory the local provider prepared for this instance (userdata, identity/).",
        ),
    ] = None,
    debug: Annotated[
        bool, typer.Option("--debug", "-v", envvar="NSTANCE_DEBUG", help="Verbose logs.")
    ] = False,
) -> None:
    """Run the agent."""
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if instance_dir is None:
        typer.echo(
            "nstance-agent: the agent is not part of this release yet; only the local provider's "
            "placeholder (--instance-dir DIR) runs.",
            err=True,
        )
        raise typer.Exit(2)
    hold_stop_signals()  # before the "waiting" line: once it is logged, SIGTERM means exit 0
    problem = check_instance_dir(instance_dir)
    if problem is not None:
        typer.echo(f"nstance-agent: {problem}", err=True)
        raise typer.Exit(2)
    log.info(
        "instance directory %s is ready; waiting for the registration feature (not in this release) "
        "until SIGTERM or SIGINT",
        instance_dir,
    )
    signum = wait_for_stop_signal()
    log.info("received %s; exiting", signal.Signals(signum).name)


def main() -> None:
    """Console-script entry point."""
    app()
