"""The compactor-sensor's values, thresholds, metrics and per-branch state (shared by
quarry.compaction.sensor, .rebuild and .trigger)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypedDict

from google.protobuf import timestamp_pb2
from prometheus_client import Counter, Gauge, Histogram

from quarry.config import Settings
from quarry.graveler.refs import RefManager, Repository
from quarry.kv import store as kv
from quarry.v1 import compactor_sensor_pb2, types_pb2

# ---- metrics ---------------------------------------------------------------------------------
# The compactor-sensor's own: exposed when a CompactionSensor is built (SENSOR_METRICS), not
# on import (branch-manager imports this package for its reporter). Branch labels are capped
# (quarry.telemetry.metrics.branch_labels).

COMPACTION_DURATION = Histogram(
    "quarry_compaction_duration_seconds",
    "Duration of the committer's Compact calls made by the compactor-sensor",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
    registry=None,
)
ENTRIES_COMPACTED = Counter(
    "quarry_compaction_entries_compacted",
    "Staged entries (puts) counted on the tokens of successfully compacted branches",
    registry=None,
)
TOMBSTONES_COMPACTED = Counter(
    "quarry_compaction_tombstones_compacted",
    "Staged tombstones (deletes) counted on the tokens of successfully compacted branches",
    registry=None,
)
SEALED_TOKENS = Gauge(
    "quarry_branch_sealed_tokens",
    "Sealed staging tokens of a branch (from its record)",
    ["repo", "branch"],
    registry=None,
)
COMPACTIONS_SKIPPED = Counter(
    "quarry_compactions_skipped",
    "Candidate branches not compacted: guard = a compaction started within the minimum "
    "interval; race = another writer or sensor changed the branch record first",
    ["reason"],
    registry=None,
)
COMPACTIONS = Counter(
    "quarry_compactions",
    "Compact calls made by the compactor-sensor, by outcome",
    ["outcome"],
    registry=None,
)
SENSOR_METRICS = (
    COMPACTION_DURATION,
    ENTRIES_COMPACTED,
    TOMBSTONES_COMPACTED,
    SEALED_TOKENS,
    COMPACTIONS_SKIPPED,
    COMPACTIONS,
)

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
            repository=self.repository,
            branch=self.branch,
            puts=self.puts,
            deletes=self.deletes,
            sealed_tokens=self.sealed_tokens,
            reason=self.reason,
        )


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
    def from_settings(cls, settings: Settings) -> Thresholds:
        return cls(
            tombstones=settings.compaction_tombstones_threshold,
            staged_entries=settings.compaction_staged_entries_threshold,
            sealed_tokens=settings.compaction_sealed_tokens_threshold,
        )

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
class BranchState:
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
class Snapshot:
    """A branch record as read by a refresh, with the predicate for a SetIf."""

    repo: Repository
    branch: types_pb2.Branch
    predicate: bytes


def seconds(ts: timestamp_pb2.Timestamp) -> float:
    return ts.seconds + ts.nanos / 1e9


# ---- the sensor ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SensorTuning:
    """The sensor's intervals and rebuild budgets (CompactionSensor's keyword options)."""

    min_interval_seconds: float = 60.0
    check_interval_seconds: float = 5.0
    rebuild_items_per_cycle: int = 200_000
    rebuild_max_items_per_branch: int = 2_000_000
    discovery_interval_seconds: float = 600.0
    stale_after_seconds: float = 60.0
    max_response_bytes: int = Settings.max_response_bytes


class TuningOptions(TypedDict, total=False):
    """SensorTuning's fields as keyword options."""

    min_interval_seconds: float
    check_interval_seconds: float
    rebuild_items_per_cycle: int
    rebuild_max_items_per_branch: int
    discovery_interval_seconds: float
    stale_after_seconds: float
    max_response_bytes: int


class SensorParts:
    """What the sensor's mixins (rebuild, trigger) share: set by CompactionSensor.__init__."""

    kv: kv.Store
    refs: RefManager
    thresholds: Thresholds
    compactor: Compactor | None
    min_interval_seconds: float
    rebuild_max_items_per_branch: int
    discovery_interval_seconds: float
    _lock: threading.Lock
    _branches: dict[tuple[str, str], BranchState]
    _discovered_at: float | None
    _clock: Callable[[], float]  # seconds (time.time, or a test's clock)
    # Seconds for the schedules (refresh, discovery): time.monotonic, or a test's clock.
    _monotonic: Callable[[], float]

    def _forget(self, key: tuple[str, str]) -> None:
        raise NotImplementedError

    def _refresh(self, key: tuple[str, str], missing_ok: bool) -> Snapshot | None:
        raise NotImplementedError
