"""The sweep of abandoned multipart uploads (operations.sweep_abandoned_uploads) over a real
local blob store, with time given (`now`, or the background sweeper's injected clock),
never waited for: an upload nothing was written to for the expiry is removed; one written
to since (a recent part, however old its record), a completed object's data and keys that
are no upload of the gateway are never touched. The background sweeper
(AbandonedUploadSweeper) does that for every repository it is given. The end-to-end twin:
tests/e2e/test_s3_gateway.py::test_abandoned_multipart_uploads_are_swept."""

from __future__ import annotations

import json
import os

import pytest

from quarry.blob import open_blob_store
from quarry.s3gateway.operations import (
    MULTIPART_PREFIX,
    AbandonedUploadSweeper,
    sweep_abandoned_uploads,
)
from quarry.v1 import types_pb2

DAY = 86400.0
EXPIRY = 7 * DAY
NOW = 2_000_000_000.0
ABANDONED = "a" * 32
ACTIVE = "b" * 32


def _write(store, root: str, key: str, age: float) -> None:
    store.put(key, b"x")
    os.utime(os.path.join(root, *key.split("/")), (NOW - age, NOW - age))


@pytest.fixture
def lake(tmp_path):
    root = str(tmp_path / "ns")
    store = open_blob_store(root)
    record = json.dumps({"key": "main/k", "owner": "u", "initiated": NOW - 30 * DAY})
    _write(store, root, f"{MULTIPART_PREFIX}{ABANDONED}/upload.json", 30 * DAY)
    _write(store, root, f"{MULTIPART_PREFIX}{ABANDONED}/part-00001-{'0' * 32}-u1", 8 * DAY)
    store.put(f"{MULTIPART_PREFIX}{ACTIVE}/upload.json", record.encode())
    os.utime(os.path.join(root, "_s3_multipart", ACTIVE, "upload.json"), (NOW - 30 * DAY,) * 2)
    _write(store, root, f"{MULTIPART_PREFIX}{ACTIVE}/part-00001-{'1' * 32}-u2", 20 * DAY)
    _write(store, root, f"{MULTIPART_PREFIX}{ACTIVE}/part-00002-{'2' * 32}-u3", 60.0)
    _write(store, root, "data/0123456789abcdef0123456789abcdef", 365 * DAY)  # completed
    _write(store, root, f"{MULTIPART_PREFIX}not-an-upload/file", 365 * DAY)
    yield store
    store.close()


def _keys(store) -> set[str]:
    return {info.key for info in store.list("")}


def test_only_uploads_idle_for_the_whole_expiry_are_removed(lake):
    before = _keys(lake)
    assert sweep_abandoned_uploads(lake, EXPIRY, NOW) == [ABANDONED]
    gone = {k for k in before if k.startswith(f"{MULTIPART_PREFIX}{ABANDONED}/")}
    assert len(gone) == 2
    # The in-progress upload whole (its record is a month old, its last part a minute), the
    # completed object's data, and what is no upload of the gateway: all still there.
    assert _keys(lake) == before - gone


def test_an_upload_written_to_within_the_expiry_is_never_removed(lake):
    """Safety: move time so the active upload's newest part is just inside the expiry."""
    assert sweep_abandoned_uploads(lake, EXPIRY, NOW + EXPIRY - 61) == [ABANDONED]
    assert any(k.startswith(f"{MULTIPART_PREFIX}{ACTIVE}/") for k in _keys(lake))
    assert sweep_abandoned_uploads(lake, EXPIRY, NOW + EXPIRY) == [ACTIVE]
    assert "data/0123456789abcdef0123456789abcdef" in _keys(lake)


def test_expiry_zero_never_removes_anything(lake):
    before = _keys(lake)
    assert sweep_abandoned_uploads(lake, 0, NOW + 10 * 365 * DAY) == []
    assert _keys(lake) == before


# ---- the background sweep over every repository (AbandonedUploadSweeper) ------------------


class _Clock:
    """Wall time as the test sets it: the sweep's `now`, moved instead of waited for."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _repositories(tmp_path, lake_root: str):
    """`lake` (the fixture's namespace: an abandoned and an in-progress upload), `quiet` (a
    namespace with no upload at all), one whose namespace is a file and one whose directory
    is gone (nothing to sweep there: the pass goes on, and creates nothing)."""
    (tmp_path / "not-a-dir").write_bytes(b"x")
    (tmp_path / "quiet").mkdir(exist_ok=True)
    return [
        types_pb2.Repository(name="broken", storage_namespace=str(tmp_path / "not-a-dir")),
        types_pb2.Repository(name="gone", storage_namespace=str(tmp_path / "gone")),
        types_pb2.Repository(name="lake", storage_namespace=lake_root),
        types_pb2.Repository(name="quiet", storage_namespace=str(tmp_path / "quiet")),
    ]


def test_the_background_sweep_removes_abandoned_uploads_of_every_repository(lake, tmp_path):
    clock = _Clock(NOW)
    repos = _repositories(tmp_path, lake.root)
    sweeper = AbandonedUploadSweeper(lambda: repos, None, EXPIRY, clock=clock)
    before = _keys(lake)
    assert sweeper.sweep() == {"lake": [ABANDONED]}
    assert {k for k in before - _keys(lake)} == {
        k for k in before if k.startswith(f"{MULTIPART_PREFIX}{ABANDONED}/")
    }
    assert sweeper.sweep() == {}  # nothing more: the next pass finds nothing to remove
    assert not (tmp_path / "gone").exists()  # a missing namespace is not created


def test_the_background_sweep_never_touches_an_upload_in_progress(lake, tmp_path):
    """Safety: the active upload's newest part was written 60 s before NOW. Up to one second
    before it has been idle for the whole expiry, every pass leaves it whole (and a
    completed object's data, however old, always); at the expiry it is abandoned."""
    clock = _Clock(NOW)
    sweeper = AbandonedUploadSweeper(
        lambda: _repositories(tmp_path, lake.root), None, EXPIRY, clock=clock
    )
    active = {k for k in _keys(lake) if k.startswith(f"{MULTIPART_PREFIX}{ACTIVE}/")}
    for now in (NOW, NOW + DAY, NOW + EXPIRY - 61):
        clock.now = now
        sweeper.sweep()
        assert active <= _keys(lake), f"an upload in progress was touched at {now}"
    clock.now = NOW + EXPIRY - 60
    assert sweeper.sweep() == {"lake": [ACTIVE]}
    assert "data/0123456789abcdef0123456789abcdef" in _keys(lake)
    assert f"{MULTIPART_PREFIX}not-an-upload/file" in _keys(lake)
