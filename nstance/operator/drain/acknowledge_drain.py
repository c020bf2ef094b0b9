"""Drain step: AcknowledgeDrained on the shard, so the server deletes the instance now.

Retried with the stream backoff until the server answers or the deadline (plus one backoff cap)
passed. NOT_FOUND (the server already deleted the instance) and FAILED_PRECONDITION from a leader
(the server no longer drains it) count as acknowledged. A shard no longer configured cannot be
acknowledged. Must not: raise for shard trouble (the server deletes at its deadline anyway).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta

import grpc

from nstance.operator.context import RPC_TIMEOUT, ShardNotConfigured
from nstance.operator.drain.state import DrainState
from nstance.operator.streams import describe_rpc_error, rpc_code
from nstance.rpc import operator_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AcknowledgeDrain:
    name: str = "acknowledge_drain"

    async def __call__(self, state: DrainState) -> None:
        await acknowledge(state)


async def acknowledge(state: DrainState) -> bool:
    """AcknowledgeDrained until the server answers or the deadline (plus one backoff cap) passed."""
    shards, shard, iid = state.ctx.shards, state.shard, state.iid
    give_up = state.deadline + timedelta(seconds=state.backoff.cap)
    attempt = 0
    while True:
        try:
            await shards.stub(shard).AcknowledgeDrained(
                operator_pb2.DrainAckRequest(instance_id=iid), timeout=RPC_TIMEOUT
            )
            shards.report(shard, True)
            state.ledger.acked.add(iid)
            log.info("instance %s: drain acknowledged on shard %s", iid, shard)
            return True
        except asyncio.CancelledError:
            raise
        except ShardNotConfigured:
            log.warning("instance %s: shard %s is no longer configured; cannot acknowledge", iid, shard)
            return False
        except Exception as exc:  # noqa: BLE001 - classified below; unknown failures are retried
            code, error = rpc_code(exc), describe_rpc_error(exc)
            if code == grpc.StatusCode.NOT_FOUND:
                shards.report(shard, True)
                state.ledger.acked.add(iid)
                log.info("instance %s: already deleted by shard %s (%s)", iid, shard, error)
                return True
            if code == grpc.StatusCode.FAILED_PRECONDITION and "standby" not in error:
                shards.report(shard, True)
                state.ledger.acked.add(iid)
                log.info("instance %s: shard %s no longer drains it (%s)", iid, shard, error)
                return True
            shards.report(shard, False, f"AcknowledgeDrained: {error}")
            if state.ctx.clock.now() >= give_up:
                log.warning(
                    "instance %s: giving up acknowledging its drain (%s); the server deletes it at its "
                    "deadline anyway",
                    iid,
                    error,
                )
                return False
            delay = state.backoff.delay(attempt)
            attempt += 1
            log.warning("instance %s: AcknowledgeDrained failed (%s); retrying in %.1fs", iid, error, delay)
            await asyncio.sleep(delay)
