"""``python -m nstance.server``: the same as the ``nstance-server`` command."""

from nstance.server.cli import main

main()
