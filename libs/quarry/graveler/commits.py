"""Commits and staging compaction: both seal the staging token, apply the sealed tokens onto
the base metarange and retire exactly the tokens applied (docs/architecture.md §4 "Commit",
"Compaction"). Seal and retire are branch updates (RefManager.update_branch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from quarry.graveler import actions, names
from quarry.graveler import errors as gerrors
from quarry.graveler.core import CommitRecord, Core, make_commit, tracer
from quarry.graveler.model import ApplyResult, DiffSummary
from quarry.graveler.protection import COMMIT
from quarry.graveler.reads import Reads
from quarry.graveler.refs import Repository, is_dirty
from quarry.graveler.retry import cas_retry
from quarry.graveler.staging import new_token
from quarry.runtime import deadlines
from quarry.v1 import types_pb2


@dataclass
class CommitOutcome:
    commit: types_pb2.Commit
    summary: DiffSummary = field(default_factory=DiffSummary)
    ranges_written: int = 0
    ranges_reused: int = 0


@dataclass(frozen=True)
class CommitParams:
    """What a commit records besides the tree: message, committer, metadata."""

    message: str
    committer: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    allow_empty: bool = False


@dataclass(frozen=True)
class Retirement:
    """What a commit or compaction installs when it retires the tokens it applied: a new
    HEAD (a commit; the compacted metarange is cleared) or a new compacted metarange."""

    applied: list[str]
    new_commit_id: str | None = None
    new_compacted: str | None = None


class _Moved(Exception):
    """Internal: HEAD or the base moved, or the sealed list lost the applied tokens."""


def sealer(staging_shards: int) -> Callable[[types_pb2.Branch], types_pb2.Branch | None]:
    """The seal of a branch update; the fresh token gets the repository's current shard
    count (a changed staging_shards takes effect here, with the branch's next token)."""

    def seal(branch: types_pb2.Branch) -> types_pb2.Branch | None:
        if not is_dirty(branch):
            return None  # only a dirty token can hold acknowledged writes
        branch.sealed_tokens.insert(0, branch.staging_token)
        branch.staging_token = new_token(staging_shards)
        branch.dirty = False
        return branch

    return seal


def _retire(
    expected: types_pb2.Branch, retirement: Retirement
) -> Callable[[types_pb2.Branch], types_pb2.Branch]:
    applied = retirement.applied

    def retire(current: types_pb2.Branch) -> types_pb2.Branch:
        sealed = list(current.sealed_tokens)
        if (
            current.commit_id != expected.commit_id
            or current.compacted_metarange_id != expected.compacted_metarange_id
            or len(sealed) < len(applied)
            or (applied and sealed[len(sealed) - len(applied) :] != applied)
        ):
            raise _Moved()
        del current.sealed_tokens[:]
        current.sealed_tokens.extend(sealed[: len(sealed) - len(applied)])
        if retirement.new_commit_id is not None:
            current.commit_id = retirement.new_commit_id
            current.compacted_metarange_id = ""
        if retirement.new_compacted is not None:
            current.compacted_metarange_id = retirement.new_compacted
        return current

    return retire


class Commits:
    def __init__(self, core: Core, reads: Reads) -> None:
        self.core = core
        self.reads = reads
        self.refs = core.refs

    def commit(  # the Commit request, field for field (see CommitParams)
        self,
        repo_name: str,
        branch_name: str,
        message: str,
        committer: str = "",
        metadata: dict[str, str] | None = None,
        allow_empty: bool = False,
    ) -> CommitOutcome:
        repo = self.core.live_repo(repo_name)
        names.check_branch_name(branch_name)
        self.core.protection.check(repo, branch_name, COMMIT)
        params = CommitParams(message, committer, dict(metadata or {}), allow_empty)
        names.check_commit_metadata(params.message, params.metadata)
        attributes = {"quarry.repository": repo.name, "quarry.branch": branch_name}
        with tracer.start_as_current_span("graveler.commit", attributes=attributes) as span:

            def exhausted() -> gerrors.BranchContended:
                return gerrors.BranchContended(
                    f"commit on {branch_name!r} lost the race {self.core.retries.branch.max_attempts} times; retry",
                    metadata={"repository": repo.name, "branch": branch_name},
                )

            for attempt in self.core.retries.branch.attempts(exhausted):
                outcome = self._commit_attempt(repo, branch_name, params)
                if outcome is not None:
                    span.set_attribute("quarry.commit", outcome.commit.id)
                    span.set_attribute("quarry.attempts", attempt + 1)
                    event = actions.commit_event(repo, branch_name, params, "post-commit")
                    event.commit_id = outcome.commit.id
                    actions.post_event(self.core, self.reads, repo, outcome.commit, event)
                    return outcome
                cas_retry("commit", attempt + 1)
        raise AssertionError("unreachable")

    def _commit_attempt(
        self, repo: Repository, branch_name: str, params: CommitParams
    ) -> CommitOutcome | None:
        """One attempt; None means "lost a race, start over"."""
        deadlines.check()  # an expired or cancelled commit seals nothing
        branch = self.seal(repo, branch_name)
        if branch is None:
            return None
        applied = list(branch.sealed_tokens)
        head = self.refs.get_commit(repo, branch.commit_id)
        base = branch.compacted_metarange_id or head.metarange_id
        # (2)+(3) Combine the sealed tokens (newest wins) and apply them onto the base.
        attributes = {"quarry.tokens": len(applied)}
        with tracer.start_as_current_span("graveler.apply", attributes=attributes) as span:
            if applied:
                result = self.core.range_writer.apply_changes(
                    repo.storage_namespace, base, self.reads.staged_changes(applied)
                )
            else:
                result = ApplyResult(metarange_id=base)
            span.set_attribute("quarry.ranges_written", result.ranges_written)
            span.set_attribute("quarry.ranges_reused", result.ranges_reused)
        if branch.compacted_metarange_id:
            # The apply counted changes against the compacted metarange; the commit's
            # summary is against HEAD (a walk of the ranges that differ only).
            result = ApplyResult(
                result.metarange_id,
                self.reads.summary_between(repo, head.metarange_id, result.metarange_id),
                result.ranges_written,
                result.ranges_reused,
            )
        if (
            result.summary.total == 0
            and not params.allow_empty
            and result.metarange_id == head.metarange_id
        ):
            # Nothing to commit; still retire the sealed tokens so they are not re-applied.
            if applied and not self.retire(repo, branch_name, branch, Retirement(applied)):
                return None
            raise gerrors.NoChanges(
                f"no changes to commit on {branch_name!r}",
                metadata={"repository": repo.name, "branch": branch_name},
            )
        # Pre-commit hooks judge the metarange this attempt commits: the sealed tokens
        # applied, action files read from it. Writes arriving while they run are
        # acknowledged on the fresh token (a writer that hit a sealed token writes again
        # to the new one) and stay staged for the next commit. A failure raises before
        # anything moves: the sealed tokens stay on the branch with every staged write
        # (the next commit applies them); the ranges written are garbage for GC.
        event = actions.commit_event(repo, branch_name, params, "pre-commit")
        actions.pre_event(self.core, self.reads, repo, result.metarange_id, event)
        # (4) The commit record (content-addressed, so a retry writes the same key).
        commit = make_commit(
            CommitRecord(
                [head.id],
                result.metarange_id,
                params.message,
                params.committer,
                params.metadata,
                head.generation + 1,
            )
        )
        with tracer.start_as_current_span("graveler.write_commit"):
            self.refs.insert_commit(repo, commit)
        # (5) Move the branch and drop exactly the tokens applied.
        if not self.retire(repo, branch_name, branch, Retirement(applied, commit.id)):
            return None
        return CommitOutcome(commit, result.summary, result.ranges_written, result.ranges_reused)

    def seal(self, repo: Repository, branch_name: str) -> types_pb2.Branch | None:
        """(1) Seal: push the staging token onto the sealed list and install a fresh one
        with dirty=false, in one branch update. Only a dirty token can hold acknowledged
        writes, so a clean branch is not sealed (its record is returned as it is). None if
        the update kept losing (typically to writers marking the branch dirty)."""
        with tracer.start_as_current_span("graveler.seal"):
            try:
                update = self.refs.update_branch(
                    repo, branch_name, sealer(repo.staging_shards), step="seal"
                )
            except gerrors.BranchNotFound as missing:
                raise self.core.not_a_branch(repo, branch_name, missing) from None
            except gerrors.BranchContended:
                return None
            if update.changed:
                self.core.forget_branch(repo, branch_name)
            return update.branch

    def retire(
        self,
        repo: Repository,
        branch_name: str,
        expected: types_pb2.Branch,
        retirement: Retirement,
    ) -> bool:
        """Set HEAD (a commit: the compacted metarange is cleared) or the compacted metarange
        (a compaction), and remove exactly the applied tokens from the sealed list,
        re-reading the record on conflicts caused by fields we do not own (a writer marking
        it dirty, a new seal in front, the sensor's guard). False if HEAD or the base moved,
        or the sealed list lost the tokens: the work must be redone."""
        with tracer.start_as_current_span("graveler.swap_branch"):
            # (6) The dropper deletes the retired tokens' items after a grace period, once
            # the branch no longer references them: queued before the swap, so a process
            # that dies right after it leaves no orphan token (queue_retiring_tokens).
            self.core.staging.queue_retiring_tokens(retirement.applied, repo.partition, branch_name)
            # The last point to stop: a call that expired or was cancelled moves no branch
            # (its ranges and commit record are only unreferenced garbage for GC).
            deadlines.check()
            try:
                self.refs.update_branch(
                    repo, branch_name, _retire(expected, retirement), step="swap_branch"
                )
            except (_Moved, gerrors.BranchContended):
                return False
            self.core.forget_branch(repo, branch_name)
            return True

    # ---- staging compaction ----------------------------------------------------------------

    def compact(self, repo_name: str, branch_name: str) -> tuple[str, int]:
        """Fold the branch's uncommitted changes into a compacted metarange: seal, apply
        every sealed token onto the compacted (or HEAD) metarange, then retire {compacted =
        new, drop exactly those tokens}. Reads then find those changes in one metarange
        instead of scanning staging partitions (a million tombstones cost nothing to list
        any more). Returns (compacted metarange id, number of tokens compacted)."""
        repo = self.core.live_repo(repo_name)
        names.check_branch_name(branch_name)
        attributes = {"quarry.repository": repo.name, "quarry.branch": branch_name}
        with tracer.start_as_current_span("graveler.compact", attributes=attributes):
            return self._compact(repo, branch_name)

    def _compact(self, repo: Repository, branch_name: str) -> tuple[str, int]:
        def exhausted() -> gerrors.BranchContended:
            return gerrors.BranchContended(
                f"branch {branch_name!r} kept changing during compaction; retry",
                metadata={"repository": repo.name, "branch": branch_name},
            )

        for _ in self.core.retries.branch.attempts(exhausted):
            branch = self.seal(repo, branch_name)
            if branch is None:
                continue
            applied = list(branch.sealed_tokens)
            if not applied:
                return branch.compacted_metarange_id, 0
            head = self.refs.get_commit(repo, branch.commit_id)
            base = branch.compacted_metarange_id or head.metarange_id
            result = self.core.range_writer.apply_changes(
                repo.storage_namespace, base, self.reads.staged_changes(applied)
            )
            retirement = Retirement(applied, new_compacted=result.metarange_id)
            if self.retire(repo, branch_name, branch, retirement):
                return result.metarange_id, len(applied)
        raise AssertionError("unreachable")


__all__ = ["CommitOutcome", "CommitParams", "Commits", "Retirement"]
