"""RequestLog over the memory KV store: at most one run per request id and fingerprint."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid

import pytest

from quarry.graveler import requests as rq
from quarry.kv.memory import MemoryStore
from quarry.v1 import records_pb2
from support.counting import CountingStore
from support.wait import wait_until

PARTITION = b"repo/r/instance"


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store():
    return CountingStore(MemoryStore())


@pytest.fixture
def log(store, clock):
    request_log = rq.RequestLog(
        store, lambda name: PARTITION, retention_seconds=100, lease_seconds=10, clock=clock
    )
    yield request_log
    request_log.close()


class Calls:
    """A call that counts its runs and answers with its run number."""

    def __init__(self):
        self.runs = 0

    def __call__(self) -> bytes:
        self.runs += 1
        return f"result {self.runs}".encode()


def run(log, request_id, call, fingerprint=b"f1"):
    return log.run(PARTITION, request_id, fingerprint, call, lambda r: r, lambda b: b)


def record(store, request_id) -> records_pb2.RequestRecord:
    return records_pb2.RequestRecord.FromString(
        store.inner.get(PARTITION, b"requests/" + request_id.encode()).value
    )


def test_a_repeat_returns_the_first_result_without_running(log, store):
    call, request_id = Calls(), str(uuid.uuid4())
    store.reset()
    assert run(log, request_id, call) == b"result 1"
    assert store.snapshot() == {("set_if", "repo"): 2}  # claim + record, no read
    store.reset()
    replayed = rq.CALLS.labels("replayed")._value.get()
    assert run(log, request_id, call) == b"result 1"
    assert store.snapshot() == {("set_if", "repo"): 1, ("get", "repo"): 1}
    assert rq.CALLS.labels("replayed")._value.get() == replayed + 1
    assert call.runs == 1
    assert record(store, request_id).state == rq.DONE


def test_the_same_id_with_another_fingerprint_is_reused_and_runs_nothing(log):
    call, request_id = Calls(), str(uuid.uuid4())
    run(log, request_id, call)
    with pytest.raises(rq.RequestIdReused):
        run(log, request_id, call, fingerprint=b"f2")
    assert call.runs == 1


SOME_ID = uuid.UUID("0b6f3c52-8f0e-4a5e-9d59-2f1c7e0a4d11")


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "abc",
        # Fixed ids: a test's name must be the same in every collection (xdist workers).
        str(SOME_ID)[:-1],
        str(SOME_ID) + "0",
        "urn:uuid:" + str(SOME_ID),
        str(SOME_ID).replace("-", ""),
    ],
)
def test_a_malformed_id_is_refused_before_anything_runs(log, store, bad):
    call = Calls()
    store.reset()
    with pytest.raises(rq.InvalidRequestId):
        run(log, bad, call)
    assert call.runs == 0 and store.total() == 0


def test_an_id_is_case_insensitive(log):
    call, request_id = Calls(), str(uuid.uuid4())
    run(log, request_id.upper(), call)
    assert run(log, request_id, call) == b"result 1"


def test_a_failed_call_is_not_remembered(log, store):
    request_id = str(uuid.uuid4())

    def fail():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        run(log, request_id, fail)
    assert record(store, request_id).state == rq.RELEASED
    call = Calls()
    assert run(log, request_id, call, fingerprint=b"another request") == b"result 1"
    assert call.runs == 1


def test_a_repeat_while_the_first_runs_is_in_progress_and_does_not_run(log):
    request_id = str(uuid.uuid4())
    started, release = threading.Event(), threading.Event()
    runs = []

    def slow():
        runs.append(1)
        started.set()
        assert release.wait(5)
        return b"slow"

    first = threading.Thread(target=run, args=(log, request_id, slow))
    first.start()
    assert started.wait(5)
    with pytest.raises(rq.RequestInProgress) as caught:
        run(log, request_id, slow)
    assert caught.value.retry_delay is not None
    with pytest.raises(rq.RequestIdReused):  # a different request is told at once
        run(log, request_id, slow, fingerprint=b"f2")
    release.set()
    first.join()
    assert run(log, request_id, slow) == b"slow"
    assert len(runs) == 1


def test_a_dead_claim_is_taken_over_after_the_lease(log, store, clock):
    request_id = str(uuid.uuid4())
    dead = records_pb2.RequestRecord(
        state=rq.PENDING, fingerprint=b"f1", owner="dead", updated_at_ms=int(clock.now * 1000)
    )
    store.inner.set(PARTITION, b"requests/" + request_id.encode(), dead.SerializeToString())
    call = Calls()
    clock.now += 9
    with pytest.raises(rq.RequestInProgress):
        run(log, request_id, call)
    clock.now += 2  # past the lease
    assert run(log, request_id, call) == b"result 1"
    assert record(store, request_id).owner != "dead"


def test_after_the_retention_window_the_id_runs_again(log, clock):
    call, request_id = Calls(), str(uuid.uuid4())
    run(log, request_id, call)
    clock.now += 100
    assert run(log, request_id, call) == b"result 1"
    clock.now += 0.01
    assert run(log, request_id, call, fingerprint=b"f2") == b"result 2"


def test_a_live_claim_is_renewed_so_a_long_call_is_never_run_twice(store):
    """Real clock, a 0.3 s lease, a call of 1.2 s: repeats all along are in progress."""
    request_log = rq.RequestLog(store, lambda name: PARTITION, lease_seconds=0.3)
    request_id = str(uuid.uuid4())
    runs = []
    started = threading.Event()

    def long_call():
        runs.append(1)
        started.set()
        time.sleep(1.2)
        return b"long"

    first = threading.Thread(target=run, args=(request_log, request_id, long_call))
    first.start()
    try:
        assert started.wait(5)
        deadline = time.monotonic() + 1.0
        refusals = 0
        while time.monotonic() < deadline:
            with pytest.raises(rq.RequestInProgress):
                run(request_log, request_id, long_call)
            refusals += 1
            time.sleep(0.1)
        assert refusals >= 5
    finally:
        first.join()
        request_log.close()
    assert run(request_log, request_id, long_call) == b"long" and len(runs) == 1


def test_a_takeover_while_the_first_runs_is_not_overwritten_by_the_first(log, store, clock):
    """The first call's claim expired (it stalled) and a repeat took it over: the first
    finishing later must not overwrite the taker's record with its own."""
    log.close()  # no renewals: the first call is stalled for good
    request_id = str(uuid.uuid4())
    taken = []

    def stalled():
        clock.now += 11  # the lease passes while this call runs (no renewer at this clock)
        taken.append(run(log, request_id, Calls()))
        return b"stalled"

    assert run(log, request_id, stalled) == b"stalled"
    assert taken == [b"result 1"]
    assert record(store, request_id).response == b"result 1"


def test_a_corrupt_record_is_data_loss_naming_it(log, store):
    request_id = str(uuid.uuid4())
    store.inner.set(PARTITION, b"requests/" + request_id.encode(), b"\xff garbage")
    with pytest.raises(rq.CorruptRequestRecord) as caught:
        run(log, request_id, Calls())
    assert caught.value.code.name == "DATA_LOSS"
    assert caught.value.metadata["key"] == f"requests/{request_id}"


def test_purge_deletes_only_records_that_count_as_absent(log, store, clock):
    kept, expired, released = (str(uuid.uuid4()) for _ in range(3))
    run(log, expired, Calls())
    with pytest.raises(RuntimeError):
        run(log, released, lambda: (_ for _ in ()).throw(RuntimeError("x")))
    clock.now += 50
    run(log, kept, Calls())
    clock.now += 60  # `expired` is 110 s old, `kept` 60 s
    store.inner.set(PARTITION, b"other/key", b"not a request record")
    assert log.purge_expired(PARTITION) == 2
    left = [kv.key for kv in store.inner.scan(PARTITION)]
    assert left == [b"other/key", b"requests/" + kept.encode()]
    assert log.purge_used() == 0  # what is left is live


def test_partition_for_checks_the_repository_name(log):
    from quarry.graveler.errors import InvalidName

    assert log.partition_for(None) == b"quarry"
    assert log.partition_for("rep") == PARTITION
    with pytest.raises(InvalidName):
        log.partition_for("bad/name")


def test_work_after_the_effect_runs_once_the_outcome_is_recorded(log, store):
    """Post-event hooks (after_recorded) run after the DONE record, not inside the window
    between the call's effect and that record: a process dying in a slow hook then leaves
    the call answered by its record, not run again (found: a commit applied twice after a
    committer was killed during its post-commit hooks)."""
    request_id = str(uuid.uuid4())
    seen: list[int] = []

    def call() -> bytes:
        rq.after_recorded(lambda: seen.append(record(store, request_id).state))
        assert seen == []  # deferred while the call runs
        return b"answer"

    assert run(log, request_id, call) == b"answer"
    assert seen == [rq.DONE]
    # Outside a recorded call it runs at once; a failure in it never changes the answer.
    rq.after_recorded(lambda: seen.append(0))
    assert seen == [rq.DONE, 0]

    def failing() -> None:
        raise RuntimeError("a hook's recorder failed")

    other = str(uuid.uuid4())
    assert run(log, other, lambda: (rq.after_recorded(failing), b"fine")[1]) == b"fine"
    assert record(store, other).state == rq.DONE


def test_work_after_a_failed_call_never_runs(log):
    ran: list[bool] = []

    def call() -> bytes:
        rq.after_recorded(lambda: ran.append(True))
        raise ValueError("the call failed after asking")

    with pytest.raises(ValueError):
        run(log, str(uuid.uuid4()), call)
    assert ran == []


class FlakyStore(MemoryStore):
    """A store whose conditional writes fail (the KV store away) while `away` is set."""

    def __init__(self):
        super().__init__()
        self.away = False

    def set_if(self, partition, key, value, predicate):
        if self.away:
            raise ConnectionError("the KV store is away")
        return super().set_if(partition, key, value, predicate)


@pytest.mark.parametrize("fails", [False, True])
def test_an_outcome_whose_write_failed_is_recorded_once_the_store_is_back(fails):
    """tester hAM O2: the KV store away as a call ended left its id claimed for the whole
    lease (repeats REQUEST_IN_PROGRESS); the renewer now writes the outcome (DONE, or
    RELEASED for a failed call) once the store answers again, within the lease."""
    store = FlakyStore()
    # A lease long enough for a loaded machine; the renewer looks every lease / 6.
    request_log = rq.RequestLog(store, lambda name: PARTITION, lease_seconds=10)
    request_id = str(uuid.uuid4())

    def call():
        store.away = True  # goes away as the call ends: its outcome cannot be written
        if fails:
            raise RuntimeError("the call failed")
        return b"answer"

    try:
        if fails:
            with pytest.raises(RuntimeError):
                run(request_log, request_id, call)
        else:
            assert run(request_log, request_id, call) == b"answer"
        store.away = False
        expected = b"again" if fails else b"answer"
        # At once: still in progress, or (the renewer was quicker) already the right answer.
        with contextlib.suppress(rq.RequestInProgress):
            assert run(request_log, request_id, lambda: b"again") == expected
        key = b"requests/" + request_id.encode()
        wanted = rq.RELEASED if fails else rq.DONE
        wait_until(
            lambda: (
                records_pb2.RequestRecord.FromString(store.get(PARTITION, key).value).state
                == wanted
            ),
            timeout=30,
            what="the outcome written once the store is back",
        )
        assert run(request_log, request_id, lambda: b"again") == expected
    finally:
        request_log.close()
