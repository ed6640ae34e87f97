"""Committer worker processes (issue 29, item 3: "any other service where it pays"):
commits of CLIENTS clients at once, each on a branch of its own, against a committer of 1
and of 2 worker processes (QUARRY_COMMITTER_WORKERS), in alternating rounds of one run.

The suite runs as processes (`quarry serve ...`, benchmarks/cost_table.running_suite; the
kv-gateway's limiter off: the comparison is of the committer's work). Each client stages
CHANGES entries (one PutObjects) and commits them, over and over, for SECONDS; commits per
second, median of ROUNDS rounds per worker count, and the ratio 2 / 1.
Run: `.venv/bin/python benchmarks/committer_workers.py` (BENCH_COMMITTERS_*)."""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from pathlib import Path

import grpc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from cost_table import entry, running_suite

from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import committer_pb2, committer_pb2_grpc

CLIENTS = int(os.environ.get("BENCH_COMMITTERS_CLIENTS", "8"))
CHANGES = int(os.environ.get("BENCH_COMMITTERS_CHANGES", "200"))
SECONDS = float(os.environ.get("BENCH_COMMITTERS_SECONDS", "10"))
ROUNDS = int(os.environ.get("BENCH_COMMITTERS_ROUNDS", "3"))
REPO = "bench"


def commits_per_second(workers: int) -> float:
    with running_suite(
        QUARRY_KV_LIMITER_ENABLED="false", QUARRY_COMMITTER_WORKERS=str(workers)
    ) as suite:
        suite.bm.CreateRepository(
            bm.CreateRepositoryRequest(name=REPO, storage_namespace=str(suite.home / "lake"))
        )
        for k in range(CLIENTS):
            suite.bm.CreateBranch(
                bm.CreateBranchRequest(repository=REPO, name=f"b{k}", source_ref="main")
            )
        # Every worker up before the clock starts (the supervisor answers as soon as one is).
        time.sleep(3 if workers > 1 else 0)
        stop = time.monotonic() + SECONDS
        counts = [0] * CLIENTS

        def client(k: int) -> None:
            # A connection of its own: the kernel spreads connections over the workers.
            channel = grpc.insecure_channel(
                f"127.0.0.1:{suite.ports['committer']}",
                options=[("grpc.use_local_subchannel_pool", 1)],
            )
            committer = committer_pb2_grpc.CommitterStub(channel)
            n = 0
            while time.monotonic() < stop:
                suite.bm.PutObjects(
                    iter(
                        [
                            bm.PutObjectsRequest(
                                repository=REPO,
                                branch=f"b{k}",
                                entries=[entry(f"d{k}/{n}/{i:04d}") for i in range(CHANGES)],
                            )
                        ]
                    )
                )
                committer.Commit(
                    committer_pb2.CommitRequest(repository=REPO, branch=f"b{k}", message=str(n))
                )
                n += 1
            counts[k] = n
            channel.close()

        started = time.monotonic()
        threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(counts) / (time.monotonic() - started)


def main() -> None:
    rates: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(ROUNDS):
        for workers in rates:
            rates[workers].append(commits_per_second(workers))
    one, two = (statistics.median(rates[w]) for w in (1, 2))
    print(
        f"committer workers: {CLIENTS} clients committing {CHANGES} staged entries each, "
        f"{SECONDS:.0f} s rounds, median of {ROUNDS}"
    )
    for workers in rates:
        print(
            f"  {workers} worker(s): {statistics.median(rates[workers]):6.1f} commits/s  "
            f"({', '.join(f'{r:.1f}' for r in rates[workers])})"
        )
    print(f"  2 workers / 1: {two / one:.2f}")


if __name__ == "__main__":
    main()
