"""CompactionSensor without gRPC: thresholds, the trigger guard, counter resets, rebuilds.

Writes go through a real Graveler on a MemoryStore (so staging tokens, commits and branch
records are the real ones); the test plays branch-manager's reporter by passing each
write's counts and staging token to `sensor.record`.
"""

import threading

import pytest
from prometheus_client import REGISTRY

from quarry import errors
from quarry.compaction.sensor import (
    REASON_SEALED_TOKENS,
    REASON_STAGED_ENTRIES,
    REASON_TOMBSTONES,
    CompactionSensor,
    StagingStats,
    Thresholds,
)
from quarry.graveler import errors as gerrors
from quarry.graveler.model import Entry
from support.compaction_fakes import Clock, FakeCompactor
from support.wait import wait_until


def entry(path, checksum="c1"):
    return Entry(path, f"data/{path}-{checksum}", 10, checksum, 0, "text/plain", {})


def put(graveler, sensor, repo, branch, paths, checksum="c1"):
    staged = graveler.put_objects(repo, branch, [entry(p, checksum) for p in paths])
    if sensor is not None:
        sensor.record([StagingStats(repo, branch, staged.staging_token, int(staged), 0)])
    return staged


def delete(graveler, sensor, repo, branch, paths):
    staged = graveler.delete_objects(repo, branch, paths)
    if sensor is not None:
        sensor.record([StagingStats(repo, branch, staged.staging_token, 0, int(staged))])
    return staged


def committed_files(graveler, repo, n, branch="main"):
    paths = [f"f/{i:03d}" for i in range(n)]
    graveler.put_objects(repo, branch, [entry(p) for p in paths])
    graveler.commit(repo, branch, "files")
    return paths


def metric(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


# ---- thresholds -------------------------------------------------------------------------------


def test_tombstone_threshold_triggers_exactly_as_configured(graveler, repo, make_sensor, compactor):
    sensor = make_sensor(tombstones=5)
    paths = committed_files(graveler, repo, 10)
    for path in paths[:4]:
        delete(graveler, sensor, repo, "main", [path])
    assert sensor.evaluate_once() == []
    assert sensor.list_candidates() == [] and compactor.calls == []

    delete(graveler, sensor, repo, "main", [paths[4]])
    [candidate] = sensor.list_candidates()
    assert (candidate.repository, candidate.branch, candidate.deletes) == (repo, "main", 5)
    assert candidate.reason == REASON_TOMBSTONES
    assert sensor.evaluate_once() == [(repo, "main")]
    assert compactor.calls == [(repo, "main")]
    # The compaction retired the counted tokens: nothing left to compact.
    assert sensor.evaluate_once() == []
    assert compactor.calls == [(repo, "main")]
    assert graveler.get_branch(repo, "main").compacted_metarange_id


def test_staged_entries_threshold_counts_puts_and_deletes(graveler, repo, make_sensor, compactor):
    sensor = make_sensor(staged_entries=6)
    paths = committed_files(graveler, repo, 3)
    put(graveler, sensor, repo, "main", ["new/a", "new/b"])
    delete(graveler, sensor, repo, "main", paths)
    sensor.evaluate_once()
    assert compactor.calls == []  # 5 staged items
    put(graveler, sensor, repo, "main", ["new/c"])
    [candidate] = sensor.list_candidates()
    assert candidate.reason == REASON_STAGED_ENTRIES
    assert (candidate.puts, candidate.deletes) == (3, 3)
    assert sensor.evaluate_once() == [(repo, "main")]


def test_sealed_tokens_threshold_reads_the_branch_record(graveler, repo, make_sensor, compactor):
    sensor = make_sensor(sealed_tokens=2)
    repository = graveler.refs.get_repository(repo)
    for i in range(2):
        put(graveler, sensor, repo, "main", [f"a/{i}"])
        sensor.evaluate_once()
        assert compactor.calls == []
        graveler.commits.seal(repository, "main")  # a commit that sealed and then failed
    sensor.record([StagingStats(repo, "main", "", 1, 0)])  # any activity: re-read the record
    assert sensor.evaluate_once() == [(repo, "main")]
    assert compactor.calls == [(repo, "main")]
    assert metric("quarry_branch_sealed_tokens", repo=repo, branch="main") == 0  # compacted


def test_sealed_tokens_candidate_reason_and_stats(graveler, repo, make_sensor):
    sensor = make_sensor(sealed_tokens=1, compactor_=FakeCompactor(None, "noop"))
    put(graveler, sensor, repo, "main", ["a"])
    graveler.commits.seal(graveler.refs.get_repository(repo), "main")
    stats = sensor.get_branch_stats(repo, "main")
    assert (stats.puts, stats.deletes, stats.sealed_tokens) == (1, 0, 1)
    assert metric("quarry_branch_sealed_tokens", repo=repo, branch="main") == 1
    [candidate] = sensor.list_candidates()
    assert candidate.reason == REASON_SEALED_TOKENS


def test_zero_disables_a_threshold(graveler, repo, make_sensor, compactor):
    sensor = make_sensor()  # every threshold 0
    paths = committed_files(graveler, repo, 20)
    put(graveler, sensor, repo, "main", [f"x/{i}" for i in range(20)])
    delete(graveler, sensor, repo, "main", paths)
    assert sensor.evaluate_once() == [] and sensor.list_candidates() == []
    assert sensor.get_branch_stats(repo, "main").deletes == 20


def test_thresholds_come_from_settings():
    from quarry.config import load_settings

    settings = load_settings(
        env={},
        compaction_tombstones_threshold=7,
        compaction_staged_entries_threshold=8,
        compaction_sealed_tokens_threshold=9,
        compaction_min_interval_seconds=3.0,
    )
    sensor = CompactionSensor.from_settings(settings, None, None)
    assert sensor.thresholds == Thresholds(7, 8, 9)
    assert sensor.min_interval_seconds == 3.0
    assert Thresholds.from_settings(load_settings(env={})) == Thresholds(100_000, 1_000_000, 10)


# ---- the guard --------------------------------------------------------------------------------


def test_guard_prevents_a_second_trigger_within_the_interval(
    graveler, repo, make_sensor, store, clock
):
    failing = FakeCompactor(store, errors.Unimplemented("Compact is not built yet"))
    sensor = make_sensor(tombstones=2, min_interval=60.0, compactor_=failing)
    paths = committed_files(graveler, repo, 2)
    delete(graveler, sensor, repo, "main", paths)
    guarded = metric("quarry_compactions_skipped_total", reason="guard")

    # The committer answers UNIMPLEMENTED: logged, and the sensor carries on.
    assert sensor.evaluate_once() == [(repo, "main")]
    record = graveler.get_branch(repo, "main")
    assert record.compaction_start_time.seconds == int(clock.now)
    clock.now += 59
    assert sensor.evaluate_once() == []
    assert len(failing.calls) == 1
    assert metric("quarry_compactions_skipped_total", reason="guard") == guarded + 1
    assert sensor.get_branch_stats(repo, "main").last_compaction == pytest.approx(clock.now - 59)

    clock.now += 2  # past the interval: try again
    assert sensor.evaluate_once() == [(repo, "main")]
    assert len(failing.calls) == 2


def test_two_sensors_sharing_one_kv_store_trigger_once(graveler, repo, make_sensor, compactor):
    paths = committed_files(graveler, repo, 3)
    first, second = make_sensor(tombstones=3), make_sensor(tombstones=3)
    staged = delete(graveler, None, repo, "main", paths)
    for sensor in (first, second):  # each replica heard of the deletes
        sensor.record([StagingStats(repo, "main", staged.staging_token, 0, 3)])
    assert first.evaluate_once() == [(repo, "main")]
    assert second.evaluate_once() == []
    assert compactor.calls == [(repo, "main")]


def test_concurrent_sensors_trigger_once(graveler, repo, make_sensor, store):
    noop = FakeCompactor(store, "noop")
    paths = committed_files(graveler, repo, 3)
    staged = delete(graveler, None, repo, "main", paths)
    sensors = [make_sensor(tombstones=3, compactor_=noop) for _ in range(6)]
    for sensor in sensors:
        sensor.record([StagingStats(repo, "main", staged.staging_token, 0, 3)])
    barrier = threading.Barrier(len(sensors))
    results = []

    def run(sensor):
        barrier.wait()
        results.append(sensor.evaluate_once())

    threads = [threading.Thread(target=run, args=(s,)) for s in sensors]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(noop.calls) == 1
    assert sorted(map(len, results)) == [0] * 5 + [1]


def test_a_failing_branch_does_not_stop_the_others(graveler, repo, make_sensor, store):
    class Picky(FakeCompactor):
        def compact(self, repository, branch):
            if branch == "main":
                self.calls.append((repository, branch))
                raise errors.Internal("boom")
            return super().compact(repository, branch)

    picky = Picky(store)
    sensor = make_sensor(tombstones=1, compactor_=picky)
    graveler.create_branch(repo, "dev", "main")
    for branch in ("main", "dev"):
        put(graveler, None, repo, branch, ["gone"])
        graveler.commit(repo, branch, "one")
        delete(graveler, sensor, repo, branch, ["gone"])
    assert sorted(sensor.evaluate_once()) == [(repo, "dev"), (repo, "main")]
    assert sorted(picky.calls) == [(repo, "dev"), (repo, "main")]
    assert graveler.get_branch(repo, "dev").compacted_metarange_id
    assert not graveler.get_branch(repo, "main").compacted_metarange_id


# ---- counters follow the branch record -------------------------------------------------------


def test_counters_reset_when_the_token_is_committed(graveler, repo, make_sensor):
    sensor = make_sensor(tombstones=100)
    paths = committed_files(graveler, repo, 4)
    put(graveler, sensor, repo, "main", ["n/1", "n/2"])
    delete(graveler, sensor, repo, "main", paths[:3])
    stats = sensor.get_branch_stats(repo, "main")
    assert (stats.puts, stats.deletes) == (2, 3)

    graveler.commit(repo, "main", "second")
    sensor.evaluate_once()
    stats = sensor.get_branch_stats(repo, "main")
    assert (stats.puts, stats.deletes, stats.sealed_tokens) == (0, 0, 0)
    # New writes count on the new token only.
    delete(graveler, sensor, repo, "main", [paths[3]])
    assert sensor.get_branch_stats(repo, "main").deletes == 1


def test_counters_reset_when_the_token_is_compacted_elsewhere(graveler, repo, make_sensor, store):
    sensor = make_sensor(tombstones=3)
    paths = committed_files(graveler, repo, 3)
    delete(graveler, sensor, repo, "main", paths)
    assert len(sensor.list_candidates()) == 1
    FakeCompactor(store).compact(repo, "main")  # e.g. `quarry compact`, or another sensor
    sensor.evaluate_once()
    assert sensor.list_candidates() == []
    assert sensor.get_branch_stats(repo, "main").deletes == 0


def test_a_late_report_for_a_retired_token_is_dropped(graveler, repo, make_sensor):
    sensor = make_sensor(tombstones=100)
    staged = put(graveler, None, repo, "main", ["a"])
    graveler.commit(repo, "main", "c")
    sensor.get_branch_stats(repo, "main")
    sensor.record([StagingStats(repo, "main", staged.staging_token, 5, 5)])  # arrives late
    sensor.evaluate_once()
    assert sensor.get_branch_stats(repo, "main").puts == 0


def test_deleted_branches_are_forgotten(graveler, repo, make_sensor):
    sensor = make_sensor(tombstones=1, stale_after_seconds=0)  # re-read every cycle
    graveler.create_branch(repo, "tmp", "main")
    put(graveler, sensor, repo, "tmp", ["a"])
    sensor.evaluate_once()
    graveler.delete_branch(repo, "tmp")
    sensor.evaluate_once()
    assert sensor._stats((repo, "tmp")).puts == 0
    with pytest.raises(gerrors.BranchNotFound):
        sensor.get_branch_stats(repo, "tmp")


def test_a_deleted_branch_is_forgotten_once_its_record_is_stale_on_the_sensors_clock(
    graveler, repo, make_sensor
):
    """The refresh schedule runs on the sensor's monotonic clock: a test moves it past
    stale_after_seconds instead of waiting (or setting the staleness to 0)."""
    schedule = Clock(now=1000.0)
    sensor = make_sensor(tombstones=100, monotonic=schedule)
    graveler.create_branch(repo, "tmp", "main")
    put(graveler, sensor, repo, "tmp", ["a"])
    sensor.evaluate_once()  # read the record (counts rebuilt)
    graveler.delete_branch(repo, "tmp")
    sensor.evaluate_once()
    assert sensor._stats((repo, "tmp")).puts == 1  # not stale yet: not read again
    schedule.now += sensor.stale_after_seconds
    sensor.evaluate_once()  # stale: read again, found deleted, forgotten
    assert sensor._stats((repo, "tmp")).puts == 0


def test_reports_without_repository_or_counts_are_ignored(make_sensor):
    sensor = make_sensor(tombstones=1)
    assert (
        sensor.record(
            [
                StagingStats("", "main", "t", 1, 1),
                StagingStats("lake", "", "t", 1, 1),
                StagingStats("lake", "main", "t", 0, 0),
            ]
        )
        == 0
    )
    assert sensor.list_candidates() == []


def test_list_candidates_orders_and_pages(graveler, repo, make_sensor):
    sensor = make_sensor(tombstones=1)
    for i, branch in enumerate(("b1", "b2", "b3")):
        sensor.record([StagingStats(repo, branch, "t", 0, i + 1)])
    assert [c.branch for c in sensor.list_candidates()] == ["b3", "b2", "b1"]
    assert [c.branch for c in sensor.list_candidates(page_size=2)] == ["b3", "b2"]
    with pytest.raises(errors.InvalidArgument):
        sensor.list_candidates(page_size=-1)


# ---- rebuilding after a restart --------------------------------------------------------------


def test_rebuild_after_restart_counts_staged_items_from_kv(graveler, repo, make_sensor):
    paths = committed_files(graveler, repo, 5)
    put(graveler, None, repo, "main", [f"new/{i}" for i in range(7)])
    delete(graveler, None, repo, "main", paths[:2])
    graveler.commits.seal(graveler.refs.get_repository(repo), "main")  # now a sealed token
    put(graveler, None, repo, "main", ["later/1", "later/2"])
    delete(graveler, None, repo, "main", [paths[2]])

    restarted = make_sensor(tombstones=100)  # never heard of any of it
    stats = restarted.get_branch_stats(repo, "main")
    assert (stats.puts, stats.deletes, stats.sealed_tokens) == (9, 3, 1)


def test_rebuild_on_first_evaluation_finds_branches_and_triggers(
    graveler, repo, make_sensor, compactor
):
    paths = committed_files(graveler, repo, 4)
    graveler.create_branch(repo, "clean", "main")
    delete(graveler, None, repo, "main", paths)

    restarted = make_sensor(tombstones=4)
    assert restarted.evaluate_once() == [(repo, "main")]
    assert compactor.calls == [(repo, "main")]
    assert ("lake", "clean") not in restarted._branches  # nothing staged: not tracked


def test_reports_before_the_rebuild_are_not_counted_twice(graveler, repo, make_sensor):
    sensor = make_sensor(tombstones=100)
    put(graveler, sensor, repo, "main", ["a", "b", "c"])  # reported AND in the KV store
    stats = sensor.get_branch_stats(repo, "main")
    assert stats.puts == 3
    put(graveler, sensor, repo, "main", ["d"])
    assert sensor.get_branch_stats(repo, "main").puts == 4


def test_rebuild_stops_counting_once_the_branch_is_a_candidate(graveler, repo, make_sensor):
    paths = committed_files(graveler, repo, 3000)
    delete(graveler, None, repo, "main", paths)
    sensor = make_sensor(tombstones=1000)
    stats = sensor.get_branch_stats(repo, "main")
    assert 1000 <= stats.deletes < 3000  # bounded: stopped once past the threshold
    assert sensor.list_candidates()[0].reason == REASON_TOMBSTONES


def test_rebuild_budget_per_cycle(graveler, repo, make_sensor):
    for name in ("b1", "b2", "b3"):
        graveler.create_branch(repo, name, "main")
        put(graveler, None, repo, name, [f"p/{i}" for i in range(10)])
    sensor = make_sensor(tombstones=100, rebuild_items_per_cycle=15)
    sensor.evaluate_once()
    rebuilt = [k for k, s in sensor._branches.items() if s.rebuilt]
    assert len(rebuilt) == 2  # 10 items, 20 ≥ 15: the third waits for the next cycle
    sensor.evaluate_once()
    assert all(s.rebuilt for s in sensor._branches.values())
    assert sorted(sensor._stats((repo, b)).puts for b in ("b1", "b2", "b3")) == [10, 10, 10]


# ---- the loop -----------------------------------------------------------------------------------


def test_background_loop_triggers_and_stops(graveler, repo, store):
    compactor = FakeCompactor(store)
    sensor = CompactionSensor(
        store, compactor, Thresholds(tombstones=2), check_interval_seconds=0.02
    )
    paths = committed_files(graveler, repo, 2)
    delete(graveler, sensor, repo, "main", paths)
    sensor.start()
    try:
        wait_until(lambda: compactor.calls, timeout=5, what="a compaction")
    finally:
        sensor.stop()
    assert compactor.calls == [(repo, "main")]


def test_rebuild_is_bounded_per_branch(graveler, repo, make_sensor):
    graveler.commits.seal(graveler.refs.get_repository(repo), "main")
    for batch in range(3):  # three tokens of 40 entries: two sealed, one staging
        put(graveler, None, repo, "main", [f"b{batch}/{i}" for i in range(40)])
        if batch < 2:
            graveler.commits.seal(graveler.refs.get_repository(repo), "main")
    sensor = make_sensor(tombstones=1000, rebuild_max_items_per_branch=50)
    stats = sensor.get_branch_stats(repo, "main")
    assert stats.puts == 50 and stats.sealed_tokens == 2
