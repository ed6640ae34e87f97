"""The client's pythonic surface: arguments → requests, pages followed, settings."""

from __future__ import annotations

import datetime as dt

import pytest

from quarry.client import Client, make_entry
from quarry.config import load_settings
from quarry.v1 import types_pb2


def test_from_settings_and_context_manager(fake):
    settings = load_settings(
        env={}, branch_manager_address=fake.target, committer_address=fake.target
    )
    with Client.from_settings(settings, timeout=5) as client:
        repo = client.create_repository("lake", "/tmp/lake")
        assert (repo.name, repo.default_branch) == ("lake", "main")
        assert client.branch_manager_target == fake.target
    request = fake.script.requests["CreateRepository"][0]
    assert request.default_branch == "main"
    assert client._owned == []  # channels closed


def test_put_object_from_keywords(fake, client):
    when = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
    entry = client.put_object(
        "repo",
        "main",
        path="a/b.csv",
        physical_address="s3://x/y",
        size_bytes=12,
        checksum="abc",
        mtime=when,
        content_type="text/csv",
        metadata={"owner": "me"},
        if_absent=True,
    )
    assert entry.path == "a/b.csv"
    request = fake.script.requests["PutObject"][0]
    assert request.if_absent is True
    assert request.entry.mtime.ToDatetime(tzinfo=dt.UTC) == when
    assert dict(request.entry.metadata) == {"owner": "me"}
    with pytest.raises(TypeError):
        client.put_object("repo", "main", make_entry("a"), path="b")


def test_iter_branches_follows_page_tokens(fake, client):
    names = [b.name for b in client.iter_branches("repo", page_size=3)]
    assert names == [f"b{i}" for i in range(7)]
    assert len(fake.script.requests["ListBranches"]) == 3


def test_iter_objects_merges_common_prefixes_in_order(fake, client):
    items = list(client.iter_objects("repo", "main", delimiter="/", page_size=2))
    flat = [i if isinstance(i, str) else i.path for i in items]
    assert flat == ["a.csv", "b/", "c.csv", "d/", "e.csv"]
    recursive = [e.path for e in client.iter_objects("repo", "main", prefix="b/")]
    assert recursive == ["b/1", "b/2"]


def test_iter_log_limit_sizes_pages(fake, client):
    ids = [c.id for c in client.iter_log("repo", "main", limit=5)]
    assert ids == ["c10", "c9", "c8", "c7", "c6"]
    assert fake.script.requests["Log"][0].page_size == 5
    assert len([c for c in client.iter_log("repo", "main")]) == 10
    assert list(client.iter_log("repo", "main", limit=0)) == []


def test_delete_objects_in_batches(fake, client):
    done = []
    deleted = client.delete_objects(
        "repo", "main", (f"p{i}" for i in range(25)), batch_size=10, progress=done.append
    )
    assert deleted == 25
    assert [len(r.paths) for r in fake.script.requests["DeleteObjects"]] == [10, 10, 5]
    assert done == [10, 20, 25]
    assert client.delete_objects("repo", "main", []) == 0


def test_make_entry_timestamps():
    assert make_entry("p", mtime=None).HasField("mtime") is False
    naive = make_entry("p", mtime=dt.datetime(2024, 1, 1))
    assert naive.mtime.seconds == int(dt.datetime(2024, 1, 1, tzinfo=dt.UTC).timestamp())
    stamp = types_pb2.Entry(path="x").mtime
    stamp.seconds = 7
    assert make_entry("p", mtime=stamp).mtime.seconds == 7
    with pytest.raises(TypeError):
        make_entry("p", mtime="yesterday")


def test_core_error_classes_are_rebuilt_by_reason(fake, client):
    import quarry.blob.base  # noqa: F401 — defines another OBJECT_NOT_FOUND class
    from quarry.graveler import errors as gerrors

    fake.script.fail("GetBranch", gerrors.ObjectNotFound("'x' not found", metadata={"p": "x"}))
    with pytest.raises(gerrors.ObjectNotFound) as caught:
        client.get_branch("repo", "main")
    assert caught.value.metadata == {"p": "x"} and caught.value.reason == "OBJECT_NOT_FOUND"
