"""Issue 10.1 over real gRPC servers: an entry's identity covers every field a user writes
and reads back — the physical address included, not mtime (docs/architecture.md §2). Whatever a
user last staged and read back before a commit is what they read after it: re-pointing a
path at another address (same size, no checksum) is a change for the uncommitted diff,
commit, diff, merge and compaction; re-staging exactly the same fields is not."""

from __future__ import annotations

import itertools

import pytest

from quarry.client import make_entry
from quarry.graveler.errors import MergeConflict, NoChanges
from quarry.v1 import types_pb2
from support.suite import suite_fixture

_numbers = itertools.count()
OLD = "s3://b/old.parquet"
NEW = "s3://b/NEW.parquet"


suite = suite_fixture()


@pytest.fixture
def client(suite):
    client = suite.client()
    yield client
    client.close()


@pytest.fixture
def repo(suite, client, request):
    name = f"id-{next(_numbers)}"
    client.create_repository(name, suite.namespace(name))
    client.put_object(name, "main", path="t.parquet", physical_address=OLD, size_bytes=100)
    client.commit(name, "main", "old")
    return name


def fields(entry: types_pb2.Entry) -> tuple:
    return (
        entry.path,
        entry.physical_address,
        entry.size_bytes,
        entry.checksum,
        entry.content_type,
        dict(entry.metadata),
    )


def test_a_repointed_address_is_committed(client, repo):
    """The issue's reproduction: same size, no checksum, another address."""
    client.put_object(repo, "main", path="t.parquet", physical_address=NEW, size_bytes=100)
    assert client.stat_object(repo, "main", "t.parquet").physical_address == NEW
    changes = list(client.iter_uncommitted(repo, "main"))
    assert [(c.type, c.path, c.entry.physical_address) for c in changes] == [
        (types_pb2.CHANGE_TYPE_CHANGED, "t.parquet", NEW)
    ]
    response = client.commit(repo, "main", "re-point")
    assert response.summary.changed == 1
    assert client.stat_object(repo, "main", "t.parquet").physical_address == NEW
    assert client.stat_object(repo, "main@", "t.parquet").physical_address == NEW
    # The committed history shows it too: diff between the two commits.
    log = [c.id for c in client.iter_log(repo, "main")]
    diff = list(client.iter_diff(repo, log[1], log[0]))
    assert [(c.type, c.path, c.entry.physical_address) for c in diff] == [
        (types_pb2.CHANGE_TYPE_CHANGED, "t.parquet", NEW)
    ]
    assert client.stat_object(repo, log[1], "t.parquet").physical_address == OLD


@pytest.mark.parametrize(
    "field,value",
    [
        ("physical_address", NEW),
        ("size_bytes", 101),
        ("checksum", "c"),
        ("content_type", "text/csv"),
        ("metadata", {"k": "v"}),
    ],
)
def test_every_field_a_user_reads_back_is_part_of_the_identity(client, repo, field, value):
    entry = dict(path="t.parquet", physical_address=OLD, size_bytes=100)
    entry[field] = value
    client.put_object(repo, "main", **entry)
    client.commit(repo, "main", f"change {field}")
    assert fields(client.stat_object(repo, "main", "t.parquet")) == fields(make_entry(**entry))


def test_restaging_the_same_fields_is_no_change_even_with_another_mtime(client, repo):
    client.put_object(
        repo, "main", path="t.parquet", physical_address=OLD, size_bytes=100, mtime=1_800_000_000
    )
    assert list(client.iter_uncommitted(repo, "main")) == []
    with pytest.raises(NoChanges):
        client.commit(repo, "main", "nothing")


def test_merge_takes_a_repointed_address_and_conflicts_on_two(client, repo):
    client.create_branch(repo, "dev", "main")
    client.create_branch(repo, "other", "main")
    client.put_object(repo, "dev", path="t.parquet", physical_address=NEW, size_bytes=100)
    client.commit(repo, "dev", "re-point on dev")
    # Only dev changed the path: the merge brings the new address.
    merged = client.merge(repo, "dev", "main")
    assert merged.summary.changed == 1
    assert client.stat_object(repo, "main", "t.parquet").physical_address == NEW
    # dev and other re-pointed it at different addresses: a conflict, not a silent pick.
    client.put_object(
        repo, "other", path="t.parquet", physical_address="s3://b/third.parquet", size_bytes=100
    )
    client.commit(repo, "other", "re-point elsewhere")
    with pytest.raises(MergeConflict):
        client.merge(repo, "other", "main")
    assert client.stat_object(repo, "main", "t.parquet").physical_address == NEW
    client.merge(repo, "other", "main", strategy="source-wins")
    assert client.stat_object(repo, "main", "t.parquet").physical_address == "s3://b/third.parquet"


def test_compaction_keeps_a_repointed_address(client, repo):
    client.put_object(repo, "main", path="t.parquet", physical_address=NEW, size_bytes=100)
    client.put_object(repo, "main", path="u.parquet", physical_address=OLD, size_bytes=1)
    compacted = client.compact(repo, "main")
    assert compacted.compacted_metarange_id
    assert client.stat_object(repo, "main", "t.parquet").physical_address == NEW
    assert sorted(
        (c.path, c.entry.physical_address) for c in client.iter_uncommitted(repo, "main")
    ) == [("t.parquet", NEW), ("u.parquet", OLD)]
    assert client.commit(repo, "main", "after compaction").summary.changed == 1
    assert client.stat_object(repo, "main@", "t.parquet").physical_address == NEW
