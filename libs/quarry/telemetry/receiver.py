"""A local OTLP trace receiver: the collector end of OTEL_EXPORTER_OTLP_ENDPOINT, for people
without a collector (`quarry traces`, `quarry up --traces`) and for tests.

A real gRPC server implementing opentelemetry.proto.collector.trace.v1.TraceService, as an
OpenTelemetry Collector would; the services' and the CLI's real OTLP exporters send to it.
Spans are kept flattened (`ReceivedSpan`) with the service.name of the process that sent
them. With `on_trace`, each trace is handed over once it is complete: its root span has
arrived and no span of it for `settle` seconds (exporters batch: a service sends its spans
up to OTEL_BSP_SCHEDULE_DELAY after they end, so a trace's spans arrive in several exports).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from quarry.telemetry import DEFAULT_ENDPOINT, DEFAULT_PORT, DEFAULT_SETTLE_SECONDS


@dataclass(frozen=True)
class ReceivedSpan:
    service: str  # resource attribute service.name
    name: str
    kind: str  # SERVER, CLIENT, INTERNAL, ...
    trace_id: str  # hex
    span_id: str
    parent_id: str  # "" for a root span
    start: int  # start time, ns since the epoch
    end: int = 0  # end time, ns since the epoch
    status: str = "UNSET"  # OK, ERROR, UNSET
    events: tuple[tuple[str, dict[str, object]], ...] = field(default=())
    attributes: dict[str, object] = field(default_factory=dict, hash=False, compare=False)

    @property
    def duration_ms(self) -> float:
        return max(0, self.end - self.start) / 1e6

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["events"] = [{"name": name, "attributes": attrs} for name, attrs in self.events]
        data["duration_ms"] = round(self.duration_ms, 3)
        return data


def _value(any_value: Any) -> object:
    which = any_value.WhichOneof("value")
    value = getattr(any_value, which) if which else None
    if which in ("array_value", "kvlist_value"):
        return str(value)
    return value


def _attributes(key_values: Any) -> dict[str, object]:
    return {kv.key: _value(kv.value) for kv in key_values}


def spans_of(request: trace_service_pb2.ExportTraceServiceRequest) -> list[ReceivedSpan]:
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
                        end=span.end_time_unix_nano,
                        status=trace_pb2.Status.StatusCode.Name(span.status.code).removeprefix(
                            "STATUS_CODE_"
                        ),
                        events=tuple(
                            (event.name, _attributes(event.attributes)) for event in span.events
                        ),
                        attributes=_attributes(span.attributes),
                    )
                )
    return received


class _Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[ReceivedSpan] = []
        self.listeners: list[Callable[[list[ReceivedSpan]], None]] = []

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        received = spans_of(request)
        with self.lock:
            self.spans.extend(received)
            listeners = list(self.listeners)
        for listener in listeners:
            listener(received)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    def __init__(self, receiver: _Receiver, host: str, port: int) -> None:
        self._receiver = receiver
        self.port = port
        self.endpoint = f"http://{host}:{port}"

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
        deadline = time.monotonic() + timeout
        while not services <= {s.service for s in self.trace(trace_id)}:
            if time.monotonic() > deadline:
                got = sorted({s.service for s in self.trace(trace_id)})
                raise TimeoutError(
                    f"spans of trace {trace_id} from {sorted(services)}: only from {got}"
                )
            time.sleep(0.05)


@contextlib.contextmanager
def otlp_receiver(
    host: str = "127.0.0.1",
    port: int = 0,
    on_trace: Callable[[list[ReceivedSpan]], None] | None = None,
    settle: float = DEFAULT_SETTLE_SECONDS,
    keep: bool = True,
) -> Iterator[OtlpReceiver]:
    """An OTLP/gRPC trace receiver on host:port (0: a free port). `on_trace(spans)` is
    called once per completed trace (module docstring); `keep=False` keeps no spans past
    that (a long-running `quarry traces`)."""
    receiver = _Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    assembler = _TraceAssembler(on_trace, settle) if on_trace is not None else None
    if assembler is not None:
        receiver.listeners.append(assembler.add)
    if not keep:
        receiver.listeners.append(lambda _spans: OtlpReceiver(receiver, host, bound).clear())
    server.start()
    try:
        yield OtlpReceiver(receiver, host, bound)
    finally:
        server.stop(0)
        if assembler is not None:
            assembler.close()


class _TraceAssembler:
    """Groups arriving spans by trace; hands a trace over once complete (module docstring),
    or at close. A trace whose root never arrives is handed over after 10 x `settle`."""

    def __init__(self, on_trace: Callable[[list[ReceivedSpan]], None], settle: float) -> None:
        self._on_trace = on_trace
        self._settle = settle
        self._lock = threading.Lock()
        self._traces: dict[str, list[ReceivedSpan]] = {}
        self._last: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otlp-traces", daemon=True)
        self._thread.start()

    def add(self, spans: list[ReceivedSpan]) -> None:
        now = time.monotonic()
        with self._lock:
            for span in spans:
                self._traces.setdefault(span.trace_id, []).append(span)
                self._last[span.trace_id] = now

    def _take(self, everything: bool) -> list[list[ReceivedSpan]]:
        now = time.monotonic()
        done = []
        with self._lock:
            for trace_id, spans in list(self._traces.items()):
                quiet = now - self._last[trace_id]
                rooted = any(not s.parent_id for s in spans)
                if everything or (quiet >= self._settle and (rooted or quiet >= 10 * self._settle)):
                    done.append(sorted(spans, key=lambda s: s.start))
                    del self._traces[trace_id], self._last[trace_id]
        return sorted(done, key=lambda spans: spans[0].start)

    def _run(self) -> None:
        while not self._stop.wait(min(0.2, self._settle / 4)):
            for spans in self._take(everything=False):
                self._on_trace(spans)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for spans in self._take(everything=True):
            self._on_trace(spans)


def tree(spans: list[ReceivedSpan], durations: bool = False) -> str:
    """The spans as an indented tree, `service: name (KIND)` per line, with each span's
    duration when asked (spans whose parent is not among them are roots)."""
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
            took = f"  {span.duration_ms:.1f} ms" if durations else ""
            error = "  ERROR" if span.status == "ERROR" else ""
            lines.append(
                f"{'  ' * depth}{span.service}: {span.name} ({span.kind}){took}{error}{suffix}"
            )
            walk(span.span_id, depth + 1)

    walk("", 0)
    return "\n".join(lines)


def trace_json_line(spans: list[ReceivedSpan]) -> str:
    """One trace as one JSON line: {"trace_id", "spans": [...]}, spans in start order."""
    return json.dumps(
        {"trace_id": spans[0].trace_id, "spans": [s.as_json() for s in spans]}, default=str
    )


__all__ = [
    "DEFAULT_ENDPOINT",
    "DEFAULT_PORT",
    "DEFAULT_SETTLE_SECONDS",
    "OtlpReceiver",
    "ReceivedSpan",
    "otlp_receiver",
    "spans_of",
    "trace_json_line",
    "tree",
]
