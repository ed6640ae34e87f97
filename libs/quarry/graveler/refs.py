"""RefManager: repositories, branches, tags and commits in the KV store.

The keys and record codecs are in quarry.graveler.layout (the one owner of the storage
layout, docs/architecture.md §2); ref parsing, resolution and history walks are in
quarry.graveler.resolution (mixed in). Every change of a branch record goes through
`RefManager.update_branch` (read, apply a function to a copy, compare-and-swap, retry).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf import timestamp_pb2
from google.protobuf.message import Message

from quarry.config import REPOSITORY_CACHE_SECONDS
from quarry.graveler import errors as gerrors
from quarry.graveler import layout, records
from quarry.graveler.layout import (
    BRANCHES_PREFIX,
    COMMITS_PREFIX,
    CREATING_PREFIX,
    DELETED_INSTANCES_PREFIX,
    GC_RULES_KEY,
    QUARRY_PARTITION,
    REPOS_PREFIX,
    TAGS_PREFIX,
    prefix_end,
    repo_partition,
)
from quarry.graveler.resolution import (
    COMMIT_ID_HEX,
    MIN_COMMIT_PREFIX,
    LogWalk,
    ParsedRef,
    RefResolution,
    ResolvedRef,
    parse_ref,
)
from quarry.graveler.retry import DEFAULT_RETRY, RetryPolicy, cas_retry
from quarry.kv import store as kv
from quarry.kv.amortized import AmortizationStats, AmortizedStore
from quarry.lru import LRUCache, TTLCache
from quarry.runtime import deadlines
from quarry.v1 import types_pb2

M = TypeVar("M", bound=Message)

# A function applied to a copy of a branch record by RefManager.update_branch: it returns
# the record to store (usually the copy it was given, changed) or None for "no change"; it
# may raise to abort the update.
BranchFn = Callable[[types_pb2.Branch], "types_pb2.Branch | None"]


@dataclass(frozen=True)
class Creation:
    instance_id: str
    repository: str
    storage_namespace: str
    started: float  # unix seconds


@dataclass(frozen=True)
class BranchUpdate:
    """The outcome of RefManager.update_branch."""

    before: types_pb2.Branch  # the record the function was applied to
    branch: types_pb2.Branch  # the record stored now (`before` when unchanged)
    predicate: bytes  # the stored bytes: the predicate of the next compare-and-swap
    changed: bool


@dataclass(frozen=True)
class Repository:
    name: str
    storage_namespace: str
    default_branch: str
    instance_id: str
    creation_time: int  # unix seconds
    # KV partitions per new staging token (quarry.kv.partitions; 1 = unsharded).
    staging_shards: int = 1

    @functools.cached_property
    def partition(self) -> bytes:
        # Computed once per record (every read of the repository's records names it).
        return repo_partition(self.name, self.instance_id)

    def to_proto(self) -> types_pb2.Repository:
        return types_pb2.Repository(
            name=self.name,
            storage_namespace=self.storage_namespace,
            default_branch=self.default_branch,
            creation_time=timestamp_pb2.Timestamp(seconds=self.creation_time),
            instance_id=self.instance_id,
            staging_shards=self.staging_shards,
        )

    def to_record(self) -> bytes:
        return layout.encode_repository(self.to_proto(), self.instance_id)

    @staticmethod
    def from_record(data: bytes, key: bytes) -> Repository:
        """The repository stored at `quarry`/`key` (CorruptRecord if unreadable)."""
        record = layout.decode_repository(key, data)
        r = record.repository
        return Repository(
            r.name,
            r.storage_namespace,
            r.default_branch,
            record.instance_id,
            r.creation_time.seconds,
            max(1, r.staging_shards),
        )


def is_dirty(branch: types_pb2.Branch) -> bool:
    """Records written before the field existed read as dirty (the safe default)."""
    return branch.dirty if branch.HasField("dirty") else True


class RefManager(RefResolution):
    # Repository records change by deletion and by UpdateRepository (settings: staging_shards,
    # which only flows that install a staging token use, and they read the record fresh); a
    # short cache saves one KV read per call.
    # Writers re-validate the record together with the branch (Writes.write), and every other
    # flow that changes refs reads it fresh (Core.live_repo), so a stale entry can at worst
    # serve a read of a repository deleted within this window. It
    # must stay shorter than the dropper's grace period (staging_drop_grace_seconds, which
    # Settings refuses otherwise), so a dead instance's branch records are still there while
    # a stale entry can point at them.
    REPOSITORY_TTL_SECONDS = REPOSITORY_CACHE_SECONDS

    def __init__(
        self, store: kv.Store, commit_cache_size: int = 100_000, retry: RetryPolicy = DEFAULT_RETRY
    ):
        self.kv = store
        # The budget and backoff of a branch compare-and-swap (update_branch, delete_branch)
        # when the caller names no policy.
        self.retry = retry
        self._repos = TTLCache(self.REPOSITORY_TTL_SECONDS)
        # Branch records are read through a single flight per key (seeds/branch-read-
        # optimization.md, issue 14): concurrent reads of one branch share one KV read, so
        # a hot branch costs about one read per read latency however many requests read it.
        # It must NEVER answer a request with a read issued before that request arrived: a
        # write acknowledged before the request started would be missed (read-after-write,
        # on which the reader flow's validation and the writer flow's re-read rely). A
        # request only joins a flight whose read it saw start later (quarry.kv.amortized).
        self._branch_reads = AmortizedStore(store)
        # Commits are immutable: bounded by count only.
        self._commits = LRUCache(max_bytes=1 << 62, max_items=commit_cache_size)

    # ---- repositories ------------------------------------------------------------------

    def get_repository(self, name: str, fresh: bool = False) -> Repository:
        if not fresh:
            cached = self._repos.get(name, ttl=self.REPOSITORY_TTL_SECONDS)
            if cached is not None:
                return cached
        try:
            data = self.kv.get(QUARRY_PARTITION, layout.repository_key(name)).value
        except kv.KeyNotFound:
            self._repos.pop(name)
            raise gerrors.RepositoryNotFound(
                f"repository {name!r} not found", metadata={"repository": name}
            ) from None
        repo = Repository.from_record(data, layout.repository_key(name))
        self._repos.put(name, repo)
        return repo

    def repository_key(self, name: str) -> tuple[bytes, bytes]:
        return QUARRY_PARTITION, layout.repository_key(name)

    def insert_repository(self, repo: Repository) -> None:
        try:
            self.kv.set_if(
                QUARRY_PARTITION, layout.repository_key(repo.name), repo.to_record(), kv.ABSENT
            )
        except kv.PredicateFailed:
            raise gerrors.RepositoryExists(
                f"repository {repo.name!r} already exists", metadata={"repository": repo.name}
            ) from None
        self.remember_repository(repo)

    def update_repository(
        self, name: str, change: Callable[[Repository], Repository]
    ) -> Repository:
        """Compare-and-swap the repository record: read it fresh, store `change(record)` if
        the record is still the one read, else read again and retry. Never recreates a
        deleted repository (the swap is conditional on the bytes read) and never changes its
        name, instance or namespace (only the settings `change` returns)."""
        key = layout.repository_key(name)
        for attempt in DEFAULT_RETRY.attempts(
            lambda: gerrors.RepositoryContended(
                f"repository {name!r} kept changing; retry", metadata={"repository": name}
            )
        ):
            try:
                current = self.kv.get(QUARRY_PARTITION, key)
            except kv.KeyNotFound:
                self._repos.pop(name)
                raise gerrors.RepositoryNotFound(
                    f"repository {name!r} not found", metadata={"repository": name}
                ) from None
            before = Repository.from_record(current.value, key)
            after = change(before)
            if (after.name, after.instance_id, after.storage_namespace) != (
                before.name,
                before.instance_id,
                before.storage_namespace,
            ):
                raise AssertionError("an update may change a repository's settings only")
            if after == before:
                self._repos.put(name, before)
                return before
            try:
                self.kv.set_if(
                    QUARRY_PARTITION, key, after.to_record(), kv.Equals(current.predicate)
                )
            except kv.PredicateFailed:
                cas_retry("update-repository", attempt)
                continue
            self._repos.put(name, after)
            return after
        raise AssertionError("unreachable")

    def remember_repository(self, repo: Repository) -> None:
        """Cache a repository record just read or written (it is the current instance)."""
        self._repos.put(repo.name, repo)

    def record_deleted_instance(self, repo: Repository) -> None:
        """Remember that this repository instance is gone for good (deleted, or its
        creation failed): only then may a new repository take over its namespace."""
        self.kv.set(
            QUARRY_PARTITION,
            layout.deleted_instance_key(repo.instance_id),
            layout.encode_deleted_instance(repo.name),
        )

    def is_deleted_instance(self, instance_id: str) -> bool:
        try:
            self.kv.get(QUARRY_PARTITION, layout.deleted_instance_key(instance_id))
            return True
        except kv.KeyNotFound:
            return False

    def add_creation(self, repo: Repository, started: float) -> None:
        self.kv.set(
            QUARRY_PARTITION,
            layout.creation_key(repo.instance_id),
            layout.encode_creation(repo.name, repo.storage_namespace, started),
        )

    def remove_creation(self, repo: Repository) -> None:
        self.kv.delete(QUARRY_PARTITION, layout.creation_key(repo.instance_id))

    def list_creations(self) -> list[Creation]:
        """Repository creations in progress (or interrupted: see Graveler.CREATION_TTL)."""
        found = []
        iterator = self.kv.scan(QUARRY_PARTITION, CREATING_PREFIX, prefix_end(CREATING_PREFIX))
        try:
            for item in iterator:
                decoded = layout.decode_creation(item.value)
                if decoded is None:
                    continue  # not one of ours: it cannot name a namespace
                repository, storage_namespace, started = decoded
                found.append(
                    Creation(
                        layout.name_of(item.key, CREATING_PREFIX),
                        repository,
                        storage_namespace,
                        started,
                    )
                )
        finally:
            iterator.close()
        return found

    def delete_repository_record(self, repo: Repository) -> None:
        """Delete the record of this instance of the repository, by compare-and-delete:
        a deletion that lost a race (a replica paused while another deleted the repository
        and it was created or restored again under its name) must never delete the new
        instance's record -- that emptied a live repository (tester hAO). RepositoryNotFound
        when the record no longer names `repo`'s instance; a change of its settings
        meanwhile is read again."""
        key = layout.repository_key(repo.name)
        for attempt in DEFAULT_RETRY.attempts(
            lambda: gerrors.RepositoryContended(
                f"repository {repo.name!r} kept changing; retry",
                metadata={"repository": repo.name},
            )
        ):
            try:
                current: kv.GetResult | None = self.kv.get(QUARRY_PARTITION, key)
            except kv.KeyNotFound:
                current = None
            if (
                current is None
                or Repository.from_record(current.value, key).instance_id != repo.instance_id
            ):
                self._repos.pop(repo.name)
                raise gerrors.RepositoryNotFound(
                    f"repository {repo.name!r} not found (deleted meanwhile)",
                    metadata={"repository": repo.name},
                )
            try:
                self.kv.delete_if(QUARRY_PARTITION, key, kv.Equals(current.predicate))
            except kv.PredicateFailed:
                cas_retry("delete-repository", attempt)
                continue
            self._repos.pop(repo.name)
            return

    def list_repositories(self, after: str = "", limit: int = 100) -> list[Repository]:
        """Up to `limit` repositories named after `after`. Corrupt records are skipped in a
        listing scope (records.listing) and raise CorruptRecord outside one."""
        start = layout.scan_start(REPOS_PREFIX, after)
        out = []
        iterator = self.kv.scan(
            QUARRY_PARTITION, start, prefix_end(REPOS_PREFIX), batch_size=limit + 1
        )
        try:
            for item in iterator:
                try:
                    out.append(Repository.from_record(item.value, item.key))
                except records.CorruptRecord as exc:
                    records.skip(exc)
                    continue
                if len(out) >= limit:
                    break
        finally:
            iterator.close()
        return out

    # ---- branches ----------------------------------------------------------------------

    def branch_read_stats(self) -> AmortizationStats:
        """Branch-record reads asked for (`requests`) and sent to the KV store
        (`backend_reads`) by this manager since it was created."""
        return self._branch_reads.stats()

    def get_branch(self, repo: Repository, name: str) -> tuple[types_pb2.Branch, bytes]:
        """The branch record as stored when the call started or later (never older: see
        `_branch_reads`), with its predicate for a compare-and-swap."""
        try:
            result = self._branch_reads.get(repo.partition, layout.branch_key(name))
        except kv.KeyNotFound:
            raise gerrors.BranchNotFound(
                f"branch {name!r} not found in repository {repo.name!r}",
                metadata={"repository": repo.name, "branch": name},
            ) from None
        return layout.decode_branch(repo.partition, name, result.value), result.predicate

    def branch_key(self, repo: Repository, name: str) -> tuple[bytes, bytes]:
        return repo.partition, layout.branch_key(name)

    def set_branch_if(
        self, repo: Repository, branch: types_pb2.Branch, predicate: kv.Predicate
    ) -> bytes:
        """The raw conditional write of a branch record; returns the new predicate. Only
        insert_branch and update_branch call it (tests may wrap it to stage races)."""
        data = layout.encode_branch(branch)
        deadlines.check()  # the last point to stop: a write not sent changes nothing
        # Once sent, a branch write completes whatever the caller's deadline: cut in flight,
        # it could land unanswered, a commit or merge that moved the branch reported failed
        # (and its retry answered NO_CHANGES).
        with deadlines.serving(None):
            self.kv.set_if(repo.partition, layout.branch_key(branch.name), data, predicate)
        return data

    def insert_branch(self, repo: Repository, branch: types_pb2.Branch) -> bytes:
        """Create a branch record (set if absent); BranchExists if the name is taken."""
        try:
            return self.set_branch_if(repo, branch, kv.ABSENT)
        except kv.PredicateFailed:
            raise gerrors.BranchExists(
                f"branch {branch.name!r} already exists",
                metadata={"repository": repo.name, "branch": branch.name},
            ) from None

    def update_branch(
        self,
        repo: Repository,
        name: str,
        fn: BranchFn,
        *,
        step: str = "update_branch",
        policy: RetryPolicy | None = None,
        expect: tuple[types_pb2.Branch, bytes] | None = None,
    ) -> BranchUpdate:
        """The one way to change a branch record: read it (or start from `expect`, a
        record and predicate read earlier), apply `fn` to a copy, and store the result if
        the record is still what was read. A lost swap re-reads and re-applies `fn` after
        a jittered backoff (a `cas.retry` span event {step, attempt}); after the policy's
        budget, BranchContended. `fn` may raise to abort, or return None for "no change"
        (nothing is written). Never writes a record `fn` did not produce from the record
        it replaces."""

        def exhausted() -> gerrors.BranchContended:
            return gerrors.BranchContended(
                f"branch {name!r} kept changing ({step}); retry",
                metadata={"repository": repo.name, "branch": name},
            )

        for attempt in (self.retry if policy is None else policy).attempts(exhausted):
            if attempt == 0 and expect is not None:
                current, predicate = expect
            else:
                current, predicate = self.get_branch(repo, name)
            copy = types_pb2.Branch()
            copy.CopyFrom(current)
            updated = fn(copy)
            if updated is None:
                return BranchUpdate(current, current, predicate, False)
            try:
                stored = self.set_branch_if(repo, updated, kv.Equals(predicate))
            except kv.PredicateFailed:
                cas_retry(step, attempt + 1)
                continue
            return BranchUpdate(current, updated, stored, True)
        raise AssertionError("unreachable: the policy raises when exhausted")

    def delete_branch(
        self,
        repo: Repository,
        name: str,
        check: Callable[[types_pb2.Branch], None] = lambda branch: None,
        *,
        policy: RetryPolicy | None = None,
    ) -> types_pb2.Branch:
        """Delete the branch record through compare-and-delete; returns the record deleted,
        whose tokens the caller retires. `check` sees each record read and may raise to
        refuse. Never deletes a record it did not read: a change landing between the read
        and the delete (a seal installing a fresh staging token, a commit) makes the delete
        fail and start over from the new record, so the tokens returned are exactly those
        the deleted record held and none is orphaned. BranchNotFound once it is gone;
        BranchContended after the policy's budget."""

        def exhausted() -> gerrors.BranchContended:
            return gerrors.BranchContended(
                f"branch {name!r} kept changing (delete_branch); retry",
                metadata={"repository": repo.name, "branch": name},
            )

        for attempt in (self.retry if policy is None else policy).attempts(exhausted):
            current, predicate = self.get_branch(repo, name)
            check(current)
            try:
                self.delete_branch_if(repo, name, kv.Equals(predicate))
            except kv.PredicateFailed:
                cas_retry("delete_branch", attempt + 1)
                continue
            return current
        raise AssertionError("unreachable: the policy raises when exhausted")

    def delete_branch_if(self, repo: Repository, name: str, predicate: kv.Equals) -> None:
        """The raw compare-and-delete of a branch record. Only delete_branch calls it (tests
        may wrap it to stage races). Once sent it completes, as set_branch_if."""
        deadlines.check()
        with deadlines.serving(None):
            self.kv.delete_if(repo.partition, layout.branch_key(name), predicate)

    def list_branches(
        self, repo: Repository, after: str = "", limit: int = 100
    ) -> list[types_pb2.Branch]:
        return self._scan_records(types_pb2.Branch, repo.partition, BRANCHES_PREFIX, after, limit)

    # ---- tags --------------------------------------------------------------------------

    def get_tag(self, repo: Repository, name: str) -> types_pb2.Tag:
        try:
            data = self.kv.get(repo.partition, layout.tag_key(name)).value
        except kv.KeyNotFound:
            raise gerrors.TagNotFound(
                f"tag {name!r} not found in repository {repo.name!r}",
                metadata={"repository": repo.name, "tag": name},
            ) from None
        return layout.decode(types_pb2.Tag, repo.partition, layout.tag_key(name), data)

    def insert_tag(self, repo: Repository, tag: types_pb2.Tag) -> None:
        try:
            self.kv.set_if(
                repo.partition, layout.tag_key(tag.name), layout.encode_tag(tag), kv.ABSENT
            )
        except kv.PredicateFailed:
            raise gerrors.TagExists(
                f"tag {tag.name!r} already exists (tags are immutable)",
                metadata={"repository": repo.name, "tag": tag.name},
            ) from None

    def delete_tag(self, repo: Repository, name: str) -> None:
        self.get_tag(repo, name)  # NOT_FOUND for a missing tag
        self.kv.delete(repo.partition, layout.tag_key(name))

    def list_tags(self, repo: Repository, after: str = "", limit: int = 100) -> list[types_pb2.Tag]:
        return self._scan_records(types_pb2.Tag, repo.partition, TAGS_PREFIX, after, limit)

    # ---- settings --------------------------------------------------------------------

    def get_gc_rules(self, repo: Repository) -> types_pb2.GarbageCollectionRules:
        try:
            data = self.kv.get(repo.partition, GC_RULES_KEY).value
        except kv.KeyNotFound:
            raise gerrors.GarbageCollectionRulesNotFound(
                f"repository {repo.name!r} has no garbage-collection rules",
                metadata={"repository": repo.name},
            ) from None
        return layout.decode(types_pb2.GarbageCollectionRules, repo.partition, GC_RULES_KEY, data)

    def set_gc_rules(self, repo: Repository, rules: types_pb2.GarbageCollectionRules) -> None:
        self.kv.set(repo.partition, GC_RULES_KEY, layout.encode_gc_rules(rules))

    def delete_gc_rules(self, repo: Repository) -> None:
        self.get_gc_rules(repo)  # NOT_FOUND when there are none
        self.kv.delete(repo.partition, GC_RULES_KEY)

    # ---- commits -----------------------------------------------------------------------

    def get_commit(self, repo: Repository, commit_id: str) -> types_pb2.Commit:
        cache_key = (repo.instance_id, commit_id)
        cached = self._commits.get(cache_key)
        if cached is not None:
            return cached
        try:
            data = self.kv.get(repo.partition, layout.commit_key(commit_id)).value
        except kv.KeyNotFound:
            raise gerrors.CommitNotFound(
                f"commit {commit_id!r} not found",
                metadata={"repository": repo.name, "commit": commit_id},
            ) from None
        commit = layout.decode(types_pb2.Commit, repo.partition, layout.commit_key(commit_id), data)
        self._commits.put(cache_key, commit, 0)
        return commit

    def insert_commit(self, repo: Repository, commit: types_pb2.Commit) -> None:
        """Commits are content-addressed: writing an existing id again is a no-op."""
        with contextlib.suppress(kv.PredicateFailed):
            self.kv.set_if(
                repo.partition,
                layout.commit_key(commit.id),
                layout.encode_commit(commit),
                kv.ABSENT,
            )
        self._commits.put((repo.instance_id, commit.id), commit, 0)

    def list_commits(
        self, repo: Repository, after: str = "", limit: int = 100
    ) -> list[types_pb2.Commit]:
        """Commits in id order (a repository dump reads them all)."""
        return self._scan_records(types_pb2.Commit, repo.partition, COMMITS_PREFIX, after, limit)

    def commit_ids_with_prefix(self, repo: Repository, prefix: str, limit: int = 2) -> list[str]:
        start = layout.commit_key(prefix)
        iterator = self.kv.scan(repo.partition, start, prefix_end(start), batch_size=limit)
        try:
            ids = []
            for item in iterator:
                ids.append(layout.name_of(item.key, COMMITS_PREFIX))
                if len(ids) >= limit:
                    break
            return ids
        finally:
            iterator.close()

    # ---- helpers ---------------------------------------------------------------------------

    def _scan_records(
        self, message_type: type[M], partition: bytes, prefix: bytes, after: str, limit: int
    ) -> list[M]:
        """Up to `limit` records under `prefix` named after `after`, decoded; a corrupt one
        is skipped in a listing scope and raises CorruptRecord outside one."""
        start = layout.scan_start(prefix, after)
        iterator = self.kv.scan(partition, start, prefix_end(prefix), batch_size=limit + 1)
        try:
            out = []
            for item in iterator:
                record = layout.decode_or_skip(message_type, partition, item.key, item.value)
                if record is None:
                    continue
                out.append(record)
                if len(out) >= limit:
                    break
            return out
        finally:
            iterator.close()


_prefix_end = prefix_end

__all__ = [
    "BRANCHES_PREFIX",
    "COMMITS_PREFIX",
    "COMMIT_ID_HEX",
    "DELETED_INSTANCES_PREFIX",
    "GC_RULES_KEY",
    "MIN_COMMIT_PREFIX",
    "REPOS_PREFIX",
    "TAGS_PREFIX",
    "BranchUpdate",
    "LogWalk",
    "ParsedRef",
    "RefManager",
    "Repository",
    "ResolvedRef",
    "is_dirty",
    "parse_ref",
    "prefix_end",
]
