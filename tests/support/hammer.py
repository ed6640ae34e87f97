"""Writers, readers and committers hammering one branch at once; shared by the unit test
(in-process core) and the integration test (real servers over gRPC).

Each writer owns its paths and writes increasing versions, recording a version as
acknowledged only after the write returned. Readers check that they never see a version
older than one acknowledged before their read started. At the end every path must hold its
last acknowledged version, on the branch and, after a final commit, in the commit chain.
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
    seconds: float = 3.0,
    paths_per_writer: int = 5,
    retryable: tuple[type[BaseException], ...] = (),
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
            except Exception as exc:  # noqa: BLE001
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
            except Exception as exc:  # noqa: BLE001
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
            except Exception as exc:  # noqa: BLE001
                with lock:
                    result.errors.append(f"commit: {exc!r}")
            time.sleep(0.005)

    threads = (
        [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
        + [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
        + [threading.Thread(target=committer, args=(i,)) for i in range(committers)]
    )
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(60)
    return result
