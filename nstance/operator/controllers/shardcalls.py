"""Calling a shard's Operator API from a controller step, with one error vocabulary.

Every unary call goes through ``call``: it looks the shard up in ``ctx.shards``, applies
``RPC_TIMEOUT``, reports the outcome with ``ctx.shards.report`` (so ``reachable`` stays current for the
shard choice and the sync manager), and turns every failure into ``ShardCallError`` with a ``Failure``
kind the steps branch on:

* ``NOT_CONFIGURED`` - the shard is not in the operator config (any more);
* ``UNREACHABLE``    - UNAVAILABLE, DEADLINE_EXCEEDED, a closed channel, or a standby refusing a change
  while leadership moves: transient, retry after ``timings.unreachable_retry``;
* ``NOT_FOUND``      - the server does not know the object;
* ``REFUSED``        - INVALID_ARGUMENT or FAILED_PRECONDITION: the request itself is wrong (bad
  template, static group...), retrying the same request will not help;
* ``FAILED``         - anything else (provider error, INTERNAL, permission): retry after error_retry.

Must not: decide what a failure means for an object (the steps do), or retry by itself.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from nstance.operator.context import RPC_TIMEOUT, OperatorContext, ShardNotConfigured
from nstance.rpc import operator_pb2_grpc

log = logging.getLogger(__name__)


class Failure(enum.StrEnum):
    NOT_CONFIGURED = "NotConfigured"
    UNREACHABLE = "Unreachable"
    NOT_FOUND = "NotFound"
    REFUSED = "Refused"
    FAILED = "Failed"


_UNREACHABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_REFUSED_CODES = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION})
_STANDBY_MARK = "standby"


class ShardCallError(Exception):
    """A failed Operator API call: which shard and method, the failure kind, the server's words."""

    def __init__(self, shard: str, method: str, failure: Failure, code: str, details: str) -> None:
        super().__init__(f"{method} on shard {shard!r} failed: {code}: {details}")
        self.shard = shard
        self.method = method
        self.failure = failure
        self.code = code
        self.details = details


def classify(code: Any, details: str) -> Failure:
    """The failure kind of a gRPC status code (and its details, to spot standby refusals)."""
    if code in _UNREACHABLE_CODES:
        return Failure.UNREACHABLE
    if code == grpc.StatusCode.FAILED_PRECONDITION and _STANDBY_MARK in details:
        return Failure.UNREACHABLE
    if code == grpc.StatusCode.NOT_FOUND:
        return Failure.NOT_FOUND
    if code in _REFUSED_CODES:
        return Failure.REFUSED
    return Failure.FAILED


async def call(
    ctx: OperatorContext,
    shard: str,
    method: str,
    invoke: Callable[[operator_pb2_grpc.OperatorServiceStub, float], Awaitable[Any]],
) -> Any:
    """Run ``invoke(stub, timeout)`` against ``shard``; raise ShardCallError on any failure."""
    try:
        stub = ctx.shards.stub(shard)
    except ShardNotConfigured:
        configured = ", ".join(ctx.shards.configured()) or "none"
        raise ShardCallError(
            shard,
            method,
            Failure.NOT_CONFIGURED,
            "NOT_CONFIGURED",
            f"shard {shard!r} is not in the operator config (configured shards: {configured})",
        ) from None
    try:
        response = await invoke(stub, RPC_TIMEOUT)
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
        details = str(exc.details() or "")
        failure = classify(code, details)
        name = getattr(code, "name", str(code))
        ctx.shards.report(shard, failure is not Failure.UNREACHABLE, f"{method}: {name}: {details}")
        raise ShardCallError(shard, method, failure, name, details) from None
    except grpc.aio.UsageError as exc:
        # The channel was closed under us (shard removed or reconnecting): transient.
        ctx.shards.report(shard, False, f"{method}: {exc}")
        raise ShardCallError(shard, method, Failure.UNREACHABLE, "CLOSED", str(exc)) from None
    ctx.shards.report(shard, True)
    return response
