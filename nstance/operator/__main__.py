"""``python -m nstance.operator``: the same as the ``nstance-operator`` console script; nothing else here."""

from nstance.operator.cli import main

if __name__ == "__main__":
    main()
