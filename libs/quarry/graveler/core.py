"""What every flow of the core shares: the stores, the ref and staging managers, the
writers' branch cache, and small helpers (docs/architecture.md §4).

The flows (reads, writes, commits, merges, repositories) each take a `Core`; the `Graveler`
facade (quarry.graveler.graveler) composes them.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from google.protobuf import timestamp_pb2
from opentelemetry import trace

from quarry import errors
from quarry.blob.ownership import NamespaceClaim
from quarry.config import Settings
from quarry.graveler import errors as gerrors
from quarry.graveler import names
from quarry.graveler.model import ApplyResult, Change, Entry, MergeResult, MergeStrategy
from quarry.graveler.protection import BranchProtection
from quarry.graveler.reach import AddressRules
from quarry.graveler.refs import RefManager, Repository
from quarry.graveler.retry import DEFAULT_RETRIES, Retries
from quarry.graveler.staging import StagingManager
from quarry.kv import store as kv
from quarry.lru import TTLCache
from quarry.paging import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, PageBudget
from quarry.v1 import types_pb2

if TYPE_CHECKING:
    import pyarrow as pa

DEFAULT_MAX_RESPONSE_BYTES = Settings.max_response_bytes

tracer = trace.get_tracer("quarry.graveler")


class CommittedReader(Protocol):
    """What the core reads from committed storage (quarry.committed.CommittedManager)."""

    def get_entry(self, namespace: str, metarange_id: str, path: str) -> Entry | None: ...

    def iterate(
        self, namespace: str, metarange_id: str, start: str = "", prefix: str = ""
    ) -> Iterator[Entry]: ...

    def diff(
        self, namespace: str, left_id: str, right_id: str, prefix: str = "", start: str = ""
    ) -> Iterator[Change]: ...

    # The files these metaranges need that the namespace does not hold (a restore's check).
    def missing_files(self, namespace: str, metarange_ids: Iterable[str]) -> list[str]: ...


class RangeWriterClient(Protocol):
    """What the core asks range-writer to write (local manager or RemoteRangeWriter)."""

    def apply_changes(
        self,
        namespace: str,
        base_metarange_id: str,
        changes: Iterable[tuple[str, Entry | None]],
    ) -> ApplyResult: ...

    def write_metarange(self, namespace: str, entries: Iterable[Entry]) -> ApplyResult: ...

    # The same for entries in columns (quarry.committed.columns): an import's listing.
    def write_columns(self, namespace: str, batches: Iterable[pa.RecordBatch]) -> ApplyResult: ...

    def replace_prefixes(
        self,
        namespace: str,
        base_metarange_id: str,
        prefixes: Sequence[str],
        import_metarange_id: str,
    ) -> ApplyResult: ...

    def merge_metaranges(  # noqa: PLR0913 — the range-writer's RPC, field for field
        self,
        namespace: str,
        base_id: str,
        source_id: str,
        destination_id: str,
        strategy: MergeStrategy = MergeStrategy.DEFAULT,
        max_conflicts: int = 100,
        dry_run: bool = False,
    ) -> MergeResult: ...

    def claim_namespace(
        self, namespace: str, marker: bytes, replace: bytes | None = None
    ) -> NamespaceClaim: ...


def check_page_size(requested: int) -> int:
    if requested < 0:
        raise errors.InvalidArgument("page_size may not be negative")
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def now_seconds() -> int:
    return int(time.time())


def commit_id_for(
    parents: list[str],
    metarange_id: str,
    message: str,
    committer: str,
    creation_seconds: int,
    metadata: dict[str, str],
) -> str:
    """Content address of a commit: identical content gives the identical id."""
    h = hashlib.sha256()

    def part(value: str) -> None:
        data = value.encode()
        h.update(len(data).to_bytes(4, "big"))
        h.update(data)

    part(str(len(parents)))
    for parent in parents:
        part(parent)
    part(metarange_id)
    part(message)
    part(committer)
    part(str(creation_seconds))
    for key in sorted(metadata):
        part(key)
        part(metadata[key])
    return h.hexdigest()


@dataclass(frozen=True)
class CommitRecord:
    """What a new commit record holds besides its id and time."""

    parents: list[str]
    metarange_id: str
    message: str
    committer: str
    metadata: dict[str, str]
    generation: int


def make_commit(record: CommitRecord) -> types_pb2.Commit:
    """A commit record stamped now, with its content address as id."""
    seconds = now_seconds()
    commit_id = commit_id_for(
        record.parents,
        record.metarange_id,
        record.message,
        record.committer,
        seconds,
        record.metadata,
    )
    return types_pb2.Commit(
        id=commit_id,
        parents=record.parents,
        metarange_id=record.metarange_id,
        message=record.message,
        committer=record.committer,
        creation_time=timestamp_pb2.Timestamp(seconds=seconds),
        metadata=record.metadata,
        generation=record.generation,
    )


class Core:
    """The state every flow shares."""

    def __init__(  # noqa: PLR0913 — Graveler's public constructor: the parts, then tunables
        self,
        store: kv.Store,
        committed: CommittedReader,
        range_writer: RangeWriterClient,
        dirty_read_optimization: bool = True,
        branch_cache_seconds: float = 1.0,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        retries: Retries = DEFAULT_RETRIES,
    ) -> None:
        self.kv = store
        self.retries = retries
        self.refs = RefManager(store, retry=retries.branch)
        self.staging = StagingManager(store)
        self.protection = BranchProtection(store)
        # Where staged addresses and import sources may point (its Reach set by wiring).
        self.addresses = AddressRules(self.refs)
        self.committed = committed
        self.range_writer = range_writer
        # quarry.actions.runs.Actions when the service runs hooks (the committer); None: off.
        self.actions: Any = None
        self.dirty_read_optimization = dirty_read_optimization
        # Pages end before their encoded size passes this (quarry.paging).
        self.max_response_bytes = max_response_bytes
        self._branch_cache_seconds = branch_cache_seconds
        # Writers may start from a slightly stale branch record: the validation read after
        # the staging write catches any change of token.
        # (repository, instance id, branch) → (branch, predicate), for branch_cache_seconds
        self._write_cache = TTLCache(branch_cache_seconds)

    def repo(self, name: str) -> Repository:
        """The repository record, possibly cached (RefManager.REPOSITORY_TTL_SECONDS): for
        reads, and for the writer flow, whose validation read re-checks the instance."""
        names.check_repository_name(name)
        return self.refs.get_repository(name)

    def live_repo(self, name: str) -> Repository:
        """The repository record read fresh (one KV get), for every flow that changes refs
        (commit, merge, revert, cherry-pick, compact, reset, discard, deletes, branches,
        tags, settings). A cached record may name an instance deleted and re-created within
        the cache window, whose records still exist until its partition is dropped: such a
        flow must NEVER act on that dead instance (a commit would answer NO_CHANGES, or
        commit into it, while the write it should take sits in the new repository). A flow
        that starts after the re-creation so always acts on the new instance; one that read
        the record before the deletion acts as if it had finished before it."""
        names.check_repository_name(name)
        return self.refs.get_repository(name, fresh=True)

    def budget(self, requested: int) -> PageBudget:
        """One page's budget: the requested (or default) number of items, and no more
        than `max_response_bytes` of encoded response (quarry.paging)."""
        return PageBudget.for_response(check_page_size(requested), self.max_response_bytes)

    def branch(self, repo: Repository, name: str) -> tuple[types_pb2.Branch, bytes]:
        """The branch record for an operation that needs a branch (fresh read); a tag or
        commit named instead gets FAILED_PRECONDITION / NOT_A_BRANCH."""
        try:
            return self.refs.get_branch(repo, name)
        except gerrors.BranchNotFound as missing:
            raise self.not_a_branch(repo, name, missing) from None

    def not_a_branch(
        self, repo: Repository, name: str, missing: gerrors.BranchNotFound
    ) -> errors.QuarryError:
        """NotABranch if `name` is a tag, else the BranchNotFound given."""
        try:
            self.refs.get_tag(repo, name)
        except gerrors.TagNotFound:
            return missing
        return gerrors.NotABranch(
            f"{name!r} is a tag; writes and uncommitted changes need a branch",
            metadata={"repository": repo.name, "ref": name},
        )

    # ---- the writers' branch cache ---------------------------------------------------------

    def cached_branch(self, repo: Repository, name: str) -> tuple[types_pb2.Branch, bytes]:
        key = (repo.name, repo.instance_id, name)
        cached = self._write_cache.get(key)
        if cached is not None:
            return cached
        branch, predicate = self.branch(repo, name)
        self._write_cache.put(key, (branch, predicate))
        return branch, predicate

    def peek_branch(self, repo: Repository, name: str) -> types_pb2.Branch | None:
        """The cached record of branch `name`, if any (never a read): a hint, e.g. of which
        staging token to look into, that whoever uses it checks against a fresh read."""
        cached = self._write_cache.get((repo.name, repo.instance_id, name))
        return None if cached is None else cached[0]

    def remember_branch(self, repo: Repository, branch: types_pb2.Branch, predicate: bytes) -> None:
        self._write_cache.put((repo.name, repo.instance_id, branch.name), (branch, predicate))

    def forget_branch(self, repo: Repository, name: str) -> None:
        self._write_cache.pop((repo.name, repo.instance_id, name))


__all__ = [
    "CommitRecord",
    "commit_id_for",
    "CommittedReader",
    "Core",
    "RangeWriterClient",
    "make_commit",
]
