"""What actions cost a commit (issue 28: "commit time with no action files within 5 % of
before"), three ways in one run on one repository, rounds interleaved so drift hits all alike:

* off:     the Graveler without an actions engine (core.actions None): Quarry before actions;
* on:      actions on, no action file on the branch: the commit looks the "_" prefix of the
           metarange it commits up (and its post-commit answers from the cached "none");
* 1 hook:  actions on, one pre-commit webhook (a trivial HTTP server in a process of its own
           answering 200): the lookup, reading and parsing the action file, the signed POST,
           and the run's KV record.

The engine is in process (memory KV, ranges in a local directory, the real CommittedManager),
so a commit here is its bare engine cost (a few ms), the harshest denominator: over gRPC the
same overhead is a smaller share. Each round stages one change and commits; timed: the commit.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_repo import BenchRepo, entry, path_of, verdict

from quarry.actions.runs import Actions
from quarry.graveler import actions as graveler_actions
from quarry.graveler.model import Entry

M = int(os.environ.get("BENCH_ACTIONS_ENTRIES", "100000"))
ROUNDS = int(os.environ.get("BENCH_ACTIONS_ROUNDS", "41"))

HOOK_SERVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Ok)
print(server.server_address[1], flush=True)
server.serve_forever()
"""

ACTION = """name: bench gate
on:
  pre-commit:
    branches: [hooked]
hooks:
  - id: ok
    type: webhook
    properties:
      url: http://127.0.0.1:{port}/
"""


def action_entry(namespace: str, port: int) -> Entry:
    data = ACTION.format(port=port).encode()
    path = Path(namespace) / "bench-objects" / hashlib.sha256(data).hexdigest()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return Entry("_quarry_actions/gate.yaml", str(path), len(data), hashlib.md5(data).hexdigest())


def main() -> None:
    hook = subprocess.Popen([sys.executable, "-c", HOOK_SERVER], stdout=subprocess.PIPE, text=True)
    root = Path(tempfile.mkdtemp(prefix="bench-actions-"))
    repo = None
    try:
        port = int(hook.stdout.readline())  # type: ignore[union-attr]
        repo = BenchRepo(root, M)
        g = repo.g
        engine = Actions(g.kv)
        g.create_branch("bench", "hooked", "main")
        g.put_objects("bench", "hooked", [action_entry(repo.namespace, port)])
        g.actions = engine
        g.commit("bench", "hooked", "the action file")
        # The lookups' own time, measured inside the commit (the commit medians move by more
        # than the lookup costs from one round to the next on a shared machine).
        lookup_seconds: list[float] = []
        load = graveler_actions._load

        def timed_load(core, reads, layers):  # type: ignore[no-untyped-def]
            start = time.perf_counter()
            try:
                return load(core, reads, layers)
            finally:
                lookup_seconds.append(time.perf_counter() - start)

        graveler_actions._load = timed_load  # type: ignore[assignment]
        lookups: list[float] = []
        sides = {"off": ("main", None), "on": ("main", engine), "1 hook": ("hooked", engine)}
        times: dict[str, list[float]] = {name: [] for name in sides}
        version = 0
        for round_ in range(ROUNDS + 1):  # round 0 warms every side up, untimed
            order = list(sides)
            order = order[round_ % 3 :] + order[: round_ % 3]
            for name in order:
                branch, actions = sides[name]
                version += 1
                g.actions = actions
                g.put_objects("bench", branch, [entry(path_of(version * 7919 % M), version)])
                lookup_seconds.clear()
                start = time.perf_counter()
                g.commit("bench", branch, f"v{version}")
                elapsed = time.perf_counter() - start
                if round_:
                    times[name].append(elapsed)
                    if name == "on":
                        lookups.append(sum(lookup_seconds))
        runs = sum(
            1
            for _ in engine.kv.scan(
                g.refs.get_repository("bench").partition, b"actions/runs/", b"actions/runs0"
            )
        )
        base = statistics.median(times["off"])
        print(
            f"  1-change commit into {M:,} entries, median of {ROUNDS} interleaved rounds (in process)"
        )
        print(f"  {'':<34}{'commit ms':>10}{'x off':>8}")
        for name, label in (
            ("off", "actions off (before actions)"),
            ("on", "actions on, no action files"),
            ("1 hook", "actions on, 1 pre-commit webhook"),
        ):
            median = statistics.median(times[name])
            print(f"  {label:<34}{median * 1e3:>10.2f}{median / base:>8.3f}")
        overhead = statistics.median(times["on"]) / base
        print(f"  target: no action files <= 1.05 x off: {overhead:.3f}  {verdict(overhead, 1.05)}")
        lookup = statistics.median(lookups)
        print(
            f"  the lookups themselves (pre-commit + cached post-commit), timed inside the "
            f"commit: {lookup * 1e3:.3f} ms = {lookup / base:.2%} of a commit with actions off"
        )
        print(f"  (webhook runs recorded: {runs}; hook server in its own process)")
    finally:
        hook.terminate()
        hook.wait()
        if repo is not None:
            repo.close()
        import shutil

        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
