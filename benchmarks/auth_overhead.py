"""Auth on vs off (issue 12): StatObject on a clean branch and PutObjects (batches of 1,000)
through two suites of real services started side by side in this run, one with
authentication and authorization on, one with them off. Rounds alternate between the suites
(and which goes first), and each figure is the median of its rounds, so the noise of a shared
machine falls on both alike. Target: auth on >= 0.9 of auth off.

Both suites are driven by quarry.client.Client; the auth-on one logs in with the admin that
`Auth/Setup` creates. Also counts the KV reads of the `auth` partition per 1,000
StatObjects in steady state (the kv-gateway's capacity report): the authorizer caches each
user's principal and policies (auth_cache_seconds), so the hot path adds none beyond a
refresh per cache lifetime.
"""

from __future__ import annotations

import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from quarry.client import Client, Credentials
from quarry.kv.partitions import AUTH
from quarry.v1 import kv_pb2, kv_pb2_grpc, types_pb2

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from support.processes import free_port, quarry_env, wait_serving

CALLS = int(os.environ.get("BENCH_CALLS", "2000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
PUT_ENTRIES = int(os.environ.get("BENCH_AUTH_PUT_ENTRIES", "20000"))  # per round
SERVICES = ["kv-gateway", "range-writer", "branch-manager", "committer"]
TARGET = 0.9


class Suite:
    """One suite of `quarry serve` processes and a Client of it."""

    def __init__(
        self, name: str, home: Path, client: Client, kv: kv_pb2_grpc.KVGatewayStub
    ) -> None:
        self.name = name
        self.home = home
        self.client = client
        self.kv = kv
        self.stat_rates: list[float] = []
        self.put_rates: list[float] = []


@contextmanager
def running_suite(name: str, auth: bool) -> Iterator[Suite]:
    home = Path(tempfile.mkdtemp(prefix=f"quarry-bench-{name}-"))
    ports = {service: free_port() for service in SERVICES}
    settings = {"QUARRY_AUTH_ENABLED": "true" if auth else "false"}
    if auth:
        settings["QUARRY_AUTH_SIGNING_KEY"] = secrets.token_hex(32)
    for service, port in ports.items():
        prefix = f"QUARRY_{service.upper().replace('-', '_')}"
        settings[f"{prefix}_PORT"] = str(port)
        settings[f"{prefix}_ADDRESS"] = f"127.0.0.1:{port}"
    env = quarry_env(home, **settings)
    children: list[subprocess.Popen[bytes]] = []
    try:
        for service in SERVICES:
            children.append(
                subprocess.Popen(
                    [sys.executable, "-m", "quarry.cli.main", "serve", service],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            wait_serving(f"127.0.0.1:{ports[service]}")
        addresses = {
            "branch_manager": f"127.0.0.1:{ports['branch-manager']}",
            "committer": f"127.0.0.1:{ports['committer']}",
        }
        if auth:
            with Client(**addresses, token="") as bootstrap:
                created = bootstrap.setup().credentials
            credentials = Credentials(created.access_key_id, created.secret_access_key)
            client = Client(**addresses, credentials=credentials)
        else:
            client = Client(**addresses, token="")
        with client:
            kv_channel = client.authenticated_channel(f"127.0.0.1:{ports['kv-gateway']}")
            yield Suite(name, home, client, kv_pb2_grpc.KVGatewayStub(kv_channel))
    finally:
        for child in reversed(children):
            child.terminate()
        for child in children:
            child.wait(20)


def load(suite: Suite) -> None:
    """A repository whose main holds 1,000 committed objects and nothing staged."""
    client = suite.client
    client.create_repository("bench", storage_namespace=str(suite.home / "lake"))
    client.put_objects(
        "bench",
        "main",
        (
            types_pb2.Entry(
                path=f"data/f{i:05d}", physical_address=f"a/{i}", size_bytes=i, checksum=f"c{i}"
            )
            for i in range(1000)
        ),
    )
    client.commit("bench", "main", "load")


def stat_round(suite: Suite, calls: int) -> float:
    stat = suite.client.stat_object
    start = time.perf_counter()
    for i in range(calls):
        stat("bench", "main", f"data/f{i % 1000:05d}")
    return calls / (time.perf_counter() - start)


def put_round(suite: Suite, round_no: int) -> float:
    entries = [
        types_pb2.Entry(
            path=f"bulk/{round_no:03d}/{i:06d}",
            physical_address=f"s3://x/{round_no}/{i}",
            size_bytes=1000,
            checksum=f"{round_no}-{i}",
        )
        for i in range(PUT_ENTRIES)
    ]
    start = time.perf_counter()
    suite.client.put_objects("bench", "other", entries, batch_size=1000)
    return PUT_ENTRIES / (time.perf_counter() - start)


def auth_reads(suite: Suite) -> float:
    report = suite.kv.GetCapacityReport(kv_pb2.GetCapacityReportRequest(top_n=1))
    return sum(c.usage.reads for c in report.classes if c.partition_class == AUTH)


def alternate(suites: list[Suite], measure: Callable[[Suite, int], None]) -> None:
    """ROUNDS rounds over every suite, the order flipped each round."""
    for round_no in range(ROUNDS):
        ordered = suites if round_no % 2 == 0 else list(reversed(suites))
        for suite in ordered:
            measure(suite, round_no)


def verdict(ratio: float) -> str:
    return "MET" if ratio >= TARGET else "MISSED"


def main() -> None:
    with ExitStack() as stack:
        off = stack.enter_context(running_suite("auth-off", auth=False))
        on = stack.enter_context(running_suite("auth-on", auth=True))
        suites = [off, on]
        for suite in suites:
            load(suite)
            # PutObjects stages on a branch of its own: main stays clean for StatObject.
            suite.client.create_branch("bench", "other", "main")
            stat_round(suite, 300)  # warm-up: connections, caches, the auth cache filled

        before = auth_reads(on)
        alternate(suites, lambda suite, _: suite.stat_rates.append(stat_round(suite, CALLS)))
        reads_per_1000 = (auth_reads(on) - before) / (CALLS * ROUNDS) * 1000
        alternate(suites, lambda suite, n: suite.put_rates.append(put_round(suite, n)))

        stat_off, stat_on = (statistics.median(s.stat_rates) for s in suites)
        put_off, put_on = (statistics.median(s.put_rates) for s in suites)
        print(
            f"auth on vs off, two suites side by side (median of {ROUNDS} alternating rounds; "
            f"{CALLS} StatObjects, {PUT_ENTRIES:,} entries a round)"
        )
        print(f"  {'':34}{'auth off':>12}{'auth on':>12}   on/off")
        stat_ratio = stat_on / stat_off
        print(
            f"  {'StatObject, clean branch (calls/s)':34}{stat_off:>12,.0f}{stat_on:>12,.0f}   "
            f"{stat_ratio:.2f}   (target >= {TARGET}: {verdict(stat_ratio)})"
        )
        put_ratio = put_on / put_off
        print(
            f"  {'PutObjects x1,000 (entries/s)':34}{put_off:>12,.0f}{put_on:>12,.0f}   "
            f"{put_ratio:.2f}   (target >= {TARGET}: {verdict(put_ratio)})"
        )
        print(
            f"  auth-partition KV reads per 1,000 StatObjects (auth on, steady state): "
            f"{reads_per_1000:.2f}   (the authorizer's per-user cache)"
        )


if __name__ == "__main__":
    main()
