"""Command line of nstance-agent.

The agent is configured through ``NSTANCE_*`` environment variables, as upstream's is. This release
ships the command and its help; registration and the mTLS streams arrive with the agent release, and
until then running it says so and exits with status 2.
"""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(
    add_completion=False,
    help=(
        "Nstance agent: registers this VM with its shard server using the nonce from userdata, then "
        "streams health reports and receives files over mTLS. Configured with NSTANCE_* variables "
        "(NSTANCE_SERVER_REGISTRATION_ADDR, NSTANCE_SERVER_AGENT_ADDR, NSTANCE_INSTANCE_ID, "
        "NSTANCE_IDENTITY_DIR, NSTANCE_REPORT_INTERVAL, ...)."
    ),
)


@app.command()
def main_command(
    debug: Annotated[
        bool, typer.Option("--debug", "-v", envvar="NSTANCE_DEBUG", help="Verbose logs.")
    ] = False,
) -> None:
    """Run the agent."""
    typer.echo("nstance-agent: the agent is not part of this release yet.", err=True)
    raise typer.Exit(2)


def main() -> None:
    """Console-script entry point."""
    app()
