"""Request ids (AIP-155) over gRPC against the real suite: a repeat of a mutating call with
the same id returns the first result and changes nothing; the same id on another request is
REQUEST_ID_REUSED; a malformed id is INVALID_ARGUMENT; concurrent duplicates take effect
once; a lost answer is recovered by the Python client's own retry."""

from __future__ import annotations

import contextlib
import threading
import uuid

import grpc
import pytest

from quarry.client import Client, RetryPolicy
from quarry.kv.partitions import QUARRY_PARTITION
from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import committer_pb2 as cm
from quarry.v1 import types_pb2
from support.caches import paused_ttl_caches
from support.lossy import DropAnswers, RecordRequests, lossy_channel
from support.suite import running_suite


def rid() -> str:
    return str(uuid.uuid4())


def reason(error: grpc.RpcError) -> str:
    from quarry.runtime.errors import from_rpc_error

    return from_rpc_error(error).reason


@pytest.fixture
def repo(stubs, suite):
    name = f"rid-{uuid.uuid4().hex[:8]}"
    stubs.bm.CreateRepository(
        bm.CreateRepositoryRequest(name=name, storage_namespace=suite.namespace(name))
    )
    return name


def put(stubs, repo, path, address="s3://b/x", branch="main"):
    stubs.bm.PutObject(
        bm.PutObjectRequest(
            repository=repo,
            branch=branch,
            entry=types_pb2.Entry(
                path=path, physical_address=address, checksum=address, size_bytes=1
            ),
        )
    )


def log_ids(stubs, repo, ref="main", first_parent=False) -> list[str]:
    return [
        c.id
        for c in stubs.cm.Log(
            cm.LogRequest(repository=repo, ref=ref, first_parent=first_parent, page_size=1000)
        ).commits
    ]


def uncommitted(stubs, repo, branch="main") -> list[str]:
    return [
        c.path
        for c in stubs.bm.DiffUncommitted(
            bm.DiffUncommittedRequest(repository=repo, branch=branch)
        ).changes
    ]


# ---- repeats return the first result and change nothing ----------------------------------


def test_a_repeated_commit_returns_the_first_commit_and_commits_nothing_staged_since(stubs, repo):
    put(stubs, repo, "a")
    request = cm.CommitRequest(repository=repo, branch="main", message="one", request_id=rid())
    first = stubs.cm.Commit(request)
    put(stubs, repo, "b")  # staged after the first commit: the repeat must not commit it
    again = stubs.cm.Commit(request)
    assert again == first
    history = log_ids(stubs, repo)
    assert history[0] == first.commit.id and len(history) == 2  # + the initial commit
    assert uncommitted(stubs, repo) == ["b"]
    # Without an id the same request is a new commit (of "b").
    request.request_id = ""
    assert stubs.cm.Commit(request).commit.id != first.commit.id


def test_a_repeated_merge_makes_one_merge_commit(stubs, repo):
    stubs.bm.CreateBranch(bm.CreateBranchRequest(repository=repo, name="feature"))
    put(stubs, repo, "f", branch="feature")
    stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="feature", message="f"))
    request = cm.MergeRequest(
        repository=repo,
        source_ref="feature",
        destination_branch="main",
        allow_empty=True,
        request_id=rid(),
    )
    first = stubs.cm.Merge(request)
    # A hint changes nothing the merge does: the repeat still matches.
    request.hint_metarange_id = "not-a-hint"
    again = stubs.cm.Merge(request)
    assert again.commit.id == first.commit.id
    merges = [
        c
        for c in stubs.cm.Log(cm.LogRequest(repository=repo, ref="main")).commits
        if len(c.parents) == 2
    ]
    assert [c.id for c in merges] == [first.commit.id]


def test_repeated_creates_and_deletes_succeed_instead_of_exists_or_not_found(stubs, suite):
    name = f"rid-{uuid.uuid4().hex[:8]}"
    create_repo = bm.CreateRepositoryRequest(
        name=name, storage_namespace=suite.namespace(name), request_id=rid()
    )
    assert stubs.bm.CreateRepository(create_repo) == stubs.bm.CreateRepository(create_repo)

    create_branch = bm.CreateBranchRequest(repository=name, name="dev", request_id=rid())
    first_branch = stubs.bm.CreateBranch(create_branch)
    assert stubs.bm.CreateBranch(create_branch) == first_branch

    create_tag = bm.CreateTagRequest(repository=name, name="v1", ref="main", request_id=rid())
    assert stubs.bm.CreateTag(create_tag) == stubs.bm.CreateTag(create_tag)

    delete_branch = bm.DeleteBranchRequest(repository=name, name="dev", request_id=rid())
    stubs.bm.DeleteBranch(delete_branch)
    stubs.bm.DeleteBranch(delete_branch)  # not BRANCH_NOT_FOUND
    # A new branch of the same name is not deleted by the repeat.
    stubs.bm.CreateBranch(bm.CreateBranchRequest(repository=name, name="dev"))
    stubs.bm.DeleteBranch(delete_branch)
    assert stubs.bm.GetBranch(bm.GetBranchRequest(repository=name, name="dev")).branch.name

    delete_tag = bm.DeleteTagRequest(repository=name, name="v1", request_id=rid())
    stubs.bm.DeleteTag(delete_tag)
    stubs.bm.DeleteTag(delete_tag)

    delete_repo = bm.DeleteRepositoryRequest(name=name, request_id=rid())
    stubs.bm.DeleteRepository(delete_repo)
    stubs.bm.DeleteRepository(delete_repo)  # not REPOSITORY_NOT_FOUND
    # Without the id it is gone.
    with pytest.raises(grpc.RpcError) as caught:
        stubs.bm.DeleteRepository(bm.DeleteRepositoryRequest(name=name))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_repeated_reset_revert_cherry_pick_and_compact_change_nothing_more(stubs, repo):
    put(stubs, repo, "a")
    first = stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="main", message="a"))
    revert = cm.RevertRequest(repository=repo, branch="main", ref=first.commit.id, request_id=rid())
    reverted = stubs.cm.Revert(revert)
    assert stubs.cm.Revert(revert) == reverted
    pick = cm.CherryPickRequest(
        repository=repo, branch="main", ref=first.commit.id, request_id=rid()
    )
    picked = stubs.cm.CherryPick(pick)
    assert stubs.cm.CherryPick(pick) == picked
    assert log_ids(stubs, repo)[:3] == [picked.commit.id, reverted.commit.id, first.commit.id]

    put(stubs, repo, "c")
    compact = cm.CompactRequest(repository=repo, branch="main", request_id=rid())
    compacted = stubs.cm.Compact(compact)
    assert compacted.tokens_compacted == 1
    put(stubs, repo, "d")
    assert stubs.cm.Compact(compact) == compacted  # "d" stays uncompacted
    branch = stubs.bm.GetBranch(bm.GetBranchRequest(repository=repo, name="main")).branch
    assert branch.dirty and branch.compacted_metarange_id == compacted.compacted_metarange_id

    reset = bm.ResetBranchRequest(
        repository=repo, branch="main", ref=first.commit.id, force=True, request_id=rid()
    )
    stubs.bm.ResetBranch(reset)
    put(stubs, repo, "e")
    stubs.bm.ResetBranch(reset)  # the repeat does not drop what was staged since
    assert uncommitted(stubs, repo) == ["e"]


def test_repeated_staging_writes_and_discards_change_nothing_after_a_commit(stubs, repo):
    put_request = bm.PutObjectRequest(
        repository=repo,
        branch="main",
        request_id=rid(),
        entry=types_pb2.Entry(path="p", physical_address="s3://1"),
    )
    stubs.bm.PutObject(put_request)
    stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="main", message="p"))
    put(stubs, repo, "p", address="s3://2")  # a later write of the same path
    stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="main", message="p2"))
    stubs.bm.PutObject(put_request)  # a late retry must not bring back the old address
    assert uncommitted(stubs, repo) == []
    entry = stubs.bm.StatObject(bm.StatObjectRequest(repository=repo, ref="main", path="p"))
    assert entry.entry.physical_address == "s3://2"

    delete = bm.DeleteObjectsRequest(
        repository=repo, branch="main", paths=["p", "q"], request_id=rid()
    )
    assert stubs.bm.DeleteObjects(delete).deleted == 1
    stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="main", message="rm"))
    put(stubs, repo, "p", address="s3://3")
    assert stubs.bm.DeleteObjects(delete).deleted == 1  # the first answer, nothing staged
    assert uncommitted(stubs, repo) == ["p"]

    discard = bm.DiscardChangesRequest(repository=repo, branch="main", request_id=rid())
    stubs.bm.DiscardChanges(discard)
    put(stubs, repo, "p", address="s3://4")
    stubs.bm.DiscardChanges(discard)
    assert uncommitted(stubs, repo) == ["p"]


def test_put_objects_messages_with_ids_are_staged_once_when_a_stream_is_replayed(stubs, repo):
    ids = [rid(), rid()]

    def stream(address):
        yield bm.PutObjectsRequest(
            repository=repo,
            branch="main",
            request_id=ids[0],
            entries=[
                types_pb2.Entry(path="s/1", physical_address=address),
                types_pb2.Entry(path="s/2", physical_address=address),
            ],
        )
        yield bm.PutObjectsRequest(
            request_id=ids[1], entries=[types_pb2.Entry(path="s/3", physical_address=address)]
        )

    assert stubs.bm.PutObjects(stream("s3://v1")).count == 3
    stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="main", message="s"))
    assert stubs.bm.PutObjects(stream("s3://v1")).count == 3
    assert uncommitted(stubs, repo) == []
    # The same ids on other batches are refused, and nothing of that stream is staged.
    with pytest.raises(grpc.RpcError) as caught:
        stubs.bm.PutObjects(stream("s3://v2"))
    assert reason(caught.value) == "REQUEST_ID_REUSED"
    assert uncommitted(stubs, repo) == []


# ---- misuse ------------------------------------------------------------------------------


def test_reusing_an_id_for_another_request_is_request_id_reused_and_changes_nothing(stubs, repo):
    request_id = rid()
    put(stubs, repo, "a")
    stubs.cm.Commit(
        cm.CommitRequest(repository=repo, branch="main", message="one", request_id=request_id)
    )
    put(stubs, repo, "b")
    before = log_ids(stubs, repo)
    for other in (
        cm.CommitRequest(repository=repo, branch="main", message="two", request_id=request_id),
        cm.CommitRequest(
            repository=repo, branch="main", message="one", allow_empty=True, request_id=request_id
        ),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            stubs.cm.Commit(other)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason(caught.value) == "REQUEST_ID_REUSED"
    # Another RPC with the same id (same repository partition) is a different request too.
    with pytest.raises(grpc.RpcError) as caught:
        stubs.bm.CreateBranch(
            bm.CreateBranchRequest(repository=repo, name="x", request_id=request_id)
        )
    assert reason(caught.value) == "REQUEST_ID_REUSED"
    assert log_ids(stubs, repo) == before and uncommitted(stubs, repo) == ["b"]
    assert [
        b.name for b in stubs.bm.ListBranches(bm.ListBranchesRequest(repository=repo)).branches
    ] == ["main"]


def test_the_same_id_on_another_repository_is_a_new_request(stubs, suite, repo):
    """Request ids are scoped by repository (the record lives in the repository's
    partition): a client that reuses an id on another repository gets that repository's
    call run, never the first repository's answer nor REQUEST_ID_REUSED."""
    other = f"rid-{uuid.uuid4().hex[:8]}"
    stubs.bm.CreateRepository(
        bm.CreateRepositoryRequest(name=other, storage_namespace=suite.namespace(other))
    )
    request_id = rid()
    put(stubs, repo, "a")
    put(stubs, other, "b")
    first = stubs.cm.Commit(
        cm.CommitRequest(repository=repo, branch="main", message="m", request_id=request_id)
    )
    second = stubs.cm.Commit(
        cm.CommitRequest(repository=other, branch="main", message="m", request_id=request_id)
    )
    assert second.commit.id != first.commit.id
    assert log_ids(stubs, other)[0] == second.commit.id and uncommitted(stubs, other) == []
    assert log_ids(stubs, repo)[0] == first.commit.id


@pytest.mark.parametrize(
    "bad",
    [
        "x",
        "not-a-uuid",
        "123e4567e89b12d3a456426614174000",
        "{123e4567-e89b-12d3-a456-426614174000}",
        " " + "a" * 36,
        "123e4567-e89b-12d3-a456-42661417400g",
        "é" * 36,
    ],
)
def test_a_malformed_id_is_invalid_argument_and_changes_nothing(stubs, repo, bad):
    put(stubs, repo, "a")
    with pytest.raises(grpc.RpcError) as caught:
        stubs.cm.Commit(
            cm.CommitRequest(repository=repo, branch="main", message="m", request_id=bad)
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason(caught.value) == "INVALID_REQUEST_ID"
    assert len(log_ids(stubs, repo)) == 1 and uncommitted(stubs, repo) == ["a"]


def test_a_failed_call_is_not_remembered_and_its_retry_runs(stubs, repo):
    request = cm.CommitRequest(repository=repo, branch="main", message="m", request_id=rid())
    with pytest.raises(grpc.RpcError) as caught:
        stubs.cm.Commit(request)  # nothing staged
    assert reason(caught.value) == "NO_CHANGES"
    put(stubs, repo, "a")
    assert stubs.cm.Commit(request).summary.added == 1


def test_an_uppercase_id_is_the_same_id(stubs, repo):
    put(stubs, repo, "a")
    request_id = rid()
    first = stubs.cm.Commit(
        cm.CommitRequest(repository=repo, branch="main", message="m", request_id=request_id)
    )
    again = stubs.cm.Commit(
        cm.CommitRequest(repository=repo, branch="main", message="m", request_id=request_id.upper())
    )
    assert again.commit.id == first.commit.id


# ---- concurrency -------------------------------------------------------------------------


def test_concurrent_duplicates_take_effect_once(suite, repo, stubs, monkeypatch):
    """Two clients send the same commit at once (with many staged entries the first is still
    running when the second arrives): one commit, and both get it (the second through
    REQUEST_IN_PROGRESS retries, then the recorded result)."""
    import quarry.client.retry as retry_module

    retried_on = []
    record_retry = retry_module._record_retry

    def recording(method, attempt, exc, *args):
        retried_on.append(exc.reason)
        record_retry(method, attempt, exc, *args)

    monkeypatch.setattr(retry_module, "_record_retry", recording)
    for round_number in range(3):
        branch = f"src{round_number}"
        stubs.bm.CreateBranch(bm.CreateBranchRequest(repository=repo, name=branch))
        stubs.bm.PutObjects(
            iter(
                [
                    bm.PutObjectsRequest(
                        repository=repo,
                        branch=branch,
                        entries=[
                            types_pb2.Entry(path=f"{branch}/{i:05d}", physical_address="s3://x")
                            for i in range(3000)
                        ],
                    )
                ]
            )
        )
        request_id = rid()
        barrier = threading.Barrier(2)
        results, failures = [], []

        def send(
            barrier=barrier,
            results=results,
            failures=failures,
            branch=branch,
            request_id=request_id,
        ):
            with suite.client(retry=RetryPolicy(budget=60.0, max_attempts=0)) as client:
                barrier.wait()
                try:
                    results.append(client.commit(repo, branch, "c", request_id=request_id))
                except Exception as exc:  # reported below
                    failures.append(exc)

        threads = [threading.Thread(target=send) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures
        assert results[0].commit.id == results[1].commit.id
        history = log_ids(stubs, repo, branch)
        assert history[0] == results[0].commit.id
        assert history[1] == log_ids(stubs, repo, "main")[0]  # exactly one commit on top
    # The duplicates did overlap: a second call arrived while the first ran.
    assert "REQUEST_IN_PROGRESS" in retried_on


# ---- lost answers: the client's own retry ------------------------------------------------


@pytest.mark.parametrize("method", ["Commit", "Merge"])
def test_a_lost_answer_is_recovered_by_the_clients_retry_with_the_same_id(
    suite, stubs, repo, method
):
    dropper = DropAnswers(f"/quarry.v1.Committer/{method}")
    channel = lossy_channel(suite.targets["committer"], dropper)
    try:
        client = Client(
            suite.targets["branch-manager"], channel, retry=RetryPolicy(base_delay=0.01)
        )
        if method == "Commit":
            put(stubs, repo, "a")
            result = client.commit(repo, "main", "lost answer").commit
        else:
            stubs.bm.CreateBranch(bm.CreateBranchRequest(repository=repo, name="f"))
            put(stubs, repo, "f", branch="f")
            stubs.cm.Commit(cm.CommitRequest(repository=repo, branch="f", message="f"))
            result = client.merge(repo, "f", "main", allow_empty=True).commit
        client.close()
    finally:
        channel.close()
    assert dropper.dropped == 1 and len(dropper.requests) == 2
    first, retry = dropper.requests
    assert first.request_id and retry.request_id == first.request_id
    history = log_ids(stubs, repo, first_parent=True)
    assert history[0] == result.id and len(history) == 2  # one commit, not a second one


def test_the_client_sends_an_id_per_logical_call_except_on_staging_writes(suite, repo):
    recorder = RecordRequests()
    channels = [
        grpc.intercept_channel(grpc.insecure_channel(suite.targets[name]), recorder)
        for name in ("branch-manager", "committer")
    ]
    try:
        with Client(*channels) as client:
            client.put_object(repo, "main", path="a", physical_address="s3://a")
            client.put_objects(repo, "main", [{"path": "b", "physical_address": "s3://b"}])
            client.delete_object(repo, "main", "b")
            client.delete_objects(repo, "main", ["a"])
            client.put_object(repo, "main", path="a", physical_address="s3://a")
            client.commit(repo, "main", "c")
            client.create_branch(repo, "dev")
            client.create_tag(repo, "t1", "main")
            client.reset_branch(repo, "dev", "main")
            client.compact(repo, "main")
            client.discard_changes(repo, "main")
            client.merge(repo, "dev", "main", allow_empty=True)
            client.delete_tag(repo, "t1")
            client.delete_branch(repo, "dev")
            client.get_branch(repo, "main")
    finally:
        for channel in channels:
            channel.close()
    with_id = {method for method, request in recorder.calls if getattr(request, "request_id", "")}
    without = {
        method for method, request in recorder.calls if not getattr(request, "request_id", "")
    } - {"Login"}  # the client's own login (auth), not a call of the caller's
    assert with_id == {
        "Commit",
        "CreateBranch",
        "CreateTag",
        "ResetBranch",
        "Compact",
        "DiscardChanges",
        "Merge",
        "DeleteTag",
        "DeleteBranch",
    }
    assert without == {"PutObject", "PutObjects", "DeleteObject", "DeleteObjects", "GetBranch"}
    ids = [request.request_id for _, request in recorder.calls if request_id_of(request)]
    assert len(set(ids)) == len(ids)  # a fresh id per logical call


def request_id_of(request) -> str:
    return getattr(request, "request_id", "")


def test_staging_writes_with_a_caller_id_are_staged_once_across_replays(suite, stubs, repo):
    with suite.client() as client:
        # (checksums too: until identity covers the address, issue 10 item 1)
        entries = [
            {"path": f"s/{i:03d}", "physical_address": "s3://v1", "checksum": "v1"}
            for i in range(25)
        ]
        put_id, delete_id = rid(), rid()
        assert client.put_objects(repo, "main", entries, batch_size=10, request_id=put_id) == 25
        client.commit(repo, "main", "v1")
        client.put_object(repo, "main", path="s/000", physical_address="s3://v2", checksum="v2")
        client.commit(repo, "main", "v2")
        # A replay (a driver retrying the whole call) stages nothing: s/000 stays v2.
        assert client.put_objects(repo, "main", entries, batch_size=10, request_id=put_id) == 25
        assert uncommitted(stubs, repo) == []
        assert client.stat_object(repo, "main", "s/000").physical_address == "s3://v2"
        paths = [f"s/{i:03d}" for i in range(25)]
        assert client.delete_objects(repo, "main", paths, batch_size=10, request_id=delete_id) == 25
        client.commit(repo, "main", "rm")
        client.put_object(repo, "main", path="s/001", physical_address="s3://v3")
        assert client.delete_objects(repo, "main", paths, batch_size=10, request_id=delete_id) == 25
        assert uncommitted(stubs, repo) == ["s/001"]


# ---- retention ---------------------------------------------------------------------------


def test_after_the_retention_window_a_repeat_runs_again(tmp_path):
    import time

    with running_suite(tmp_path, request_retention_seconds=0.3) as suite, suite.client() as client:
        client.create_repository("rep", suite.namespace("rep"))
        request_id = rid()
        first = client.commit("rep", "main", "m", allow_empty=True, request_id=request_id)
        assert (
            client.commit("rep", "main", "m", allow_empty=True, request_id=request_id).commit.id
            == first.commit.id
        )
        time.sleep(0.5)
        again = client.commit("rep", "main", "m", allow_empty=True, request_id=request_id)
        assert again.commit.id != first.commit.id
        assert list(again.commit.parents) == [first.commit.id]


# ---- cost ----------------------------------------------------------------------------------


def test_an_id_costs_two_conditional_writes_and_nothing_without_one(
    stubs, suite, repo, counting_backend
):
    """The measured price of an id (the figures in the client's docstring): a fresh id costs
    two conditional writes in the call's partition; a repeat one failed conditional write and
    one read, and nothing else; a call without an id costs what it did before."""

    def cost(call) -> dict:
        """The call's KV operations, without what background work may add meanwhile (the
        staging dropper's scans and deletes, a refresh of the cached repository record or
        of the IAM records its authorization reads, whose caches may expire while the
        cleanup queue drains)."""
        suite.drain_cleanup_queue()  # the dropper's branch reads are not the call's
        counting_backend.reset()
        call()
        return {
            (op, cls): n
            for (op, cls), n in counting_backend.snapshot().items()
            if n
            and op not in ("scan", "batch_delete")
            and (cls, op) not in (("cleanup", "delete"), ("quarry", "get"), ("quarry", "batch_get"))
            and cls != "auth"  # a refresh of the cached IAM records (users, policies)
        }

    def put_call(request_id):
        return lambda: stubs.bm.PutObject(
            bm.PutObjectRequest(
                repository=repo,
                branch="main",
                request_id=request_id,
                entry=types_pb2.Entry(path="p", physical_address="s3://p"),
            )
        )

    # Time stands still for the TTL caches (a writer's branch record is cached for 1 s): the
    # three calls are compared with the same cached records, however slow the machine.
    with paused_ttl_caches():
        put(stubs, repo, "warm")  # caches warm
        plain = cost(put_call(""))
        request_id = rid()
        with_id = cost(put_call(request_id))
        repeated = cost(put_call(request_id))
    expected = dict(plain)
    expected[("set_if", "repo")] = expected.get(("set_if", "repo"), 0) + 2
    assert with_id == expected
    assert repeated == {("set_if", "repo"): 1, ("get", "repo"): 1}

    # Installation-wide calls keep their record in the quarry partition.
    assert (
        cost(
            lambda: stubs.bm.DeleteRepository(
                bm.DeleteRepositoryRequest(name=repo, request_id=request_id)
            )
        )[("set_if", "quarry")]
        == 2
    )
    assert cost(
        lambda: stubs.bm.DeleteRepository(
            bm.DeleteRepositoryRequest(name=repo, request_id=request_id)
        )
    ) == {("set_if", "quarry"): 1}  # + its get
    assert counting_backend.inner.get(QUARRY_PARTITION, b"requests/" + request_id.encode())


def test_a_commit_whose_deadline_passes_just_after_the_branch_moved_is_answered_on_retry(
    suite, repo, stubs, monkeypatch
):
    """The caller's deadline runs out between the branch swap and the commit's record: the
    client hears DEADLINE_EXCEEDED, but the commit landed. What follows the swap (the
    retired token's drop, the request's DONE record) runs outside that deadline, so a retry
    with the same id is answered with that commit — it was REQUEST_IN_PROGRESS for the
    claim's lease, then NO_CHANGES — and no staging token is left behind."""
    import time

    from quarry.graveler.refs import RefManager
    from quarry.runtime import deadlines

    put(stubs, repo, "late/a")
    swap = RefManager.update_branch

    def swap_then_outlive_the_deadline(self, *args, **kwargs):
        result = swap(self, *args, **kwargs)
        call = deadlines.current()
        if kwargs.get("step") == "swap_branch" and call is not None and call.deadline:
            time.sleep(max(0.0, call.remaining() or 0.0) + 0.05)
        return result

    monkeypatch.setattr(RefManager, "update_branch", swap_then_outlive_the_deadline)
    request = cm.CommitRequest(repository=repo, branch="main", message="late", request_id=rid())
    with pytest.raises(grpc.RpcError) as late:
        stubs.cm.Commit(request, timeout=2.0)
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    monkeypatch.undo()
    # The client's retry (REQUEST_IN_PROGRESS while the first call's thread finishes): well
    # inside the claim's 30 s lease, the id was recorded, not left claimed.
    with suite.client(retry=RetryPolicy(budget=10.0, max_attempts=0)) as client:
        answered = client.commit(repo, "main", "late", request_id=request.request_id)
    assert answered.commit.id == log_ids(stubs, repo)[0]
    assert answered.commit.message == "late" and uncommitted(stubs, repo) == []


def test_a_branch_swap_whose_answer_is_lost_to_the_deadline_still_counts(
    suite, repo, stubs, monkeypatch
):
    """The swap's KV write lands but its answer comes after the caller's deadline (a remote
    KV store's latency): the commit moved the branch, so it must not be reported failed —
    its retry with the same id was answered NO_CHANGES. A branch write, once sent, runs to
    its own answer outside the caller's deadline (the last check is before it is sent)."""
    import time

    from quarry import errors
    from quarry.graveler.commits import Commits
    from quarry.kv.remote import RemoteStore
    from quarry.runtime import deadlines

    put(stubs, repo, "lost/a")
    armed = threading.Event()
    retire, set_if = Commits.retire, RemoteStore.set_if

    def retire_armed(self, *args, **kwargs):
        armed.set()
        try:
            return retire(self, *args, **kwargs)
        finally:
            armed.clear()

    def set_if_answer_lost(self, partition, key, value, predicate):
        result = set_if(self, partition, key, value, predicate)
        call = deadlines.current()
        if armed.is_set() and b"branch" in key and call is not None and call.deadline:
            time.sleep(max(0.0, call.remaining() or 0.0) + 0.05)
            raise errors.DeadlineExceeded("the write's answer came after the deadline")
        return result

    monkeypatch.setattr(Commits, "retire", retire_armed)
    monkeypatch.setattr(RemoteStore, "set_if", set_if_answer_lost)
    request = cm.CommitRequest(repository=repo, branch="main", message="lost", request_id=rid())
    with contextlib.suppress(grpc.RpcError):  # its deadline may pass: the answer is the retry's
        stubs.cm.Commit(request, timeout=2.0)
    monkeypatch.undo()
    with suite.client(retry=RetryPolicy(budget=10.0, max_attempts=0)) as client:
        answered = client.commit(repo, "main", "lost", request_id=request.request_id)
    assert answered.commit.id == log_ids(stubs, repo)[0] and answered.commit.message == "lost"
    assert uncommitted(stubs, repo) == []


def test_a_claim_whose_answer_is_lost_to_the_deadline_never_holds_the_id(
    suite, repo, stubs, monkeypatch
):
    """The request-id claim lands but its answer comes after the caller's deadline: the id
    stayed claimed for the whole lease (REQUEST_IN_PROGRESS for 30 s, nothing running).
    The claim, once sent, runs to its own answer; the retry runs at once."""
    import time

    from quarry import errors
    from quarry.kv.remote import RemoteStore
    from quarry.runtime import deadlines

    put(stubs, repo, "claimed/a")
    set_if = RemoteStore.set_if

    def set_if_answer_lost(self, partition, key, value, predicate):
        result = set_if(self, partition, key, value, predicate)
        call = deadlines.current()
        if key.startswith(b"requests/") and call is not None and call.deadline:
            time.sleep(max(0.0, call.remaining() or 0.0) + 0.05)
            raise errors.DeadlineExceeded("the claim's answer came after the deadline")
        return result

    monkeypatch.setattr(RemoteStore, "set_if", set_if_answer_lost)
    request = cm.CommitRequest(repository=repo, branch="main", message="c", request_id=rid())
    with contextlib.suppress(grpc.RpcError):
        stubs.cm.Commit(request, timeout=2.0)
    monkeypatch.undo()
    with suite.client(retry=RetryPolicy(budget=10.0, max_attempts=0)) as client:
        answered = client.commit(repo, "main", "c", request_id=request.request_id)
    assert answered.commit.id == log_ids(stubs, repo)[0]
