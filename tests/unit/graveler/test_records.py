"""layout.decode (records.decode_record with the layout's record checks): garbage never passes as a record; listings skip, the rest fail."""

import grpc
import pytest

from quarry.graveler import layout, records
from quarry.graveler.layout import decode as decode_record
from quarry.graveler.records import CorruptRecord
from quarry.graveler.refs import BRANCHES_PREFIX
from quarry.graveler.staging import StagingManager
from quarry.v1 import records_pb2, types_pb2

GARBAGE = b"\xff\xfe not a protobuf \x00\x01"
COMMIT = "a" * 64


@pytest.mark.parametrize(
    "message_type, key",
    [
        (records_pb2.RepositoryRecord, b"repos/demo"),
        (types_pb2.Branch, b"branches/main"),
        (types_pb2.Tag, b"tags/v1"),
        (types_pb2.Commit, f"commits/{COMMIT}".encode()),
        (types_pb2.StagedValue, b"some/path"),
        (records_pb2.CleanupRecord, b"staging/abc"),
    ],
)
@pytest.mark.parametrize("value", [GARBAGE, b""], ids=["garbage", "empty"])
def test_garbage_and_empty_records_are_corrupt(message_type, key, value):
    with pytest.raises(CorruptRecord) as caught:
        decode_record(message_type, b"part/x", key, value)
    error = caught.value
    assert error.code == grpc.StatusCode.DATA_LOSS and error.reason == "CORRUPT_RECORD"
    assert error.metadata == {
        "partition": "part/x",
        "key": key.decode(),
        "record": message_type.__name__,
    }


def test_well_formed_records_that_contradict_their_key_are_corrupt():
    branch = types_pb2.Branch(name="other", commit_id=COMMIT, staging_token="t")
    with pytest.raises(CorruptRecord, match="does not match its key"):
        decode_record(types_pb2.Branch, b"p", b"branches/main", branch.SerializeToString())
    no_commit = types_pb2.Branch(name="main", staging_token="t")
    with pytest.raises(CorruptRecord, match="no commit id"):
        decode_record(types_pb2.Branch, b"p", b"branches/main", no_commit.SerializeToString())
    # The dropper deletes the partition a cleanup key names: never one of another class.
    for key in (b"quarry", b"cleanup", b"nonsense"):
        record = records_pb2.CleanupRecord(partition_key=key.decode(), queued_at=1)
        with pytest.raises(CorruptRecord):
            decode_record(records_pb2.CleanupRecord, b"cleanup", key, record.SerializeToString())
    good = types_pb2.Branch(name="main", commit_id=COMMIT, staging_token="t")
    assert decode_record(types_pb2.Branch, b"p", b"branches/main", good.SerializeToString()) == good


def test_only_a_listing_skips_and_each_record_counts_once():
    with pytest.raises(CorruptRecord):
        layout.decode_or_skip(types_pb2.Tag, b"p", b"tags/x", GARBAGE)
    with records.listing() as tally:
        with records.listing() as inner:  # nested scopes share the tally
            assert inner is tally
            for _ in range(3):  # a retried read of the same record
                assert layout.decode_or_skip(types_pb2.Tag, b"p", b"tags/x", GARBAGE) is None
            assert layout.decode_or_skip(types_pb2.Tag, b"p", b"tags/y", GARBAGE) is None
        assert tally.count == 2
        records.next_page_starts_at(b"tags/y")
        assert tally.count == 1
    with pytest.raises(CorruptRecord):
        layout.decode_or_skip(types_pb2.Tag, b"p", b"tags/x", GARBAGE)


def test_graveler_listings_skip_and_reads_fail(graveler, repo, kv_store):
    graveler.create_branch(repo, "good", "main")
    partition = graveler.refs.get_repository(repo).partition
    kv_store.set(partition, BRANCHES_PREFIX + b"bad", GARBAGE)
    with records.listing() as tally:
        branches, _ = graveler.list_branches(repo)
    assert [b.name for b in branches] == ["good", "main"] and tally.count == 1
    with pytest.raises(CorruptRecord):
        graveler.get_branch(repo, "bad")
    # Without a listing scope of its own, the domain call opens one: still skipped.
    assert [b.name for b in graveler.list_branches(repo)[0]] == ["good", "main"]


def test_dropper_parks_and_never_overwrites_a_parked_item(kv_store):
    staging = StagingManager(kv_store)
    kv_store.set(b"cleanup", b"staging/x", GARBAGE)
    assert staging.drop_queued(grace_seconds=0) == 0
    assert kv_store.get(b"cleanup", b"parked/staging/x").value == GARBAGE
    # Another corrupt item under the same key later: parked beside the first, not over it.
    kv_store.set(b"cleanup", b"staging/x", b"other garbage")
    staging.drop_queued(grace_seconds=0)
    parked = {i.key: i.value for i in kv_store.scan(b"cleanup")}
    assert parked[b"parked/staging/x"] == GARBAGE
    assert b"other garbage" in parked.values() and b"staging/x" not in parked
    # A key too long to prefix is parked under its hash, still never lost.
    long_key = b"staging/" + b"k" * 1010
    kv_store.set(b"cleanup", long_key, GARBAGE)
    staging.drop_queued(grace_seconds=0)
    assert long_key not in {i.key for i in kv_store.scan(b"cleanup")}
    assert sum(1 for i in kv_store.scan(b"cleanup") if i.value == GARBAGE) == 2
