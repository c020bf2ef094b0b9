"""Contract suites: one set of behaviours, run against every implementation of an interface."""
