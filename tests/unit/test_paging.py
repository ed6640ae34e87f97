"""PageBudget (quarry.paging): pages end by item count or by encoded response size, never
before their first item; encoded_size is what an item adds to the real response."""

import pytest

from quarry.convert import change_to_proto, entry_to_proto
from quarry.graveler.model import Change, ChangeType, Entry, RangeInfo
from quarry.paging import ELEMENT_OVERHEAD_BYTES, PAGE_TOKEN_RESERVE_BYTES, PageBudget, encoded_size
from quarry.v1 import branch_manager_pb2, committer_pb2, range_writer_pb2, types_pb2


def entry(i: int, metadata_bytes: int = 0) -> Entry:
    return Entry(
        f"data/{i:05d}.parquet",
        f"s3://b/{i}",
        10,
        "c",
        1_700_000_000_000_000,
        "application/x-parquet",
        {"k": "v" * metadata_bytes} if metadata_bytes else {},
    )


def take(budget: PageBudget, items) -> list:
    page = []
    for item in items:
        if not budget.admit(item):
            break
        page.append(item)
    return page


def test_page_ends_at_the_item_count():
    budget = PageBudget(3, 10**9, size_of=lambda _: 1)
    assert take(budget, range(10)) == [0, 1, 2]
    assert (budget.items, budget.bytes) == (3, 3)


def test_page_ends_before_the_item_that_would_pass_the_byte_limit():
    budget = PageBudget(100, 10, size_of=lambda item: item)
    assert take(budget, [4, 4, 2, 1]) == [4, 4, 2]  # exactly at the limit is allowed
    budget = PageBudget(100, 10, size_of=lambda item: item)
    assert take(budget, [4, 4, 3, 1]) == [4, 4]
    assert budget.bytes == 8


def test_first_item_is_admitted_even_when_larger_than_the_limit():
    budget = PageBudget(100, 10, size_of=lambda item: item)
    assert take(budget, [50, 1]) == [50]  # progress, and alone on its page
    budget.reset()
    assert take(budget, [1, 50]) == [1]


def test_budget_refuses_an_empty_page():
    with pytest.raises(ValueError):
        PageBudget(0, 10)
    with pytest.raises(ValueError):
        PageBudget(10, 0)


def test_encoded_size_bounds_the_real_response_tightly():
    entries = [entry(i, metadata_bytes=100 * i) for i in range(50)]
    changes = [Change(ChangeType.ADDED, e.path, e) for e in entries[:25]] + [
        Change(ChangeType.REMOVED, e.path) for e in entries[25:]
    ]
    prefixes = [f"dir-{i}/" for i in range(20)]
    commits = [
        types_pb2.Commit(id="c" * 64, message="m" * (i * 300), metadata={"a": "b"})
        for i in range(10)
    ]
    ranges = [RangeInfo(f"{i:064x}", f"a{i}", f"b{i}", 7, 1000) for i in range(30)]
    cases = [
        (
            branch_manager_pb2.ListObjectsResponse(
                entries=[entry_to_proto(e) for e in entries], common_prefixes=prefixes
            ),
            [*entries, *prefixes],
        ),
        (committer_pb2.DiffResponse(changes=[change_to_proto(c) for c in changes]), changes),
        (committer_pb2.LogResponse(commits=commits), commits),
        (
            range_writer_pb2.GetMetaRangeResponse(
                ranges=[
                    types_pb2.RangeInfo(
                        id=r.id,
                        min_key=r.min_key,
                        max_key=r.max_key,
                        count=r.count,
                        size_bytes=r.size_bytes,
                    )
                    for r in ranges
                ]
            ),
            ranges,
        ),
    ]
    for response, items in cases:
        estimated = sum(encoded_size(item) for item in items)
        actual = response.ByteSize()
        # Never under (the page could pass the limit), at most the element overhead over.
        assert actual <= estimated <= actual + ELEMENT_OVERHEAD_BYTES * len(items), response


def test_encoded_size_refuses_what_it_cannot_measure():
    with pytest.raises(TypeError):
        encoded_size(object())


def test_response_budget_keeps_room_for_the_page_token():
    budget = PageBudget.for_response(10, PAGE_TOKEN_RESERVE_BYTES + 100)
    assert budget.max_bytes == 100
    # A limit below the reserve still lets a page hold its one item.
    assert PageBudget.for_response(10, 10).max_bytes == 1
