"""Commit of C changes into a repository of M entries, against git plumbing doing the same
in the same run (docs/architecture.md §6: commit cost grows with the change, not the repository).

Quarry: the core in process (memory KV, ranges as Parquet in a local directory, the real
CommittedManager), so the figure is the engine's, not the gRPC hops'. The M entries are
written once as a metarange and committed; then C changes are staged (put_objects) and
committed. Timed: staging + commit, and commit alone.
git: an index holding the same M paths (1,000 files per directory) with its cache-tree
written once; then `git update-index --index-info` of the C changes + `git write-tree
--missing-ok`, timed together.
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

from quarry.blob import LocalBlobStore
from quarry.committed import CommittedManager
from quarry.graveler.graveler import CommitRecord, Graveler, make_commit
from quarry.graveler.model import Entry
from quarry.kv.memory import MemoryStore

SIZES = [int(x) for x in os.environ.get("BENCH_COMMIT_SIZES", "10000,100000,1000000").split(",")]
ROUNDS = int(os.environ.get("BENCH_COMMIT_ROUNDS", "3"))
FILES_PER_DIR = 1000
BLOB = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # any id: --missing-ok


def path_of(i: int) -> str:
    return f"dir{i // FILES_PER_DIR:04d}/file{i % FILES_PER_DIR:04d}"


def entry(path: str, version: int) -> Entry:
    return Entry(path, f"s3://lake/{path}@{version}", 100 + version, f"sum-{path}-{version}")


def change_sets(m: int, rng: random.Random) -> dict[str, list[int]]:
    directory = rng.randrange(m // FILES_PER_DIR)
    localized = [directory * FILES_PER_DIR + f for f in range(min(1000, FILES_PER_DIR))]
    return {
        "1": [rng.randrange(m)],
        "1000 localized": localized,
        "1000 scattered": rng.sample(range(m), 1000),
    }


class QuarrySide:
    def __init__(self, root: Path, m: int):
        self.namespace = str(root / "lake")
        self.committed = CommittedManager(lambda ns: LocalBlobStore(ns), None)
        self.g = Graveler(MemoryStore(), self.committed, self.committed)
        self.g.create_repository("bench", self.namespace)
        repo = self.g.refs.get_repository("bench")
        result = self.committed.write_metarange(
            self.namespace, (entry(path_of(i), 0) for i in range(m))
        )
        head = self.g.get_commit("bench", "main")
        commit = make_commit(
            CommitRecord([head.id], result.metarange_id, "import", "bench", {}, head.generation + 1)
        )
        self.g.refs.insert_commit(repo, commit)
        self.g.reset_branch("bench", "main", commit.id, force=True)
        self.version = 0

    def run(self, indexes: list[int]) -> tuple[float, float, int]:
        self.version += 1
        entries = [entry(path_of(i), self.version) for i in indexes]
        start = time.perf_counter()
        self.g.put_objects("bench", "main", entries)
        staged = time.perf_counter()
        outcome = self.g.commit("bench", "main", f"v{self.version}")
        end = time.perf_counter()
        return end - start, end - staged, outcome.ranges_written


class GitSide:
    def __init__(self, root: Path, m: int):
        self.dir = root / "git"
        self.dir.mkdir()
        self.env = dict(
            os.environ, GIT_DIR=str(self.dir / ".git"), GIT_INDEX_FILE=str(self.dir / "index")
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

    def run(self, indexes: list[int]) -> float:
        self.version += 1
        # A distinct blob id per version so every line is a real change.
        blob = f"{self.version:040x}"
        lines = "".join(f"100644 {blob}\t{path_of(i)}\n" for i in indexes)
        start = time.perf_counter()
        self._update(lines)
        self._write_tree()
        return time.perf_counter() - start


def main() -> None:
    rng = random.Random(7)
    rows = []
    for m in SIZES:
        root = Path(tempfile.mkdtemp(prefix=f"quarry-commit-{m}-"))
        try:
            t0 = time.perf_counter()
            quarry = QuarrySide(root, m)
            build_quarry = time.perf_counter() - t0
            t0 = time.perf_counter()
            git = GitSide(root, m)
            build_git = time.perf_counter() - t0
            print(
                f"  M={m:>9,}: built in {build_quarry:.1f}s (quarry) / {build_git:.1f}s (git)",
                flush=True,
            )
            for label, _ in change_sets(m, rng).items():
                q_total, q_commit, g_total, written = [], [], [], []
                for _ in range(ROUNDS):
                    indexes = change_sets(m, rng)[label]
                    total, commit_only, ranges = quarry.run(indexes)
                    q_total.append(total)
                    q_commit.append(commit_only)
                    written.append(ranges)
                    g_total.append(git.run(indexes))
                rows.append(
                    (
                        m,
                        label,
                        statistics.median(q_total),
                        statistics.median(q_commit),
                        statistics.median(g_total),
                        max(written),
                    )
                )
        finally:
            shutil.rmtree(root, ignore_errors=True)

    print(f"\n  commit of C changes into M entries (median of {ROUNDS}; quarry = stage + commit)")
    print(
        f"  {'M':>9} {'C':<16}{'quarry ms':>10}{'commit ms':>10}{'git ms':>9}"
        f"{'quarry/git':>11}{'ranges':>8}"
    )
    for m, label, q, qc, g, written in rows:
        print(
            f"  {m:>9,} {label:<16}{q * 1e3:>10.1f}{qc * 1e3:>10.1f}{g * 1e3:>9.1f}"
            f"{q / g:>11.2f}{written:>8}"
        )
    by = {(m, label): q for m, label, q, _, _, _ in rows}
    if 10000 in SIZES and 1000000 in SIZES:
        for label in ("1", "1000 localized"):
            ratio = by[(1000000, label)] / by[(10000, label)]
            print(f"  flatness, C={label}: 1M / 10k = {ratio:.2f}  (target <= 1.5)")


if __name__ == "__main__":
    main()
