"""Keeping groups at their wanted state: the reconciler and everything that acts on instances.

The work queue and reconciler (plan a group, then act), the instance lifecycle (``instances``:
crash-safe create, delete, drain), record follow-ups, load balancers, images, the mass-deletion brake
and safety holds, and the recovery side: cache rebuild and provider sync (``recovery``, ``claims``,
``adoption``), record restore, cache repair and garbage collection. Deciding *what* to do is pure and
lives in ``nstance.core.plan``; this package does it.
"""
