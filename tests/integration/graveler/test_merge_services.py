"""Merges over gRPC through the committer and range-writer: typed conflict details on the
wire, and N concurrent merges of disjoint branches into one destination."""

import threading
import uuid

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import committer_pb2 as cm
from quarry.v1 import types_pb2


def details_of(error):
    status = rpc_status.from_call(error)
    out = {}
    for detail in status.details:
        for cls in (
            error_details_pb2.ErrorInfo,
            types_pb2.MergeConflicts,
            types_pb2.MergeRetryHint,
        ):
            if detail.Is(cls.DESCRIPTOR):
                message = cls()
                detail.Unpack(message)
                out[cls.__name__] = message
    return out


def setup_repo(stubs, suite, files):
    name = f"m-{uuid.uuid4().hex[:10]}"
    stubs.bm.CreateRepository(
        bm.CreateRepositoryRequest(name=name, storage_namespace=suite.namespace(name))
    )
    stage(stubs, name, "main", files)
    stubs.cm.Commit(cm.CommitRequest(repository=name, branch="main", message="base"))
    return name


def stage(stubs, repo, branch, files):
    stubs.bm.PutObjects(
        iter(
            [
                bm.PutObjectsRequest(
                    repository=repo,
                    branch=branch,
                    entries=[
                        types_pb2.Entry(
                            path=p, physical_address=f"s3://x/{p}/{c}", size_bytes=1, checksum=c
                        )
                        for p, c in files.items()
                    ],
                )
            ]
        )
    )


def listing(stubs, repo, ref):
    out, token = {}, ""
    while True:
        page = stubs.bm.ListObjects(
            bm.ListObjectsRequest(repository=repo, ref=ref, page_size=1000, page_token=token)
        )
        out.update({e.path: e.checksum for e in page.entries})
        token = page.next_page_token
        if not token:
            return out


def test_conflicts_travel_as_a_typed_detail(stubs, suite):
    repo = setup_repo(stubs, suite, {"a": "0", "b": "0"})
    stubs.bm.CreateBranch(bm.CreateBranchRequest(repository=repo, name="f", source_ref="main"))
    stage(stubs, repo, "f", {"a": "f"})
    stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="f", message="f"))
    stage(stubs, repo, "main", {"a": "m"})
    stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="main", message="m"))
    with pytest.raises(grpc.RpcError) as caught:
        stubs.cm.Merge(cm.MergeRequest(repository=repo, source_ref="f", destination_branch="main"))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = details_of(caught.value)
    assert details["ErrorInfo"].reason == "MERGE_CONFLICT"
    conflict = details["MergeConflicts"].conflicts[0]
    assert (
        conflict.path,
        conflict.base.checksum,
        conflict.source.checksum,
        conflict.destination.checksum,
    ) == ("a", "0", "f", "m")
    dry = stubs.cm.Merge(
        cm.MergeRequest(repository=repo, source_ref="f", destination_branch="main", dry_run=True)
    )
    assert [c.path for c in dry.conflicts] == ["a"] and not dry.HasField("commit")
    merged = stubs.cm.Merge(
        cm.MergeRequest(
            repository=repo,
            source_ref="f",
            destination_branch="main",
            strategy=types_pb2.MERGE_STRATEGY_SOURCE_WINS,
        )
    )
    assert merged.commit.metadata["quarry.merge.strategy"] == "source-wins"
    assert listing(stubs, repo, "main")["a"] == "f"
    base = stubs.cm.FindMergeBase(
        cm.FindMergeBaseRequest(repository=repo, left_ref="main", right_ref="f")
    )
    assert (
        base.commit.id
        == stubs.cm.GetCommit(cm.GetCommitRequest(repository=repo, ref="f")).commit.id
    )


@pytest.mark.parametrize(("count", "path_length"), [(150, 17), (5, 900)])
def test_many_or_long_conflicts_are_still_merge_conflict_with_the_count(
    stubs, suite, count, path_length
):
    """The conflicts listed travel in the status trailer, read under gRPC's 8 KiB metadata
    limit: 100 short ones (or 5 on long paths) made the answer RESOURCE_EXHAUSTED with no
    conflict at all. Now: MERGE_CONFLICT, the conflicts that fit, `more` for the rest;
    and a dry run counts them all (it said 100 of 150)."""
    paths = [f"{i:04d}".ljust(path_length, "p") for i in range(count)]
    repo = setup_repo(stubs, suite, dict.fromkeys(paths, "0"))
    stubs.bm.CreateBranch(bm.CreateBranchRequest(repository=repo, name="f", source_ref="main"))
    stage(stubs, repo, "f", dict.fromkeys(paths, "f"))
    stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="f", message="f"))
    stage(stubs, repo, "main", dict.fromkeys(paths, "m"))
    stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="main", message="m"))
    with pytest.raises(grpc.RpcError) as caught:
        stubs.cm.Merge(cm.MergeRequest(repository=repo, source_ref="f", destination_branch="main"))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION, caught.value.details()
    details = details_of(caught.value)
    assert details["ErrorInfo"].reason == "MERGE_CONFLICT"
    assert details["ErrorInfo"].metadata["conflicts"] == str(count)
    listed = details["MergeConflicts"]
    assert len(listed.conflicts) + listed.more == count and listed.more > 0
    assert [c.path for c in listed.conflicts] == paths[: len(listed.conflicts)]
    dry = stubs.cm.Merge(
        cm.MergeRequest(repository=repo, source_ref="f", destination_branch="main", dry_run=True)
    )
    assert len(dry.conflicts) + dry.more_conflicts == count


def test_concurrent_merges_of_disjoint_branches(stubs, suite):
    n = 4
    repo = setup_repo(stubs, suite, {f"base/{i:03d}": "0" for i in range(200)})
    expected = listing(stubs, repo, "main")
    for b in range(n):
        branch = f"b{b}"
        stubs.bm.CreateBranch(
            bm.CreateBranchRequest(repository=repo, name=branch, source_ref="main")
        )
        files = {f"branch{b}/{i:03d}": str(b) for i in range(50)}
        files[f"base/{b * 7:03d}"] = f"changed-by-{b}"
        stage(stubs, repo, branch, files)
        stubs.cm.Commit(cm.CommitRequest(repository=repo, branch=branch, message=branch))
        expected.update(files)
    outcomes, errors = {}, []
    barrier = threading.Barrier(n)

    def merge(b):
        barrier.wait()
        hint = ""
        for _ in range(10):
            try:
                outcomes[b] = stubs.cm.Merge(
                    cm.MergeRequest(
                        repository=repo,
                        source_ref=f"b{b}",
                        destination_branch="main",
                        hint_metarange_id=hint,
                    )
                )
                return
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.ABORTED:
                    errors.append(error)
                    return
                details = details_of(error)
                assert details["ErrorInfo"].reason in ("HEAD_MOVED", "BRANCH_CONTENDED")
                if "MergeRetryHint" in details:
                    hint = details["MergeRetryHint"].hint_metarange_id
        errors.append(RuntimeError(f"b{b} never merged"))

    threads = [threading.Thread(target=merge, args=(b,)) for b in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert listing(stubs, repo, "main") == expected
    assert sum(o.attempts for o in outcomes.values()) >= n
    log = stubs.cm.Log(cm.LogRequest(repository=repo, ref="main", first_parent=True))
    assert sum(1 for c in log.commits if "quarry.merge.source" in c.metadata) == n


def test_a_criss_cross_merge_keeps_a_deletion_over_the_real_range_writer(suite):
    """hM's history over gRPC and the real range-writer: two merges in opposite directions
    at once, then feat deletes p; merging main into feat brought p back (one merge base
    chosen of two). From the virtual base of both it stays deleted, as in git."""
    import uuid

    name = f"cc-{uuid.uuid4().hex[:8]}"

    def e(path, n):
        return {
            "path": path,
            "physical_address": f"s3://b/{n}",
            "size_bytes": 1,
            "checksum": str(n),
        }

    with suite.client() as c:
        c.create_repository(name, suite.namespace(name))
        c.put_objects(name, "main", [e("base", 0)])
        c.commit(name, "main", "root")
        c.create_branch(name, "feat", "main")
        c.put_objects(name, "feat", [e("p", 1), e("p2", 11)])
        c.commit(name, "feat", "add p")
        c.put_objects(name, "main", [e("q", 2)])
        c.commit(name, "main", "q")
        c.put_objects(name, "main", [e("r", 3)])
        before = c.commit(name, "main", "r").commit.id
        c.merge(name, "feat", "main")
        c.merge(name, before, "feat")
        c.delete_object(name, "feat", "p")
        c.commit(name, "feat", "delete p")
        c.merge(name, "main", "feat", allow_empty=True)
        assert sorted(x.path for x in c.iter_objects(name, "feat")) == ["base", "p2", "q", "r"]
