"""nstance-agent: runs on every VM; registers, reports health and receives files over mTLS."""
