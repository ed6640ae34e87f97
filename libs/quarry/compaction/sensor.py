"""CompactionSensor: per-branch staging statistics and the decision to compact.

What it knows (ARCHITECTURE.md §4 "Staging compaction", seeds/staging-compaction.md):

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

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

from prometheus_client import Counter, Gauge, Histogram

from quarry import errors
from quarry.config import Settings
from quarry.graveler import errors as gerrors
from quarry.graveler import layout, records
from quarry.graveler.retry import ONCE
from quarry.graveler.refs import RefManager, Repository, is_dirty
from quarry.kv import store as kv
from quarry.graveler.layout import staging_partition
from quarry.graveler.staging import SCAN_BATCH
from quarry.paging import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, PageBudget
from quarry.runtime.periodic import PeriodicWorker
from quarry.v1 import compactor_sensor_pb2, types_pb2

log = logging.getLogger(__name__)

# ---- metrics (global registry) --------------------------------------------------------------

COMPACTION_DURATION = Histogram(
    "quarry_compaction_duration_seconds",
    "Duration of the committer's Compact calls made by the compactor-sensor",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600))
ENTRIES_COMPACTED = Counter(
    "quarry_compaction_entries_compacted",
    "Staged entries (puts) counted on the tokens of successfully compacted branches")
TOMBSTONES_COMPACTED = Counter(
    "quarry_compaction_tombstones_compacted",
    "Staged tombstones (deletes) counted on the tokens of successfully compacted branches")
SEALED_TOKENS = Gauge(
    "quarry_branch_sealed_tokens", "Sealed staging tokens of a branch (from its record)",
    ["repo", "branch"])
COMPACTIONS_SKIPPED = Counter(
    "quarry_compactions_skipped",
    "Candidate branches not compacted: guard = a compaction started within the minimum "
    "interval; race = another writer or sensor changed the branch record first",
    ["reason"])
COMPACTIONS = Counter(
    "quarry_compactions", "Compact calls made by the compactor-sensor, by outcome",
    ["outcome"])

# ---- reasons -------------------------------------------------------------------------------

REASON_TOMBSTONES = "tombstones"
REASON_STAGED_ENTRIES = "staged_entries"
REASON_SEALED_TOKENS = "sealed_tokens"

LIST_PAGE = 100


# ---- values --------------------------------------------------------------------------------

@dataclass
class StagingStats:
    """Staged writes reported for one staging token of a branch."""

    repository: str
    branch: str
    staging_token: str
    puts: int = 0
    deletes: int = 0


@dataclass(frozen=True)
class BranchStats:
    repository: str
    branch: str
    puts: int
    deletes: int
    sealed_tokens: int
    # When the last compaction of the branch started (its record's compaction_start_time,
    # unix seconds), None if never.
    last_compaction: float | None
    tokens: tuple[StagingStats, ...] = ()


@dataclass(frozen=True)
class Candidate:
    repository: str
    branch: str
    puts: int
    deletes: int
    sealed_tokens: int
    reason: str  # the thresholds crossed, comma separated: "tombstones,sealed_tokens"

    def to_proto(self) -> compactor_sensor_pb2.CompactionCandidate:
        return compactor_sensor_pb2.CompactionCandidate(
            repository=self.repository, branch=self.branch, puts=self.puts,
            deletes=self.deletes, sealed_tokens=self.sealed_tokens, reason=self.reason)


@dataclass(frozen=True)
class CompactionResult:
    compacted_metarange_id: str
    tokens_compacted: int


class Compactor(Protocol):
    """The committer's Compact (over gRPC in the service; a fake in tests)."""

    def compact(self, repository: str, branch: str) -> CompactionResult: ...


@dataclass(frozen=True)
class Thresholds:
    """A threshold of 0 is disabled. A branch is a candidate once a count reaches one."""

    tombstones: int = 100_000
    staged_entries: int = 1_000_000
    sealed_tokens: int = 10

    @classmethod
    def from_settings(cls, settings) -> "Thresholds":
        return cls(tombstones=settings.compaction_tombstones_threshold,
                   staged_entries=settings.compaction_staged_entries_threshold,
                   sealed_tokens=settings.compaction_sealed_tokens_threshold)

    def reasons(self, puts: int, deletes: int, sealed_tokens: int) -> list[str]:
        found = []
        if self.tombstones > 0 and deletes >= self.tombstones:
            found.append(REASON_TOMBSTONES)
        if self.staged_entries > 0 and puts + deletes >= self.staged_entries:
            found.append(REASON_STAGED_ENTRIES)
        if self.sealed_tokens > 0 and sealed_tokens >= self.sealed_tokens:
            found.append(REASON_SEALED_TOKENS)
        return found

    def staged_decided(self, puts: int, deletes: int) -> bool:
        """Past a staged-item threshold already: a rebuild scan may stop counting."""
        return bool(self.reasons(puts, deletes, 0))


@dataclass
class _BranchState:
    # staging token → [puts, deletes]; "" collects reports that did not name a token.
    tokens: dict[str, list[int]] = field(default_factory=dict)
    sealed_tokens: int = 0
    last_compaction: float | None = None
    staging_token: str = ""
    # Rebuilt from the KV store (or known to need no rebuild).
    rebuilt: bool = False
    # Reports received / the report count at the last refresh: a refresh is due when they
    # differ.
    reports: int = 0
    refreshed_reports: int = -1
    refreshed_at: float = float("-inf")  # monotonic
    rebuild_lock: threading.Lock = field(default_factory=threading.Lock)

    def totals(self) -> tuple[int, int]:
        puts = sum(c[0] for c in self.tokens.values())
        deletes = sum(c[1] for c in self.tokens.values())
        return puts, deletes


@dataclass
class _Snapshot:
    """A branch record as read by a refresh, with the predicate for a SetIf."""

    repo: Repository
    branch: types_pb2.Branch
    predicate: bytes


def _seconds(ts) -> float:
    return ts.seconds + ts.nanos / 1e9


# ---- the sensor ----------------------------------------------------------------------------

class CompactionSensor:
    """Thread-safe. `record` is the report path (memory only); everything that reads the KV
    store or calls the committer runs in `evaluate_once` (the background loop) or in
    `get_branch_stats`."""

    def __init__(self, store: kv.Store, compactor: Compactor | None,
                 thresholds: Thresholds | None = None, *,
                 min_interval_seconds: float = 60.0,
                 check_interval_seconds: float = 5.0,
                 rebuild_items_per_cycle: int = 200_000,
                 rebuild_max_items_per_branch: int = 2_000_000,
                 discovery_interval_seconds: float = 600.0,
                 stale_after_seconds: float = 60.0,
                 max_response_bytes: int = Settings.max_response_bytes,
                 clock: Callable[[], float] = time.time):
        self.kv = store
        self.max_response_bytes = max_response_bytes
        self.refs = RefManager(store)
        self.compactor = compactor
        self.thresholds = thresholds or Thresholds()
        self.min_interval_seconds = min_interval_seconds
        self.check_interval_seconds = check_interval_seconds
        self.rebuild_items_per_cycle = rebuild_items_per_cycle
        self.rebuild_max_items_per_branch = rebuild_max_items_per_branch
        self.discovery_interval_seconds = discovery_interval_seconds
        self.stale_after_seconds = stale_after_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._branches: dict[tuple[str, str], _BranchState] = {}
        self._discovered_at: float | None = None
        # Evaluates at once, then every check interval; a failed pass (e.g. the kv-gateway
        # is away) is logged once per streak and the next one comes at the same interval.
        self._worker = PeriodicWorker("compactor-sensor", self.evaluate_once,
                                      check_interval_seconds,
                                      retry_initial=check_interval_seconds)

    @classmethod
    def from_settings(cls, settings, store: kv.Store, compactor: Compactor | None,
                      **kwargs) -> "CompactionSensor":
        return cls(store, compactor, Thresholds.from_settings(settings),
                   min_interval_seconds=settings.compaction_min_interval_seconds,
                   check_interval_seconds=settings.compaction_check_interval_seconds,
                   max_response_bytes=settings.max_response_bytes, **kwargs)

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
                    state = self._branches[key] = _BranchState()
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
        self._rebuild(key, snapshot)
        return self._stats(key)

    def list_candidates(self, page_size: int = 0) -> list[Candidate]:
        """Branches past a threshold, from memory (as of the last evaluation and reports),
        most tombstones first: the first `page_size`, or fewer when they would take the
        response past max_response_bytes."""
        if page_size < 0:
            raise errors.InvalidArgument("page_size may not be negative")
        budget = PageBudget(min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE),
                            self.max_response_bytes)
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
                    out.append(Candidate(repository, branch, puts, deletes,
                                         state.sealed_tokens, ",".join(reasons)))
        out.sort(key=lambda c: (-c.deletes, -(c.puts + c.deletes), -c.sealed_tokens,
                                c.repository, c.branch))
        return out

    def _stats(self, key: tuple[str, str]) -> BranchStats:
        with self._lock:
            state = self._branches.get(key)
            if state is None:
                return BranchStats(key[0], key[1], 0, 0, 0, None)
            puts, deletes = state.totals()
            tokens = tuple(StagingStats(key[0], key[1], token, c[0], c[1])
                           for token, c in state.tokens.items())
            return BranchStats(key[0], key[1], puts, deletes, state.sealed_tokens,
                               state.last_compaction, tokens)

    # ---- evaluation ------------------------------------------------------------------------

    def evaluate_once(self) -> list[tuple[str, str]]:
        """One pass of the background loop: discover branches (at start and then every
        discovery interval), refresh the branches that need it (rebuilding unknown ones
        within the per-cycle budget), then trigger compactions for candidates. Returns the
        branches for which Compact was called."""
        try:
            self._maybe_discover()
        except Exception:  # noqa: BLE001 — the KV may be back next cycle
            log.warning("compactor-sensor: discovering branches failed", exc_info=True)
        budget = self.rebuild_items_per_cycle
        snapshots: dict[tuple[str, str], _Snapshot] = {}
        for key in self._due_for_refresh():
            try:
                snapshot = self._refresh(key, missing_ok=True)
                if snapshot is None:
                    continue
                snapshots[key] = snapshot
                if budget > 0:
                    budget -= self._rebuild(key, snapshot)
            except Exception:  # noqa: BLE001 — one branch must not stop the others
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
            except Exception:  # noqa: BLE001
                log.warning("compactor-sensor: triggering %s/%s failed", *key, exc_info=True)
        return triggered

    def _due_for_refresh(self) -> list[tuple[str, str]]:
        now = time.monotonic()
        due = []
        with self._lock:
            for key, state in self._branches.items():
                puts, deletes = state.totals()
                if (state.reports != state.refreshed_reports or not state.rebuilt
                        or self.thresholds.reasons(puts, deletes, state.sealed_tokens)
                        or ((puts or deletes or state.sealed_tokens)
                            and now - state.refreshed_at >= self.stale_after_seconds)):
                    due.append(key)
        return due

    def _refresh(self, key: tuple[str, str], missing_ok: bool) -> _Snapshot | None:
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
            log.warning("compactor-sensor: parked %s/%s (corrupt record partition=%s key=%s)",
                        key[0], key[1], records.show(exc.partition), records.show(exc.key))
            if missing_ok:
                return None
            raise
        live = {branch.staging_token, *branch.sealed_tokens}
        last = (_seconds(branch.compaction_start_time)
                if branch.HasField("compaction_start_time") else None)
        with self._lock:
            state = self._branches.get(key)
            if state is None:
                state = self._branches[key] = _BranchState()
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
            state.refreshed_at = time.monotonic()
            if not state.rebuilt and not is_dirty(branch) and not branch.sealed_tokens:
                state.rebuilt = True  # nothing acknowledged is staged: nothing to count
        SEALED_TOKENS.labels(key[0], key[1]).set(len(branch.sealed_tokens))
        return _Snapshot(repo, branch, predicate)

    def _forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._branches.pop(key, None)
        try:
            SEALED_TOKENS.remove(key[0], key[1])
        except KeyError:
            pass

    # ---- rebuild from the KV store -------------------------------------------------------------

    def _rebuild(self, key: tuple[str, str], snapshot: _Snapshot) -> int:
        """Count the staged items of a branch not rebuilt yet. Returns items scanned."""
        with self._lock:
            state = self._branches.get(key)
        if state is None or state.rebuilt:
            return 0
        with state.rebuild_lock:
            if state.rebuilt:
                return 0
            branch = snapshot.branch
            tokens = ([branch.staging_token] if is_dirty(branch) else []) + \
                list(branch.sealed_tokens)
            with self._lock:
                before = {t: tuple(c) for t, c in state.tokens.items()}
            scanned: dict[str, list[int]] = {}
            total = [0, 0]
            items = 0
            for token in tokens:
                if self.thresholds.staged_decided(*total) or \
                        items >= self.rebuild_max_items_per_branch:
                    break
                counts = scanned[token] = [0, 0]
                items += self._count_token(token, counts, total,
                                           self.rebuild_max_items_per_branch - items)
            with self._lock:
                if self._branches.get(key) is not state:
                    return items  # forgotten meanwhile
                for token, (puts, deletes) in scanned.items():
                    now = state.tokens.get(token, [0, 0])
                    was = before.get(token, (0, 0))
                    # Reports received during the scan are added to what the scan counted.
                    state.tokens[token] = [puts + now[0] - was[0], deletes + now[1] - was[1]]
                    if state.tokens[token] == [0, 0]:
                        del state.tokens[token]
                state.rebuilt = True
            if items:
                log.info("compactor-sensor: rebuilt %s/%s from the KV store: %d staged items "
                         "in %d token(s)", key[0], key[1], items, len(scanned))
            return items

    def _count_token(self, token: str, counts: list[int], total: list[int],
                     limit: int) -> int:
        items = 0
        partition = staging_partition(token)
        iterator = self.kv.scan(partition, batch_size=SCAN_BATCH)
        try:
            for item in iterator:
                try:
                    value = layout.decode_staged_value(partition, item.key, item.value)
                except records.CorruptRecord as exc:
                    records.note_skipped(exc)  # uncounted; the rest of the token still is
                    continue
                index = 0 if layout.is_staged_entry(value) else 1
                counts[index] += 1
                total[index] += 1
                items += 1
                if items >= limit or (items % SCAN_BATCH == 0
                                      and self.thresholds.staged_decided(*total)):
                    break
        finally:
            iterator.close()
        return items

    def _maybe_discover(self) -> None:
        """Find the branches with staged or sealed data that this process has not heard of
        (after a restart): they are refreshed and rebuilt like reported ones."""
        now = time.monotonic()
        if self._discovered_at is not None and \
                now - self._discovered_at < self.discovery_interval_seconds:
            return
        self._discovered_at = now
        with records.listing():  # corrupt repository/branch records: skipped, counted
            found = self._discover()
        if found:
            log.info("compactor-sensor: found %d branch(es) with staged data to count", found)

    def _discover(self) -> int:
        found = 0
        after = ""
        while True:
            repos = self.refs.list_repositories(after, LIST_PAGE)
            for repo in repos:
                branch_after = ""
                while True:
                    branches = self.refs.list_branches(repo, branch_after, LIST_PAGE)
                    for branch in branches:
                        if not is_dirty(branch) and not branch.sealed_tokens:
                            continue
                        with self._lock:
                            if (repo.name, branch.name) not in self._branches:
                                self._branches[(repo.name, branch.name)] = _BranchState()
                                found += 1
                    if len(branches) < LIST_PAGE:
                        break
                    branch_after = branches[-1].name
            if len(repos) < LIST_PAGE:
                break
            after = repos[-1].name
        return found

    # ---- triggering ------------------------------------------------------------------------

    def _trigger(self, candidate: Candidate, snapshot: _Snapshot) -> bool:
        """Claim the branch through its record, then call Compact. True if Compact was
        called (whatever its outcome)."""
        branch = snapshot.branch
        now = self._clock()
        if branch.HasField("compaction_start_time") and \
                abs(now - _seconds(branch.compaction_start_time)) < self.min_interval_seconds:
            COMPACTIONS_SKIPPED.labels("guard").inc()
            log.debug("compactor-sensor: %s/%s compacted recently; skipping",
                      candidate.repository, candidate.branch)
            return False
        if self.compactor is None:
            return False
        if not self._claim(snapshot, now):
            COMPACTIONS_SKIPPED.labels("race").inc()
            log.debug("compactor-sensor: %s/%s changed before the claim; skipping",
                      candidate.repository, candidate.branch)
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
        log.info("compactor-sensor: compacting %s/%s (%s: %d puts, %d tombstones, %d sealed "
                 "tokens)", candidate.repository, candidate.branch, candidate.reason, puts,
                 deletes, candidate.sealed_tokens)
        started = time.monotonic()
        try:
            result = self.compactor.compact(candidate.repository, candidate.branch)
        except Exception as exc:  # noqa: BLE001 — log and carry on; retried after the interval
            COMPACTIONS.labels("error").inc()
            log.warning("compactor-sensor: Compact(%s/%s) failed: %s: %s", candidate.repository,
                        candidate.branch, getattr(exc, "reason", type(exc).__name__), exc)
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
        except Exception:  # noqa: BLE001 — the next cycle reads it again
            log.debug("compactor-sensor: re-reading %s/%s failed", *key, exc_info=True)
        log.info("compactor-sensor: compacted %s/%s into metarange %s (%d token(s)) in %.2fs",
                 candidate.repository, candidate.branch, result.compacted_metarange_id,
                 result.tokens_compacted, time.monotonic() - started)
        return True

    def _claim(self, snapshot: _Snapshot, now: float) -> bool:
        """Set compaction_start_time = now if the branch record is still the one evaluated
        (one compare-and-swap through the branch update: only the winner compacts)."""

        def claim(branch: types_pb2.Branch) -> types_pb2.Branch:
            branch.compaction_start_time.FromNanoseconds(int(now * 1e9))
            return branch

        try:
            self.refs.update_branch(snapshot.repo, snapshot.branch.name, claim,
                                    step="compaction_claim", policy=ONCE,
                                    expect=(snapshot.branch, snapshot.predicate))
        except gerrors.BranchContended:
            return False
        return True

    # ---- the background loop ---------------------------------------------------------------

    def start(self) -> "CompactionSensor":
        self._worker.start(first_delay=0)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._worker.stop(timeout)
