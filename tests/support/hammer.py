"""Writers, readers and committers hammering one branch at once; shared by the unit test
(in-process core) and the integration test (real servers over gRPC).

Each writer owns its paths and writes increasing versions, recording a version as
acknowledged only after the write returned. Readers check that they never see a version
older than one acknowledged before their read started. At the end every path must hold its
last acknowledged version, on the branch and, after a final commit, in the commit chain.

The hammer runs until a fixed amount of work is done (`min_writes`, `min_reads`,
`min_commits`), however long that takes on a loaded machine: the tests assert what went
wrong (stale reads, lost writes), never how fast it went (throughput is `make bench`'s).
`timeout` only bounds a hang.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class HammerResult:
    acked: dict[str, int] = field(default_factory=dict)
    stale_reads: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    commits: int = 0
    reads: int = 0
    writes: int = 0


def hammer(
    put: Callable[[str, int], None],
    read: Callable[[str], int | None],
    commit: Callable[[], bool],
    writers: int = 4,
    readers: int = 2,
    committers: int = 2,
    paths_per_writer: int = 5,
    retryable: tuple[type[BaseException], ...] = (),
    min_writes: int = 50,
    min_reads: int = 50,
    min_commits: int = 2,
    timeout: float = 180.0,
) -> HammerResult:
    result = HammerResult()
    lock = threading.Lock()
    stop = threading.Event()

    def writer(w: int) -> None:
        rng = random.Random(w)
        version = 0
        while not stop.is_set():
            version += 1
            path = f"w{w}/p{rng.randrange(paths_per_writer)}"
            try:
                put(path, version)
            except retryable:
                continue  # not acknowledged: no promise made
            except Exception as exc:
                with lock:
                    result.errors.append(f"put {path}: {exc!r}")
                continue
            with lock:
                result.acked[path] = version
                result.writes += 1

    def reader(r: int) -> None:
        rng = random.Random(100 + r)
        while not stop.is_set():
            path = f"w{rng.randrange(writers)}/p{rng.randrange(paths_per_writer)}"
            with lock:
                floor = result.acked.get(path, 0)
            try:
                seen = read(path) or 0
            except retryable:
                continue
            except Exception as exc:
                with lock:
                    result.errors.append(f"read {path}: {exc!r}")
                continue
            with lock:
                result.reads += 1
                if seen < floor:
                    result.stale_reads.append(f"{path}: saw v{seen} after v{floor} was acked")

    def committer(c: int) -> None:
        while not stop.is_set():
            try:
                if commit():
                    with lock:
                        result.commits += 1
            except retryable:
                pass
            except Exception as exc:
                with lock:
                    result.errors.append(f"commit: {exc!r}")
            time.sleep(0.005)

    threads = (
        [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
        + [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
        + [threading.Thread(target=committer, args=(i,)) for i in range(committers)]
    )

    def done() -> bool:
        with lock:
            return (
                result.writes >= min_writes
                and result.reads >= min_reads
                and result.commits >= min_commits
            )

    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    try:
        while not done() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    if not done():
        raise AssertionError(
            f"the hammer did not finish its work within {timeout:g}s (a hang?): "
            f"{result.writes} writes, {result.reads} reads, {result.commits} commits; "
            f"errors: {result.errors[:3]}"
        )
    return result
