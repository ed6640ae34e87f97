"""An OTLP trace receiver on loopback: the collector end of OTEL_EXPORTER_OTLP_ENDPOINT.

A real gRPC server implementing opentelemetry.proto.collector.trace.v1.TraceService, as an
OpenTelemetry Collector would; the services' real OTLP exporters send to it. Spans are kept
flattened (`ReceivedSpan`) with the service.name of the process that sent them."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from support.wait import wait_until


@dataclass(frozen=True)
class ReceivedSpan:
    service: str  # resource attribute service.name
    name: str
    kind: str  # SERVER, CLIENT, INTERNAL, ...
    trace_id: str  # hex
    span_id: str
    parent_id: str  # "" for a root span
    start: int  # start time, ns since the epoch
    events: tuple[tuple[str, dict[str, object]], ...] = field(default=())
    attributes: dict[str, object] = field(default_factory=dict, hash=False, compare=False)


def _value(any_value) -> object:
    which = any_value.WhichOneof("value")
    return getattr(any_value, which) if which else None


def _attributes(key_values) -> dict[str, object]:
    return {kv.key: _value(kv.value) for kv in key_values}


class _Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[ReceivedSpan] = []

    def Export(self, request, context):
        received = []
        for resource_spans in request.resource_spans:
            service = str(_attributes(resource_spans.resource.attributes).get("service.name"))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            service=service,
                            name=span.name,
                            kind=trace_pb2.Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            start=span.start_time_unix_nano,
                            events=tuple(
                                (event.name, _attributes(event.attributes)) for event in span.events
                            ),
                            attributes=_attributes(span.attributes),
                        )
                    )
        with self.lock:
            self.spans.extend(received)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    def __init__(self, receiver: _Receiver, port: int) -> None:
        self._receiver = receiver
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"

    def spans(self) -> list[ReceivedSpan]:
        with self._receiver.lock:
            return list(self._receiver.spans)

    def clear(self) -> None:
        with self._receiver.lock:
            self._receiver.spans.clear()

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.spans() if s.trace_id == trace_id]

    def wait_for(self, trace_id: str, services: set[str], timeout: float = 20.0) -> None:
        """Until spans of `trace_id` have arrived from every one of `services` (exporters
        batch: up to OTEL_BSP_SCHEDULE_DELAY after the call)."""
        wait_until(
            lambda: services <= {s.service for s in self.trace(trace_id)},
            timeout=timeout,
            what=f"spans of trace {trace_id} from {sorted(services)}",
        )


@contextlib.contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = _Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield OtlpReceiver(receiver, port)
    finally:
        server.stop(0)


def tree(spans: list[ReceivedSpan]) -> str:
    """The spans as an indented tree, `service: name` per line (for reports and failures)."""
    by_parent: dict[str, list[ReceivedSpan]] = {}
    ids = {s.span_id for s in spans}
    for span in spans:
        parent = span.parent_id if span.parent_id in ids else ""
        by_parent.setdefault(parent, []).append(span)
    for children in by_parent.values():
        children.sort(key=lambda s: s.start)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for span in by_parent.get(parent, []):
            events = sorted({name for name, _ in span.events})
            suffix = f"  [events: {', '.join(events)}]" if events else ""
            lines.append(f"{'  ' * depth}{span.service}: {span.name} ({span.kind}){suffix}")
            walk(span.span_id, depth + 1)

    walk("", 0)
    return "\n".join(lines)


class _ForwardWhileActive(SpanProcessor):
    """Sends this process's finished spans to a receiver while active; shut down after."""

    def __init__(self, endpoint: str) -> None:
        self._processor = BatchSpanProcessor(
            OTLPSpanExporter(endpoint=endpoint, insecure=True), schedule_delay_millis=100
        )
        self.active = True

    def on_start(self, span, parent_context=None) -> None:
        pass

    def on_end(self, span) -> None:
        if self.active:
            self._processor.on_end(span)

    def shutdown(self) -> None:
        self.active = False
        self._processor.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._processor.force_flush(timeout_millis)


@contextlib.contextmanager
def exporting_to(receiver: OtlpReceiver) -> Iterator[str]:
    """Tracing on in THIS process (the client side), its spans exported with the real OTLP
    exporter to `receiver`; yields this process's service.name. The global provider stays
    (OpenTelemetry sets it once per process); the forwarding ends with the block."""
    from opentelemetry import trace

    from quarry import telemetry

    telemetry.use_in_memory_exporter("quarry-tests")
    provider = trace.get_tracer_provider()
    forward = _ForwardWhileActive(receiver.endpoint)
    provider.add_span_processor(forward)
    try:
        yield str(provider.resource.attributes["service.name"])
    finally:
        forward.force_flush()
        forward.shutdown()
