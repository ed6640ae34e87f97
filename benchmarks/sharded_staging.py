"""Sharded staging (issue 29 item 1): one branch's staged-write ceiling with N = 4 staging
shards against N = 1, and what sharding costs elsewhere, in one run, as ratios.

Real processes (`quarry serve ...`, benchmarks/cost_table.running_suite), two suites:

1. Limiter ON at DynamoDB's per-partition limits (WCU per partition per second:
   BENCH_SHARDS_WCU, default 1,000; scale it down on a busy machine, the ratio is what
   counts): WRITERS writers stage entries on ONE branch with PutObjects batches of BATCH for
   SECONDS after a burst drain; a throttled batch (RESOURCE_EXHAUSTED) is retried after a
   short jittered pause. Sustained acknowledged entries/s, N = 4 vs N = 1 (target >= 3.5x).
   Then StatObject on the dirty branch: staging reads per call from the gateway's capacity
   report (target: 1, whatever N).
2. Limiter OFF (the comparison is of work, not of throttling): COMMIT_ENTRIES entries staged
   on a branch of an N = 1 and an N = 4 repository; ListObjects first page (1,000 entries) on
   each dirty branch, LIST_ROUNDS alternating rounds, median (target N4/N1 <= 1.5); then the
   commit of all of them, COMMIT_ROUNDS alternating rounds (target N4/N1 <= 1.1).

Either phase alone: BENCH_SHARDS_SECONDS=0 skips the first, BENCH_SHARDS_COMMIT_ENTRIES=0 the
second. On a machine too busy to reach N x WCU staged writes per second, the first phase says
so (N=4 never throttled): lower BENCH_SHARDS_WCU.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import grpc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from cost_table import Suite, commit, entry, running_suite

from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import kv_pb2

WCU = float(os.environ.get("BENCH_SHARDS_WCU", "1000"))
WRITERS = int(os.environ.get("BENCH_SHARDS_WRITERS", "8"))
BATCH = int(os.environ.get("BENCH_SHARDS_BATCH", "50"))
SECONDS = float(os.environ.get("BENCH_SHARDS_SECONDS", "8"))
COMMIT_ENTRIES = int(os.environ.get("BENCH_SHARDS_COMMIT_ENTRIES", "100000"))
COMMIT_ROUNDS = int(os.environ.get("BENCH_SHARDS_COMMIT_ROUNDS", "2"))
LIST_ROUNDS = int(os.environ.get("BENCH_SHARDS_LIST_ROUNDS", "15"))
STAT_CALLS = 20
SHARDS = (1, 4)


def create(suite: Suite, name: str, shards: int) -> None:
    suite.bm.CreateRepository(
        bm.CreateRepositoryRequest(
            name=name, storage_namespace=str(suite.home / "lake" / name), staging_shards=shards
        )
    )


def stage(suite: Suite, repo: str, entries: list) -> None:
    """Stage `entries` on main (one PutObjects stream, batches of 1,000; limiter off)."""
    suite.bm.PutObjects(
        iter(
            [
                bm.PutObjectsRequest(repository=repo, branch="main", entries=entries[i : i + 1000])
                for i in range(0, len(entries), 1000)
            ]
        )
    )


def sustained_writes(suite: Suite, repo: str) -> tuple[float, int]:
    """(acknowledged entries per second, throttled batches) of WRITERS writers on one branch,
    measured for SECONDS after one second spent draining the limiter's burst."""
    stop = threading.Event()
    measuring = threading.Event()
    counts = [0] * WRITERS
    throttled = [0] * WRITERS

    def writer(n: int) -> None:
        rng = random.Random(n)
        i = 0
        while not stop.is_set():
            request = bm.PutObjectsRequest(
                repository=repo,
                branch="main",
                entries=[entry(f"w{n}/f{i + k:08d}") for k in range(BATCH)],
            )
            try:
                suite.bm.PutObjects(iter([request]))
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                if measuring.is_set():
                    throttled[n] += 1
                time.sleep(rng.uniform(0.005, 0.03))
                continue
            i += BATCH
            if measuring.is_set():
                counts[n] += BATCH

    threads = [threading.Thread(target=writer, args=(n,), daemon=True) for n in range(WRITERS)]
    for thread in threads:
        thread.start()
    # The burst (one second of capacity per partition) drains first: measure from one second
    # after the first throttled batch (at most 15 s of warm-up).
    measuring.set()
    deadline = time.monotonic() + 15
    while sum(throttled) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    measuring.clear()
    counts[:] = [0] * WRITERS
    throttled[:] = [0] * WRITERS
    measuring.set()
    start = time.monotonic()
    time.sleep(SECONDS)
    measuring.clear()
    elapsed = time.monotonic() - start
    stop.set()
    for thread in threads:
        thread.join(30)
    return sum(counts) / elapsed, sum(throttled)


def staging_reads(suite: Suite) -> float:
    report = suite.kv.GetCapacityReport(kv_pb2.GetCapacityReportRequest(top_n=1))
    return sum(c.usage.reads for c in report.classes if c.partition_class == "staging")


def stat_staging_reads(suite: Suite, repo: str) -> float:
    """Staging reads per StatObject on the dirty branch (hits and misses alternate)."""
    suite.bm.StatObject(bm.StatObjectRequest(repository=repo, ref="main", path="w0/f00000000"))
    before = staging_reads(suite)
    for i in range(STAT_CALLS):
        path = "w0/f00000000" if i % 2 == 0 else f"missing/{i}"
        try:
            suite.bm.StatObject(bm.StatObjectRequest(repository=repo, ref="main", path=path))
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.NOT_FOUND:
                raise
    return (staging_reads(suite) - before) / STAT_CALLS


def first_page_seconds(suite: Suite, repo: str) -> float:
    start = time.perf_counter()
    response = suite.bm.ListObjects(
        bm.ListObjectsRequest(repository=repo, ref="main", page_size=1000)
    )
    elapsed = time.perf_counter() - start
    assert len(response.entries) == 1000, len(response.entries)
    return elapsed


def write_phase() -> None:
    print(
        f"sharded staging: {WRITERS} writers on one branch, PutObjects batches of {BATCH}, "
        f"limiter on at {WCU:,.0f} WCU/s per partition, {SECONDS:.0f} s sustained"
    )
    rates: dict[int, float] = {}
    refusals: dict[int, int] = {}
    stat_reads: dict[int, float] = {}
    with running_suite(QUARRY_KV_LIMITER_WRITE_UNITS_PER_SECOND=str(WCU)) as suite:
        for shards in SHARDS:
            repo = f"writes-n{shards}"
            create(suite, repo, shards)
            rate, refused = sustained_writes(suite, repo)
            rates[shards] = rate
            refusals[shards] = refused
            stat_reads[shards] = stat_staging_reads(suite, repo)
            print(
                f"  N={shards}: {rate:>8,.0f} staged entries/s ({rate / WCU:.2f}x one "
                f"partition's WCU/s; {refused} throttled batches); StatObject on the dirty "
                f"branch: {stat_reads[shards]:.2f} staging reads per call"
            )
    ratio = rates[4] / rates[1]
    print(
        f"  sustained writes N=4 / N=1: {ratio:.2f}x   {'MET' if ratio >= 3.5 else 'MISSED'} (>= 3.5)"
    )
    if refusals[4] == 0:
        print(
            "  (N=4 was never throttled: the writers, not the partitions, were the limit on this "
            "machine now; run again with a lower BENCH_SHARDS_WCU)"
        )
    one_read = all(abs(v - 1.0) < 1e-9 for v in stat_reads.values())
    print(
        f"  StatObject, dirty branch, staging reads per call = 1 at N=1 and N=4: {'MET' if one_read else 'MISSED'}"
    )


def main() -> None:
    if SECONDS > 0:  # BENCH_SHARDS_SECONDS=0: the limiter-off phase only
        write_phase()
    if COMMIT_ENTRIES <= 0:
        return  # BENCH_SHARDS_COMMIT_ENTRIES=0: the write phase only
    print(
        f"  limiter off: {COMMIT_ENTRIES:,} staged entries per branch; ListObjects first page "
        f"(1,000) median of {LIST_ROUNDS}; commit of all of them, {COMMIT_ROUNDS} round(s)"
    )
    with running_suite(QUARRY_KV_LIMITER_ENABLED="false") as suite:
        for shards in SHARDS:
            create(suite, f"big-n{shards}", shards)
        lists: dict[int, list[float]] = {n: [] for n in SHARDS}
        commits: dict[int, list[float]] = {n: [] for n in SHARDS}
        for round_ in range(COMMIT_ROUNDS):
            for shards in SHARDS:
                entries = [
                    entry(f"tables/t{i % 17:02d}/part-{i:07d}", str(round_ + 1))
                    for i in range(COMMIT_ENTRIES)
                ]
                stage(suite, f"big-n{shards}", entries)
            if round_ == 0:
                for _ in range(LIST_ROUNDS):
                    for shards in SHARDS:
                        lists[shards].append(first_page_seconds(suite, f"big-n{shards}"))
            # Alternate which goes first: the machine's load drifts within a round.
            for shards in SHARDS if round_ % 2 == 0 else SHARDS[::-1]:
                start = time.perf_counter()
                commit(suite, f"big-n{shards}", "main", f"round {round_}")
                commits[shards].append(time.perf_counter() - start)
    list_ratio = statistics.median(lists[4]) / statistics.median(lists[1])
    commit_ratio = statistics.median(commits[4]) / statistics.median(commits[1])
    for shards in SHARDS:
        print(
            f"  N={shards}: ListObjects first page {statistics.median(lists[shards]) * 1000:.1f} ms, "
            f"commit {statistics.median(commits[shards]):.2f} s "
            f"({', '.join(f'{s:.2f}' for s in commits[shards])})"
        )
    print(
        f"  ListObjects first page N=4 / N=1: {list_ratio:.2f}   {'MET' if list_ratio <= 1.5 else 'MISSED'} (<= 1.5)"
    )
    print(
        f"  commit of {COMMIT_ENTRIES:,} staged N=4 / N=1: {commit_ratio:.2f}   {'MET' if commit_ratio <= 1.1 else 'MISSED'} (<= 1.1)"
    )


if __name__ == "__main__":
    main()
