"""Test support that ships with the package: fakes and helpers shared by tests, demos and benchmarks.

Modules here may start local helper servers (for example ``moto_server``) but must not import
test-only dependencies (moto, pytest) at import time, so installing ``nstance`` never requires them.
"""
