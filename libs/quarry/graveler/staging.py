"""StagingManager: uncommitted entries, one KV partition per staging token, or N for a token
with N shards (docs/architecture.md §10 "Sharded staging").

A staging partition maps object path (UTF-8 bytes) → StagedValue (an entry or a tombstone).
A token with N > 1 shards (`<base>.s<N>`, the repository's `staging_shards` when the token
was installed) spreads its paths over N partitions by a stable hash of the path
(quarry.kv.partitions.staging_shard): a point read or write of a path touches exactly one
partition, a scan is an N-way merge of the shards (they hold disjoint paths), and dropping
a token drops all its shards. Nothing else in the domain knows a token has shards.
Tokens are never reused: when a commit, reset or branch deletion drops a token, it is
queued in the `cleanup` partition and a background Dropper deletes its items after a grace
period, so staging partitions do not accumulate.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from quarry.graveler import layout, records
from quarry.graveler.iterators import DisjointMerge
from quarry.graveler.layout import (
    BRANCHES_PREFIX,
    CLEANUP_PARTITION,
    PARKED_PREFIX,
    staged_partition,
    staging_partitions,
)
from quarry.graveler.model import Entry
from quarry.graveler.refs import Repository
from quarry.kv import store as kv
from quarry.kv.partitions import REPO, partition_class, repo_partition, sharded_token
from quarry.runtime.periodic import PeriodicWorker

log = logging.getLogger(__name__)

TOMBSTONE = None  # a staged deletion, as seen by domain code
# A token queued ahead of a branch change (queue_retiring_tokens) that the branch still
# references this long after is not being retired: its cleanup record is forgotten (a later
# retirement queues it again).
RETIRING_EXPIRY_SECONDS = 3600
# A queued partition still in use this long after it was queued is looked at again only
# every KEPT_RECHECK_SECONDS (per process): thousands of them (a deletion of a large
# repository that died after queuing its branches' tokens) cost a KV read each per pass and
# held up the dropping of due ones (tester hAO). A change in progress is looked at on every
# pass until then. Keeping one longer only delays its drop.
KEPT_BACKOFF_AFTER_SECONDS = 60.0
KEPT_RECHECK_SECONDS = 30.0
_KEPT_REMEMBERED = 100_000
SCAN_BATCH = 1000


def new_token(shards: int = 1) -> str:
    """A fresh, never used staging token with `shards` partitions (1: today's layout)."""
    return sharded_token(uuid.uuid4().hex, shards)


def shard_scan_batch(shards: int) -> int:
    """Items per KV scan page of one shard of an N-shard token: a page of a listing takes
    about 1/N of its items from each shard, so each shard fetches a little more than its
    share (never N full pages for one page of results)."""
    if shards <= 1:
        return SCAN_BATCH
    return max(100, -(-SCAN_BATCH * 5 // (4 * shards)))


# The codecs live in the layout module (kept here under their old names).
encode_value = layout.encode_staged
decode_value = layout.decode_staged
entry_of = layout.staged_entry


class StagedIterator:
    """(path, Entry | None) of one staging partition in path order; seek_ge supported.

    `first_batch`: items of the first KV scan page (a shard's share of a listing page);
    once they are consumed the scan goes on with full SCAN_BATCH pages, so a long scan (a
    commit's) pays no more pages than an unsharded one."""

    def __init__(
        self,
        store: kv.Store,
        partition: bytes,
        start: str,
        end: bytes | None,
        first_batch: int = SCAN_BATCH,
    ):
        self._store = store
        self._partition = partition
        self._start = start.encode()
        self._end = end
        self._scan = store.scan(partition, self._start, end, batch_size=first_batch)
        self._scan_start = self._start  # where the current KV scan began
        # Items left before switching to full pages; None once on full pages.
        self._until_full: int | None = first_batch if first_batch < SCAN_BATCH else None
        self._last_key: bytes | None = None

    def __iter__(self) -> StagedIterator:
        return self

    def __next__(self) -> tuple[str, Entry | None]:
        while True:
            if self._until_full == 0 and self._last_key is not None:
                self._reopen(self._last_key + b"\x00")
            item = next(self._scan)
            self._last_key = item.key
            if self._until_full is not None:
                self._until_full -= 1
            value = layout.staged_or_skip(self._partition, item.key, item.value)
            if value is not None:  # None: corrupt, skipped by a listing (records.listing)
                path = item.key.decode()
                return path, entry_of(path, value)

    def seek_ge(self, path: str) -> None:
        target = max(path.encode(), self._start)  # never before the scan's start
        if target < self._scan_start:
            self._reopen(target)  # behind a scan reopened further on
        else:
            self._scan.seek_ge(target)

    def _reopen(self, start: bytes) -> None:
        self._scan.close()
        self._scan = self._store.scan(self._partition, start, self._end, batch_size=SCAN_BATCH)
        self._scan_start = start
        self._until_full = None

    def close(self) -> None:
        self._scan.close()


class StagingManager:
    def __init__(self, store: kv.Store, clock: Callable[[], float] = time.time):
        """`clock`: wall-clock seconds, for the cleanup queue's timestamps and the dropper's
        grace period (tests pass one they move forward instead of waiting)."""
        self.kv = store
        self._clock = clock
        # Queued partitions found in use: when to look at each again (KEPT_RECHECK_SECONDS).
        self._kept_until: dict[bytes, float] = {}

    def get(self, token: str, path: str) -> tuple[bool, Entry | None, bytes | None]:
        """(found, entry-or-tombstone, predicate)."""
        # One lookup whatever the token's shard count: the path names its shard.
        try:
            result = self.kv.get(staged_partition(token, path), layout.staged_key(path))
        except kv.KeyNotFound:
            return False, None, None
        return True, decode_value(token, path, result.value), result.predicate

    def get_many(
        self, token: str, paths: Sequence[str], chunk: int = 1000
    ) -> dict[str, Entry | None]:
        """The paths of `paths` the token holds (an entry, or None for a tombstone), read
        in KV batches of `chunk` keys: one round trip per chunk, not one per path."""
        found: dict[str, Entry | None] = {}
        for start in range(0, len(paths), chunk):
            part = paths[start : start + chunk]
            results = self.kv.batch_get(
                [(staged_partition(token, path), layout.staged_key(path)) for path in part]
            )
            for path, result in zip(part, results, strict=True):
                if result is not None:
                    found[path] = decode_value(token, path, result.value)
        return found

    def get_with(
        self, token: str, path: str, record: tuple[bytes, bytes]
    ) -> tuple[kv.GetResult | None, bool, Entry | None]:
        """get(token, path) and another record (partition, key) in one KV batch:
        (the record or None, found, entry-or-tombstone). The two reads are not ordered."""
        held, staged = self.kv.batch_get(
            [record, (staged_partition(token, path), layout.staged_key(path))]
        )
        if staged is None:
            return held, False, None
        return held, True, decode_value(token, path, staged.value)

    def set_many(self, token: str, items: Sequence[tuple[str, Entry | None]]) -> None:
        """One KV write (a batch across the token's shards when there are several)."""
        if len(items) == 1:
            path, entry = items[0]
            self.kv.set(staged_partition(token, path), layout.staged_key(path), encode_value(entry))
            return
        self.kv.batch_set(self._kv_items(token, items))

    def set_many_then_get(
        self,
        token: str,
        items: Sequence[tuple[str, Entry | None]],
        then_get: Sequence[tuple[bytes, bytes]],
    ) -> list[kv.GetResult | None]:
        """set_many's one KV write, then a batch_get of `then_get` that sees it (the writer's
        validation read), in one KV round trip (Store.set_then_get)."""
        return self.kv.set_then_get(self._kv_items(token, items), then_get)

    @staticmethod
    def _kv_items(
        token: str, items: Sequence[tuple[str, Entry | None]]
    ) -> list[tuple[bytes, bytes, bytes]]:
        return [
            (staged_partition(token, path), layout.staged_key(path), encode_value(entry))
            for path, entry in items
        ]

    def set_if(self, token: str, path: str, entry: Entry | None, predicate: kv.Predicate) -> None:
        self.kv.set_if(
            staged_partition(token, path), layout.staged_key(path), encode_value(entry), predicate
        )

    def scan(
        self, token: str, start: str = "", end: bytes | None = None
    ) -> StagedIterator | DisjointMerge:
        """(path, Entry | None) of the token in path order: its one partition's scan, or the
        merge of its shards' scans (disjoint paths), each paged by shard_scan_batch."""
        partitions = staging_partitions(token)
        if len(partitions) == 1:
            return StagedIterator(self.kv, partitions[0], start, end)
        batch = shard_scan_batch(len(partitions))
        return DisjointMerge([StagedIterator(self.kv, p, start, end, batch) for p in partitions])

    # ---- dropping tokens -------------------------------------------------------------------

    def queue_drop(self, partitions: Sequence[bytes]) -> None:
        """Queue whole partitions (staging tokens, dead repository instances) for deletion."""
        if not partitions:
            return
        now = int(self._clock())
        self.kv.batch_set(
            [
                (CLEANUP_PARTITION, partition, layout.encode_cleanup(partition, now))
                for partition in partitions
            ]
        )

    def queue_retiring_tokens(
        self, tokens: Sequence[str], repository_partition: bytes, branch: str
    ) -> None:
        """Queue every partition of `tokens` that a change of `branch`'s record is about to
        retire, BEFORE the change is made (a commit's or compaction's swap, a merge, a
        discard, a reset, a branch deletion): the one way a retired token is queued.

        Safety rule: the dropper deletes such a partition only once the branch no longer
        references its token (drop_queued), so queuing ahead never drops a token that the
        change, failed or not made, left in use; and a process that dies right after the
        change (or loses the KV store then) leaves no orphan token behind -- the queue
        written after the change left its items in the KV store for good. May raise: the
        change has not been made."""
        now = int(self._clock())
        queued = [
            (
                CLEANUP_PARTITION,
                partition,
                layout.encode_cleanup(partition, now, repository_partition, branch, token),
            )
            for token in tokens
            if token
            for partition in staging_partitions(token)
        ]
        if queued:
            self.kv.batch_set(queued)

    def drop_queued(self, grace_seconds: float, limit: int = 100) -> int:
        """Delete the items of queued partitions older than the grace period. Returns the
        number of partitions dropped. Safe to run in several processes at once (deletes are
        idempotent).

        Never deletes a partition whose cleanup record cannot be read, or whose record
        names another partition than its key, or that is not a staging or repo partition:
        such an item is parked (see park_cleanup_item) and the pass carries on."""
        dropped = 0
        now = self._clock()
        iterator = self.kv.scan(CLEANUP_PARTITION, batch_size=limit)
        try:
            due = []
            for item in iterator:
                if item.key.startswith(PARKED_PREFIX):
                    continue  # parked earlier: kept for a human, never dropped
                try:
                    record = layout.decode_cleanup(item.key, item.value)
                except records.CorruptRecord as exc:
                    self.park_cleanup_item(item.key, item.value, exc)
                    continue
                if now - record.queued_at < grace_seconds:
                    continue
                if now < self._kept_until.get(item.key, 0.0):
                    continue  # found in use a moment ago
                if (record.branch and self._still_referenced(record)) or self._instance_live(
                    item.key
                ):
                    # Queued ahead of a branch change that has not retired the token, or of
                    # a repository deletion that has not happened (yet, or ever): kept;
                    # forgotten once the change can no longer be coming.
                    if now - record.queued_at >= RETIRING_EXPIRY_SECONDS:
                        self._forget_expired(item)
                    elif now - record.queued_at >= KEPT_BACKOFF_AFTER_SECONDS:
                        self._keep_for_a_while(item.key, now)
                    continue
                self._kept_until.pop(item.key, None)
                due.append(item.key)
                if len(due) >= limit:
                    break
        finally:
            iterator.close()
        for partition in due:
            if partition_class(partition) == REPO:
                self._drop_branch_tokens(partition)
            self._delete_partition(partition)
            self.kv.delete(CLEANUP_PARTITION, partition)
            dropped += 1
        return dropped

    def _keep_for_a_while(self, partition: bytes, now: float) -> None:
        if len(self._kept_until) >= _KEPT_REMEMBERED:
            self._kept_until.clear()  # bounded: forgetting only means looking again sooner
        self._kept_until[partition] = now + KEPT_RECHECK_SECONDS

    def queue_dead_instances(self) -> int:
        """Queue the partition of each repository instance recorded as deleted whose items
        are still there and that no cleanup record names: what a deletion leaves when its
        process dies after the repository record went and before the instance was queued
        (Repositories.delete_repository queues it only then). Never an instance a
        repository record names (_instance_live). Returns how many were queued."""
        start = layout.DELETED_INSTANCES_PREFIX
        found = []
        for item in self.kv.scan(layout.QUARRY_PARTITION, start, layout.prefix_end(start)):
            try:
                partition = repo_partition(item.value, item.key[len(start) :])
            except kv.UnknownPartitionClass:
                continue  # not a record this pass can act on: `quarry doctor` reads them
            found.append(partition)
        queued = 0
        for partition in found:
            if self._is_queued(partition) or self._instance_live(partition):
                continue
            if not kv.has_items(self.kv, partition):
                continue
            self.queue_drop([partition])
            queued += 1
        return queued

    def _is_queued(self, partition: bytes) -> bool:
        try:
            self.kv.get(CLEANUP_PARTITION, partition)
            return True
        except kv.KeyNotFound:
            return False

    def _instance_live(self, partition: bytes) -> bool:
        """Whether `partition` is a repository instance's that its repository record still
        names (a deletion queued ahead that has not happened): never dropped then. An
        unreadable record counts as yes: nothing is dropped on a guess."""
        if partition_class(partition) != REPO:
            return False
        _, name, instance_id = partition.split(b"/", 2)
        key = layout.repository_key(name.decode(errors="replace"))
        try:
            value = self.kv.get(layout.QUARRY_PARTITION, key).value
        except kv.KeyNotFound:
            return False
        try:
            return Repository.from_record(value, key).instance_id == instance_id.decode()
        except records.CorruptRecord:
            return True

    def _drop_branch_tokens(self, instance: bytes) -> None:
        """The staging partitions a dead instance's branches name, dropped with it: a seal
        between a deletion's listing of the branches and the deletion installed tokens no
        one queued."""
        for item in self.kv.scan(instance, BRANCHES_PREFIX, layout.prefix_end(BRANCHES_PREFIX)):
            try:
                branch = layout.decode_branch(
                    instance, layout.name_of(item.key, BRANCHES_PREFIX), item.value
                )
            except records.CorruptRecord:
                continue  # its tokens are unknown: `quarry doctor` names what is left
            for token in (branch.staging_token, *branch.sealed_tokens):
                if token:
                    for partition in staging_partitions(token):
                        self._delete_partition(partition)

    def _forget_expired(self, item: kv.KeyValue) -> None:
        """Delete an expired cleanup record, only if it is still the one read: a change
        about to retire the same token may have queued it afresh meanwhile (the same key),
        and that record must stay, or the token would never be dropped."""
        try:
            current = self.kv.get(CLEANUP_PARTITION, item.key)
        except kv.KeyNotFound:
            return
        if current.value != item.value:
            return
        with contextlib.suppress(kv.PredicateFailed):
            self.kv.delete_if(CLEANUP_PARTITION, item.key, kv.Equals(current.predicate))

    def _still_referenced(self, record: Any) -> bool:
        """Whether the branch a token was queued ahead for still references it (its record
        unreadable counts as yes: nothing is dropped on a guess)."""
        partition = record.repository_partition.encode()
        try:
            value = self.kv.get(partition, layout.branch_key(record.branch)).value
        except kv.KeyNotFound:
            return False  # the branch is gone: so is every reference to its tokens
        try:
            branch = layout.decode_branch(partition, record.branch, value)
        except records.CorruptRecord:
            return True
        return record.token in (branch.staging_token, *branch.sealed_tokens)

    def park_cleanup_item(self, key: bytes, value: bytes, why: records.CorruptRecord) -> bytes:
        """Move a corrupt cleanup item aside to `parked/<key>` in the cleanup partition, so
        the dropper stops tripping over it. Returns the parked key.

        Never loses it: the copy is written (set-if-absent) before the original is deleted;
        an existing parked copy with other bytes is never overwritten (the new one gets a
        unique suffix). `quarry doctor` lists parked items."""
        parked = layout.parked_key(key)
        try:
            self.kv.set_if(CLEANUP_PARTITION, parked, value, kv.ABSENT)
        except kv.PredicateFailed:
            try:
                same = self.kv.get(CLEANUP_PARTITION, parked).value == value
            except kv.KeyNotFound:
                same = False
            if not same:
                parked = layout.parked_key(key, unique=str(time.time_ns()))
                self.kv.set_if(CLEANUP_PARTITION, parked, value, kv.ABSENT)
        self.kv.delete(CLEANUP_PARTITION, key)
        records.CORRUPT_RECORDS_PARKED.labels(why.record).inc()
        log.warning(
            "parked corrupt cleanup item: partition=%s key=%s moved to key=%s: %s",
            records.show(CLEANUP_PARTITION),
            records.show(key),
            records.show(parked),
            why.message,
        )
        return parked

    def _delete_partition(self, partition: bytes) -> None:
        while True:
            iterator = self.kv.scan(partition, batch_size=SCAN_BATCH)
            try:
                keys = [item.key for _, item in zip(range(SCAN_BATCH), iterator, strict=False)]
            finally:
                iterator.close()
            if not keys:
                return
            self.kv.batch_delete([(partition, key) for key in keys])


# How often a dropper looks for deleted repositories' instances left unqueued (a scan of the
# deleted-instance records: one per repository ever deleted).
DEAD_INSTANCES_INTERVAL_SECONDS = 3600.0


class Dropper:
    """Background worker running StagingManager.drop_queued periodically (a PeriodicWorker:
    it backs off while the KV store is unreachable and stops between partitions when asked,
    so a dead kv-gateway never holds up a shutdown)."""

    def __init__(
        self, staging: StagingManager, interval_seconds: float = 5.0, grace_seconds: float = 10.0
    ):
        self._staging = staging
        self._grace = grace_seconds
        self._dead_instances_checked = float("-inf")  # on the first pass, then hourly
        self._worker = PeriodicWorker(
            "staging-dropper",
            self._drop_due,
            interval_seconds,
            retry_max=max(interval_seconds, 30.0),
        )

    def start(self) -> Dropper:
        self._worker.start()
        return self

    def _drop_due(self) -> None:
        now = time.monotonic()
        if now - self._dead_instances_checked >= DEAD_INSTANCES_INTERVAL_SECONDS:
            self._staging.queue_dead_instances()
            self._dead_instances_checked = now
        while not self._worker.stopping.is_set():
            if self._staging.drop_queued(self._grace) == 0:
                return

    def stop(self, timeout: float = 5.0) -> bool:
        return self._worker.stop(timeout)
