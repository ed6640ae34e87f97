"""Triggering a compaction: the guard (compaction_start_time within the minimum interval),
the claim (one branch update: only the winner compacts) and the Compact call."""

from __future__ import annotations

import logging
import time

from quarry import telemetry
from quarry.compaction.state import (
    COMPACTION_DURATION,
    COMPACTIONS,
    COMPACTIONS_SKIPPED,
    ENTRIES_COMPACTED,
    TOMBSTONES_COMPACTED,
    Candidate,
    SensorParts,
    Snapshot,
    seconds,
)
from quarry.graveler import errors as gerrors
from quarry.graveler.retry import ONCE
from quarry.v1 import types_pb2

log = logging.getLogger("quarry.compaction.sensor")


class TriggerMixin(SensorParts):
    # ---- triggering ------------------------------------------------------------------------

    def _trigger(self, candidate: Candidate, snapshot: Snapshot) -> bool:
        """Claim the branch through its record, then call Compact. True if Compact was
        called (whatever its outcome)."""
        branch = snapshot.branch
        now = self._clock()
        if (
            branch.HasField("compaction_start_time")
            and abs(now - seconds(branch.compaction_start_time)) < self.min_interval_seconds
        ):
            COMPACTIONS_SKIPPED.labels("guard").inc()
            log.debug(
                "compactor-sensor: %s/%s compacted recently; skipping",
                candidate.repository,
                candidate.branch,
            )
            return False
        if self.compactor is None:
            return False
        # The sensor's loop runs unsampled (no spans while idle); a compaction is real work
        # and gets a trace of its own: claim, Compact and what the committer does for it.
        with telemetry.root_span(
            "compaction.trigger",
            {"quarry.repository": candidate.repository, "quarry.branch": candidate.branch},
        ):
            return self._claim_and_compact(candidate, snapshot, now)

    def _claim_and_compact(self, candidate: Candidate, snapshot: Snapshot, now: float) -> bool:
        branch = snapshot.branch
        if not self._claim(snapshot, now):
            COMPACTIONS_SKIPPED.labels("race").inc()
            log.debug(
                "compactor-sensor: %s/%s changed before the claim; skipping",
                candidate.repository,
                candidate.branch,
            )
            return False
        key = (candidate.repository, candidate.branch)
        tokens = {branch.staging_token, *branch.sealed_tokens}
        with self._lock:
            state = self._branches.get(key)
            if state is not None:
                state.last_compaction = now
                counted = [state.tokens.get(t, [0, 0]) for t in tokens]
                puts, deletes = sum(c[0] for c in counted), sum(c[1] for c in counted)
            else:
                puts = deletes = 0
        log.info(
            "compactor-sensor: compacting %s/%s (%s: %d puts, %d tombstones, %d sealed tokens)",
            candidate.repository,
            candidate.branch,
            candidate.reason,
            puts,
            deletes,
            candidate.sealed_tokens,
        )
        compactor = self.compactor
        assert compactor is not None  # the caller returned before the claim without one
        started = time.monotonic()
        try:
            result = compactor.compact(candidate.repository, candidate.branch)
        except Exception as exc:  # log and carry on; retried after the interval
            COMPACTIONS.labels("error").inc()
            log.warning(
                "compactor-sensor: Compact(%s/%s) failed: %s: %s",
                candidate.repository,
                candidate.branch,
                getattr(exc, "reason", type(exc).__name__),
                exc,
            )
            return True
        COMPACTION_DURATION.observe(time.monotonic() - started)
        COMPACTIONS.labels("ok").inc()
        ENTRIES_COMPACTED.inc(puts)
        TOMBSTONES_COMPACTED.inc(deletes)
        with self._lock:
            state = self._branches.get(key)
            if state is not None:
                for token in tokens:
                    state.tokens.pop(token, None)
        try:
            self._refresh(key, missing_ok=True)  # the compacted record: sealed tokens, gauge
        except Exception:  # the next cycle reads it again
            log.debug("compactor-sensor: re-reading %s/%s failed", *key, exc_info=True)
        log.info(
            "compactor-sensor: compacted %s/%s into metarange %s (%d token(s)) in %.2fs",
            candidate.repository,
            candidate.branch,
            result.compacted_metarange_id,
            result.tokens_compacted,
            time.monotonic() - started,
        )
        return True

    def _claim(self, snapshot: Snapshot, now: float) -> bool:
        """Set compaction_start_time = now if the branch record is still the one evaluated
        (one compare-and-swap through the branch update: only the winner compacts)."""

        def claim(branch: types_pb2.Branch) -> types_pb2.Branch:
            branch.compaction_start_time.FromNanoseconds(int(now * 1e9))
            return branch

        try:
            self.refs.update_branch(
                snapshot.repo,
                snapshot.branch.name,
                claim,
                step="compaction_claim",
                policy=ONCE,
                expect=(snapshot.branch, snapshot.predicate),
            )
        except gerrors.BranchContended:
            return False
        return True
