"""Ref parsing and resolution, and history walks (merge base, log) over commit records.

`RefResolution` is mixed into RefManager (quarry.graveler.refs), which provides the record
access it needs (get_branch, get_tag, get_commit, commit_ids_with_prefix).
"""

from __future__ import annotations

import contextlib
import heapq
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quarry.graveler import errors as gerrors
from quarry.v1 import types_pb2

if TYPE_CHECKING:
    from quarry.graveler.refs import Repository

COMMIT_ID_HEX = 64
MIN_COMMIT_PREFIX = 6
# The longest a ref's base may be: a branch or tag name (255 characters; quarry.graveler.names).
MAX_REF_BASE = 255

# ---- refs -------------------------------------------------------------------------------

_MODIFIER = re.compile(r"([~^])(\d*)")


HEAD = "HEAD"  # in a ref: the repository's default branch (resolve); never a branch or tag name


def head_alias(ref: str) -> str:
    """`@` alone (or `@~N`, `@^N`) is git's short form of HEAD."""
    if ref == "@" or ref.startswith(("@~", "@^")):
        return HEAD + ref[1:]
    return ref


@dataclass(frozen=True)
class ParsedRef:
    base: str
    # ("~", n) = n-th first-parent ancestor; ("^", n) = n-th parent (1-based).
    modifiers: tuple[tuple[str, int], ...]
    committed_only: bool  # `branch@`


def parse_ref(ref: str) -> ParsedRef:
    if not ref:
        raise gerrors.InvalidRef("ref is required")
    if "~" not in ref and "^" not in ref and not ref.endswith("@"):
        return ParsedRef(ref, (), False)  # the common case: a bare name (every read's ref)
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
            raise gerrors.InvalidRef(
                f"invalid ref {ref!r}: after the name only ~N and ^N are allowed"
            )
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


class RefResolution:
    """Resolution and history over the record access of a RefManager."""

    def get_branch(self, repo: Repository, name: str) -> tuple[types_pb2.Branch, bytes]:
        raise NotImplementedError

    def get_tag(self, repo: Repository, name: str) -> types_pb2.Tag:
        raise NotImplementedError

    def get_commit(self, repo: Repository, commit_id: str) -> types_pb2.Commit:
        raise NotImplementedError

    def commit_ids_with_prefix(self, repo: Repository, prefix: str, limit: int = 2) -> list[str]:
        raise NotImplementedError

    # ---- ref resolution ------------------------------------------------------------------

    def resolve(self, repo: Repository, ref: str) -> ResolvedRef:
        """branch (with uncommitted changes), branch@, tag, full or 6+ hex prefix commit id,
        each optionally followed by ~N / ^N. Precedence: branch, tag, commit. `HEAD` (and
        `@`, git's short form) names the repository's default branch: quarry has no
        checked-out branch, and the default branch is where work lands by default."""
        parsed = parse_ref(head_alias(ref))
        if parsed.base == HEAD:
            parsed = ParsedRef(repo.default_branch, parsed.modifiers, parsed.committed_only)
        if len(parsed.base) > MAX_REF_BASE:
            # No branch or tag name is this long (names are at most 255 characters) and no
            # commit id either: refused before any lookup (a KV key of it is too large).
            raise gerrors.RefNotFound(
                f"ref {ref[:100]!r}... is not a branch, tag or commit id (too long)",
                metadata={"ref": ref[:255]},
            )
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
            with contextlib.suppress(gerrors.TagNotFound):
                commit_id = self.get_tag(repo, parsed.base).commit_id
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
            raise gerrors.RefNotFound(
                f"ref {ref!r} is not a branch, tag or commit id (a commit "
                f"id prefix needs at least {MIN_COMMIT_PREFIX} hex "
                f"characters)",
                metadata={"ref": ref},
            )
        if len(base) == COMMIT_ID_HEX:
            self.get_commit(repo, base)
            return base
        ids = self.commit_ids_with_prefix(repo, base)
        if not ids:
            raise gerrors.RefNotFound(f"no commit starts with {base!r}", metadata={"ref": ref})
        if len(ids) > 1:
            raise gerrors.AmbiguousRef(
                f"commit prefix {base!r} is ambiguous; use more characters", metadata={"ref": ref}
            )
        return ids[0]

    def _walk(self, repo: Repository, commit_id: str, kind: str, count: int, ref: str) -> str:
        if kind == "~":
            for _ in range(count):
                parents = self.get_commit(repo, commit_id).parents
                if not parents:
                    raise gerrors.RefNotFound(
                        f"ref {ref!r}: history is shorter than that", metadata={"ref": ref}
                    )
                commit_id = parents[0]
            return commit_id
        if count == 0:
            return commit_id
        parents = self.get_commit(repo, commit_id).parents
        if count > len(parents):
            raise gerrors.RefNotFound(
                f"ref {ref!r}: commit {commit_id[:12]} has {len(parents)} parent(s)",
                metadata={"ref": ref},
            )
        return parents[count - 1]

    # ---- history ---------------------------------------------------------------------------

    def log(self, repo: Repository, frontier: list[str], first_parent: bool = False) -> LogWalk:
        """Commits reachable from `frontier`, newest first (see LogWalk)."""
        return LogWalk(self, repo, frontier, first_parent)

    def merge_base(self, repo: Repository, left_id: str, right_id: str) -> str | None:
        """The best common ancestor of two commits, or None if they share no history: the
        first of merge_bases (a three-way merge of a criss-cross history merges them all,
        quarry.graveler.merges)."""
        bases = self.merge_bases(repo, left_id, right_id)
        return bases[0] if bases else None

    def merge_bases(self, repo: Repository, left_id: str, right_id: str) -> list[str]:
        """The best common ancestors of two commits (none an ancestor of another): one,
        several on criss-cross histories, none when they share no history. Ordered by
        generation, highest first, then by id: deterministic.

        Walks both histories together, newest generation first, painting each commit with
        the side(s) it is reachable from. The first commits painted by both sides are
        common ancestors; their own ancestors are marked stale so only the best ones are
        kept. Cost grows with the commits since the fork point, not with the whole history.
        """
        if left_id == right_id:
            return [left_id]
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
        return sorted(candidates, key=lambda c: (-self.get_commit(repo, c).generation, c))

    def is_ancestor(self, repo: Repository, ancestor_id: str, descendant_id: str) -> bool:
        return self.merge_base(repo, ancestor_id, descendant_id) == ancestor_id


class LogWalk:
    """Iterates commits reachable from a frontier, newest first by (generation, time, id).

    A commit's children all have higher generations, so when a commit is popped every path
    to it has been walked: no `seen` set is needed beyond the queue itself. `frontier()` is
    the resumable state for paging (computed only when a page ends).
    """

    def __init__(
        self, refs: RefResolution, repo: Repository, frontier: list[str], first_parent: bool
    ):
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
        heapq.heappush(self._heap, (-commit.generation, -commit.creation_time.seconds, commit_id))

    def __iter__(self) -> LogWalk:
        return self

    def __next__(self) -> types_pb2.Commit:
        if not self._heap:
            raise StopIteration
        _, _, commit_id = heapq.heappop(self._heap)
        self._queued.discard(commit_id)
        commit = self._refs.get_commit(self._repo, commit_id)
        for parent in commit.parents[:1] if self._first_parent else commit.parents:
            self._push(parent)
        return commit

    def frontier(self) -> list[str]:
        """The commits still to walk, in walk order."""
        return [entry[2] for entry in sorted(self._heap)]
