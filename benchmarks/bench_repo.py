"""A repository of M entries for the commit and merge benchmarks, built the way an import
writes one (ranges straight through the committed writer: no staging, no commit loop) and,
for large M, kept on disk between runs.

Entries: `dir%04d/file%04d` (1,000 files per directory, the layout the git side uses too).
The built ranges and metarange of a size are cached under `.bench-cache/` (gitignored),
keyed by the storage format version, the chunking parameters and ENTRY_SHAPE; a run links
(hard links: files are immutable and every writer puts if absent, so nothing is ever
modified in place) the cached files into a fresh namespace of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from quarry import FORMAT_VERSION
from quarry.blob import LocalBlobStore
from quarry.blob.layout import METARANGES_PREFIX, RANGES_PREFIX
from quarry.committed import CommittedManager
from quarry.committed.processes import ProcessSpanWorkers
from quarry.committed.spans import FanOut
from quarry.committed.writer import DEFAULT_MAX_RANGE_BYTES, DEFAULT_TARGET_RANGE_ENTRIES
from quarry.graveler.graveler import CommitRecord, Graveler, make_commit
from quarry.graveler.model import Entry
from quarry.kv.memory import MemoryStore

FILES_PER_DIR = 1000
# Bump when entry() changes: cached repositories of another shape are not reused.
ENTRY_SHAPE = "commit-bench-1"
CACHE_DIR = Path(
    os.environ.get("BENCH_CACHE_DIR", Path(__file__).resolve().parent.parent / ".bench-cache")
)
# Sizes at or above this are cached on disk (smaller ones build faster than they copy).
CACHE_FROM = int(os.environ.get("BENCH_CACHE_FROM", "1000000"))
# A range-writer with worker processes fans out applies of at least this many changes
# (QUARRY_RANGE_WRITER_FAN_OUT_MIN_CHANGES, as the benches run it).
FAN_OUT_MIN_CHANGES = int(os.environ.get("BENCH_FAN_OUT_MIN_CHANGES", "500"))


def path_of(i: int) -> str:
    return f"dir{i // FILES_PER_DIR:04d}/file{i % FILES_PER_DIR:04d}"


def entry(path: str, version: int | str) -> Entry:
    size = 100 + version if isinstance(version, int) else 100
    return Entry(path, f"s3://lake/{path}@{version}", size, f"sum-{path}-{version}")


def _cache_key(m: int) -> str:
    return (
        f"m{m}-format{FORMAT_VERSION}-t{DEFAULT_TARGET_RANGE_ENTRIES}-"
        f"b{DEFAULT_MAX_RANGE_BYTES}-{ENTRY_SHAPE}"
    )


def _build(namespace: str, m: int) -> str:
    committed = CommittedManager(lambda ns: LocalBlobStore(ns), None)
    try:
        result = committed.write_metarange(namespace, (entry(path_of(i), 0) for i in range(m)))
    finally:
        committed.close()
    return result.metarange_id


def cached_base(m: int) -> tuple[Path, str, float]:
    """The directory holding M entries' ranges and metarange, its metarange id, and how
    long building it took now (0.0 when it came from the cache)."""
    root = CACHE_DIR / _cache_key(m)
    done = root / "metarange.json"
    if done.exists():
        return root / "lake", json.loads(done.read_text())["metarange_id"], 0.0
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="building-", dir=CACHE_DIR))
    start = time.perf_counter()
    metarange_id = _build(str(staging / "lake"), m)
    elapsed = time.perf_counter() - start
    (staging / "metarange.json").write_text(json.dumps({"metarange_id": metarange_id, "m": m}))
    shutil.rmtree(root, ignore_errors=True)
    os.replace(staging, root)
    return root / "lake", metarange_id, elapsed


def link_tree(source: Path, target: Path, prefix: str) -> None:
    src_dir = source / prefix
    dst_dir = target / prefix
    dst_dir.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(src_dir):
        try:
            os.link(src_dir / name, dst_dir / name)
        except FileExistsError:
            pass
        except OSError:
            shutil.copyfile(src_dir / name, dst_dir / name)


def local_manager() -> CommittedManager:
    """The benches' CommittedManager: local directories, no disk cache (module level, so a
    span worker process can build its own)."""
    return CommittedManager(LocalBlobStore, None)


class FannedOutWriter:
    """The manager as the range writer, with large applies fanned out to span worker
    processes, as a range-writer with QUARRY_RANGE_WRITER_PROCESSES does."""

    def __init__(self, manager: CommittedManager, processes: int, min_changes: int) -> None:
        self.manager = manager
        self.workers = ProcessSpanWorkers(processes, local_manager, add_stats=manager.add_stats)
        self.fan_out = FanOut(manager, self.workers.peers(), min_changes=min_changes)
        self.workers.wait_ready()

    def apply_changes(self, namespace, base_metarange_id, changes):
        return self.fan_out.apply_changes(namespace, base_metarange_id, changes)

    def __getattr__(self, name: str):  # everything else is the manager's
        return getattr(self.manager, name)

    def close(self) -> None:
        self.fan_out.close()
        self.workers.close()


class BenchRepo:
    """A Graveler over a memory KV and a local namespace whose `main` holds M entries.
    `processes`: span worker processes next to this one (0: the apply runs here whole)."""

    def __init__(self, root: Path, m: int, name: str = "bench", processes: int = 0):
        self.namespace = str(root / "lake")
        self.committed = local_manager()
        self.writer = (
            FannedOutWriter(self.committed, processes, FAN_OUT_MIN_CHANGES) if processes else None
        )
        self.g = Graveler(MemoryStore(), self.committed, self.writer or self.committed)
        self.g.create_repository(name, self.namespace)
        self.name = name
        start = time.perf_counter()
        if m >= CACHE_FROM:
            lake, metarange_id, built = cached_base(m)
            for prefix in (RANGES_PREFIX, METARANGES_PREFIX):
                link_tree(lake, Path(self.namespace), prefix.rstrip("/"))
            self.build_seconds = built
        else:
            metarange_id = self.committed.write_metarange(
                self.namespace, (entry(path_of(i), 0) for i in range(m))
            ).metarange_id
            self.build_seconds = time.perf_counter() - start
        self.setup_seconds = time.perf_counter() - start
        repo = self.g.refs.get_repository(name)
        head = self.g.get_commit(name, "main")
        commit = make_commit(
            CommitRecord([head.id], metarange_id, "import", "bench", {}, head.generation + 1)
        )
        self.g.refs.insert_commit(repo, commit)
        self.g.reset_branch(name, "main", commit.id, force=True)
        self.base_metarange_id = metarange_id

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.committed.close()


def scratch_dir(prefix: str) -> Path:
    """A temporary directory on the cache's filesystem (so hard links work)."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=CACHE_DIR))


def settle() -> None:
    """Write back every dirty page before a timed operation (untimed): a journal commit
    (Quarry's fsyncs) otherwise also writes what another process left dirty — git's 70 MB
    index at 1M entries, in the same run — and each side should pay only for its own work."""
    os.sync()


def verdict(value: float, target: float) -> str:
    return "MET" if value <= target else "MISSED"
