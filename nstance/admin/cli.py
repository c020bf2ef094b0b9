"""Command line of nstance-admin: the root options and the command groups, wired together.

Each group lives in its own module: ``cluster`` (init, nonce, register-operator; ``secrets
generate-key``), ``configcmds`` (config validate/upload/status/refresh) and ``plan`` (config plan),
``groups``, ``instances``, ``certs`` (cert revoke/list-revoked) and ``watch``. Every expected failure
prints ``error: ...`` on stderr and exits with status 1 (``output.fail``); nothing is written before
every check that can fail has passed.

The root, ``cluster``, ``group``, ``instance`` and ``config`` are ``persistent.PersistentGroup``s: their
options are accepted after any command below them too, as upstream's cobra persistent flags.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from nstance.core.cli import DEBUG_ENV, VERSION_HELP, print_version, run_app
from nstance.core.logformat import TEXT_FORMAT

from .certs import register_certs
from .cluster import cluster_app, secrets_app
from .configcmds import register_config
from .groups import group_app
from .instances import instance_app
from .persistent import PersistentGroup
from .plan import register_plan
from .shardcalls import shard_options
from .watch import register_watch

app = typer.Typer(
    cls=PersistentGroup,
    add_completion=False,
    help="Nstance administration: cluster bootstrap, nonces, config checks.",
)
config_app = typer.Typer(
    cls=PersistentGroup, add_completion=False, help="Shard config files: validate and upload."
)
config_app.callback()(shard_options)
app.add_typer(cluster_app, name="cluster")
app.add_typer(config_app, name="config")
app.add_typer(secrets_app, name="secrets")


def _debug_logs(value: bool) -> bool:
    """``--debug``: debug logs on stderr, and NSTANCE_DEBUG for the last-resort traceback. An option
    callback, so that ``-v`` given after a subcommand (where the root callback has already run) works."""
    if value:
        os.environ[DEBUG_ENV] = "1"
        logging.basicConfig(level=logging.DEBUG, format=TEXT_FORMAT, stream=sys.stderr)
    return value


@app.callback()
def main_options(
    temp_dir: Annotated[
        Path, typer.Option("--temp-dir", help="Working directory for generated files (identity, nonces).")
    ] = Path("./temp"),
    version: Annotated[
        bool,
        typer.Option("--version", callback=print_version("nstance-admin"), is_eager=True, help=VERSION_HELP),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            "-v",
            envvar=DEBUG_ENV,
            callback=_debug_logs,
            help="Debug logs on stderr, and a traceback for an unexpected error.",
        ),
    ] = False,
) -> None:
    """Nstance administration.

    ``--temp-dir`` and ``--debug`` are accepted after any subcommand too (``persistent``); the commands
    read ``--temp-dir`` from the context (``options.temp_dir``).
    """
    del temp_dir, debug


app.add_typer(group_app, name="group")
app.add_typer(instance_app, name="instance")
register_config(config_app)
register_plan(config_app)
register_certs(app)
register_watch(app)


def main() -> None:
    """Console-script entry point."""
    run_app(app, "nstance-admin")
