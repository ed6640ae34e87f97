"""A dict-backed committed store for unit speed (the real one is quarry.committed, tested
on its own and under the core in tests/integration). Same contract: content-addressed
metaranges, sorted entries, seekable iterators, diffs by identity; input the real writer
refuses (unsorted or duplicate paths, unknown metarange ids) is refused here too. The
committed-storage contract suite (tests/integration/committed/test_committed_contract.py)
runs against this fake and the real implementations alike."""

from __future__ import annotations

import bisect
import hashlib
import re

import pyarrow as pa

from quarry.blob import LocalBlobStore, parse_storage_namespace
from quarry.blob.ownership import claim_namespace
from quarry.committed.errors import (
    DuplicatePath,
    InvalidMetaRangeId,
    MetaRangeNotFound,
    UnsortedInput,
)
from quarry.graveler.model import ApplyResult, Change, ChangeType, DiffSummary, Entry
from support.merge_model import naive_merge


class _Iterator:
    def __init__(self, entries: list[Entry], start: str, prefix: str):
        self._entries = entries
        self._paths = [e.path for e in entries]
        self._prefix = prefix
        self._position = bisect.bisect_left(self._paths, max(start, prefix))

    def __iter__(self):
        return self

    def __next__(self) -> Entry:
        if self._position >= len(self._entries):
            raise StopIteration
        entry = self._entries[self._position]
        if not entry.path.startswith(self._prefix):
            raise StopIteration
        self._position += 1
        return entry

    def seek_ge(self, path: str) -> None:
        self._position = bisect.bisect_left(self._paths, max(path, self._prefix))

    def close(self) -> None:
        pass


_ID = re.compile(r"^[0-9a-f]{64}$")


def _check_sorted(what: str, paths):
    """Yields the paths, refusing what the real writer refuses (quarry.committed.writer)."""
    last = None
    for path in paths:
        if last is not None and not path > last:
            if path == last:
                raise DuplicatePath(f"{what}: duplicate path {path!r}")
            raise UnsortedInput(f"{what} must be sorted by path: {path!r} after {last!r}")
        last = path
        yield path


def _put_or_delete(item) -> tuple[str, Entry | None]:
    if isinstance(item, Change):
        return item.path, None if item.type == ChangeType.REMOVED else item.entry
    return item


class FakeCommitted:
    def __init__(self):
        self.metaranges: dict[str, list[Entry]] = {"": []}  # "" = the empty metarange
        self.applies = 0

    def _store(self, entries: list[Entry]) -> str:
        h = hashlib.sha256()
        for e in entries:
            # Like the real ids (quarry.committed.format.range_id_of): mtimes count too.
            h.update(
                e.path.encode()
                + b"\0"
                + e.identity
                + e.physical_address.encode()
                + b"\0"
                + str(e.mtime_us).encode()
                + b"\0"
            )
        metarange_id = h.hexdigest()
        self.metaranges[metarange_id] = entries
        return metarange_id

    def claim_namespace(self, namespace, marker, replace=None):
        # The real claim (marker written into the real directory): ownership is not faked.
        return claim_namespace(
            LocalBlobStore(parse_storage_namespace(namespace)[1]), marker, replace
        )

    def _entries(self, metarange_id: str) -> list[Entry]:
        found = self.metaranges.get(metarange_id or "")
        if found is None:
            if not _ID.match(metarange_id):
                raise InvalidMetaRangeId(f"invalid metarange id {metarange_id!r}")
            raise MetaRangeNotFound(f"metarange {metarange_id} not found")
        return found

    def write_metarange(self, namespace, entries) -> ApplyResult:
        entries = list(entries)
        list(_check_sorted("entries", (e.path for e in entries)))
        return ApplyResult(self._store(entries), DiffSummary(added=len(entries)))

    def write_columns(self, namespace, batches) -> ApplyResult:
        """write_metarange of entries in columns (quarry.committed.columns)."""

        def entries():
            for batch in batches:
                mtimes = batch.column("mtime").cast(pa.int64()).to_pylist()
                for row, mtime_us in zip(batch.to_pylist(), mtimes, strict=True):
                    yield Entry(
                        row["path"],
                        row["physical_address"],
                        row["size_bytes"],
                        row["checksum"],
                        mtime_us,
                        row["content_type"],
                        row["metadata"],
                    )

        return self.write_metarange(namespace, entries())

    def apply_changes(self, namespace, base_metarange_id, changes) -> ApplyResult:
        self.applies += 1
        current = {e.path: e for e in self._entries(base_metarange_id)}
        changes = [_put_or_delete(item) for item in changes]
        list(_check_sorted("changes", (path for path, _entry in changes)))  # before any effect
        summary = DiffSummary()
        for path, entry in changes:
            before = current.get(path)
            if entry is None:
                if before is not None:
                    del current[path]
                    summary.removed += 1
            elif before is None:
                current[path] = entry
                summary.added += 1
            elif before.identity != entry.identity:
                current[path] = entry
                summary.changed += 1
        return ApplyResult(self._store(sorted(current.values(), key=lambda e: e.path)), summary)

    def get_entry(self, namespace, metarange_id, path):
        entries = self._entries(metarange_id)
        i = bisect.bisect_left([e.path for e in entries], path)
        return entries[i] if i < len(entries) and entries[i].path == path else None

    def iterate(self, namespace, metarange_id, start="", prefix=""):
        return _Iterator(self._entries(metarange_id), start, prefix)

    def diff(self, namespace, left_id, right_id, prefix="", start=""):
        # Both metaranges are resolved before the first change, as the real diff does.
        left = {e.path: e for e in self._entries(left_id)}
        right = {e.path: e for e in self._entries(right_id)}
        return self._changes(left, right, prefix, start)

    @staticmethod
    def _changes(left, right, prefix, start):
        for path in sorted(set(left) | set(right)):
            if not path.startswith(prefix) or path < start:
                continue
            a, b = left.get(path), right.get(path)
            if a is None:
                yield Change(ChangeType.ADDED, path, b)
            elif b is None:
                yield Change(ChangeType.REMOVED, path)
            elif a.identity != b.identity:
                yield Change(ChangeType.CHANGED, path, b)


def _merge_metaranges(
    self,
    namespace,
    base_id,
    source_id,
    destination_id,
    strategy=0,
    max_conflicts=100,
    dry_run=False,
):
    from quarry import errors
    from quarry.graveler.model import MergeResult, MergeStrategy

    if max_conflicts is None or max_conflicts < 0:
        raise errors.InvalidArgument("max_conflicts must be >= 0")  # as the real merge

    def as_dict(mr):
        return {e.path: e for e in self._entries(mr)}

    dest = as_dict(destination_id)
    merged, summary, conflicts, more = naive_merge(
        as_dict(base_id), as_dict(source_id), dest, MergeStrategy(strategy), max_conflicts
    )
    if conflicts or more or dry_run:
        return MergeResult("", summary, tuple(conflicts), more)
    new_id = self._store(sorted(merged.values(), key=lambda e: e.path))
    self.merges += 1
    return MergeResult(new_id, summary, ranges_written=1)


FakeCommitted.merge_metaranges = _merge_metaranges
FakeCommitted.merges = 0
