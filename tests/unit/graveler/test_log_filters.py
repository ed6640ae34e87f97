"""Log filtered by the paths a commit changed and by time (lakectl log --objects /
--prefixes / --since): which commits match, against their first parent, and that a
filtered walk answers in bounded pages that together hold exactly the matches."""

from __future__ import annotations

import pytest

from quarry.graveler import errors as gerrors
from quarry.graveler import reads as reads_module
from support.histories import put_commit


def messages(g, repo, ref="main", **filters) -> list[str]:
    found, token = [], ""
    while True:
        page, token = g.log(repo, ref, page_token=token, **filters)
        found += [c.message for c in page]
        if not token:
            return found


@pytest.fixture
def history(graveler, repo):
    g = graveler
    put_commit(g, repo, "main", {"tables/a/1": "1", "tables/ab/1": "1"}, "both tables")
    put_commit(g, repo, "main", {"tables/ab/1": "2"}, "ab only")
    put_commit(g, repo, "main", {"notes.txt": "1"}, "notes")
    g.create_branch(repo, "side", "main")
    put_commit(g, repo, "side", {"tables/a/2": "1"}, "a on side")
    put_commit(g, repo, "main", {"tables/a/1": None}, "drop a/1")
    g.merge(repo, "side", "main", message="merge side")
    return g, repo


def test_prefixes_and_objects_keep_the_commits_that_changed_them(history):
    g, repo = history
    everything = messages(g, repo)
    assert len(everything) == 7  # notes and the initial commit too

    def only(*kept: str) -> list[str]:
        """`kept`, in the unfiltered log's order (commits of one generation made within
        the clock's resolution are ordered by id)."""
        return [m for m in everything if m in kept]

    assert messages(g, repo, prefixes=["tables/a/"]) == only(
        "merge side",  # against its first parent (main): it brought tables/a/2
        "drop a/1",
        "a on side",
        "both tables",
    )
    assert messages(g, repo, prefixes=["tables/a"]) == only(  # a text prefix: ab/ too
        "merge side", "drop a/1", "a on side", "ab only", "both tables"
    )
    # An object is that path exactly: never tables/a/10, nor tables/ab/1 for tables/a.
    assert messages(g, repo, objects=["tables/a/1"]) == only("drop a/1", "both tables")
    assert messages(g, repo, objects=["tables/a"]) == []
    assert messages(g, repo, objects=["notes.txt", "tables/ab/1"]) == only(
        "notes", "ab only", "both tables"
    )
    assert messages(g, repo, prefixes=["nothing/"]) == []


def test_since_keeps_the_commits_made_at_or_after_it(history):
    g, repo = history
    commits, _ = g.log(repo, "main")
    times = [c.creation_time.ToNanoseconds() / 1e9 for c in commits]
    cut = sorted(times)[len(times) // 2]
    kept = messages(g, repo, since=cut)
    assert kept == [c.message for c, t in zip(commits, times, strict=True) if t >= cut]
    assert messages(g, repo, since=max(times) + 1) == []


def test_a_filtered_walk_answers_in_bounded_pages_that_hold_every_match(history, monkeypatch):
    g, repo = history
    expected = messages(g, repo, prefixes=["tables/"])
    monkeypatch.setattr(reads_module, "LOG_SCAN_PER_PAGE", 2)
    pages, token = [], ""
    while True:
        page, token = g.log(repo, "main", page_token=token, prefixes=["tables/"])
        pages.append(page)
        if not token:
            break
    assert len(pages) > 2 and all(len(page) <= 2 for page in pages)
    assert [c.message for page in pages for c in page] == expected


def test_bad_filters_are_refused(history):
    g, repo = history
    with pytest.raises(gerrors.InvalidPath):
        g.log(repo, "main", prefixes=[""])
    with pytest.raises(gerrors.InvalidPath):
        g.log(repo, "main", objects=[f"p{i}" for i in range(101)])
