"""Partition classes (docs/architecture.md §2) and the validating store wrapper."""

from __future__ import annotations

import grpc
import pytest

from quarry.kv import store
from quarry.kv.memory import MemoryStore
from quarry.kv.partitions import (
    CLEANUP_PARTITION,
    MAX_STAGING_SHARDS,
    QUARRY_PARTITION,
    PartitionValidatingStore,
    partition_class,
    repo_partition,
    sharded_token,
    staging_partition,
    staging_partition_of,
    staging_partitions,
    staging_shard,
    staging_token_shards,
)


@pytest.mark.parametrize(
    "partition, expected",
    [
        (b"quarry", "quarry"),
        (b"repo/lake/01HZX", "repo"),
        (b"repo/a/b", "repo"),
        (b"staging/tok-123", "staging"),
        (b"cleanup", "cleanup"),
        (b"auth", "auth"),
        (bytearray(b"staging/t"), "staging"),
    ],
)
def test_known_partition_classes(partition, expected):
    assert partition_class(partition) == expected


@pytest.mark.parametrize(
    "partition",
    [
        b"",
        b"quarry/",
        b"quarryx",
        b"Quarry",
        b"cleanup/x",
        b"other",
        b"repo",
        b"repo/",
        b"repo/lake",
        b"repo/lake/",
        b"repo//id",
        b"repo/lake/id/extra",
        b"staging",
        b"staging/",
        b"staging/a/b",
    ],
)
def test_unknown_partitions_are_refused_with_the_known_classes_listed(partition):
    with pytest.raises(store.UnknownPartitionClass) as caught:
        partition_class(partition)
    message = str(caught.value)
    for form in ("quarry", "repo/<repo>/<instance-id>", "staging/<token>", "cleanup", "auth"):
        assert form in message
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.reason == "UNKNOWN_PARTITION_CLASS"


def test_non_bytes_partition_is_refused():
    with pytest.raises(store.UnknownPartitionClass):
        partition_class("quarry")  # type: ignore[arg-type]


def test_builders():
    assert QUARRY_PARTITION == b"quarry"
    assert CLEANUP_PARTITION == b"cleanup"
    assert repo_partition("lake", "01HZX") == b"repo/lake/01HZX"
    assert repo_partition(b"lake", b"i") == b"repo/lake/i"
    assert staging_partition("tok") == b"staging/tok"
    assert partition_class(repo_partition("lake", "i")) == "repo"
    assert partition_class(staging_partition(b"t")) == "staging"


@pytest.mark.parametrize("repo, instance", [("", "i"), ("r", ""), ("a/b", "i"), ("r", "i/j")])
def test_repo_partition_refuses_bad_parts(repo, instance):
    with pytest.raises(store.UnknownPartitionClass):
        repo_partition(repo, instance)


@pytest.mark.parametrize("token", ["", "a/b"])
def test_staging_partition_refuses_bad_tokens(token):
    with pytest.raises(store.UnknownPartitionClass):
        staging_partition(token)


# ---- the wrapper -----------------------------------------------------------------------

BAD = b"nowhere/x"
GOOD = b"staging/t1"


@pytest.fixture
def backend():
    return MemoryStore()


@pytest.fixture
def validating(backend):
    return PartitionValidatingStore(backend)


def test_valid_calls_pass_through(validating, backend):
    validating.set(GOOD, b"a", b"1")
    validating.set_if(GOOD, b"b", b"2", store.ABSENT)
    validating.batch_set([(b"quarry", b"repos/x", b"r"), (GOOD, b"c", b"3")])
    assert validating.get(GOOD, b"a").value == b"1"
    assert [kv.key for kv in validating.scan(GOOD)] == [b"a", b"b", b"c"]
    assert [r.value for r in validating.batch_get([(GOOD, b"b"), (b"quarry", b"repos/x")])] == [
        b"2",
        b"r",
    ]
    validating.delete(GOOD, b"a")
    validating.batch_delete([(GOOD, b"b")])
    assert [kv.key for kv in backend.scan(GOOD)] == [b"c"]


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.get(BAD, b"k"),
        lambda s: s.set(BAD, b"k", b"v"),
        lambda s: s.set_if(BAD, b"k", b"v", store.ABSENT),
        lambda s: s.delete(BAD, b"k"),
        lambda s: s.scan(BAD),
        lambda s: s.batch_get([(BAD, b"k")]),
        lambda s: s.batch_set([(BAD, b"k", b"v")]),
        lambda s: s.batch_delete([(BAD, b"k")]),
    ],
)
def test_every_call_checks_its_partition(validating, call):
    with pytest.raises(store.UnknownPartitionClass):
        call(validating)


def test_one_bad_item_refuses_the_whole_batch_before_anything_is_written(validating, backend):
    with pytest.raises(store.UnknownPartitionClass):
        validating.batch_set([(GOOD, b"a", b"1"), (BAD, b"b", b"2")])
    assert list(backend.scan(GOOD)) == []

    backend.set(GOOD, b"a", b"1")
    with pytest.raises(store.UnknownPartitionClass):
        validating.batch_delete([(GOOD, b"a"), (b"repo/x", b"b")])
    assert backend.get(GOOD, b"a").value == b"1"


def test_generic_partition_checks_come_first(validating):
    with pytest.raises(store.MissingPartitionKey):
        validating.get(b"", b"k")
    with pytest.raises(store.KeyTooLarge):
        validating.get(b"staging/" + b"t" * store.MAX_PARTITION_KEY_BYTES, b"k")


# ---- sharded staging tokens ------------------------------------------------------------------


def test_the_shard_of_a_key_never_changes():
    """Pinned values: a change of the hash would strand every staged item of every sharded
    token in a partition where point reads no longer look."""
    assert [staging_shard(b"a/b.parquet", n) for n in (1, 2, 4, 16, 64)] == [0, 1, 3, 7, 55]
    assert [staging_shard(b"data/part-00000.parquet", n) for n in (2, 4, 16, 64)] == [1, 3, 3, 19]
    assert [staging_shard(b"", n) for n in (2, 4, 16, 64)] == [0, 0, 4, 52]


def test_keys_spread_over_every_shard():
    counts = [0] * 4
    for i in range(4000):
        counts[staging_shard(f"data/part-{i:05d}.parquet".encode(), 4)] += 1
    assert min(counts) > 800, counts


def test_sharded_token_names():
    assert sharded_token("abc", 1) == "abc"  # one shard: today's token, byte for byte
    assert staging_partitions("abc") == [b"staging/abc"]
    token = sharded_token("abc", 4)
    assert token == "abc.s4"
    assert staging_token_shards(token) == 4
    assert staging_partitions(token) == [f"staging/abc.s4.{i}".encode() for i in range(4)]
    key = b"a/b.parquet"
    assert staging_partition_of(token, key) == b"staging/abc.s4.3"
    assert staging_partition_of("abc", key) == b"staging/abc"
    for partition in staging_partitions(token):
        assert partition_class(partition) == "staging"
    with pytest.raises(store.UnknownPartitionClass):
        staging_partition(token)  # a sharded token has no single partition
    for shards in (0, MAX_STAGING_SHARDS + 1):
        with pytest.raises(store.InvalidStagingShards):
            sharded_token("abc", shards)


@pytest.mark.parametrize(
    "partition",
    [
        b"staging/abc.s4",  # the bare name of a sharded token: its items live in its shards
        b"staging/abc.s4.4",  # shard index out of range
        b"staging/abc.s4.04",  # not canonical
        b"staging/abc.s1.0",  # one shard is the unsharded layout
        b"staging/abc.s65.0",  # past MAX_STAGING_SHARDS
    ],
)
def test_malformed_shard_partitions_are_refused(partition):
    with pytest.raises(store.UnknownPartitionClass):
        partition_class(partition)


def _other_shard_of(token: str, key: bytes) -> bytes:
    own = staging_partition_of(token, key)
    return next(p for p in staging_partitions(token) if p != own)


@pytest.mark.parametrize(
    "write",
    [
        lambda s, p, k: s.set(p, k, b"v"),
        lambda s, p, k: s.set_if(p, k, b"v", store.ABSENT),
        lambda s, p, k: s.batch_set([(p, k, b"v")]),
    ],
)
def test_a_key_is_written_only_into_its_own_shard(validating, backend, write):
    """Safety rule: a staged item never lands in a partition where a point read of its path
    does not look (another shard of its token, another token's shard, a bare name)."""
    token, other_token = sharded_token("mine", 4), sharded_token("theirs", 4)
    key = b"a/b.parquet"
    write(validating, staging_partition_of(token, key), key)  # its own shard: accepted
    for wrong in (
        _other_shard_of(token, key),
        _other_shard_of(other_token, key),
    ):
        with pytest.raises(store.WrongStagingShard):
            write(validating, wrong, key)
    with pytest.raises(store.UnknownPartitionClass):
        write(validating, b"staging/" + token.encode(), key)
    assert [
        p
        for p in (
            b"staging/mine.s4.0",
            b"staging/mine.s4.1",
            b"staging/mine.s4.2",
            b"staging/theirs.s4.0",
            b"staging/theirs.s4.1",
            b"staging/theirs.s4.2",
            b"staging/theirs.s4.3",
        )
        if list(backend.scan(p))
    ] == []


def test_one_misplaced_key_refuses_the_whole_batch(validating, backend):
    token = sharded_token("mine", 4)
    good, bad = b"a/b.parquet", b"x"
    with pytest.raises(store.WrongStagingShard) as caught:
        validating.batch_set(
            [
                (staging_partition_of(token, good), good, b"1"),
                (_other_shard_of(token, bad), bad, b"2"),
            ]
        )
    assert caught.value.reason == "WRONG_STAGING_SHARD"
    assert all(list(backend.scan(p)) == [] for p in staging_partitions(token))
