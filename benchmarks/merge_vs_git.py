"""Merge of two branches with 1,000 scattered changes each over a 1,000,000-entry base (no
conflicts), against `git merge-tree --write-tree` on the same trees, in the same run; the
cost of a merge retry that reuses the merged metarange (the seed) over the first try; and
flatness: a merge of two branches with 1,000 localized changes each (one directory each) at
1M and at 10M entries.

Quarry: the core in process with the real CommittedManager (Parquet ranges in a local
directory, fsynced before the metarange naming them); the base is written straight through
the committed writer (bench_repo, cached on disk). git: real blobs and trees (1,000 files
per directory), commits for base, A, B; git's defaults, pinned (GIT_CONFIG_NOSYSTEM, an
empty HOME): merge-tree writes loose tree objects, not fsynced (core.fsync's default).
Before each timed operation, on both sides, every dirty page is written back (os.sync,
untimed: bench_repo.settle), so neither pays for the other's writeback.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from bench_repo import FILES_PER_DIR, BenchRepo, entry, path_of, scratch_dir, settle, verdict

from quarry.graveler.model import MergeStrategy

M = int(os.environ.get("BENCH_MERGE_ENTRIES", "1000000"))
FLAT_SIZES = [
    int(x) for x in os.environ.get("BENCH_MERGE_FLAT_SIZES", "1000000,10000000").split(",") if x
]
CHANGES = 1000
ROUNDS = int(os.environ.get("BENCH_MERGE_ROUNDS", "3"))
# Localized merges take milliseconds: a median of 3 moves with one scheduling hiccup.
SMALL_ROUNDS = int(os.environ.get("BENCH_MERGE_SMALL_ROUNDS", "9"))


class Git:
    def __init__(self, root: Path):
        self.dir = root / "git"
        self.dir.mkdir()
        self.env = dict(
            os.environ,
            GIT_DIR=str(self.dir / ".git"),
            GIT_INDEX_FILE=str(self.dir / "index"),
            GIT_AUTHOR_NAME="b",
            GIT_AUTHOR_EMAIL="b@x",
            GIT_COMMITTER_NAME="b",
            GIT_COMMITTER_EMAIL="b@x",
            GIT_CONFIG_NOSYSTEM="1",
            HOME=str(root / "git-home"),
            XDG_CONFIG_HOME=str(root / "git-home"),
        )
        (root / "git-home").mkdir()
        self.git("init", "-q", str(self.dir))
        self.blobs = {}

    def git(self, *args, stdin: bytes | None = None) -> str:
        return (
            subprocess.run(
                ["git", *args],
                input=stdin,
                check=True,
                env=self.env,
                cwd=self.dir,
                capture_output=True,
            )
            .stdout.decode()
            .strip()
        )

    def blob(self, content: str) -> str:
        if content not in self.blobs:
            self.blobs[content] = self.git("hash-object", "-w", "--stdin", stdin=content.encode())
        return self.blobs[content]

    def commit(self, lines: str, parent: str | None) -> str:
        self.git("update-index", "--add", "--index-info", stdin=lines.encode())
        tree = self.git("write-tree")
        args = ["commit-tree", tree, "-m", "c"] + (["-p", parent] if parent else [])
        return self.git(*args)

    def reset_index(self, commit: str) -> None:
        self.git("read-tree", commit)


def branch(repo: BenchRepo, name: str, start: str, indexes: list[int]) -> str:
    """A branch from `start` with `indexes` changed (version = the branch name); its
    metarange id."""
    g = repo.g
    g.create_branch("bench", name, start)
    g.put_objects("bench", name, [entry(path_of(i), name) for i in sorted(indexes)])
    g.commit("bench", name, name)
    return g.get_commit("bench", name).metarange_id


def scattered(root: Path, rng: random.Random) -> None:
    repo = BenchRepo(root, M)
    g, committed, namespace = repo.g, repo.committed, repo.namespace
    git = Git(root)
    base_blob = git.blob("base")
    base_commit = git.commit("".join(f"100644 {base_blob}\t{path_of(i)}\n" for i in range(M)), None)
    main_head = g.get_branch("bench", "main").commit_id
    base_mr = repo.base_metarange_id
    q_times, g_times, retry_ratio, retry_ranges = [], [], [], []
    for r in range(ROUNDS):
        picks = rng.sample(range(M), 2 * CHANGES)
        side_a, side_b = picks[:CHANGES], picks[CHANGES:]
        a, b = f"a{r}", f"b{r}"
        source_mr = branch(repo, a, main_head, side_a)
        dest_before = branch(repo, b, main_head, side_b)
        settle()
        start = time.perf_counter()
        first = committed.merge_metaranges(
            namespace, base_mr, source_mr, dest_before, MergeStrategy.DEFAULT
        )
        q_times.append(time.perf_counter() - start)
        # The retry: the destination moved (one more commit) before the swap.
        g.put_objects("bench", b, [entry(path_of(rng.randrange(M)), f"race{r}")])
        g.commit("bench", b, "race")
        dest_after = g.get_commit("bench", b).metarange_id
        settle()
        start = time.perf_counter()
        retry = committed.merge_metaranges(
            namespace, dest_before, first.metarange_id, dest_after, MergeStrategy.DEFAULT
        )
        retry_time = time.perf_counter() - start
        retry_ratio.append(retry_time / q_times[-1])
        retry_ranges.append((retry.ranges_written, first.ranges_written))

        # git: the same trees as commits, then merge-tree.
        git.reset_index(base_commit)
        a_commit = git.commit(
            "".join(f"100644 {git.blob(a)}\t{path_of(i)}\n" for i in side_a), base_commit
        )
        git.reset_index(base_commit)
        b_commit = git.commit(
            "".join(f"100644 {git.blob(b)}\t{path_of(i)}\n" for i in side_b), base_commit
        )
        settle()
        start = time.perf_counter()
        git.git("merge-tree", "--write-tree", a_commit, b_commit)
        g_times.append(time.perf_counter() - start)
    committed.close()

    q, gt = statistics.median(q_times), statistics.median(g_times)
    retry = statistics.median(retry_ratio)
    print(f"  merge of 2 x {CHANGES:,} scattered changes over {M:,} entries (median of {ROUNDS})")
    print(f"  quarry merge_metaranges   {q * 1e3:8.1f} ms")
    print(f"  git merge-tree            {gt * 1e3:8.1f} ms")
    print(f"  target: quarry / git <= 1.0: {q / gt:.2f}  {verdict(q / gt, 1.0)}")
    print(
        f"  target: retry / first attempt <= 0.3: {retry:.2f}  {verdict(retry, 0.3)}; "
        "ranges written retry/first: " + ", ".join(f"{w}/{f}" for w, f in retry_ranges)
    )


def localized(m: int, rng: random.Random) -> float:
    """Median time of merging two branches with 1,000 changes in one directory each."""
    root = scratch_dir(f"merge-flat-{m}-")
    repo = BenchRepo(root, m)
    try:
        main_head = repo.g.get_branch("bench", "main").commit_id
        times = []
        for r in range(SMALL_ROUNDS):
            dir_a, dir_b = rng.sample(range(m // FILES_PER_DIR), 2)
            source = branch(
                repo, f"la{r}", main_head, [dir_a * FILES_PER_DIR + f for f in range(CHANGES)]
            )
            dest = branch(
                repo, f"lb{r}", main_head, [dir_b * FILES_PER_DIR + f for f in range(CHANGES)]
            )
            settle()
            start = time.perf_counter()
            repo.committed.merge_metaranges(
                repo.namespace, repo.base_metarange_id, source, dest, MergeStrategy.DEFAULT
            )
            times.append(time.perf_counter() - start)
        ready = f"built in {repo.build_seconds:.1f}s" if repo.build_seconds else "from .bench-cache"
        print(
            f"  M={m:>10,}: localized merge {statistics.median(times) * 1e3:8.1f} ms "
            f"(median of {SMALL_ROUNDS}; {ready})"
        )
        return statistics.median(times)
    finally:
        repo.committed.close()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    rng = random.Random(11)
    version = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.strip()
    print(f"  {version}, default settings (see the module docstring)", flush=True)
    root = scratch_dir("merge-")
    try:
        scattered(root, rng)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    flat = {m: localized(m, rng) for m in FLAT_SIZES}
    if 1_000_000 in flat and 10_000_000 in flat:
        ratio = flat[10_000_000] / flat[1_000_000]
        print(f"  target: localized merge 10M / 1M <= 1.2: {ratio:.2f}  {verdict(ratio, 1.2)}")


if __name__ == "__main__":
    main()
