"""Looking through wrappers: the object a chain of ``inner`` attributes ends at.

The server wraps its provider and its object store (metrics, fencing, key prefixes); each wrapper
exposes what it wraps as ``inner``. What a backend *is* (which capabilities a provider has, how many
parallel reads a store is worth) is asked of the innermost one.
"""

from __future__ import annotations


def innermost(obj: object) -> object:
    """Follow ``inner`` from ``obj`` until an object without one; that object."""
    while (inner := getattr(obj, "inner", None)) is not None:
        obj = inner
    return obj
