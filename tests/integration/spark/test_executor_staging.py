"""What a write task does with its files, against real services and a real local namespace,
without Spark (quarry.spark.executor._write_and_stage, the body of a task): every file is
durable before its entry is staged, and a task never stages an entry for bytes it did not
write."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pytest

import quarry.blob
from quarry.blob.local import LocalBlobStore
from quarry.client import Client
from quarry.spark.common import Connection
from quarry.spark.executor import WriteSpec, _write_and_stage, file_key
from support.suite import suite_fixture

JOB = "20261126T080000-0123456789ab"


suite = suite_fixture()


class RecordingStore(LocalBlobStore):
    """A real local store that remembers which keys were written and which are synced."""

    def __init__(self, root: str):
        super().__init__(root)
        self.written: list[str] = []
        self.synced: set[str] = set()

    def put_deferred(self, key: str, data: bytes) -> bool:
        written = super().put_deferred(key, data)
        self.written.append(key)
        return written

    def put(self, key: str, data: bytes, if_absent: bool = False) -> bool:
        written = super().put(key, data, if_absent)  # durable when it returns
        self.written.append(key)
        self.synced.add(key)
        return written

    def sync(self) -> None:
        super().sync()
        self.synced.update(self.written)


@pytest.fixture
def task(suite, request, monkeypatch):
    repo = "stage-" + request.node.name.replace("_", "-")[5:40].strip("-")
    namespace = suite.namespace(repo)
    with suite.client() as client:
        client.create_repository(repo, namespace)
        client.create_branch(repo, "eph", "main")
    stores: list[RecordingStore] = []

    def open_recording(storage_namespace, settings=None):
        stores.append(RecordingStore(storage_namespace))
        return stores[-1]

    monkeypatch.setattr(quarry.blob, "open_blob_store", open_recording)
    connection = Connection(suite.targets["branch-manager"], suite.targets["committer"])
    spec = WriteSpec(connection, repo, "eph", namespace, "t/", JOB, max_records_per_file=1)
    return spec, stores


def rows(count: int) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"id": list(range(count))})]


def test_every_staged_entry_points_at_a_synced_file(suite, task, monkeypatch):
    spec, stores = task
    spec = WriteSpec(**{**spec.__dict__, "stage_batch_files": 4})
    unsynced_at_staging: list[str] = []
    real_put_objects = Client.put_objects

    def checking_put_objects(self, repository, branch, entries, *args, **kwargs):
        entries = list(entries)
        (store,) = stores
        for entry in entries:
            key = entry.physical_address[len(spec.storage_namespace) + 1 :]
            if key not in store.synced:
                unsynced_at_staging.append(key)
        return real_put_objects(self, repository, branch, entries, *args, **kwargs)

    monkeypatch.setattr(Client, "put_objects", checking_put_objects)
    reported = _write_and_stage(spec, iter(rows(10)), partition=0, task_attempt_id=7)

    assert len(reported) == 10 and unsynced_at_staging == []
    with suite.client() as client:
        staged = {e.path: e for e in client.iter_objects(spec.repository, "eph", prefix="t/")}
    assert sorted(staged) == sorted(r["path"] for r in reported)
    for row in reported:  # each entry describes the bytes at its address
        with open(row["physical_address"], "rb") as fh:
            data = fh.read()
        entry = staged[row["path"]]
        assert (entry.size_bytes, entry.checksum) == (len(data), hashlib.sha256(data).hexdigest())


def test_a_file_key_that_already_exists_is_never_staged_or_overwritten(suite, task):
    """Keys are unique per task attempt, so one already there holds someone else's bytes:
    staging an entry for it would describe bytes the task did not write."""
    spec, _stores = task
    key = file_key(spec, 0, 1, 7)
    with LocalBlobStore(spec.storage_namespace) as store:
        store.put(key, b"not this task's file")

    with pytest.raises(FileExistsError):
        _write_and_stage(spec, iter(rows(3)), partition=0, task_attempt_id=7)

    with LocalBlobStore(spec.storage_namespace) as store:
        assert store.get(key) == b"not this task's file"
    with suite.client() as client:
        staged = [e.physical_address for e in client.iter_objects(spec.repository, "eph")]
    assert not [a for a in staged if a.endswith(key)]
