"""Sharded staging tokens in the domain core (docs/architecture.md §2 "Sharded staging"): the
repository setting, its change from each branch's next token, listings merged over shards,
and every flow that retires tokens dropping all their shards."""

from __future__ import annotations

import pytest

from quarry.graveler.layout import staging_partitions
from quarry.graveler.model import Entry
from quarry.kv import store as kv
from quarry.kv.partitions import MAX_STAGING_SHARDS, staging_token_shards


def entry(path: str, version: int = 1) -> Entry:
    return Entry(path, f"s3://lake/{path}@{version}", 10, f"c{version}")


def shards_of(graveler, repo: str, branch: str = "main") -> int:
    return staging_token_shards(graveler.get_branch(repo, branch).staging_token)


def test_the_setting_is_stored_and_reported(graveler, tmp_path):
    created = graveler.create_repository("sharded", str(tmp_path / "s"), staging_shards=8)
    assert created.staging_shards == 8
    assert graveler.get_repository("sharded").to_proto().staging_shards == 8
    assert shards_of(graveler, "sharded") == 8
    plain = graveler.create_repository("plain", str(tmp_path / "p"))
    assert plain.to_proto().staging_shards == 1
    token = graveler.get_branch("plain", "main").staging_token
    assert "." not in token and len(token) == 32  # today's token, byte for byte


@pytest.mark.parametrize("bad", [-1, MAX_STAGING_SHARDS + 1])
def test_out_of_range_is_refused_and_changes_nothing(graveler, tmp_path, bad):
    with pytest.raises(kv.InvalidStagingShards) as caught:
        graveler.create_repository("bad", str(tmp_path / "b"), staging_shards=bad)
    assert caught.value.reason == "INVALID_STAGING_SHARDS"
    graveler.create_repository("good", str(tmp_path / "g"), staging_shards=2)
    with pytest.raises(kv.InvalidStagingShards):
        graveler.update_repository("good", staging_shards=bad)
    assert graveler.get_repository("good").staging_shards == 2


def test_a_change_applies_from_each_branchs_next_token(graveler, repo, staging_shards):
    graveler.put_objects(repo, "main", [entry(f"before/{i}") for i in range(40)])
    before = graveler.get_branch(repo, "main").staging_token
    graveler.update_repository(repo, staging_shards=3)
    # The token in use keeps its shard count: nothing staged moves, everything is readable.
    assert graveler.get_branch(repo, "main").staging_token == before
    assert graveler.stat_object(repo, "main", "before/7").checksum == "c1"
    graveler.create_branch(repo, "fresh", "main")
    assert shards_of(graveler, repo, "fresh") == 3
    # Writes during a seal land in the new token; the commit applies the old one.
    graveler.commit(repo, "main", "one")
    assert shards_of(graveler, repo) == 3
    graveler.put_objects(repo, "main", [entry(f"after/{i}") for i in range(40)])
    listed, _, _ = graveler.list_objects(repo, "main", page_size=1000)
    assert [e.path for e in listed] == sorted(
        [f"before/{i}" for i in range(40)] + [f"after/{i}" for i in range(40)]
    )
    graveler.update_repository(repo, staging_shards=staging_shards)
    graveler.commit(repo, "main", "two")
    assert shards_of(graveler, repo) == staging_shards
    assert graveler.stat_object(repo, "main@", "after/39").checksum == "c1"


def test_a_commit_applies_sealed_tokens_of_different_shard_counts(graveler, repo):
    """A branch whose sealed tokens have different shard counts (the setting changed between
    two seals, and the first commit lost its final swap) commits them all, newest wins."""
    graveler.put_objects(repo, "main", [entry(f"p/{i}", 1) for i in range(30)])
    graveler.update_repository(repo, staging_shards=5)
    graveler.commits.seal(graveler.live_repo(repo), "main")  # a commit that stopped here
    graveler.put_objects(repo, "main", [entry(f"p/{i}", 2) for i in range(0, 30, 2)])
    branch = graveler.get_branch(repo, "main")
    assert len(branch.sealed_tokens) == 1
    assert staging_token_shards(branch.staging_token) == 5
    outcome = graveler.commit(repo, "main", "both")
    assert outcome.summary.added == 30
    for i in range(30):
        expected = "c2" if i % 2 == 0 else "c1"
        assert graveler.stat_object(repo, "main@", f"p/{i}").checksum == expected


@pytest.mark.parametrize("delimiter", ["", "/"])
def test_listing_pages_are_ordered_and_bounded(graveler, repo, delimiter):
    paths = sorted(f"d{i % 7}/f{i:04d}" if delimiter else f"f{i:04d}" for i in range(300))
    graveler.put_objects(repo, "main", [entry(p) for p in paths])
    graveler.delete_objects(repo, "main", paths[::10])  # tombstones in every shard
    seen: list[str] = []
    token = ""
    while True:
        entries, prefixes, token = graveler.list_objects(
            repo, "main", delimiter=delimiter, page_size=13, page_token=token
        )
        assert len(entries) + len(prefixes) <= 13
        seen += [e.path for e in entries] + list(prefixes)
        if not token:
            break
    if delimiter:
        assert seen == [f"d{i}/" for i in range(7)]
    else:
        assert seen == [p for p in paths if p not in set(paths[::10])]


def test_every_flow_that_retires_tokens_drops_all_their_shards(graveler, repo, kv_store):
    """Safety rule: dropping a token deletes its items in every shard, and never an item of
    a token still in use."""
    backend = kv_store.inner
    retired: list[str] = []

    def stage(branch: str) -> None:
        graveler.put_objects(repo, branch, [entry(f"{branch}/{i}") for i in range(40)])
        retired.append(graveler.get_branch(repo, branch).staging_token)

    stage("main")
    graveler.commit(repo, "main", "commit")
    for flow in ("reset", "discard", "delete"):
        graveler.create_branch(repo, flow, "main")
        stage(flow)
        if flow == "reset":
            graveler.reset_branch(repo, flow, "main", force=True)
        elif flow == "discard":
            graveler.discard_changes(repo, flow)
        else:
            graveler.delete_branch(repo, flow)
    graveler.put_objects(repo, "main", [entry("live/1")])
    live = graveler.get_branch(repo, "main").staging_token
    while graveler.staging.drop_queued(0):
        pass
    for token in retired:
        for partition in staging_partitions(token):
            assert list(backend.scan(partition)) == [], partition
    held = [p for p in staging_partitions(live) if list(backend.scan(p))]
    assert len(held) == 1
    assert graveler.stat_object(repo, "main", "live/1").checksum == "c1"


def test_a_shard_scan_starts_with_a_small_page_then_goes_on_with_full_pages(kv_store):
    """A shard's first KV page is its share of a listing page; past it the scan reopens with
    full pages: every item once, in order, and seeks forward and backward still land."""
    from quarry.graveler.layout import encode_staged
    from quarry.graveler.staging import SCAN_BATCH, StagedIterator

    partition = b"staging/scan.s2.0"
    keys = [f"k{i:05d}" for i in range(2 * SCAN_BATCH + 50)]
    kv_store.inner.batch_set([(partition, k.encode(), encode_staged(entry(k))) for k in keys])
    kv_store.reset()
    iterator = StagedIterator(kv_store, partition, "", None, first_batch=7)
    assert [path for path, _ in iterator] == keys
    assert kv_store.total(op="scan") == 2  # the small first page, then full pages
    iterator = StagedIterator(kv_store, partition, "k00003", None, first_batch=7)
    got = [next(iterator)[0] for _ in range(20)]
    assert got == keys[3:23]
    iterator.seek_ge("k01500")  # forward, on full pages
    assert next(iterator)[0] == "k01500"
    iterator.seek_ge("k00010")  # backward, behind the reopened scan
    assert next(iterator)[0] == "k00010"
    iterator.seek_ge("a")  # never before the scan's start
    assert next(iterator)[0] == "k00003"
    iterator.close()


def test_export_and_import_carry_every_shard(graveler, repo, committed):
    """The export/import rebuild path walks every shard of every token a branch holds."""
    import io

    from quarry.exporting import export_store, import_store
    from quarry.graveler.graveler import Graveler
    from quarry.kv.memory import MemoryStore
    from quarry.runtime.format_version import ensure_format_version

    ensure_format_version(graveler.kv)
    graveler.put_objects(repo, "main", [entry(f"sealed/{i}") for i in range(20)])
    graveler.commits.seal(graveler.live_repo(repo), "main")  # a commit that stopped here
    graveler.put_objects(repo, "main", [entry(f"staged/{i}") for i in range(20)])
    dump = io.StringIO()
    export_store(graveler.kv, dump)
    target = MemoryStore()
    import_store(target, io.StringIO(dump.getvalue()))
    again = Graveler(target, committed, committed)
    listed, _, _ = again.list_objects(repo, "main", page_size=100)
    assert [e.path for e in listed] == sorted(
        [f"sealed/{i}" for i in range(20)] + [f"staged/{i}" for i in range(20)]
    )


def test_doctor_knows_every_shard_of_a_token_in_use(graveler, repo, tmp_path):
    """No shard of a live token is reported as an orphan; a shard partition of a token no
    branch holds is."""
    from quarry.blob.local import LocalBlobStore
    from quarry.doctor import ORPHAN_STAGING_TOKEN, Doctor
    from quarry.graveler.layout import encode_staged
    from quarry.kv.partitions import sharded_token, staging_partition_of

    graveler.put_objects(repo, "main", [entry(f"d/{i}") for i in range(20)])
    live = graveler.get_branch(repo, "main").staging_token
    orphan = sharded_token("0rphan0rphan", 2)
    graveler.kv.set(staging_partition_of(orphan, b"lost"), b"lost", encode_staged(entry("lost")))
    candidates = [*staging_partitions(live), staging_partition_of(orphan, b"lost")]
    report = Doctor(graveler.kv, LocalBlobStore, lambda: candidates).check()
    orphans = [f.partition for f in report.findings if f.kind == ORPHAN_STAGING_TOKEN]
    assert len(orphans) == 1 and "0rphan0rphan.s2." in orphans[0], orphans
