"""Amortized reads: follower batching shares identical gets without breaking read-after-write
and without adding latency to uncontended gets."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from quarry.kv import amortized as amortized_module
from quarry.kv import store
from quarry.kv.amortized import AmortizationStats, AmortizedStore
from quarry.kv.memory import MemoryStore
from support.wait import wait_until

P = b"repo/lake/i1"
K = b"branches/main"
TIMEOUT = 10


class Hold:
    """Holds one backend read after it has taken its snapshot of the value (so the read is
    "in flight" with a known result) until released; optionally fails it then."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error
        self.reached = threading.Event()
        self._released = threading.Event()

    def wait_reached(self) -> None:
        assert self.reached.wait(TIMEOUT), "the held read never started"

    def release(self) -> None:
        self._released.set()

    def block(self) -> None:
        self.reached.set()
        assert self._released.wait(TIMEOUT), "the held read was never released"


class GatedStore(MemoryStore):
    """A MemoryStore whose gets are counted and numbered from 1; `hold(n)` makes read n
    block (after reading the value) until the returned Hold is released. `delay` makes every
    read take that long (only for the load test)."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay
        self._reads_lock = threading.Lock()
        self._holds: dict[int, Hold] = {}
        self.reads = 0

    def hold(self, read_number: int, error: BaseException | None = None) -> Hold:
        with self._reads_lock:
            assert read_number > self.reads, "that read has already started"
            hold = self._holds[read_number] = Hold(error)
            return hold

    def release_all(self) -> None:
        with self._reads_lock:
            for hold in self._holds.values():
                hold.release()

    def get(self, partition: bytes, key: bytes) -> store.GetResult:
        with self._reads_lock:
            self.reads += 1
            hold = self._holds.get(self.reads)
        try:
            return super().get(partition, key)
        finally:
            if self.delay:
                time.sleep(self.delay)
            if hold is not None:
                hold.block()
                if hold.error is not None:
                    raise hold.error


@pytest.fixture
def pool():
    with ThreadPoolExecutor(max_workers=40) as executor:
        yield executor


@pytest.fixture
def backend(pool):
    # Depends on `pool` so that held reads are released before the pool joins its threads,
    # even when a test fails half-way.
    gated = GatedStore()
    yield gated
    gated.release_all()


def wait_for_requests(amortized: AmortizedStore, count: int) -> None:
    """Wait until `count` gets have registered with `amortized` (joined or started a flight:
    registering and joining happen in one step under its lock)."""
    wait_until(
        lambda: amortized.stats().requests >= count,
        timeout=TIMEOUT,
        interval=0.0005,
        what=f"{count} gets to register",
    )


def assert_no_flights_left(amortized: AmortizedStore) -> None:
    assert amortized.keys_in_flight() == 0


# ---- no added latency when uncontended -------------------------------------------------


def test_sequential_gets_each_read_the_backend_at_once(backend):
    backend.set(P, K, b"1")
    amortized = AmortizedStore(backend)
    assert amortized.get(P, K).value == b"1"
    amortized.set(P, K, b"2")
    assert amortized.get(P, K).value == b"2"
    assert backend.reads == 2
    assert amortized.stats() == AmortizationStats(requests=2, backend_reads=2)
    assert_no_flights_left(amortized)


def test_sequential_gets_add_no_wait(monkeypatch):
    """An uncontended get waits for nothing but the backend: no gate is ever waited on
    (counted, not timed: a timing comparison flakes on a loaded machine)."""
    backend = MemoryStore()
    backend.set(P, K, b"v")
    amortized = AmortizedStore(backend)
    waits = []
    real_wait = amortized_module._Gate.wait

    def counted_wait(gate) -> None:
        waits.append(gate)
        real_wait(gate)

    monkeypatch.setattr(amortized_module._Gate, "wait", counted_wait)
    for _ in range(600):
        assert amortized.get(P, K).value == b"v"
    assert waits == []
    assert amortized.stats() == AmortizationStats(requests=600, backend_reads=600)
    assert_no_flights_left(amortized)


# ---- sharing under concurrency ---------------------------------------------------------


def test_gets_arriving_during_a_read_share_exactly_one_following_read(pool, backend):
    backend.set(P, K, b"v1")
    amortized = AmortizedStore(backend)
    read_1 = backend.hold(1)

    first = pool.submit(amortized.get, P, K)
    read_1.wait_reached()
    followers = [pool.submit(amortized.get, P, K) for _ in range(20)]
    wait_for_requests(amortized, 21)
    assert backend.reads == 1  # the followers queue behind read 1; nothing else is issued
    read_1.release()

    assert [f.result(TIMEOUT).value for f in [first, *followers]] == [b"v1"] * 21
    assert backend.reads == 2
    assert amortized.stats() == AmortizationStats(requests=21, backend_reads=2)
    assert_no_flights_left(amortized)


def test_arrivals_after_the_next_read_is_issued_form_a_new_flight(pool, backend):
    backend.set(P, K, b"v1")
    amortized = AmortizedStore(backend)
    read_1, read_2 = backend.hold(1), backend.hold(2)

    first = pool.submit(amortized.get, P, K)
    read_1.wait_reached()
    second_wave = [pool.submit(amortized.get, P, K) for _ in range(3)]
    wait_for_requests(amortized, 4)
    read_1.release()
    read_2.wait_reached()  # read 2 (the second wave's) has seen b"v1" and is in flight

    amortized.set(P, K, b"v2")
    third_wave = [pool.submit(amortized.get, P, K) for _ in range(3)]
    wait_for_requests(amortized, 7)
    assert backend.reads == 2
    read_2.release()

    assert first.result(TIMEOUT).value == b"v1"
    assert [f.result(TIMEOUT).value for f in second_wave] == [b"v1"] * 3
    assert [f.result(TIMEOUT).value for f in third_wave] == [b"v2"] * 3
    assert amortized.stats() == AmortizationStats(requests=7, backend_reads=3)
    assert_no_flights_left(amortized)


def test_read_after_write_a_get_never_joins_a_read_already_issued(pool, backend):
    backend.set(P, K, b"old")
    amortized = AmortizedStore(backend)
    read_1 = backend.hold(1)

    first = pool.submit(amortized.get, P, K)
    # Read 1 has been issued and has already seen b"old"; it is held in flight.
    read_1.wait_reached()

    def write_then_read() -> bytes:
        amortized.set(P, K, b"new")
        return amortized.get(P, K).value

    writer = pool.submit(write_then_read)
    wait_for_requests(amortized, 2)
    read_1.release()

    # Served by read 1 it would see b"old"; it must wait for a read issued after it arrived.
    assert writer.result(TIMEOUT) == b"new"
    assert first.result(TIMEOUT).value == b"old"
    assert backend.reads == 2
    assert_no_flights_left(amortized)


def test_not_found_reaches_every_member_as_its_own_copy(pool, backend):
    amortized = AmortizedStore(backend)
    read_1 = backend.hold(1)

    futures = [pool.submit(amortized.get, P, b"missing")]
    read_1.wait_reached()
    futures += [pool.submit(amortized.get, P, b"missing") for _ in range(5)]
    wait_for_requests(amortized, 6)
    read_1.release()

    errors = []
    for future in futures:
        with pytest.raises(store.KeyNotFound) as caught:
            future.result(TIMEOUT)
        errors.append(caught.value)
    assert backend.reads == 2  # read 1 for the first get, read 2 shared by the other five
    # Each member raises its own copy, with the backend's message and reason.
    assert len({id(e) for e in errors}) == len(errors)
    assert all(e.reason == "KEY_NOT_FOUND" for e in errors)
    assert len({str(e) for e in errors}) == 1
    assert_no_flights_left(amortized)


def test_different_keys_and_partitions_do_not_share(pool, backend):
    other_partition = b"repo/lake/i2"
    backend.set(P, b"a", b"A")
    backend.set(P, b"b", b"B")
    backend.set(other_partition, b"a", b"other-A")
    amortized = AmortizedStore(backend)
    read_1 = backend.hold(1)

    held = pool.submit(amortized.get, P, b"a")
    read_1.wait_reached()
    # Neither queues behind the held read of (P, a): each is read at once, in this thread.
    assert amortized.get(P, b"b").value == b"B"
    assert amortized.get(other_partition, b"a").value == b"other-A"
    assert not held.done()
    read_1.release()

    assert held.result(TIMEOUT).value == b"A"
    assert backend.reads == 3
    assert amortized.stats() == AmortizationStats(requests=3, backend_reads=3)
    assert_no_flights_left(amortized)


def test_bytearray_and_bytes_names_share_a_flight(pool, backend):
    backend.set(P, K, b"v")
    amortized = AmortizedStore(backend)
    read_1 = backend.hold(1)

    first = pool.submit(amortized.get, P, K)
    read_1.wait_reached()
    followers = [
        pool.submit(amortized.get, bytearray(P), memoryview(K)),
        pool.submit(amortized.get, P, K),
    ]
    wait_for_requests(amortized, 3)
    read_1.release()

    assert [f.result(TIMEOUT).value for f in [first, *followers]] == [b"v"] * 3
    assert backend.reads == 2
    assert_no_flights_left(amortized)


# ---- failures --------------------------------------------------------------------------


def test_a_failing_read_in_progress_does_not_strand_the_next_flight(pool, backend):
    backend.set(P, K, b"v")
    amortized = AmortizedStore(backend)
    read_1 = backend.hold(1, error=store.BackendUnavailable("backend went away"))

    first = pool.submit(amortized.get, P, K)
    read_1.wait_reached()
    followers = [pool.submit(amortized.get, P, K) for _ in range(5)]
    wait_for_requests(amortized, 6)
    read_1.release()

    with pytest.raises(store.BackendUnavailable):
        first.result(TIMEOUT)
    assert [f.result(TIMEOUT).value for f in followers] == [b"v"] * 5
    assert backend.reads == 2
    assert_no_flights_left(amortized)


def test_a_failing_shared_read_fails_every_member_and_the_key_recovers(pool, backend):
    backend.set(P, K, b"v")
    amortized = AmortizedStore(backend)
    read_1 = backend.hold(1)
    backend.hold(2, error=store.BackendUnavailable("backend went away")).release()

    first = pool.submit(amortized.get, P, K)
    read_1.wait_reached()
    followers = [pool.submit(amortized.get, P, K) for _ in range(5)]
    wait_for_requests(amortized, 6)
    read_1.release()

    assert first.result(TIMEOUT).value == b"v"
    errors = []
    for future in followers:
        with pytest.raises(store.BackendUnavailable) as caught:
            future.result(TIMEOUT)
        errors.append(caught.value)
    assert len({id(e) for e in errors}) == len(errors)
    assert_no_flights_left(amortized)
    assert amortized.get(P, K).value == b"v"  # the next get reads afresh
    assert backend.reads == 3


# ---- under load ------------------------------------------------------------------------


def test_hammering_one_key_amortizes_and_cleans_up(pool):
    backend = GatedStore(delay=0.002)
    backend.set(P, K, b"hot")
    amortized = AmortizedStore(backend)
    threads, gets_each = 32, 20
    barrier = threading.Barrier(threads)

    def hammer() -> list[bytes]:
        barrier.wait()
        return [amortized.get(P, K).value for _ in range(gets_each)]

    results = [f.result(30) for f in [pool.submit(hammer) for _ in range(threads)]]

    assert results == [[b"hot"] * gets_each] * threads
    stats = amortized.stats()
    assert stats.requests == threads * gets_each
    assert stats.backend_reads == backend.reads
    # Each read answers everything that queued behind the previous one.
    assert stats.backend_reads <= stats.requests // 4, stats
    assert_no_flights_left(amortized)


# ---- the rest of the Store interface ---------------------------------------------------


def test_everything_else_passes_through():
    backend = MemoryStore()
    amortized = AmortizedStore(backend)
    amortized.set(P, b"a", b"1")
    amortized.set_if(P, b"b", b"2", store.ABSENT)
    with pytest.raises(store.PredicateFailed):
        amortized.set_if(P, b"b", b"3", store.ABSENT)
    amortized.batch_set([(P, b"c", b"3"), (P, b"d", b"4")])
    assert [kv.key for kv in amortized.scan(P, b"b")] == [b"b", b"c", b"d"]
    amortized.delete(P, b"a")
    amortized.batch_delete([(P, b"c")])
    assert [r and r.value for r in amortized.batch_get([(P, b"a"), (P, b"b"), (P, b"d")])] == [
        None,
        b"2",
        b"4",
    ]
    assert amortized.stats().backend_reads == 0  # none of these were amortized gets


def test_gate_holds_every_waiter_until_opened_then_lets_all_through() -> None:
    """The flights' one-shot signal: a chain of lock hand-offs, so one waiter that did not
    pass the lock on would strand the rest (that is what this catches)."""
    from quarry.kv.amortized import _Gate

    gate = _Gate()
    passed: list[int] = []
    waiters = [
        threading.Thread(target=lambda k=k: (gate.wait(), passed.append(k)), daemon=True)
        for k in range(8)
    ]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.05)
    assert passed == []
    gate.open()
    deadline = time.monotonic() + TIMEOUT
    for waiter in waiters:
        waiter.join(max(0.0, deadline - time.monotonic()))
    assert sorted(passed) == list(range(8))
    gate.wait()  # after opening, a wait returns at once


def test_a_shared_read_works_for_no_one_callers_deadline():
    """A flight's read is shared by every member: it must never take its leader's deadline
    or cancellation (quarry.runtime.deadlines), which would fail the other members with the
    leader's DEADLINE_EXCEEDED / CANCELLED. It runs with the store's own timeout."""
    from quarry.runtime import deadlines

    seen = []

    class Recording(MemoryStore):
        def get(self, partition, key):
            seen.append((deadlines.current(), deadlines.timeout(30.0)))
            return super().get(partition, key)

    inner = Recording()
    inner.set(P, K, b"v")
    leader = deadlines.IncomingCall("/test/Leader", time.monotonic() + 0.5, lambda: True)
    with deadlines.serving(leader):
        assert deadlines.timeout(30.0) <= 0.5  # the leader's own calls carry its deadline
        assert AmortizedStore(inner).get(P, K).value == b"v"
    assert seen == [(None, 30.0)]
