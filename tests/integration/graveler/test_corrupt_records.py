"""One corrupt KV record fails only the calls that need it (DATA_LOSS / CORRUPT_RECORD naming
partition and key); listings skip it and say so; the dropper parks a corrupt cleanup item
and keeps dropping the rest. Garbage is planted through the kv-gateway's SetItem, as an
operator's mistake or a bad disk would leave it; everything else goes through real gRPC."""

from __future__ import annotations

import time
import uuid

import grpc
import pytest

from quarry.graveler.refs import Repository
from quarry.kv.remote import RemoteStore
from quarry.runtime.errors import error_info
from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import committer_pb2 as cm
from quarry.v1 import records_pb2, types_pb2
from support.wait import wait_until

GARBAGE = b"\xff\xfe not a protobuf \x00\x01"


@pytest.fixture(scope="module")
def kv(suite):
    store = RemoteStore(suite.targets["kv-gateway"])
    yield store
    store.close()


def new_repo(stubs, suite) -> str:
    name = f"r-{uuid.uuid4().hex[:10]}"
    stubs.bm.CreateRepository(
        bm.CreateRepositoryRequest(name=name, storage_namespace=suite.namespace(name))
    )
    return name


def put(stubs, repo, path, branch="main"):
    stubs.bm.PutObject(
        bm.PutObjectRequest(
            repository=repo,
            branch=branch,
            entry=types_pb2.Entry(
                path=path, physical_address=f"data/{path}", size_bytes=1, checksum="c"
            ),
        )
    )


def repo_partition(kv, name: str) -> bytes:
    return Repository.from_record(
        kv.get(b"quarry", b"repos/" + name.encode()).value, b"repos/" + name.encode()
    ).partition


def expect_corrupt(call, partition: bytes, key: bytes) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() == grpc.StatusCode.DATA_LOSS, caught.value.details()
    info, _ = error_info(caught.value)
    assert info.reason == "CORRUPT_RECORD"
    assert info.metadata["partition"] == partition.decode()
    assert info.metadata["key"] == key.decode()


def test_corrupt_repository_record_fails_only_that_repository(stubs, suite, kv):
    names = sorted(new_repo(stubs, suite) for _ in range(3))
    kv.set(b"quarry", b"repos/zzz", GARBAGE)
    # protobuf parses many byte strings: a well-formed record under the wrong key is corrupt.
    decoy = records_pb2.RepositoryRecord(
        repository=types_pb2.Repository(name="elsewhere"), instance_id="x"
    ).SerializeToString()
    # Between the first and second repository: page 1 (page_size=1) reads past it to find
    # the look-ahead item, page 2 starts before it; only page 2 may count it.
    decoy_key = f"repos/{names[0]}-decoy".encode()
    kv.set(b"quarry", decoy_key, decoy)
    try:
        listed = stubs.bm.ListRepositories(bm.ListRepositoriesRequest())
        assert [r.name for r in listed.repositories] == names
        assert listed.skipped_corrupt_records == 2
        # Paging goes past a corrupt record too.
        seen, token, skipped = [], "", []
        while True:
            page = stubs.bm.ListRepositories(
                bm.ListRepositoriesRequest(page_size=1, page_token=token)
            )
            seen += [r.name for r in page.repositories]
            skipped.append(page.skipped_corrupt_records)
            token = page.next_page_token
            if not token:
                break
        assert seen == names and skipped == [0, 1, 1]
        expect_corrupt(
            lambda: stubs.bm.GetRepository(bm.GetRepositoryRequest(name="zzz")),
            b"quarry",
            b"repos/zzz",
        )
        expect_corrupt(
            lambda: stubs.bm.ListBranches(bm.ListBranchesRequest(repository=f"{names[0]}-decoy")),
            b"quarry",
            decoy_key,
        )
        # Every other tenant works.
        put(stubs, names[0], "a")
        stubs.cm.Commit(cm.CommitRequest(repository=names[0], branch="main", message="m"))
    finally:
        kv.delete(b"quarry", b"repos/zzz")
        kv.delete(b"quarry", decoy_key)


def test_corrupt_branch_record_fails_only_that_branch(stubs, suite, kv):
    repo = new_repo(stubs, suite)
    for name in ("good", "bad"):
        stubs.bm.CreateBranch(bm.CreateBranchRequest(repository=repo, name=name))
    partition = repo_partition(kv, repo)
    kv.set(partition, b"branches/bad", GARBAGE)

    listed = stubs.bm.ListBranches(bm.ListBranchesRequest(repository=repo))
    assert [b.name for b in listed.branches] == ["good", "main"]
    assert listed.skipped_corrupt_records == 1
    for call in (
        lambda: stubs.bm.GetBranch(bm.GetBranchRequest(repository=repo, name="bad")),
        lambda: put(stubs, repo, "x", branch="bad"),
        lambda: stubs.bm.ListObjects(bm.ListObjectsRequest(repository=repo, ref="bad")),
        lambda: stubs.cm.Commit(
            cm.CommitRequest(repository=repo, branch="bad", message="m", allow_empty=True)
        ),
        lambda: stubs.cm.Log(cm.LogRequest(repository=repo, ref="bad")),
    ):
        expect_corrupt(call, partition, b"branches/bad")
    # The repository's other branches work.
    put(stubs, repo, "x", branch="good")
    stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="good", message="m"))
    assert [
        e.path
        for e in stubs.bm.ListObjects(bm.ListObjectsRequest(repository=repo, ref="good")).entries
    ] == ["x"]
    # Tags: the same.
    stubs.bm.CreateTag(bm.CreateTagRequest(repository=repo, name="v1", ref="good"))
    kv.set(partition, b"tags/v0", GARBAGE)
    tags = stubs.bm.ListTags(bm.ListTagsRequest(repository=repo))
    assert [t.name for t in tags.tags] == ["v1"] and tags.skipped_corrupt_records == 1
    expect_corrupt(
        lambda: stubs.bm.GetTag(bm.GetTagRequest(repository=repo, name="v0")), partition, b"tags/v0"
    )


def test_corrupt_staged_value_is_skipped_by_listings_and_fails_what_needs_it(stubs, suite, kv):
    repo = new_repo(stubs, suite)
    for path in ("d/1", "d/2", "d/3"):
        put(stubs, repo, path)
    token = stubs.bm.GetBranch(
        bm.GetBranchRequest(repository=repo, name="main")
    ).branch.staging_token
    partition = f"staging/{token}".encode()
    kv.set(partition, b"d/2", GARBAGE)
    # An empty StagedValue parses: it must not pass as a value either.
    kv.set(partition, b"d/4", b"")

    listed = stubs.bm.ListObjects(bm.ListObjectsRequest(repository=repo, ref="main"))
    assert [e.path for e in listed.entries] == ["d/1", "d/3"]
    assert listed.skipped_corrupt_records == 2
    prefixes = stubs.bm.ListObjects(
        bm.ListObjectsRequest(repository=repo, ref="main", delimiter="/")
    )
    assert list(prefixes.common_prefixes) == ["d/"]

    def skipped_per_page(call, request, **fields) -> list[int]:
        token, counts = "", []
        while True:
            page = call(request(page_size=1, page_token=token, **fields))
            counts.append(page.skipped_corrupt_records)
            token = page.next_page_token
            if not token:
                return counts

    pages = [
        skipped_per_page(stubs.bm.ListObjects, bm.ListObjectsRequest, repository=repo, ref="main"),
        skipped_per_page(
            stubs.bm.DiffUncommitted, bm.DiffUncommittedRequest, repository=repo, branch="main"
        ),
    ]
    # Page 1 (d/1) reads d/2 looking for its end: d/2 is page 2's, counted once.
    assert pages == [[0, 2], [0, 2]]
    diff = stubs.bm.DiffUncommitted(bm.DiffUncommittedRequest(repository=repo, branch="main"))
    assert [c.path for c in diff.changes] == ["d/1", "d/3"]
    assert diff.skipped_corrupt_records == 2
    expect_corrupt(
        lambda: stubs.bm.StatObject(bm.StatObjectRequest(repository=repo, ref="main", path="d/2")),
        partition,
        b"d/2",
    )
    # A commit needs every staged value: it fails, and changes nothing a reader sees.
    expect_corrupt(
        lambda: stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="main", message="m")),
        partition,
        b"d/2",
    )
    assert [
        c.message for c in stubs.cm.Log(cm.LogRequest(repository=repo, ref="main")).commits
    ] == ["Repository created"]
    assert [
        e.path
        for e in stubs.bm.ListObjects(bm.ListObjectsRequest(repository=repo, ref="main")).entries
    ] == ["d/1", "d/3"]
    # Discarding one path needs its staged value: DATA_LOSS. Discarding everything does
    # not read staged values: the way out, and the branch reads clean again.
    expect_corrupt(
        lambda: stubs.bm.DiscardChanges(
            bm.DiscardChangesRequest(repository=repo, branch="main", path="d/2")
        ),
        partition,
        b"d/2",
    )
    stubs.bm.DiscardChanges(bm.DiscardChangesRequest(repository=repo, branch="main"))
    after = stubs.bm.ListObjects(bm.ListObjectsRequest(repository=repo, ref="main"))
    assert list(after.entries) == [] and after.skipped_corrupt_records == 0
    # A clean listing says nothing was skipped.
    other = new_repo(stubs, suite)
    put(stubs, other, "ok")
    assert (
        stubs.bm.ListObjects(
            bm.ListObjectsRequest(repository=other, ref="main")
        ).skipped_corrupt_records
        == 0
    )


def test_dropper_parks_a_corrupt_cleanup_item_and_keeps_dropping(stubs, suite, kv):
    """The dropper must never delete a partition its cleanup item does not clearly name, and
    never lose the item: it is moved to parked/<key>. Meanwhile real tokens are dropped."""
    # A victim partition with data, and cleanup items that must not drop it: garbage, and a
    # well-formed record naming another partition than its key.
    victim = f"staging/victim-{uuid.uuid4().hex}".encode()
    kv.set(victim, b"keep/me", types_pb2.StagedValue(tombstone=True).SerializeToString())
    mismatched = records_pb2.CleanupRecord(
        partition_key="staging/elsewhere", queued_at=1
    ).SerializeToString()
    kv.set(b"cleanup", b"staging/garbage-item", GARBAGE)
    kv.set(b"cleanup", victim, mismatched)

    repo = new_repo(stubs, suite)
    token = stubs.bm.GetBranch(
        bm.GetBranchRequest(repository=repo, name="main")
    ).branch.staging_token
    for i in range(5):
        put(stubs, repo, f"f{i}")
    stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="main", message="m"))
    real = f"staging/{token}".encode()
    suite.age_cleanup_queue()

    def dropped() -> bool:
        queued = [item.key for item in kv.scan(b"cleanup")]
        return not list(kv.scan(real)) and real not in queued

    wait_until(dropped, timeout=30, interval=0.05, what="the real token dropped")
    assert list(kv.scan(real)) == [], "the real token was not dropped"
    assert real not in [item.key for item in kv.scan(b"cleanup")]

    cleanup = {item.key: item.value for item in kv.scan(b"cleanup")}
    assert b"staging/garbage-item" not in cleanup and victim not in cleanup
    assert cleanup[b"parked/staging/garbage-item"] == GARBAGE
    assert cleanup[b"parked/" + victim] == mismatched
    assert [item.key for item in kv.scan(victim)] == [b"keep/me"]
    # Parked items stay parked on later passes.
    time.sleep(0.3)
    assert {
        k: v for k, v in ((i.key, i.value) for i in kv.scan(b"cleanup")) if k.startswith(b"parked/")
    } == {b"parked/staging/garbage-item": GARBAGE, b"parked/" + victim: mismatched}


def test_sensor_rebuild_skips_corrupt_records_and_counts_the_rest(stubs, suite, kv):
    """A compactor-sensor starting over the KV store (rebuild): a corrupt branch record and
    a corrupt staged value must not stop discovery or the counting of the other branches."""
    from quarry.compaction.sensor import CompactionSensor, Thresholds

    repo = new_repo(stubs, suite)
    for name in ("good", "bad"):
        stubs.bm.CreateBranch(bm.CreateBranchRequest(repository=repo, name=name))
    for i in range(3):
        put(stubs, repo, f"g{i}", branch="good")
    put(stubs, repo, "b0", branch="bad")
    token = stubs.bm.GetBranch(
        bm.GetBranchRequest(repository=repo, name="good")
    ).branch.staging_token
    kv.set(f"staging/{token}".encode(), b"g9", GARBAGE)
    partition = repo_partition(kv, repo)
    kv.set(partition, b"branches/bad", GARBAGE)
    # A corrupt record in another repository's listing position must not hide this one.
    kv.set(b"quarry", b"repos/a-corrupt", GARBAGE)
    try:
        sensor = CompactionSensor(
            kv,
            compactor=None,
            thresholds=Thresholds(staged_entries=3, tombstones=0, sealed_tokens=0),
        )
        sensor.evaluate_once()
        # Discovery found the good branch by itself, and counted it (not the garbage).
        assert [
            (c.repository, c.branch, c.puts)
            for c in sensor.list_candidates()
            if c.repository == repo
        ] == [(repo, "good", 3)]
        stats = sensor.get_branch_stats(repo, "good")
        assert (stats.puts, stats.deletes) == (3, 0)
        # The corrupt branch: its own stats fail with DATA_LOSS, the sensor carries on.
        with pytest.raises(Exception) as caught:
            sensor.get_branch_stats(repo, "bad")
        assert getattr(caught.value, "reason", "") == "CORRUPT_RECORD"
        sensor.evaluate_once()
        assert sensor.get_branch_stats(repo, "good").puts == 3
    finally:
        kv.delete(b"quarry", b"repos/a-corrupt")


def test_client_refuses_incomplete_listings_unless_allowed(stubs, suite, kv):
    """GC decides from listings what is unreferenced, Spark what a table holds: the client
    must never hand them a listing with records left out. The CLI opts in and warns."""
    from quarry.client import IncompleteListing

    repo = new_repo(stubs, suite)
    stubs.bm.CreateBranch(bm.CreateBranchRequest(repository=repo, name="bad"))
    partition = repo_partition(kv, repo)
    kv.set(partition, b"branches/bad", GARBAGE)
    with suite.client() as strict:
        with pytest.raises(IncompleteListing) as caught:
            list(strict.iter_branches(repo))
        assert caught.value.code == grpc.StatusCode.DATA_LOSS
        assert strict.skipped_corrupt_records == 1
    with suite.client(allow_incomplete_listings=True) as lenient:
        assert [b.name for b in lenient.iter_branches(repo)] == ["main"]
        assert lenient.skipped_corrupt_records == 1
        with pytest.raises(Exception) as caught:
            lenient.get_branch(repo, "bad")
        assert caught.value.reason == "CORRUPT_RECORD"
        assert caught.value.metadata["key"] == "branches/bad"


def test_log_over_a_corrupt_commit_is_data_loss(stubs, suite, kv):
    repo = new_repo(stubs, suite)
    partition = repo_partition(kv, repo)
    commit_id = "e" * 64
    kv.set(partition, f"commits/{commit_id}".encode(), GARBAGE)
    kv.set(
        partition,
        b"branches/broken",
        types_pb2.Branch(
            name="broken", commit_id=commit_id, staging_token=uuid.uuid4().hex
        ).SerializeToString(),
    )
    expect_corrupt(
        lambda: stubs.cm.Log(cm.LogRequest(repository=repo, ref="broken")),
        partition,
        f"commits/{commit_id}".encode(),
    )
    expect_corrupt(
        lambda: stubs.bm.ListObjects(bm.ListObjectsRequest(repository=repo, ref="broken")),
        partition,
        f"commits/{commit_id}".encode(),
    )
    assert [
        c.message for c in stubs.cm.Log(cm.LogRequest(repository=repo, ref="main")).commits
    ] == ["Repository created"]


def test_skips_and_parks_are_counted_and_logged(stubs, suite, kv, caplog):
    from prometheus_client import REGISTRY

    def sample(name, record):
        return REGISTRY.get_sample_value(name, {"record": record}) or 0.0

    skipped_before = sample("quarry_corrupt_records_skipped_total", "Tag")
    parked_before = sample("quarry_corrupt_records_parked_total", "CleanupRecord")
    repo = new_repo(stubs, suite)
    partition = repo_partition(kv, repo)
    kv.set(partition, b"tags/broken", GARBAGE)
    key = f"staging/garbage-{uuid.uuid4().hex}".encode()
    with caplog.at_level("WARNING", logger="quarry.graveler"):
        assert stubs.bm.ListTags(bm.ListTagsRequest(repository=repo)).skipped_corrupt_records == 1
        kv.set(b"cleanup", key, GARBAGE)
        wait_until(
            lambda: key not in [item.key for item in kv.scan(b"cleanup")],
            interval=0.05,
            what="the corrupt cleanup item parked",
        )
    assert sample("quarry_corrupt_records_skipped_total", "Tag") == skipped_before + 1
    assert sample("quarry_corrupt_records_parked_total", "CleanupRecord") >= parked_before + 1
    text = caplog.text
    assert f"partition={partition.decode()} key=tags/broken" in text
    assert f"partition=cleanup key={key.decode()} moved to key=parked/{key.decode()}" in text
