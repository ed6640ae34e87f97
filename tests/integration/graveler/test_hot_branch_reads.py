"""Hot branch reads (issue 14, target 4): concurrent reads of one branch share one
branch-record read (RefManager's single flight per branch key), and never one issued before
they arrived, so a write acknowledged before a read starts is always visible to it.

The suite is real (kv-gateway, range-writer, branch-manager, committer on loopback). A second
branch-manager replica runs in this process over the same kv-gateway, with a gate on its KV
store that can hold one branch-record read after the gateway answered it: that read is then
"in flight" with a known (old) result while writes land through the suite's branch-manager.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from quarry.graveler import errors as gerrors
from quarry.graveler.graveler import Graveler
from quarry.graveler.layout import branch_key
from quarry.kv import store as kv
from quarry.kv.remote import RemoteStore
from quarry.runtime.wiring import core_dependencies
from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import committer_pb2 as cm
from quarry.v1 import types_pb2
from support.wait import wait_until

TIMEOUT = 10


class BranchReadGate(kv.Store):
    """Passes everything to `inner`; when armed, holds the next read of `key` after the
    inner read returned, until released."""

    def __init__(self, inner: kv.Store, key: bytes) -> None:
        self.inner = inner
        self.key = key
        self.branch_reads = 0
        self._armed = False
        self._lock = threading.Lock()
        self.reached = threading.Event()
        self._released = threading.Event()

    def arm(self) -> None:
        self.reached.clear()
        self._released.clear()
        self._armed = True

    def release(self) -> None:
        self._released.set()

    def get(self, partition: bytes, key: bytes) -> kv.GetResult:
        result = self.inner.get(partition, key)
        if key != self.key:
            return result
        with self._lock:
            self.branch_reads += 1
            hold, self._armed = self._armed, False
        if hold:
            self.reached.set()
            assert self._released.wait(TIMEOUT), "the held read was never released"
        return result

    def set(self, partition, key, value):
        self.inner.set(partition, key, value)

    def set_if(self, partition, key, value, predicate):
        self.inner.set_if(partition, key, value, predicate)

    def delete(self, partition, key):
        self.inner.delete(partition, key)

    def delete_if(self, partition, key, predicate):
        self.inner.delete_if(partition, key, predicate)

    def scan(self, partition, start=b"", end=None, batch_size=kv.DEFAULT_SCAN_BATCH_SIZE):
        return self.inner.scan(partition, start, end, batch_size)

    def batch_get(self, items):
        return self.inner.batch_get(items)

    def batch_set(self, items):
        self.inner.batch_set(items)

    def batch_delete(self, items):
        self.inner.batch_delete(items)

    def close(self):
        self.inner.close()


def entry(path: str, checksum: str = "c") -> types_pb2.Entry:
    return types_pb2.Entry(path=path, physical_address=f"s3://b/{path}", checksum=checksum)


@pytest.fixture
def clean_repo(stubs, suite, request) -> str:
    """A repository whose main holds one committed object "a" and is clean."""
    name = "hot-" + request.node.name.replace("_", "-")[-40:].strip("-")
    stubs.bm.CreateRepository(
        bm.CreateRepositoryRequest(name=name, storage_namespace=suite.namespace(name))
    )
    stubs.bm.PutObject(bm.PutObjectRequest(repository=name, branch="main", entry=entry("a")))
    stubs.cm.Commit(cm.CommitRequest(repository=name, branch="main", message="a"))
    return name


@pytest.fixture
def replica(suite):
    """(graveler, gate): a second branch-manager core over the suite's kv-gateway, its
    branch-record reads of main passing through a BranchReadGate."""
    gate = BranchReadGate(RemoteStore(suite.targets["kv-gateway"]), branch_key("main"))
    deps = core_dependencies(suite.settings, kv_store=gate, start_dropper=False)
    yield deps.graveler, gate
    for close in deps.closers:
        close()
    gate.close()


def wait_for_branch_requests(graveler: Graveler, count: int) -> None:
    wait_until(
        lambda: graveler.refs.branch_read_stats().requests >= count,
        timeout=TIMEOUT,
        what=f"{count} branch-record reads to arrive",
    )


def test_a_read_never_shares_a_branch_read_issued_before_it_arrived(stubs, clean_repo, replica):
    """The safety rule on purpose: reader A's branch read is issued (and answered: main is
    clean) and held; a write is then acknowledged; reader B starts after the ack while A's
    read is still in flight. Answering B from A's read would skip staging (clean) and miss
    the write: B must wait for a read of its own and see it."""
    graveler, gate = replica
    graveler.stat_object(clean_repo, "main", "a")  # warm the repository record
    gate.arm()
    with ThreadPoolExecutor(2) as pool:
        before = graveler.refs.branch_read_stats().requests
        reader_a = pool.submit(graveler.stat_object, clean_repo, "main", "b")
        assert gate.reached.wait(TIMEOUT)
        stubs.bm.PutObject(
            bm.PutObjectRequest(repository=clean_repo, branch="main", entry=entry("b", "new"))
        )  # acknowledged: every read that starts now must see it
        reader_b = pool.submit(graveler.stat_object, clean_repo, "main", "b")
        wait_for_branch_requests(graveler, before + 2)  # B waits on the flight machinery
        gate.release()
        with pytest.raises(gerrors.ObjectNotFound):
            reader_a.result(TIMEOUT)  # started before the write: need not see it
        assert reader_b.result(TIMEOUT).checksum == "new"


def test_reads_arriving_during_a_branch_read_share_one_following_read(clean_repo, replica):
    """Counts: while one branch read is in flight, five more reads of the branch arrive;
    together they cost exactly one more branch-record read (clean branch: no validation
    read), and every one of them answers."""
    graveler, gate = replica
    graveler.stat_object(clean_repo, "main", "a")
    stats_before = graveler.refs.branch_read_stats()
    reads_before = gate.branch_reads
    gate.arm()
    with ThreadPoolExecutor(6) as pool:
        first = pool.submit(graveler.stat_object, clean_repo, "main", "a")
        assert gate.reached.wait(TIMEOUT)
        followers = [pool.submit(graveler.stat_object, clean_repo, "main", "a") for _ in range(5)]
        wait_for_branch_requests(graveler, stats_before.requests + 6)
        gate.release()
        assert first.result(TIMEOUT).path == "a"
        assert [f.result(TIMEOUT).path for f in followers] == ["a"] * 5
    assert gate.branch_reads - reads_before == 2
    stats = graveler.refs.branch_read_stats()
    assert stats.requests - stats_before.requests == 6
    assert stats.backend_reads - stats_before.backend_reads == 2


def test_sequential_reads_each_read_the_branch_record_once(
    stubs, suite, clean_repo, counting_backend
):
    """No sharing without concurrency, and nothing added: one branch-record read per
    StatObject on a clean branch, no staging read."""
    suite.drain_cleanup_queue()  # the dropper's branch reads are not the StatObjects'
    for _ in range(3):  # warm the repository and commit caches
        stubs.bm.StatObject(bm.StatObjectRequest(repository=clean_repo, ref="main", path="a"))
    counting_backend.reset()
    for _ in range(10):
        stubs.bm.StatObject(bm.StatObjectRequest(repository=clean_repo, ref="main", path="a"))
    assert counting_backend.total(cls="repo", op="get") == 10
    # Gets only: the suite's staging dropper scans and deletes retired tokens meanwhile.
    assert counting_backend.total(cls="staging", op="get") == 0


def test_read_after_write_under_concurrency(stubs, clean_repo):
    """Writers stage objects while readers hammer StatObject on the same branch; every read
    asks for a path whose write was acknowledged before the read started, and finds it with
    the acknowledged checksum, across a commit in the middle."""
    acknowledged: list[tuple[str, str]] = []
    lock = threading.Lock()
    stop = threading.Event()
    failures: list[str] = []
    reads = [0]

    def writer(w: int) -> None:
        for i in range(25):
            path, checksum = f"w{w}/{i:03d}", f"{w}-{i}"
            stubs.bm.PutObject(
                bm.PutObjectRequest(
                    repository=clean_repo, branch="main", entry=entry(path, checksum)
                )
            )
            with lock:
                acknowledged.append((path, checksum))
            if w == 0 and i == 12:
                stubs.cm.Commit(cm.CommitRequest(repository=clean_repo, branch="main", message="m"))

    def reader(r: int) -> None:
        n = 0
        while not stop.is_set():
            with lock:
                known = acknowledged[-(1 + n % 7) :] if acknowledged else []
            for path, checksum in known[:1]:
                got = stubs.bm.StatObject(
                    bm.StatObjectRequest(repository=clean_repo, ref="main", path=path)
                )
                if got.entry.checksum != checksum:
                    failures.append(f"{path}: {got.entry.checksum!r} != {checksum!r}")
            n += 1
            with lock:
                reads[0] += 1

    with ThreadPoolExecutor(10) as pool:
        readers = [pool.submit(reader, r) for r in range(6)]
        writers = [pool.submit(writer, w) for w in range(4)]
        for f in writers:
            f.result(60)
        # A fixed amount of reading, however long it takes (no throughput floor).
        # (A reader that failed ends the wait: its error is raised below.)
        wait_until(
            lambda: reads[0] > 100 or any(f.done() for f in readers), timeout=120, what="100 reads"
        )
        stop.set()
        for f in readers:
            f.result(60)
    assert not failures, failures[:5]
    assert reads[0] > 100
