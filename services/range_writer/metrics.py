"""The range-writer's metrics: per operation (apply, write_metarange, merge) its latency and
the ranges its results wrote or reused from the base; and, read from CommittedManager.stats
when scraped (nothing on the hot path), the range and metarange files put or found already
there and the bytes written."""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from quarry import errors
from quarry.committed import CommittedManager
from quarry.committed.stats import CommittedStats
from quarry.telemetry.metrics import expose

OPERATION_DURATION = Histogram(
    "quarry_range_writer_operation_duration_seconds",
    "Time of an ApplyChanges (apply), WriteMetaRange (write_metarange) or MergeMetaRanges "
    "(merge) on the range-writer, by operation and outcome (ok, error, stopped: the caller's "
    "deadline passed or it cancelled)",
    ["op", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
    registry=None,
)
STOPPED = Counter(
    "quarry_range_writer_operations_stopped",
    "Operations the range-writer stopped before finishing because their caller's deadline "
    "passed (deadline_exceeded) or the caller cancelled (cancelled): their ranges written so "
    "far are unreferenced (garbage for GC), no metarange was written",
    ["op", "reason"],
    registry=None,
)
RANGES = Counter(
    "quarry_range_writer_ranges",
    "Ranges of the metaranges the range-writer produced, by operation and whether the range "
    "was written anew or reused unchanged from an input metarange",
    ["op", "kind"],
    registry=None,
)


class CommittedStatsCollector(Collector):
    """quarry_range_writer_{range,metarange}_files_total{result} and
    quarry_range_writer_bytes_written_total, summed over the process's live managers (one in
    a `quarry serve range-writer` process; several in in-process test suites) at scrape time.
    A manager's stats include its span worker processes' files (CommittedManager.add_stats)."""

    def __init__(self) -> None:
        self.managers: weakref.WeakSet[CommittedManager] = weakref.WeakSet()

    def collect(self) -> Iterator[CounterMetricFamily]:
        totals = CommittedStats()
        for manager in list(self.managers):
            stats = manager.stats
            for name, value in stats.as_dict().items():
                setattr(totals, name, getattr(totals, name) + value)
        ranges = CounterMetricFamily(
            "quarry_range_writer_range_files",
            "Range files the range-writer put (written) or found already stored (existing)",
            labels=["result"],
        )
        ranges.add_metric(["written"], totals.ranges_written)
        ranges.add_metric(["existing"], totals.ranges_existing)
        metaranges = CounterMetricFamily(
            "quarry_range_writer_metarange_files",
            "Metarange files the range-writer put (written: a metarange or index root; "
            "written_page: an index page) or found already stored (existing)",
            labels=["result"],
        )
        metaranges.add_metric(["written"], totals.metaranges_written)
        metaranges.add_metric(["written_page"], totals.metarange_pages_written)
        metaranges.add_metric(["existing"], totals.metaranges_existing)
        written = CounterMetricFamily(
            "quarry_range_writer_bytes_written",
            "Encoded bytes of the range and metarange files the range-writer put",
            value=totals.bytes_written,
        )
        yield from (ranges, metaranges, written)


_STATS = CommittedStatsCollector()

# A callback the operation calls with (ranges_written, ranges_reused) once it has a result.
Done = Callable[[int, int], None]


class RangeWriterMetrics:
    """What the range-writer servicer records, over `manager`."""

    def __init__(self, manager: CommittedManager) -> None:
        expose(OPERATION_DURATION, RANGES, STOPPED, _STATS)
        _STATS.managers.add(manager)

    @contextlib.contextmanager
    def operation(self, op: str) -> Iterator[Done]:
        """Time `op`; the body calls the yielded function with its result's range counts.
        A body that raises is timed with outcome "error"."""
        started = time.perf_counter()

        def done(ranges_written: int, ranges_reused: int) -> None:
            RANGES.labels(op, "written").inc(ranges_written)
            RANGES.labels(op, "reused").inc(ranges_reused)

        try:
            yield done
        except (errors.DeadlineExceeded, errors.Cancelled) as stopped:
            OPERATION_DURATION.labels(op, "stopped").observe(time.perf_counter() - started)
            STOPPED.labels(op, stopped.reason.lower()).inc()
            raise
        except BaseException:
            OPERATION_DURATION.labels(op, "error").observe(time.perf_counter() - started)
            raise
        OPERATION_DURATION.labels(op, "ok").observe(time.perf_counter() - started)
