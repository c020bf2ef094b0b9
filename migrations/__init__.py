"""Alembic migrations for the SQLite cache; installed as the package ``nstance._migrations``."""
