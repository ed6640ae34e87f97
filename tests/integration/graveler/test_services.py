"""branch-manager and committer over gRPC, wired to kv-gateway and range-writer: statuses
with ErrorInfo reasons, nothing half-applied, concurrency, cost counts, token cleanup."""

import uuid

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from quarry.kv.partitions import staging_partitions, staging_token_shards
from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import committer_pb2 as cm
from quarry.v1 import types_pb2
from support.caches import paused_ttl_caches
from support.hammer import hammer
from support.wait import wait_until


def reason_of(error: grpc.RpcError) -> str:
    status = rpc_status.from_call(error)
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason
    raise AssertionError("no ErrorInfo")


def new_repo(stubs, suite, staging_shards: int = 0) -> str:
    name = f"r-{uuid.uuid4().hex[:10]}"
    stubs.bm.CreateRepository(
        bm.CreateRepositoryRequest(
            name=name, storage_namespace=suite.namespace(name), staging_shards=staging_shards
        )
    )
    return name


# The flows below run with unsharded staging tokens and with 4 shards per token.
SHARDS = pytest.mark.parametrize("shards", [1, 4], ids=["shards1", "shards4"])


def put(stubs, repo, path, checksum="c", branch="main"):
    stubs.bm.PutObject(
        bm.PutObjectRequest(
            repository=repo,
            branch=branch,
            entry=types_pb2.Entry(
                path=path,
                physical_address=f"data/{path}/{checksum}",
                size_bytes=1,
                checksum=checksum,
            ),
        )
    )


@SHARDS
def test_workflow_over_grpc(stubs, suite, shards):
    repo = new_repo(stubs, suite, shards)
    batches = [
        bm.PutObjectsRequest(
            repository=repo,
            branch="main",
            entries=[
                types_pb2.Entry(
                    path=f"dir{b}/f{i}",
                    physical_address=f"a/{b}/{i}",
                    size_bytes=i,
                    checksum=f"{b}-{i}",
                )
                for i in range(100)
            ],
        )
        for b in range(5)
    ]
    assert stubs.bm.PutObjects(iter(batches)).count == 500
    listing = stubs.bm.ListObjects(
        bm.ListObjectsRequest(repository=repo, ref="main", delimiter="/")
    )
    assert list(listing.common_prefixes) == [f"dir{b}/" for b in range(5)]
    commit = stubs.cm.Commit(
        cm.CommitRequest(repository=repo, branch="main", message="load", committer="test")
    )
    assert commit.summary.added == 500 and commit.ranges_written >= 1
    stat = stubs.bm.StatObject(bm.StatObjectRequest(repository=repo, ref="main@", path="dir3/f7"))
    assert stat.entry.checksum == "3-7"
    log = stubs.cm.Log(cm.LogRequest(repository=repo, ref="main"))
    assert [c.message for c in log.commits] == ["load", "Repository created"]


@pytest.mark.parametrize(
    "call, code, reason",
    [
        (
            lambda s, r: s.bm.CreateBranch(
                bm.CreateBranchRequest(repository=r, name="bad/name", source_ref="main")
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_NAME",
        ),
        (
            lambda s, r: s.bm.PutObject(
                bm.PutObjectRequest(
                    repository=r, branch="main", entry=types_pb2.Entry(path="x" * 1100)
                )
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_PATH",
        ),
        (
            lambda s, r: s.bm.PutObject(
                bm.PutObjectRequest(
                    repository=r,
                    branch="main",
                    entry=types_pb2.Entry(path="m", metadata={"k": "v" * 10000}),
                )
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ENTRY",
        ),
        (
            lambda s, r: s.bm.PutObject(
                bm.PutObjectRequest(repository=r, branch="nope", entry=types_pb2.Entry(path="a"))
            ),
            grpc.StatusCode.NOT_FOUND,
            "BRANCH_NOT_FOUND",
        ),
        (
            lambda s, r: s.bm.StatObject(
                bm.StatObjectRequest(repository=r, ref="unknown-ref", path="a")
            ),
            grpc.StatusCode.NOT_FOUND,
            "REF_NOT_FOUND",
        ),
        (
            lambda s, r: s.bm.StatObject(bm.StatObjectRequest(repository=r, ref="main", path="a")),
            grpc.StatusCode.NOT_FOUND,
            "OBJECT_NOT_FOUND",
        ),
        (
            lambda s, r: s.bm.GetRepository(bm.GetRepositoryRequest(name="missing-repo")),
            grpc.StatusCode.NOT_FOUND,
            "REPOSITORY_NOT_FOUND",
        ),
        (
            lambda s, r: s.cm.Commit(cm.CommitRequest(repository=r, branch="main", message="x")),
            grpc.StatusCode.FAILED_PRECONDITION,
            "NO_CHANGES",
        ),
        (
            lambda s, r: s.bm.DeleteBranch(bm.DeleteBranchRequest(repository=r, name="main")),
            grpc.StatusCode.FAILED_PRECONDITION,
            "PROTECTED_BRANCH",
        ),
        (
            lambda s, r: s.bm.ListObjects(
                bm.ListObjectsRequest(repository=r, ref="main", page_token="%%%")
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_PAGE_TOKEN",
        ),
        (
            lambda s, r: s.bm.CreateRepository(
                bm.CreateRepositoryRequest(name=r, storage_namespace="/tmp/x")
            ),
            grpc.StatusCode.ALREADY_EXISTS,
            "REPOSITORY_EXISTS",
        ),
        (
            lambda s, r: s.cm.Merge(
                cm.MergeRequest(repository=r, source_ref="main", destination_branch="main")
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "NO_CHANGES",
        ),
        (
            lambda s, r: s.cm.Merge(
                cm.MergeRequest(
                    repository=r, source_ref="main", destination_branch="main", strategy=9
                )
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (
            lambda s, r: s.cm.Revert(cm.RevertRequest(repository=r, branch="main", ref="main")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_PARENT",
        ),
        (
            lambda s, r: s.cm.Compact(cm.CompactRequest(repository=r, branch="nope")),
            grpc.StatusCode.NOT_FOUND,
            "BRANCH_NOT_FOUND",
        ),
    ],
)
def test_bad_input_gets_a_clear_status_and_changes_nothing(stubs, suite, call, code, reason):
    repo = new_repo(stubs, suite)
    before = stubs.bm.GetBranch(bm.GetBranchRequest(repository=repo, name="main")).branch
    with pytest.raises(grpc.RpcError) as caught:
        call(stubs, repo)
    assert caught.value.code() == code
    assert reason_of(caught.value) == reason
    assert "Traceback" not in caught.value.details()
    after = stubs.bm.GetBranch(bm.GetBranchRequest(repository=repo, name="main")).branch
    assert after == before


@SHARDS
def test_concurrent_writers_readers_committers_over_grpc(stubs, suite, shards):
    repo = new_repo(stubs, suite, shards)

    def do_put(path, version):
        stubs.bm.PutObject(
            bm.PutObjectRequest(
                repository=repo,
                branch="main",
                entry=types_pb2.Entry(
                    path=path,
                    physical_address=f"{path}/{version}",
                    size_bytes=version,
                    checksum=f"v{version}",
                ),
            )
        )

    def do_read(path):
        try:
            entry = stubs.bm.StatObject(
                bm.StatObjectRequest(repository=repo, ref="main", path=path)
            ).entry
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        return int(entry.checksum[1:])

    def do_commit():
        try:
            stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="main", message="h"))
            return True
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.FAILED_PRECONDITION:
                return False
            raise

    # ABORTED (bounded retries exhausted) is a clean, retryable refusal: nothing was
    # acknowledged, so nothing was promised.
    aborted = type("Aborted", (Exception,), {})

    def retrying(fn):
        def call(*args):
            try:
                return fn(*args)
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.ABORTED:
                    raise aborted() from None
                raise

        return call

    result = hammer(
        retrying(do_put),
        retrying(do_read),
        retrying(do_commit),
        writers=4,
        readers=2,
        committers=2,
        retryable=(aborted,),
        # A fixed amount of work, however long it takes (no throughput floor).
        min_writes=100,
        min_reads=50,
        min_commits=3,
    )
    assert not result.errors, result.errors[:5]
    assert not result.stale_reads, result.stale_reads[:5]
    do_commit()
    for path, version in result.acked.items():
        entry = stubs.bm.StatObject(
            bm.StatObjectRequest(repository=repo, ref="main@", path=path)
        ).entry
        assert entry.checksum == f"v{version}", path


# The background dropper (fast in this suite) scans the cleanup queue and deletes retired
# staging partitions at any moment; its operations are not part of the call measured.
DROPPER_OPS = {
    ("scan", "cleanup"),
    ("get", "cleanup"),
    ("delete", "cleanup"),
    ("scan", "staging"),
    ("batch_delete", "staging"),
}


def _costs(counting_backend, action, suite) -> dict:
    # Time stands still for the TTL caches from the warm call to the measured one: however
    # slow the machine, no entry the warm call relied on expires in between.
    suite.drain_cleanup_queue()  # the dropper's reads are not the call's
    with paused_ttl_caches():
        action()  # warm caches
        counting_backend.reset()
        action()
    return {k: v for k, v in counting_backend.snapshot().items() if k not in DROPPER_OPS}


def test_costs_do_not_grow_with_history(stubs, suite, counting_backend):
    repo = new_repo(stubs, suite)
    put(stubs, repo, "data/a")
    stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="main", message="first"))

    def measure():
        stat = _costs(
            counting_backend,
            lambda: stubs.bm.StatObject(
                bm.StatObjectRequest(repository=repo, ref="main", path="data/a")
            ),
            suite,
        )
        listing = _costs(
            counting_backend,
            lambda: stubs.bm.ListObjects(
                bm.ListObjectsRequest(repository=repo, ref="main", page_size=10)
            ),
            suite,
        )
        write = _costs(counting_backend, lambda: put(stubs, repo, "data/b", "same"), suite)
        return stat, listing, write

    shallow = measure()
    stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="main", message="b"))
    # 50 commits deeper: a cost that grew with the depth (linearly, or even by its
    # logarithm) would differ from the shallow one here as it would at any greater depth.
    for i in range(49):
        put(stubs, repo, f"history/{i}")
        stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="main", message=f"c{i}"))
    deep = measure()
    assert shallow[0] == deep[0], "StatObject cost changed with history depth"
    assert shallow[1] == deep[1], "ListObjects cost changed with history depth"
    assert shallow[2] == deep[2], "PutObject cost changed with history depth"
    assert sum(v for (op, cls), v in shallow[0].items() if cls == "staging") == 0


@SHARDS
def test_retired_staging_tokens_are_dropped(stubs, suite, counting_backend, shards):
    repo = new_repo(stubs, suite, shards)
    token = stubs.bm.GetBranch(
        bm.GetBranchRequest(repository=repo, name="main")
    ).branch.staging_token
    partitions = staging_partitions(token)  # every shard of the token
    assert len(partitions) == shards
    for i in range(20):
        put(stubs, repo, f"f{i}")
    backend = counting_backend.inner
    assert all(list(backend.scan(p)) for p in partitions)  # 20 paths reach every shard
    stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="main", message="c"))
    suite.age_cleanup_queue()

    def queued() -> bool:
        return any(item.key in partitions for item in backend.scan(b"cleanup"))

    # The dropper empties the partitions, then removes their cleanup records: wait for both.
    def dropped() -> bool:
        return not any(list(backend.scan(p)) for p in partitions) and not queued()

    wait_until(dropped, timeout=30, interval=0.05, what="the token dropped")
    for partition in partitions:
        assert list(backend.scan(partition)) == []


@SHARDS
def test_stat_on_a_dirty_sharded_branch_is_one_staging_get(stubs, suite, counting_backend, shards):
    """Through the kv-gateway: a hit and a miss on a dirty branch each cost one staging read,
    whatever the token's shard count, in one batch with the fresh branch-record read; a hit
    is that batch alone, a miss then reads the branch record again to validate."""
    repo = new_repo(stubs, suite, shards)
    for i in range(30):
        put(stubs, repo, f"dirty/{i:03d}")
    hit = {("batch_get", "repo"): 1, ("batch_get", "staging"): 1}
    for path, expected in (("dirty/017", hit), ("dirty/missing", {**hit, ("get", "repo"): 1})):
        costs = _costs(counting_backend, lambda p=path: _stat_or_none(stubs, repo, p), suite)
        reads = {k: v for k, v in costs.items() if k[1] in ("repo", "staging")}
        assert reads == expected, (path, costs)


def _stat_or_none(stubs, repo, path):
    try:
        return stubs.bm.StatObject(bm.StatObjectRequest(repository=repo, ref="main", path=path))
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return None


def test_update_repository_changes_shards_from_the_next_token(stubs, suite):
    repo = new_repo(stubs, suite)
    shown = stubs.bm.GetRepository(bm.GetRepositoryRequest(name=repo)).repository
    assert shown.staging_shards == 1
    put(stubs, repo, "a")
    before = stubs.bm.GetBranch(bm.GetBranchRequest(repository=repo, name="main")).branch
    updated = stubs.bm.UpdateRepository(
        bm.UpdateRepositoryRequest(name=repo, staging_shards=4)
    ).repository
    assert updated.staging_shards == 4
    now = stubs.bm.GetBranch(bm.GetBranchRequest(repository=repo, name="main")).branch
    assert now.staging_token == before.staging_token  # the token in use keeps its layout
    stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="main", message="c"))
    after = stubs.bm.GetBranch(bm.GetBranchRequest(repository=repo, name="main")).branch
    assert staging_token_shards(after.staging_token) == 4
    # No field set: nothing changes.
    same = stubs.bm.UpdateRepository(bm.UpdateRepositoryRequest(name=repo)).repository
    assert same.staging_shards == 4
    for bad in (0, 65):
        with pytest.raises(grpc.RpcError) as caught:
            stubs.bm.UpdateRepository(bm.UpdateRepositoryRequest(name=repo, staging_shards=bad))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason_of(caught.value) == "INVALID_STAGING_SHARDS"
    with pytest.raises(grpc.RpcError) as caught:
        stubs.bm.CreateRepository(
            bm.CreateRepositoryRequest(
                name="r-too-many",
                storage_namespace=suite.namespace("r-too-many"),
                staging_shards=65,
            )
        )
    assert reason_of(caught.value) == "INVALID_STAGING_SHARDS"
    with pytest.raises(grpc.RpcError) as caught:
        stubs.bm.UpdateRepository(bm.UpdateRepositoryRequest(name="r-nope", staging_shards=2))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert stubs.bm.GetRepository(bm.GetRepositoryRequest(name=repo)).repository.staging_shards == 4


@SHARDS
def test_long_scans_over_the_gateway_see_every_entry_once(stubs, suite, shards):
    """Past a shard's first (small) KV page the scan reopens with full pages: a listing of
    every page and a commit through the kv-gateway see each of 3,000 staged entries once."""
    repo = new_repo(stubs, suite, shards)
    paths = [f"t{i % 7}/part-{i:05d}" for i in range(3000)]
    stubs.bm.PutObjects(
        iter(
            [
                bm.PutObjectsRequest(
                    repository=repo,
                    branch="main",
                    entries=[
                        types_pb2.Entry(path=p, physical_address=f"a/{p}", size_bytes=1)
                        for p in paths[i : i + 1000]
                    ],
                )
                for i in range(0, len(paths), 1000)
            ]
        )
    )
    listed: list[str] = []
    token = ""
    while True:
        page = stubs.bm.ListObjects(
            bm.ListObjectsRequest(repository=repo, ref="main", page_size=1000, page_token=token)
        )
        listed += [e.path for e in page.entries]
        token = page.next_page_token
        if not token:
            break
    assert listed == sorted(paths)
    commit = stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="main", message="all"))
    assert commit.summary.added == 3000
