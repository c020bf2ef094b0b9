"""What every mechanism of a shard shares: the ``ShardContext`` handle and the state it carries.

The shard's configuration (``configstate``, the dynamic groups and their writer, config health),
instance records in object storage (``records``), in-process events, fencing and the leader clock,
create limits, provisioning data, metrics, the loop-lag probe and degraded components. The lowest
layer of the server: it imports no other server package.
"""
