"""``python -m nstance.agent``: the same as the ``nstance-agent`` console script; nothing else here."""

from nstance.agent.cli import main

if __name__ == "__main__":
    main()
