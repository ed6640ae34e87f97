"""Every paged listing of the core ends by encoded size as well as by count: with a small
max_response_bytes and a large page_size, each page's real response stays under the limit,
holds at least one item, and following the tokens yields every item once, in order."""

import pytest

from quarry.convert import change_to_proto, entry_to_proto
from quarry.graveler.graveler import Graveler
from quarry.graveler.model import Entry
from quarry.paging import PAGE_TOKEN_RESERVE_BYTES
from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import committer_pb2 as cm

LIMIT = 20_000


@pytest.fixture
def small(kv_store, committed):
    """A core whose responses are cut at LIMIT bytes."""
    return Graveler(kv_store, committed, committed, max_response_bytes=LIMIT)


def follow(call):
    """Every page of a listing: call(page_token) -> (response proto, next token)."""
    pages, token = [], ""
    while True:
        response, token = call(token)
        pages.append(response)
        if not token:
            return pages
        assert len(pages) < 1000, "paging does not progress"


def assert_bounded(pages, items_of):
    assert len(pages) > 1, "the byte limit should have cut the listing"
    for page in pages:
        assert page.ByteSize() <= LIMIT
        assert len(items_of(page)) >= 1


def big_entry(i: int) -> Entry:
    return Entry(
        f"data/{i:04d}.parquet", f"s3://bucket/{i}", 10, f"sum{i}", metadata={"k": "x" * 1000}
    )


def test_objects_and_uncommitted_changes_are_paged_by_size(small, repo):
    small.put_objects(repo, "main", [big_entry(i) for i in range(60)])
    expected = [f"data/{i:04d}.parquet" for i in range(60)]

    def list_page(token):
        entries, prefixes, nxt = small.list_objects(
            repo, "main", page_size=10_000, page_token=token
        )
        return bm.ListObjectsResponse(
            entries=[entry_to_proto(e) for e in entries],
            common_prefixes=prefixes,
            next_page_token=nxt,
        ), nxt

    pages = follow(list_page)
    assert_bounded(pages, lambda p: p.entries)
    assert [e.path for p in pages for e in p.entries] == expected

    def uncommitted_page(token):
        changes, nxt = small.diff_uncommitted(repo, "main", page_size=10_000, page_token=token)
        return bm.DiffUncommittedResponse(
            changes=[change_to_proto(c) for c in changes], next_page_token=nxt
        ), nxt

    pages = follow(uncommitted_page)
    assert_bounded(pages, lambda p: p.changes)
    assert [c.path for p in pages for c in p.changes] == expected

    first = small.get_commit(repo, "main").id
    small.commit(repo, "main", "load")

    def diff_page(token):
        changes, nxt = small.diff(repo, first, "main", page_size=10_000, page_token=token)
        return cm.DiffResponse(
            changes=[change_to_proto(c) for c in changes], next_page_token=nxt
        ), nxt

    pages = follow(diff_page)
    assert_bounded(pages, lambda p: p.changes)
    assert [c.path for p in pages for c in p.changes] == expected


def test_common_prefixes_count_toward_the_size(small, repo):
    # 40 directories with ~900-byte names: 36 KB of prefixes alone.
    dirs = [f"{i:03d}" + "d" * 900 for i in range(40)]
    small.put_objects(repo, "main", [Entry(f"{d}/file", "s3://b/x", 1) for d in dirs])

    def page(token):
        entries, prefixes, nxt = small.list_objects(
            repo, "main", delimiter="/", page_size=10_000, page_token=token
        )
        return bm.ListObjectsResponse(
            entries=[entry_to_proto(e) for e in entries],
            common_prefixes=prefixes,
            next_page_token=nxt,
        ), nxt

    pages = follow(page)
    assert_bounded(pages, lambda p: p.common_prefixes)
    assert [c for p in pages for c in p.common_prefixes] == [d + "/" for d in dirs]


def test_log_is_paged_by_size_and_walks_each_commit_once(small, repo):
    for i in range(12):
        small.put_objects(repo, "main", [Entry(f"f{i}", "s3://b/x", i + 1)])
        small.commit(repo, "main", f"{i:02d} " + "m" * 6000)
    # A merge: two parents, so the walk's frontier has more than one commit to resume.
    small.create_branch(repo, "side", "main~3")
    small.put_objects(repo, "side", [Entry("side-file", "s3://b/y", 1)])
    small.commit(repo, "side", "side " + "s" * 6000)
    small.merge(repo, "side", "main", message="merge " + "g" * 6000)
    expected = [
        c.id
        for c in Graveler(small.kv, small.committed, small.range_writer).log(
            repo, "main", page_size=1000
        )[0]
    ]

    def page(token):
        commits, nxt = small.log(repo, "main", page_size=10_000, page_token=token)
        return cm.LogResponse(commits=commits, next_page_token=nxt), nxt

    pages = follow(page)
    assert_bounded(pages, lambda p: p.commits)
    walked = [c.id for p in pages for c in p.commits]
    assert walked == expected and len(set(walked)) == len(walked) == 15


def test_branches_tags_and_repositories_are_paged_by_size(kv_store, committed, tmp_path):
    # 2,000 bytes for the items once the page token's reserve is kept.
    tiny = Graveler(
        kv_store, committed, committed, max_response_bytes=PAGE_TOKEN_RESERVE_BYTES + 2_000
    )
    names = []
    for i in range(4):
        name = f"repo-{i}-" + "r" * 50
        tiny.create_repository(
            name, str(tmp_path / ("n" * 200) / ("n" * 200) / ("n" * 200) / str(i))
        )
        names.append(name)
    repo = names[0]
    branches = sorted(["main"] + [f"b{i:02d}" + "b" * 200 for i in range(20)])
    tags = [f"t{i:02d}" + "t" * 200 for i in range(20)]
    for name in branches[:-1]:
        tiny.create_branch(repo, name, "main")
    for name in tags:
        tiny.create_tag(repo, name, "main")

    for listing, expected in (
        (lambda token: tiny.list_branches(repo, 10_000, token), branches),
        (lambda token: tiny.list_tags(repo, 10_000, token), tags),
        (lambda token: tiny.list_repositories(10_000, token), names),
    ):
        pages, token = [], ""
        while True:
            items, token = listing(token)
            pages.append(items)
            if not token:
                break
        # Cut by size: more than one page, but not one item per page.
        assert 1 < len(pages) < len(expected)
        for items in pages:
            assert items
            protos = [i.to_proto() if hasattr(i, "to_proto") else i for i in items]
            assert sum(p.ByteSize() + 3 for p in protos) <= 2_000
        assert [i.name for items in pages for i in items] == expected
