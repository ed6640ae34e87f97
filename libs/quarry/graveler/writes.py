"""Writes: put, delete and discard, through the writer flow (docs/architecture.md §4 "Write").

The writer flow: mark the branch dirty (a branch update, only when it is clean), write to
its staging token, then read the repository and branch records in one batch and
acknowledge only if the token is unchanged; otherwise write again to the new token.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from quarry import errors
from quarry.graveler import errors as gerrors
from quarry.graveler import layout, names
from quarry.graveler.core import Core
from quarry.graveler.model import Entry
from quarry.graveler.protection import STAGING_WRITE
from quarry.graveler.reads import Reads, change_against, contended
from quarry.graveler.refs import Repository, is_dirty
from quarry.graveler.staging import new_token
from quarry.kv import store as kv
from quarry.v1 import types_pb2

StagedItems = Sequence[tuple[str, Entry | None]]


class StagedCount(int):
    """What put_objects / delete_objects return: the number of paths staged (an int, as
    before) carrying `staging_token`, the token the write was acknowledged on ("" when
    nothing was written), so branch-manager can report staging activity per token to the
    compactor-sensor without another branch read."""

    staging_token: str

    def __new__(cls, count: int, staging_token: str = "") -> StagedCount:
        value = super().__new__(cls, count)
        value.staging_token = staging_token
        return value


# The default bounds of one PutObjects stream (Settings.max_put_objects_stream_entries and
# max_put_objects_stream_bytes). An entry held as the received proto costs about 270 bytes
# of memory for ~150 encoded bytes (measured with Spark-like paths and addresses): a full
# stream of typical entries holds ~270 MB; the byte bound caps a stream of fat entries
# (metadata up to 8 KB each) at the same order.
DEFAULT_MAX_STREAM_ENTRIES = 1_000_000
DEFAULT_MAX_STREAM_BYTES = 512 * 1024 * 1024


class PutStreamTooLarge(errors.InvalidArgument):
    """A PutObjects stream longer than the server holds before staging (it is staged all or
    nothing, so it is read whole first): split it into several calls."""

    reason = "PUT_STREAM_TOO_LARGE"


@dataclass(frozen=True)
class PutStreamLimits:
    """What branch-manager holds of one PutObjects stream before staging any of it."""

    max_entries: int = DEFAULT_MAX_STREAM_ENTRIES
    max_bytes: int = DEFAULT_MAX_STREAM_BYTES

    def check(self, entries: int, encoded_bytes: int) -> None:
        """PutStreamTooLarge once a stream has passed either bound."""
        if entries > self.max_entries or encoded_bytes > self.max_bytes:
            raise PutStreamTooLarge(
                f"a PutObjects stream may carry at most {self.max_entries} entries and "
                f"{self.max_bytes} bytes (it is validated whole before anything is staged); "
                f"this one passed {entries} entries / {encoded_bytes} bytes: split it into "
                f"several calls",
                metadata={
                    "max_entries": str(self.max_entries),
                    "max_bytes": str(self.max_bytes),
                },
            )


def batch_items(entries: Iterable[Entry]) -> list[tuple[str, Entry]]:
    """One batch as the writer stages it: every entry checked (names.check_entry; raises
    before anything is staged), the last write of a path wins, sorted by path."""
    seen = {}
    for entry in entries:
        names.check_entry(entry)
        seen[entry.path] = entry  # the last write of a path in one batch wins
    return sorted(seen.items())


class TokenMoved(Exception):
    """Internal: a conditional staged write must be re-decided on the new token."""


def _mark_dirty(branch: types_pb2.Branch) -> types_pb2.Branch | None:
    if is_dirty(branch):
        return None
    branch.dirty = True
    return branch


class Writes:
    def __init__(self, core: Core, reads: Reads) -> None:
        self.core = core
        self.reads = reads
        self.refs = core.refs
        self.staging = core.staging
        # Bounds of one PutObjects stream (branch-manager; set from Settings by wiring).
        self.stream_limits = PutStreamLimits()

    def check_put(self, repo_name: str, branch_name: str, entries: Iterable[Entry]) -> None:
        """Everything put_objects refuses about a batch for the caller's mistakes (names,
        every entry), checked the same way and without any KV operation or write: a
        PutObjects stream checks all its batches with it before staging the first."""
        repo = self.core.repo(repo_name)
        names.check_branch_name(branch_name)
        items = batch_items(entries)
        self.core.addresses.check_entries(repo, (entry for _, entry in items))

    def copy_object(
        self,
        repo_name: str,
        source_ref: str,
        source_path: str,
        branch_name: str,
        path: str,
        if_absent: bool = False,
    ) -> tuple[Entry, StagedCount]:
        """Stage `path` on the branch with the entry of `source_path` at `source_ref`: the
        same bytes (objects are immutable), content type and metadata. Its address is the
        source's, which the caller may read (the service authorizes fs:ReadObject on the
        source): the staging rules apply to it as to any entry, but no place beyond it
        needs a permission of its own."""
        names.check_path(path)
        entry = self.reads.stat_object(repo_name, source_ref, source_path).with_path(path)
        return entry, self.put_objects(repo_name, branch_name, [entry], if_absent=if_absent)

    def put_objects(
        self,
        repo_name: str,
        branch_name: str,
        entries: Sequence[Entry],
        if_absent: bool = False,
        if_match_checksum: str = "",
    ) -> StagedCount:
        """Stage `entries`. `if_absent`: ObjectExists when the (one) path has an entry;
        `if_match_checksum`: ChecksumConditionFailed unless the (one) path's entry has that checksum
        (ObjectNotFound when it has none)."""
        repo = self.core.repo(repo_name)
        names.check_branch_name(branch_name)
        items = batch_items(entries)
        if if_absent and if_match_checksum:
            raise gerrors.InvalidEntry("if_absent and if_match_checksum exclude each other")
        if not items:
            return StagedCount(0)
        self.core.addresses.check_entries(repo, (entry for _, entry in items))
        self.core.protection.check(repo, branch_name, STAGING_WRITE)
        if if_absent or if_match_checksum:
            if len(items) != 1:
                raise gerrors.InvalidEntry("a conditional put applies to a single object")
            token = self._put_conditional(repo, branch_name, items[0][1], if_match_checksum)
        else:
            token = self.write(repo, branch_name, items)
        return StagedCount(len(items), token)

    def delete_objects(self, repo_name: str, branch_name: str, paths: Sequence[str]) -> StagedCount:
        """Stage tombstones for the paths that exist on the branch; others are no-ops."""
        repo = self.core.live_repo(repo_name)
        names.check_branch_name(branch_name)
        for path in paths:
            names.check_path(path)
        unique = sorted(set(paths))
        if not unique:
            return StagedCount(0)
        self.core.protection.check(repo, branch_name, STAGING_WRITE)
        message = f"branch {branch_name!r} kept changing"
        for _ in self.core.retries.branch.attempts(lambda: contended(message)):
            branch, _ = self.core.branch(repo, branch_name)
            layers = self.reads.branch_layers(repo, branch, "delete")
            found = self.reads.lookup_many(layers, unique)
            existing = [path for path in unique if found[path] is not None]
            if self.reads.still_valid(layers):
                break
        token = ""
        if existing:
            token = self.write(repo, branch_name, [(path, None) for path in existing])
        return StagedCount(len(existing), token)

    def _put_conditional(
        self, repo: Repository, branch_name: str, entry: Entry, if_match_checksum: str
    ) -> str:
        """Stage `entry` only if its path has no entry on the branch (`if_match_checksum`
        empty) or has one with that checksum. Returns the staging token written to (""
        if the entry was already there).

        Safety rule: never stages over an entry the condition did not see. The staged key
        is written with a KV predicate on the staged value the check read, and only to
        the staging token the check read; a token that moved (a commit) starts over."""
        message = f"branch {branch_name!r} kept changing"
        for _ in self.core.retries.branch.attempts(lambda: contended(message)):
            repo = self.core.repo(repo.name)  # the current instance (see write)
            branch, _ = self.core.branch(repo, branch_name)
            layers = self.reads.branch_layers(repo, branch, "put")
            # The staging token is consulted even on a clean branch: the conditional write
            # below targets it.
            found, value, staged_predicate = self.staging.get(branch.staging_token, entry.path)
            if not found:
                found, value = self.reads.lookup(layers, entry.path)
            if value is not None and value == entry:
                return ""  # our own write from an attempt whose token was sealed meanwhile
            where = {"repository": repo.name, "branch": branch_name, "path": entry.path}
            if not if_match_checksum and value is not None:
                raise gerrors.ObjectExists(
                    f"{entry.path!r} already exists on {branch_name!r}", metadata=where
                )
            if if_match_checksum and value is None:
                raise gerrors.ObjectNotFound(
                    f"{entry.path!r} not found on {branch_name!r} (the put was conditioned on "
                    f"checksum {if_match_checksum!r})",
                    metadata=where,
                )
            if if_match_checksum and value is not None and value.checksum != if_match_checksum:
                raise gerrors.ChecksumConditionFailed(
                    f"{entry.path!r} on {branch_name!r} has checksum {value.checksum!r}, not "
                    f"{if_match_checksum!r}",
                    metadata={**where, "expected_checksum": if_match_checksum},
                )
            predicate = kv.Equals(staged_predicate) if staged_predicate is not None else kv.ABSENT
            try:
                return self.write(
                    repo,
                    branch_name,
                    [(entry.path, entry)],
                    conditional=(predicate, branch.staging_token),
                )
            except TokenMoved:
                continue
            except kv.PredicateFailed:
                concurrent = (
                    gerrors.ChecksumConditionFailed if if_match_checksum else gerrors.ObjectExists
                )
                raise concurrent(
                    f"{entry.path!r} was written concurrently", metadata={"path": entry.path}
                ) from None
        raise AssertionError("unreachable")

    def write(
        self,
        repo: Repository,
        branch_name: str,
        items: StagedItems,
        conditional: tuple[kv.Predicate, str] | None = None,
    ) -> str:
        """The writer flow: dirty first, then staging, then validate the token. Returns the
        staging token the write was acknowledged on. `conditional` = (predicate of the one
        staged item, the token it must be written to): a write for put-if-absent."""
        expected_token = conditional[1] if conditional is not None else None
        for _ in range(
            self.core.retries.branch.max_attempts
        ):  # no sleep: a moved token is retried at once
            branch, branch_predicate = self.core.cached_branch(repo, branch_name)
            if expected_token is not None and branch.staging_token != expected_token:
                self.core.forget_branch(repo, branch_name)
                raise TokenMoved()
            if not is_dirty(branch):
                branch = self._mark_dirty(repo, branch, branch_predicate)
                if expected_token is not None and branch.staging_token != expected_token:
                    raise TokenMoved()
            keys = self._validation_keys(repo, branch_name)
            if conditional is None:
                # The staged write and the validation read after it: one KV round trip.
                found = self.staging.set_many_then_get(branch.staging_token, items, keys)
            else:
                path, entry = items[0]
                self.staging.set_if(branch.staging_token, path, entry, conditional[0])
                found = self.core.kv.batch_get(keys)
            current_repo, current = self._validated(repo, branch_name, keys, found)
            if current_repo.instance_id != repo.instance_id:
                # Deleted and re-created since our cached record: what we wrote went to the
                # dead instance (its partitions are queued for dropping). Write again into
                # the repository as it is now.
                self.refs.remember_repository(current_repo)
                if expected_token is not None:
                    raise TokenMoved()
                repo = current_repo
                continue
            if current.staging_token == branch.staging_token:
                return branch.staging_token
            # A commit sealed our token while we wrote: write again to the new token (the
            # same entry again is idempotent, whichever token the commit took).
            if expected_token is not None:
                raise TokenMoved()
        raise gerrors.BranchContended(
            f"branch {branch_name!r} kept changing staging token during the write; retry",
            metadata={"repository": repo.name, "branch": branch_name},
        )

    def _mark_dirty(
        self, repo: Repository, cached: types_pb2.Branch, predicate: bytes
    ) -> types_pb2.Branch:
        """Set `dirty` before writing (invariant 1), starting from the cached record; a
        stale cache or a concurrent change is re-read by the branch update."""
        try:
            update = self.refs.update_branch(
                repo, cached.name, _mark_dirty, step="mark_dirty", expect=(cached, predicate)
            )
        except gerrors.BranchNotFound as missing:
            self.core.forget_branch(repo, cached.name)
            raise self.core.not_a_branch(repo, cached.name, missing) from None
        self.core.remember_branch(repo, update.branch, update.predicate)
        return update.branch

    def _validation_keys(self, repo: Repository, branch_name: str) -> list[tuple[bytes, bytes]]:
        """The validation read: the repository and branch records, read fresh in one batch
        after the staged write (not a compare-and-swap: it only checks which token the write
        landed on)."""
        return [self.refs.repository_key(repo.name), self.refs.branch_key(repo, branch_name)]

    def _validated(
        self,
        repo: Repository,
        branch_name: str,
        keys: list[tuple[bytes, bytes]],
        found: list[kv.GetResult | None],
    ) -> tuple[Repository, types_pb2.Branch]:
        """What the validation read of `keys` (_validation_keys) `found`: the repository as
        it is now, and the branch record (an empty one when the repository is another
        instance)."""
        repo_key = keys[0]
        repo_now, branch_now = found
        if repo_now is None:
            raise gerrors.RepositoryNotFound(
                f"repository {repo.name!r} was deleted", metadata={"repository": repo.name}
            )
        current_repo = Repository.from_record(repo_now.value, repo_key[1])
        if current_repo.instance_id != repo.instance_id:
            return current_repo, types_pb2.Branch()
        if branch_now is None:
            self.core.forget_branch(repo, branch_name)
            raise gerrors.BranchNotFound(
                f"branch {branch_name!r} not found",
                metadata={"repository": repo.name, "branch": branch_name},
            )
        current = layout.decode_branch(repo.partition, branch_name, branch_now.value)
        self.core.remember_branch(repo, current, branch_now.predicate)
        return current_repo, current

    # ---- discard ------------------------------------------------------------------------

    def discard_changes(
        self, repo_name: str, branch_name: str, path: str = "", prefix: str = ""
    ) -> int:
        """Discard uncommitted changes to one path, a prefix, or everything."""
        repo = self.core.live_repo(repo_name)
        names.check_branch_name(branch_name)
        if path and prefix:
            raise gerrors.InvalidPath("give a path or a prefix, not both")
        if path:
            names.check_path(path)
        self.core.protection.check(repo, branch_name, STAGING_WRITE)
        if not path and not prefix:
            self.discard_all(repo, branch_name)
            return -1
        # Stage the committed value back (or a tombstone where nothing is committed) for
        # every uncommitted change in scope, through the writer flow: safe against a
        # concurrent commit taking the token, unlike deleting staged keys.
        branch, _ = self.core.branch(repo, branch_name)
        head = self.refs.get_commit(repo, branch.commit_id).metarange_id
        reverts: list[tuple[str, Entry | None]] = []
        scope = path if path else prefix
        for staged_path, value in self.reads.uncommitted_values(repo, branch, head, scope, ""):
            if path and staged_path != path:
                break
            committed = self.core.committed.get_entry(repo.storage_namespace, head, staged_path)
            if change_against(staged_path, value, committed) is not None:
                reverts.append((staged_path, committed))
        if reverts:
            self.write(repo, branch_name, reverts)
        return len(reverts)

    def discard_all(self, repo: Repository, branch_name: str) -> None:
        """A fresh token, no sealed tokens, no compacted metarange, same HEAD."""

        def clean(branch: types_pb2.Branch) -> types_pb2.Branch:
            # The tokens this record change retires are queued first (dropped once the
            # branch no longer references them: queue_retiring_tokens).
            self.staging.queue_retiring_tokens(
                [branch.staging_token, *branch.sealed_tokens], repo.partition, branch_name
            )
            return types_pb2.Branch(
                name=branch_name,
                commit_id=branch.commit_id,
                staging_token=new_token(repo.staging_shards),
                dirty=False,
            )

        self.refs.update_branch(repo, branch_name, clean, step="discard")
        self.core.forget_branch(repo, branch_name)


__all__ = [
    "DEFAULT_MAX_STREAM_BYTES",
    "DEFAULT_MAX_STREAM_ENTRIES",
    "PutStreamLimits",
    "PutStreamTooLarge",
    "StagedCount",
    "TokenMoved",
    "Writes",
    "batch_items",
]
