"""Connections from the operator to every configured shard's Operator API (``ShardAccess``).

``ShardSet`` keeps one grpc.aio mTLS channel per shard: the operator certificate and key as the
client identity, the cluster CA as the only trust root, the server verified as ``nstance-server``
(every server certificate carries that DNS name, so an IP address works as the target), keepalive
pings every 20 s with a 10 s timeout even without calls (servers allow pings every 10 s), reconnect
backoff from 1 s to 30 s, 4 MiB message limits. Under an Ed25519 cluster CA the TLS runs in OpenSSL
(``pki.tlsclient``), as the agent's does: upstream's servers present Ed25519 certificates, which
grpcio cannot verify. The identity key may be Ed25519 or ECDSA P-256 either way.

A shard counts as reachable from the latest of two signals: what callers ``report`` about their calls
and streams, and the channel's own connectivity (READY → reachable, TRANSIENT_FAILURE → not). A small
task per shard follows the channel state and asks it to connect, so an idle shard reconnects by itself
after its server comes back.

``update`` follows the operator config: new shards get a channel, removed ones are closed, a changed
address re-opens the channel, and ``wait_changed`` callers wake up. ``set_credentials`` (certificate
renewal) opens new channels with the new certificate at once, wakes ``wait_changed`` callers (every
``stub()`` is a new object now, so stream owners reopen their streams on the new channel), and closes
the old channels after a grace period, so calls and streams in flight finish — no restart needed.

Note for stream owners: when a channel is closed under a call (grace period over, shard removed or
re-addressed, ``close``), grpc.aio ends the call as locally cancelled, and ``read()`` / ``async for``
raise ``asyncio.CancelledError`` although the reading task was not cancelled. Treat a CancelledError
while ``asyncio.current_task().cancelling() == 0`` as a lost stream.

Must not: make Operator API calls itself or decide anything about groups, instances or Kubernetes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import grpc
import grpc.aio

from nstance.core.errors import InvalidArgument
from nstance.operator.config import ShardEndpoint
from nstance.operator.context import ShardNotConfigured
from nstance.operator.health import OperatorMetrics
from nstance.pki.certs import SERVER_COMMON_NAME
from nstance.pki.tlsclient import forwarded_aio_channel, needs_openssl
from nstance.rpc import operator_pb2_grpc

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024
KEEPALIVE_MS: Final = 20_000
KEEPALIVE_TIMEOUT_MS: Final = 10_000
DEFAULT_GRACE: Final = 30.0


def channel_options(
    *, reconnect_min: float = 1.0, reconnect_max: float = 30.0
) -> list[tuple[str, int | str]]:
    """gRPC options of every Operator API channel."""
    return [
        ("grpc.ssl_target_name_override", SERVER_COMMON_NAME),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", int(reconnect_min * 1000)),
        ("grpc.min_reconnect_backoff_ms", int(reconnect_min * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(reconnect_max * 1000)),
        # A fresh channel per credential set: never share a subchannel with an older certificate.
        ("grpc.use_local_subchannel_pool", 1),
    ]


def _uses_openssl(ca_pem: bytes) -> bool:
    """Whether channels run over OpenSSL (an Ed25519 CA); an unreadable CA is left to grpcio to refuse."""
    try:
        return needs_openssl(ca_pem)
    except InvalidArgument:
        return False


async def _wait_for(event: asyncio.Event) -> None:
    await event.wait()


@dataclass
class _Shard:
    shard: str
    endpoint: ShardEndpoint
    channel: grpc.aio.Channel
    stub: operator_pb2_grpc.OperatorServiceStub
    reachable: bool = False
    error: str = "not connected yet"
    connected_once: bool = False
    watcher: asyncio.Task[None] | None = None


class ShardSet:
    """The operator's connections to its shards; implements ``context.ShardAccess``."""

    def __init__(
        self,
        ca_pem: bytes,
        cert_pem: bytes,
        key_pem: bytes,
        *,
        metrics: OperatorMetrics | None = None,
        grace: float = DEFAULT_GRACE,
        reconnect_min: float = 1.0,
        reconnect_max: float = 30.0,
    ) -> None:
        self._ca_pem = ca_pem
        self._cert_pem = cert_pem
        self._key_pem = key_pem
        self._openssl = _uses_openssl(ca_pem)
        self._metrics = metrics or OperatorMetrics()
        self._grace = grace
        self._reconnect = (reconnect_min, reconnect_max)
        self._shards: dict[str, _Shard] = {}
        self._changed = asyncio.Event()
        self._closers: set[asyncio.Task[None]] = set()
        self._closed = False

    # --- ShardAccess ---------------------------------------------------------------------------------

    def configured(self) -> Sequence[str]:
        return list(self._shards)

    def stub(self, shard: str) -> operator_pb2_grpc.OperatorServiceStub:
        entry = self._shards.get(shard)
        if entry is None:
            known = ", ".join(self._shards) or "none"
            raise ShardNotConfigured(f"shard {shard!r} is not in the operator config (configured: {known})")
        return entry.stub

    def reachable(self, shard: str) -> bool:
        entry = self._shards.get(shard)
        return entry is not None and entry.reachable

    def report(self, shard: str, ok: bool, error: str = "") -> None:
        entry = self._shards.get(shard)
        if entry is None:
            return
        self._set(entry, ok, error or ("" if ok else "call failed"))

    def wait_changed(self) -> Coroutine[Any, Any, None]:
        """Wait for the next change after *this call* (the event is taken now, not when the
        coroutine first runs, so ``ensure_future(shards.wait_changed())`` misses nothing)."""
        return _wait_for(self._changed)

    # --- extras for the runtime, health and renewal ------------------------------------------------------

    def endpoint(self, shard: str) -> ShardEndpoint:
        entry = self._shards.get(shard)
        if entry is None:
            raise ShardNotConfigured(f"shard {shard!r} is not in the operator config")
        return entry.endpoint

    def error(self, shard: str) -> str:
        """Why the shard is not reachable ("" when it is)."""
        entry = self._shards.get(shard)
        return "not configured" if entry is None else ("" if entry.reachable else entry.error)

    def any_reachable(self) -> bool:
        return any(entry.reachable for entry in self._shards.values())

    def describe(self) -> str:
        """``zone-a: reachable; zone-b: UNAVAILABLE: ...`` for logs and /readyz."""
        return (
            "; ".join(f"{s}: {'reachable' if e.reachable else e.error}" for s, e in self._shards.items())
            or "no shards configured"
        )

    # --- state ------------------------------------------------------------------------------------------

    def _set(self, entry: _Shard, ok: bool, error: str) -> None:
        was = entry.reachable
        entry.reachable = ok
        entry.error = "" if ok else error
        if ok and not was:
            if entry.connected_once:
                self._metrics.reconnects.labels(entry.shard).inc()
                log.info("shard %s (%s) is reachable again", entry.shard, entry.endpoint.operator_addr)
            entry.connected_once = True
        elif was and not ok:
            log.warning(
                "shard %s (%s) became unreachable: %s", entry.shard, entry.endpoint.operator_addr, error
            )
        self._publish_metrics()

    def _publish_metrics(self) -> None:
        for shard, entry in self._shards.items():
            self._metrics.shard_reachable.labels(shard).set(1 if entry.reachable else 0)
        self._metrics.shards_reachable.set(sum(1 for e in self._shards.values() if e.reachable))
        self._metrics.shards_configured.set(len(self._shards))

    def _notify(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    def _open(self, target: str) -> grpc.aio.Channel:
        low, high = self._reconnect
        options = channel_options(reconnect_min=low, reconnect_max=high)
        if self._openssl:
            return forwarded_aio_channel(target, self._ca_pem, self._key_pem, self._cert_pem, options=options)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self._ca_pem, private_key=self._key_pem, certificate_chain=self._cert_pem
        )
        return grpc.aio.secure_channel(target, credentials, options=options)

    async def _follow(self, entry: _Shard, channel: grpc.aio.Channel) -> None:
        """Keep the channel connecting and mirror its state into ``reachable``."""
        while True:
            state = channel.get_state(try_to_connect=True)
            if state == grpc.ChannelConnectivity.READY:
                self._set(entry, True, "")
            elif state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                self._set(entry, False, f"cannot connect to {entry.endpoint.operator_addr}")
            elif state == grpc.ChannelConnectivity.SHUTDOWN:
                return
            await channel.wait_for_state_change(state)

    def _start(self, shard: str, endpoint: ShardEndpoint) -> _Shard:
        channel = self._open(endpoint.operator_addr)
        entry = _Shard(shard, endpoint, channel, operator_pb2_grpc.OperatorServiceStub(channel))
        entry.watcher = asyncio.create_task(self._follow(entry, channel), name=f"shard-{shard}-state")
        return entry

    def _retire(self, channel: grpc.aio.Channel, watcher: asyncio.Task[None] | None, delay: float) -> None:
        async def close_later() -> None:
            try:
                if delay > 0:
                    await asyncio.sleep(delay)
            finally:
                if watcher is not None:
                    watcher.cancel()
                await channel.close()

        task = asyncio.create_task(close_later(), name="shard-channel-close")
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)

    # --- changes ----------------------------------------------------------------------------------------

    def update(self, shards: Mapping[str, ShardEndpoint]) -> None:
        """Follow a new shard map: open new shards, close removed ones, re-open changed addresses."""
        if self._closed:
            return
        changed = False
        current = dict(self._shards)
        new: dict[str, _Shard] = {}
        for shard, endpoint in shards.items():
            entry = current.pop(shard, None)
            if entry is not None and entry.endpoint.operator_addr == endpoint.operator_addr:
                entry.endpoint = endpoint
                new[shard] = entry
                continue
            if entry is not None:
                log.info(
                    "shard %s moved from %s to %s; reconnecting",
                    shard,
                    entry.endpoint.operator_addr,
                    endpoint.operator_addr,
                )
                self._retire(entry.channel, entry.watcher, 0)
            else:
                log.info("connecting to shard %s at %s", shard, endpoint.operator_addr)
            new[shard] = self._start(shard, endpoint)
            changed = True
        for shard, entry in current.items():
            log.info("shard %s removed from the operator config; closing its connection", shard)
            self._retire(entry.channel, entry.watcher, 0)
            with contextlib.suppress(KeyError):
                self._metrics.shard_reachable.remove(shard)
            changed = True
        if list(new) != list(self._shards):
            changed = True
        self._shards = new
        self._publish_metrics()
        if changed:
            self._notify()

    def set_credentials(self, cert_pem: bytes, key_pem: bytes) -> None:
        """Use a renewed certificate: new channels now, old ones closed after the grace period."""
        self._cert_pem, self._key_pem = cert_pem, key_pem
        for shard, entry in list(self._shards.items()):
            old_channel, old_watcher = entry.channel, entry.watcher
            channel = self._open(entry.endpoint.operator_addr)
            entry.channel = channel
            entry.stub = operator_pb2_grpc.OperatorServiceStub(channel)
            entry.watcher = asyncio.create_task(self._follow(entry, channel), name=f"shard-{shard}-state")
            self._retire(old_channel, old_watcher, self._grace)
        log.info(
            "shard connections now use the renewed certificate; old connections close in %.0fs", self._grace
        )
        self._notify()

    async def close(self) -> None:
        """Close every channel now (the runtime stops leading or exits)."""
        self._closed = True
        entries, self._shards = list(self._shards.values()), {}
        for entry in entries:
            with contextlib.suppress(KeyError):
                self._metrics.shard_reachable.remove(entry.shard)
        self._publish_metrics()
        for entry in entries:
            if entry.watcher is not None:
                entry.watcher.cancel()
            await entry.channel.close()
        closers = list(self._closers)
        for task in closers:
            task.cancel()
        for task in closers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for entry in entries:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                if entry.watcher is not None:
                    await entry.watcher
        self._notify()
