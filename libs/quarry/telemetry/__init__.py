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
import logging
import os
import random
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

# The SDK (tracer provider, processors, exporters) is imported where a provider is made: a
# process that never traces (most CLI commands) is spared ~0.1 s of CPU at start.
if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

# Where a local receiver listens (`quarry traces`, quarry.telemetry.receiver): OTLP/gRPC's
# registered port, the exporters' default endpoint.
DEFAULT_PORT = 4317
DEFAULT_ENDPOINT = f"http://127.0.0.1:{DEFAULT_PORT}"
# A received trace is complete once its root arrived and nothing more for this long.
DEFAULT_SETTLE_SECONDS = 2.0

_lock = threading.Lock()
_configured = False
_random = random.Random()


class _PrivateIdGenerator:
    """Trace and span ids from Quarry's own generator. OpenTelemetry's default draws them
    from the global `random` state, which belongs to the application (a seeded Spark job,
    a test's Hypothesis): every span would move it."""

    def generate_span_id(self) -> int:
        return _random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return _random.getrandbits(128) or 1

    def is_trace_id_random(self) -> bool:
        return False  # what IdGenerator's default answered when this was its subclass


# Every id Quarry makes: its tracer providers' and the background work's unsampled context.
_IDS = _PrivateIdGenerator()


def _provider(service_name: str) -> TracerProvider:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    # _PrivateIdGenerator has IdGenerator's two methods; registered as one when first used
    # (defining it as a subclass would import the SDK with this module).
    IdGenerator.register(_PrivateIdGenerator)
    # process.pid: which worker process of a service served a span (quarry.runtime.workers).
    resource = Resource.create({SERVICE_NAME: service_name, "process.pid": os.getpid()})
    return TracerProvider(resource=resource, id_generator=cast(IdGenerator, _IDS))


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


NOT_CONFIGURED = (
    "tracing is not configured, no spans will be exported: set OTEL_EXPORTER_OTLP_ENDPOINT "
    f"(e.g. {DEFAULT_ENDPOINT}, where `quarry traces` listens) or OTEL_TRACES_EXPORTER=console"
)


def configure_tracing(
    service: str, env: Mapping[str, str] = os.environ, warn_when_off: bool = True
) -> bool:
    """Install a global TracerProvider if the OTEL_* variables ask for one. Idempotent.
    When they do not (and OTEL_TRACES_EXPORTER is not an explicit `none`), a caller that
    asked for tracing gets a warning saying how to turn it on, not silence; services, for
    which off is the default, pass warn_when_off=False."""
    global _configured
    with _lock:
        if _configured:
            return True
        if not tracing_requested(env):
            explicitly_off = env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none"
            if warn_when_off and not explicitly_off:
                logging.getLogger(__name__).warning("quarry: warning: %s", NOT_CONFIGURED)
            return False
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
        )

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
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

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
    if configure_tracing(service, env, warn_when_off=False):
        return
    with _lock:
        if _configured:
            return
        if not _has_sdk_provider():
            trace.set_tracer_provider(_provider(f"quarry-{service}"))
        _configured = True


def _has_sdk_provider() -> bool:
    from opentelemetry.sdk.trace import TracerProvider

    return isinstance(trace.get_tracer_provider(), TracerProvider)


def flush(timeout_millis: int = 5000) -> bool:
    """Export the spans still batched (before a short-lived process exits). Safe whether or
    not tracing was configured: OpenTelemetry's default ProxyTracerProvider has no
    force_flush (AttributeError), so call this rather than the provider's."""
    force_flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    return bool(force_flush(timeout_millis)) if force_flush is not None else True


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
