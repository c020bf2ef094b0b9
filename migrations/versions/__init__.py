"""Alembic revision scripts for the SQLite cache, one module per revision, applied in order by ``migrate``."""
