"""StatObject and PutObjects through the real services, against baselines from the same
run: a bare echo RPC (the gRPC floor) and raw SetItem writes through the kv-gateway.

Hot branch (issue 14, target 4): CONCURRENCY client threads (16) call StatObject on one clean
branch at once, against the bare echo at the same concurrency; branch-manager shares one
branch-record read among the concurrent reads of a branch (quarry.graveler.refs), so the
repository-partition reads the kv-gateway meters per StatObject fall well below one.

Multi-process serving (issue 29, item 3): the hot branch runs against branch-manager with
BENCH_BRANCH_MANAGER_WORKERS worker processes (default 0: one per core, as `quarry up` and
the chart run it) and, in the same rounds, against a second branch-manager of 1 process over
the same kv-gateway. Each of the CONCURRENCY clients has a connection of its own (as that
many real clients do; the kernel spreads connections, not calls, over the workers), to the
echo as well.

The suite runs as separate processes (`quarry serve ...`), as in production; the client is
this process. Also counts the staging reads the dirty flag saves (from the kv-gateway's
capacity report: staging-class reads per 1,000 StatObjects, clean vs dirty branch).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import (
    branch_manager_pb2_grpc,
    committer_pb2,
    committer_pb2_grpc,
    kv_pb2,
    kv_pb2_grpc,
    types_pb2,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from support.processes import free_port, quarry_env, wait_serving

CALLS = int(os.environ.get("BENCH_CALLS", "2000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
ENTRIES = int(os.environ.get("BENCH_PUT_ENTRIES", "20000"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "16"))
WORKERS = os.environ.get("BENCH_BRANCH_MANAGER_WORKERS", "0")
# Issue 14, target 4; issue 29 raised it to 0.8 (with worker processes).
TARGET_HOT_OF_ECHO = 0.8
TARGET_BRANCH_READS_PER_STAT = 0.25
TARGET_SINGLE_OF_FLOOR = 0.9
SERVICES = ["kv-gateway", "range-writer", "branch-manager", "committer"]


def timed_rate(fn, n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - start)


def median(fn, n: int) -> float:
    return statistics.median(timed_rate(fn, n) for _ in range(ROUNDS))


def concurrent_rate(fn, n: int, clients: int = CONCURRENCY) -> float:
    """Calls per second of `clients` threads making n calls in all (fn(i), i < n)."""
    barrier = threading.Barrier(clients + 1)

    def client(k: int) -> None:
        barrier.wait()
        for i in range(k, n, clients):
            fn(i)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    return n / (time.perf_counter() - start)


def own_connection(target: str) -> grpc.Channel:
    """A channel with a TCP connection of its own (channels to one target otherwise share
    one through gRPC's global subchannel pool)."""
    return grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


def start_service(name: str, env: dict[str, str]) -> subprocess.Popen:
    """`quarry serve NAME`, returned once its first line says it is bound (a branch-manager
    with workers: every worker bound and through its first readiness round)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "quarry.cli.main", "serve", name],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = child.stdout.readline()
    assert "ready" in line, f"{name} did not start: {line!r}"
    threading.Thread(target=child.stdout.read, daemon=True).start()  # keep it drained
    return child


def class_reads(kv, partition_class: str) -> float:
    report = kv.GetCapacityReport(kv_pb2.GetCapacityReportRequest(top_n=1))
    return sum(c.usage.reads for c in report.classes if c.partition_class == partition_class)


def staging_reads(kv) -> float:
    return class_reads(kv, "staging")


def met(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="quarry-bench-reads-"))
    ports = {name: free_port() for name in SERVICES}
    # Auth off: these numbers stay comparable with earlier runs (auth on vs off: issue 12).
    env = quarry_env(
        home,
        QUARRY_AUTH_ENABLED="false",
        **{f"QUARRY_{n.upper().replace('-', '_')}_PORT": str(p) for n, p in ports.items()},
        **{
            f"QUARRY_{n.upper().replace('-', '_')}_ADDRESS": f"127.0.0.1:{p}"
            for n, p in ports.items()
        },
    )
    children = []
    echo = subprocess.Popen(
        [sys.executable, str(HERE / "echo_server.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    echo_port = int(echo.stdout.readline())
    relay = subprocess.Popen(
        [sys.executable, str(HERE / "echo_server.py"), "--forward", str(echo_port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    single_port = free_port()
    try:
        for name in SERVICES:
            service_env = env
            if name == "branch-manager":
                service_env = dict(env, QUARRY_BRANCH_MANAGER_WORKERS=WORKERS)
            children.append(start_service(name, service_env))
            wait_serving(f"127.0.0.1:{ports[name]}")
        # The same branch-manager in one process, for the hot branch's comparison.
        children.append(
            start_service(
                "branch-manager",
                dict(
                    env,
                    QUARRY_BRANCH_MANAGER_WORKERS="1",
                    QUARRY_BRANCH_MANAGER_PORT=str(single_port),
                    QUARRY_BRANCH_MANAGER_ADDRESS=f"127.0.0.1:{single_port}",
                ),
            )
        )
        wait_serving(f"127.0.0.1:{single_port}")
        echo_call = grpc.insecure_channel(f"127.0.0.1:{echo_port}").unary_unary("/bench.Echo/Echo")
        relay_port = int(relay.stdout.readline())
        relay_call = grpc.insecure_channel(f"127.0.0.1:{relay_port}").unary_unary(
            "/bench.Echo/Echo"
        )
        bm_stub = branch_manager_pb2_grpc.BranchManagerStub(
            grpc.insecure_channel(f"127.0.0.1:{ports['branch-manager']}")
        )
        cm_stub = committer_pb2_grpc.CommitterStub(
            grpc.insecure_channel(f"127.0.0.1:{ports['committer']}")
        )
        kv = kv_pb2_grpc.KVGatewayStub(grpc.insecure_channel(f"127.0.0.1:{ports['kv-gateway']}"))

        namespace = home / "lake"
        bm_stub.CreateRepository(
            bm.CreateRepositoryRequest(name="bench", storage_namespace=str(namespace))
        )
        bm_stub.PutObjects(
            iter(
                [
                    bm.PutObjectsRequest(
                        repository="bench",
                        branch="main",
                        entries=[
                            types_pb2.Entry(
                                path=f"data/f{i:05d}",
                                physical_address=f"a/{i}",
                                size_bytes=i,
                                checksum=f"c{i}",
                            )
                            for i in range(1000)
                        ],
                    )
                ]
            )
        )
        cm_stub.Commit(
            committer_pb2.CommitRequest(repository="bench", branch="main", message="load")
        )
        stat_requests = [
            bm.StatObjectRequest(repository="bench", ref="main", path=f"data/f{i % 1000:05d}")
            for i in range(CALLS)
        ]
        payload = stat_requests[0].SerializeToString()

        def do_echo(i):
            echo_call(payload)

        def do_relay(i):
            relay_call(payload)

        def do_stat(i):
            bm_stub.StatObject(stat_requests[i])

        timed_rate(do_echo, 200)
        timed_rate(do_relay, 200)
        timed_rate(do_stat, 200)
        # Rounds alternate between the figures compared (so the noise of a shared machine
        # falls on both alike); each ratio is the median of its per-round ratios.
        echo_rates, relay_rates, clean_rates = [], [], []
        before = staging_reads(kv)
        for _ in range(ROUNDS):
            echo_rates.append(timed_rate(do_echo, CALLS))
            relay_rates.append(timed_rate(do_relay, CALLS))
            clean_rates.append(timed_rate(do_stat, CALLS))
        clean_staging = (staging_reads(kv) - before) / (CALLS * ROUNDS) * 1000
        echo_rate, relay_rate, clean_rate = (
            statistics.median(rates) for rates in (echo_rates, relay_rates, clean_rates)
        )
        single = statistics.median(s / r for s, r in zip(clean_rates, relay_rates, strict=True))

        # Hot branch: CONCURRENCY clients at once. The repository partition holds the
        # branch record (commits are cached: the only other reads there), so its metered
        # reads per StatObject are the branch-record reads per StatObject.
        # Client k uses connection k (concurrent_rate gives it the calls i = k mod clients).
        hot_echo_calls = [
            own_connection(f"127.0.0.1:{echo_port}").unary_unary("/bench.Echo/Echo")
            for _ in range(CONCURRENCY)
        ]
        hot_stubs = {
            target: [
                branch_manager_pb2_grpc.BranchManagerStub(own_connection(target))
                for _ in range(CONCURRENCY)
            ]
            for target in (f"127.0.0.1:{ports['branch-manager']}", f"127.0.0.1:{single_port}")
        }
        workers_stubs, single_stubs = hot_stubs.values()

        def do_hot_echo(i):
            hot_echo_calls[i % CONCURRENCY](payload)

        def do_hot_stat(stubs):
            return lambda i: stubs[i % CONCURRENCY].StatObject(stat_requests[i])

        concurrent_rate(do_hot_echo, 400)
        concurrent_rate(do_hot_stat(workers_stubs), 400)
        concurrent_rate(do_hot_stat(single_stubs), 400)
        hot_echo_rates, hot_rates, hot_single_rates, hot_reads = [], [], [], 0.0
        for _ in range(ROUNDS):
            hot_echo_rates.append(concurrent_rate(do_hot_echo, CALLS))
            before = class_reads(kv, "repo")
            hot_rates.append(concurrent_rate(do_hot_stat(workers_stubs), CALLS))
            hot_reads += class_reads(kv, "repo") - before
            hot_single_rates.append(concurrent_rate(do_hot_stat(single_stubs), CALLS))
        hot_echo_rate, hot_rate, hot_single_rate = (
            statistics.median(rates) for rates in (hot_echo_rates, hot_rates, hot_single_rates)
        )
        hot = statistics.median(s / e for s, e in zip(hot_rates, hot_echo_rates, strict=True))
        hot_single = statistics.median(
            s / e for s, e in zip(hot_single_rates, hot_echo_rates, strict=True)
        )
        hot_branch_reads = hot_reads / (CALLS * ROUNDS)
        workers = "one per core" if WORKERS == "0" else WORKERS

        # Dirty the branch (one staged object elsewhere) and measure again.
        bm_stub.PutObject(
            bm.PutObjectRequest(
                repository="bench",
                branch="main",
                entry=types_pb2.Entry(path="other/x", checksum="x"),
            )
        )
        before = staging_reads(kv)
        dirty_rate = median(do_stat, CALLS)
        dirty_staging = (staging_reads(kv) - before) / (CALLS * ROUNDS) * 1000

        # PutObjects: entries staged per second, batches of 1,000, vs raw SetItem writes.
        batches = [
            bm.PutObjectsRequest(
                repository="bench",
                branch="main",
                entries=[
                    types_pb2.Entry(
                        path=f"bulk/{b:03d}/{i:04d}",
                        physical_address=f"s3://x/{b}/{i}",
                        size_bytes=1000,
                        checksum=f"{b}-{i}",
                    )
                    for i in range(1000)
                ],
            )
            for b in range(ENTRIES // 1000)
        ]
        start = time.perf_counter()
        bm_stub.PutObjects(iter(batches))
        put_rate = ENTRIES / (time.perf_counter() - start)
        value = batches[0].entries[0].SerializeToString()
        set_requests = [
            kv_pb2.SetItemRequest(
                partition_key=b"staging/bench-raw", key=f"k{i:06d}".encode(), value=value
            )
            for i in range(CALLS)
        ]
        set_rate = median(lambda i: kv.SetItem(set_requests[i]), CALLS)

        print(f"branch reads and writes through the services (median of {ROUNDS} x {CALLS})")
        print(f"  bare echo RPC                {echo_rate:>9,.0f} calls/s   1.00")
        print(
            f"  echo with one downstream hop {relay_rate:>9,.0f} calls/s   "
            f"{relay_rate / echo_rate:.2f} of echo   (the floor for a call that needs one "
            f"KV read)"
        )
        print(
            f"  StatObject, clean branch     {clean_rate:>9,.0f} calls/s   "
            f"{clean_rate / echo_rate:.2f} of echo, {single:.2f} of the one-hop floor   "
            f"(target >= {TARGET_SINGLE_OF_FLOOR} of the floor: {met(single >= TARGET_SINGLE_OF_FLOOR)})"
        )
        print(
            f"  StatObject, dirty branch     {dirty_rate:>9,.0f} calls/s   "
            f"{dirty_rate / echo_rate:.2f} of echo"
        )
        print(
            f"  staging reads per 1,000 StatObjects: clean {clean_staging:.0f}, "
            f"dirty {dirty_staging:.0f}  (saved on clean: {dirty_staging - clean_staging:.0f})"
        )
        print(f"  hot branch, {CONCURRENCY} concurrent clients (a connection each):")
        print(f"    bare echo RPC (one process) {hot_echo_rate:>8,.0f} calls/s   1.00")
        print(
            f"    StatObject, clean branch   {hot_rate:>9,.0f} calls/s   {hot:.2f} of echo   "
            f"(branch-manager workers: {workers}; target >= {TARGET_HOT_OF_ECHO}: "
            f"{met(hot >= TARGET_HOT_OF_ECHO)})"
        )
        print(
            f"    StatObject, 1 process      {hot_single_rate:>9,.0f} calls/s   "
            f"{hot_single:.2f} of echo"
        )
        print(
            f"    branch-record reads per StatObject (kv-gateway metering) "
            f"{hot_branch_reads:.3f}   (target <= {TARGET_BRANCH_READS_PER_STAT}: "
            f"{met(hot_branch_reads <= TARGET_BRANCH_READS_PER_STAT)})"
        )
        print(
            f"  PutObjects (batches of 1,000) {put_rate:>9,.0f} entries/s  "
            f"{put_rate / set_rate:.1f}x raw SetItem ({set_rate:,.0f} items/s)"
        )
    finally:
        for child in reversed(children):
            child.terminate()
        for child in children:
            child.wait(20)
        for process in (relay, echo):
            process.stdin.close()
            process.wait(5)


if __name__ == "__main__":
    main()
