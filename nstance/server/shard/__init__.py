"""One shard as the Operator API sees it, and what its leader runs.

``api`` is the seam: the plain types and the ``ShardAPI`` protocol that the gRPC servicer calls.
``shard`` implements it, and starts and stops the leader's work (cache rebuild, reconciler, GC,
config and image loops) when leadership is won or lost.
"""
