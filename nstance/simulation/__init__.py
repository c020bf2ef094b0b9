"""Deterministic simulation of a shard: real server code, simulated time, cloud, storage and agents.

``python -m nstance.simulation --seeds N`` (``make sim SEEDS=N``) runs N seeded scenarios; a
failing seed prints the command that reproduces it exactly. See ``world`` for the simulated parts
(one module each) and ``invariants`` for what must hold after a run.
"""
