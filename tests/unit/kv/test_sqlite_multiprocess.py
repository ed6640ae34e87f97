"""Two OS processes doing compare-and-swap increments on one SQLite file lose no update."""

from __future__ import annotations

import multiprocessing
import random
import time

from quarry.kv.sqlite import SQLiteStore
from quarry.kv.store import Equals, PredicateFailed

PARTITION, KEY = b"staging/multiprocess-m", b"counter"


def _increment(path: str, times: int, barrier, conflicts) -> None:
    # Runs in a spawned child: its own interpreter, its own connections to the file.
    store = SQLiteStore(path)
    rng = random.Random()
    barrier.wait()
    lost = 0
    for _ in range(times):
        # Without a pause one process keeps winning the write lock while the other sleeps
        # in SQLite's busy handler, and the increments never actually interleave.
        time.sleep(rng.uniform(0, 0.001))
        while True:
            current = store.get(PARTITION, KEY)
            try:
                store.set_if(
                    PARTITION, KEY, str(int(current.value) + 1).encode(), Equals(current.predicate)
                )
                break
            except PredicateFailed:
                lost += 1
    store.close()
    with conflicts.get_lock():
        conflicts.value += lost


def test_cas_increments_from_two_processes(tmp_path):
    path = str(tmp_path / "shared.db")
    setup = SQLiteStore(path)
    setup.set(PARTITION, KEY, b"0")

    ctx = multiprocessing.get_context("spawn")
    processes_n, times = 2, 200
    barrier = ctx.Barrier(processes_n)
    conflicts = ctx.Value("i", 0)
    procs = [
        ctx.Process(target=_increment, args=(path, times, barrier, conflicts))
        for _ in range(processes_n)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0] * processes_n

    assert setup.get(PARTITION, KEY).value == str(processes_n * times).encode()
    print(f"CAS conflicts between processes: {conflicts.value}")
    setup.close()
