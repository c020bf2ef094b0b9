"""The grpcio server options of the shard's three APIs, built from ``shard.limits``.

Message sizes come from ``shard.limits.max_message_bytes`` (upstream's 4 MiB by default). The agent
and operator ports carry watch streams that live for days, so they also ping idle connections
(upstream's agent keepalive settings). Pure: returns option lists for ``grpc.aio.server``.
"""

from __future__ import annotations

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


def server_options(limits: LimitsConfig, *, streams: bool) -> Options:
    """Options for one API server; ``streams`` for the ports serving long-lived watch streams."""
    options: Options = [
        ("grpc.max_receive_message_length", limits.max_message_bytes),
        ("grpc.max_send_message_length", limits.max_message_bytes),
    ]
    if streams:
        options += KEEPALIVE
    return options
