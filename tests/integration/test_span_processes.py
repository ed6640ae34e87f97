"""Span worker processes (quarry.committed.processes): real spawned processes apply spans of
a large apply with the result of one apply; a worker that dies, or stops answering, costs
only its span; a worker never outlives the process that started it."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from quarry.blob import LocalBlobStore
from quarry.committed import CommittedManager
from quarry.committed.processes import ProcessSpanWorkers
from quarry.committed.spans import FanOut
from quarry.graveler.model import Entry
from support.processes import process_running, wait_gone

TARGET = 16
# A worker builds its manager with this (pickled to the spawned process): the same chunking
# as the coordinator's, or the spans' ranges would not be those of one apply.
MAKE_MANAGER = functools.partial(
    CommittedManager, LocalBlobStore, None, target_range_entries=TARGET
)


def entry(path: str, version: int = 0) -> Entry:
    return Entry(path, f"/data/{path}@{version}", len(path) + version, f"{version:032x}")


@pytest.fixture
def workers():
    pool = ProcessSpanWorkers(1, MAKE_MANAGER)
    pool.wait_ready(60)
    yield pool
    pool.close()


def reference(where, entries: list[Entry], changes):
    """One apply of `changes` by one manager, in a namespace of its own (ids do not depend
    on the namespace)."""
    manager = MAKE_MANAGER()
    base = manager.write_metarange(str(where), entries).metarange_id
    return manager.apply_changes(str(where), base, changes)


def scattered(entries: list[Entry], version: int, step: int = 10) -> list[tuple[str, Entry]]:
    return [(e.path, entry(e.path, version)) for e in entries[::step]]


def repository(tmp_path):
    """A namespace holding a metarange of 2,400 entries (about 150 ranges of TARGET: every
    10th entry changed touches most of them, enough for two spans of at least
    MIN_RANGES_PER_SPAN), and the coordinator's manager."""
    namespace = str(tmp_path / "ns")
    coordinator = MAKE_MANAGER()
    entries = [entry(f"p/{i:05d}") for i in range(2400)]
    return (
        namespace,
        coordinator,
        entries,
        coordinator.write_metarange(namespace, entries).metarange_id,
    )


def assert_a_worker_takes_part(where, coordinator, fan_out, namespace, base, entries) -> None:
    """A fan-out apply has the result of one apply, and a worker wrote part of its ranges
    (the coordinator wrote fewer than one apply does). A worker slower than span_timeout
    (a loaded machine) has its span applied by the coordinator, which is correct: up to
    three applies, each checked, and a worker must take part in one of them."""
    shares = []
    for attempt in range(3):
        before = coordinator.stats.ranges_written
        changes = scattered(entries, 2 + attempt)
        expected = reference(where / str(attempt), entries, changes)
        result = fan_out.apply_changes(namespace, base, changes)
        assert result.metarange_id == expected.metarange_id
        shares.append((coordinator.stats.ranges_written - before, expected.ranges_written))
        if shares[-1][0] < shares[-1][1]:
            return
    raise AssertionError(f"no worker took part (coordinator wrote, of one apply): {shares}")


def test_a_worker_process_applies_a_span_with_the_result_of_one_apply(tmp_path, workers):
    namespace, coordinator, entries, base = repository(tmp_path)
    coordinator.reset_stats()
    changes = scattered(entries, 1)
    expected = reference(tmp_path / "other", entries, changes)
    written_alone = expected.ranges_written

    fan_out = FanOut(coordinator, [workers.apply_span], min_changes=1)
    try:
        result = fan_out.apply_changes(namespace, base, changes)
    finally:
        fan_out.close()
    assert result.metarange_id == expected.metarange_id
    assert result.summary == expected.summary
    # The worker wrote part of the ranges: the coordinator wrote fewer than one apply does.
    assert 0 < coordinator.stats.ranges_written < written_alone
    # Every range the metarange names is in the namespace (the worker's are durable).
    for info in coordinator.get_metarange(namespace, result.metarange_id):
        assert os.path.exists(os.path.join(namespace, "_quarry", "ranges", f"{info.id}.parquet"))


def test_a_workers_files_count_in_the_coordinators_stats(tmp_path):
    """The range-writer's file metrics read its manager's stats: the spans its workers
    wrote must be counted there too (add_stats)."""
    namespace, coordinator, entries, base = repository(tmp_path)
    coordinator.reset_stats()
    changes = scattered(entries, 1)
    written_alone = reference(tmp_path / "other", entries, changes).ranges_written
    pool = ProcessSpanWorkers(1, MAKE_MANAGER, add_stats=coordinator.add_stats)
    fan_out = FanOut(coordinator, pool.peers(), min_changes=1)
    try:
        pool.wait_ready(60)
        result = fan_out.apply_changes(namespace, base, changes)
    finally:
        fan_out.close()
        pool.close()
    assert result.ranges_written == written_alone
    stats = coordinator.stats
    # Every range file of the apply is counted once: the coordinator's and the worker's.
    assert stats.ranges_written == written_alone
    assert stats.metaranges_written == 1
    ranges_dir = os.path.join(namespace, "_quarry", "ranges")
    new_ids = {i.id for i in coordinator.get_metarange(namespace, result.metarange_id)} - {
        i.id for i in coordinator.get_metarange(namespace, base)
    }
    new_bytes = sum(os.path.getsize(os.path.join(ranges_dir, f"{i}.parquet")) for i in new_ids)
    # ... and their bytes (the metarange's on top).
    assert new_bytes < stats.bytes_written


def test_a_worker_that_dies_costs_only_its_span(tmp_path, workers):
    namespace, coordinator, entries, base = repository(tmp_path)
    fan_out = FanOut(coordinator, [workers.apply_span], min_changes=1)
    try:
        for pid in workers.pids():
            os.kill(pid, signal.SIGKILL)
        changes = scattered(entries, 1)
        expected = reference(tmp_path / "a", entries, changes)
        # The span the dead worker held is applied by the coordinator: same result.
        assert fan_out.apply_changes(namespace, base, changes).metarange_id == (
            expected.metarange_id
        )
        # The next apply gets a fresh worker, which takes its span again.
        workers.wait_ready(60)
        assert_a_worker_takes_part(tmp_path / "b", coordinator, fan_out, namespace, base, entries)
    finally:
        fan_out.close()


# The span timeout of the stopped-worker test. It must outlast a fresh worker's first span,
# which the test needs answered: that span is cold (its base ranges read for the first time,
# and pyarrow imports pandas on its first array), and on a loaded machine it took over 10 s
# (2 s expired: every fresh worker was replaced in turn, and none took part); the same span
# in a range-writer's worker took over 30 s at a load average of 16. The test waits it out
# once, asleep, for the stopped worker.
STOPPED_WORKER_SPAN_TIMEOUT = 60


def test_a_worker_that_stops_answering_is_killed_and_its_span_applied_here(tmp_path):
    """A stopped (SIGSTOP: ignores SIGTERM, answers nothing) or deadlocked worker must not
    hold a commit: past span_timeout the span is applied by the coordinator, the worker is
    killed and a fresh one takes the next apply's span."""
    namespace, coordinator, entries, base = repository(tmp_path)
    pool = ProcessSpanWorkers(1, MAKE_MANAGER, span_timeout=STOPPED_WORKER_SPAN_TIMEOUT)
    fan_out = FanOut(coordinator, pool.peers(), min_changes=1)
    stopped = 0
    try:
        pool.wait_ready(60)
        [stopped] = pool.pids()
        os.kill(stopped, signal.SIGSTOP)
        changes = scattered(entries, 1)
        expected = reference(tmp_path / "a", entries, changes)
        started = time.monotonic()
        assert fan_out.apply_changes(namespace, base, changes).metarange_id == (
            expected.metarange_id
        )
        # About the span timeout: not held until the worker answers (never).
        assert time.monotonic() - started < STOPPED_WORKER_SPAN_TIMEOUT + 30
        assert wait_gone([stopped]) == [], "the stopped worker was left behind"
        # A fresh worker takes its span of the next apply.
        pool.wait_ready(60)
        assert pool.pids() and stopped not in pool.pids()
        assert_a_worker_takes_part(tmp_path / "b", coordinator, fan_out, namespace, base, entries)
    finally:
        fan_out.close()
        pool.close()
        if stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGKILL)


def test_closing_does_not_wait_for_a_worker_that_stopped_answering():
    """A worker stopped (or deadlocked) when the range-writer shuts down must not hold the
    shutdown: close() waits at most span_timeout, then kills it."""
    pool = ProcessSpanWorkers(1, MAKE_MANAGER, span_timeout=2)
    pool.wait_ready(60)
    [stopped] = pool.pids()
    os.kill(stopped, signal.SIGSTOP)
    try:
        started = time.monotonic()
        pool.close()
        assert time.monotonic() - started < 20
        assert wait_gone([stopped]) == [], "the stopped worker was left behind"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stopped, signal.SIGKILL)


def test_closing_waits_for_every_worker_not_only_the_first_to_end(caplog):
    """close() waits for each worker up to span_timeout: a worker that ends later than
    another (here: paused for a second and a half, as one finishing its span would be) ends
    on its own, never killed because the first one had ended. Killing it would cut short
    the span it was writing. (close() kills exactly the workers it logs as stuck.)"""
    pool = ProcessSpanWorkers(2, MAKE_MANAGER, span_timeout=60)
    pool.wait_ready(60)
    pids = pool.pids()
    late = pids[0]
    os.kill(late, signal.SIGSTOP)
    resume = threading.Timer(1.5, os.kill, (late, signal.SIGCONT))
    resume.start()
    try:
        with caplog.at_level(logging.WARNING, logger="quarry.committed.processes"):
            pool.close()
        assert "did not stop in time" not in caplog.text
        assert wait_gone(pids) == []
    finally:
        resume.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.kill(late, signal.SIGCONT)


def test_closing_a_pool_whose_workers_all_died_returns_at_once():
    pool = ProcessSpanWorkers(1, MAKE_MANAGER, span_timeout=30)
    pool.wait_ready(60)
    for pid in pool.pids():
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while pool.pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    pool.close()
    assert time.monotonic() - started < 10


def test_workers_end_with_the_process_that_started_them(tmp_path):
    # Never outlive the range-writer: its workers are killed with it, even by SIGKILL
    # (nothing in the parent runs then).
    script = textwrap.dedent(
        """
        import functools, sys, time
        from quarry.blob import LocalBlobStore
        from quarry.committed import CommittedManager
        from quarry.committed.processes import ProcessSpanWorkers

        if __name__ == "__main__":
            workers = ProcessSpanWorkers(
                2, functools.partial(CommittedManager, LocalBlobStore, None)
            )
            workers.wait_ready(60)
            print(*workers.pids(), flush=True)
            time.sleep(600)
        """
    )
    path = tmp_path / "parent.py"
    path.write_text(script)
    parent = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        pids = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(process_running(pid) for pid in pids)
        parent.kill()
        parent.wait(10)
        assert wait_gone(pids, 10) == [], "a worker outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in pids:
            if process_running(pid):
                os.kill(pid, signal.SIGKILL)
