"""Graveler: the versioning core's facade. Every flow reads top to bottom here.

Flows follow ARCHITECTURE.md §4: the branch record is the only compare-and-swap point;
writers set `dirty` before writing to staging and validate the staging token afterwards;
readers layer staging token (only when dirty) → sealed tokens → committed metarange and
validate the branch when they read any staging layer; commits seal, apply, and swap.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Protocol, Sequence

from google.protobuf import timestamp_pb2
from opentelemetry import trace
from prometheus_client import Counter

from quarry import errors
from quarry.blob.namespace import (namespace_location, namespaces_overlap,
                                   normalize_storage_namespace)
from quarry.blob.ownership import (MARKER_KEY, InvalidMarker, NamespaceClaim, NamespaceInUse,
                                   NamespaceNotEmpty, build_marker, parse_marker)
from quarry.config import Settings
from quarry.graveler import errors as gerrors
from quarry.graveler import records
from quarry.graveler import names
from quarry.graveler.iterators import (CommittedSource, LayeredIterator, decode_page_token,
                                       encode_page_token, string_after_prefix)
from quarry.graveler.model import (ApplyResult, Change, ChangeType, Conflict, DiffSummary,
                                   Entry, MergeResult, MergeStrategy)
from quarry.graveler.refs import (BRANCHES_PREFIX, REPOS_PREFIX, TAGS_PREFIX, RefManager,
                                  Repository, ResolvedRef, commit_id_for, is_dirty, prefix_end)
from quarry.graveler.staging import StagingManager, new_token
from quarry.kv import store as kv
from quarry.kv.partitions import staging_partition
from quarry.paging import PageBudget
from quarry.runtime.format_version import ensure_installation_id
from quarry.v1 import types_pb2

log = logging.getLogger(__name__)

BRANCH_READS = Counter("graveler_branch_reads", "Reads (stat/list) on branches",
                       ["repo", "branch", "dirty", "op"])
STAGING_READ_ATTEMPTS = Counter("graveler_staging_read_attempts",
                                "Reads that looked into a staging token",
                                ["repo", "branch", "op"])

MAX_ATTEMPTS = 10
MAX_MERGE_ATTEMPTS = 5
MAX_CONFLICTS_REPORTED = 100
MERGE_HINTS_PREFIX = b"mergehints/"
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 10_000
INITIAL_COMMIT_MESSAGE = "Repository created"
# A repository creation announced longer ago than this is taken as interrupted (creations
# take well under a second; one that passes half of this gives up before becoming visible).
CREATION_TTL_SECONDS = 600.0
SYSTEM_COMMITTER = "quarry"


class CommittedReader(Protocol):
    """What the core reads from committed storage (quarry.committed.CommittedManager)."""

    def get_entry(self, namespace: str, metarange_id: str, path: str) -> Entry | None: ...

    def iterate(self, namespace: str, metarange_id: str, start: str = "",
                prefix: str = ""): ...

    def diff(self, namespace: str, left_id: str, right_id: str, prefix: str = "",
             start: str = "") -> Iterator[Change]: ...


class RangeWriterClient(Protocol):
    """What the core asks range-writer to write (local manager or RemoteRangeWriter)."""

    def apply_changes(self, namespace: str, base_metarange_id: str,
                      changes: Iterable[tuple[str, Entry | None]]) -> ApplyResult: ...

    def write_metarange(self, namespace: str, entries: Iterable[Entry]) -> ApplyResult: ...

    def merge_metaranges(self, namespace: str, base_id: str, source_id: str,
                         destination_id: str, strategy: MergeStrategy = MergeStrategy.DEFAULT,
                         max_conflicts: int = 100, dry_run: bool = False) -> MergeResult: ...

    def claim_namespace(self, namespace: str, marker: bytes,
                        replace: bytes | None = None) -> NamespaceClaim: ...


@dataclass
class Layers:
    """What a read of a ref consults, newest first."""

    repo: Repository
    tokens: list[str]
    base_metarange_id: str
    branch: types_pb2.Branch | None = None
    branch_name: str | None = None


@dataclass
class MergeOutcome:
    commit: types_pb2.Commit | None  # None on a dry run
    summary: DiffSummary
    base_commit_id: str
    conflicts: tuple[Conflict, ...] = ()
    more_conflicts: int = 0
    attempts: int = 1
    ranges_written: int = 0
    ranges_reused: int = 0


@dataclass
class CommitOutcome:
    commit: types_pb2.Commit
    summary: DiffSummary = field(default_factory=DiffSummary)
    ranges_written: int = 0
    ranges_reused: int = 0


_tracer = trace.get_tracer("quarry.graveler")


def _cas_retry(what: str, attempt: int) -> None:
    """A lost compare-and-swap, as an event on the current span."""
    trace.get_current_span().add_event("cas.retry", {"step": what, "attempt": attempt})


def _backoff(attempt: int) -> None:
    time.sleep(min(0.2, 0.002 * (2 ** attempt)) * random.uniform(0.5, 1.0))


def _page_size(requested: int) -> int:
    if requested < 0:
        raise errors.InvalidArgument("page_size may not be negative")
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


DEFAULT_MAX_RESPONSE_BYTES = Settings.max_response_bytes


def _now_seconds() -> int:
    return int(time.time())


def _wall_clock() -> float:
    """Seconds since the epoch, comparable across processes (creation announcements)."""
    return time.time()


class StagedCount(int):
    """What put_objects / delete_objects return: the number of paths staged (an int, as
    before) carrying `staging_token`, the token the write was acknowledged on ("" when
    nothing was written), so branch-manager can report staging activity per token to the
    compactor-sensor without another branch read."""

    staging_token: str

    def __new__(cls, count: int, staging_token: str = "") -> "StagedCount":
        value = super().__new__(cls, count)
        value.staging_token = staging_token
        return value


class Graveler:
    def __init__(self, store: kv.Store, committed: CommittedReader,
                 range_writer: RangeWriterClient, dirty_read_optimization: bool = True,
                 branch_cache_seconds: float = 1.0,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES):
        self.kv = store
        self.refs = RefManager(store)
        self.staging = StagingManager(store)
        self.committed = committed
        self.range_writer = range_writer
        self.dirty_read_optimization = dirty_read_optimization
        # Pages end before their encoded size passes this (quarry.paging).
        self.max_response_bytes = max_response_bytes
        self._branch_cache_seconds = branch_cache_seconds
        # Writers may start from a slightly stale branch record: the validation read after
        # the staging write catches any change of token.
        self._write_cache: dict[tuple[str, str, str], tuple[float, types_pb2.Branch, bytes]] = {}
        self._installation_id: str | None = None

    # ==== repositories ======================================================================

    def create_repository(self, name: str, storage_namespace: str,
                          default_branch: str = "main") -> Repository:
        names.check_repository_name(name)
        default_branch = default_branch or "main"
        names.check_branch_name(default_branch)
        storage_namespace = normalize_storage_namespace(storage_namespace)
        repo = Repository(name=name, storage_namespace=storage_namespace,
                          default_branch=default_branch, instance_id=uuid.uuid4().hex,
                          creation_time=_now_seconds())
        # Announce the creation BEFORE looking for overlapping namespaces: of two creations
        # of nested namespaces racing, the later look sees the other (its announcement, or
        # its record once visible: an announcement is removed only after the record exists).
        started = _wall_clock()
        self.refs.add_creation(repo, started)
        try:
            self._check_namespace_free(repo)
            # Order: the ownership marker claims the namespace, then everything the
            # repository needs exists, all BEFORE the repository record that makes it
            # visible. A failure leaves only an unreachable instance partition and a marker
            # of a deleted instance.
            try:
                self._claim_namespace(repo)
                empty = self.range_writer.write_metarange(storage_namespace, [])
                initial = self._make_commit([], empty.metarange_id, INITIAL_COMMIT_MESSAGE,
                                            SYSTEM_COMMITTER, {}, generation=1)
                self.refs.insert_commit(repo, initial)
                branch = types_pb2.Branch(name=default_branch, commit_id=initial.id,
                                          staging_token=new_token(), dirty=False)
                self.refs.set_branch_if(repo, branch, kv.ABSENT)
                if _wall_clock() - started > CREATION_TTL_SECONDS / 2:
                    # Others ignore announcements older than CREATION_TTL_SECONDS: never
                    # become visible that late.
                    raise errors.Aborted(f"creating repository {name!r} took too long; "
                                         f"nothing was created, retry")
                self.refs.insert_repository(repo)
            except BaseException as exc:
                # The marker may now name an instance that will never become visible (even
                # when the claim itself failed: its answer may be what was lost): let a
                # later creation reuse the namespace (a live record still wins, see
                # _check_reusable).
                try:
                    self.refs.record_deleted_instance(repo)
                except Exception:  # noqa: BLE001 — the original error is the one to report
                    log.warning("could not record the failed creation of %s", repo.name,
                                exc_info=True)
                if isinstance(exc, gerrors.RepositoryExists):
                    self.staging.queue_drop([repo.partition])
                raise
        finally:
            try:
                self.refs.remove_creation(repo)
            except Exception:  # noqa: BLE001 — it expires (CREATION_TTL_SECONDS)
                log.warning("could not remove the creation record of %s", repo.name,
                            exc_info=True)
        return repo

    def installation_id(self) -> str:
        if self._installation_id is None:
            self._installation_id = ensure_installation_id(self.kv)
        return self._installation_id

    def _check_namespace_free(self, repo: Repository) -> None:
        """A namespace may not contain or lie inside the namespace of another repository
        being created, nor equal, contain or lie inside that of an existing one. A taken
        name is ALREADY_EXISTS as before. (Two creations of the SAME namespace are settled
        by the marker instead: exactly one claims it.)"""
        name, storage_namespace = repo.name, repo.storage_namespace
        now = _wall_clock()
        for other in self.refs.list_creations():
            if other.instance_id == repo.instance_id or \
                    other.started < now - CREATION_TTL_SECONDS:
                continue  # ours, or interrupted long ago
            if self._overlaps(storage_namespace, other.storage_namespace, other.repository) \
                    and namespace_location(storage_namespace) != \
                    namespace_location(other.storage_namespace):
                raise NamespaceInUse(
                    f"storage namespace {storage_namespace} overlaps the namespace "
                    f"{other.storage_namespace} of repository {other.repository!r}, being "
                    f"created", metadata={"storage_namespace": storage_namespace,
                                          "other_repository": other.repository,
                                          "other_storage_namespace": other.storage_namespace})
        after = ""
        while True:
            # A corrupt repository record is skipped (logged and counted), so it cannot block
            # every creation; its namespace still holds its marker, which refuses an equal
            # namespace, and `quarry doctor` names the record.
            with records.listing():
                repos = self.refs.list_repositories(after, 1000)
            for other in repos:
                if other.name == name:
                    raise gerrors.RepositoryExists(f"repository {name!r} already exists",
                                                   metadata={"repository": name})
                if self._overlaps(storage_namespace, other.storage_namespace, other.name):
                    raise NamespaceInUse(
                        f"storage namespace {storage_namespace} overlaps the namespace "
                        f"{other.storage_namespace} of repository {other.name!r}: a namespace "
                        f"may not equal, contain or lie inside another repository's",
                        metadata={"storage_namespace": storage_namespace,
                                  "other_repository": other.name,
                                  "other_storage_namespace": other.storage_namespace})
            if len(repos) < 1000:
                return
            after = repos[-1].name

    @staticmethod
    def _overlaps(storage_namespace: str, other: str, other_name: str) -> bool:
        try:
            return namespaces_overlap(storage_namespace, other)
        except gerrors.InvalidStorageNamespace:
            log.warning("repository %s has an unparsable namespace %r", other_name, other)
            return False

    def _claim_namespace(self, repo: Repository) -> None:
        """Write the ownership marker through the range-writer: into an empty namespace, or
        over the marker of a deleted repository of this installation (only then, and only
        if nothing but Quarry's own files is there). Never claims a namespace holding
        anyone else's files, and of two creations racing for one namespace exactly one
        wins (the marker is written if absent / if equal)."""
        ns = repo.storage_namespace
        marker = build_marker(repo.name, repo.instance_id, self.installation_id()).to_bytes()
        claim = self.range_writer.claim_namespace(ns, marker)
        if claim.claimed:
            return
        if claim.existing_marker is None:
            raise NamespaceNotEmpty(
                f"storage namespace {ns} is not empty (it holds {claim.keys[0]!r}"
                f"{' and more' if len(claim.keys) > 1 else ''}): a repository needs an empty "
                f"namespace, or one left by a deleted repository of this installation",
                metadata={"storage_namespace": ns, "example_key": claim.keys[0]})
        self._check_reusable(ns, claim)
        claim = self.range_writer.claim_namespace(ns, marker, replace=claim.existing_marker)
        if not claim.claimed:
            raise NamespaceInUse(f"storage namespace {ns} was just claimed by another "
                                 f"repository", metadata={"storage_namespace": ns})

    def _check_reusable(self, ns: str, claim) -> None:
        """Raise unless the marker found is that of a deleted repository of this
        installation and the namespace holds nothing but Quarry's own files."""
        from quarry.retention import FOREIGN, classify

        try:
            found = parse_marker(claim.existing_marker)
        except InvalidMarker as exc:
            raise NamespaceNotEmpty(f"storage namespace {ns} holds an unreadable ownership "
                                    f"marker ({exc})", metadata={"storage_namespace": ns})
        meta = {"storage_namespace": ns, "other_repository": found.repository,
                "other_instance_id": found.instance_id}
        if found.installation_id != self.installation_id():
            raise NamespaceNotEmpty(
                f"storage namespace {ns} belongs to repository {found.repository!r} of "
                f"another Quarry installation", metadata=meta)
        try:
            live = self.refs.get_repository(found.repository, fresh=True)
        except gerrors.RepositoryNotFound:
            live = None
        if live is not None and live.instance_id == found.instance_id:
            raise NamespaceInUse(f"storage namespace {ns} is used by repository "
                                 f"{found.repository!r}", metadata=meta)
        if not self.refs.is_deleted_instance(found.instance_id):
            raise NamespaceInUse(
                f"storage namespace {ns} is being claimed by repository {found.repository!r} "
                f"(or its creation was interrupted: if no repository uses the namespace, "
                f"remove {MARKER_KEY} there)", metadata=meta)
        foreign = [k for k in claim.keys if classify(k).kind == FOREIGN]
        if foreign or claim.keys_truncated:
            example = foreign[0] if foreign else claim.keys[-1]
            raise NamespaceNotEmpty(
                f"storage namespace {ns} was left by deleted repository {found.repository!r} "
                f"but holds " + (f"files Quarry did not write (e.g. {example!r})" if foreign
                                 else "too many files to check; empty it first"),
                metadata={**meta, "example_key": example})

    def get_repository(self, name: str) -> Repository:
        names.check_repository_name(name)
        return self.refs.get_repository(name, fresh=True)

    @records.skips_corrupt_records
    def list_repositories(self, page_size: int = 0, page_token: str = ""
                          ) -> tuple[list[Repository], str]:
        return _page_by_name(self.refs.list_repositories, self._budget(page_size),
                             page_token, REPOS_PREFIX)

    @records.skips_corrupt_records  # a corrupt branch record is dropped with the partition
    def delete_repository(self, name: str) -> None:
        repo = self.get_repository(name)
        tokens = []
        after = ""
        while True:
            branches = self.refs.list_branches(repo, after, 1000)
            for branch in branches:
                tokens.append(branch.staging_token)
                tokens.extend(branch.sealed_tokens)
            if len(branches) < 1000:
                break
            after = branches[-1].name
        # Recorded before the record goes: its namespace may then be reused (ownership).
        self.refs.record_deleted_instance(repo)
        self.refs.delete_repository_record(name)
        self.staging.queue_drop([repo.partition, *_staging_partitions(tokens)])

    def _repo(self, name: str) -> Repository:
        names.check_repository_name(name)
        return self.refs.get_repository(name)

    def _budget(self, page_size: int) -> PageBudget:
        """One page's budget: the requested (or default) number of items, and no more
        than `max_response_bytes` of encoded response (quarry.paging)."""
        return PageBudget.for_response(_page_size(page_size), self.max_response_bytes)

    # ==== branches ============================================================================

    def create_branch(self, repo_name: str, name: str, source_ref: str) -> types_pb2.Branch:
        repo = self._repo(repo_name)
        names.check_branch_name(name)
        resolved = self.refs.resolve(repo, source_ref or repo.default_branch)
        branch = types_pb2.Branch(name=name, commit_id=resolved.commit_id,
                                  staging_token=new_token(), dirty=False)
        try:
            self.refs.set_branch_if(repo, branch, kv.ABSENT)
        except kv.PredicateFailed:
            raise gerrors.BranchExists(f"branch {name!r} already exists",
                                       metadata={"repository": repo.name,
                                                 "branch": name}) from None
        return branch

    def get_branch(self, repo_name: str, name: str) -> types_pb2.Branch:
        repo = self._repo(repo_name)
        names.check_branch_name(name)
        return self.refs.get_branch(repo, name)[0]

    @records.skips_corrupt_records
    def list_branches(self, repo_name: str, page_size: int = 0, page_token: str = ""
                      ) -> tuple[list[types_pb2.Branch], str]:
        repo = self._repo(repo_name)
        return _page_by_name(lambda after, limit: self.refs.list_branches(repo, after, limit),
                             self._budget(page_size), page_token, BRANCHES_PREFIX)

    def delete_branch(self, repo_name: str, name: str) -> None:
        repo = self._repo(repo_name)
        names.check_branch_name(name)
        if name == repo.default_branch:
            raise gerrors.ProtectedBranch(f"{name!r} is the default branch of {repo.name!r} "
                                          f"and cannot be deleted",
                                          metadata={"repository": repo.name, "branch": name})
        branch, _ = self.refs.get_branch(repo, name)
        self.refs.delete_branch_record(repo, name)
        self._forget_branch(repo, name)
        self.staging.queue_drop_tokens([branch.staging_token, *branch.sealed_tokens])

    def reset_branch(self, repo_name: str, name: str, ref: str, force: bool = False
                     ) -> types_pb2.Branch:
        """Hard reset: the branch points at `ref` with no uncommitted changes."""
        repo = self._repo(repo_name)
        names.check_branch_name(name)
        target = self.refs.resolve(repo, ref).commit_id
        for attempt in range(MAX_ATTEMPTS):
            branch, predicate = self.refs.get_branch(repo, name)
            if not force and self._has_uncommitted(repo, branch):
                raise gerrors.DirtyBranch(
                    f"branch {name!r} has uncommitted changes; commit or discard them, or "
                    f"reset with force", metadata={"repository": repo.name, "branch": name})
            reset = types_pb2.Branch(name=name, commit_id=target, staging_token=new_token(),
                                     dirty=False)
            try:
                self.refs.set_branch_if(repo, reset, kv.Equals(predicate))
            except kv.PredicateFailed:
                _backoff(attempt)
                continue
            self._forget_branch(repo, name)
            self.staging.queue_drop_tokens([branch.staging_token, *branch.sealed_tokens])
            return reset
        raise gerrors.BranchContended(f"branch {name!r} kept changing during reset")

    # ==== tags ===============================================================================

    def create_tag(self, repo_name: str, name: str, ref: str) -> types_pb2.Tag:
        repo = self._repo(repo_name)
        names.check_tag_name(name)
        tag = types_pb2.Tag(name=name, commit_id=self.refs.resolve(repo, ref).commit_id)
        self.refs.insert_tag(repo, tag)
        return tag

    def get_tag(self, repo_name: str, name: str) -> types_pb2.Tag:
        repo = self._repo(repo_name)
        names.check_tag_name(name)
        return self.refs.get_tag(repo, name)

    @records.skips_corrupt_records
    def list_tags(self, repo_name: str, page_size: int = 0, page_token: str = ""
                  ) -> tuple[list[types_pb2.Tag], str]:
        repo = self._repo(repo_name)
        return _page_by_name(lambda after, limit: self.refs.list_tags(repo, after, limit),
                             self._budget(page_size), page_token, TAGS_PREFIX)

    def delete_tag(self, repo_name: str, name: str) -> None:
        repo = self._repo(repo_name)
        names.check_tag_name(name)
        self.refs.delete_tag(repo, name)

    # ==== settings =============================================================================

    def set_gc_rules(self, repo_name: str, rules: types_pb2.GarbageCollectionRules) -> None:
        from quarry.retention import RetentionRules

        repo = self._repo(repo_name)
        for branch in rules.branch_retention_days:
            names.check_branch_name(branch)
        RetentionRules.from_proto(rules)  # INVALID_ARGUMENT for days out of range
        self.refs.set_gc_rules(repo, rules)

    def get_gc_rules(self, repo_name: str) -> types_pb2.GarbageCollectionRules:
        return self.refs.get_gc_rules(self._repo(repo_name))

    def delete_gc_rules(self, repo_name: str) -> None:
        self.refs.delete_gc_rules(self._repo(repo_name))

    # ==== reads ================================================================================

    def _layers(self, repo: Repository, resolved: ResolvedRef, op: str) -> Layers:
        if resolved.branch is None:
            commit = self.refs.get_commit(repo, resolved.commit_id)
            return Layers(repo, [], commit.metarange_id)
        branch = resolved.branch_record
        dirty = is_dirty(branch)
        BRANCH_READS.labels(repo.name, branch.name, str(dirty).lower(), op).inc()
        tokens = list(branch.sealed_tokens)
        if dirty or not self.dirty_read_optimization:
            tokens.insert(0, branch.staging_token)
            STAGING_READ_ATTEMPTS.labels(repo.name, branch.name, op).inc()
        base = branch.compacted_metarange_id or \
            self.refs.get_commit(repo, branch.commit_id).metarange_id
        return Layers(repo, tokens, base, branch, branch.name)

    def _still_valid(self, layers: Layers) -> bool:
        """A read that consulted staging tokens is valid if none of them was retired
        meanwhile (a retired token may already be partly deleted, and what it held now lives
        in a base we did not read) and the base is the one we read.

        A seal alone (our staging token moved to the sealed list, a new token in front) does
        not invalidate: the new token only holds writes acknowledged after our branch read,
        which this read need not see."""
        if not layers.tokens:
            return True  # committed data only: immutable
        try:
            current, _ = self.refs.get_branch(layers.repo, layers.branch_name)
        except gerrors.BranchNotFound:
            return False
        before = layers.branch
        live = {current.staging_token, *current.sealed_tokens}
        return (all(token in live for token in layers.tokens)
                and current.commit_id == before.commit_id
                and current.compacted_metarange_id == before.compacted_metarange_id)

    def stat_object(self, repo_name: str, ref: str, path: str) -> Entry:
        repo = self._repo(repo_name)
        names.check_path(path)
        for attempt in range(MAX_ATTEMPTS):
            layers = self._layers(repo, self.refs.resolve(repo, ref), "get")
            found, value = self._lookup(layers, path)
            if self._still_valid(layers):
                if value is None:
                    raise gerrors.ObjectNotFound(f"{path!r} not found at {ref!r}",
                                                 metadata={"repository": repo.name, "ref": ref,
                                                           "path": path})
                return value
            _backoff(attempt)
        raise gerrors.BranchContended(f"ref {ref!r} kept changing during the read")

    def _lookup(self, layers: Layers, path: str) -> tuple[bool, Entry | None]:
        for token in layers.tokens:
            found, value, _ = self.staging.get(token, path)
            if found:
                return True, value
        entry = self.committed.get_entry(layers.repo.storage_namespace,
                                         layers.base_metarange_id, path)
        return entry is not None, entry

    def _iterator(self, layers: Layers, start: str, prefix: str) -> LayeredIterator:
        end = prefix_end(prefix.encode()) if prefix else None
        sources = [self.staging.scan(token, max(start, prefix), end) for token in layers.tokens]
        sources.append(CommittedSource(self.committed.iterate(
            layers.repo.storage_namespace, layers.base_metarange_id, start=start,
            prefix=prefix)))
        return LayeredIterator(sources)

    @records.skips_corrupt_records  # a corrupt staged value: its path is left out
    def list_objects(self, repo_name: str, ref: str, prefix: str = "", delimiter: str = "",
                     page_size: int = 0, page_token: str = ""
                     ) -> tuple[list[Entry], list[str], str]:
        repo = self._repo(repo_name)
        _page_size(page_size)  # INVALID_ARGUMENT before any read
        state = decode_page_token(page_token, "after")
        after = state.get("after", "")
        if after and not after.startswith(prefix):
            raise gerrors.InvalidPageToken("page_token belongs to another listing")
        for attempt in range(MAX_ATTEMPTS):
            layers = self._layers(repo, self.refs.resolve(repo, ref), "list")
            entries, prefixes, last = self._list_page(layers, prefix, delimiter, after,
                                                      state.get("skip_prefix", False),
                                                      self._budget(page_size))
            if self._still_valid(layers):
                token = ""
                if last is not None:
                    token = encode_page_token(after=last[0], skip_prefix=last[1])
                    following = string_after_prefix(last[0]) if last[1] else None
                    records.next_page_starts_at((following or last[0] + "\x00").encode())
                return entries, prefixes, token
            _backoff(attempt)
        raise gerrors.BranchContended(f"ref {ref!r} kept changing during the listing")

    def _list_page(self, layers: Layers, prefix: str, delimiter: str, after: str,
                   skip_prefix: bool, budget: PageBudget):
        """One page, entries and common prefixes counted into one budget; returns
        (entries, common prefixes, resume point or None at the end)."""
        if not after:
            start = prefix
        elif skip_prefix:
            start = string_after_prefix(after) or after
        else:
            start = after + "\x00"
        iterator = self._iterator(layers, start, prefix)
        entries: list[Entry] = []
        prefixes: list[str] = []
        last: tuple[str, bool] | None = None
        try:
            while True:
                try:
                    path, value = next(iterator)
                except StopIteration:
                    return entries, prefixes, None
                if not path.startswith(prefix):
                    if path > prefix:
                        return entries, prefixes, None
                    continue
                if value is None:
                    continue  # tombstone
                if delimiter:
                    cut = path.find(delimiter, len(prefix))
                    if cut >= 0:
                        common = path[:cut + len(delimiter)]
                        if not budget.admit(common):
                            return entries, prefixes, last
                        prefixes.append(common)
                        last = (common, True)
                        following = string_after_prefix(common)
                        if following is None:
                            return entries, prefixes, None
                        iterator.seek_ge(following)
                        continue
                if not budget.admit(value):
                    return entries, prefixes, last
                entries.append(value)
                last = (path, False)
        finally:
            iterator.close()

    # ==== writes ==============================================================================

    def put_objects(self, repo_name: str, branch_name: str, entries: Sequence[Entry],
                    if_absent: bool = False) -> StagedCount:
        repo = self._repo(repo_name)
        names.check_branch_name(branch_name)
        seen = {}
        for entry in entries:
            names.check_entry(entry)
            seen[entry.path] = entry  # the last write of a path in one batch wins
        items = sorted(seen.items())
        if not items:
            return StagedCount(0)
        if if_absent:
            if len(items) != 1:
                raise gerrors.InvalidEntry("if_absent applies to a single object")
            token = self._put_if_absent(repo, branch_name, items[0][1])
        else:
            token = self._write(repo, branch_name, items)
        return StagedCount(len(items), token)

    def delete_objects(self, repo_name: str, branch_name: str,
                       paths: Sequence[str]) -> StagedCount:
        """Stage tombstones for the paths that exist on the branch; others are no-ops."""
        repo = self._repo(repo_name)
        names.check_branch_name(branch_name)
        for path in paths:
            names.check_path(path)
        unique = sorted(set(paths))
        if not unique:
            return StagedCount(0)
        for attempt in range(MAX_ATTEMPTS):
            branch, _ = self._branch(repo, branch_name)
            layers = self._layers(repo, ResolvedRef(branch.commit_id, branch_name, branch),
                                  "delete")
            existing = []
            for path in unique:
                found, value = self._lookup(layers, path)
                if value is not None:
                    existing.append(path)
            if self._still_valid(layers):
                break
            _backoff(attempt)
        else:
            raise gerrors.BranchContended(f"branch {branch_name!r} kept changing")
        token = ""
        if existing:
            token = self._write(repo, branch_name, [(path, None) for path in existing])
        return StagedCount(len(existing), token)

    def _put_if_absent(self, repo: Repository, branch_name: str, entry: Entry) -> str:
        """Returns the staging token written to ("" if the entry was already there)."""
        for attempt in range(MAX_ATTEMPTS):
            repo = self._repo(repo.name)  # the current instance (see _write)
            branch, _ = self._branch(repo, branch_name)
            layers = self._layers(repo, ResolvedRef(branch.commit_id, branch_name, branch),
                                  "put")
            # The staging token is consulted even on a clean branch: the conditional write
            # below targets it.
            found, value, staged_predicate = self.staging.get(branch.staging_token, entry.path)
            if not found:
                found, value = self._lookup(layers, entry.path)
            if value is not None and value == entry:
                return ""  # our own write from an attempt whose token was sealed meanwhile
            if value is not None:
                raise gerrors.ObjectExists(f"{entry.path!r} already exists on {branch_name!r}",
                                           metadata={"repository": repo.name,
                                                     "branch": branch_name,
                                                     "path": entry.path})
            predicate = kv.Equals(staged_predicate) if staged_predicate is not None else kv.ABSENT
            try:
                return self._write(repo, branch_name, [(entry.path, entry)],
                                   predicate=predicate, expected_token=branch.staging_token)
            except _TokenMoved:
                _backoff(attempt)
            except kv.PredicateFailed:
                raise gerrors.ObjectExists(f"{entry.path!r} was written concurrently",
                                           metadata={"path": entry.path}) from None
        raise gerrors.BranchContended(f"branch {branch_name!r} kept changing")

    def _branch(self, repo: Repository, name: str) -> tuple[types_pb2.Branch, bytes]:
        """The branch record for an operation that needs a branch (fresh read); a tag or
        commit named instead gets FAILED_PRECONDITION / NOT_A_BRANCH."""
        try:
            return self.refs.get_branch(repo, name)
        except gerrors.BranchNotFound as missing:
            try:
                self.refs.get_tag(repo, name)
            except gerrors.TagNotFound:
                raise missing from None
            raise gerrors.NotABranch(f"{name!r} is a tag; writes and uncommitted changes need "
                                     f"a branch", metadata={"repository": repo.name,
                                                            "ref": name}) from None

    def _cached_branch(self, repo: Repository, name: str) -> tuple[types_pb2.Branch, bytes]:
        key = (repo.name, repo.instance_id, name)
        cached = self._write_cache.get(key)
        if cached is not None and time.monotonic() - cached[0] < self._branch_cache_seconds:
            return cached[1], cached[2]
        branch, predicate = self._branch(repo, name)
        self._write_cache[key] = (time.monotonic(), branch, predicate)
        return branch, predicate

    def _remember_branch(self, repo: Repository, branch: types_pb2.Branch,
                         predicate: bytes) -> None:
        self._write_cache[(repo.name, repo.instance_id, branch.name)] = (
            time.monotonic(), branch, predicate)

    def _forget_branch(self, repo: Repository, name: str) -> None:
        self._write_cache.pop((repo.name, repo.instance_id, name), None)

    def _write(self, repo: Repository, branch_name: str,
               items: Sequence[tuple[str, Entry | None]], predicate: kv.Predicate | None = None,
               expected_token: str | None = None) -> str:
        """The writer flow: dirty first, then staging, then validate the token. Returns the
        staging token the write was acknowledged on."""
        for attempt in range(MAX_ATTEMPTS):
            branch, branch_predicate = self._cached_branch(repo, branch_name)
            if expected_token is not None and branch.staging_token != expected_token:
                self._forget_branch(repo, branch_name)
                raise _TokenMoved()
            if not is_dirty(branch):
                marked = types_pb2.Branch()
                marked.CopyFrom(branch)
                marked.dirty = True
                try:
                    branch_predicate = self.refs.set_branch_if(repo, marked,
                                                               kv.Equals(branch_predicate))
                except kv.PredicateFailed:
                    self._forget_branch(repo, branch_name)
                    continue  # stale cache or a concurrent change: re-read, no sleep needed
                branch = marked
                self._remember_branch(repo, branch, branch_predicate)
            if predicate is None:
                self.staging.set_many(branch.staging_token, items)
            else:
                path, entry = items[0]
                self.staging.set_if(branch.staging_token, path, entry, predicate)
            # Validation: a fresh read of the repository and branch records in one batch.
            repo_key = self.refs.repository_key(repo.name)
            branch_key = self.refs.branch_key(repo, branch_name)
            repo_now, branch_now = self.kv.batch_get([repo_key, branch_key])
            if repo_now is None:
                raise gerrors.RepositoryNotFound(f"repository {repo.name!r} was deleted",
                                                 metadata={"repository": repo.name})
            current_repo = Repository.from_record(repo_now.value, repo_key[1])
            if current_repo.instance_id != repo.instance_id:
                # Deleted and re-created since our cached record: what we wrote went to the
                # dead instance (its partitions are queued for dropping). Write again into
                # the repository as it is now.
                self.refs.remember_repository(current_repo)
                if expected_token is not None:
                    raise _TokenMoved()
                repo = current_repo
                continue
            if branch_now is None:
                self._forget_branch(repo, branch_name)
                raise gerrors.BranchNotFound(f"branch {branch_name!r} not found",
                                             metadata={"repository": repo.name,
                                                       "branch": branch_name})
            current = records.decode_record(types_pb2.Branch, *branch_key, branch_now.value)
            self._remember_branch(repo, current, branch_now.predicate)
            if current.staging_token == branch.staging_token:
                return branch.staging_token
            # A commit sealed our token while we wrote: write again to the new token (the
            # same entry again is idempotent, whichever token the commit took).
            if expected_token is not None:
                raise _TokenMoved()
        raise gerrors.BranchContended(f"branch {branch_name!r} kept changing staging token "
                                      f"during the write; retry",
                                      metadata={"repository": repo.name, "branch": branch_name})

    # ==== uncommitted changes ===================================================================

    def _has_uncommitted(self, repo: Repository, branch: types_pb2.Branch) -> bool:
        if not is_dirty(branch) and not branch.sealed_tokens \
                and not branch.compacted_metarange_id:
            return False
        changes, _ = self._diff_uncommitted_page(repo, branch, "", "", self._budget(1))
        return bool(changes)

    @records.skips_corrupt_records
    def diff_uncommitted(self, repo_name: str, branch_name: str, prefix: str = "",
                         page_size: int = 0, page_token: str = ""
                         ) -> tuple[list[Change], str]:
        repo = self._repo(repo_name)
        names.check_branch_name(branch_name)
        _page_size(page_size)  # INVALID_ARGUMENT before any read
        after = decode_page_token(page_token, "after").get("after", "")
        for attempt in range(MAX_ATTEMPTS):
            branch, _ = self._branch(repo, branch_name)
            if not is_dirty(branch) and not branch.sealed_tokens \
                    and not branch.compacted_metarange_id:
                return [], ""  # clean: nothing to scan
            changes, token = self._diff_uncommitted_page(repo, branch, prefix, after,
                                                         self._budget(page_size))
            layers = Layers(repo, [branch.staging_token], "", branch, branch_name)
            if self._still_valid(layers):
                return changes, token
            _backoff(attempt)
        raise gerrors.BranchContended(f"branch {branch_name!r} kept changing")

    def _diff_uncommitted_page(self, repo: Repository, branch: types_pb2.Branch, prefix: str,
                               after: str, budget: PageBudget) -> tuple[list[Change], str]:
        head = self.refs.get_commit(repo, branch.commit_id).metarange_id
        changes: list[Change] = []
        for path, value in self._uncommitted_values(repo, branch, head, prefix, after):
            committed = self.committed.get_entry(repo.storage_namespace, head, path)
            change = _change_against(path, value, committed)
            if change is None:
                continue
            if not budget.admit(change):
                records.next_page_starts_at(changes[-1].path.encode() + b"\x00")
                return changes, encode_page_token(after=changes[-1].path)
            changes.append(change)
        return changes, ""

    def _staged_changes(self, tokens: list[str], prefix: str, after: str,
                        extra_sources: Sequence = ()) -> Iterator[tuple[str, Entry | None]]:
        """(path, newest staged value) over the tokens (newest first), then extra sources."""
        start = after + "\x00" if after else prefix
        end = prefix_end(prefix.encode()) if prefix else None
        merged = LayeredIterator([self.staging.scan(t, start, end) for t in tokens]
                                 + list(extra_sources))
        try:
            yield from merged
        finally:
            merged.close()

    def _uncommitted_values(self, repo: Repository, branch: types_pb2.Branch,
                            head_metarange: str, prefix: str, after: str
                            ) -> Iterator[tuple[str, Entry | None]]:
        """Every path with an uncommitted value, newest layer first: the staging and sealed
        tokens, then what compaction moved into the compacted metarange (the diff between
        the HEAD metarange and it; a removal shows as a tombstone)."""
        tokens = [branch.staging_token, *branch.sealed_tokens]
        extra = []
        if branch.compacted_metarange_id:
            start = after + "\x00" if after else ""
            compacted = self.committed.diff(repo.storage_namespace, head_metarange,
                                            branch.compacted_metarange_id, prefix=prefix,
                                            start=start)
            extra.append(_ChangeSource(compacted))
        return self._staged_changes(tokens, prefix, after, extra)

    def discard_changes(self, repo_name: str, branch_name: str, path: str = "",
                        prefix: str = "") -> int:
        """Discard uncommitted changes to one path, a prefix, or everything."""
        repo = self._repo(repo_name)
        names.check_branch_name(branch_name)
        if path and prefix:
            raise gerrors.InvalidPath("give a path or a prefix, not both")
        if path:
            names.check_path(path)
        if not path and not prefix:
            self._discard_all(repo, branch_name)
            return -1
        # Stage the committed value back (or a tombstone where nothing is committed) for
        # every uncommitted change in scope, through the writer flow: safe against a
        # concurrent commit taking the token, unlike deleting staged keys.
        branch, _ = self._branch(repo, branch_name)
        head = self.refs.get_commit(repo, branch.commit_id).metarange_id
        reverts: list[tuple[str, Entry | None]] = []
        scope = path if path else prefix
        for staged_path, value in self._uncommitted_values(repo, branch, head, scope, ""):
            if path and staged_path != path:
                break
            committed = self.committed.get_entry(repo.storage_namespace, head, staged_path)
            if _change_against(staged_path, value, committed) is not None:
                reverts.append((staged_path, committed))
        if reverts:
            self._write(repo, branch_name, reverts)
        return len(reverts)

    def _discard_all(self, repo: Repository, branch_name: str) -> None:
        """A fresh token, no sealed tokens, no compacted metarange, same HEAD."""
        for attempt in range(MAX_ATTEMPTS):
            branch, predicate = self.refs.get_branch(repo, branch_name)
            clean = types_pb2.Branch(name=branch_name, commit_id=branch.commit_id,
                                     staging_token=new_token(), dirty=False)
            try:
                self.refs.set_branch_if(repo, clean, kv.Equals(predicate))
            except kv.PredicateFailed:
                _backoff(attempt)
                continue
            self._forget_branch(repo, branch_name)
            self.staging.queue_drop_tokens([branch.staging_token, *branch.sealed_tokens])
            return
        raise gerrors.BranchContended(f"branch {branch_name!r} kept changing")

    # ==== commits ================================================================================

    def _make_commit(self, parents: list[str], metarange_id: str, message: str,
                     committer: str, metadata: dict[str, str], generation: int
                     ) -> types_pb2.Commit:
        seconds = _now_seconds()
        commit_id = commit_id_for(parents, metarange_id, message, committer, seconds, metadata)
        return types_pb2.Commit(id=commit_id, parents=parents, metarange_id=metarange_id,
                                message=message, committer=committer,
                                creation_time=timestamp_pb2.Timestamp(seconds=seconds),
                                metadata=metadata, generation=generation)

    def commit(self, repo_name: str, branch_name: str, message: str, committer: str = "",
               metadata: dict[str, str] | None = None, allow_empty: bool = False
               ) -> CommitOutcome:
        repo = self._repo(repo_name)
        names.check_branch_name(branch_name)
        metadata = dict(metadata or {})
        names.check_commit_metadata(message, metadata)
        with _tracer.start_as_current_span("graveler.commit", attributes={
                "quarry.repository": repo.name, "quarry.branch": branch_name}) as span:
            for attempt in range(MAX_ATTEMPTS):
                outcome = self._commit_attempt(repo, branch_name, message, committer,
                                               metadata, allow_empty)
                if outcome is not None:
                    span.set_attribute("quarry.commit", outcome.commit.id)
                    span.set_attribute("quarry.attempts", attempt + 1)
                    return outcome
                _cas_retry("commit", attempt + 1)
                _backoff(attempt)
        raise gerrors.BranchContended(f"commit on {branch_name!r} lost the race "
                                      f"{MAX_ATTEMPTS} times; retry",
                                      metadata={"repository": repo.name,
                                                "branch": branch_name})

    def _commit_attempt(self, repo: Repository, branch_name: str, message: str,
                        committer: str, metadata: dict[str, str], allow_empty: bool
                        ) -> CommitOutcome | None:
        """One attempt; None means "lost a race, start over"."""
        branch = self._seal(repo, branch_name)
        if branch is None:
            return None
        applied = list(branch.sealed_tokens)
        head = self.refs.get_commit(repo, branch.commit_id)
        base = branch.compacted_metarange_id or head.metarange_id
        # (2)+(3) Combine the sealed tokens (newest wins) and apply them onto the base.
        with _tracer.start_as_current_span("graveler.apply", attributes={
                "quarry.tokens": len(applied)}) as span:
            if applied:
                result = self.range_writer.apply_changes(
                    repo.storage_namespace, base, self._staged_changes(applied, "", ""))
            else:
                result = ApplyResult(metarange_id=base)
            span.set_attribute("quarry.ranges_written", result.ranges_written)
            span.set_attribute("quarry.ranges_reused", result.ranges_reused)
        if branch.compacted_metarange_id:
            # The apply counted changes against the compacted metarange; the commit's
            # summary is against HEAD (a walk of the ranges that differ only).
            result = ApplyResult(result.metarange_id, self._summary_between(
                repo, head.metarange_id, result.metarange_id), result.ranges_written,
                result.ranges_reused)
        if result.summary.total == 0 and not allow_empty \
                and result.metarange_id == head.metarange_id:
            # Nothing to commit; still retire the sealed tokens so they are not re-applied.
            if applied and not self._retire_tokens(repo, branch_name, branch, applied, None):
                return None
            raise gerrors.NoChanges(f"no changes to commit on {branch_name!r}",
                                    metadata={"repository": repo.name, "branch": branch_name})
        # (4) The commit record (content-addressed, so a retry writes the same key).
        commit = self._make_commit([head.id], result.metarange_id, message, committer,
                                   metadata, head.generation + 1)
        with _tracer.start_as_current_span("graveler.write_commit"):
            self.refs.insert_commit(repo, commit)
        # (5) Move the branch and drop exactly the tokens applied.
        if not self._retire_tokens(repo, branch_name, branch, applied, commit.id):
            return None
        return CommitOutcome(commit, result.summary, result.ranges_written, result.ranges_reused)

    def _seal(self, repo: Repository, branch_name: str) -> types_pb2.Branch | None:
        """(1) Seal: push the staging token onto the sealed list and install a fresh one
        with dirty=false, in one compare-and-swap. Only a dirty token can hold acknowledged
        writes, so a clean branch is not sealed. A lost swap (typically a writer marking the
        branch dirty) is re-read and retried at once."""
        with _tracer.start_as_current_span("graveler.seal"):
            return self._seal_attempts(repo, branch_name)

    def _seal_attempts(self, repo: Repository, branch_name: str) -> types_pb2.Branch | None:
        for attempt in range(MAX_ATTEMPTS):
            branch, predicate = self._branch(repo, branch_name)
            if not is_dirty(branch):
                return branch
            sealed = types_pb2.Branch()
            sealed.CopyFrom(branch)
            sealed.sealed_tokens.insert(0, branch.staging_token)
            sealed.staging_token = new_token()
            sealed.dirty = False
            try:
                self.refs.set_branch_if(repo, sealed, kv.Equals(predicate))
            except kv.PredicateFailed:
                _cas_retry("seal", attempt + 1)
                continue
            self._forget_branch(repo, branch_name)
            return sealed
        return None

    def _retire_tokens(self, repo: Repository, branch_name: str, expected: types_pb2.Branch,
                       applied: list[str], new_commit_id: str | None,
                       new_compacted: str | None = None) -> bool:
        """Set HEAD (a commit: the compacted metarange is cleared) or the compacted metarange
        (a compaction), and remove exactly `applied` from the sealed list, re-reading the
        record on conflicts caused by fields we do not own (a writer marking it dirty, a new
        seal in front, the sensor's guard). False if HEAD or the base moved, or the sealed
        list lost the tokens: the work must be redone."""
        with _tracer.start_as_current_span("graveler.swap_branch"):
            return self._retire_attempts(repo, branch_name, expected, applied, new_commit_id,
                                         new_compacted)

    def _retire_attempts(self, repo: Repository, branch_name: str, expected: types_pb2.Branch,
                         applied: list[str], new_commit_id: str | None,
                         new_compacted: str | None) -> bool:
        for attempt in range(MAX_ATTEMPTS):
            current, predicate = self.refs.get_branch(repo, branch_name)
            sealed = list(current.sealed_tokens)
            if (current.commit_id != expected.commit_id
                    or current.compacted_metarange_id != expected.compacted_metarange_id
                    or len(sealed) < len(applied)
                    or (applied and sealed[len(sealed) - len(applied):] != applied)):
                return False
            updated = types_pb2.Branch()
            updated.CopyFrom(current)
            del updated.sealed_tokens[:]
            updated.sealed_tokens.extend(sealed[:len(sealed) - len(applied)])
            if new_commit_id is not None:
                updated.commit_id = new_commit_id
                updated.compacted_metarange_id = ""
            if new_compacted is not None:
                updated.compacted_metarange_id = new_compacted
            try:
                self.refs.set_branch_if(repo, updated, kv.Equals(predicate))
            except kv.PredicateFailed:
                _cas_retry("swap_branch", attempt + 1)
                continue
            self._forget_branch(repo, branch_name)
            # (6) The dropper deletes the retired tokens' items after a grace period.
            self.staging.queue_drop_tokens(applied)
            return True
        return False

    def _summary_between(self, repo: Repository, left: str, right: str) -> DiffSummary:
        summary = DiffSummary()
        for change in self.committed.diff(repo.storage_namespace, left, right):
            summary.count(change.type)
        return summary

    # ==== staging compaction ==========================================================================

    def compact(self, repo_name: str, branch_name: str) -> tuple[str, int]:
        """Fold the branch's uncommitted changes into a compacted metarange (the seed
        staging-compaction): seal, apply every sealed token onto the compacted (or HEAD)
        metarange, then swap {compacted = new, drop exactly those tokens}. Reads then find
        those changes in one metarange instead of scanning staging partitions (a million
        tombstones cost nothing to list any more). Returns (compacted metarange id, number
        of tokens compacted)."""
        repo = self._repo(repo_name)
        names.check_branch_name(branch_name)
        with _tracer.start_as_current_span("graveler.compact", attributes={
                "quarry.repository": repo.name, "quarry.branch": branch_name}):
            return self._compact(repo, branch_name)

    def _compact(self, repo: Repository, branch_name: str) -> tuple[str, int]:
        for attempt in range(MAX_ATTEMPTS):
            branch = self._seal(repo, branch_name)
            if branch is None:
                _backoff(attempt)
                continue
            applied = list(branch.sealed_tokens)
            if not applied:
                return branch.compacted_metarange_id, 0
            head = self.refs.get_commit(repo, branch.commit_id)
            base = branch.compacted_metarange_id or head.metarange_id
            result = self.range_writer.apply_changes(
                repo.storage_namespace, base, self._staged_changes(applied, "", ""))
            if self._retire_tokens(repo, branch_name, branch, applied, None,
                                   new_compacted=result.metarange_id):
                return result.metarange_id, len(applied)
            _backoff(attempt)
        raise gerrors.BranchContended(f"branch {branch_name!r} kept changing during "
                                      f"compaction; retry",
                                      metadata={"repository": repo.name,
                                                "branch": branch_name})

    # ==== history and diffs =========================================================================

    def get_commit(self, repo_name: str, ref: str) -> types_pb2.Commit:
        repo = self._repo(repo_name)
        return self.refs.get_commit(repo, self.refs.resolve(repo, ref).commit_id)

    def log(self, repo_name: str, ref: str, first_parent: bool = False, page_size: int = 0,
            page_token: str = "") -> tuple[list[types_pb2.Commit], str]:
        repo = self._repo(repo_name)
        budget = self._budget(page_size)
        state = decode_page_token(page_token, "frontier")
        frontier = state.get("frontier") or [self.refs.resolve(repo, ref).commit_id]
        commits: list[types_pb2.Commit] = []
        walk = self.refs.log(repo, frontier, first_parent)
        for commit in walk:
            if not budget.admit(commit):
                # The next page starts with this commit. Its parents, already queued by the
                # walk, are walked after it once (LogWalk de-duplicates its queue and a
                # parent's generation is always lower).
                return commits, encode_page_token(frontier=[commit.id, *walk.frontier()])
            commits.append(commit)
            if budget.items >= budget.max_items:
                remaining = walk.frontier()
                return commits, encode_page_token(frontier=remaining) if remaining else ""
        return commits, ""

    def diff(self, repo_name: str, left_ref: str, right_ref: str, prefix: str = "",
             page_size: int = 0, page_token: str = "", three_dot: bool = False
             ) -> tuple[list[Change], str]:
        """Two-dot: left → right between committed states. Three-dot: the changes on the
        right since the merge base, CONFLICT where the left changed the same path
        differently."""
        repo = self._repo(repo_name)
        budget = self._budget(page_size)
        after = decode_page_token(page_token, "after").get("after", "")
        left = self.refs.get_commit(repo, self.refs.resolve(repo, left_ref).commit_id)
        right = self.refs.get_commit(repo, self.refs.resolve(repo, right_ref).commit_id)
        start = after + "\x00" if after else ""
        if three_dot:
            base_id = self.refs.merge_base(repo, left.id, right.id)
            base = self.refs.get_commit(repo, base_id).metarange_id if base_id else ""
            changes = self._three_dot(repo, base, left.metarange_id, right.metarange_id,
                                      prefix, start)
        else:
            changes = self.committed.diff(repo.storage_namespace, left.metarange_id,
                                          right.metarange_id, prefix=prefix, start=start)
        page: list[Change] = []
        for change in changes:
            if not budget.admit(change):
                return page, encode_page_token(after=page[-1].path)
            page.append(change)
        return page, ""

    def _three_dot(self, repo: Repository, base: str, left: str, right: str, prefix: str,
                   start: str) -> Iterator[Change]:
        namespace = repo.storage_namespace
        for change in self.committed.diff(namespace, base, right, prefix=prefix, start=start):
            before = self.committed.get_entry(namespace, base, change.path)
            on_left = self.committed.get_entry(namespace, left, change.path)
            left_changed = not _same_entry(on_left, before)
            if left_changed and not _same_entry(on_left, change.entry):
                yield Change(ChangeType.CONFLICT, change.path, change.entry)
            else:
                yield change

    # ==== merges ====================================================================================

    def find_merge_base(self, repo_name: str, left_ref: str, right_ref: str
                        ) -> types_pb2.Commit:
        repo = self._repo(repo_name)
        left = self.refs.resolve(repo, left_ref).commit_id
        right = self.refs.resolve(repo, right_ref).commit_id
        base = self.refs.merge_base(repo, left, right)
        if base is None:
            raise gerrors.NoMergeBase(f"{left_ref!r} and {right_ref!r} share no history",
                                      metadata={"left": left_ref, "right": right_ref})
        return self.refs.get_commit(repo, base)

    def merge(self, repo_name: str, source_ref: str, destination_branch: str,
              strategy: MergeStrategy = MergeStrategy.DEFAULT, message: str = "",
              committer: str = "", metadata: dict[str, str] | None = None,
              squash: bool = False, allow_empty: bool = False, dry_run: bool = False,
              hint_metarange_id: str = "") -> MergeOutcome:
        """Three-way merge of `source_ref` into a branch (ARCHITECTURE.md §4, the seed
        merge-retry-metarange-reuse): when the final swap loses to a moved HEAD, the retry
        merges the result just produced onto the new HEAD instead of starting over."""
        repo = self._repo(repo_name)
        names.check_branch_name(destination_branch)
        metadata = dict(metadata or {})
        names.check_commit_metadata(message, metadata)
        try:
            strategy = MergeStrategy(strategy)
        except ValueError:
            raise errors.InvalidArgument(f"unknown merge strategy {strategy!r}") from None
        source = self.refs.get_commit(repo, self.refs.resolve(repo, source_ref).commit_id)
        branch, _ = self._branch(repo, destination_branch)
        head = self.refs.get_commit(repo, branch.commit_id)
        base_id = self.refs.merge_base(repo, source.id, head.id)
        base_metarange = self.refs.get_commit(repo, base_id).metarange_id if base_id else ""
        if base_id == source.id and not allow_empty:
            raise gerrors.NoChanges(f"{source_ref!r} is already merged into "
                                    f"{destination_branch!r}",
                                    metadata={"repository": repo.name, "source": source.id})
        resume = self._usable_merge_hint(repo, hint_metarange_id, source.id, base_id, head.id)
        if not message:
            message = f"Merge {source_ref!r} into {destination_branch!r}"
        metadata.update({"quarry.merge.strategy": strategy.name.lower().replace("_", "-"),
                         "quarry.merge.source": source.id,
                         "quarry.merge.base": base_id or ""})
        parents_after_head = [] if squash else [source.id]
        with _tracer.start_as_current_span("graveler.merge", attributes={
                "quarry.repository": repo.name, "quarry.branch": destination_branch,
                "quarry.source": source.id, "quarry.base": base_id or ""}):
            return self._three_way_commit(
                repo, destination_branch, base_metarange, source.metarange_id, strategy,
                parents_after_head, message, committer, metadata, allow_empty, dry_run,
                base_commit_id=base_id or "", source_commit_id=source.id, resume=resume)

    def revert(self, repo_name: str, branch_name: str, ref: str, parent_number: int = 0,
               message: str = "", committer: str = "") -> MergeOutcome:
        """A commit undoing `ref`: the three-way merge (base = ref, source = its parent)."""
        repo = self._repo(repo_name)
        names.check_branch_name(branch_name)
        commit = self.refs.get_commit(repo, self.refs.resolve(repo, ref).commit_id)
        parent = self._chosen_parent(repo, commit, parent_number, "revert")
        return self._three_way_commit(
            repo, branch_name, commit.metarange_id, parent.metarange_id,
            MergeStrategy.DEFAULT, [], message or f"Revert {commit.message!r}", committer,
            {"quarry.revert": commit.id}, allow_empty=False, dry_run=False,
            base_commit_id=commit.id, source_commit_id=parent.id)

    def cherry_pick(self, repo_name: str, branch_name: str, ref: str, parent_number: int = 0,
                    message: str = "", committer: str = "") -> MergeOutcome:
        """A commit repeating `ref`'s change: the three-way merge (base = its parent)."""
        repo = self._repo(repo_name)
        names.check_branch_name(branch_name)
        commit = self.refs.get_commit(repo, self.refs.resolve(repo, ref).commit_id)
        parent = self._chosen_parent(repo, commit, parent_number, "cherry-pick")
        return self._three_way_commit(
            repo, branch_name, parent.metarange_id, commit.metarange_id,
            MergeStrategy.DEFAULT, [], message or commit.message,
            committer or commit.committer, {"quarry.cherry-pick": commit.id},
            allow_empty=False, dry_run=False, base_commit_id=parent.id,
            source_commit_id=commit.id)

    def _chosen_parent(self, repo: Repository, commit: types_pb2.Commit, parent_number: int,
                       action: str) -> types_pb2.Commit:
        parents = list(commit.parents)
        if not parents:
            raise gerrors.InvalidParent(f"cannot {action} {commit.id[:12]}: it has no parent")
        if len(parents) > 1 and parent_number == 0:
            raise gerrors.InvalidParent(f"{commit.id[:12]} is a merge commit: choose the "
                                        f"parent_number (1..{len(parents)}) to {action} against")
        number = parent_number or 1
        if not 1 <= number <= len(parents):
            raise gerrors.InvalidParent(f"{commit.id[:12]} has {len(parents)} parent(s); "
                                        f"parent_number {number} is out of range")
        return self.refs.get_commit(repo, parents[number - 1])

    def _three_way_commit(self, repo: Repository, branch_name: str, base_metarange: str,
                          source_metarange: str, strategy: MergeStrategy,
                          parents_after_head: list[str], message: str, committer: str,
                          metadata: dict[str, str], allow_empty: bool, dry_run: bool,
                          base_commit_id: str, source_commit_id: str,
                          resume: tuple[str, str] | None = None) -> MergeOutcome:
        """Merge (base → source) onto the branch HEAD and commit it.

        `resume` = (merged metarange, destination commit it was merged onto): the work of
        an earlier attempt. Retrying with base' = that destination, source' = that result,
        destination' = the new HEAD gives the results of the seed's correctness table, and
        ranges only the earlier attempt touched are not rewritten. (One difference from a
        merge from scratch is documented in quarry.committed.merge: a path both sides changed
        identically and the new HEAD changed again keeps the new HEAD's value.)"""
        written = reused = 0
        for attempt in range(MAX_MERGE_ATTEMPTS):
            branch, predicate = self._branch(repo, branch_name)
            if self._has_uncommitted(repo, branch):
                raise gerrors.DirtyBranch(
                    f"branch {branch_name!r} has uncommitted changes; commit or discard them "
                    f"first", metadata={"repository": repo.name, "branch": branch_name})
            head = self.refs.get_commit(repo, branch.commit_id)
            if resume is None:
                inputs = (base_metarange, source_metarange, head.metarange_id)
            else:
                merged_before, merged_onto = resume
                inputs = (self.refs.get_commit(repo, merged_onto).metarange_id, merged_before,
                          head.metarange_id)
            with _tracer.start_as_current_span("graveler.merge_metaranges", attributes={
                    "quarry.attempt": attempt + 1, "quarry.resumed": resume is not None}):
                result = self.range_writer.merge_metaranges(
                    repo.storage_namespace, *inputs, strategy=strategy,
                    max_conflicts=MAX_CONFLICTS_REPORTED, dry_run=dry_run)
            written += result.ranges_written
            reused += result.ranges_reused
            if result.conflicts or result.more_conflicts:
                if dry_run:
                    return MergeOutcome(None, result.summary, base_commit_id, result.conflicts,
                                        result.more_conflicts, attempt + 1)
                raise self._conflict_error(result, base_commit_id)
            if dry_run:
                return MergeOutcome(None, result.summary, base_commit_id, attempts=attempt + 1)
            if result.summary.total == 0 and not allow_empty \
                    and result.metarange_id == head.metarange_id:
                raise gerrors.NoChanges("the merge changes nothing on the destination",
                                        metadata={"repository": repo.name,
                                                  "branch": branch_name})
            parents = [head.id, *parents_after_head]
            generation = 1 + max(self.refs.get_commit(repo, p).generation for p in parents)
            commit = self._make_commit(parents, result.metarange_id, message, committer,
                                       metadata, generation)
            self.refs.insert_commit(repo, commit)
            updated = types_pb2.Branch()
            updated.CopyFrom(branch)
            updated.commit_id = commit.id
            try:
                self.refs.set_branch_if(repo, updated, kv.Equals(predicate))
            except kv.PredicateFailed:
                # HEAD moved (or a write made the branch dirty): keep this attempt's work.
                trace.get_current_span().add_event("merge.retry", {
                    "attempt": attempt + 1, "branch": branch_name,
                    "merged_metarange": result.metarange_id})
                resume = (result.metarange_id, head.id)
                _backoff(attempt)
                continue
            self._forget_branch(repo, branch_name)
            return MergeOutcome(commit, result.summary, base_commit_id, attempts=attempt + 1,
                                ranges_written=written, ranges_reused=reused)
        merged, onto = resume
        self._remember_merge_hint(repo, merged, source_commit_id, base_commit_id, onto)
        raise gerrors.HeadMoved(
            f"{branch_name!r} kept moving: the merge lost the race {MAX_MERGE_ATTEMPTS} times; "
            f"retry with hint_metarange_id to resume from the merged metarange",
            metadata={"hint_metarange_id": merged},
            details=[types_pb2.MergeRetryHint(hint_metarange_id=merged,
                                       source_commit_id=source_commit_id,
                                       base_commit_id=base_commit_id,
                                       attempts=MAX_MERGE_ATTEMPTS)])

    def _conflict_error(self, result: MergeResult, base_commit_id: str) -> gerrors.MergeConflict:
        from quarry.convert import conflict_to_proto

        total = len(result.conflicts) + result.more_conflicts
        shown = ", ".join(c.path for c in result.conflicts[:5])
        detail = types_pb2.MergeConflicts(
            conflicts=[conflict_to_proto(c) for c in result.conflicts],
            more=result.more_conflicts, base_commit_id=base_commit_id)
        return gerrors.MergeConflict(f"{total} conflicting path(s): {shown}"
                                     + (", ..." if total > 5 else ""),
                                     metadata={"conflicts": str(total)}, details=[detail])

    def _remember_merge_hint(self, repo: Repository, metarange_id: str, source: str,
                             base: str, destination: str) -> None:
        record = f"{source}\n{base}\n{destination}".encode()
        self.kv.set(repo.partition, MERGE_HINTS_PREFIX + metarange_id.encode(), record)

    def _usable_merge_hint(self, repo: Repository, hint: str, source: str, base: str | None,
                           head: str) -> tuple[str, str] | None:
        """A hint is used only if it was produced by merging this same source from this same
        base onto an ancestor of the current HEAD; otherwise it is ignored."""
        if not hint:
            return None
        try:
            record = self.kv.get(repo.partition, MERGE_HINTS_PREFIX + hint.encode()).value
        except kv.KeyNotFound:
            return None
        parts = record.decode("utf-8", "replace").split("\n")  # garbage: an unusable hint
        if len(parts) != 3:
            return None
        hinted_source, hinted_base, merged_onto = parts
        if hinted_source != source or hinted_base != (base or ""):
            return None
        if not self.refs.is_ancestor(repo, merged_onto, head):
            return None
        return hint, merged_onto


class _ChangeSource:
    """A diff (Change stream) as a layer source: REMOVED reads as a tombstone."""

    def __init__(self, changes: Iterator[Change]):
        self._changes = iter(changes)

    def __iter__(self):
        return self

    def __next__(self) -> tuple[str, Entry | None]:
        change = next(self._changes)
        return change.path, (None if change.type == ChangeType.REMOVED else change.entry)


class _TokenMoved(Exception):
    """Internal: a conditional staged write must be re-decided on the new token."""


def _same_entry(a: Entry | None, b: Entry | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.identity == b.identity


def _change_against(path: str, staged: Entry | None, committed: Entry | None) -> Change | None:
    if staged is None:
        return Change(ChangeType.REMOVED, path) if committed is not None else None
    if committed is None:
        return Change(ChangeType.ADDED, path, staged)
    if committed.identity != staged.identity:
        return Change(ChangeType.CHANGED, path, staged)
    return None


def _page_by_name(fetch, budget: PageBudget, page_token: str, key_prefix: bytes
                  ) -> tuple[list, str]:
    """One page of a listing ordered by name: `fetch(after, limit)` returns up to `limit`
    items named after `after` (stored at key_prefix + name); one extra item tells whether
    another page follows. The page ends early when the budget's byte limit is reached."""
    after = decode_page_token(page_token, "after").get("after", "")
    items = fetch(after, budget.max_items + 1)
    for index, item in enumerate(items):
        if not budget.admit(item):
            last = items[index - 1].name
            records.next_page_starts_at(key_prefix + last.encode() + b"\x00")
            return items[:index], encode_page_token(after=last)
    return items, ""


def _staging_partitions(tokens: Iterable[str]) -> list[bytes]:
    return [staging_partition(t) for t in tokens if t]


__all__ = ["Graveler", "CommitOutcome", "Layers"]
