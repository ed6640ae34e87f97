"""Tracing (OpenTelemetry) and metrics (Prometheus) for every service and client.

Tracing is off unless configured by the standard variables: OTEL_TRACES_EXPORTER
(`otlp` or `console`) or OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT.
OTEL_SERVICE_NAME names the service (default: quarry-<service>). Tests call
`use_in_memory_exporter()` to capture spans. Trace context crosses processes in gRPC
metadata through the interceptors returned by `server_interceptors()` / `instrument_channel()`,
which decide per call (tracing may be configured after a channel is made). Background loops
run under `background()` and emit no spans.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

_lock = threading.Lock()
_configured = False
_random = random.Random()


class _PrivateIdGenerator(IdGenerator):
    """Trace and span ids from Quarry's own generator. OpenTelemetry's default draws them
    from the global `random` state, which belongs to the application (a seeded Spark job,
    a test's Hypothesis): every span would move it."""

    def generate_span_id(self) -> int:
        return _random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return _random.getrandbits(128) or 1


# Every id Quarry makes: its tracer providers' and the background work's unsampled context.
_IDS = _PrivateIdGenerator()


def _provider(service_name: str) -> TracerProvider:
    return TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}), id_generator=_IDS)


def tracing_requested(env: Mapping[str, str] = os.environ) -> bool:
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter in ("none", ""):
        return bool(
            exporter == ""
            and (
                env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            )
        )
    return True


def configure_tracing(service: str, env: Mapping[str, str] = os.environ) -> bool:
    """Install a global TracerProvider if the OTEL_* variables ask for one. Idempotent."""
    global _configured
    with _lock:
        if _configured or not tracing_requested(env):
            return _configured
        name = env.get("OTEL_SERVICE_NAME") or f"quarry-{service}"
        provider = _provider(name)
        exporters = env.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",")
        for exporter in exporters:
            exporter = exporter.strip()
            if exporter == "console":
                provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
            elif exporter in ("otlp", ""):
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        _configured = True
        return True


def use_in_memory_exporter(service: str = "test") -> InMemorySpanExporter:
    """For tests: record every span in memory (installs the global provider once)."""
    global _configured
    with _lock:
        exporter = InMemorySpanExporter()
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            current.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            provider = _provider(service)
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
        _configured = True
        return exporter


def enable_propagation(service: str, env: Mapping[str, str] = os.environ) -> None:
    """Make this process's gRPC calls carry the current trace context, exporting its own
    spans only if the OTEL_* variables ask for it. For processes that join a trace started
    elsewhere (Spark executors): without a provider there would be no context to send."""
    global _configured
    if configure_tracing(service, env):
        return
    with _lock:
        if _configured:
            return
        if not isinstance(trace.get_tracer_provider(), TracerProvider):
            trace.set_tracer_provider(_provider(f"quarry-{service}"))
        _configured = True


def tracer(name: str = "quarry") -> trace.Tracer:
    return trace.get_tracer(name)


def tracing_enabled() -> bool:
    return _configured


# ---- calls that belong to no request ------------------------------------------------------


@contextlib.contextmanager
def background() -> Iterator[None]:
    """Run background work (readiness probes, the sensor's scans, the dropper, staging
    reports) under an UNSAMPLED span context: the gRPC calls it makes carry
    `traceparent ...-00`, so neither this process nor any service it calls records a span
    for them (the default ParentBased sampler follows the caller). An idle suite exports
    nothing. Work worth a trace of its own starts one with `root_span`."""
    if not _configured:
        yield
        return
    unsampled = NonRecordingSpan(
        SpanContext(
            trace_id=_IDS.generate_trace_id(),
            span_id=_IDS.generate_span_id(),
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.DEFAULT),
        )
    )
    token = otel_context.attach(trace.set_span_in_context(unsampled))
    try:
        yield
    finally:
        otel_context.detach(token)


def root_span(name: str, attributes: Mapping[str, str] | None = None) -> Any:
    """A span that starts a new trace whatever is current (e.g. a compaction the sensor
    triggers from its unsampled background loop). A context manager."""
    return tracer("quarry").start_as_current_span(
        name, context=otel_context.Context(), attributes=attributes
    )


# ---- gRPC -----------------------------------------------------------------------------------
#
# OpenTelemetry's interceptors cost ~0.1 ms per call even when spans are not recorded, a large
# share of a ~0.3 ms RPC. So every server and channel gets a switch that asks, per call, whether
# tracing is on (a module global): off, the call goes straight through (one Python call more);
# on, through OpenTelemetry's interceptor, built on first use. Whether a call is traced thus
# never depends on whether tracing was configured before or after the channel was made.

# Not traced on the server: probes (readiness, kubelet) and grpcurl's reflection.
_UNTRACED_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


class _TracingServerSwitch(grpc.ServerInterceptor):
    def __init__(self) -> None:
        self._otel: grpc.ServerInterceptor | None = None

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        if not _configured or handler_call_details.method.startswith(_UNTRACED_PREFIXES):
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
        if not _configured:
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
