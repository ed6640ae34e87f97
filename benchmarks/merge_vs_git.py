"""Merge of two branches with 1,000 scattered changes each over a 1,000,000-entry base (no
conflicts), against `git merge-tree --write-tree` on the same trees, in the same run; and
the cost of a merge retry that reuses the merged metarange (the seed) over the first try.

Quarry: the core in process with the real CommittedManager (Parquet ranges in a local
directory). git: real blobs and trees (1,000 files per directory), commits for base, A, B.
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
from quarry.graveler.model import Entry, MergeStrategy
from quarry.kv.memory import MemoryStore

M = int(os.environ.get("BENCH_MERGE_ENTRIES", "1000000"))
CHANGES = 1000
ROUNDS = int(os.environ.get("BENCH_MERGE_ROUNDS", "3"))
FILES_PER_DIR = 1000


def path_of(i: int) -> str:
    return f"dir{i // FILES_PER_DIR:04d}/file{i % FILES_PER_DIR:04d}"


def entry(i: int, version: str) -> Entry:
    return Entry(path_of(i), f"s3://lake/{i}@{version}", 100, f"sum-{i}-{version}")


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
        )
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


def main() -> None:
    rng = random.Random(11)
    root = Path(tempfile.mkdtemp(prefix="quarry-merge-"))
    try:
        namespace = str(root / "lake")
        committed = CommittedManager(lambda ns: LocalBlobStore(ns), None)
        g = Graveler(MemoryStore(), committed, committed)
        g.create_repository("bench", namespace)
        repo = g.refs.get_repository("bench")
        base = committed.write_metarange(namespace, (entry(i, "base") for i in range(M)))
        head = g.get_commit("bench", "main")
        commit = make_commit(CommitRecord([head.id], base.metarange_id, "import", "b", {}, 2))
        g.refs.insert_commit(repo, commit)
        g.reset_branch("bench", "main", commit.id, force=True)

        git = Git(root)
        base_blob = git.blob("base")
        base_commit = git.commit(
            "".join(f"100644 {base_blob}\t{path_of(i)}\n" for i in range(M)), None
        )

        q_times, g_times, retry_ratio, retry_ranges = [], [], [], []
        for r in range(ROUNDS):
            picks = rng.sample(range(M), 2 * CHANGES)
            side_a, side_b = picks[:CHANGES], picks[CHANGES:]
            a, b = f"a{r}", f"b{r}"
            main_head = g.get_branch("bench", "main").commit_id
            for name, side in ((a, side_a), (b, side_b)):
                g.create_branch("bench", name, main_head)
                g.put_objects("bench", name, [entry(i, name) for i in side])
                g.commit("bench", name, name)
            dest_before = g.get_commit("bench", b)
            source = g.get_commit("bench", a)
            base_mr = g.get_commit("bench", main_head).metarange_id
            start = time.perf_counter()
            first = committed.merge_metaranges(
                namespace,
                base_mr,
                source.metarange_id,
                dest_before.metarange_id,
                MergeStrategy.DEFAULT,
            )
            q_times.append(time.perf_counter() - start)
            # The retry: the destination moved (one more commit) before the swap.
            g.put_objects("bench", b, [entry(rng.randrange(M), f"race{r}")])
            g.commit("bench", b, "race")
            dest_after = g.get_commit("bench", b)
            start = time.perf_counter()
            retry = committed.merge_metaranges(
                namespace,
                dest_before.metarange_id,
                first.metarange_id,
                dest_after.metarange_id,
                MergeStrategy.DEFAULT,
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
            start = time.perf_counter()
            git.git("merge-tree", "--write-tree", a_commit, b_commit)
            g_times.append(time.perf_counter() - start)

        q, gt = statistics.median(q_times), statistics.median(g_times)
        print(
            f"  merge of 2 x {CHANGES:,} scattered changes over {M:,} entries (median of {ROUNDS})"
        )
        print(f"  quarry merge_metaranges   {q * 1e3:8.1f} ms")
        print(f"  git merge-tree            {gt * 1e3:8.1f} ms")
        print(f"  quarry / git              {q / gt:8.2f}   (target < 1.0)")
        print(
            f"  retry / first attempt     {statistics.median(retry_ratio):8.2f} of the time "
            f"(target <= 0.3); ranges written retry/first: "
            + ", ".join(f"{w}/{f}" for w, f in retry_ranges)
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
