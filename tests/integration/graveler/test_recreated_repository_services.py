"""A repository deleted and re-created under the same name within the repository-record
cache window (RefManager.REPOSITORY_TTL_SECONDS): the committer, whose cached record still
named the dead instance, answered NO_CHANGES to a Commit while a write sat staged in the new
repository (and a Merge acted on the dead instance). Real servers on loopback: branch-manager
and committer are separate cores with separate caches, as in production."""

from __future__ import annotations

import uuid

import grpc
import pytest

from quarry.graveler.refs import RefManager
from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import branch_manager_pb2_grpc, committer_pb2_grpc, types_pb2
from quarry.v1 import committer_pb2 as cm
from support.suite import _start, suite_fixture

# The dead instance's partition stays (as it does for the dropper's grace period).
suite = suite_fixture(staging_drop_grace_seconds=3600.0)


@pytest.fixture(scope="module")
def stubs(suite):
    from quarry.services.committer.service import build as build_committer

    # A second committer: a process whose cache has not seen the repository yet.
    server, target = _start(suite.settings, build_committer(suite.settings))
    suite.servers["committer-2"] = server
    channels = [grpc.insecure_channel(suite.targets[n]) for n in ("branch-manager", "committer")]
    channels.append(grpc.insecure_channel(target))
    yield (
        branch_manager_pb2_grpc.BranchManagerStub(channels[0]),
        committer_pb2_grpc.CommitterStub(channels[1]),
        committer_pb2_grpc.CommitterStub(channels[2]),
    )
    for channel in channels:
        channel.close()


@pytest.fixture(autouse=True)
def long_cache_window(monkeypatch):
    # However slow the machine, each test runs within the window (the servers are in-process).
    monkeypatch.setattr(RefManager, "REPOSITORY_TTL_SECONDS", 600.0)


def put(bm_stub, repo: str, path: str, branch: str = "main") -> None:
    entry = types_pb2.Entry(path=path, physical_address=f"s3://b/{path}", size_bytes=1)
    bm_stub.PutObject(bm.PutObjectRequest(repository=repo, branch=branch, entry=entry))


def listing(bm_stub, repo: str, ref: str) -> list[str]:
    response = bm_stub.ListObjects(bm.ListObjectsRequest(repository=repo, ref=ref))
    return [e.path for e in response.entries]


def recreate(suite, bm_stub, repo: str) -> None:
    bm_stub.DeleteRepository(bm.DeleteRepositoryRequest(name=repo))
    bm_stub.CreateRepository(
        bm.CreateRepositoryRequest(name=repo, storage_namespace=suite.namespace(f"{repo}-2"))
    )


def new_repo(suite, bm_stub) -> str:
    repo = f"r-{uuid.uuid4().hex[:10]}"
    bm_stub.CreateRepository(
        bm.CreateRepositoryRequest(name=repo, storage_namespace=suite.namespace(repo))
    )
    return repo


def test_commit_right_after_delete_and_recreate_takes_the_staged_write(suite, stubs):
    bm_stub, committer, _ = stubs
    repo = new_repo(suite, bm_stub)
    put(bm_stub, repo, "old")
    committer.Commit(cm.CommitRequest(repository=repo, branch="main", message="old"))

    recreate(suite, bm_stub, repo)
    put(bm_stub, repo, "new")
    commit = committer.Commit(
        cm.CommitRequest(repository=repo, branch="main", message="new")
    ).commit
    assert listing(bm_stub, repo, commit.id) == ["new"]
    head = bm_stub.GetBranch(bm.GetBranchRequest(repository=repo, name="main")).branch
    assert head.commit_id == commit.id
    assert listing(bm_stub, repo, "main") == ["new"]


def test_merge_right_after_delete_and_recreate_merges_in_the_new_repository(suite, stubs):
    bm_stub, stale, fresh = stubs
    repo = new_repo(suite, bm_stub)
    # The dead instance has a dev branch of its own, with a commit to merge.
    bm_stub.CreateBranch(bm.CreateBranchRequest(repository=repo, name="dev", source_ref="main"))
    put(bm_stub, repo, "old", branch="dev")
    stale.Commit(cm.CommitRequest(repository=repo, branch="dev", message="old"))

    recreate(suite, bm_stub, repo)
    bm_stub.CreateBranch(bm.CreateBranchRequest(repository=repo, name="dev", source_ref="main"))
    put(bm_stub, repo, "new", branch="dev")
    fresh.Commit(cm.CommitRequest(repository=repo, branch="dev", message="new"))
    merged = stale.Merge(
        cm.MergeRequest(repository=repo, source_ref="dev", destination_branch="main")
    ).commit
    head = bm_stub.GetBranch(bm.GetBranchRequest(repository=repo, name="main")).branch
    assert head.commit_id == merged.id
    assert listing(bm_stub, repo, "main") == ["new"]
