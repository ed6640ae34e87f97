"""Shared staging calls of the s3-gateway's writes (quarry.uploads.SharedStaging) and the
rule for the bytes of a staging that failed (quarry.uploads.stage), over a real suite (gRPC
over loopback). A client wrapper holds the first calls open, so the writes that arrive
meanwhile wait for a shared call deterministically, with no timing.

Safety rules tried on purpose: a write never returns before its own entry is staged (each
writer stats its object the moment it returns); a refused write in a batch fails alone and
the others are staged; bytes are removed only when the server refused the staging, never
when the outcome is unknown (a lost answer after the entry was staged)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from quarry import errors, uploads
from quarry.blob import object_address, open_blob_store, open_object
from quarry.v1 import types_pb2
from support.suite import suite_fixture
from support.wait import wait_until

suite = suite_fixture()


@pytest.fixture
def client(suite):
    with suite.client() as client:
        yield client


@pytest.fixture
def repo(suite, client) -> str:
    name = f"r{uuid.uuid4().hex[:8]}"
    client.create_repository(name, suite.namespace(name))
    return name


class HeldClient:
    """The real client, with its first `hold` staging calls held open until `release()`; the
    calls it made, as ("put_object", path) or ("put_objects", [paths])."""

    def __init__(self, client: Any, hold: int) -> None:
        self._client = client
        self._hold = hold
        self._opened = threading.Event()
        self._lock = threading.Lock()
        self.calls: list[tuple[str, Any]] = []
        self.held = 0

    def release(self) -> None:
        self._opened.set()

    def _enter(self, call: tuple[str, Any]) -> None:
        with self._lock:
            self.calls.append(call)
            hold = len(self.calls) <= self._hold
            if hold:
                self.held += 1
        if hold:
            assert self._opened.wait(60)

    def put_object(self, repository: str, branch: str, entry: types_pb2.Entry) -> Any:
        self._enter(("put_object", entry.path))
        return self._client.put_object(repository, branch, entry)

    def put_objects(self, repository: str, branch: str, entries: list, batch_size: int) -> int:
        self._enter(("put_objects", [e.path for e in entries]))
        return self._client.put_objects(repository, branch, entries, batch_size=batch_size)


def entry_of(path: str) -> types_pb2.Entry:
    return types_pb2.Entry(path=path, physical_address=f"data/{path}", checksum=f"c-{path}")


def run_writers(
    staging: uploads.SharedStaging,
    held: HeldClient,
    repo: str,
    first: list[types_pb2.Entry],
    then: list[types_pb2.Entry],
    after_return: Callable[[types_pb2.Entry], Any],
) -> dict[str, Any]:
    """Stage `first` (each holds a call open), then `then` (each waits for a call), then let
    the held calls go; {path: what after_return saw right after its stage returned, or the
    error the stage raised}."""
    results: dict[str, Any] = {}

    def write(entry: types_pb2.Entry) -> None:
        try:
            staging.stage(held, repo, "main", entry)
        except Exception as exc:
            results[entry.path] = exc
            return
        results[entry.path] = after_return(entry)

    threads = [threading.Thread(target=write, args=(e,)) for e in first]
    for thread in threads:
        thread.start()
    wait_until(lambda: held.held == len(first), timeout=30, what="the first calls held")
    later = [threading.Thread(target=write, args=(e,)) for e in then]
    for thread in later:
        thread.start()
    wait_until(lambda: staging.waiting_writes() == len(then), timeout=30, what="the writes waiting")
    held.release()
    for thread in threads + later:
        thread.join(60)
    return results


def test_writes_that_wait_share_one_call_and_each_returns_after_its_own_entry(client, repo):
    batches: list[int] = []
    staging = uploads.SharedStaging(max_entries=100, max_calls=2, observe=batches.append)
    held = HeldClient(client, hold=2)
    first = [entry_of(f"first/{i}") for i in range(2)]
    then = [entry_of(f"then/{i}") for i in range(6)]
    # Read-after-acknowledge: each writer stats its own object the moment it returns.
    seen = run_writers(
        staging, held, repo, first, then, lambda e: client.stat_object(repo, "main", e.path)
    )
    for entry in first + then:
        assert isinstance(seen[entry.path], types_pb2.Entry), seen[entry.path]
        assert seen[entry.path].checksum == entry.checksum
    # Two calls of one entry held open; the six that waited went in ONE PutObjects.
    assert sorted(batches) == [1, 1, 6]
    assert held.calls[2] == ("put_objects", [e.path for e in then])
    assert staging.waiting_writes() == 0
    # Uncontended again: a write is one PutObject of its own.
    staging.stage(held, repo, "main", entry_of("alone"))
    assert held.calls[-1] == ("put_object", "alone") and batches[-1] == 1


def test_a_batch_never_carries_more_than_its_size(client, repo):
    batches: list[int] = []
    staging = uploads.SharedStaging(max_entries=3, max_calls=1, observe=batches.append)
    held = HeldClient(client, hold=1)
    then = [entry_of(f"then/{i}") for i in range(7)]
    run_writers(staging, held, repo, [entry_of("first")], then, lambda e: None)
    assert batches == [1, 3, 3, 1]
    assert {e.path for e in client.iter_objects(repo, "main")} == {
        "first",
        *(e.path for e in then),
    }


def test_a_refused_write_in_a_batch_fails_alone_and_the_others_are_staged(client, repo):
    batches: list[int] = []
    staging = uploads.SharedStaging(max_entries=100, max_calls=1, observe=batches.append)
    held = HeldClient(client, hold=1)
    bad = entry_of("then/bad\x00")  # a NUL in the path: INVALID_PATH
    then = [entry_of("then/0"), bad, entry_of("then/2")]
    results = run_writers(staging, held, repo, [entry_of("first")], then, lambda e: "staged")
    assert results["first"] == results["then/0"] == results["then/2"] == "staged"
    # The refusal it would have got alone: the same error class a PutObject of it answers.
    with pytest.raises(errors.QuarryError) as alone:
        client.put_object(repo, "main", bad)
    assert type(results[bad.path]) is type(alone.value), results[bad.path]
    staged = {e.path for e in client.iter_objects(repo, "main")}
    assert staged == {"first", "then/0", "then/2"}
    # The shared call was refused whole; then each write staged with a call of its own.
    assert batches == [1, 3, 1, 1, 1]
    assert sorted(p for kind, p in held.calls[2:] if kind == "put_object") == [
        "then/0",
        "then/2",
        bad.path,
    ]


class LosingClient:
    """Stages for real (or not), then fails with `error`: a staging whose answer was lost,
    or one the server refused."""

    def __init__(self, client: Any, error: errors.QuarryError, stages: bool) -> None:
        self._client, self._error, self._stages = client, error, stages

    def put_object(self, repository: str, branch: str, entry: types_pb2.Entry) -> None:
        if self._stages:
            self._client.put_object(repository, branch, entry)
        raise self._error


@pytest.mark.parametrize("shared", [False, True])
def test_bytes_are_removed_only_when_the_server_refused_the_staging(suite, client, repo, shared):
    namespace = client.get_repository(repo).storage_namespace
    staging = uploads.SharedStaging() if shared else None

    def write(path: str, failing: Any) -> str:
        with open_blob_store(namespace, suite.settings) as store:
            pieces = iter([b"payload", b""])
            stored = uploads.store_stream(store, lambda _size: next(pieces))
            entry = types_pb2.Entry(
                path=path,
                physical_address=object_address(namespace, stored.key),
                size_bytes=stored.size,
                checksum=stored.md5,
            )
            with pytest.raises(type(failing._error)):
                uploads.stage(failing, repo, "main", entry, store, stored.key, staging)
            return entry.physical_address

    def present(address: str) -> bool:
        try:
            with open_object(address, suite.settings) as reader:
                return reader.read() == b"payload"
        except errors.QuarryError:
            return False

    # The entry was staged and then the answer was lost: its bytes must stay, and the staged
    # entry reads them.
    lost = write("lost", LosingClient(client, errors.Unavailable("answer lost"), stages=True))
    assert present(lost)
    assert client.stat_object(repo, "main", "lost").physical_address == lost
    # Unknown outcomes that staged nothing keep them too (GC's to collect).
    for error in (errors.DeadlineExceeded("late"), errors.Aborted("contended")):
        assert present(write("maybe", LosingClient(client, error, stages=False)))
    # A refusal (denied, protected, invalid): nothing was staged, the bytes are removed.
    for error in (errors.PermissionDenied("denied"), errors.FailedPrecondition("protected")):
        assert not present(write("refused", LosingClient(client, error, stages=False)))
