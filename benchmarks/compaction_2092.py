"""The scenario of lakeFS issue 2092, measured side by side in one run: a branch with
1,000,000 committed entries under one prefix and 200,000 staged tombstones over them.
List the first page (1,000) and the whole prefix: before compaction, after compaction,
and on an equivalent clean branch (800,000 committed entries, nothing staged). Also the
cost of the compaction run against a commit of the same staged changes.

The core runs in this process with the real CommittedManager (Parquet ranges in a local
directory) and its KV store behind a real kv-gateway process (SQLite), as branch-manager
uses it: staged tombstones are read over gRPC, as in production. BENCH_2092_KV=memory uses
an in-process memory store instead.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from quarry.blob import LocalBlobStore
from quarry.committed import CommittedManager
from quarry.graveler.graveler import CommitRecord, Graveler, make_commit
from quarry.graveler.model import Entry
from quarry.kv.memory import MemoryStore
from quarry.kv.remote import RemoteStore

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from support.processes import free_port, quarry_env, wait_serving

M = int(os.environ.get("BENCH_2092_ENTRIES", "1000000"))
TOMBSTONES = int(os.environ.get("BENCH_2092_TOMBSTONES", str(M // 5)))
ROUNDS = int(os.environ.get("BENCH_2092_ROUNDS", "3"))
PAGE = 1000


def path_of(i: int) -> str:
    return f"table/part-{i:07d}.parquet"


def entry(i: int) -> Entry:
    return Entry(path_of(i), f"s3://lake/{i}", 1000, f"sum-{i}")


def import_branch(g: Graveler, committed, namespace: str, branch: str, indexes) -> None:
    repo = g.refs.get_repository("bench")
    result = committed.write_metarange(namespace, (entry(i) for i in indexes))
    head = g.get_commit("bench", "main")
    commit = make_commit(
        CommitRecord(
            [head.id], result.metarange_id, f"import {branch}", "b", {}, head.generation + 1
        )
    )
    g.refs.insert_commit(repo, commit)
    if branch != "main":
        g.create_branch("bench", branch, "main")
    g.reset_branch("bench", branch, commit.id, force=True)


def first_page(g: Graveler, branch: str) -> float:
    start = time.perf_counter()
    entries, _, _ = g.list_objects("bench", branch, prefix="table/", page_size=PAGE)
    assert len(entries) == PAGE
    return time.perf_counter() - start


def whole_prefix(g: Graveler, branch: str, expected: int) -> float:
    start = time.perf_counter()
    token, seen = "", 0
    while True:
        entries, _, token = g.list_objects(
            "bench", branch, prefix="table/", page_size=PAGE, page_token=token
        )
        seen += len(entries)
        if not token:
            break
    assert seen == expected, (seen, expected)
    return time.perf_counter() - start


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="quarry-2092-"))
    rng = random.Random(2092)
    gateway = None
    try:
        if os.environ.get("BENCH_2092_KV", "gateway") == "memory":
            kv_store = MemoryStore()
        else:
            port = free_port()
            gateway = subprocess.Popen(
                [sys.executable, "-m", "quarry.cli.main", "serve", "kv-gateway"],
                env=quarry_env(
                    root / "home", QUARRY_KV_GATEWAY_PORT=str(port), QUARRY_AUTH_ENABLED="false"
                ),  # raw KV writes: no service token
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            wait_serving(f"127.0.0.1:{port}")
            kv_store = RemoteStore(f"127.0.0.1:{port}")
        namespace = str(root / "lake")
        committed = CommittedManager(lambda ns: LocalBlobStore(ns), None)
        g = Graveler(kv_store, committed, committed)
        g.create_repository("bench", namespace)
        import_branch(g, committed, namespace, "main", range(M))
        deleted = sorted(rng.sample(range(M), TOMBSTONES))
        kept = sorted(set(range(M)) - set(deleted))
        import_branch(g, committed, namespace, "clean", kept)
        g.create_branch("bench", "commit-me", "main")
        repo = g.refs.get_repository("bench")
        for branch in ("main", "commit-me"):
            # Tombstones staged through the writer flow in batches (dirty flag, staging
            # write, validation) — the existence checks of DeleteObjects are skipped to keep
            # the setup short; every path exists.
            for offset in range(0, len(deleted), 10_000):
                g.writes.write(
                    repo, branch, [(path_of(i), None) for i in deleted[offset : offset + 10_000]]
                )
        expected = M - TOMBSTONES

        def measure(branch: str) -> tuple[float, float]:
            whole_prefix(g, branch, expected)  # warm the range caches: compare read paths
            page = statistics.median(first_page(g, branch) for _ in range(ROUNDS))
            whole = statistics.median(
                whole_prefix(g, branch, expected) for _ in range(max(1, ROUNDS - 1))
            )
            return page, whole

        before = measure("main")
        start = time.perf_counter()
        compacted, tokens = g.compact("bench", "main")
        compaction_time = time.perf_counter() - start
        after = measure("main")
        clean = measure("clean")
        start = time.perf_counter()
        g.commit("bench", "commit-me", "the same tombstones")
        commit_time = time.perf_counter() - start

        print(
            f"  lakeFS #2092: {M:,} committed entries, {TOMBSTONES:,} staged tombstones "
            f"(median of {ROUNDS}; KV: {type(kv_store).__name__})"
        )
        print(f"  {'':<22}{'first page ms':>14}{'whole prefix s':>16}")
        for label, (page, whole) in (
            ("before compaction", before),
            ("after compaction", after),
            ("clean branch", clean),
        ):
            print(f"  {label:<22}{page * 1e3:>14.1f}{whole:>16.2f}")
        print(
            f"  after / clean:  first page {after[0] / clean[0]:.2f}, whole prefix "
            f"{after[1] / clean[1]:.2f}   (target <= 1.3 on both)"
        )
        print(
            f"  before / after: first page {before[0] / after[0]:.1f}x, whole prefix "
            f"{before[1] / after[1]:.1f}x"
        )
        print(
            f"  compaction run {compaction_time:.2f}s vs commit of the same changes "
            f"{commit_time:.2f}s (ratio {compaction_time / commit_time:.2f}); "
            f"{tokens} token(s) compacted"
        )
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(20)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
