"""RefManager: repositories, branches, tags and commits in the KV store, and ref parsing.

KV layout (ARCHITECTURE.md §2):
  quarry                   repos/<repo>            → RepositoryRecord
                           requests/<id>           → RequestRecord (Create/DeleteRepository)
  repo/<repo>/<instance>   branches/<b>            → Branch   (the CAS point of a branch)
                           tags/<t>                → Tag
                           commits/<id>            → Commit   (immutable, content-addressed)
                           settings/gc_rules       → GarbageCollectionRules
                           requests/<id>           → RequestRecord (quarry.graveler.requests)
"""

from __future__ import annotations

import hashlib
import heapq
import json
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from google.protobuf import timestamp_pb2

from quarry.graveler import errors as gerrors
from quarry.graveler import records
from quarry.kv import store as kv
from quarry.kv.partitions import QUARRY_PARTITION, repo_partition
from quarry.v1 import records_pb2, types_pb2

REPOS_PREFIX = b"repos/"
# Instance ids of deleted repositories (value: the name): their namespaces may be reused.
DELETED_INSTANCES_PREFIX = b"deleted-instances/"
# Repositories being created (key: instance id; value: JSON name, namespace, time), so that
# two creations of overlapping namespaces see each other before either is visible.
CREATING_PREFIX = b"creating/"


@dataclass(frozen=True)
class Creation:
    instance_id: str
    repository: str
    storage_namespace: str
    started: float  # unix seconds
BRANCHES_PREFIX = b"branches/"
TAGS_PREFIX = b"tags/"
GC_RULES_KEY = b"settings/gc_rules"
COMMITS_PREFIX = b"commits/"
COMMIT_ID_HEX = 64
MIN_COMMIT_PREFIX = 6


@dataclass(frozen=True)
class Repository:
    name: str
    storage_namespace: str
    default_branch: str
    instance_id: str
    creation_time: int  # unix seconds

    @property
    def partition(self) -> bytes:
        return repo_partition(self.name, self.instance_id)

    def to_proto(self) -> types_pb2.Repository:
        return types_pb2.Repository(name=self.name, storage_namespace=self.storage_namespace,
                                    default_branch=self.default_branch,
                                    creation_time=timestamp_pb2.Timestamp(
                                        seconds=self.creation_time),
                                    instance_id=self.instance_id)

    def to_record(self) -> bytes:
        return records_pb2.RepositoryRecord(repository=self.to_proto(),
                                            instance_id=self.instance_id).SerializeToString()

    @staticmethod
    def from_record(data: bytes, key: bytes) -> "Repository":
        """The repository stored at `quarry`/`key` (CorruptRecord if unreadable)."""
        record = records.decode_record(records_pb2.RepositoryRecord, QUARRY_PARTITION, key,
                                       data)
        r = record.repository
        return Repository(r.name, r.storage_namespace, r.default_branch, record.instance_id,
                          r.creation_time.seconds)


def is_dirty(branch: types_pb2.Branch) -> bool:
    """Records written before the field existed read as dirty (the safe default)."""
    return branch.dirty if branch.HasField("dirty") else True


def commit_id_for(parents: list[str], metarange_id: str, message: str, committer: str,
                  creation_seconds: int, metadata: dict[str, str]) -> str:
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


# ---- refs -------------------------------------------------------------------------------

_MODIFIER = re.compile(r"([~^])(\d*)")


@dataclass(frozen=True)
class ParsedRef:
    base: str
    # ("~", n) = n-th first-parent ancestor; ("^", n) = n-th parent (1-based).
    modifiers: tuple[tuple[str, int], ...]
    committed_only: bool  # `branch@`


def parse_ref(ref: str) -> ParsedRef:
    if not ref:
        raise gerrors.InvalidRef("ref is required")
    cut = len(ref)
    for i, ch in enumerate(ref):
        if ch in "~^":
            cut = i
            break
    base, rest = ref[:cut], ref[cut:]
    committed_only = base.endswith("@")
    if committed_only:
        base = base[:-1]
    if not base:
        raise gerrors.InvalidRef(f"invalid ref {ref!r}: nothing before the modifiers")
    modifiers = []
    position = 0
    while position < len(rest):
        match = _MODIFIER.match(rest, position)
        if not match:
            raise gerrors.InvalidRef(f"invalid ref {ref!r}: after the name only ~N and ^N "
                                     f"are allowed")
        count = int(match.group(2)) if match.group(2) else 1
        modifiers.append((match.group(1), count))
        position = match.end()
    return ParsedRef(base, tuple(modifiers), committed_only)


@dataclass(frozen=True)
class ResolvedRef:
    commit_id: str
    # Set when the ref names a branch with no modifiers and without '@': reads include
    # the branch's uncommitted changes.
    branch: str | None = None
    branch_record: types_pb2.Branch | None = None
    branch_predicate: bytes | None = None


class _LRU:
    def __init__(self, capacity: int):
        self._capacity = capacity
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key, value) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self._capacity:
                self._data.popitem(last=False)


class RefManager:
    # Repository records change only by deletion; a short cache saves one KV read per call.
    # Writers re-validate the record together with the branch (see Graveler._write), so a
    # stale entry can at worst serve a read of a repository deleted within this window. It
    # must stay shorter than the dropper's grace period (staging_drop_grace_seconds), so a
    # dead instance's branch records are still there while a stale entry can point at them.
    REPOSITORY_TTL_SECONDS = 2.0

    def __init__(self, store: kv.Store, commit_cache_size: int = 100_000):
        self.kv = store
        self._repos: dict[str, tuple[float, Repository]] = {}
        self._commits = _LRU(commit_cache_size)

    # ---- repositories ------------------------------------------------------------------

    def get_repository(self, name: str, fresh: bool = False) -> Repository:
        now = time.monotonic()
        if not fresh:
            cached = self._repos.get(name)
            if cached is not None and now - cached[0] < self.REPOSITORY_TTL_SECONDS:
                return cached[1]
        try:
            data = self.kv.get(QUARRY_PARTITION, REPOS_PREFIX + name.encode()).value
        except kv.KeyNotFound:
            self._repos.pop(name, None)
            raise gerrors.RepositoryNotFound(f"repository {name!r} not found",
                                             metadata={"repository": name}) from None
        repo = Repository.from_record(data, REPOS_PREFIX + name.encode())
        self._repos[name] = (now, repo)
        return repo

    def repository_key(self, name: str) -> tuple[bytes, bytes]:
        return QUARRY_PARTITION, REPOS_PREFIX + name.encode()

    def insert_repository(self, repo: Repository) -> None:
        try:
            self.kv.set_if(QUARRY_PARTITION, REPOS_PREFIX + repo.name.encode(),
                           repo.to_record(), kv.ABSENT)
        except kv.PredicateFailed:
            raise gerrors.RepositoryExists(f"repository {repo.name!r} already exists",
                                           metadata={"repository": repo.name}) from None
        self.remember_repository(repo)

    def remember_repository(self, repo: Repository) -> None:
        """Cache a repository record just read or written (it is the current instance)."""
        self._repos[repo.name] = (time.monotonic(), repo)

    def record_deleted_instance(self, repo: Repository) -> None:
        """Remember that this repository instance is gone for good (deleted, or its
        creation failed): only then may a new repository take over its namespace."""
        self.kv.set(QUARRY_PARTITION, DELETED_INSTANCES_PREFIX + repo.instance_id.encode(),
                    repo.name.encode())

    def is_deleted_instance(self, instance_id: str) -> bool:
        try:
            self.kv.get(QUARRY_PARTITION, DELETED_INSTANCES_PREFIX + instance_id.encode())
            return True
        except kv.KeyNotFound:
            return False

    def add_creation(self, repo: Repository, started: float) -> None:
        self.kv.set(QUARRY_PARTITION, CREATING_PREFIX + repo.instance_id.encode(),
                    json.dumps({"repository": repo.name, "started": started,
                                "storage_namespace": repo.storage_namespace}).encode())

    def remove_creation(self, repo: Repository) -> None:
        self.kv.delete(QUARRY_PARTITION, CREATING_PREFIX + repo.instance_id.encode())

    def list_creations(self) -> list[Creation]:
        """Repository creations in progress (or interrupted: see Graveler.CREATION_TTL)."""
        found = []
        iterator = self.kv.scan(QUARRY_PARTITION, CREATING_PREFIX,
                                _prefix_end(CREATING_PREFIX))
        try:
            for item in iterator:
                try:
                    doc = json.loads(item.value)
                    found.append(Creation(item.key[len(CREATING_PREFIX):].decode(),
                                          str(doc["repository"]),
                                          str(doc["storage_namespace"]),
                                          float(doc["started"])))
                except (ValueError, KeyError, TypeError):
                    continue  # not one of ours: it cannot name a namespace
        finally:
            iterator.close()
        return found

    def delete_repository_record(self, name: str) -> None:
        self.kv.delete(QUARRY_PARTITION, REPOS_PREFIX + name.encode())
        self._repos.pop(name, None)

    def list_repositories(self, after: str = "", limit: int = 100) -> list[Repository]:
        """Up to `limit` repositories named after `after`. Corrupt records are skipped in a
        listing scope (records.listing) and raise CorruptRecord outside one."""
        start = REPOS_PREFIX + (after.encode() + b"\x00" if after else b"")
        out = []
        iterator = self.kv.scan(QUARRY_PARTITION, start, _prefix_end(REPOS_PREFIX),
                                batch_size=limit + 1)
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

    def get_branch(self, repo: Repository, name: str) -> tuple[types_pb2.Branch, bytes]:
        try:
            result = self.kv.get(repo.partition, BRANCHES_PREFIX + name.encode())
        except kv.KeyNotFound:
            raise gerrors.BranchNotFound(f"branch {name!r} not found in repository "
                                         f"{repo.name!r}",
                                         metadata={"repository": repo.name,
                                                   "branch": name}) from None
        return (records.decode_record(types_pb2.Branch, repo.partition,
                                      BRANCHES_PREFIX + name.encode(), result.value),
                result.predicate)

    def branch_key(self, repo: Repository, name: str) -> tuple[bytes, bytes]:
        return repo.partition, BRANCHES_PREFIX + name.encode()

    def set_branch_if(self, repo: Repository, branch: types_pb2.Branch,
                      predicate: kv.Predicate) -> bytes:
        """Compare-and-swap the branch record; returns the new predicate."""
        data = branch.SerializeToString(deterministic=True)
        self.kv.set_if(repo.partition, BRANCHES_PREFIX + branch.name.encode(), data, predicate)
        return data

    def delete_branch_record(self, repo: Repository, name: str) -> None:
        self.kv.delete(repo.partition, BRANCHES_PREFIX + name.encode())

    def list_branches(self, repo: Repository, after: str = "",
                      limit: int = 100) -> list[types_pb2.Branch]:
        return self._scan_records(types_pb2.Branch, repo.partition, BRANCHES_PREFIX, after,
                                  limit)

    # ---- tags --------------------------------------------------------------------------

    def get_tag(self, repo: Repository, name: str) -> types_pb2.Tag:
        try:
            data = self.kv.get(repo.partition, TAGS_PREFIX + name.encode()).value
        except kv.KeyNotFound:
            raise gerrors.TagNotFound(f"tag {name!r} not found in repository {repo.name!r}",
                                      metadata={"repository": repo.name, "tag": name}) from None
        return records.decode_record(types_pb2.Tag, repo.partition,
                                     TAGS_PREFIX + name.encode(), data)

    def insert_tag(self, repo: Repository, tag: types_pb2.Tag) -> None:
        try:
            self.kv.set_if(repo.partition, TAGS_PREFIX + tag.name.encode(),
                           tag.SerializeToString(), kv.ABSENT)
        except kv.PredicateFailed:
            raise gerrors.TagExists(f"tag {tag.name!r} already exists (tags are immutable)",
                                    metadata={"repository": repo.name, "tag": tag.name}) from None

    def delete_tag(self, repo: Repository, name: str) -> None:
        self.get_tag(repo, name)  # NOT_FOUND for a missing tag
        self.kv.delete(repo.partition, TAGS_PREFIX + name.encode())

    def list_tags(self, repo: Repository, after: str = "", limit: int = 100) -> list[types_pb2.Tag]:
        return self._scan_records(types_pb2.Tag, repo.partition, TAGS_PREFIX, after, limit)

    # ---- settings --------------------------------------------------------------------

    def get_gc_rules(self, repo: Repository) -> types_pb2.GarbageCollectionRules:
        try:
            data = self.kv.get(repo.partition, GC_RULES_KEY).value
        except kv.KeyNotFound:
            raise gerrors.GarbageCollectionRulesNotFound(
                f"repository {repo.name!r} has no garbage-collection rules",
                metadata={"repository": repo.name}) from None
        return records.decode_record(types_pb2.GarbageCollectionRules, repo.partition,
                                     GC_RULES_KEY, data)

    def set_gc_rules(self, repo: Repository, rules: types_pb2.GarbageCollectionRules) -> None:
        self.kv.set(repo.partition, GC_RULES_KEY, rules.SerializeToString())

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
            data = self.kv.get(repo.partition, COMMITS_PREFIX + commit_id.encode()).value
        except kv.KeyNotFound:
            raise gerrors.CommitNotFound(f"commit {commit_id!r} not found",
                                         metadata={"repository": repo.name,
                                                   "commit": commit_id}) from None
        commit = records.decode_record(types_pb2.Commit, repo.partition,
                                       COMMITS_PREFIX + commit_id.encode(), data)
        self._commits.put(cache_key, commit)
        return commit

    def insert_commit(self, repo: Repository, commit: types_pb2.Commit) -> None:
        """Commits are content-addressed: writing an existing id again is a no-op."""
        try:
            self.kv.set_if(repo.partition, COMMITS_PREFIX + commit.id.encode(),
                           commit.SerializeToString(deterministic=True), kv.ABSENT)
        except kv.PredicateFailed:
            pass
        self._commits.put((repo.instance_id, commit.id), commit)

    def commit_ids_with_prefix(self, repo: Repository, prefix: str, limit: int = 2) -> list[str]:
        start = COMMITS_PREFIX + prefix.encode()
        iterator = self.kv.scan(repo.partition, start, _prefix_end(start), batch_size=limit)
        try:
            ids = []
            for item in iterator:
                ids.append(item.key[len(COMMITS_PREFIX):].decode())
                if len(ids) >= limit:
                    break
            return ids
        finally:
            iterator.close()

    # ---- ref resolution ------------------------------------------------------------------

    def resolve(self, repo: Repository, ref: str) -> ResolvedRef:
        """branch (with uncommitted changes), branch@, tag, full or 6+ hex prefix commit id,
        each optionally followed by ~N / ^N. Precedence: branch, tag, commit."""
        parsed = parse_ref(ref)
        branch_name = None
        record = predicate = None
        commit_id = None
        try:
            record, predicate = self.get_branch(repo, parsed.base)
            branch_name = parsed.base
            commit_id = record.commit_id
        except gerrors.BranchNotFound:
            pass
        if commit_id is None:
            try:
                commit_id = self.get_tag(repo, parsed.base).commit_id
            except gerrors.TagNotFound:
                pass
        if commit_id is None:
            commit_id = self._resolve_commit_id(repo, parsed.base, ref)
        for kind, count in parsed.modifiers:
            commit_id = self._walk(repo, commit_id, kind, count, ref)
        if branch_name is not None and not parsed.modifiers and not parsed.committed_only:
            return ResolvedRef(commit_id, branch_name, record, predicate)
        if parsed.committed_only and branch_name is None:
            raise gerrors.InvalidRef(f"invalid ref {ref!r}: '@' applies to branches only")
        return ResolvedRef(commit_id)

    def _resolve_commit_id(self, repo: Repository, base: str, ref: str) -> str:
        if not re.fullmatch(r"[0-9a-f]+", base) or len(base) < MIN_COMMIT_PREFIX:
            raise gerrors.RefNotFound(f"ref {ref!r} is not a branch, tag or commit id (a commit "
                                      f"id prefix needs at least {MIN_COMMIT_PREFIX} hex "
                                      f"characters)", metadata={"ref": ref})
        if len(base) == COMMIT_ID_HEX:
            self.get_commit(repo, base)
            return base
        ids = self.commit_ids_with_prefix(repo, base)
        if not ids:
            raise gerrors.RefNotFound(f"no commit starts with {base!r}", metadata={"ref": ref})
        if len(ids) > 1:
            raise gerrors.AmbiguousRef(f"commit prefix {base!r} is ambiguous; use more "
                                       f"characters", metadata={"ref": ref})
        return ids[0]

    def _walk(self, repo: Repository, commit_id: str, kind: str, count: int, ref: str) -> str:
        if kind == "~":
            for _ in range(count):
                parents = self.get_commit(repo, commit_id).parents
                if not parents:
                    raise gerrors.RefNotFound(f"ref {ref!r}: history is shorter than that",
                                              metadata={"ref": ref})
                commit_id = parents[0]
            return commit_id
        if count == 0:
            return commit_id
        parents = self.get_commit(repo, commit_id).parents
        if count > len(parents):
            raise gerrors.RefNotFound(f"ref {ref!r}: commit {commit_id[:12]} has "
                                      f"{len(parents)} parent(s)", metadata={"ref": ref})
        return parents[count - 1]

    # ---- history ---------------------------------------------------------------------------

    def log(self, repo: Repository, frontier: list[str], first_parent: bool = False
            ) -> "LogWalk":
        """Commits reachable from `frontier`, newest first (see LogWalk)."""
        return LogWalk(self, repo, frontier, first_parent)

    def merge_base(self, repo: Repository, left_id: str, right_id: str) -> str | None:
        """The best common ancestor of two commits, or None if they share no history.

        Walks both histories together, newest generation first, painting each commit with
        the side(s) it is reachable from. The first commits painted by both sides are
        common ancestors; their own ancestors are marked stale so only the best ones (not
        ancestors of another) are kept. On criss-cross histories several remain: the one
        with the highest generation wins, then the smallest id — deterministic, and the
        choice is recorded by callers in the merge commit's metadata.
        Cost grows with the commits since the fork point, not with the whole history.
        """
        if left_id == right_id:
            return left_id
        LEFT, RIGHT, STALE = 1, 2, 4
        flags: dict[str, int] = {}
        heap: list[tuple[int, str]] = []

        def paint(commit_id: str, flag: int) -> None:
            before = flags.get(commit_id, 0)
            if before | flag == before:
                return
            if before == 0:
                heapq.heappush(heap, (-self.get_commit(repo, commit_id).generation, commit_id))
            flags[commit_id] = before | flag

        paint(left_id, LEFT)
        paint(right_id, RIGHT)
        candidates: list[str] = []
        while heap:
            if all(flags[c] & STALE for _, c in heap):
                break
            _, commit_id = heapq.heappop(heap)
            flag = flags[commit_id]
            if flag & (LEFT | RIGHT) == LEFT | RIGHT and not flag & STALE:
                candidates.append(commit_id)
                flag |= STALE
            for parent in self.get_commit(repo, commit_id).parents:
                paint(parent, flag)
        if not candidates:
            return None
        return min(candidates, key=lambda c: (-self.get_commit(repo, c).generation, c))

    def is_ancestor(self, repo: Repository, ancestor_id: str, descendant_id: str) -> bool:
        return self.merge_base(repo, ancestor_id, descendant_id) == ancestor_id

    # ---- helpers ---------------------------------------------------------------------------

    def _scan_records(self, message_type, partition: bytes, prefix: bytes, after: str,
                      limit: int) -> list:
        """Up to `limit` records under `prefix` named after `after`, decoded; a corrupt one
        is skipped in a listing scope and raises CorruptRecord outside one."""
        start = prefix + (after.encode() + b"\x00" if after else b"")
        iterator = self.kv.scan(partition, start, _prefix_end(prefix), batch_size=limit + 1)
        try:
            out = []
            for item in iterator:
                record = records.decode_or_skip(message_type, partition, item.key, item.value)
                if record is None:
                    continue
                out.append(record)
                if len(out) >= limit:
                    break
            return out
        finally:
            iterator.close()


class LogWalk:
    """Iterates commits reachable from a frontier, newest first by (generation, time, id).

    A commit's children all have higher generations, so when a commit is popped every path
    to it has been walked: no `seen` set is needed beyond the queue itself. `frontier()` is
    the resumable state for paging (computed only when a page ends).
    """

    def __init__(self, refs: "RefManager", repo: Repository, frontier: list[str],
                 first_parent: bool):
        self._refs = refs
        self._repo = repo
        self._first_parent = first_parent
        self._heap: list[tuple[int, int, str]] = []
        self._queued: set[str] = set()
        for commit_id in frontier:
            self._push(commit_id)

    def _push(self, commit_id: str) -> None:
        if commit_id in self._queued:
            return
        commit = self._refs.get_commit(self._repo, commit_id)
        self._queued.add(commit_id)
        heapq.heappush(self._heap, (-commit.generation, -commit.creation_time.seconds,
                                    commit_id))

    def __iter__(self) -> "LogWalk":
        return self

    def __next__(self) -> types_pb2.Commit:
        if not self._heap:
            raise StopIteration
        _, _, commit_id = heapq.heappop(self._heap)
        self._queued.discard(commit_id)
        commit = self._refs.get_commit(self._repo, commit_id)
        for parent in (commit.parents[:1] if self._first_parent else commit.parents):
            self._push(parent)
        return commit

    def frontier(self) -> list[str]:
        """The commits still to walk, in walk order."""
        return [entry[2] for entry in sorted(self._heap)]


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with `prefix` (None: no bound)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


prefix_end = _prefix_end
