"""The grpcio server options of the shard's three APIs, built from ``shard.limits``.

Message sizes come from ``shard.limits.max_message_bytes`` (upstream's 4 MiB by default). Each port
holds at most ``max_connections`` (``grpc.max_allowed_incoming_connections``: grpcio 1.85 closes any
connection beyond it as soon as it is accepted, measured with a few hundred idle sockets) and closes
a connection whose TLS/HTTP2 handshake has not finished within ``shard.limits.handshake_timeout``
(``grpc.server_handshake_timeout_ms``; grpc's own default is two minutes). The registration port also
closes connections without a call for ``registration_idle_timeout``. The agent and operator ports
carry watch streams that live for days, so they ping idle connections instead (upstream's agent
keepalive settings). Pure: returns option lists for ``grpc.aio.server``.
"""

from __future__ import annotations

from datetime import timedelta

from nstance.config.limits import LimitsConfig

Options = list[tuple[str, int]]

#: Agent and operator watch streams live for days: ping after 20 s idle, give up after 10 s without an
#: answer, and let clients ping every 10 s even without an active call (upstream's agent settings).
KEEPALIVE: Options = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


def _ms(value: timedelta) -> int:
    return max(1, int(value.total_seconds() * 1000))


def server_options(limits: LimitsConfig, *, streams: bool, max_connections: int) -> Options:
    """Options for one API server; ``streams`` for the ports serving long-lived watch streams."""
    options: Options = [
        ("grpc.max_receive_message_length", limits.max_message_bytes),
        ("grpc.max_send_message_length", limits.max_message_bytes),
        ("grpc.max_allowed_incoming_connections", max_connections),
        ("grpc.server_handshake_timeout_ms", _ms(limits.handshake_timeout)),
    ]
    if streams:
        options += KEEPALIVE
    else:
        options.append(("grpc.max_connection_idle_ms", _ms(limits.registration_idle_timeout)))
    return options
