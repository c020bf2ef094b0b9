"""nstance-admin: cluster bootstrap, config validation and group management from a laptop or CI."""
