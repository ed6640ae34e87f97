"""Client channels to Quarry services: one place for message limits and tracing."""

from __future__ import annotations

import grpc

from quarry import telemetry

# Large enough for batch RPCs of staged entries and streamed range changes; single items
# are capped far lower (400 KB KV items).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # A restarted peer is found again within ~2 s: gRPC's default reconnect backoff grows
    # to 120 s, during which every call on the channel fails at once.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def open_channel(target: str, *, traced: bool = True) -> grpc.Channel:
    """An insecure channel to `target` ("host:port"): the one place channels are opened.
    Traced when tracing is on, unless `traced=False` (background traffic that belongs to
    no request, such as staging reports and readiness probes)."""
    channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
    return telemetry.instrument_channel(channel) if traced else channel


def open_service_channel(target: str) -> tuple[grpc.Channel, grpc.Channel]:
    """(raw, traced) views of ONE channel to another Quarry service: data calls go through
    `traced`; the readiness probe (quarry.runtime.server.service_dependency) uses `raw`, so
    probing makes no spans yet proves the connection the data calls use. Close `raw`."""
    raw = open_channel(target, traced=False)
    return raw, telemetry.instrument_channel(raw)


def channel_for(target: str | grpc.Channel) -> tuple[grpc.Channel, bool]:
    """(channel, owned): a new channel for an address (the caller closes it), or the
    caller's own channel as given."""
    if isinstance(target, str):
        return open_channel(target), True
    return target, False
