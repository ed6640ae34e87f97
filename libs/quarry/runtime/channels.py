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
]


def open_channel(target: str) -> grpc.Channel:
    """An insecure channel to `target` ("host:port"), traced when tracing is on."""
    return telemetry.instrument_channel(grpc.insecure_channel(target, options=CHANNEL_OPTIONS))


def channel_for(target: str | grpc.Channel) -> tuple[grpc.Channel, bool]:
    """(channel, owned): a new channel for an address (the caller closes it), or the
    caller's own channel as given."""
    if isinstance(target, str):
        return open_channel(target), True
    return target, False
