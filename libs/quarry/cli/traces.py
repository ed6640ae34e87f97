"""`quarry traces`: a local trace collector, for seeing traces without one — an OTLP/gRPC
receiver (quarry.telemetry.receiver) that prints each trace, once complete, as a tree of
spans with their durations, and/or writes each as one JSON line to a file.

Point the services at it with OTEL_EXPORTER_OTLP_ENDPOINT (`quarry up --traces` runs one
and does that) and trace a command with `quarry --trace ...`."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

from quarry.telemetry import DEFAULT_PORT, DEFAULT_SETTLE_SECONDS

# Types only: the receiver is imported when a command runs one, and the client library (of
# quarry.cli.base) is not loaded at all.
if TYPE_CHECKING:
    from quarry.cli.base import Subparsers
    from quarry.telemetry.receiver import OtlpReceiver, ReceivedSpan


def trace_printer(
    stream: IO[str] | None, jsonl: Path | None
) -> Callable[[list[ReceivedSpan]], None]:
    """What to do with each completed trace: its tree on `stream`, its JSON line appended
    to `jsonl` (each flushed at once, so `tail -f` shows it)."""
    from quarry.telemetry.receiver import trace_json_line, tree

    lock = threading.Lock()

    def show(spans: list[ReceivedSpan]) -> None:
        with lock:  # the file first: once a tree shows, its line is in the file
            if jsonl is not None:  # one append of the whole line: never interleaved
                with jsonl.open("ab", buffering=0) as fh:
                    fh.write((trace_json_line(spans) + "\n").encode())
            if stream is not None:
                stream.write(f"trace {spans[0].trace_id}\n{tree(spans, durations=True)}\n\n")
                stream.flush()

    return show


@contextlib.contextmanager
def serving_traces(
    host: str, port: int, stream: IO[str] | None, jsonl: Path | None, settle: float
) -> Iterator[OtlpReceiver]:
    from quarry.telemetry.receiver import otlp_receiver

    if jsonl is not None:
        jsonl.parent.mkdir(parents=True, exist_ok=True)
    with otlp_receiver(
        host, port, on_trace=trace_printer(stream, jsonl), settle=settle, keep=False
    ) as receiver:
        yield receiver


def cmd_traces(args: argparse.Namespace) -> int:
    output = Path(args.output) if args.output else None
    stream = None if (output is not None and args.quiet) else sys.stdout
    try:
        with serving_traces(args.host, args.port, stream, output, args.settle) as receiver:
            print(f"quarry traces: OTLP/gRPC receiver on {receiver.endpoint}", flush=True)
            print(f"  export to it: OTEL_EXPORTER_OTLP_ENDPOINT={receiver.endpoint}", flush=True)
            if output is not None:
                print(f"  traces also written to {output} (one JSON line each)", flush=True)
            print("  Press Ctrl-C to stop.\n", flush=True)
            stop = threading.Event()
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda _signum, _frame: stop.set())
            # A timed wait, as the services' (quarry.runtime.server): the kernel may hand
            # the signal to one of gRPC's threads, and Python runs its handler only when the
            # main thread next runs; an untimed wait would never return.
            while not stop.wait(0.5):
                pass
    except KeyboardInterrupt:
        return 0
    except RuntimeError:  # gRPC could not bind: the port is taken
        print(
            f"quarry traces: cannot listen on {args.host}:{args.port} (address in use?); "
            "choose another with --port",
            file=sys.stderr,
        )
        return 1
    return 0


def register_traces(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    help_text = "receive traces (OTLP/gRPC) and print each as a tree of spans with durations"
    traces = sub.add_parser("traces", help=help_text, description=__doc__)
    traces.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)"
    )
    traces.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port to listen on (default: {DEFAULT_PORT}, OTLP/gRPC's)",
    )
    traces.add_argument(
        "--output", metavar="FILE", help="also append each trace to FILE as one JSON line"
    )
    traces.add_argument(
        "--quiet", action="store_true", help="with --output: print no trees, only write the file"
    )
    traces.add_argument(
        "--settle",
        type=float,
        default=DEFAULT_SETTLE_SECONDS,
        metavar="SECONDS",
        help="a trace is complete once its root arrived and nothing more for SECONDS "
        f"(default: {DEFAULT_SETTLE_SECONDS:g})",
    )
    traces.set_defaults(func=cmd_traces)


COMMANDS = {"traces": register_traces}
