"""Which server of a shard leads: the lockfile election, the leader's network address and its term.

``election`` runs the conditional-write lease on object storage; ``leadernet`` moves the leader
address (and load-balancer membership) to the new leader; ``leaderterm`` numbers the terms. What a
leader does while it leads is in ``nstance.server.shard``; fencing and the leader clock are in
``nstance.server.state``, since every writer checks them.
"""
