"""Merges, reverts and cherry-picks: three-way merges of metaranges committed onto a branch,
with retry reuse and merge hints (docs/architecture.md §4 "Merge", "Revert / cherry-pick").
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TypedDict

from opentelemetry import trace

from quarry import errors
from quarry.actions.runs import Event
from quarry.graveler import actions, layout, names
from quarry.graveler import errors as gerrors
from quarry.graveler.commits import sealer
from quarry.graveler.core import CommitRecord, Core, make_commit, tracer
from quarry.graveler.model import Conflict, DiffSummary, Entry, MergeResult, MergeStrategy
from quarry.graveler.protection import COMMIT
from quarry.graveler.reads import Reads
from quarry.graveler.refs import Repository, is_dirty
from quarry.graveler.retry import ONCE
from quarry.kv import store as kv
from quarry.runtime import deadlines
from quarry.v1 import types_pb2

MAX_CONFLICTS_REPORTED = 100
# The conflicts listed in a MERGE_CONFLICT error's detail (the status trailer), encoded.
MAX_CONFLICT_DETAIL_BYTES = 2000


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


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


class MergeOptions(TypedDict, total=False):
    """Graveler.merge's keyword options (the fields of MergeParams)."""

    strategy: MergeStrategy
    message: str
    committer: str
    metadata: dict[str, str] | None
    squash: bool
    allow_empty: bool
    dry_run: bool
    hint_metarange_id: str
    destination_head_id: str


@dataclass(frozen=True)
class MergeParams:
    strategy: MergeStrategy = MergeStrategy.DEFAULT
    message: str = ""
    committer: str = ""
    metadata: dict[str, str] | None = None
    squash: bool = False
    allow_empty: bool = False
    dry_run: bool = False
    hint_metarange_id: str = ""
    # Merge only while the destination's HEAD is this commit ("": any).
    destination_head_id: str = ""


@dataclass(frozen=True)
class ThreeWay:
    """A three-way merge committed onto a branch: (base → source) applied onto its HEAD."""

    base_metarange: str
    source_metarange: str
    base_commit_id: str
    source_commit_id: str
    message: str
    committer: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    strategy: MergeStrategy = MergeStrategy.DEFAULT
    parents_after_head: list[str] = field(default_factory=list)
    allow_empty: bool = False
    dry_run: bool = False
    # (merged metarange, destination commit it was merged onto): an earlier attempt's work.
    resume: tuple[str, str] | None = None
    # The HEAD the destination must have for the commit to land ("": any).
    expected_head: str = ""
    # What the user asked for, as their messages name it: merge, revert or cherry-pick.
    operation: str = "merge"


class Merges:
    def __init__(self, core: Core, reads: Reads) -> None:
        self.core = core
        self.reads = reads
        self.refs = core.refs

    def merge(
        self, repo_name: str, source_ref: str, destination_branch: str, params: MergeParams
    ) -> MergeOutcome:
        """Three-way merge of `source_ref` into a branch: when the final swap loses to a
        moved HEAD, the retry merges the result just produced onto the new HEAD instead of
        starting over."""
        repo = self.core.live_repo(repo_name)
        names.check_branch_name(destination_branch)
        metadata = dict(params.metadata or {})
        names.check_commit_metadata(params.message, metadata)
        try:
            strategy = MergeStrategy(params.strategy)
        except ValueError:
            raise errors.InvalidArgument(f"unknown merge strategy {params.strategy!r}") from None
        source = self.refs.get_commit(repo, self.refs.resolve(repo, source_ref).commit_id)
        branch, _ = self.core.branch(repo, destination_branch)
        head = self.refs.get_commit(repo, branch.commit_id)
        bases = self.refs.merge_bases(repo, source.id, head.id)
        base_id = bases[0] if bases else None
        base_metarange = self._base_metarange(repo, bases)
        if base_id == source.id and not params.allow_empty:
            raise gerrors.NoChanges(
                f"{source_ref!r} is already merged into {destination_branch!r}",
                metadata={"repository": repo.name, "source": source.id},
            )
        resume = self._usable_hint(
            repo, params.hint_metarange_id, (source.id, base_id or "", head.id)
        )
        message = params.message or f"Merge {source_ref!r} into {destination_branch!r}"
        metadata.update(
            {
                "quarry.merge.strategy": strategy.name.lower().replace("_", "-"),
                "quarry.merge.source": source.id,
                "quarry.merge.base": base_id or "",
            }
        )
        if len(bases) > 1:  # criss-cross: the merge ran from their merge (a virtual base)
            metadata["quarry.merge.bases"] = ",".join(bases)
        work = ThreeWay(
            base_metarange,
            source.metarange_id,
            base_id or "",
            source.id,
            message,
            params.committer,
            metadata,
            strategy,
            [] if params.squash else [source.id],
            params.allow_empty,
            params.dry_run,
            resume,
            params.destination_head_id,
        )
        attributes = {
            "quarry.repository": repo.name,
            "quarry.branch": destination_branch,
            "quarry.source": source.id,
            "quarry.base": base_id or "",
        }
        with tracer.start_as_current_span("graveler.merge", attributes=attributes):
            if params.dry_run:
                return self.three_way_commit(repo, destination_branch, work)
            # Pre-merge hooks judge the source commit (whose action files apply), before
            # anything is written; a failure raises and the destination is untouched.
            event = Event(
                "pre-merge",
                repo.name,
                destination_branch,
                source_ref,
                message,
                params.committer,
                dict(params.metadata or {}),
            )
            actions.pre_event(self.core, self.reads, repo, source.metarange_id, event)
            outcome = self.three_way_commit(repo, destination_branch, work)
            if outcome.commit is not None:
                event.event_type = "post-merge"
                event.commit_id = outcome.commit.id
                actions.post_event(self.core, self.reads, repo, source, event)
            return outcome

    def revert(  # the Revert request, field for field
        self,
        repo_name: str,
        branch_name: str,
        ref: str,
        parent_number: int = 0,
        message: str = "",
        committer: str = "",
    ) -> MergeOutcome:
        """A commit undoing `ref`: the three-way merge (base = ref, source = its parent)."""
        repo, commit, parent = self._commit_and_parent(
            repo_name, branch_name, ref, parent_number, "revert"
        )
        work = ThreeWay(
            commit.metarange_id,
            parent.metarange_id,
            commit.id,
            parent.id,
            message or f"Revert {commit.message!r}",
            committer,
            {"quarry.revert": commit.id},
            operation="revert",
        )
        return self._gated_commit(repo, branch_name, work, "revert")

    def cherry_pick(  # the CherryPick request, field for field
        self,
        repo_name: str,
        branch_name: str,
        ref: str,
        parent_number: int = 0,
        message: str = "",
        committer: str = "",
    ) -> MergeOutcome:
        """A commit repeating `ref`'s change: the three-way merge (base = its parent)."""
        repo, commit, parent = self._commit_and_parent(
            repo_name, branch_name, ref, parent_number, "cherry-pick"
        )
        work = ThreeWay(
            parent.metarange_id,
            commit.metarange_id,
            parent.id,
            commit.id,
            message or commit.message,
            committer or commit.committer,
            {"quarry.cherry-pick": commit.id},
            operation="cherry-pick",
        )
        return self._gated_commit(repo, branch_name, work, "cherry-pick")

    def _gated_commit(
        self, repo: Repository, branch_name: str, work: ThreeWay, kind: str
    ) -> MergeOutcome:
        """A revert or cherry-pick with its hooks, as lakeFS runs them (Graveler.Revert,
        CherryPick): `pre-<kind>` with the action files of the branch HEAD it starts from
        (the branch must be clean, so that is the whole branch; a revert removing an action
        file is still judged by it), then the three-way commit, then `post-<kind>` with the
        action files of the commit made. A pre-hook failure raises before anything is
        written: the branch is exactly as it was."""
        if self.core.actions is None:
            return self.three_way_commit(repo, branch_name, work)
        branch, _ = self._clean_branch(repo, branch_name)
        event = Event(
            f"pre-{kind}",
            repo.name,
            branch_name,
            branch_name,
            work.message,
            work.committer,
            dict(work.metadata),
        )
        head = self.refs.get_commit(repo, branch.commit_id)
        actions.pre_event(self.core, self.reads, repo, head.metarange_id, event)
        outcome = self.three_way_commit(repo, branch_name, work)
        if outcome.commit is not None:
            event.event_type = f"post-{kind}"
            event.commit_id = outcome.commit.id
            actions.post_event(self.core, self.reads, repo, outcome.commit, event)
        return outcome

    def _clean_branch(
        self, repo: Repository, branch_name: str, seal: bool = False
    ) -> tuple[types_pb2.Branch, bytes]:
        """The branch record (and its predicate), or DirtyBranch: a three-way commit never
        takes staged changes with it (nor drops them).

        `seal`: for a commit that will move HEAD (_move_head). A branch can be clean with
        staging layers that change nothing (a path put again with HEAD's value, a
        path-discard's copy of HEAD's entry, a compacted metarange over HEAD); they are
        HEAD's values, and left under a new HEAD they would shadow it (the merge hidden,
        and undone by the next commit). So the move drops them, and to never drop a write
        it did not see, the branch's token is sealed first, as a commit and a reset do: a
        write acknowledged after the seal marks the branch dirty, and the move's
        compare-and-swap on the sealed record fails."""
        branch, predicate = self.core.branch(repo, branch_name)
        # Refused before any seal: a refused merge leaves the branch exactly as it was.
        self._refuse_dirty(repo, branch_name, branch)
        if seal and _has_layers(branch):
            sealed = self.refs.update_branch(
                repo, branch_name, sealer(repo.staging_shards), step="seal"
            )
            branch, predicate = sealed.branch, sealed.predicate
            self._refuse_dirty(repo, branch_name, branch)  # a write landed before the seal
        return branch, predicate

    def _refuse_dirty(self, repo: Repository, branch_name: str, branch: types_pb2.Branch) -> None:
        if self.reads.has_uncommitted(repo, branch):
            raise gerrors.DirtyBranch(
                f"branch {branch_name!r} has uncommitted changes; commit or discard them first",
                metadata={"repository": repo.name, "branch": branch_name},
            )

    def _commit_and_parent(
        self, repo_name: str, branch_name: str, ref: str, parent_number: int, operation: str
    ) -> tuple[Repository, types_pb2.Commit, types_pb2.Commit]:
        """What revert and cherry-pick start from: the live repository, the commit `ref`
        names and its chosen parent."""
        repo = self.core.live_repo(repo_name)
        names.check_branch_name(branch_name)
        # Revert and cherry-pick are commits onto the branch (a merge into it is not).
        self.core.protection.check(repo, branch_name, COMMIT)
        commit = self.refs.get_commit(repo, self.refs.resolve(repo, ref).commit_id)
        return repo, commit, self._chosen_parent(repo, commit, parent_number, operation)

    def _chosen_parent(
        self, repo: Repository, commit: types_pb2.Commit, parent_number: int, action: str
    ) -> types_pb2.Commit:
        parents = list(commit.parents)
        if not parents:
            raise gerrors.InvalidParent(f"cannot {action} {commit.id[:12]}: it has no parent")
        if len(parents) > 1 and parent_number == 0:
            raise gerrors.InvalidParent(
                f"{commit.id[:12]} is a merge commit: choose the "
                f"parent_number (1..{len(parents)}) to {action} against"
            )
        number = parent_number or 1
        if not 1 <= number <= len(parents):
            raise gerrors.InvalidParent(
                f"{commit.id[:12]} has {len(parents)} parent(s); "
                f"parent_number {number} is out of range"
            )
        return self.refs.get_commit(repo, parents[number - 1])

    def three_way_commit(self, repo: Repository, branch_name: str, work: ThreeWay) -> MergeOutcome:
        """Merge (base → source) onto the branch HEAD and commit it.

        `work.resume` = (merged metarange, destination commit it was merged onto): the work
        of an earlier attempt. Retrying with base' = that destination, source' = that
        result, destination' = the new HEAD gives the results of a merge from scratch, and
        ranges only the earlier attempt touched are not rewritten. (One difference from a
        merge from scratch is documented in quarry.committed.merge: a path both sides changed
        identically and the new HEAD changed again keeps the new HEAD's value.)"""
        written = reused = 0
        resume = work.resume
        for attempt in range(self.core.retries.merge.max_attempts):
            if attempt:
                self.core.retries.merge.backoff(attempt - 1)
            branch, predicate = self._clean_branch(repo, branch_name, seal=not work.dry_run)
            if work.expected_head and branch.commit_id != work.expected_head:
                # The move below swaps only this record: the commit lands on that HEAD or
                # not at all.
                raise gerrors.DestinationMoved(
                    f"{branch_name!r} is at {branch.commit_id[:12]}, not "
                    f"{work.expected_head[:12]} as the merge required",
                    metadata={"repository": repo.name, "branch": branch_name},
                )
            head = self.refs.get_commit(repo, branch.commit_id)
            if resume is None:
                inputs = (work.base_metarange, work.source_metarange, head.metarange_id)
            else:
                merged_before, merged_onto = resume
                onto = self.refs.get_commit(repo, merged_onto).metarange_id
                inputs = (onto, merged_before, head.metarange_id)
            attributes = {"quarry.attempt": attempt + 1, "quarry.resumed": resume is not None}
            with tracer.start_as_current_span("graveler.merge_metaranges", attributes=attributes):
                result = self.core.range_writer.merge_metaranges(
                    repo.storage_namespace,
                    *inputs,
                    strategy=work.strategy,
                    max_conflicts=MAX_CONFLICTS_REPORTED,
                    dry_run=work.dry_run,
                )
            written += result.ranges_written
            reused += result.ranges_reused
            if result.conflicts or result.more_conflicts:
                if work.dry_run:
                    return MergeOutcome(
                        None,
                        result.summary,
                        work.base_commit_id,
                        result.conflicts,
                        result.more_conflicts,
                        attempt + 1,
                    )
                raise self._conflict_error(result, work.base_commit_id)
            # Before the dry run's answer: a dry run says what the merge would do, refusal
            # included. (A dry run writes no metarange to compare: no change at all is its
            # test; a real merge also refuses only when the metarange is HEAD's.)
            if (
                result.summary.total == 0
                and not work.allow_empty
                and (work.dry_run or result.metarange_id == head.metarange_id)
            ):
                hint = (
                    " (--allow-empty makes the commit anyway)" if work.operation == "merge" else ""
                )
                raise gerrors.NoChanges(
                    f"the {work.operation} changes nothing on {branch_name}: it has every "
                    f"change already{hint}",
                    metadata={"repository": repo.name, "branch": branch_name},
                )
            if work.dry_run:
                return MergeOutcome(None, result.summary, work.base_commit_id, attempts=attempt + 1)
            parents = [head.id, *work.parents_after_head]
            generation = 1 + max(self.refs.get_commit(repo, p).generation for p in parents)
            commit = make_commit(
                CommitRecord(
                    parents,
                    result.metarange_id,
                    work.message,
                    work.committer,
                    work.metadata,
                    generation,
                )
            )
            self.refs.insert_commit(repo, commit)
            if not self._move_head(repo, (branch, predicate), commit.id):
                # HEAD moved (or a write made the branch dirty): keep this attempt's work.
                trace.get_current_span().add_event(
                    "merge.retry",
                    {
                        "attempt": attempt + 1,
                        "branch": branch_name,
                        "merged_metarange": result.metarange_id,
                    },
                )
                resume = (result.metarange_id, head.id)
                continue
            self.core.forget_branch(repo, branch_name)
            return MergeOutcome(
                commit,
                result.summary,
                work.base_commit_id,
                attempts=attempt + 1,
                ranges_written=written,
                ranges_reused=reused,
            )
        assert resume is not None
        merged, onto = resume
        self.remember_hint(repo, merged, (work.source_commit_id, work.base_commit_id, onto))
        raise gerrors.HeadMoved(
            f"{branch_name!r} kept moving: the merge lost the race {self.core.retries.merge.max_attempts} times; "
            f"retry with hint_metarange_id to resume from the merged metarange",
            metadata={"hint_metarange_id": merged},
            details=[
                types_pb2.MergeRetryHint(
                    hint_metarange_id=merged,
                    source_commit_id=work.source_commit_id,
                    base_commit_id=work.base_commit_id,
                    attempts=self.core.retries.merge.max_attempts,
                )
            ],
        )

    def _move_head(
        self, repo: Repository, read: tuple[types_pb2.Branch, bytes], commit_id: str
    ) -> bool:
        """Point the branch at the merge commit if its record is still the one the merge
        started from (one compare-and-swap: a loss means HEAD moved or the branch got
        dirty, and the merge is redone on top of its own result). The record was clean
        (_clean_branch): its sealed tokens and compacted metarange hold only HEAD's values,
        and go with the old HEAD (its staging token is empty: dirty is false)."""

        def move(branch: types_pb2.Branch) -> types_pb2.Branch:
            branch.commit_id = commit_id
            del branch.sealed_tokens[:]
            branch.compacted_metarange_id = ""
            return branch

        # The sealed tokens the move retires are queued first, dropped once the branch no
        # longer references them (queue_retiring_tokens: no orphan if this process dies
        # right after the move).
        self.core.staging.queue_retiring_tokens(
            list(read[0].sealed_tokens), repo.partition, read[0].name
        )
        # The last point to stop: an expired or cancelled merge moves no branch.
        deadlines.check()
        try:
            self.refs.update_branch(
                repo, read[0].name, move, step="merge", policy=ONCE, expect=read
            )
        except gerrors.BranchContended:
            return False
        return True

    # ---- criss-cross histories: a virtual merge base -----------------------------------------

    def _base_metarange(self, repo: Repository, bases: list[str], depth: int = 0) -> str:
        """The metarange a three-way merge runs from. One best common ancestor: its own.
        Several (a criss-cross history, which two merges in opposite directions at once
        make): their merge, as git's recursive strategy does. Taking one of them instead
        restored files the destination had deleted and reported conflicts on paths only
        one side changed. Paths the bases themselves disagree on are marked in the virtual
        base with an entry no side holds, so the real merge reports them as conflicts
        unless both sides agree (git's conflict-marked base)."""
        if not bases:
            return ""
        metarange = self.refs.get_commit(repo, bases[0]).metarange_id
        if depth >= MAX_VIRTUAL_BASE_DEPTH:
            return metarange
        for other in bases[1:]:
            inner = self._base_metarange(
                repo, self.refs.merge_bases(repo, bases[0], other), depth + 1
            )
            other_metarange = self.refs.get_commit(repo, other).metarange_id
            metarange = self._virtual_base(repo, inner, other_metarange, metarange)
        return metarange

    def _virtual_base(self, repo: Repository, base: str, source: str, destination: str) -> str:
        namespace = repo.storage_namespace
        rw = self.core.range_writer
        merged = rw.merge_metaranges(
            namespace, base, source, destination, max_conflicts=MAX_VIRTUAL_BASE_CONFLICTS
        )
        if not merged.conflicts and not merged.more_conflicts:
            return merged.metarange_id
        if merged.more_conflicts:
            # Too many to mark: refused as conflicts, never merged from a guessed base.
            raise self._conflict_error(merged, "")
        resolved = rw.merge_metaranges(
            namespace, base, source, destination, strategy=MergeStrategy.DEST_WINS
        )
        marks = [(c.path, _disputed(c.path)) for c in merged.conflicts]
        return rw.apply_changes(namespace, resolved.metarange_id, marks).metarange_id

    def _conflict_error(self, result: MergeResult, base_commit_id: str) -> gerrors.MergeConflict:
        """MERGE_CONFLICT with the conflicts that fit MAX_CONFLICT_DETAIL_BYTES; `more`
        counts the rest. The detail travels in the status trailer, which clients read under
        gRPC's 8 KiB metadata limit: 100 whole conflicts (or 5 on long paths) made the
        answer RESOURCE_EXHAUSTED, with no conflict at all."""
        from quarry.convert import conflict_to_proto

        total = len(result.conflicts) + result.more_conflicts
        shown = ", ".join(_cut(c.path, 100) for c in result.conflicts[:5])
        listed: list[types_pb2.Conflict] = []
        size = 0
        for conflict in result.conflicts:
            proto = conflict_to_proto(conflict)
            size += proto.ByteSize() + 4  # its field tag and length
            if size > MAX_CONFLICT_DETAIL_BYTES:
                break
            listed.append(proto)
        detail = types_pb2.MergeConflicts(
            conflicts=listed, more=total - len(listed), base_commit_id=base_commit_id
        )
        return gerrors.MergeConflict(
            f"{total} conflicting path(s): {shown}" + (", ..." if total > 5 else ""),
            metadata={"conflicts": str(total)},
            details=[detail],
        )

    # ---- merge hints ----------------------------------------------------------------------

    def remember_hint(
        self, repo: Repository, metarange_id: str, made_by: tuple[str, str, str]
    ) -> None:
        """Record that `metarange_id` is the merge of source from base onto a destination
        commit: made_by = (source, base, onto). A later merge may resume from it."""
        source, base, onto = made_by
        self.core.kv.set(
            repo.partition,
            layout.merge_hint_key(metarange_id),
            layout.encode_merge_hint(source, base, onto),
        )

    def _usable_hint(
        self, repo: Repository, hint: str, merge: tuple[str, str, str]
    ) -> tuple[str, str] | None:
        """A hint is used only if it was produced by merging this same source from this same
        base onto an ancestor of the current HEAD; otherwise it is ignored. merge = (source,
        base, head)."""
        if not hint:
            return None
        source, base, head = merge
        try:
            record = self.core.kv.get(repo.partition, layout.merge_hint_key(hint)).value
        except kv.KeyNotFound:
            return None
        decoded = layout.decode_merge_hint(record)  # garbage: an unusable hint
        if decoded is None:
            return None
        hinted_source, hinted_base, merged_onto = decoded
        if hinted_source != source or hinted_base != base:
            return None
        if not self.refs.is_ancestor(repo, merged_onto, head):
            return None
        return hint, merged_onto


def merge_params(params: MergeParams | None, options: MergeOptions) -> MergeParams:
    """MergeParams from a params object and/or keyword options (options win)."""
    return replace(params or MergeParams(), **options)


__all__ = ["MergeOptions", "MergeOutcome", "MergeParams", "Merges", "ThreeWay", "merge_params"]


def _has_layers(branch: types_pb2.Branch) -> bool:
    """Whether reads of the branch look at anything above HEAD."""
    return is_dirty(branch) or bool(branch.sealed_tokens) or bool(branch.compacted_metarange_id)


# A criss-cross of criss-crosses is merged this deep; deeper, the first base is taken.
MAX_VIRTUAL_BASE_DEPTH = 4
# Paths two merge bases may disagree on and still be marked in their virtual base.
MAX_VIRTUAL_BASE_CONFLICTS = 10_000


def _disputed(path: str) -> Entry:
    """What a virtual merge base holds where its bases disagree: an entry no commit holds
    (no real object has this checksum), so each side that has the path differs from it."""
    return Entry(path, "", 0, "quarry:merge-bases-disagree")
