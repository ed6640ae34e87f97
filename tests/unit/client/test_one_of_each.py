"""The shared mechanisms the client, the CLI and the remote stores use: one batcher, one
RpcError → domain error context, one merge-strategy parser (issue 11, item 4)."""

from __future__ import annotations

import grpc
import pytest

from quarry import errors
from quarry.batching import batches
from quarry.graveler.model import MergeStrategy
from quarry.runtime.errors import domain_errors
from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import branch_manager_pb2_grpc, types_pb2

# ---- batches ---------------------------------------------------------------------------------


def test_batches_cut_by_count_and_keep_order():
    assert list(batches(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(batches([], 3)) == []


def test_batches_cut_by_bytes_before_an_item_that_would_not_fit():
    sizes = [4, 4, 3, 9, 1]
    assert list(batches(sizes, 100, max_bytes=10, size=lambda n: n)) == [[4, 4], [3], [9, 1]]


def test_an_item_over_the_byte_budget_gets_a_batch_of_its_own():
    assert list(batches([1, 50, 2], 100, max_bytes=10, size=lambda n: n)) == [[1], [50], [2]]


def test_batches_read_the_source_only_as_batches_are_taken():
    pulled = []

    def source():
        for n in range(10):
            pulled.append(n)
            yield n

    first = next(batches(source(), 3))
    assert first == [0, 1, 2]
    assert pulled == [0, 1, 2, 3]  # the fourth item closed the first batch


def test_batches_refuse_a_non_positive_count():
    with pytest.raises(ValueError):
        list(batches([1], 0))


# ---- domain_errors -------------------------------------------------------------------------


def test_domain_errors_rebuild_the_servers_exception(fake):
    fake.script.fail_always(
        "GetBranch", errors.NotFound("no such branch", metadata={"branch": "b"})
    )
    with grpc.insecure_channel(fake.target) as channel:
        stub = branch_manager_pb2_grpc.BranchManagerStub(channel)
        with pytest.raises(errors.NotFound) as caught, domain_errors():
            stub.GetBranch(bm.GetBranchRequest(repository="repo", name="b"), timeout=5)
    assert caught.value.metadata == {"branch": "b"}
    assert caught.value.code == grpc.StatusCode.NOT_FOUND


def test_domain_errors_prefer_the_callers_own_exception(fake):
    fake.script.fail_always("GetBranch", errors.Unavailable("restarting"))
    mine = KeyError("the caller's iterable failed")
    with grpc.insecure_channel(fake.target) as channel:
        stub = branch_manager_pb2_grpc.BranchManagerStub(channel)
        with pytest.raises(KeyError) as caught, domain_errors(lambda: mine):
            stub.GetBranch(bm.GetBranchRequest(repository="repo", name="b"), timeout=5)
    assert caught.value is mine


def test_domain_errors_leave_other_exceptions_alone():
    with pytest.raises(ZeroDivisionError), domain_errors():
        1 / 0  # noqa: B018


# ---- MergeStrategy.parse ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, MergeStrategy.DEFAULT),
        ("", MergeStrategy.DEFAULT),
        ("default", MergeStrategy.DEFAULT),
        ("MERGE_STRATEGY_UNSPECIFIED", MergeStrategy.DEFAULT),
        ("source-wins", MergeStrategy.SOURCE_WINS),
        ("source_wins", MergeStrategy.SOURCE_WINS),
        ("SOURCE_WINS", MergeStrategy.SOURCE_WINS),
        ("MERGE_STRATEGY_SOURCE_WINS", MergeStrategy.SOURCE_WINS),
        ("dest-wins", MergeStrategy.DEST_WINS),
        (types_pb2.MERGE_STRATEGY_DEST_WINS, MergeStrategy.DEST_WINS),
        (MergeStrategy.SOURCE_WINS, MergeStrategy.SOURCE_WINS),
    ],
)
def test_merge_strategy_spellings(given, expected):
    assert MergeStrategy.parse(given) is expected


@pytest.mark.parametrize("given", ["theirs", "MERGE_STRATEGY_THEIRS", 9, -1])
def test_unknown_merge_strategies_are_refused(given):
    with pytest.raises(ValueError, match="unknown merge strategy"):
        MergeStrategy.parse(given)


def test_the_client_sends_an_unknown_strategy_number_for_the_server_to_judge(fake, client):
    """A newer server may know strategies this build does not: numbers pass through."""
    client.merge("repo", "feature", "main", strategy=7)
    client.merge("repo", "feature", "main", strategy="dest_wins")
    sent = [request.strategy for request in fake.script.requests["Merge"]]
    assert sent == [7, types_pb2.MERGE_STRATEGY_DEST_WINS]
    with pytest.raises(ValueError):
        client.merge("repo", "feature", "main", strategy="theirs")
