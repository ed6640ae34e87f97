"""Span workers in local processes: the spans of a large apply applied on this machine's
other cores (docs/performance.md, scale-out).

An apply's per-range work (decode, merge, encode, hash, write) holds the GIL, so threads do
not add cores to it. A range-writer configured with QUARRY_RANGE_WRITER_PROCESSES=N starts
N worker processes, each with its own CommittedManager (its own caches) over the same
object stores, and hands them spans exactly as it hands spans to peer range-writers
(quarry.committed.spans.FanOut): a worker writes and syncs its span's ranges and returns
them; the coordinator writes the one metarange once every span has returned.

What a worker must never do: outlive its range-writer, or leave an apply waiting on a
process that died or stopped answering. A worker watches its parent and exits once it is
gone (even after a SIGKILL, when nothing in the parent runs); a worker that dies breaks only
the spans it held (FanOut applies those here, and the pool is started afresh for the next
apply); a span not back within `span_timeout` seconds (a worker stopped, deadlocked, stuck
on storage) gets the pool's processes killed and started afresh, and is applied here; and
closing the pool waits for the spans in flight, as long as a span may take, then kills
the workers still busy.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from quarry.committed.apply import AppliedRanges
from quarry.committed.spans import PutOrDelete, Span, SpanApplier
from quarry.config import Settings

# Spawned, never forked: the range-writer is a gRPC server with threads, and a forked child
# would inherit its locks in whatever state they were in.
_CONTEXT = multiprocessing.get_context("spawn")
# How often a worker checks that its parent is still there.
PARENT_CHECK_SECONDS = 0.5
log = logging.getLogger(__name__)

# The worker process's manager and the pool's start barrier, set once by _start_worker.
_manager: Any = None
_started: Any = None


def _exit_when_orphaned(parent: int) -> None:
    # A process whose parent died is adopted by another (init, a subreaper): its parent id
    # changes. (The kernel's parent-death signal follows the thread that started the child,
    # and the pool starts workers from whichever thread submits.)
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_SECONDS)
    os._exit(0)


def _start_worker(make_manager: Callable[[], Any], parent: int, started: Any) -> None:
    global _manager, _started
    # `parent` is passed, not read here: a worker still starting when its parent died
    # would already see its adopter as its parent, and watch it forever.
    threading.Thread(
        target=_exit_when_orphaned, args=(parent,), name="parent-watch", daemon=True
    ).start()
    _started = started
    # Ctrl-C in a terminal reaches the whole process group: the range-writer stops its
    # workers itself (close), after the spans in flight.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _manager = make_manager()


def _ready() -> bool:
    # Every worker runs one of these at once (a barrier of `count`): so when they have all
    # returned, every worker has started, none ran two.
    _started.wait(60)
    return _manager is not None


def _apply_span(
    namespace: str, base_metarange_id: str, first: int, stop: int, changes: list[PutOrDelete]
) -> tuple[AppliedRanges, dict[str, int]]:
    """The span applied, and what it cost this worker (its CommittedManager.stats counts:
    files written, reads): a worker runs one call at a time, so the difference is the span's."""
    before = _manager.stats.as_dict()
    applied = _manager.apply_span(namespace, base_metarange_id, Span(first, stop, changes))
    after = _manager.stats.as_dict()
    return applied, {name: after[name] - before[name] for name in after}


class ProcessSpanWorkers:
    """`count` local worker processes applying spans; `apply_span` is a FanOut peer.

    `make_manager` builds a worker's CommittedManager in the worker: it is pickled to the
    spawned process, so it must be a module-level function or a functools.partial of one
    (CommittedManager.from_settings with the range-writer's settings). `add_stats` is given
    what each span cost its worker (CommittedStats counts: files written, reads), for the
    coordinator's manager (CommittedManager.add_stats) and so its metrics."""

    def __init__(
        self,
        count: int,
        make_manager: Callable[[], Any],
        add_stats: Callable[[dict[str, int]], None] | None = None,
        span_timeout: float = Settings.range_writer_span_timeout_seconds,
    ) -> None:
        if count < 1:
            raise ValueError("ProcessSpanWorkers needs at least one process")
        self.count = count
        self._make_manager = make_manager
        self._add_stats = add_stats
        self._span_timeout = span_timeout
        self._lock = threading.Lock()
        self._closed = False
        self._pool = self._start()

    def _start(self) -> concurrent.futures.ProcessPoolExecutor:
        pool = concurrent.futures.ProcessPoolExecutor(
            self.count,
            mp_context=_CONTEXT,
            initializer=_start_worker,
            initargs=(self._make_manager, os.getpid(), _CONTEXT.Barrier(self.count)),
        )
        # Start every worker now (imports and caches take a second or two) rather than
        # inside the first large apply.
        self._warming = [pool.submit(_ready) for _ in range(self.count)]
        return pool

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until every worker has started (benchmarks; the service does not wait)."""
        concurrent.futures.wait(self._warming, timeout)

    def pids(self) -> list[int]:
        """The worker processes' ids (tests and diagnostics)."""
        with self._lock:
            pool = self._pool
        return self._pids(pool)

    @staticmethod
    def _processes(pool: concurrent.futures.ProcessPoolExecutor) -> dict[int, Any]:
        # ProcessPoolExecutor keeps its processes by pid; it has no public accessor.
        return dict(getattr(pool, "_processes", None) or {})

    def _pids(self, pool: concurrent.futures.ProcessPoolExecutor) -> list[int]:
        return sorted(self._processes(pool))

    def _replace(self, pool: concurrent.futures.ProcessPoolExecutor, kill: bool = False) -> None:
        """Start a fresh pool in place of `pool` (once, however many spans saw it fail) and
        let `pool` go; `kill`: its processes first (they did not answer)."""
        with self._lock:
            if self._pool is pool and not self._closed:
                self._pool = self._start()
        if kill:
            for process in self._processes(pool).values():
                process.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def peers(self) -> list[SpanApplier]:
        """FanOut's peers: one per worker process, so each can hold a span at once."""
        return [self.apply_span] * self.count

    def apply_span(self, namespace: str, base_metarange_id: str, span: Span) -> AppliedRanges:
        with self._lock:
            if self._closed:
                raise RuntimeError("the span workers are closed")
            pool = self._pool
        try:
            future = pool.submit(
                _apply_span, namespace, base_metarange_id, span.first, span.stop, list(span.changes)
            )
            applied, counts = future.result(timeout=self._span_timeout)
        except BrokenProcessPool:
            # A worker died (killed, out of memory): this span fails (FanOut applies it in
            # the coordinator) and the next apply gets a fresh pool.
            self._replace(pool)
            raise
        except concurrent.futures.TimeoutError:
            # A worker that does not answer would hold this span, and every span queued
            # behind it, forever: its processes are killed (a stopped process ignores
            # SIGTERM until continued), the span fails (FanOut applies it here) and the next
            # apply gets a fresh pool. A span another worker of the pool held fails too.
            log.warning(
                "a span worker process did not return a span in %.0f s: killing the span "
                "workers (pids %s) and starting new ones",
                self._span_timeout,
                self._pids(pool),
            )
            self._replace(pool, kill=True)
            raise
        if self._add_stats is not None:
            self._add_stats(counts)
        return applied

    def close(self) -> None:
        """Stop the workers once the spans in flight have finished, waiting for them no
        longer than a span may take (span_timeout): a worker still busy then (stopped,
        deadlocked) is killed rather than holding the range-writer's shutdown."""
        with self._lock:
            self._closed = True
            pool = self._pool
        processes = self._processes(pool)
        pool.shutdown(wait=False, cancel_futures=True)
        # Waiting on the sentinels reaps nothing: the pool's own thread joins its processes.
        # A sentinel is ready once its process has ended; wait() returns when ANY is, so it
        # is called again for the rest until the deadline (one wait let the first worker to
        # end decide that every other was stuck, and killed them mid-exit). Stuck means a
        # sentinel still not ready, not is_alive(): an ended process may not be reaped yet.
        pending = {process.sentinel: pid for pid, process in processes.items()}
        deadline = time.monotonic() + self._span_timeout
        while pending and (left := deadline - time.monotonic()) > 0:
            for ready in multiprocessing.connection.wait(list(pending), left):
                del pending[ready]
        stuck = sorted(pending.values())
        if stuck:
            log.warning("span worker processes %s did not stop in time: killing them", stuck)
            for pid in stuck:
                processes[pid].kill()
        pool.shutdown(wait=True)
