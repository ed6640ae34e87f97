"""Garbage-collection retention: which commits a repository keeps, and which objects of its
storage namespace GC may consider. Pure functions (no gRPC, no Spark): quarry.spark.gc runs
them on the driver.

Rules follow lakeFS: a default number of days and per-branch overrides. A commit is kept
when it is a branch HEAD, is tagged, or is reachable from a branch whose retention window
(now - days) it falls into. Everything else is expired: its data may be collected unless a
kept commit or a staged entry also refers to it.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quarry import errors

# What GC may collect is decided by the object-store layout, which owns every key shape.
from quarry.blob.layout import (
    COLLECTABLE,
    DATA,
    FOREIGN,
    INTERNAL,
    INTERNAL_PREFIX,
    METARANGE,
    RANGE,
    Classified,
    classify,
)

if TYPE_CHECKING:
    from quarry.v1 import types_pb2

DEFAULT_RETENTION_DAYS = 21.0
MAX_RETENTION_DAYS = 36500  # a century: "keep forever" without overflowing date arithmetic


class InvalidRetentionRules(errors.InvalidArgument):
    reason = "INVALID_RETENTION_RULES"


@dataclass(frozen=True)
class RetentionRules:
    default_retention_days: float = DEFAULT_RETENTION_DAYS
    branch_retention_days: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        days = [self.default_retention_days, *self.branch_retention_days.values()]
        for d in days:
            if (
                isinstance(d, bool)
                or not isinstance(d, (int, float))
                or not 0 <= d <= MAX_RETENTION_DAYS
            ):  # also rejects NaN
                raise InvalidRetentionRules(
                    f"retention days must be numbers from 0 to {MAX_RETENTION_DAYS}, not {d!r}"
                )

    def days_for(self, branch: str) -> float:
        return self.branch_retention_days.get(branch, self.default_retention_days)

    @classmethod
    def from_json(cls, text: str) -> RetentionRules:
        """lakeFS's format: {"default_retention_days": 21,
        "branches": [{"branch_id": "main", "retention_days": 28}]}."""
        try:
            doc = json.loads(text)
            branches = {b["branch_id"]: b["retention_days"] for b in doc.get("branches", [])}
            return cls(doc.get("default_retention_days", DEFAULT_RETENTION_DAYS), branches)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise InvalidRetentionRules(f"invalid retention rules: {exc}") from None

    @classmethod
    def from_proto(cls, rules: types_pb2.GarbageCollectionRules) -> RetentionRules:
        """From quarry.v1.GarbageCollectionRules (what a repository stores)."""
        return cls(rules.default_retention_days, dict(rules.branch_retention_days))

    def to_proto(self) -> types_pb2.GarbageCollectionRules:
        from quarry.v1 import types_pb2

        return types_pb2.GarbageCollectionRules(
            default_retention_days=self.default_retention_days,
            branch_retention_days=dict(self.branch_retention_days),
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "default_retention_days": self.default_retention_days,
                "branches": [
                    {"branch_id": b, "retention_days": d}
                    for b, d in sorted(self.branch_retention_days.items())
                ],
            }
        )


@dataclass(frozen=True)
class CommitNode:
    id: str
    parents: tuple[str, ...]
    creation_time: _dt.datetime  # aware (UTC)
    generation: int
    metarange_id: str


def retained_commits(
    commits: Mapping[str, CommitNode],
    heads: Mapping[str, str],
    tagged: Iterable[str],
    rules: RetentionRules,
    now: _dt.datetime,
) -> set[str]:
    """Ids of the commits to keep. `commits` must hold every commit reachable from `heads`.

    A commit is kept if its creation time is within the window of at least one branch it
    is reachable from, i.e. not older than the EARLIEST cutoff among those branches. That
    earliest cutoff is propagated from the heads down to the parents in one pass over the
    commits by decreasing generation (a parent's generation is always lower)."""
    cutoff: dict[str, _dt.datetime] = {}
    kept = set(heads.values()) | set(tagged)
    for branch, head in heads.items():
        window = now - _dt.timedelta(days=rules.days_for(branch))
        if head not in cutoff or window < cutoff[head]:
            cutoff[head] = window
    for node in sorted(commits.values(), key=lambda n: n.generation, reverse=True):
        limit = cutoff.get(node.id)
        if limit is None:
            continue  # not reachable from any branch
        if node.creation_time >= limit:
            kept.add(node.id)
        for parent in node.parents:
            if parent not in cutoff or limit < cutoff[parent]:
                cutoff[parent] = limit
    return kept


__all__ = [
    "COLLECTABLE",
    "DATA",
    "DEFAULT_RETENTION_DAYS",
    "FOREIGN",
    "INTERNAL",
    "INTERNAL_PREFIX",
    "MAX_RETENTION_DAYS",
    "METARANGE",
    "RANGE",
    "Classified",
    "CommitNode",
    "InvalidRetentionRules",
    "RetentionRules",
    "classify",
    "retained_commits",
]
