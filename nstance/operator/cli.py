"""Command line of nstance-operator.

This release ships the command and its help; the controllers arrive with the operator release, and
until then running it says so and exits with status 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    add_completion=False,
    help="Nstance operator: Cluster API infrastructure provider spreading replicas across shard servers.",
)


@app.command()
def main_command(
    config: Annotated[Path, typer.Option(help="Operator config (cluster_id, tenant, shards).")] = Path(
        "/etc/nstance/operator/config.yaml"
    ),
) -> None:
    """Run the operator."""
    typer.echo("nstance-operator: the operator is not part of this release yet.", err=True)
    raise typer.Exit(2)


def main() -> None:
    """Console-script entry point."""
    app()
