"""A client's bearer token: obtained by Auth/Login with the client's credentials, attached to
every call on every channel the client opens (one client interceptor; the Client's own unary
calls carry it as call metadata through TokenStub, with the same rules, at less cost per
call), and refreshed.

Refresh: before a call, when the token expires within REFRESH_MARGIN_SECONDS; and once
after a unary call the server refused with UNAUTHENTICATED / TOKEN_EXPIRED (clock skew, a
server-side lifetime shorter than ours), which is then retried once with the new token.
Any other UNAUTHENTICATED (revoked credential, deleted user, wrong signature...) is final:
logging in again would not help, or would hide the revocation — except for a token taken from
the token cache (quarry.client.token_cache, the CLI's): it is dropped and the client logs in
once, so Login, not a stale token, answers for the credentials. Streaming calls carry the
token too; one refused as expired is not replayed here (its request stream is consumed),
but the next call logs in again.

Safety rule: the secret only ever travels in the Login request; the token is never logged
and never sent on a call when there are neither credentials nor a token (a server with
auth off sees exactly the calls it saw before).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from quarry import errors
from quarry.auth import errors as auth_errors
from quarry.client.credentials import ACCESS_KEY_ENV, SECRET_KEY_ENV, Credentials
from quarry.client.token_cache import TokenCache
from quarry.runtime.channels import AUTHORIZATION_HEADER, call_details_with
from quarry.runtime.errors import from_rpc_error

REFRESH_MARGIN_SECONDS = 60.0
TOKEN_EXPIRED = auth_errors.TokenExpired.reason

# (token, expires_at in epoch seconds) for the credentials: Auth/Login.
Login = Callable[[Credentials], tuple[str, float]]

HOW_TO_GET_CREDENTIALS = (
    f"run `quarry setup` on a new installation (or `quarry up`, which runs it), or set "
    f"{ACCESS_KEY_ENV} and {SECRET_KEY_ENV} (`quarry auth credentials create USER` makes them)"
)


class NoCredentials(auth_errors.Unauthenticated):
    """A token was asked for, but the client has neither credentials nor a token."""

    reason = "NO_CREDENTIALS"


class TokenSource:
    """The current bearer token: a fixed one given by the caller, or one from Login with the
    credentials, renewed when it is about to expire. Thread-safe; logs in at most once at a
    time."""

    def __init__(  # noqa: PLR0913 — the login, what it logs in with, and the cache
        self,
        login: Login,
        credentials: Credentials | None = None,
        token: str | None = None,
        clock: Callable[[], float] = time.time,
        margin: float = REFRESH_MARGIN_SECONDS,
        cache: TokenCache | None = None,
        endpoint: str = "",
    ) -> None:
        """`cache`: tokens kept between processes (the CLI's), filed under `endpoint` (where
        Login goes) and the credentials' access key id."""
        self._login = login
        self._credentials = credentials
        self._token = token or ""
        # A given token's expiry is unknown: used as is, never renewed without credentials.
        self._expires_at = float("inf") if token else 0.0
        self._clock = clock
        self._margin = margin
        self._lock = threading.Lock()
        self._cache = cache if credentials is not None and endpoint else None
        self._endpoint = endpoint
        self._from_cache = ""  # the token in use, when it came from the cache
        self._refused: set[str] = set()  # cached tokens a server refused

    @property
    def active(self) -> bool:
        """Whether calls carry a token at all."""
        return self._credentials is not None or bool(self._token)

    @property
    def can_refresh(self) -> bool:
        return self._credentials is not None

    def token(self) -> str:
        """The token to send now, logging in first when there is none or it expires soon."""
        with self._lock:
            if self._credentials is None:
                if not self._token:
                    raise NoCredentials(f"no credentials: {HOW_TO_GET_CREDENTIALS}")
            elif not self._expires_at or self._expires_at - self._clock() < self._margin:
                self._renew(self._credentials)
            return self._token  # "" only when the server has no Auth service (auth off)

    def _renew(self, credentials: Credentials) -> None:
        """A token from the cache if it holds a good one, else from Login (then cached)."""
        if self._cache is not None:
            cached = self._cache.lookup(self._endpoint, credentials, self._margin)
            if cached is not None and cached[0] not in self._refused:
                (self._token, self._expires_at), self._from_cache = cached, cached[0]
                return
        self._token, self._expires_at = self._login(credentials)
        self._from_cache = ""
        if self._cache is not None and self._token:
            self._cache.store(self._endpoint, credentials, self._token, self._expires_at)

    def refused(self, token: str, reason: str) -> bool:
        """A call with `token` was refused as UNAUTHENTICATED with `reason`: whether to log in
        again and retry it once. Yes for an expired token; for a token from the cache, for
        any reason (a restarted server with a new signing key, a revoked session: the cached
        token goes, and Login then answers for the credentials themselves). Any other
        refusal is final."""
        if self._credentials is None:
            return False
        with self._lock:
            from_cache = bool(token) and token == self._from_cache
            if reason != TOKEN_EXPIRED and not from_cache:
                return False
            if from_cache and self._cache is not None:
                self._cache.drop(self._endpoint, self._credentials)
                self._refused.add(token)  # never taken from the cache again
            if self._token == token:  # else another thread already renewed it
                self._token, self._expires_at, self._from_cache = "", 0.0, ""
            return True

    def expired(self, token: str) -> None:
        """The server said `token` expired: log in again on the next call (unless another
        thread already did)."""
        self.refused(token, TOKEN_EXPIRED)


def _bearer(metadata: Any, token: str) -> list[tuple[str, str]]:
    """`metadata` with `authorization: Bearer <token>` in place of any it carries."""
    replaced = [
        (key, value) for key, value in (metadata or ()) if key.lower() != AUTHORIZATION_HEADER
    ]
    replaced.append((AUTHORIZATION_HEADER, f"Bearer {token}"))
    return replaced


def _with_token(details: grpc.ClientCallDetails, token: str) -> grpc.ClientCallDetails:
    if not token:
        return details
    return call_details_with(details, _bearer(details.metadata, token))


def _refusal(outcome: Any) -> str | None:
    """The ErrorInfo reason of a finished unary call that failed with UNAUTHENTICATED,
    else None."""
    try:
        if outcome.code() != grpc.StatusCode.UNAUTHENTICATED:
            return None
        error = outcome.exception()
    except grpc.RpcError as raised:  # some call objects raise instead of answering
        error = raised
    if error is None:
        return None
    return _error_refusal(error)


class BearerTokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer <token>` to every call (see the module docstring)."""

    def __init__(self, source: TokenSource) -> None:
        self._source = source

    def intercept_unary_unary(
        self, continuation: Any, client_call_details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        token = self._source.token()
        outcome = continuation(_with_token(client_call_details, token), request)
        reason = _refusal(outcome) if self._source.can_refresh else None
        if reason is not None and self._source.refused(token, reason):
            outcome = continuation(_with_token(client_call_details, self._source.token()), request)
        return outcome

    def intercept_unary_stream(
        self, continuation: Any, client_call_details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        return continuation(_with_token(client_call_details, self._source.token()), request)

    def intercept_stream_unary(
        self, continuation: Any, client_call_details: grpc.ClientCallDetails, request_iterator: Any
    ) -> Any:
        token = self._source.token()
        outcome = continuation(_with_token(client_call_details, token), request_iterator)
        reason = _refusal(outcome) if self._source.can_refresh else None
        if reason is not None:
            self._source.refused(token, reason)  # not replayed: the request stream is consumed
        return outcome

    def intercept_stream_stream(
        self, continuation: Any, client_call_details: grpc.ClientCallDetails, request_iterator: Any
    ) -> Any:
        return continuation(
            _with_token(client_call_details, self._source.token()), request_iterator
        )


class TokenStub:
    """A stub whose unary-unary methods carry the token as call metadata, without a client
    interceptor: gRPC's interceptor machinery costs ~10 us of CPU per call, a large share of
    auth's cost on a hot read such as StatObject. Same semantics as BearerTokenInterceptor's
    unary-unary: the client's token replaces any authorization header given, none is sent
    while the token is "" (a server without auth), and a call refused as TOKEN_EXPIRED is
    retried once after logging in again. Every other kind of method (streams) is taken from
    `intercepted`, the same stub over the channel with the interceptor."""

    def __init__(self, source: TokenSource, service: Any, plain: Any, intercepted: Any) -> None:
        """`service`: the ServiceDescriptor of both stubs (which methods are unary)."""
        self._source = source
        self._unary = frozenset(
            method.name
            for method in service.methods
            if not method.client_streaming and not method.server_streaming
        )
        self._plain = plain
        self._intercepted = intercepted

    def __getattr__(self, name: str) -> Any:
        if name in self._unary:
            method = _TokenUnary(self._source, getattr(self._plain, name))
        else:
            method = getattr(self._intercepted, name)
        setattr(self, name, method)  # found once per method
        return method


class _TokenUnary:
    def __init__(self, source: TokenSource, method: Any) -> None:
        self._source = source
        self._method = method
        self._metadata: tuple[str, tuple[tuple[str, str], ...]] = ("", ())

    def _with_token(self, token: str, metadata: Any) -> Any:
        if not token:
            return metadata
        if metadata is None:
            cached_token, cached = self._metadata
            if cached_token != token:
                cached = ((AUTHORIZATION_HEADER, f"Bearer {token}"),)
                self._metadata = (token, cached)
            return cached
        return _bearer(metadata, token)

    def __call__(self, request: Any, timeout: float | None = None, metadata: Any = None) -> Any:
        token = self._source.token()
        try:
            return self._method(
                request, timeout=timeout, metadata=self._with_token(token, metadata)
            )
        except grpc.RpcError as error:
            reason = _error_refusal(error) if self._source.can_refresh else None
            if reason is None or not self._source.refused(token, reason):
                raise
        return self._method(
            request, timeout=timeout, metadata=self._with_token(self._source.token(), metadata)
        )


def _error_refusal(error: grpc.RpcError) -> str | None:
    """The ErrorInfo reason of a call refused with UNAUTHENTICATED, else None."""
    code = getattr(error, "code", None)
    if code is None or code() != grpc.StatusCode.UNAUTHENTICATED:
        return None
    return from_rpc_error(error).reason


def login_over(channel: grpc.Channel, timeout: float | None) -> Login:
    """Auth/Login on `channel` (a channel WITHOUT the interceptor: Login is open)."""
    from quarry.runtime.errors import domain_errors
    from quarry.v1 import auth_pb2, auth_pb2_grpc

    stub = auth_pb2_grpc.AuthStub(channel)

    def login(credentials: Credentials) -> tuple[str, float]:
        request = auth_pb2.LoginRequest(
            access_key_id=credentials.access_key_id,
            secret_access_key=credentials.secret_access_key,
        )
        try:
            with domain_errors():
                reply = stub.Login(request, timeout=timeout)
        except errors.Unimplemented:
            # A server without the Auth service has auth off: calls go without a header.
            return "", float("inf")
        return reply.token, float(reply.expires_at.seconds)

    return login


__all__ = [
    "AUTHORIZATION_HEADER",
    "REFRESH_MARGIN_SECONDS",
    "HOW_TO_GET_CREDENTIALS",
    "NoCredentials",
    "TokenSource",
    "BearerTokenInterceptor",
    "TokenStub",
    "login_over",
]
