"""Scale-out of commits over range-writer replicas: the same scattered apply (1,000 changes
over 1M entries, what a commit sends) through one range-writer process, and through two
(the one called fans the apply out in two key spans, one to its peer: QUARRY_RANGE_WRITER_
PEERS), in the same run. Real processes (`quarry serve range-writer`), auth off, the client
is this process (RemoteRangeWriter, as the committer calls it). The 1M base comes from
bench_repo's cache. Both sides apply a fresh version each round, so both write new ranges.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_repo import cached_base, entry, link_tree, path_of, scratch_dir

from quarry.blob.layout import METARANGES_PREFIX, RANGES_PREFIX
from quarry.committed.remote import RemoteRangeWriter

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from support.processes import free_port, quarry_env, wait_serving

M = int(os.environ.get("BENCH_SCALE_ENTRIES", "1000000"))
CHANGES = 1000
ROUNDS = int(os.environ.get("BENCH_SCALE_ROUNDS", "3"))


def serve(home: Path, port: int, **settings: str) -> subprocess.Popen:
    env = quarry_env(
        home,
        QUARRY_AUTH_ENABLED="false",
        QUARRY_RANGE_WRITER_PORT=str(port),
        QUARRY_METRICS_BASE_PORT="0",
        **settings,
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "quarry.cli.main", "serve", "range-writer"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_serving(f"127.0.0.1:{port}")
    return child


def main() -> None:
    root = scratch_dir("scale-")
    lake, base, _ = cached_base(M)
    namespace = root / "lake"
    for prefix in (RANGES_PREFIX, METARANGES_PREFIX):
        link_tree(lake, namespace, prefix.rstrip("/"))
    solo_port, coordinator_port, peer_port = free_port(), free_port(), free_port()
    children = []
    try:
        children.append(serve(root / "solo", solo_port))
        children.append(serve(root / "peer", peer_port))
        children.append(
            serve(
                root / "coordinator",
                coordinator_port,
                QUARRY_RANGE_WRITER_PEERS=f"127.0.0.1:{peer_port}",
                QUARRY_RANGE_WRITER_FAN_OUT_MIN_CHANGES="500",
            )
        )
        solo = RemoteRangeWriter(f"127.0.0.1:{solo_port}")
        fanned = RemoteRangeWriter(f"127.0.0.1:{coordinator_port}")
        rng = random.Random(5)
        times: dict[str, list[float]] = {"1 process": [], "2 processes": []}
        same = True
        for r in range(ROUNDS):
            picks = sorted(rng.sample(range(M), CHANGES))
            for label, writer in (("1 process", solo), ("2 processes", fanned)):
                changes = [(path_of(i), entry(path_of(i), f"{label}{r}")) for i in picks]
                start = time.perf_counter()
                result = writer.apply_changes(str(namespace), base, changes)
                times[label].append(time.perf_counter() - start)
                same = same and result.summary.changed == CHANGES
        one, two = (statistics.median(times[k]) for k in ("1 process", "2 processes"))
        print(f"  apply of {CHANGES:,} scattered changes over {M:,} entries (median of {ROUNDS})")
        print(f"  1 range-writer process      {one * 1e3:8.1f} ms")
        print(f"  2 range-writer processes    {two * 1e3:8.1f} ms  (2 key spans, one per process)")
        print(f"  2 / 1                       {two / one:8.2f}  (summaries correct: {same})")
        solo.close()
        fanned.close()
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
