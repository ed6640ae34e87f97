"""Client channels to Quarry services: one place for message limits, tracing, transport
security (TLS, mTLS: quarry.runtime.tls) and the bearer token every call carries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from quarry.runtime.tls import ChannelSecurity, environment_channel_security
from quarry.telemetry.rpc import instrument_channel

# Large enough for batch RPCs of staged entries and streamed range changes; single items
# are capped far lower (400 KB KV items).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # A restarted peer is found again within ~2 s: gRPC's default reconnect backoff grows
    # to 120 s, during which every call on the channel fails at once.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


AUTHORIZATION_HEADER = "authorization"
# A Quarry service relaying a user's call sends its own token here (the user's stays in
# `authorization`): the call is still the user's, authorized as the user's, and the server
# records the relay (quarry.auth.tokens.Principal.relayed_by). Checks that trust what the
# service did for the user (quarry.auth.checks.check_import: addresses of bytes it wrote)
# read it.
RELAY_HEADER = "x-quarry-relayed-by"

# Returns the current bearer token (fresh: the source renews it before it expires).
TokenSource = Callable[[], str]


class BearerToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer <token>` to every call, asking `token_source` each time
    (it caches; asking is cheap). A call that already carries an authorization header keeps
    its own."""

    def __init__(self, token_source: TokenSource):
        self._token_source = token_source

    def _with_token(self, details: Any) -> Any:
        metadata = list(details.metadata or ())
        if not any(key.lower() == AUTHORIZATION_HEADER for key, _ in metadata):
            metadata.append((AUTHORIZATION_HEADER, f"Bearer {self._token_source()}"))
        return call_details_with(details, metadata)

    def intercept_unary_unary(self, continuation, client_call_details, request):  # noqa: ANN001, ANN201
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):  # noqa: ANN001, ANN201
        return continuation(self._with_token(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):  # noqa: ANN001, ANN201
        return continuation(self._with_token(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # noqa: ANN001, ANN201
        return continuation(self._with_token(client_call_details), request_iterator)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(  # grpc's ClientCallDetails fields
        self,
        method: str,
        timeout: float | None,
        metadata: Any,
        credentials: Any,
        wait_for_ready: Any,
        compression: Any,
    ):
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression


def call_details_with(details: Any, metadata: Any) -> grpc.ClientCallDetails:
    """A client interceptor's `details` (grpc.ClientCallDetails) with `metadata` in place
    of its own."""
    return _CallDetails(
        details.method,
        details.timeout,
        metadata,
        details.credentials,
        getattr(details, "wait_for_ready", None),
        getattr(details, "compression", None),
    )


def with_token(channel: grpc.Channel, token_source: TokenSource | None) -> grpc.Channel:
    """`channel` with every call carrying the bearer token of `token_source` (as is when
    None). Closing the result closes `channel`."""
    if token_source is None:
        return channel
    return grpc.intercept_channel(channel, BearerToken(token_source))


def open_channel(
    target: str,
    *,
    traced: bool = True,
    token_source: TokenSource | None = None,
    security: ChannelSecurity | None = None,
) -> grpc.Channel:
    """A channel to `target` ("host:port", or "dns:///name:port" for a name with several
    addresses): the one place channels are opened. Secured as `security` says — a service
    passes channel_security(its settings); None: as the environment's settings say
    (QUARRY_TLS_*; plaintext when none is set), which is what a user's client wants. Traced
    when tracing is on, unless `traced=False` (background traffic that belongs to no request,
    such as staging reports and readiness probes). With `token_source`, every call carries
    `authorization: Bearer <token>`."""
    if security is None:
        security = environment_channel_security()
    options = CHANNEL_OPTIONS
    if target.startswith("dns:///"):
        # A name with several addresses (a headless Service's pods): calls spread over all.
        options = [*CHANNEL_OPTIONS, ("grpc.lb_policy_name", "round_robin")]
    if security.tls:
        channel = grpc.secure_channel(
            target, security.credentials(), options=options + security.options()
        )
    else:
        channel = grpc.insecure_channel(target, options=options)
    channel = instrument_channel(channel) if traced else channel
    return with_token(channel, token_source)


def open_service_channel(
    target: str,
    token_source: TokenSource | None = None,
    security: ChannelSecurity | None = None,
) -> tuple[grpc.Channel, grpc.Channel]:
    """(raw, traced) views of ONE channel to another Quarry service: data calls go through
    `traced` (carrying the service's token when `token_source` is given); the readiness
    probe (quarry.runtime.server.service_dependency) uses `raw` — health is open — so
    probing makes no spans yet proves the connection the data calls use. Close `raw`.
    `security`: as for open_channel (services pass channel_security(settings))."""
    raw = open_channel(target, traced=False, security=security)
    return raw, with_token(instrument_channel(raw), token_source)


def channel_for(target: str | grpc.Channel) -> tuple[grpc.Channel, bool]:
    """(channel, owned): a new channel for an address (the caller closes it), or the
    caller's own channel as given."""
    if isinstance(target, str):
        return open_channel(target), True
    return target, False
