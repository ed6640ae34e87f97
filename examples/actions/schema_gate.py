"""A pre-merge hook server: refuses a merge when a Parquet file it brings lacks a column.

The server is Python's standard library (http.server); it asks Quarry what the merge brings
(Committer/Diff from the destination to the source, three-dot) with the Quarry client and
reads each new Parquet file's schema with pyarrow (both come with `pip install quarry`).

    QUARRY_REQUIRED_COLUMN=user_id python examples/actions/schema_gate.py --port 8099

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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow as pa
import pyarrow.parquet as pq

from quarry.blob import read_object
from quarry.client import Client
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


def handler_for(client: Client, column: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 — http.server's name
            event = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bad = (
                missing_column(client, event, column) if event["event_type"] == "pre-merge" else []
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--branch-manager", default="127.0.0.1:7402")
    parser.add_argument("--committer", default="127.0.0.1:7403")
    args = parser.parse_args()
    column = os.environ.get("QUARRY_REQUIRED_COLUMN", "user_id")
    client = Client(branch_manager=args.branch_manager, committer=args.committer)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler_for(client, column))
    print(f"schema gate on http://127.0.0.1:{args.port}/ (required column {column!r})")
    server.serve_forever()


if __name__ == "__main__":
    main()
