"""Splitting an apply into disjoint key spans that separate writers can apply in parallel
(docs/performance.md, scale-out).

A span is a run of base ranges [first, stop) with the changes whose paths fall into its keys.
Spans are cut only after a base range whose last path is a chunk boundary by hash
(is_boundary, not the byte cap) and that no change deletes: the whole apply cuts a range
after that path whatever comes before it, so its builder is empty there, and applying each
span on its own and concatenating the ranges gives exactly the ranges of the whole apply
(the same metarange id). Applying a span writes and syncs its ranges but no metarange; the
coordinator writes the one metarange naming all of them once every span has returned.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import itertools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from quarry.committed.apply import AppliedRanges, apply_to_ranges
from quarry.committed.format import is_boundary
from quarry.committed.rangedata import MetaRange
from quarry.committed.writer import RangeWriter
from quarry.graveler.model import ApplyResult, DiffSummary, Entry, RangeInfo

PutOrDelete = tuple[str, Entry | None]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Span:
    """Base ranges [first, stop) and the changes within their keys (the last span also
    takes every change after the last range)."""

    first: int
    stop: int
    changes: Sequence[PutOrDelete]


def plan_spans(
    ranges: Sequence[RangeInfo],
    changes: Sequence[PutOrDelete],
    parts: int,
    target_entries: int,
    min_ranges_per_span: int = 0,
) -> list[Span]:
    """At most `parts` spans with about as many changes each, cut where it is safe (see the
    module docstring). `changes` sorted by path. Fewer spans when there are no safe cuts,
    and, with `min_ranges_per_span`, when the changes fall into fewer than that many base
    ranges per span (a span's round trip would cost more than rewriting them here)."""
    if parts <= 1 or len(ranges) <= 1 or not changes:
        return [Span(0, len(ranges), changes)]
    paths = [path for path, _ in changes]
    max_keys = [r.max_key for r in ranges]
    if min_ranges_per_span > 0:
        parts = min(parts, ranges_touched(max_keys, paths) // min_ranges_per_span)
        if parts <= 1:
            return [Span(0, len(ranges), changes)]
    deleted = {path for path, entry in changes if entry is None}
    cuts: list[int] = []  # cut after base range i: spans end at i + 1
    for k in range(1, parts):
        at = bisect.bisect_left(max_keys, paths[len(paths) * k // parts])
        i = max(at, cuts[-1] + 1 if cuts else 0)
        while i < len(ranges) - 1 and not (
            is_boundary(max_keys[i], target_entries) and max_keys[i] not in deleted
        ):
            i += 1
        if i >= len(ranges) - 1:
            break
        cuts.append(i)
    spans: list[Span] = []
    first = 0
    lo = 0  # changes [lo, ...) are not yet in a span
    for i in cuts:
        hi = bisect.bisect_right(paths, max_keys[i], lo)
        spans.append(Span(first, i + 1, changes[lo:hi]))
        first, lo = i + 1, hi
    spans.append(Span(first, len(ranges), changes[lo:]))
    return spans


def ranges_touched(max_keys: Sequence[str], paths: Sequence[str]) -> int:
    """How many base ranges (by their last keys, ascending) the sorted `paths` fall into;
    paths after the last range count as one more."""
    touched = 0
    at = -1
    for path in paths:
        i = bisect.bisect_left(max_keys, path, max(at, 0))
        if i != at:
            touched += 1
            at = i
    return touched


def apply_span(
    writer: RangeWriter, namespace: str, ranges: Sequence[RangeInfo], span: Span
) -> AppliedRanges:
    """Apply one span's changes to its base ranges: its ranges are written and durable
    (synced) when this returns; no metarange is written."""
    applied = apply_to_ranges(
        writer, namespace, MetaRange("", list(ranges[span.first : span.stop])), span.changes
    )
    writer.loader.store(namespace).sync()
    return applied


def combine(spans: Sequence[AppliedRanges]) -> AppliedRanges:
    """The spans' results, in key order, as one apply's."""
    summary = DiffSummary()
    ranges: list[RangeInfo] = []
    for applied in spans:
        ranges.extend(applied.ranges)
        summary.added += applied.summary.added
        summary.removed += applied.summary.removed
        summary.changed += applied.summary.changed
    return AppliedRanges(
        ranges,
        summary,
        sum(a.written for a in spans),
        sum(a.reused for a in spans),
    )


# Applies one span (first, stop over the base metarange) somewhere: here or on a peer.
SpanApplier = Callable[[str, str, Span], AppliedRanges]

# Changes held in memory to plan spans; a longer stream is applied here whole.
FAN_OUT_MAX_CHANGES = 200_000
# A span is worth its round trip (pickling or sending its changes, a worker's reads of
# ranges it has not cached) only if it rewrites a few dozen ranges: 1,000 changes in one
# directory rewrite ~4 ranges, and fanning them out measured 1.5x slower than applying
# them here.
MIN_RANGES_PER_SPAN = 32


class FanOut:
    """An apply split into spans: the first applied by `local`, the others by `peers` in
    turn (each on its own thread), and the one metarange written by `manager` once every
    span has returned (their ranges are durable by then). Streams shorter than
    `min_changes` or longer than FAN_OUT_MAX_CHANGES, and applies with no safe cut, run
    whole in `manager`."""

    def __init__(
        self,
        manager: Any,
        peers: Sequence[SpanApplier],
        spans: int = 0,
        min_changes: int = 2000,
    ) -> None:
        self._manager = manager
        self._peers = list(peers)
        self._spans = spans or len(self._peers) + 1
        self._min_changes = max(1, min_changes)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max(1, self._spans), thread_name_prefix="span"
        )

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def apply_changes(
        self, namespace: str, base_metarange_id: str, changes: Iterable[PutOrDelete]
    ) -> ApplyResult:
        iterator = iter(changes)
        held = list(itertools.islice(iterator, FAN_OUT_MAX_CHANGES + 1))
        manager = self._manager
        if not self._peers or not self._min_changes <= len(held) <= FAN_OUT_MAX_CHANGES:
            return manager.apply_changes(
                namespace, base_metarange_id, itertools.chain(held, iterator)
            )
        spans = manager.plan_spans(
            namespace, base_metarange_id, held, self._spans, MIN_RANGES_PER_SPAN
        )
        if len(spans) == 1:
            return manager.apply_changes(namespace, base_metarange_id, held)
        futures = [
            self._pool.submit(
                self._peers[(k - 1) % len(self._peers)], namespace, base_metarange_id, span
            )
            for k, span in enumerate(spans)
            if k > 0
        ]
        applied = [manager.apply_span(namespace, base_metarange_id, spans[0])]
        # Every span must have returned before the metarange names their ranges. A span a
        # peer could not apply (down, overloaded, restarting) is applied here: a peer is
        # capacity, never a dependency (bad input fails here the same way).
        for future, span in zip(futures, spans[1:], strict=True):
            try:
                applied.append(future.result())
            except Exception:
                log.warning(
                    "span %d..%d failed on a peer, applying it here",
                    span.first,
                    span.stop,
                    exc_info=True,
                )
                applied.append(manager.apply_span(namespace, base_metarange_id, span))
        return manager.put_metarange(namespace, base_metarange_id, applied)
