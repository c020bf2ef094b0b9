"""Domain errors shared by every layer.

Each class names a category a caller can act on. The server's error interceptor maps them to gRPC
status codes (InvalidArgument -> INVALID_ARGUMENT, and so on); CLIs print their message. Code below
the servicers raises these instead of building gRPC statuses itself.
"""

from __future__ import annotations


class NstanceError(Exception):
    """Base class of every error Nstance raises on purpose."""


class InvalidArgument(NstanceError):
    """The caller sent something malformed or outside the rules; retrying the same input fails again."""


class NotFound(NstanceError):
    """The named object does not exist."""


class AlreadyExists(NstanceError):
    """An object that must be created only once already exists."""


class FailedPrecondition(NstanceError):
    """The system is not in a state where the request can be carried out (e.g. not the leader)."""


class PermissionDenied(NstanceError):
    """The caller is known but not allowed to do this."""


class Unauthenticated(NstanceError):
    """The caller could not be identified (bad token, bad certificate)."""


class Unavailable(NstanceError):
    """A dependency is temporarily unreachable; retrying later may succeed."""


class ResourceExhausted(NstanceError):
    """A limit was hit (rate limit, quota, size)."""
