"""The storage layout's record codecs (quarry.graveler.layout): records are stored as the
internal quarry.storage.v1 messages, and their bytes are those the quarry.v1 messages wrote
before, both ways, so existing stores and export files read unchanged (no format bump)."""

import pytest
from google.protobuf import timestamp_pb2

from quarry.graveler import layout
from quarry.graveler.model import Entry
from quarry.graveler.refs import Repository
from quarry.storage.v1 import records_pb2 as stored
from quarry.v1 import records_pb2, types_pb2

TIME = timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=123_000)
ENTRY = types_pb2.Entry(
    path="a/b.parquet",
    physical_address="s3://b/data/x",
    size_bytes=42,
    checksum="abc",
    mtime=TIME,
    content_type="application/x-parquet",
    metadata={"k": "v", "z": "1"},
)

# Every stored record type, fully populated, as the API (or quarry.v1 record) message.
API_RECORDS = [
    types_pb2.Branch(
        name="main",
        commit_id="c" * 64,
        staging_token="t1",
        sealed_tokens=["t2", "t3"],
        dirty=False,
        compacted_metarange_id="m1",
        compaction_start_time=TIME,
    ),
    types_pb2.Branch(name="legacy", commit_id="c" * 64, staging_token="t1"),  # no `dirty`
    types_pb2.Commit(
        id="d" * 64,
        parents=["a" * 64, "b" * 64],
        metarange_id="m",
        message="msg",
        committer="me",
        creation_time=TIME,
        metadata={"x": "y"},
        generation=7,
    ),
    types_pb2.Tag(name="v1", commit_id="c" * 64),
    types_pb2.GarbageCollectionRules(
        default_retention_days=7.5, branch_retention_days={"main": 30.0}
    ),
    types_pb2.StagedValue(entry=ENTRY),
    types_pb2.StagedValue(tombstone=True),
    records_pb2.RepositoryRecord(
        repository=types_pb2.Repository(
            name="r",
            storage_namespace="s3://b/r",
            default_branch="main",
            creation_time=TIME,
            instance_id="i1",
        ),
        instance_id="i1",
    ),
    records_pb2.CleanupRecord(partition_key="staging/t1", queued_at=1_700_000_000),
    records_pb2.CleanupRecord(
        partition_key="staging/t2",
        queued_at=1_700_000_000,
        repository_partition="repo/r/i1",
        branch="main",
        token="t2",
    ),
    records_pb2.RequestRecord(
        state=records_pb2.REQUEST_STATE_DONE,
        fingerprint=b"\x01\x02",
        response=b"resp",
        updated_at_ms=1_700_000_000_123,
        owner="o",
    ),
]


def _stored_type(message):
    return getattr(stored, type(message).__name__)


@pytest.mark.parametrize("api", API_RECORDS, ids=lambda m: type(m).__name__)
def test_api_bytes_decode_as_stored_messages_and_back(api):
    data = api.SerializeToString(deterministic=True)
    record = _stored_type(api).FromString(data)
    assert record.SerializeToString(deterministic=True) == data
    assert type(api).FromString(record.SerializeToString(deterministic=True)) == api


@pytest.mark.parametrize("api", API_RECORDS, ids=lambda m: type(m).__name__)
def test_stored_and_api_descriptors_agree_field_for_field(api):
    def shape(descriptor, depth=0):
        return {
            f.number: (
                f.name,
                f.type,
                f.is_repeated,
                f.has_presence,
                shape(f.message_type, depth + 1)
                if f.message_type is not None and depth < 3
                else None,
            )
            for f in descriptor.fields
        }

    assert shape(_stored_type(api).DESCRIPTOR) == shape(api.DESCRIPTOR)


def test_layout_writes_the_bytes_the_api_messages_wrote():
    branch, legacy, commit, tag, rules = API_RECORDS[:5]
    for api, encode in (
        (branch, layout.encode_branch),
        (legacy, layout.encode_branch),
        (commit, layout.encode_commit),
        (tag, layout.encode_tag),
        (rules, layout.encode_gc_rules),
    ):
        assert encode(api) == api.SerializeToString(deterministic=True)
    entry = Entry(
        "a/b.parquet",
        "s3://b/data/x",
        42,
        "abc",
        1_700_000_000_000_123,
        "application/x-parquet",
        {"k": "v", "z": "1"},
    )
    assert layout.encode_staged(entry) == types_pb2.StagedValue(entry=ENTRY).SerializeToString(
        deterministic=True
    )
    assert layout.encode_staged(None) == types_pb2.StagedValue(tombstone=True).SerializeToString()
    repo = Repository("r", "s3://b/r", "main", "i1", 1_700_000_000)
    # An unsharded repository (staging_shards 1) stores the bytes written before the field
    # existed: the API message reports 1, the record leaves it absent.
    written_before = repo.to_proto()
    written_before.ClearField("staging_shards")
    assert (
        layout.encode_repository(repo.to_proto(), repo.instance_id)
        == records_pb2.RepositoryRecord(
            repository=written_before, instance_id="i1"
        ).SerializeToString()
    )
    sharded = Repository("r", "s3://b/r", "main", "i1", 1_700_000_000, staging_shards=4)
    stored = layout.encode_repository(sharded.to_proto(), sharded.instance_id)
    assert Repository.from_record(stored, layout.repository_key("r")) == sharded


def test_layout_reads_records_the_api_messages_wrote():
    branch, legacy, commit, tag, rules = API_RECORDS[:5]
    partition = b"repo/r/i1"
    assert layout.decode_branch(partition, "main", branch.SerializeToString()) == branch
    decoded_legacy = layout.decode_branch(partition, "legacy", legacy.SerializeToString())
    assert decoded_legacy == legacy and not decoded_legacy.HasField("dirty")
    assert (
        layout.decode(
            types_pb2.Commit, partition, layout.commit_key(commit.id), commit.SerializeToString()
        )
        == commit
    )
    assert (
        layout.decode(types_pb2.Tag, partition, layout.tag_key("v1"), tag.SerializeToString())
        == tag
    )
    assert (
        layout.decode(
            types_pb2.GarbageCollectionRules,
            partition,
            layout.GC_RULES_KEY,
            rules.SerializeToString(),
        )
        == rules
    )
    staged = layout.decode_staged(
        "t1", "a/b.parquet", types_pb2.StagedValue(entry=ENTRY).SerializeToString()
    )
    assert staged is not None and staged.mtime_us == 1_700_000_000_000_123
    assert dict(staged.metadata) == {"k": "v", "z": "1"}
    assert (
        layout.decode_staged(
            "t1", "gone", types_pb2.StagedValue(tombstone=True).SerializeToString()
        )
        is None
    )
