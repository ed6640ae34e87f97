"""Staging compaction: the compactor-sensor's domain (statistics, thresholds, the trigger
guard) and the reporter branch-manager uses to feed it (docs/architecture.md §4).

    CompactionSensor   per-branch staging statistics; decides and triggers compactions
    StagingReporter    branch-manager side: batches staged-write counts, fire-and-forget
"""

from quarry.compaction.sensor import (
    REASON_SEALED_TOKENS,
    REASON_STAGED_ENTRIES,
    REASON_TOMBSTONES,
    BranchStats,
    Candidate,
    CompactionResult,
    CompactionSensor,
    Compactor,
    StagingStats,
    Thresholds,
)

__all__ = [
    "CompactionSensor",
    "Thresholds",
    "StagingStats",
    "BranchStats",
    "Candidate",
    "CompactionResult",
    "Compactor",
    "REASON_TOMBSTONES",
    "REASON_STAGED_ENTRIES",
    "REASON_SEALED_TOKENS",
]
