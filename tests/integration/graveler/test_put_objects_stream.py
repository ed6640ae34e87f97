"""PutObjects is all or nothing with respect to the caller's mistakes (issue 10, "never a
half-applied change"): a stream with any refused message stages nothing, whichever message
it is, and a valid stream is still staged batch by batch, within a bound on what the server
holds. Real servers on loopback (tests/support/suite.py)."""

from __future__ import annotations

import uuid

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import types_pb2
from support.suite import suite_fixture

MAX_ENTRIES = 50  # this suite's max_put_objects_stream_entries


suite = suite_fixture(max_put_objects_stream_entries=MAX_ENTRIES)


@pytest.fixture(scope="module")
def stub(suite):
    channel = grpc.insecure_channel(suite.targets["branch-manager"])
    yield bm_stub(channel)
    channel.close()


def bm_stub(channel):
    from quarry.v1 import branch_manager_pb2_grpc

    return branch_manager_pb2_grpc.BranchManagerStub(channel)


@pytest.fixture
def repo(stub, suite):
    name = f"r-{uuid.uuid4().hex[:10]}"
    stub.CreateRepository(
        bm.CreateRepositoryRequest(name=name, storage_namespace=suite.namespace(name))
    )
    stub.CreateBranch(bm.CreateBranchRequest(repository=name, name="dev", source_ref="main"))
    return name


def entry(path: str, **fields) -> types_pb2.Entry:
    fields.setdefault("physical_address", f"s3://b/{path}")
    fields.setdefault("size_bytes", 1)
    return types_pb2.Entry(path=path, **fields)


def message(repo: str = "", branch: str = "", paths=(), request_id: str = "", entries=()):
    return bm.PutObjectsRequest(
        repository=repo,
        branch=branch,
        entries=[*(entry(p) for p in paths), *entries],
        request_id=request_id,
    )


def reason_of(error: grpc.RpcError) -> str:
    for detail in rpc_status.from_call(error).details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason
    raise AssertionError(f"no ErrorInfo: {error.details()}")


def state(stub, repo: str) -> dict:
    """What a user observes of both branches: records and listings (staged included)."""
    out = {}
    for branch in ("main", "dev"):
        record = stub.GetBranch(bm.GetBranchRequest(repository=repo, name=branch)).branch
        listing = stub.ListObjects(bm.ListObjectsRequest(repository=repo, ref=branch))
        out[branch] = (
            record.SerializeToString(deterministic=True),
            [e.path for e in listing.entries],
        )
    return out


def first_ok(repo):
    return message(repo, "main", ["a/1", "a/2"])


REFUSED = {
    "another branch": (lambda r: [first_ok(r), message(r, "dev", ["b/1"])], "INVALID_ARGUMENT"),
    "another repository": (
        lambda r: [first_ok(r), message("other-repo", "main", ["b/1"])],
        "INVALID_ARGUMENT",
    ),
    "a path with NUL": (lambda r: [first_ok(r), message(paths=["ok", "bad\x00"])], "INVALID_PATH"),
    "an empty path": (lambda r: [first_ok(r), message(paths=[""])], "INVALID_PATH"),
    "a negative size": (
        lambda r: [first_ok(r), message(entries=[entry("neg", size_bytes=-1)])],
        "INVALID_ENTRY",
    ),
    "metadata too large": (
        lambda r: [first_ok(r), message(entries=[entry("m", metadata={"k": "v" * 9000})])],
        "INVALID_ENTRY",
    ),
    "an mtime out of range": (
        lambda r: [
            first_ok(r),
            message(entries=[entry("t", mtime={"seconds": 2**62})]),
        ],
        "INVALID_ENTRY",
    ),
    "a malformed request_id": (
        lambda r: [first_ok(r), message(paths=["c"], request_id="not-a-uuid")],
        "INVALID_REQUEST_ID",
    ),
    "one request_id on two different batches": (
        lambda r: [
            first_ok(r),
            message(paths=["c"], request_id=ID),
            message(paths=["d"], request_id=ID),
        ],
        "REQUEST_ID_REUSED",
    ),
    "too many entries": (
        lambda r: [
            message(r, "main", [f"x/{i}" for i in range(MAX_ENTRIES)]),
            message(paths=["y"]),
        ],
        "PUT_STREAM_TOO_LARGE",
    ),
}
ID = "7a0c1c4e-0d4f-4d55-9b0a-4b8f7c2f9e11"


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_refused_later_message_stages_nothing(stub, repo, case):
    """Before the fix the first message's entries stayed staged (the branch turned dirty
    and listed a/1, a/2) although the call failed."""
    build, reason = REFUSED[case]
    before = state(stub, repo)
    with pytest.raises(grpc.RpcError) as caught:
        stub.PutObjects(iter(build(repo)))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert reason_of(caught.value) == reason
    assert state(stub, repo) == before


def test_a_request_id_used_before_for_another_batch_refuses_the_whole_stream(stub, repo):
    used = str(uuid.uuid4())
    assert stub.PutObjects(iter([message(repo, "main", ["first"], request_id=used)])).count == 1
    before = state(stub, repo)
    with pytest.raises(grpc.RpcError) as caught:
        stub.PutObjects(
            iter([message(repo, "main", ["a/1"]), message(paths=["other"], request_id=used)])
        )
    assert reason_of(caught.value) == "REQUEST_ID_REUSED"
    assert state(stub, repo) == before


def test_a_valid_stream_is_staged_whole_and_request_ids_keep_their_meaning(stub, repo):
    ids = [str(uuid.uuid4()) for _ in range(2)]
    stream = [
        message(repo, "main", ["s/1", "s/2"], request_id=ids[0]),
        message(paths=["s/3"]),
        message(repo, "", ["s/4", "s/4"], request_id=ids[1]),  # same path twice: counts once
    ]
    assert stub.PutObjects(iter(stream)).count == 5 - 1
    listed = stub.ListObjects(bm.ListObjectsRequest(repository=repo, ref="main")).entries
    assert [e.path for e in listed] == ["s/1", "s/2", "s/3", "s/4"]
    # A replay (the client resends a broken stream): the messages with ids are answered from
    # the request log, the one without is staged again (idempotent by identity).
    assert stub.PutObjects(iter(stream)).count == 4
    # Within one stream a repeated message with the same id is a repeat, not a reuse.
    again = message(repo, "main", ["r/1"], request_id=str(uuid.uuid4()))
    assert stub.PutObjects(iter([again, again])).count == 2


def test_a_stream_at_the_bound_is_accepted(stub, repo):
    paths = [f"x/{i:03d}" for i in range(MAX_ENTRIES)]
    stream = [message(repo, "main", paths[:20]), message(paths=paths[20:])]
    assert stub.PutObjects(iter(stream)).count == MAX_ENTRIES
    listed = stub.ListObjects(
        bm.ListObjectsRequest(repository=repo, ref="main", page_size=1000)
    ).entries
    assert [e.path for e in listed] == paths
