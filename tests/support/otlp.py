"""The OTLP trace receiver for tests (quarry.telemetry.receiver: the one `quarry traces`
runs), `exporting_to`: this test process's own spans sent to one, and
`quarry_up_with_traces`: a whole suite as `quarry up --traces` runs it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from quarry.telemetry.receiver import OtlpReceiver, ReceivedSpan, otlp_receiver, tree
from support.processes import VENV_BIN, free_port, json_lines, quarry_env, service_ports
from support.wait import wait_until

__all__ = [
    "OtlpReceiver",
    "ReceivedSpan",
    "TracedUp",
    "exporting_to",
    "otlp_receiver",
    "quarry_up_with_traces",
    "tree",
]


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


@dataclass
class TracedUp:
    """A running `quarry up --traces` (tests/support/otlp.py `quarry_up_with_traces`)."""

    env: dict[str, str]  # the environment of its processes (and of `quarry` commands)
    home: Path
    ports: dict[str, int]  # each service's port
    endpoint: str  # its trace receiver, as OTEL_EXPORTER_OTLP_ENDPOINT
    out: list[str]  # its stdout so far (the banner, the printed trees)
    err: list[str] = dataclasses.field(default_factory=list)  # its stderr: the services' logs

    def quarry(self, *args: str, **extra: str) -> subprocess.CompletedProcess:
        """A `quarry` command against it (`extra`: more environment); must succeed."""
        done = subprocess.run(
            [str(VENV_BIN / "quarry"), *args],
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    def traces(self) -> list[dict]:
        """The traces the receiver wrote so far ($QUARRY_HOME/traces.jsonl)."""
        return json_lines(self.home / "traces.jsonl")

    def printed(self) -> str:
        return "".join(self.out)

    def json_logs(self) -> list[dict]:
        """The services' log lines so far, as objects (with `log_format="json"`)."""
        return [json.loads(line) for line in list(self.err) if line.startswith("{")]


@contextlib.contextmanager
def quarry_up_with_traces(tmp_path: Path, **settings: str) -> Iterator[TracedUp]:
    """`quarry up --traces` as users run it (real processes exporting with the real OTLP
    exporters to its trace receiver), every service on a free port, with more `settings`
    (quarry_env's keywords); stopped with SIGINT."""
    from quarry.cli.main import SERVICE_MODULES

    ports = {name: free_port() for name in SERVICE_MODULES}
    traces_port = free_port()
    home = tmp_path / "home"
    env = quarry_env(
        home,
        **service_ports(ports),
        **settings,
    )
    child = subprocess.Popen(
        [str(VENV_BIN / "quarry"), "up", "--traces", "--traces-port", str(traces_port)],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    up = TracedUp(env, home, ports, f"http://127.0.0.1:{traces_port}", [])

    def drain(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    threading.Thread(target=drain, args=(child.stdout, up.out), daemon=True).start()
    # Drained too: a full stderr pipe would block the services' logging.
    threading.Thread(target=drain, args=(child.stderr, up.err), daemon=True).start()
    try:
        wait_until(lambda: "Press Ctrl-C" in up.printed(), timeout=90, what="quarry up's banner")
        yield up
    finally:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
