"""gRPC's side of telemetry: the per-call metrics interceptor (RpcMetrics), the tracing
server interceptor and channel instrumentation. Apart from quarry.telemetry so that the core
(which counts and traces through quarry.telemetry) never imports gRPC: only the servers and
channels (quarry.runtime) import this module."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from quarry.runtime.handlers import wrap_behavior
from quarry.telemetry import tracing_enabled

# Infrastructure, not users' requests: probes (readiness, kubelet) and grpcurl's reflection.
# Not traced on the server, and not counted in quarry_rpc_requests_total: a kubelet's probes
# would otherwise outnumber a quiet service's real calls.
INFRASTRUCTURE_METHOD_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


class RpcMetrics(grpc.ServerInterceptor):
    """Counts and times every call but health checks and reflection (the outermost
    interceptor, so refusals by the others are counted with their codes). Per call: two clock
    reads and two cached-child updates."""

    def __init__(self, service: str) -> None:
        # Imported by servers only: clients (the CLI) load this module for
        # instrument_channel and are spared prometheus_client's start-up.
        from quarry.telemetry.metrics import RPC_DURATION, RPC_REQUESTS, expose

        expose(RPC_REQUESTS, RPC_DURATION)
        self._requests, self._durations = RPC_REQUESTS, RPC_DURATION
        self._service = service
        # Wrapped handlers by method: (the handler wrapped, the wrapper).
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if method.startswith(INFRASTRUCTURE_METHOD_PREFIXES):
            return handler  # health probes and reflection: not users' calls
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler, method.lstrip("/"))
        # One entry per method: a handler rebuilt per call (tracing on) replaces it.
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _recorder(self, method: str) -> Callable[[grpc.StatusCode | None, float], None]:
        children: dict[grpc.StatusCode | None, tuple[Any, Any]] = {}
        service, requests, durations = self._service, self._requests, self._durations

        def record(code: grpc.StatusCode | None, started: float) -> None:
            elapsed = time.perf_counter() - started
            pair = children.get(code)
            if pair is None:
                name = (code or grpc.StatusCode.OK).name
                pair = children[code] = (
                    requests.labels(service, method, name),
                    durations.labels(service, method, name),
                )
            pair[0].inc()
            pair[1].observe(elapsed)

        return record

    def _wrap(self, handler: Any, method: str) -> Any:
        """`handler`: a grpc RpcMethodHandler (a namedtuple in grpc's implementation)."""
        record = self._recorder(method)

        def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(request: Any, context: grpc.ServicerContext) -> Any:
                started = time.perf_counter()
                try:
                    response = behavior(request, context)
                except BaseException:
                    record(_code_of(context), started)
                    raise
                record(context.code(), started)  # type: ignore[attr-defined]
                return response

            return wrapper

        def streaming(behavior: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
            def wrapper(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                started = time.perf_counter()
                try:
                    yield from behavior(request, context)
                except BaseException:
                    record(_code_of(context), started)
                    raise
                record(context.code(), started)  # type: ignore[attr-defined]

            return wrapper

        return wrap_behavior(handler, unary, streaming)


def _code_of(context: grpc.ServicerContext) -> grpc.StatusCode:
    """The status of a call that raised: the code it aborted with, else UNKNOWN (what gRPC
    answers for an uncaught exception); CANCELLED for a call the client gave up on."""
    code = context.code()  # type: ignore[attr-defined]
    if code is not None:
        return code
    return grpc.StatusCode.UNKNOWN if context.is_active() else grpc.StatusCode.CANCELLED


class _TracingServerSwitch(grpc.ServerInterceptor):
    def __init__(self) -> None:
        self._otel: grpc.ServerInterceptor | None = None

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        if not tracing_enabled() or handler_call_details.method.startswith(
            INFRASTRUCTURE_METHOD_PREFIXES
        ):
            return continuation(handler_call_details)
        otel = self._otel
        if otel is None:
            from opentelemetry.instrumentation.grpc import server_interceptor

            otel = self._otel = server_interceptor()
        return otel.intercept_service(continuation, handler_call_details)


def server_interceptors() -> Sequence[grpc.ServerInterceptor]:
    """The tracing interceptor: OpenTelemetry's server interceptor whenever tracing is on
    (decided per call), a pass-through otherwise."""
    return [_TracingServerSwitch()]


class _MultiCallableSwitch:
    """A stub's multicallable: OpenTelemetry's while tracing is on, the plain one otherwise."""

    __slots__ = ("_plain", "_make_traced", "_traced")

    def __init__(self, plain: Any, make_traced: Callable[[], Any]) -> None:
        self._plain = plain
        self._make_traced = make_traced
        self._traced: Any = None

    def _pick(self) -> Any:
        if not tracing_enabled():
            return self._plain
        traced = self._traced
        if traced is None:
            traced = self._traced = self._make_traced()
        return traced

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._pick()(*args, **kwargs)

    def with_call(self, *args: Any, **kwargs: Any) -> Any:
        return self._pick().with_call(*args, **kwargs)

    def future(self, *args: Any, **kwargs: Any) -> Any:
        return self._pick().future(*args, **kwargs)


class _TracingChannel(grpc.Channel):
    """`channel` with the per-call tracing switch on every method (see above)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._channel = channel
        self._traced_channel: Any = None

    def _traced(self) -> Any:
        if self._traced_channel is None:
            # OpenTelemetry's own channel wrapper (it also covers streams).
            from opentelemetry.instrumentation.grpc import client_interceptor, intercept_channel

            self._traced_channel = intercept_channel(self._channel, client_interceptor())
        return self._traced_channel

    def _switch(self, kind: str, args: tuple, kwargs: dict[str, Any]) -> _MultiCallableSwitch:
        plain = getattr(self._channel, kind)(*args, **kwargs)
        return _MultiCallableSwitch(plain, lambda: getattr(self._traced(), kind)(*args, **kwargs))

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self._switch("unary_unary", args, kwargs)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._switch("unary_stream", args, kwargs)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self._switch("stream_unary", args, kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._switch("stream_stream", args, kwargs)

    def subscribe(self, *args: Any, **kwargs: Any) -> None:
        self._channel.subscribe(*args, **kwargs)

    def unsubscribe(self, *args: Any, **kwargs: Any) -> None:
        self._channel.unsubscribe(*args, **kwargs)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> _TracingChannel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def instrument_channel(channel: grpc.Channel) -> grpc.Channel:
    """`channel` propagating trace context on every call made while tracing is on (whenever
    it was turned on). Closing the result closes `channel`."""
    return _TracingChannel(channel)
