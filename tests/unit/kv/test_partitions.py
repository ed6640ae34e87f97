"""Partition classes (docs/architecture.md §2) and the validating store wrapper."""

from __future__ import annotations

import grpc
import pytest

from quarry.kv import store
from quarry.kv.memory import MemoryStore
from quarry.kv.partitions import (
    CLEANUP_PARTITION,
    QUARRY_PARTITION,
    PartitionValidatingStore,
    partition_class,
    repo_partition,
    staging_partition,
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
