"""nstance-server: the per-shard daemon (reconciler, registration, CA, agent and operator APIs)."""
