"""Commit of C changes into a repository of M entries, against git plumbing doing the same
in the same run (docs/architecture.md §6: commit cost grows with the change, not the repository).

Quarry: the core in process (memory KV, ranges as Parquet in a local directory, fsynced before
the metarange naming them; the real CommittedManager), so the figure is the engine's, not the
gRPC hops'. The M entries are written once as a metarange (bench_repo: straight through the
committed writer, cached on disk for M >= 1M) and committed; then C changes are staged
(put_objects) and committed. Timed: staging + commit, and commit alone.
git: an index holding the same M paths (1,000 files per directory) with its cache-tree
written once; then `git update-index --index-info` of the C changes + `git write-tree
--missing-ok`, timed together. git runs with its defaults, pinned so no user or system
configuration changes them (GIT_CONFIG_NOSYSTEM, an empty HOME): index version 2, no split
index, core.fsync at its default (git 2.36+: neither the index nor loose objects are
fsynced — Quarry's range files are), no untracked cache; update-index and write-tree never
run an automatic gc. The 10M point is Quarry only (flatness: 10M against 1M).
Before each timed operation, on both sides, every dirty page is written back (os.sync,
untimed: bench_repo.settle), so neither pays for the other's writeback.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench_repo import FILES_PER_DIR, BenchRepo, entry, path_of, scratch_dir, settle, verdict

SIZES = [
    int(x) for x in os.environ.get("BENCH_COMMIT_SIZES", "10000,100000,1000000,10000000").split(",")
]
# Sizes without the git side (building a 10M-entry git index takes minutes and ~1 GB).
QUARRY_ONLY_FROM = int(os.environ.get("BENCH_COMMIT_QUARRY_ONLY_FROM", "10000000"))
ROUNDS = int(os.environ.get("BENCH_COMMIT_ROUNDS", "3"))
# The rows of 1 and of 1,000 localized changes take milliseconds, where one scheduling hiccup
# moves a median of 3 by half (the 10M / 1M flatness read 1.02, 1.55 and 1.27 in three runs of
# the same code): they take more rounds.
SMALL_ROUNDS = int(os.environ.get("BENCH_COMMIT_SMALL_ROUNDS", "9"))
# The scattered commit at 1M also runs with this many span worker processes next to the
# committing one (QUARRY_RANGE_WRITER_PROCESSES), alternating with the one-process side.
PROCESSES = int(os.environ.get("BENCH_COMMIT_PROCESSES", "1"))
SCATTERED = "1000 scattered"
BLOB = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # any id: --missing-ok
DURABLE_GIT = {
    "GIT_CONFIG_COUNT": "2",
    "GIT_CONFIG_KEY_0": "core.fsync",
    "GIT_CONFIG_VALUE_0": "loose-object,index",
    "GIT_CONFIG_KEY_1": "core.fsyncMethod",
    "GIT_CONFIG_VALUE_1": "batch",
}


def change_sets(m: int, rng: random.Random) -> dict[str, list[int]]:
    directory = rng.randrange(m // FILES_PER_DIR)
    localized = [directory * FILES_PER_DIR + f for f in range(min(1000, FILES_PER_DIR))]
    sets = {"1": [rng.randrange(m)], "1000 localized": localized}
    if m < QUARRY_ONLY_FROM:
        sets[SCATTERED] = rng.sample(range(m), 1000)
    return sets


class QuarrySide:
    def __init__(self, root: Path, m: int, processes: int = 0):
        self.repo = BenchRepo(root, m, processes=processes)
        self.g = self.repo.g
        self.version = 0

    def run(self, indexes: list[int]) -> tuple[float, float, int]:
        self.version += 1
        entries = [entry(path_of(i), self.version) for i in indexes]
        settle()
        start = time.perf_counter()
        self.g.put_objects("bench", "main", entries)
        staged = time.perf_counter()
        outcome = self.g.commit("bench", "main", f"v{self.version}")
        end = time.perf_counter()
        return end - start, end - staged, outcome.ranges_written

    def close(self) -> None:
        self.repo.close()


class GitSide:
    def __init__(self, root: Path, m: int):
        self.dir = root / "git"
        self.dir.mkdir()
        home = root / "git-home"
        home.mkdir()
        self.env = dict(
            os.environ,
            GIT_DIR=str(self.dir / ".git"),
            GIT_INDEX_FILE=str(self.dir / "index"),
            GIT_CONFIG_NOSYSTEM="1",
            HOME=str(home),
            XDG_CONFIG_HOME=str(home),
        )
        subprocess.run(["git", "init", "-q", str(self.dir)], check=True, env=self.env)
        lines = "".join(f"100644 {BLOB}\t{path_of(i)}\n" for i in range(m))
        self._update(lines)
        self._write_tree()
        self.version = 0

    def _update(self, lines: str) -> None:
        subprocess.run(
            ["git", "update-index", "--add", "--index-info"],
            input=lines.encode(),
            check=True,
            env=self.env,
            cwd=self.dir,
        )

    def _write_tree(self) -> None:
        subprocess.run(
            ["git", "write-tree", "--missing-ok"],
            check=True,
            env=self.env,
            cwd=self.dir,
            stdout=subprocess.DEVNULL,
        )

    def run(self, indexes: list[int], durable: bool = False) -> float:
        """`durable`: with Quarry's guarantee (what it wrote is fsynced before it returns):
        core.fsync=loose-object,index with core.fsyncMethod=batch (one flush for all loose
        objects, as Quarry syncs a commit's ranges together)."""
        self.version += 1
        # A distinct blob id per version so every line is a real change.
        blob = f"{self.version:040x}"
        lines = "".join(f"100644 {blob}\t{path_of(i)}\n" for i in indexes)
        env = self.env
        if durable:
            self.env = dict(env, **DURABLE_GIT)
        try:
            settle()
            start = time.perf_counter()
            self._update(lines)
            self._write_tree()
            return time.perf_counter() - start
        finally:
            self.env = env


def main() -> None:
    rng = random.Random(7)
    rows = []
    fanned_rows: list[tuple[int, float, float]] = []
    version = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.strip()
    print(f"  {version}, default settings (see the module docstring)", flush=True)
    for m in SIZES:
        root = scratch_dir(f"commit-{m}-") if m >= 1_000_000 else Path(tempfile.mkdtemp())
        quarry = fanned = None
        try:
            t0 = time.perf_counter()
            quarry = QuarrySide(root, m)
            setup_quarry = time.perf_counter() - t0
            if PROCESSES and 1_000_000 <= m < QUARRY_ONLY_FROM:
                fanned_root = root / "fanned"
                fanned_root.mkdir()
                fanned = QuarrySide(fanned_root, m, processes=PROCESSES)
            git = None
            build_git = 0.0
            if m < QUARRY_ONLY_FROM:
                t0 = time.perf_counter()
                git = GitSide(root, m)
                build_git = time.perf_counter() - t0
            built = quarry.repo.build_seconds
            print(
                f"  M={m:>10,}: quarry ready in {setup_quarry:.1f}s "
                f"({f'built in {built:.1f}s' if built else 'from .bench-cache'}), "
                + (f"git index built in {build_git:.1f}s" if git else "no git side"),
                flush=True,
            )
            # One untimed commit on each side first: a process's first commit pays imports,
            # thread pools and cold caches that no later one does (the first row measured
            # them: 10k entries slower than 100k).
            warm_up = change_sets(m, rng)["1"]
            quarry.run(warm_up)
            if git is not None:
                git.run(warm_up)
            if fanned is not None:
                # Its worker's first span reads the base's ranges (its caches start empty).
                fanned.run(change_sets(m, rng)[SCATTERED])
            for label in change_sets(m, rng):
                q_total, q_commit, g_total, g_durable, written = [], [], [], [], []
                f_total, f_commit = [], []
                for _ in range(ROUNDS if label == SCATTERED else SMALL_ROUNDS):
                    indexes = change_sets(m, rng)[label]
                    total, commit_only, ranges = quarry.run(indexes)
                    q_total.append(total)
                    q_commit.append(commit_only)
                    written.append(ranges)
                    if git is not None:
                        g_total.append(git.run(indexes))
                        g_durable.append(git.run(change_sets(m, rng)[label], durable=True))
                    if fanned is not None and label == SCATTERED:
                        total, commit_only, _ = fanned.run(change_sets(m, rng)[label])
                        f_total.append(total)
                        f_commit.append(commit_only)
                if f_total:
                    fanned_rows.append((m, statistics.median(f_total), statistics.median(f_commit)))
                rows.append(
                    (
                        m,
                        label,
                        statistics.median(q_total),
                        statistics.median(q_commit),
                        statistics.median(g_total) if g_total else None,
                        statistics.median(g_durable) if g_durable else None,
                        max(written),
                    )
                )
        finally:
            for side in (quarry, fanned):
                if side is not None:
                    side.close()
            shutil.rmtree(root, ignore_errors=True)

    print(
        f"\n  commit of C changes into M entries (median of {ROUNDS} scattered, {SMALL_ROUNDS} "
        "others; quarry = stage + commit)"
    )
    print(
        f"  {'M':>10} {'C':<16}{'quarry ms':>10}{'commit ms':>10}{'git ms':>9}"
        f"{'quarry/git':>11}{'git fsync ms':>13}{'q/git fsync':>12}{'ranges':>8}"
    )
    for m, label, q, qc, g, gd, written in rows:
        git_ms = f"{g * 1e3:>9.1f}" if g else f"{'-':>9}"
        ratio = f"{q / g:>11.2f}" if g else f"{'-':>11}"
        durable_ms = f"{gd * 1e3:>13.1f}" if gd else f"{'-':>13}"
        durable_ratio = f"{q / gd:>12.2f}" if gd else f"{'-':>12}"
        print(
            f"  {m:>10,} {label:<16}{q * 1e3:>10.1f}{qc * 1e3:>10.1f}{git_ms}{ratio}"
            f"{durable_ms}{durable_ratio}{written:>8}"
        )
    by = {(m, label): (q, g) for m, label, q, _, g, _, _ in rows}
    durable = {(m, label): gd for m, label, _, _, _, gd, _ in rows}
    for m, q, qc in fanned_rows:
        g, gd = by[(m, SCATTERED)][1], durable[(m, SCATTERED)]
        label = f"{SCATTERED} +{PROCESSES}p"
        print(
            f"  {m:>10,} {label:<16}{q * 1e3:>10.1f}{qc * 1e3:>10.1f}{g * 1e3:>9.1f}"
            f"{q / g:>11.2f}{gd * 1e3:>13.1f}{q / gd:>12.2f}{'':>8}"
        )
    print(
        "  (targets against git's defaults; 'git fsync' = git with Quarry's durability, "
        f"for information; '+{PROCESSES}p' = with {PROCESSES} span worker process(es), "
        f"QUARRY_RANGE_WRITER_PROCESSES={PROCESSES}, alternating with the rows above)"
    )
    if (1_000_000, SCATTERED) in by:
        q, g = by[(1_000_000, SCATTERED)]
        print(
            f"  target: 1000 scattered into 1M <= 0.8 x git: {q / g:.2f}  {verdict(q / g, 0.8)}"
            " (one process)"
        )
    for m, q, _ in fanned_rows:
        if m == 1_000_000:
            g = by[(m, SCATTERED)][1]
            print(
                f"  target: 1000 scattered into 1M <= 0.8 x git: {q / g:.2f}  "
                f"{verdict(q / g, 0.8)} (+{PROCESSES} span worker process)"
            )
    if (10_000, "1") in by:
        q, g = by[(10_000, "1")]
        print(f"  target: 1 change into 10k <= 1.0 x git: {q / g:.2f}  {verdict(q / g, 1.0)}")
    for label in ("1", "1000 localized"):
        if (10_000, label) in by and (1_000_000, label) in by:
            ratio = by[(1_000_000, label)][0] / by[(10_000, label)][0]
            print(
                f"  flatness, C={label}: 1M / 10k = {ratio:.2f}  (target <= 1.5) {verdict(ratio, 1.5)}"
            )
    for label in ("1", "1000 localized"):
        if (10_000_000, label) in by and (1_000_000, label) in by:
            ratio = by[(10_000_000, label)][0] / by[(1_000_000, label)][0]
            target = "target" if label != "1" else "for information"
            print(
                f"  flatness, C={label}: 10M / 1M = {ratio:.2f}  ({target} <= 1.2) "
                f"{verdict(ratio, 1.2)}"
            )


if __name__ == "__main__":
    main()
