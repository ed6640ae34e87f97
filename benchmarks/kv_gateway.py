"""kv-gateway throughput against the gRPC floor, measured side by side in one run.

Prints: bare echo RPC rate, gateway GetItem/SetItem rates (sequential and 8 threads) and
their ratios to echo, BatchGetItems cost per item, and the raw SQLite backend rate.
Servers run in their own processes (as in production) so client and server do not share
a GIL; runs alternate between echo and gateway and the median of rounds is reported.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from quarry.kv.sqlite import SQLiteStore
from quarry.v1 import kv_pb2, kv_pb2_grpc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from support.processes import free_port, quarry_env, wait_serving

CALLS = int(os.environ.get("BENCH_CALLS", "2000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
THREADS = 8
PARTITION = b"repo/bench/1"
VALUE = b"x" * 200  # about a branch record


def rate(fn, calls: int, threads: int = 1) -> float:
    """Calls per second of `fn(i)` over `calls` calls spread on `threads` threads."""
    if threads == 1:
        start = time.perf_counter()
        for i in range(calls):
            fn(i)
        return calls / (time.perf_counter() - start)
    per_thread = calls // threads
    barrier = threading.Barrier(threads + 1)

    def worker(t: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            fn(t * per_thread + i)

    with ThreadPoolExecutor(threads) as pool:
        jobs = [pool.submit(worker, t) for t in range(threads)]
        barrier.wait()
        start = time.perf_counter()
        for job in jobs:
            job.result()
        return per_thread * threads / (time.perf_counter() - start)


def median_rate(fn, calls: int, threads: int = 1) -> float:
    return statistics.median(rate(fn, calls, threads) for _ in range(ROUNDS))


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="quarry-bench-"))
    echo = subprocess.Popen(
        [sys.executable, str(HERE / "echo_server.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    echo_port = int(echo.stdout.readline())
    gw_port = free_port()
    gateway = subprocess.Popen(
        [sys.executable, "-m", "quarry.cli.main", "serve", "kv-gateway"],
        env=quarry_env(
            tmp, QUARRY_KV_GATEWAY_PORT=str(gw_port), QUARRY_AUTH_ENABLED="false"
        ),  # raw KV
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_serving(f"127.0.0.1:{gw_port}")
        echo_channel = grpc.insecure_channel(f"127.0.0.1:{echo_port}")
        echo_call = echo_channel.unary_unary("/bench.Echo/Echo")
        gw_channel = grpc.insecure_channel(f"127.0.0.1:{gw_port}")
        stub = kv_pb2_grpc.KVGatewayStub(gw_channel)

        keys = [f"branches/b{i:05d}".encode() for i in range(1000)]
        for key in keys:
            stub.SetItem(kv_pb2.SetItemRequest(partition_key=PARTITION, key=key, value=VALUE))
        get_requests = [kv_pb2.GetItemRequest(partition_key=PARTITION, key=k) for k in keys]
        echo_payload = get_requests[0].SerializeToString()

        def do_echo(i):
            echo_call(echo_payload)

        def do_get(i):
            stub.GetItem(get_requests[i % len(keys)])

        def do_set(i):
            stub.SetItem(
                kv_pb2.SetItemRequest(partition_key=PARTITION, key=keys[i % len(keys)], value=VALUE)
            )

        batch = kv_pb2.BatchGetItemsRequest(
            items=[kv_pb2.ItemKey(partition_key=PARTITION, key=k) for k in keys[:100]]
        )

        def do_batch(i):
            stub.BatchGetItems(batch)

        for fn in (do_echo, do_get, do_set):  # warm up connections and caches
            rate(fn, 200)

        # Rounds alternate echo and gateway calls, and each ratio is taken within a round,
        # so a slow spell of this shared machine hits both sides of a ratio alike.
        plan = [
            ("echo", do_echo, 1),
            ("GetItem", do_get, 1),
            ("SetItem", do_set, 1),
            ("echo x8", do_echo, THREADS),
            ("GetItem x8", do_get, THREADS),
            ("SetItem x8", do_set, THREADS),
        ]
        samples: dict[str, list[float]] = {label: [] for label, _, _ in plan}
        ratios: dict[str, list[float]] = {label: [] for label, _, _ in plan}
        for _ in range(ROUNDS):
            for label, fn, threads in plan:
                samples[label].append(rate(fn, CALLS, threads))
            for label, _, _ in plan:
                base = "echo x8" if label.endswith("x8") else "echo"
                ratios[label].append(samples[label][-1] / samples[base][-1])
        results = {label: statistics.median(v) for label, v in samples.items()}
        ratio = {label: statistics.median(v) for label, v in ratios.items()}
        batch_rate = median_rate(do_batch, max(50, CALLS // 50))

        sqlite = SQLiteStore(tmp / "raw.db")
        for key in keys:
            sqlite.set(PARTITION, key, VALUE)
        raw_get = median_rate(lambda i: sqlite.get(PARTITION, keys[i % len(keys)]), CALLS * 5)
        raw_set = median_rate(lambda i: sqlite.set(PARTITION, keys[i % len(keys)], VALUE), CALLS)
        sqlite.close()

        print(
            f"kv-gateway vs the gRPC floor  (median of {ROUNDS} alternating rounds of {CALLS} "
            f"calls; ratios within a round; SQLite backend)"
        )
        print(f"  {'':<24}{'calls/s':>10}{'vs echo':>10}")
        for label in ("echo", "GetItem", "SetItem"):
            print(f"  {label + ' (1 thread)':<24}{results[label]:>10,.0f}{ratio[label]:>10.2f}")
        for label in ("echo x8", "GetItem x8", "SetItem x8"):
            print(
                f"  {label.replace(' x8', '') + f' ({THREADS} threads)':<24}"
                f"{results[label]:>10,.0f}{ratio[label]:>10.2f}"
            )
        per_item_us = 1e6 / (batch_rate * 100)
        get_us = 1e6 / results["GetItem"]
        print(
            f"  BatchGetItems(100)      {batch_rate * 100:>10,.0f} items/s  "
            f"{per_item_us:.1f} µs/item = {per_item_us / get_us:.3f} of one GetItem"
        )
        print(f"  raw SQLite get          {raw_get:>10,.0f} ops/s  (in process, no gRPC)")
        print(f"  raw SQLite set          {raw_set:>10,.0f} ops/s")
        print(
            f"  target: GetItem >= 0.70 of echo -> "
            f"{'MET' if ratio['GetItem'] >= 0.70 else 'MISSED'}"
        )
    finally:
        echo.stdin.close()
        echo.wait(5)
        gateway.terminate()
        gateway.wait(20)


if __name__ == "__main__":
    main()
