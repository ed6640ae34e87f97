"""Flatness (issue 14, target 3) with CPU time: the localized commit (1,000 changes in one
directory) and merge (2 x 1,000 localized) of commit_vs_git.py and merge_vs_git.py at 1M and
10M entries, ROUNDS each, reporting wall time and the process's CPU time (all its threads)
per operation, as medians and minimums, and the 10M / 1M ratios. Both repositories are
open at once and their rounds alternate.

On a shared machine wall times of a few milliseconds vary by 2-3x between runs; CPU time
and the minimum over many rounds show what the code costs. The repositories come from
bench_repo (cached under .bench-cache/). Run: `.venv/bin/python benchmarks/profile_flatness.py`
(BENCH_FLAT_ROUNDS, default 9).
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import time

from bench_repo import FILES_PER_DIR, BenchRepo, entry, path_of, scratch_dir
from merge_vs_git import branch

from quarry.graveler.model import MergeStrategy

ROUNDS = int(os.environ.get("BENCH_FLAT_ROUNDS", "9"))
SIZES = (1_000_000, 10_000_000)
CHANGES = 1000


class Timer:
    """Wall and CPU seconds of each timed block."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def __enter__(self) -> Timer:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall.append(time.perf_counter() - self._wall)
        self.cpu.append(time.process_time() - self._cpu)


class Size:
    """One repository of `m` entries and its commit and merge timers."""

    def __init__(self, m: int, rng: random.Random) -> None:
        self.m = m
        self.rng = rng
        self.root = scratch_dir(f"flat-{m}-")
        self.repo = BenchRepo(self.root, m)
        self.commit, self.merge = Timer(), Timer()
        g = self.repo.g
        self.head = g.get_branch("bench", "main").commit_id
        g.put_objects("bench", "main", [entry(path_of(rng.randrange(m)), "warm-up")])
        g.commit("bench", "main", "warm-up")

    def round(self, r: int) -> None:
        """A localized commit on main, then a localized merge of two fresh branches."""
        repo, g, m, rng = self.repo, self.repo.g, self.m, self.rng
        directory = rng.randrange(m // FILES_PER_DIR)
        paths = [path_of(directory * FILES_PER_DIR + f) for f in range(CHANGES)]
        g.put_objects("bench", "main", [entry(p, f"v{r}") for p in paths])
        with self.commit:
            g.commit("bench", "main", f"c{r}")
        dir_a, dir_b = rng.sample(range(m // FILES_PER_DIR), 2)
        changed = [[d * FILES_PER_DIR + f for f in range(CHANGES)] for d in (dir_a, dir_b)]
        source = branch(repo, f"la{r}", self.head, changed[0])
        dest = branch(repo, f"lb{r}", self.head, changed[1])
        with self.merge:
            repo.committed.merge_metaranges(
                repo.namespace, repo.base_metarange_id, source, dest, MergeStrategy.DEFAULT
            )

    def close(self) -> None:
        self.repo.committed.close()
        shutil.rmtree(self.root, ignore_errors=True)


def main() -> None:
    rng = random.Random(5)
    # Both repositories at once, their rounds alternating: the machine's drift over a run
    # falls on both sizes alike (and both run with the same heap).
    sizes: dict[int, Size] = {}
    try:
        for m in SIZES:
            sizes[m] = Size(m, rng)
        for r in range(ROUNDS):
            for size in sizes.values():
                size.round(r)
    finally:
        for size in sizes.values():
            size.close()
    timers = {m: (size.commit, size.merge) for m, size in sizes.items()}
    small, large = SIZES
    print(f"  localized ops, {ROUNDS} rounds: ms median / min at 1M and 10M; 10M / 1M")
    for k, op in enumerate(("commit", "merge")):
        for kind in ("wall", "cpu"):
            a = getattr(timers[small][k], kind)
            b = getattr(timers[large][k], kind)
            print(
                f"  {op:6} {kind:4}  1M {statistics.median(a) * 1e3:6.1f} / {min(a) * 1e3:6.1f}"
                f"  10M {statistics.median(b) * 1e3:6.1f} / {min(b) * 1e3:6.1f}"
                f"  ratio {statistics.median(b) / statistics.median(a):5.2f} / "
                f"{min(b) / min(a):5.2f}"
            )


if __name__ == "__main__":
    main()
