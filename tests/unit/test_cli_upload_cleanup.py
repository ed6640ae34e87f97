"""quarry.cli.upload.remove_refused: what a refused `quarry put --from` may delete.

Safety rule: only its own uploads (`data/<uuid hex>` keys in the namespace), only after a
refusal (nothing staged), and never an address the branch names (a stream refused after
some of its batches were staged)."""

from __future__ import annotations

from quarry.blob import LocalBlobStore, object_address
from quarry.cli.upload import remove_refused
from quarry.v1 import types_pb2


def _setup(tmp_path):
    namespace = str(tmp_path / "lake")
    store = LocalBlobStore(namespace)
    keys = ["data/" + "a" * 32, "data/" + "b" * 32, "tables/people.csv"]
    for key in keys:
        store.put(key, b"x")
    entries = [types_pb2.Entry(path=k, physical_address=object_address(namespace, k)) for k in keys]
    return store, namespace, keys, entries


def test_only_refused_uploads_nobody_names_are_removed(tmp_path):
    store, namespace, keys, entries = _setup(tmp_path)
    staged = {entries[1].physical_address}
    assert remove_refused(store, namespace, entries, "PERMISSION_DENIED", staged) == 1
    assert not store.exists(keys[0])  # the refused upload
    assert store.exists(keys[1])  # named by the branch: staged before the refusal
    assert store.exists(keys[2])  # not an upload's key: never ours to delete


def test_an_unknown_outcome_removes_nothing(tmp_path):
    store, namespace, keys, entries = _setup(tmp_path)
    for outcome in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "ABORTED", "UNKNOWN"):
        assert remove_refused(store, namespace, entries, outcome) == 0
    assert all(store.exists(k) for k in keys)
