"""The OTLP trace receiver for tests (quarry.telemetry.receiver: the one `quarry traces`
runs), and `exporting_to`: this test process's own spans sent to one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from quarry.telemetry.receiver import OtlpReceiver, ReceivedSpan, otlp_receiver, tree

__all__ = ["OtlpReceiver", "ReceivedSpan", "exporting_to", "otlp_receiver", "tree"]


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
