"""The KV store contract (docs/architecture.md §3, quarry/kv/store.py) as an importable
suite, like lakeFS's kvtest: a new Store runs it by subclassing KVContract with a `kv_store`
fixture. tests/integration/kv/test_conformance.py runs it against every backend (memory,
sqlite, dynamodb on real dynalite) and the kv-gateway over gRPC.

Every test writes to fresh partitions, so a target can share one store per session.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable

import pytest

from quarry import errors
from quarry.kv import store
from quarry.kv.store import ABSENT, EXISTS, Equals, KeyValue


def keys_of(it) -> list[bytes]:
    return [kv.key for kv in it]


def fill(kv_store, partition: bytes, keys, value_of=lambda k: b"v:" + k) -> dict:
    items = {k: value_of(k) for k in keys}
    kv_store.batch_set([(partition, k, v) for k, v in items.items()])
    return items


def numbered_keys(n: int) -> list[bytes]:
    return [b"key-%03d" % i for i in range(n)]


# ---- partitions ------------------------------------------------------------------------


def prefix_partitions() -> tuple[bytes, bytes]:
    token = uuid.uuid4().hex
    # "-m" is a byte prefix of "-ma": a backend that concatenated partition+key, or
    # scanned by partition prefix, would leak one into the other.
    return f"staging/{token}-m".encode(), f"staging/{token}-ma".encode()


# ---- scans -----------------------------------------------------------------------------

ODD_KEYS = [
    b"\x00",
    b"\x00\x00",
    b"\x00\x01",
    b"\x01",
    b"\x7f",
    b"\x80",
    b"\x80\x00",
    b"\xfe",
    b"\xff",
    b"\xff\x00",
    b"\xff\xff",
    b"\xff\xff\xff",
    b"a",
    b"a\x00",
    b"a\x00\x00",
    b"a\x01",
    b"ab",
    b"abc",
    b"abd",
    b"b",
    b"A",
    b"Z",
    b"z",
    b"0",
    b"9",
    "é".encode(),
    "日本".encode(),
]


# ---- missing arguments -----------------------------------------------------------------

P, K, V = b"staging/missing-args-m", b"k", b"v"

MISSING_ARGUMENT_CASES = {
    "get-partition": (lambda s: s.get(b"", K), store.MissingPartitionKey),
    "get-key": (lambda s: s.get(P, b""), store.MissingKey),
    "set-partition": (lambda s: s.set(b"", K, V), store.MissingPartitionKey),
    "set-key": (lambda s: s.set(P, b"", V), store.MissingKey),
    "set-value": (lambda s: s.set(P, K, None), store.MissingValue),
    "set_if-partition": (lambda s: s.set_if(b"", K, V, ABSENT), store.MissingPartitionKey),
    "set_if-key": (lambda s: s.set_if(P, b"", V, ABSENT), store.MissingKey),
    "set_if-value": (lambda s: s.set_if(P, K, None, ABSENT), store.MissingValue),
    "set_if-predicate": (lambda s: s.set_if(P, K, V, None), store.MissingPredicate),
    "delete-partition": (lambda s: s.delete(b"", K), store.MissingPartitionKey),
    "delete-key": (lambda s: s.delete(P, b""), store.MissingKey),
    "scan-partition": (lambda s: list(s.scan(b"")), store.MissingPartitionKey),
    "batch_get-partition": (lambda s: s.batch_get([(P, K), (b"", K)]), store.MissingPartitionKey),
    "batch_get-key": (lambda s: s.batch_get([(P, K), (P, b"")]), store.MissingKey),
    "batch_set-partition": (
        lambda s: s.batch_set([(P, K, V), (b"", K, V)]),
        store.MissingPartitionKey,
    ),
    "batch_set-key": (lambda s: s.batch_set([(P, K, V), (P, b"", V)]), store.MissingKey),
    "batch_set-value": (lambda s: s.batch_set([(P, K, V), (P, b"k2", None)]), store.MissingValue),
    "batch_delete-partition": (
        lambda s: s.batch_delete([(P, K), (b"", K)]),
        store.MissingPartitionKey,
    ),
    "batch_delete-key": (lambda s: s.batch_delete([(P, K), (P, b"")]), store.MissingKey),
    "set_then_get-key": (lambda s: s.set_then_get([(P, b"", V)], [(P, K)]), store.MissingKey),
    "set_then_get-value": (
        lambda s: s.set_then_get([(P, K, V), (P, b"k2", None)], [(P, K)]),
        store.MissingValue,
    ),
    "set_then_get-read-key": (
        lambda s: s.set_then_get([(P, K, V)], [(P, b"")]),
        store.MissingKey,
    ),
}


def _new_partition(suffix: str = "m") -> bytes:
    """A fresh partition of a class the gateway accepts (staging/<token>)."""
    return f"staging/{uuid.uuid4().hex}-{suffix}".encode()


class KVContract:
    """The KV store contract. Subclass it as `Test...` in a test module and give it a
    `kv_store` fixture (the Store under test; it may be shared by every test, even across
    sessions: each test writes to fresh partitions)."""

    @pytest.fixture
    def new_partition(self) -> Callable[..., bytes]:
        """Factory of fresh partitions, for tests that need several."""
        return _new_partition

    @pytest.fixture
    def partition(self) -> bytes:
        return _new_partition()

    # ---- basic operations ------------------------------------------------------------------

    def test_get_set_overwrite_delete_round_trip(self, kv_store, partition):
        with pytest.raises(store.KeyNotFound):
            kv_store.get(partition, b"k")
        kv_store.set(partition, b"k", b"one")
        got = kv_store.get(partition, b"k")
        assert got.value == b"one"
        kv_store.set(partition, b"k", b"two")
        assert kv_store.get(partition, b"k").value == b"two"
        kv_store.delete(partition, b"k")
        with pytest.raises(store.KeyNotFound):
            kv_store.get(partition, b"k")
        assert keys_of(kv_store.scan(partition)) == []

    def test_values_are_binary_safe(self, kv_store, partition):
        value = bytes(range(256)) * 4
        kv_store.set(partition, b"bin", value)
        assert kv_store.get(partition, b"bin").value == value

    def test_empty_value_is_distinct_from_missing_key(self, kv_store, partition):
        kv_store.set(partition, b"empty", b"")
        got = kv_store.get(partition, b"empty")
        assert got.value == b""
        assert [(kv.key, kv.value) for kv in kv_store.scan(partition)] == [(b"empty", b"")]
        assert kv_store.batch_get([(partition, b"empty"), (partition, b"missing")])[0].value == b""

        with pytest.raises(store.PredicateFailed):
            kv_store.set_if(partition, b"empty", b"x", ABSENT)
        kv_store.set_if(partition, b"empty", b"", EXISTS)
        kv_store.set_if(partition, b"empty", b"", Equals(b""))
        kv_store.set_if(partition, b"empty", b"", Equals(got.predicate))
        assert kv_store.get(partition, b"empty").value == b""

        # ...and a missing key does not match Equals(b"") or EXISTS.
        with pytest.raises(store.PredicateFailed):
            kv_store.set_if(partition, b"missing", b"x", Equals(b""))
        with pytest.raises(store.PredicateFailed):
            kv_store.set_if(partition, b"missing", b"x", EXISTS)
        with pytest.raises(store.KeyNotFound):
            kv_store.get(partition, b"missing")

        # A value can go from non-empty to empty and back.
        kv_store.set_if(partition, b"empty", b"full", Equals(b""))
        kv_store.set_if(partition, b"empty", b"", Equals(b"full"))
        assert kv_store.get(partition, b"empty").value == b""

    def test_keys_compared_by_content(self, kv_store, partition):
        kv_store.set(partition, b"abc", b"1")
        same = [
            bytes([97, 98, 99]),
            b"a" + b"bc",
            b"abc",
            bytes(bytearray(b"abc")),
            b"".join([b"a", b"b", b"c"]),
        ]
        for k in same:
            assert kv_store.get(partition, k).value == b"1"
        kv_store.set_if(bytes(partition), b"ab" + b"c", b"2", EXISTS)
        assert kv_store.get(b"".join([partition]), b"abc").value == b"2"
        assert keys_of(kv_store.scan(partition)) == [b"abc"]
        kv_store.delete(partition, bytes([97, 98, 99]))
        with pytest.raises(store.KeyNotFound):
            kv_store.get(partition, b"abc")

    def test_delete_is_idempotent(self, kv_store, partition, new_partition):
        kv_store.delete(partition, b"never-set")
        kv_store.delete(new_partition(), b"partition-never-used")
        kv_store.set(partition, b"k", b"v")
        kv_store.delete(partition, b"k")
        kv_store.delete(partition, b"k")
        kv_store.batch_delete([(partition, b"k"), (partition, b"k"), (partition, b"other")])
        with pytest.raises(store.KeyNotFound):
            kv_store.get(partition, b"k")

    def test_partitions_isolated_for_get_set_delete(self, kv_store):
        m, ma = prefix_partitions()
        kv_store.set(m, b"k", b"in m")
        kv_store.set(ma, b"k", b"in ma")
        kv_store.set(m, b"ak", b"only in m")
        assert kv_store.get(m, b"k").value == b"in m"
        assert kv_store.get(ma, b"k").value == b"in ma"
        with pytest.raises(store.KeyNotFound):  # m + "ak" and ma + "k" concatenate alike
            kv_store.get(ma, b"ak")
        kv_store.delete(m, b"k")
        assert kv_store.get(ma, b"k").value == b"in ma"
        with pytest.raises(store.PredicateFailed):
            kv_store.set_if(m, b"k", b"x", EXISTS)
        kv_store.set_if(ma, b"k", b"y", Equals(b"in ma"))
        assert kv_store.batch_get([(m, b"k"), (ma, b"k"), (m, b"ak"), (ma, b"ak")]) == [
            None,
            store.GetResult(b"y", b"y"),
            store.GetResult(b"only in m", b"only in m"),
            None,
        ]

    def test_partitions_isolated_for_scan(self, kv_store):
        m, ma = prefix_partitions()
        fill(kv_store, m, [b"a", b"c", b"e"])
        fill(kv_store, ma, [b"\x00", b"b", b"d", b"\xff"])
        assert keys_of(kv_store.scan(m)) == [b"a", b"c", b"e"]
        assert keys_of(kv_store.scan(ma)) == [b"\x00", b"b", b"d", b"\xff"]
        assert keys_of(kv_store.scan(m, start=b"b", batch_size=1)) == [b"c", b"e"]
        assert keys_of(kv_store.scan(ma, start=b"c", end=b"\xff")) == [b"d"]

    def test_scan_returns_one_partition_in_unsigned_byte_order(self, kv_store, partition):
        shuffled = ODD_KEYS[:]
        random.Random(7).shuffle(shuffled)
        for k in shuffled:  # one at a time: insertion order must not matter
            kv_store.set(partition, k, b"v:" + k)
        expected = sorted(ODD_KEYS)  # Python orders bytes as unsigned bytes
        assert expected[0] == b"\x00" and expected[-1] == b"\xff\xff\xff"
        got = list(kv_store.scan(partition))
        assert [kv.key for kv in got] == expected
        assert all(kv.value == b"v:" + kv.key for kv in got)
        assert all(isinstance(kv, KeyValue) for kv in got)

    def test_scan_from_start_key(self, kv_store, partition):
        fill(kv_store, partition, ODD_KEYS)
        expected = sorted(ODD_KEYS)
        for start in [
            b"",
            b"\x00",
            b"\x00\x00\x00",
            b"a",
            b"a\x00\x00\x00",
            b"ab\xff",
            b"\x80",
            b"\xff\xff",
            b"\xff\xff\xff",
        ]:
            assert keys_of(kv_store.scan(partition, start=start)) == [
                k for k in expected if k >= start
            ], start

    def test_scan_with_exclusive_end_key(self, kv_store, partition):
        fill(kv_store, partition, ODD_KEYS)
        expected = sorted(ODD_KEYS)
        cases = [
            (b"", b"\x00\x00"),
            (b"", b"a"),
            (b"a", b"b"),
            (b"a", b"a\x00"),
            (b"\x00", b"\xff"),
            (b"\x7f", b"\x80\x00"),
            (b"ab", b"abd"),
            (b"b", b"\xff\xff\xff"),
            (b"a", b"a"),
            (b"b", b"a"),
            (b"\x00", b"\x00\x00\x01"),
        ]
        for start, end in cases:
            for batch_size in (1, 2, 1000):
                got = keys_of(kv_store.scan(partition, start=start, end=end, batch_size=batch_size))
                assert got == [k for k in expected if start <= k < end], (start, end, batch_size)
        # No end (None), and an empty end, mean "to the end of the partition".
        assert keys_of(kv_store.scan(partition, start=b"z", end=None)) == [
            k for k in expected if k >= b"z"
        ]
        assert keys_of(kv_store.scan(partition, start=b"z", end=b"")) == [
            k for k in expected if k >= b"z"
        ]

    @pytest.mark.parametrize("batch_size", [1, 10])
    def test_scan_tiny_pages(self, kv_store, partition, batch_size):
        keys = numbered_keys(95)
        items = fill(kv_store, partition, keys)
        got = list(kv_store.scan(partition, batch_size=batch_size))
        assert [kv.key for kv in got] == keys
        assert all(kv.value == items[kv.key] for kv in got)
        # Bounds that fall on and between page boundaries.
        assert (
            keys_of(
                kv_store.scan(partition, start=b"key-010", end=b"key-020", batch_size=batch_size)
            )
            == keys[10:20]
        )
        assert (
            keys_of(
                kv_store.scan(partition, start=b"key-0095", end=b"key-091", batch_size=batch_size)
            )
            == keys[10:91]
        )
        assert (
            keys_of(kv_store.scan(partition, start=b"key-085", batch_size=batch_size)) == keys[85:]
        )

    def test_scan_empty_partition_and_start_past_end(self, kv_store, partition, new_partition):
        assert keys_of(kv_store.scan(new_partition())) == []
        assert keys_of(kv_store.scan(new_partition(), start=b"a", end=b"z", batch_size=1)) == []
        fill(kv_store, partition, [b"a", b"b"])
        assert keys_of(kv_store.scan(partition, start=b"b\x00")) == []
        assert keys_of(kv_store.scan(partition, start=b"\xff" * 10, batch_size=1)) == []
        it = kv_store.scan(partition, start=b"c")
        with pytest.raises(StopIteration):
            next(it)
        with pytest.raises(StopIteration):  # stays exhausted
            next(it)

    def test_scan_is_lazy_and_sees_writes_in_later_pages(self, kv_store, partition):
        fill(kv_store, partition, [b"a", b"b", b"c", b"d"])
        it = kv_store.scan(partition, batch_size=2)
        assert next(it).key == b"a"
        # Written after the scan began, past anything fetched so far.
        kv_store.set(partition, b"e", b"late")
        assert keys_of(it) == [b"b", b"c", b"d", b"e"]

    def test_scan_with_keys_deleted_while_paging(self, kv_store, partition):
        keys = numbered_keys(95)
        fill(kv_store, partition, keys)
        deleted: set[bytes] = set()
        rng = random.Random(11)
        seen: list[bytes] = []
        for kv in kv_store.scan(partition, batch_size=4):
            seen.append(kv.key)
            i = keys.index(kv.key)
            # Delete the key just returned (it is the cursor the next page resumes after),
            # the next key (possibly already buffered), and a few random ones ahead and behind.
            victims = {kv.key, *keys[i + 1 : i + 2], *rng.sample(keys, 3)}
            kv_store.batch_delete([(partition, k) for k in victims])
            deleted |= victims
        assert seen == sorted(set(seen)), "scan returned a key twice or out of order"
        survivors = [k for k in keys if k not in deleted]
        assert set(survivors) <= set(seen), "scan missed keys that were never deleted"
        assert set(seen) <= set(keys)
        assert keys_of(kv_store.scan(partition)) == survivors

    def test_scan_with_concurrent_deleting_thread(self, kv_store, partition):
        keys = numbered_keys(95)
        fill(kv_store, partition, keys)
        victims = keys[1::2]
        survivors = keys[0::2]
        stop = threading.Event()

        def deleter():
            for k in random.Random(3).sample(victims, len(victims)):
                if stop.is_set():
                    return
                kv_store.delete(partition, k)

        t = threading.Thread(target=deleter)
        it = kv_store.scan(partition, batch_size=3)
        seen = [next(it).key]
        t.start()
        try:
            seen += keys_of(it)
        finally:
            stop.set()
            t.join()
        assert seen == sorted(set(seen))
        assert set(survivors) <= set(seen) <= set(keys)

    def test_seek_ge_forward_and_backward(self, kv_store, partition):
        keys = numbered_keys(30)
        fill(kv_store, partition, keys)
        it = kv_store.scan(partition, batch_size=4)
        assert [next(it).key for _ in range(3)] == keys[:3]
        it.seek_ge(b"key-020")  # forward, beyond the buffered page
        assert next(it).key == b"key-020"
        assert next(it).key == b"key-021"
        it.seek_ge(b"key-005")  # backward
        assert [next(it).key for _ in range(6)] == keys[5:11]
        it.seek_ge(b"key-0105")  # between keys
        assert next(it).key == b"key-011"
        it.seek_ge(b"key-011")  # onto the key just returned
        assert next(it).key == b"key-011"
        it.seek_ge(b"key-\xff")  # past the end
        with pytest.raises(StopIteration):
            next(it)
        it.seek_ge(b"")  # an exhausted iterator can be repositioned
        assert keys_of(it) == keys
        it.seek_ge(b"key-027")
        assert keys_of(it) == keys[27:]

    def test_seek_ge_stays_inside_scan_bounds(self, kv_store, partition):
        keys = numbered_keys(30)
        fill(kv_store, partition, keys)
        it = kv_store.scan(partition, start=b"key-010", end=b"key-020", batch_size=3)
        assert next(it).key == b"key-010"
        it.seek_ge(b"key-000")  # before start: clamped to start
        assert next(it).key == b"key-010"
        it.seek_ge(b"key-018")
        assert keys_of(it) == keys[18:20]
        it.seek_ge(b"key-025")  # at/after end: nothing
        assert keys_of(it) == []

    # ---- set_if predicates -----------------------------------------------------------------

    def test_set_if_absent(self, kv_store, partition):
        kv_store.set_if(partition, b"k", b"first", ABSENT)
        assert kv_store.get(partition, b"k").value == b"first"
        with pytest.raises(store.PredicateFailed):
            kv_store.set_if(partition, b"k", b"second", ABSENT)
        assert kv_store.get(partition, b"k").value == b"first"
        kv_store.delete(partition, b"k")
        kv_store.set_if(partition, b"k", b"again", ABSENT)  # absent again after delete
        assert kv_store.get(partition, b"k").value == b"again"

    def test_set_if_exists(self, kv_store, partition):
        with pytest.raises(store.PredicateFailed):
            kv_store.set_if(partition, b"k", b"x", EXISTS)
        with pytest.raises(store.KeyNotFound):  # the failed write left nothing behind
            kv_store.get(partition, b"k")
        kv_store.set(partition, b"k", b"v1")
        kv_store.set_if(partition, b"k", b"v2", EXISTS)
        assert kv_store.get(partition, b"k").value == b"v2"

    def test_set_if_equals(self, kv_store, partition):
        with pytest.raises(store.PredicateFailed):
            kv_store.set_if(partition, b"k", b"x", Equals(b"anything"))
        kv_store.set(partition, b"k", b"v1")
        first = kv_store.get(partition, b"k")
        kv_store.set_if(partition, b"k", b"v2", Equals(first.predicate))
        assert kv_store.get(partition, b"k").value == b"v2"
        # `first` is now stale.
        with pytest.raises(store.PredicateFailed):
            kv_store.set_if(partition, b"k", b"v3", Equals(first.predicate))
        with pytest.raises(store.PredicateFailed):  # a prefix of the value is not equal
            kv_store.set_if(partition, b"k", b"v3", Equals(b"v"))
        with pytest.raises(store.PredicateFailed):
            kv_store.set_if(partition, b"k", b"v3", Equals(b"v2\x00"))
        assert kv_store.get(partition, b"k").value == b"v2"
        kv_store.delete(partition, b"k")
        with pytest.raises(store.PredicateFailed):  # a deleted key equals nothing
            kv_store.set_if(partition, b"k", b"v3", Equals(b"v2"))

    def test_set_if_equals_stale_after_someone_else_wrote_the_same_length(
        self, kv_store, partition
    ):
        kv_store.set(partition, b"k", b"aaaa")
        mine = kv_store.get(partition, b"k")
        kv_store.set(partition, b"k", b"bbbb")  # another writer
        with pytest.raises(store.PredicateFailed):
            kv_store.set_if(partition, b"k", b"cccc", Equals(mine.predicate))
        assert kv_store.get(partition, b"k").value == b"bbbb"

    def test_delete_if_equals(self, kv_store, partition):
        # Compare-and-delete: never deletes a value other than the one the caller read.
        with pytest.raises(store.PredicateFailed):  # a missing key equals nothing
            kv_store.delete_if(partition, b"k", Equals(b"anything"))
        kv_store.set(partition, b"k", b"v1")
        first = kv_store.get(partition, b"k")
        kv_store.set(partition, b"k", b"v2")  # another writer
        with pytest.raises(store.PredicateFailed):  # `first` is stale: kept
            kv_store.delete_if(partition, b"k", Equals(first.predicate))
        with pytest.raises(store.PredicateFailed):  # a prefix of the value is not equal
            kv_store.delete_if(partition, b"k", Equals(b"v"))
        assert kv_store.get(partition, b"k").value == b"v2"
        kv_store.delete_if(partition, b"k", Equals(kv_store.get(partition, b"k").predicate))
        with pytest.raises(store.KeyNotFound):
            kv_store.get(partition, b"k")
        with pytest.raises(store.PredicateFailed):  # deleted: a second delete_if fails
            kv_store.delete_if(partition, b"k", Equals(b"v2"))
        # An empty value is a real value, also here.
        kv_store.set(partition, b"empty", b"")
        with pytest.raises(store.PredicateFailed):
            kv_store.delete_if(partition, b"empty", Equals(b"x"))
        kv_store.delete_if(partition, b"empty", Equals(b""))
        with pytest.raises(store.KeyNotFound):
            kv_store.get(partition, b"empty")

    def test_delete_if_needs_an_equals_predicate(self, kv_store, partition):
        kv_store.set(partition, b"k", b"v")
        with pytest.raises(store.MissingPredicate):
            kv_store.delete_if(partition, b"k", None)
        for predicate in (ABSENT, EXISTS, b"v"):
            with pytest.raises(errors.InvalidArgument):
                kv_store.delete_if(partition, b"k", predicate)
        assert kv_store.get(partition, b"k").value == b"v"

    def test_delete_if_race_has_exactly_one_winner(self, kv_store, partition):
        kv_store.set(partition, b"k", b"v")
        read = kv_store.get(partition, b"k").predicate
        outcomes: list[str] = []
        barrier = threading.Barrier(8)

        def delete() -> None:
            barrier.wait()
            try:
                kv_store.delete_if(partition, b"k", Equals(read))
                outcomes.append("deleted")
            except store.PredicateFailed:
                outcomes.append("failed")

        threads = [threading.Thread(target=delete) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) == ["deleted"] + ["failed"] * 7

    def test_set_if_without_predicate(self, kv_store, partition):
        with pytest.raises(store.MissingPredicate):
            kv_store.set_if(partition, b"k", b"v", None)
        with pytest.raises(store.KeyNotFound):
            kv_store.get(partition, b"k")

    @pytest.mark.parametrize("case", list(MISSING_ARGUMENT_CASES))
    def test_missing_argument(self, kv_store, case):
        call, error = MISSING_ARGUMENT_CASES[case]
        with pytest.raises(error):
            call(kv_store)

    # ---- concurrency -----------------------------------------------------------------------

    def test_set_if_absent_race_has_exactly_one_winner(self, kv_store, partition):
        n = 16
        barrier = threading.Barrier(n)
        outcomes: list[object] = [None] * n

        def racer(i: int) -> None:
            barrier.wait()
            try:
                kv_store.set_if(partition, b"lock", b"owner-%d" % i, ABSENT)
                outcomes[i] = "won"
            except store.PredicateFailed:
                outcomes[i] = "lost"
            except Exception as e:  # anything else is a failure, reported below
                outcomes[i] = e

        threads = [threading.Thread(target=racer, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(map(str, outcomes)) == ["lost"] * (n - 1) + ["won"]
        winner = outcomes.index("won")
        assert kv_store.get(partition, b"lock").value == b"owner-%d" % winner

    def test_cas_counter_under_contention(self, kv_store, partition):
        threads_n, increments = 8, 25
        kv_store.set(partition, b"counter", b"0")
        barrier = threading.Barrier(threads_n)
        failures: list[BaseException] = []
        conflicts = [0] * threads_n

        def incrementer(i: int) -> None:
            try:
                barrier.wait()
                for _ in range(increments):
                    while True:
                        current = kv_store.get(partition, b"counter")
                        new = str(int(current.value) + 1).encode()
                        try:
                            kv_store.set_if(partition, b"counter", new, Equals(current.predicate))
                            break
                        except store.PredicateFailed:
                            conflicts[i] += 1
            except BaseException as e:
                failures.append(e)

        threads = [threading.Thread(target=incrementer, args=(i,)) for i in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures
        assert kv_store.get(partition, b"counter").value == str(threads_n * increments).encode()

    # ---- limits ----------------------------------------------------------------------------

    def test_value_at_item_size_limit(self, kv_store, partition):
        key = b"big"
        size = store.MAX_ITEM_BYTES - store.item_size(partition, key, b"")
        value = bytes(random.Random(5).getrandbits(8) for _ in range(64)) * (
            size // 64
        ) + b"\x00" * (size % 64)
        assert store.item_size(partition, key, value) == store.MAX_ITEM_BYTES
        kv_store.set(partition, key, value)
        assert kv_store.get(partition, key).value == value
        kv_store.set_if(partition, key, value, Equals(value))
        assert [kv.value for kv in kv_store.scan(partition)] == [value]
        assert kv_store.batch_get([(partition, key)])[0].value == value

        over = value + b"!"
        with pytest.raises(store.ItemTooLarge):
            kv_store.set(partition, key, over)
        with pytest.raises(store.ItemTooLarge):
            kv_store.set_if(partition, key, over, EXISTS)
        with pytest.raises(store.ItemTooLarge):
            kv_store.batch_set([(partition, b"small", b"x"), (partition, key, over)])
        assert kv_store.get(partition, key).value == value

    def test_key_size_limit(self, kv_store, partition):
        longest = b"k" * (store.MAX_KEY_BYTES - 1) + b"\xff"
        kv_store.set(partition, longest, b"v")
        assert kv_store.get(partition, longest).value == b"v"
        assert keys_of(kv_store.scan(partition, start=longest)) == [longest]
        kv_store.delete(partition, longest)

        too_long = longest + b"\x00"
        for call in (
            lambda: kv_store.get(partition, too_long),
            lambda: kv_store.set(partition, too_long, b"v"),
            lambda: kv_store.set_if(partition, too_long, b"v", ABSENT),
            lambda: kv_store.delete(partition, too_long),
            lambda: kv_store.batch_get([(partition, too_long)]),
            lambda: kv_store.batch_set([(partition, too_long, b"v")]),
            lambda: kv_store.batch_delete([(partition, too_long)]),
        ):
            with pytest.raises(store.KeyTooLarge):
                call()

    def test_partition_key_size_limit(self, kv_store):
        token = uuid.uuid4().hex.encode()
        prefix = b"staging/" + token + b"-"
        longest = prefix + b"m" * (store.MAX_PARTITION_KEY_BYTES - len(prefix))
        assert len(longest) == store.MAX_PARTITION_KEY_BYTES
        kv_store.set(longest, b"k", b"v")
        assert kv_store.get(longest, b"k").value == b"v"
        assert keys_of(kv_store.scan(longest)) == [b"k"]
        with pytest.raises(store.KeyTooLarge):
            kv_store.set(longest + b"m", b"k", b"v")
        with pytest.raises(store.KeyTooLarge):
            kv_store.get(longest + b"m", b"k")

    # ---- batches ---------------------------------------------------------------------------

    def test_batches_across_chunk_boundaries(self, kv_store, new_partition):
        # 230 items: more than DynamoDB's 25 per BatchWriteItem and 100 per BatchGetItem, over
        # two partitions, with an empty value in the mix.
        a, b = new_partition(), new_partition()
        items = [(a if i % 3 else b, b"item-%04d" % i, b"value-%d" % i) for i in range(230)]
        items[17] = (items[17][0], items[17][1], b"")
        kv_store.batch_set(items)

        wanted = []
        for i, (p, k, _v) in enumerate(items):
            wanted.append((p, k))
            if i % 7 == 0:
                wanted.append((p, b"missing-%04d" % i))
        wanted.append((new_partition(), b"item-0001"))  # a partition that was never written
        wanted.append(wanted[0])  # the same key twice
        results = kv_store.batch_get(wanted)
        by_key = {(p, k): v for p, k, v in items}
        assert len(results) == len(wanted)
        for (p, k), result in zip(wanted, results, strict=True):
            if (p, k) in by_key:
                assert result is not None and result.value == by_key[(p, k)], k
                assert result.predicate is not None
            else:
                assert result is None, k

        assert keys_of(kv_store.scan(a)) == sorted(k for p, k, _ in items if p == a)

        # Delete 150 of them, plus keys that do not exist.
        doomed = [(p, k) for p, k, _ in items[:150]] + [(a, b"missing-1"), (b, b"missing-2")]
        kv_store.batch_delete(doomed)
        results = kv_store.batch_get([(p, k) for p, k, _ in items])
        assert [r is None for r in results] == [i < 150 for i in range(230)]
        assert [r.value for r in results[150:]] == [v for _, _, v in items[150:]]

    def test_batch_set_overwrites_and_last_duplicate_wins(self, kv_store, partition):
        kv_store.set(partition, b"k", b"old")
        kv_store.batch_set(
            [(partition, b"k", b"first"), (partition, b"j", b"x"), (partition, b"k", b"last")]
        )
        assert kv_store.get(partition, b"k").value == b"last"
        assert kv_store.get(partition, b"j").value == b"x"

    def test_set_then_get_reads_what_it_wrote(self, kv_store, new_partition):
        """The writes (one item, several across partitions, none), then the reads, which see
        them: in request order, a missing key None, each with its predicate."""
        a, b = new_partition(), new_partition()
        kv_store.set(a, b"other", b"before")
        one = kv_store.set_then_get([(a, b"k", b"v1")], [(a, b"k"), (a, b"other"), (b, b"no")])
        assert [r.value if r else None for r in one] == [b"v1", b"before", None]
        assert one[0].predicate == kv_store.get(a, b"k").predicate
        many = kv_store.set_then_get(
            [(a, b"k", b"v2"), (b, b"j", b""), (a, b"k", b"v3")], [(b, b"j"), (a, b"k")]
        )
        assert [r.value if r else None for r in many] == [b"", b"v3"]  # the last write wins
        assert kv_store.set_then_get([], [(a, b"k")])[0].value == b"v3"
        assert kv_store.set_then_get([(b, b"x", b"y")], []) == []
        assert kv_store.get(b, b"x").value == b"y"

    def test_empty_batches(self, kv_store):
        assert kv_store.batch_get([]) == []
        kv_store.batch_set([])
        kv_store.batch_delete([])

    def test_large_values_span_response_size_caps(self, kv_store, partition):
        # 8 x 300 KB = 2.4 MB: more than one DynamoDB Query page (1 MB) and more than dynalite
        # returns from one BatchGetItem, so paging and unprocessed-key retries must kick in.
        values = {b"big-%d" % i: bytes([i]) * (300 * 1024) for i in range(8)}
        kv_store.batch_set([(partition, k, v) for k, v in values.items()])
        got = list(kv_store.scan(partition))
        assert [kv.key for kv in got] == sorted(values)
        assert all(kv.value == values[kv.key] for kv in got)
        results = kv_store.batch_get([(partition, k) for k in values])
        assert [r.value for r in results] == list(values.values())
