"""The commit flow's object-store cost on a real CommittedManager (Parquet ranges in a local
directory, counted): committing one change into 100,000 entries writes at most 2 ranges and
1 metarange, and reads only the range the change falls into."""

import pytest

from quarry.actions.runs import Actions
from quarry.blob import CountingBlobStore, LocalBlobStore
from quarry.committed import CommittedManager, metarange_key
from quarry.committed.metaranges import read_metarange_tree
from quarry.graveler.graveler import CommitRecord, Graveler, make_commit
from quarry.graveler.model import Entry
from quarry.kv.memory import MemoryStore
from support.counting import CountingStore

M = 100_000


def entry(i: int, version: int = 0) -> Entry:
    return Entry(
        f"dir{i // 1000:04d}/file{i % 1000:04d}",
        f"s3://lake/{i}@{version}",
        100,
        f"sum-{i}-{version}",
    )


@pytest.mark.parametrize("actions", [False, True], ids=["no-actions", "actions-on"])
def test_one_change_into_100k_entries(tmp_path, actions):
    """With actions on and no action files, a commit also lists the "_" prefix of the
    metarange it is about to commit (quarry.graveler.actions): no KV operation and no
    range read more (no range holds a "_" path here; the metarange is the one just
    written), so the counts below hold in both cases."""
    stores: dict[str, CountingBlobStore] = {}

    def opener(namespace):
        return stores.setdefault(namespace, CountingBlobStore(LocalBlobStore(namespace)))

    committed = CommittedManager(opener, None)
    kv_store = CountingStore(MemoryStore())
    g = Graveler(kv_store, committed, committed)
    if actions:
        g.actions = Actions(kv_store)
    namespace = str(tmp_path / "lake")
    g.create_repository("cost", namespace)
    repo = g.refs.get_repository("cost")
    imported = committed.write_metarange(namespace, (entry(i) for i in range(M)))
    head = g.get_commit("cost", "main")
    commit = make_commit(CommitRecord([head.id], imported.metarange_id, "import", "test", {}, 2))
    g.refs.insert_commit(repo, commit)
    g.reset_branch("cost", "main", commit.id, force=True)
    total_ranges = len(committed.get_metarange(namespace, imported.metarange_id))
    assert total_ranges > 50
    pages, _ = read_metarange_tree(stores[namespace].inner, imported.metarange_id)
    print(f"{total_ranges} ranges on {len(pages)} index pages")

    blob = stores[namespace]
    lookups: list[str] = []  # action-file lookups: listings of the "_" prefix
    iterate = committed.iterate

    def counting_iterate(namespace, metarange_id, start="", prefix="", readahead=0):
        if prefix == "_":
            lookups.append(metarange_id)
        return iterate(namespace, metarange_id, start, prefix, readahead)

    committed.iterate = counting_iterate  # type: ignore[method-assign]
    for version in (1, 2, 3):
        g.put_objects("cost", "main", [entry(54_321 + version, version)])
        committed.clear_memory_cache()
        blob.reset()
        kv_store.reset()
        outcome = g.commit("cost", "main", f"change {version}")
        assert outcome.summary.changed == 1
        written = blob.keys_written
        assert len([k for k in written if "/ranges/" in k]) <= 2, written
        # The new root and at most two index pages (the ones around the change): never
        # every page of the metarange.
        metarange_files = [k for k in written if "/metaranges/" in k]
        assert metarange_key(outcome.commit.metarange_id) in metarange_files, written
        assert len(metarange_files) <= 3, written
        range_reads = [k for k in blob.keys_read if "/ranges/" in k]
        assert len(range_reads) <= 2, range_reads
        assert outcome.ranges_reused >= total_ranges - 2
        # KV side: no scan of anything but the one sealed staging token.
        assert kv_store.total(cls="staging", op="scan") == 1
        # 8 KV operations per commit, with or without actions (measured 2026-11-27).
        assert kv_store.total() <= 8, kv_store.snapshot()
        # One lookup (pre-commit: the metarange being committed); the post-commit's is
        # answered by the remembered "no action files" of that same metarange.
        assert lookups == ([outcome.commit.metarange_id] if actions else []), lookups
        lookups.clear()
    assert g.stat_object("cost", "main", entry(54_324).path).checksum == "sum-54324-3"
