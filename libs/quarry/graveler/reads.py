"""Reads: stat, list, the read layers and their validation, uncommitted changes, history
and diffs (docs/architecture.md §4 "Read", "Uncommitted diff").

A read of a branch layers its staging token (only when dirty), its sealed tokens and its
base (compacted or HEAD metarange), and is accepted only if the branch record still holds
every token it read and the same base (`still_valid`); otherwise it backs off and reads
again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from quarry.graveler import errors as gerrors
from quarry.graveler import layout, names, records
from quarry.graveler.core import Core, check_page_size
from quarry.graveler.iterators import (
    CommittedSource,
    LayeredIterator,
    decode_page_token,
    encode_page_token,
    string_after_prefix,
)
from quarry.graveler.layout import prefix_end
from quarry.graveler.model import Change, ChangeType, DiffSummary, Entry
from quarry.graveler.refs import Repository, ResolvedRef, is_dirty
from quarry.paging import PageBudget
from quarry.telemetry.metrics import branch_labels
from quarry.v1 import types_pb2

# A layer of a read: (path, entry or None for a tombstone) in path order.
LayerSource = Iterator[tuple[str, Entry | None]]

# Branch labels are capped (quarry.telemetry.metrics.BranchLabels): ephemeral branches share
# one value, branches past the first MAX_BRANCH_LABELS are "other".
# A filtered Log page walks at most this many commits (then answers with a page token).
LOG_SCAN_PER_PAGE = 5_000
MAX_LOG_FILTERS = 100

BRANCH_READS = Counter(
    "graveler_branch_reads", "Reads (stat/list) on branches", ["repo", "branch", "dirty", "op"]
)
STAGING_READ_ATTEMPTS = Counter(
    "graveler_staging_read_attempts",
    "Reads that looked into a staging token",
    ["repo", "branch", "op"],
)


# The counters' children by (repo, branch, dirty, op): looking a child up by its labels on
# every read costs more than the rest of a clean StatObject's bookkeeping. Same cardinality
# as the metrics themselves.
_COUNTERS: dict[tuple[str, str, bool, str], tuple[Any, Any]] = {}


def _read_counters(repo: str, branch: str, dirty: bool, op: str) -> tuple[Any, Any]:
    """(graveler_branch_reads, graveler_staging_read_attempts) children of one read."""
    key = (repo, branch, dirty, op)
    counters = _COUNTERS.get(key)
    if counters is None:
        counters = _COUNTERS[key] = (
            BRANCH_READS.labels(repo, branch, str(dirty).lower(), op),
            STAGING_READ_ATTEMPTS.labels(repo, branch, op),
        )
    return counters


@dataclass
class Layers:
    """What a read of a ref consults, newest first."""

    repo: Repository
    tokens: list[str]
    base_metarange_id: str
    branch: types_pb2.Branch | None = None
    branch_name: str | None = None


@dataclass(frozen=True)
class ListQuery:
    """One page of a listing: where it starts and what it groups."""

    prefix: str
    delimiter: str
    after: str
    skip_prefix: bool


def contended(what: str) -> gerrors.BranchContended:
    return gerrors.BranchContended(what)


class Reads:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.refs = core.refs
        self.staging = core.staging
        self.committed = core.committed

    # ---- layers ---------------------------------------------------------------------------

    def layers(self, repo: Repository, resolved: ResolvedRef, op: str) -> Layers:
        if resolved.branch is None or resolved.branch_record is None:
            commit = self.refs.get_commit(repo, resolved.commit_id)
            return Layers(repo, [], commit.metarange_id)
        branch = resolved.branch_record
        dirty = is_dirty(branch)
        # Capped labels first (ephemeral branches share one), so the children cache stays
        # as bounded as the metrics.
        counters = _read_counters(*branch_labels(repo.name, branch.name), dirty, op)
        counters[0].inc()
        tokens = list(branch.sealed_tokens)
        if dirty or not self.core.dirty_read_optimization:
            tokens.insert(0, branch.staging_token)
            counters[1].inc()
        base = (
            branch.compacted_metarange_id
            or self.refs.get_commit(repo, branch.commit_id).metarange_id
        )
        return Layers(repo, tokens, base, branch, branch.name)

    def branch_layers(self, repo: Repository, branch: types_pb2.Branch, op: str) -> Layers:
        return self.layers(repo, ResolvedRef(branch.commit_id, branch.name, branch), op)

    def still_valid(self, layers: Layers) -> bool:
        """A read that consulted staging tokens is valid if none of them was retired
        meanwhile (a retired token may already be partly deleted, and what it held now lives
        in a base we did not read) and the base is the one we read.

        A seal alone (our staging token moved to the sealed list, a new token in front) does
        not invalidate: the new token only holds writes acknowledged after our branch read,
        which this read need not see."""
        if not layers.tokens:
            return True  # committed data only: immutable
        assert layers.branch is not None and layers.branch_name is not None
        try:
            current, _ = self.refs.get_branch(layers.repo, layers.branch_name)
        except gerrors.BranchNotFound:
            return False
        before = layers.branch
        live = {current.staging_token, *current.sealed_tokens}
        return (
            all(token in live for token in layers.tokens)
            and current.commit_id == before.commit_id
            and current.compacted_metarange_id == before.compacted_metarange_id
        )

    def lookup(self, layers: Layers, path: str, skip_tokens: int = 0) -> tuple[bool, Entry | None]:
        """The first layer holding `path`, newest first; `skip_tokens`: that many of the
        newest tokens are already known not to hold it."""
        for token in layers.tokens[skip_tokens:]:
            found, value, _ = self.staging.get(token, path)
            if found:
                return True, value
        entry = self.committed.get_entry(
            layers.repo.storage_namespace, layers.base_metarange_id, path
        )
        return entry is not None, entry

    def lookup_many(self, layers: Layers, paths: Sequence[str]) -> dict[str, Entry | None]:
        """lookup() of each of `paths` (each once): what the first layer holding it holds
        (None: a tombstone, or in no layer). One batched KV read per staging token for all
        the paths not yet found, instead of one read per path and token."""
        answers: dict[str, Entry | None] = {}
        left = list(dict.fromkeys(paths))
        for token in layers.tokens:
            if not left:
                break
            staged = self.staging.get_many(token, left)
            answers.update(staged)
            left = [path for path in left if path not in staged]
        for path in left:
            answers[path] = self.committed.get_entry(
                layers.repo.storage_namespace, layers.base_metarange_id, path
            )
        return answers

    def iterator(self, layers: Layers, start: str, prefix: str) -> LayeredIterator:
        end = prefix_end(prefix.encode()) if prefix else None
        sources: list[LayerSource] = [
            self.staging.scan(token, max(start, prefix), end) for token in layers.tokens
        ]
        sources.append(
            CommittedSource(
                self.committed.iterate(
                    layers.repo.storage_namespace,
                    layers.base_metarange_id,
                    start=start,
                    prefix=prefix,
                )
            )
        )
        return LayeredIterator(sources)

    # ---- stat and list ------------------------------------------------------------------

    def stat_object(self, repo_name: str, ref: str, path: str) -> Entry:
        repo = self.core.repo(repo_name)
        names.check_path(path)
        message = f"ref {ref!r} kept changing during the read"
        early = self._dirty_branch_read(repo, ref, path)
        for _ in self.core.retries.branch.attempts(lambda: contended(message)):
            skip = 0
            if early is not None:
                resolved, token, found, staged = early
                early = None
                layers = self.layers(repo, resolved, "get")
                current = layers.branch is not None and layers.branch.staging_token == token
                # The token looked into is the fresh record's staging token, consulted (dirty):
                if current and layers.tokens[:1] == [token]:
                    if found:
                        # In the staging token the fresh branch record names as current:
                        # the newest layer, so the answer, with no validation (below).
                        return self._found(repo, ref, path, staged)
                    skip = 1  # not there: the other layers, then validation, as always
            else:
                resolved = self.refs.resolve(repo, ref)
                layers = self.layers(repo, resolved, "get")
                if resolved.branch_record is not None and resolved.branch_predicate is not None:
                    # The hint of the next read's staging token (_dirty_branch_read).
                    self.core.remember_branch(
                        repo, resolved.branch_record, resolved.branch_predicate
                    )
            _, value = self.lookup(layers, path, skip)
            if self.still_valid(layers):
                return self._found(repo, ref, path, value)
        raise AssertionError("unreachable")

    @staticmethod
    def _found(repo: Repository, ref: str, path: str, value: Entry | None) -> Entry:
        if value is None:
            raise gerrors.ObjectNotFound(
                f"{path!r} not found at {ref!r}",
                metadata={"repository": repo.name, "ref": ref, "path": path},
            )
        return value

    def _dirty_branch_read(
        self, repo: Repository, ref: str, path: str
    ) -> tuple[ResolvedRef, str, bool, Entry | None] | None:
        """A StatObject on a branch last seen dirty (Core.peek_branch): the branch record,
        read fresh, and `path` in the staging token it had, in one KV batch (one round trip
        where a read is otherwise a branch read, a staging read and a validation read).
        (the ref resolved from the fresh record, the token looked into, found, value); None
        when `ref` is not such a branch (the read then goes the usual way).

        Why a hit needs no validation: both reads happen after the request arrived. When the
        fresh record names the token looked into as its current staging token, every write
        acknowledged before the request arrived is in that token or in an older layer (a
        write is acknowledged only once it sits in the token current at its validation
        read, and a token is never current again once sealed), so a value found there is
        at least as new as any of them. Retiring a token only deletes: it can turn a hit
        into a miss, never change a value found. A miss goes on through the older layers
        and the usual validation (still_valid, a branch read after every other read)."""
        hint = self.core.peek_branch(repo, ref)
        if hint is None or not (is_dirty(hint) or not self.core.dirty_read_optimization):
            return None
        token = hint.staging_token
        record, found, staged = self.staging.get_with(token, path, self.refs.branch_key(repo, ref))
        if record is None:
            self.core.forget_branch(repo, ref)
            return None  # gone: resolution decides what `ref` names now
        branch = layout.decode_branch(repo.partition, ref, record.value)
        self.core.remember_branch(repo, branch, record.predicate)
        resolved = ResolvedRef(branch.commit_id, ref, branch, record.predicate)
        return resolved, token, found, staged

    @records.skips_corrupt_records  # a corrupt staged value: its path is left out
    def list_objects(  # the ListObjects request, field for field
        self,
        repo_name: str,
        ref: str,
        prefix: str = "",
        delimiter: str = "",
        page_size: int = 0,
        page_token: str = "",
    ) -> tuple[list[Entry], list[str], str]:
        repo = self.core.repo(repo_name)
        check_page_size(page_size)  # INVALID_ARGUMENT before any read
        state = decode_page_token(page_token, "after")
        after = state.get("after", "")
        if after and not after.startswith(prefix):
            raise gerrors.InvalidPageToken("page_token belongs to another listing")
        query = ListQuery(prefix, delimiter, after, state.get("skip_prefix", False))
        message = f"ref {ref!r} kept changing during the listing"
        for _ in self.core.retries.branch.attempts(lambda: contended(message)):
            layers = self.layers(repo, self.refs.resolve(repo, ref), "list")
            entries, prefixes, last = self.list_page(layers, query, self.core.budget(page_size))
            if self.still_valid(layers):
                token = ""
                if last is not None:
                    token = encode_page_token(after=last[0], skip_prefix=last[1])
                    following = string_after_prefix(last[0]) if last[1] else None
                    records.next_page_starts_at((following or last[0] + "\x00").encode())
                return entries, prefixes, token
        raise AssertionError("unreachable")

    def list_page(
        self, layers: Layers, query: ListQuery, budget: PageBudget
    ) -> tuple[list[Entry], list[str], tuple[str, bool] | None]:
        """One page, entries and common prefixes counted into one budget; returns
        (entries, common prefixes, resume point or None at the end)."""
        prefix, delimiter, after = query.prefix, query.delimiter, query.after
        if not after:
            start = prefix
        elif query.skip_prefix:
            start = string_after_prefix(after) or after
        else:
            start = after + "\x00"
        iterator = self.iterator(layers, start, prefix)
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
                        common = path[: cut + len(delimiter)]
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

    # ---- uncommitted changes ----------------------------------------------------------------

    def has_uncommitted(self, repo: Repository, branch: types_pb2.Branch) -> bool:
        if not is_dirty(branch) and not branch.sealed_tokens and not branch.compacted_metarange_id:
            return False
        changes, _ = self.diff_uncommitted_page(repo, branch, "", "", self.core.budget(1))
        return bool(changes)

    @records.skips_corrupt_records
    def diff_uncommitted(
        self,
        repo_name: str,
        branch_name: str,
        prefix: str = "",
        page_size: int = 0,
        page_token: str = "",
    ) -> tuple[list[Change], str]:
        repo = self.core.repo(repo_name)
        names.check_branch_name(branch_name)
        check_page_size(page_size)  # INVALID_ARGUMENT before any read
        after = decode_page_token(page_token, "after").get("after", "")
        message = f"branch {branch_name!r} kept changing"
        for _ in self.core.retries.branch.attempts(lambda: contended(message)):
            branch, _ = self.core.branch(repo, branch_name)
            if (
                not is_dirty(branch)
                and not branch.sealed_tokens
                and not branch.compacted_metarange_id
            ):
                return [], ""  # clean: nothing to scan
            changes, token = self.diff_uncommitted_page(
                repo, branch, prefix, after, self.core.budget(page_size)
            )
            layers = Layers(repo, [branch.staging_token], "", branch, branch_name)
            if self.still_valid(layers):
                return changes, token
        raise AssertionError("unreachable")

    def diff_uncommitted_page(  # one page of the request above
        self,
        repo: Repository,
        branch: types_pb2.Branch,
        prefix: str,
        after: str,
        budget: PageBudget,
    ) -> tuple[list[Change], str]:
        head = self.refs.get_commit(repo, branch.commit_id).metarange_id
        changes: list[Change] = []
        for path, value in self.uncommitted_values(repo, branch, head, prefix, after):
            committed = self.committed.get_entry(repo.storage_namespace, head, path)
            change = change_against(path, value, committed)
            if change is None:
                continue
            if not budget.admit(change):
                records.next_page_starts_at(changes[-1].path.encode() + b"\x00")
                return changes, encode_page_token(after=changes[-1].path)
            changes.append(change)
        return changes, ""

    def staged_changes(
        self,
        tokens: list[str],
        prefix: str = "",
        after: str = "",
        extra_sources: Sequence[LayerSource] = (),
    ) -> Iterator[tuple[str, Entry | None]]:
        """(path, newest staged value) over the tokens (newest first), then extra sources."""
        start = after + "\x00" if after else prefix
        end = prefix_end(prefix.encode()) if prefix else None
        sources: list[LayerSource] = [self.staging.scan(t, start, end) for t in tokens]
        merged = LayeredIterator(sources + list(extra_sources))
        try:
            yield from merged
        finally:
            merged.close()

    def uncommitted_values(  # a page of uncommitted values
        self,
        repo: Repository,
        branch: types_pb2.Branch,
        head_metarange: str,
        prefix: str,
        after: str,
    ) -> Iterator[tuple[str, Entry | None]]:
        """Every path with an uncommitted value, newest layer first: the staging and sealed
        tokens, then what compaction moved into the compacted metarange (the diff between
        the HEAD metarange and it; a removal shows as a tombstone)."""
        tokens = [branch.staging_token, *branch.sealed_tokens]
        extra: list[LayerSource] = []
        if branch.compacted_metarange_id:
            start = after + "\x00" if after else ""
            compacted = self.committed.diff(
                repo.storage_namespace,
                head_metarange,
                branch.compacted_metarange_id,
                prefix=prefix,
                start=start,
            )
            extra.append(ChangeSource(compacted))
        return self.staged_changes(tokens, prefix, after, extra)

    # ---- history and diffs ------------------------------------------------------------------

    def get_commit(self, repo_name: str, ref: str) -> types_pb2.Commit:
        repo = self.core.repo(repo_name)
        return self.refs.get_commit(repo, self.refs.resolve(repo, ref).commit_id)

    def summary_between(self, repo: Repository, left: str, right: str) -> DiffSummary:
        summary = DiffSummary()
        for change in self.committed.diff(repo.storage_namespace, left, right):
            summary.count(change.type)
        return summary

    def log(  # noqa: PLR0913 — the Log request, field for field
        self,
        repo_name: str,
        ref: str,
        first_parent: bool = False,
        page_size: int = 0,
        page_token: str = "",
        objects: Sequence[str] = (),
        prefixes: Sequence[str] = (),
        since: float | None = None,
    ) -> tuple[list[types_pb2.Commit], str]:
        """History from `ref`, newest first. With `objects` / `prefixes` only the commits
        that changed one of those paths, or a path under one of those prefixes, against
        their first parent (the initial commit: against nothing); with `since` (seconds)
        only commits made at or after it. A filtered page walks at most LOG_SCAN_PER_PAGE
        commits: it may then hold fewer commits than asked, or none, with a page token to
        go on (each call stays bounded however rare the matches)."""
        repo = self.core.repo(repo_name)
        budget = self.core.budget(page_size)
        state = decode_page_token(page_token, "frontier")
        frontier = state.get("frontier") or [self.refs.resolve(repo, ref).commit_id]
        if len(objects) + len(prefixes) > MAX_LOG_FILTERS:
            raise gerrors.InvalidPath(
                f"a log names at most {MAX_LOG_FILTERS} objects and prefixes",
                metadata={"count": str(len(objects) + len(prefixes))},
            )
        for path in (*objects, *prefixes):
            names.check_path(path)
        filtered = bool(objects or prefixes) or since is not None
        commits: list[types_pb2.Commit] = []
        walk = self.refs.log(repo, frontier, first_parent)
        scanned = 0
        for commit in walk:
            if filtered:
                scanned += 1
                if scanned > LOG_SCAN_PER_PAGE:
                    return commits, encode_page_token(frontier=[commit.id, *walk.frontier()])
                if not self._log_matches(repo, commit, objects, prefixes, since):
                    continue
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

    def _log_matches(
        self,
        repo: Repository,
        commit: types_pb2.Commit,
        objects: Sequence[str],
        prefixes: Sequence[str],
        since: float | None,
    ) -> bool:
        if since is not None and commit.creation_time.ToNanoseconds() < since * 1e9:
            return False
        if not objects and not prefixes:
            return True
        parent = (
            self.refs.get_commit(repo, commit.parents[0]).metarange_id if commit.parents else ""
        )
        if parent == commit.metarange_id:
            return False  # the same tree: nothing changed (ranges are content-addressed)
        namespace = repo.storage_namespace
        for prefix in prefixes:
            for _change in self.committed.diff(namespace, parent, commit.metarange_id, prefix):
                return True
        for path in objects:
            # The diff of the paths starting with `path`, in order: `path` itself comes
            # first, so the first change says whether it is that path.
            for change in self.committed.diff(namespace, parent, commit.metarange_id, path):
                if change.path == path:
                    return True
                break
        return False

    def diff(  # noqa: PLR0913 — the Diff request, field for field
        self,
        repo_name: str,
        left_ref: str,
        right_ref: str,
        prefix: str = "",
        page_size: int = 0,
        page_token: str = "",
        three_dot: bool = False,
    ) -> tuple[list[Change], str]:
        """Two-dot: left → right between committed states. Three-dot: the changes on the
        right since the merge base, CONFLICT where the left changed the same path
        differently."""
        repo = self.core.repo(repo_name)
        budget = self.core.budget(page_size)
        after = decode_page_token(page_token, "after").get("after", "")
        left = self.refs.get_commit(repo, self.refs.resolve(repo, left_ref).commit_id)
        right = self.refs.get_commit(repo, self.refs.resolve(repo, right_ref).commit_id)
        start = after + "\x00" if after else ""
        changes: Iterator[Change]
        if three_dot:
            base_id = self.refs.merge_base(repo, left.id, right.id)
            base = self.refs.get_commit(repo, base_id).metarange_id if base_id else ""
            changes = self._three_dot(
                repo, (base, left.metarange_id, right.metarange_id), prefix, start
            )
        else:
            changes = self.committed.diff(
                repo.storage_namespace,
                left.metarange_id,
                right.metarange_id,
                prefix=prefix,
                start=start,
            )
        page: list[Change] = []
        for change in changes:
            if not budget.admit(change):
                return page, encode_page_token(after=page[-1].path)
            page.append(change)
        return page, ""

    def _three_dot(
        self, repo: Repository, metaranges: tuple[str, str, str], prefix: str, start: str
    ) -> Iterator[Change]:
        base, left, right = metaranges
        namespace = repo.storage_namespace
        for change in self.committed.diff(namespace, base, right, prefix=prefix, start=start):
            before = self.committed.get_entry(namespace, base, change.path)
            on_left = self.committed.get_entry(namespace, left, change.path)
            left_changed = not same_entry(on_left, before)
            if left_changed and not same_entry(on_left, change.entry):
                yield Change(ChangeType.CONFLICT, change.path, change.entry)
            else:
                yield change

    def find_merge_base(self, repo_name: str, left_ref: str, right_ref: str) -> types_pb2.Commit:
        repo = self.core.repo(repo_name)
        left = self.refs.resolve(repo, left_ref).commit_id
        right = self.refs.resolve(repo, right_ref).commit_id
        base = self.refs.merge_base(repo, left, right)
        if base is None:
            raise gerrors.NoMergeBase(
                f"{left_ref!r} and {right_ref!r} share no history",
                metadata={"left": left_ref, "right": right_ref},
            )
        return self.refs.get_commit(repo, base)


class ChangeSource:
    """A diff (Change stream) as a layer source: REMOVED reads as a tombstone."""

    def __init__(self, changes: Iterator[Change]) -> None:
        self._changes = iter(changes)

    def __iter__(self) -> ChangeSource:
        return self

    def __next__(self) -> tuple[str, Entry | None]:
        change = next(self._changes)
        return change.path, (None if change.type == ChangeType.REMOVED else change.entry)


def same_entry(a: Entry | None, b: Entry | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.identity == b.identity


def change_against(path: str, staged: Entry | None, committed: Entry | None) -> Change | None:
    if staged is None:
        return Change(ChangeType.REMOVED, path) if committed is not None else None
    if committed is None:
        return Change(ChangeType.ADDED, path, staged)
    if committed.identity != staged.identity:
        return Change(ChangeType.CHANGED, path, staged)
    return None


__all__ = ["ChangeSource", "Layers", "ListQuery", "Reads", "change_against"]
