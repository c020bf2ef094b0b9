"""Object storage: the durable source of truth (config, dynamic groups, instance records, leases)."""
