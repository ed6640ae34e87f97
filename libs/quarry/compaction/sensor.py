"""CompactionSensor: per-branch staging statistics and the decision to compact.

What it knows (docs/architecture.md §4 "Staging compaction"):

* `StagingStats` per (repository, branch, staging token): staged puts and deletes, as
  reported by branch-manager (`record`, in memory only — the report path does no I/O).
* per branch: the number of sealed tokens and when the last compaction started, both
  from the branch record in the KV store.

Evaluating a branch (`evaluate_once`, run by the background loop every
compaction_check_interval_seconds, and `get_branch_stats`) reads its branch record and
forgets the counters of tokens that are neither the staging token nor a sealed token any
more (committed, compacted, reset, discarded). A branch this process has never evaluated
(after a restart, or first heard of through a report) is rebuilt by scanning its staging
and sealed token partitions and counting entries and tombstones (StagedValue). The scan
stops as soon as the branch is known to be past a threshold, or after
`rebuild_max_items_per_branch` items; the loop starts no further rebuild in a cycle once it
has scanned `rebuild_items_per_cycle` items, the rest wait for the next cycle. Discovery
(listing every repository's branches to find those with staged or sealed data) runs at the
first evaluation and then every `discovery_interval_seconds`.
Counts are a heuristic: a path staged twice is reported twice, and writes reported while a
branch is being rebuilt may be counted both by the scan and by their report.

Triggering (at most once per compaction_min_interval_seconds per branch, across every
replica sharing the KV store): read the branch; if its compaction_start_time is within the
interval, skip (quarry_compactions_skipped_total{reason="guard"}); otherwise SetIf the
record (Equals the predicate just read) with compaction_start_time = now. Only the winner of
that SetIf (a loser counts reason="race") calls the committer's Compact. A failing Compact
(e.g. UNIMPLEMENTED) is logged; the sensor carries on and may try again after the interval.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Unpack

from quarry import errors
from quarry.compaction.rebuild import RebuildMixin
from quarry.compaction.state import (
    COMPACTION_DURATION,
    COMPACTIONS,
    COMPACTIONS_SKIPPED,
    ENTRIES_COMPACTED,
    LIST_PAGE,
    REASON_SEALED_TOKENS,
    REASON_STAGED_ENTRIES,
    REASON_TOMBSTONES,
    SEALED_TOKENS,
    SENSOR_METRICS,
    TOMBSTONES_COMPACTED,
    BranchState,
    BranchStats,
    Candidate,
    CompactionResult,
    Compactor,
    SensorTuning,
    Snapshot,
    StagingStats,
    Thresholds,
    TuningOptions,
    seconds,
)
from quarry.compaction.trigger import TriggerMixin
from quarry.config import Settings
from quarry.graveler import errors as gerrors
from quarry.graveler import records
from quarry.graveler.refs import RefManager, is_dirty
from quarry.kv import store as kv
from quarry.paging import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, PageBudget
from quarry.runtime.periodic import PeriodicWorker
from quarry.telemetry.metrics import branch_labels, expose

log = logging.getLogger(__name__)


class CompactionSensor(RebuildMixin, TriggerMixin):
    """Thread-safe. `record` is the report path (memory only); everything that reads the KV
    store or calls the committer runs in `evaluate_once` (the background loop) or in
    `get_branch_stats`."""

    def __init__(
        self,
        store: kv.Store,
        compactor: Compactor | None,
        thresholds: Thresholds | None = None,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        **options: Unpack[TuningOptions],
    ) -> None:
        """`options`: the fields of SensorTuning (intervals and rebuild budgets). `clock`:
        the wall clock (compaction ages); `monotonic`: the clock of the refresh and
        discovery schedules (a test moves either instead of waiting)."""
        expose(*SENSOR_METRICS)
        tuning = replace(SensorTuning(), **options)
        check_interval_seconds = tuning.check_interval_seconds
        self.kv = store
        self.max_response_bytes = tuning.max_response_bytes
        self.refs = RefManager(store)
        self.compactor = compactor
        self.thresholds = thresholds or Thresholds()
        self.min_interval_seconds = tuning.min_interval_seconds
        self.check_interval_seconds = check_interval_seconds
        self.rebuild_items_per_cycle = tuning.rebuild_items_per_cycle
        self.rebuild_max_items_per_branch = tuning.rebuild_max_items_per_branch
        self.discovery_interval_seconds = tuning.discovery_interval_seconds
        self.stale_after_seconds = tuning.stale_after_seconds
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._branches: dict[tuple[str, str], BranchState] = {}
        self._discovered_at: float | None = None
        # Evaluates at once, then every check interval; a failed pass (e.g. the kv-gateway
        # is away) is logged once per streak and the next one comes at the same interval.
        self._worker = PeriodicWorker(
            "compactor-sensor",
            self.evaluate_once,
            check_interval_seconds,
            retry_initial=check_interval_seconds,
        )

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        store: kv.Store,
        compactor: Compactor | None,
        **options: Unpack[TuningOptions],
    ) -> CompactionSensor:
        tuning: TuningOptions = {
            "min_interval_seconds": settings.compaction_min_interval_seconds,
            "check_interval_seconds": settings.compaction_check_interval_seconds,
            "max_response_bytes": settings.max_response_bytes,
        }
        tuning.update(options)
        return cls(store, compactor, Thresholds.from_settings(settings), **tuning)

    # ---- the report path (memory only) --------------------------------------------------------

    def record(self, reports: Iterable[StagingStats]) -> int:
        """Add reported staging activity. Never does I/O. Returns the reports accepted."""
        accepted = 0
        with self._lock:
            for report in reports:
                if not report.repository or not report.branch:
                    continue
                puts, deletes = max(0, int(report.puts)), max(0, int(report.deletes))
                if not puts and not deletes:
                    continue
                key = (report.repository, report.branch)
                state = self._branches.get(key)
                if state is None:
                    state = self._branches[key] = BranchState()
                token = report.staging_token or state.staging_token
                counts = state.tokens.setdefault(token, [0, 0])
                counts[0] += puts
                counts[1] += deletes
                state.reports += 1
                accepted += 1
        return accepted

    # ---- answers ---------------------------------------------------------------------------

    def get_branch_stats(self, repository: str, branch: str) -> BranchStats:
        """Fresh statistics: reads the branch record (NOT_FOUND for a missing repository or
        branch) and, for a branch not known yet, counts its staged items from the KV."""
        key = (repository, branch)
        snapshot = self._refresh(key, missing_ok=False)
        assert snapshot is not None  # missing_ok=False: NOT_FOUND raised instead
        self._rebuild(key, snapshot)
        return self._stats(key)

    def list_candidates(self, page_size: int = 0) -> list[Candidate]:
        """Branches past a threshold, from memory (as of the last evaluation and reports),
        most tombstones first: the first `page_size`, or fewer when they would take the
        response past max_response_bytes."""
        if page_size < 0:
            raise errors.InvalidArgument("page_size may not be negative")
        budget = PageBudget(
            min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE), self.max_response_bytes
        )
        out = []
        for candidate in self._candidates():
            if not budget.admit(candidate):
                break
            out.append(candidate)
        return out

    def _candidates(self) -> list[Candidate]:
        out = []
        with self._lock:
            for (repository, branch), state in self._branches.items():
                puts, deletes = state.totals()
                reasons = self.thresholds.reasons(puts, deletes, state.sealed_tokens)
                if reasons:
                    out.append(
                        Candidate(
                            repository,
                            branch,
                            puts,
                            deletes,
                            state.sealed_tokens,
                            ",".join(reasons),
                        )
                    )
        out.sort(
            key=lambda c: (
                -c.deletes,
                -(c.puts + c.deletes),
                -c.sealed_tokens,
                c.repository,
                c.branch,
            )
        )
        return out

    def _stats(self, key: tuple[str, str]) -> BranchStats:
        with self._lock:
            state = self._branches.get(key)
            if state is None:
                return BranchStats(key[0], key[1], 0, 0, 0, None)
            puts, deletes = state.totals()
            tokens = tuple(
                StagingStats(key[0], key[1], token, c[0], c[1]) for token, c in state.tokens.items()
            )
            return BranchStats(
                key[0], key[1], puts, deletes, state.sealed_tokens, state.last_compaction, tokens
            )

    # ---- evaluation ------------------------------------------------------------------------

    def evaluate_once(self) -> list[tuple[str, str]]:
        """One pass of the background loop: discover branches (at start and then every
        discovery interval), refresh the branches that need it (rebuilding unknown ones
        within the per-cycle budget), then trigger compactions for candidates. Returns the
        branches for which Compact was called."""
        try:
            self._maybe_discover()
        except Exception:  # the KV may be back next cycle
            log.warning("compactor-sensor: discovering branches failed", exc_info=True)
        budget = self.rebuild_items_per_cycle
        snapshots: dict[tuple[str, str], Snapshot] = {}
        for key in self._due_for_refresh():
            try:
                snapshot = self._refresh(key, missing_ok=True)
                if snapshot is None:
                    continue
                snapshots[key] = snapshot
                if budget > 0:
                    budget -= self._rebuild(key, snapshot)
            except Exception:  # one branch must not stop the others
                log.warning("compactor-sensor: evaluating %s/%s failed", *key, exc_info=True)
        triggered = []
        for candidate in self._candidates():
            key = (candidate.repository, candidate.branch)
            snapshot = snapshots.get(key)
            if snapshot is None:
                continue  # its record could not be read this cycle
            try:
                if self._trigger(candidate, snapshot):
                    triggered.append(key)
            except Exception:
                log.warning("compactor-sensor: triggering %s/%s failed", *key, exc_info=True)
        return triggered

    def _due_for_refresh(self) -> list[tuple[str, str]]:
        now = self._monotonic()
        due = []
        with self._lock:
            for key, state in self._branches.items():
                puts, deletes = state.totals()
                if (
                    state.reports != state.refreshed_reports
                    or not state.rebuilt
                    or self.thresholds.reasons(puts, deletes, state.sealed_tokens)
                    or (
                        (puts or deletes or state.sealed_tokens)
                        and now - state.refreshed_at >= self.stale_after_seconds
                    )
                ):
                    due.append(key)
        return due

    def _refresh(self, key: tuple[str, str], missing_ok: bool) -> Snapshot | None:
        """Read the branch record; drop the counters of tokens it no longer holds."""
        with self._lock:
            state = self._branches.get(key)
            known_tokens = set(state.tokens) if state is not None else set()
            reports_before = state.reports if state is not None else 0
        try:
            repo = self.refs.get_repository(key[0])
            branch, predicate = self.refs.get_branch(repo, key[1])
        except (gerrors.RepositoryNotFound, gerrors.BranchNotFound):
            self._forget(key)
            if missing_ok:
                return None
            raise
        except records.CorruptRecord as exc:
            # Park the branch: forgotten until a new report names it, so a corrupt record
            # is not re-read (and logged) every cycle; the other branches carry on.
            self._forget(key)
            records.CORRUPT_RECORDS_PARKED.labels(exc.record).inc()
            log.warning(
                "compactor-sensor: parked %s/%s (corrupt record partition=%s key=%s)",
                key[0],
                key[1],
                records.show(exc.partition),
                records.show(exc.key),
            )
            if missing_ok:
                return None
            raise
        live = {branch.staging_token, *branch.sealed_tokens}
        last = (
            seconds(branch.compaction_start_time)
            if branch.HasField("compaction_start_time")
            else None
        )
        with self._lock:
            state = self._branches.get(key)
            if state is None:
                state = self._branches[key] = BranchState()
            unattributed = state.tokens.pop("", None)
            if unattributed is not None:
                counts = state.tokens.setdefault(branch.staging_token, [0, 0])
                counts[0] += unattributed[0]
                counts[1] += unattributed[1]
            # Only tokens known before the read may be judged by it: a report that arrived
            # since may name a token newer than the record we read.
            for token in list(state.tokens):
                if token in known_tokens and token not in live:
                    del state.tokens[token]
            state.sealed_tokens = len(branch.sealed_tokens)
            state.last_compaction = last
            state.staging_token = branch.staging_token
            state.refreshed_reports = reports_before
            state.refreshed_at = self._monotonic()
            if not state.rebuilt and not is_dirty(branch) and not branch.sealed_tokens:
                state.rebuilt = True  # nothing acknowledged is staged: nothing to count
        SEALED_TOKENS.labels(*branch_labels(key[0], key[1])).set(len(branch.sealed_tokens))
        return Snapshot(repo, branch, predicate)

    def _forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._branches.pop(key, None)
        with contextlib.suppress(KeyError):
            SEALED_TOKENS.remove(key[0], key[1])

    # ---- the background loop ---------------------------------------------------------------

    def start(self) -> CompactionSensor:
        self._worker.start(first_delay=0)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._worker.stop(timeout)


__all__ = [
    "COMPACTION_DURATION",
    "COMPACTIONS",
    "COMPACTIONS_SKIPPED",
    "ENTRIES_COMPACTED",
    "LIST_PAGE",
    "REASON_SEALED_TOKENS",
    "REASON_STAGED_ENTRIES",
    "REASON_TOMBSTONES",
    "SEALED_TOKENS",
    "TOMBSTONES_COMPACTED",
    "BranchStats",
    "Candidate",
    "CompactionResult",
    "CompactionSensor",
    "Compactor",
    "StagingStats",
    "Thresholds",
]
