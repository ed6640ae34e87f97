"""A pre-merge hook server: refuses a merge when a Parquet file it brings lacks a column.

The server is Python's standard library (http.server); it asks Quarry what the merge brings
(Committer/Diff from the destination to the source, three-dot) with the Quarry client and
reads each new Parquet file's schema with pyarrow (both come with `pip install quarry`).

    QUARRY_REQUIRED_COLUMN=user_id python examples/actions/schema_gate.py --port 8099

or in the background on a free port, for a script (it stops when that shell exits):

    eval "$(python examples/actions/schema_gate.py --port 0 --detach)"   # $SCHEMA_GATE_URL

and an action file committed on the branch being merged (docs/actions.md):

    # _quarry_actions/schema.yaml
    name: schema gate
    on:
      pre-merge:
        branches: [main]
    hooks:
      - id: required_column
        type: webhook
        properties:
          url: http://127.0.0.1:8099/
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow as pa
import pyarrow.parquet as pq

from quarry.blob import read_object
from quarry.client import Client
from quarry.config import Settings, load_settings
from quarry.v1 import types_pb2


def missing_column(client: Client, event: dict, column: str) -> list[str]:
    """The Parquet paths the merge adds or changes whose schema lacks `column`."""
    bad = []
    changes = client.iter_diff(
        event["repository_id"], event["branch_id"], event["source_ref"], three_dot=True
    )
    for change in changes:
        if change.type == types_pb2.CHANGE_TYPE_REMOVED or not change.path.endswith(".parquet"):
            continue
        schema = pq.read_schema(pa.BufferReader(read_object(change.entry.physical_address)))
        if column not in schema.names:
            bad.append(change.path)
    return bad


def handler_for(client: Client | Callable[[], Client], column: str) -> type[BaseHTTPRequestHandler]:
    """The hook's request handler; `client` is a Client or what makes one when needed."""
    connect = client if callable(client) else lambda: client

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            event = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bad = (
                missing_column(connect(), event, column)
                if event["event_type"] == "pre-merge"
                else []
            )
            answer = (
                f"missing column {column!r} in: {', '.join(bad)}" if bad else "schema ok"
            ).encode()
            self.send_response(400 if bad else 200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


def _stop_with(pid: int, server: ThreadingHTTPServer) -> None:
    """Stop serving once process `pid` (the shell that started a detached gate) is gone:
    a hook server left behind by a closed terminal or a failed script does not linger."""
    while True:
        time.sleep(1)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            server.shutdown()
            return
        except PermissionError:
            continue  # alive, someone else's (a reused pid): keep serving


def _detach(server: ThreadingHTTPServer, url: str) -> None:
    """Serve in a child process of its own session; print shell assignments of the URL and
    the pid (as `eval "$(ssh-agent)"` does) once the socket listens, and return. The child
    stops when the calling shell exits, or on SIGTERM."""
    shell = os.getppid()
    sys.stdout.flush()
    child = os.fork()
    if child:
        server.socket.close()  # the child serves it
        print(f"SCHEMA_GATE_URL={url}; SCHEMA_GATE_PID={child}; export SCHEMA_GATE_URL")
        return
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for stream in (0, 1, 2):  # the caller's $(...) ends when nobody holds its pipe
        os.dup2(devnull, stream)
    threading.Thread(target=_stop_with, args=(shell, server), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8099, help="0: a free port")
    parser.add_argument(
        "--detach",
        action="store_true",
        help="serve in the background; print SCHEMA_GATE_URL=...; SCHEMA_GATE_PID=... for eval",
    )
    parser.add_argument("--branch-manager", help="default: QUARRY_BRANCH_MANAGER_ADDRESS")
    parser.add_argument("--committer", help="default: QUARRY_COMMITTER_ADDRESS")
    args = parser.parse_args()
    column = os.environ.get("QUARRY_REQUIRED_COLUMN", "user_id")
    overrides = {}
    if args.branch_manager:
        overrides["branch_manager_address"] = args.branch_manager
    if args.committer:
        overrides["committer_address"] = args.committer
    settings = load_settings(**overrides)
    gate = _Gate(settings, column)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), gate.handler())
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    if args.detach:
        _detach(server, url)
        return
    print(f"schema gate on {url} (required column {column!r})", flush=True)
    server.serve_forever()


class _Gate:
    """The handler with a client dialled on first use (after a --detach fork: a gRPC
    channel must not cross a fork)."""

    def __init__(self, settings: Settings, column: str) -> None:
        self.settings = settings
        self.column = column
        self._client: Client | None = None
        self._lock = threading.Lock()

    def client(self) -> Client:
        with self._lock:
            if self._client is None:
                self._client = Client.from_settings(self.settings)
            return self._client

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return handler_for(self.client, self.column)


if __name__ == "__main__":
    main()
