"""nstance-operator: the Cluster API infrastructure provider that drives shard servers."""
