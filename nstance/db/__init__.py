"""The server's local SQLite cache.

Object storage is the source of truth for instance records, operators and group config; this cache
holds a queryable copy plus ephemeral state (health, drain progress, load-balancer membership) and can
be rebuilt from object storage and the provider at any time.

Modules: ``models`` (tables), ``types`` (column types), ``engine`` (open, pragmas, transactions,
migrate) and ``repo`` (the queries the server runs). Only this package imports SQLAlchemy or alembic;
callers use the repository functions and the ORM rows they return.
"""
