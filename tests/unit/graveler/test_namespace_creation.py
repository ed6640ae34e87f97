"""Creation of repositories in overlapping namespaces while another creation is in flight:
the announcement (`quarry`/`creating/<instance>`) makes them see each other before either
is visible; an announcement older than CREATION_TTL_SECONDS counts as interrupted."""

from __future__ import annotations

import time

import pytest

from quarry import errors
from quarry.blob.ownership import MARKER_KEY, NamespaceInUse, parse_marker
from quarry.graveler import repositories as graveler_module
from quarry.graveler.refs import Repository


def announce(graveler, name: str, namespace: str, started: float) -> Repository:
    repo = Repository(name, namespace, "main", f"{name:0<32}"[:32], 0)
    graveler.refs.add_creation(repo, started)
    return repo


def test_a_namespace_around_or_inside_one_being_created_is_in_use(graveler, tmp_path):
    announce(graveler, "inflight", f"{tmp_path}/lake/inner", time.time())
    for namespace in (f"{tmp_path}/lake", f"{tmp_path}/lake/inner/deeper", str(tmp_path)):
        with pytest.raises(NamespaceInUse) as caught:
            graveler.create_repository("other", namespace)
        assert caught.value.metadata["other_repository"] == "inflight"
    assert not (tmp_path / "lake" / "_quarry").exists()  # refused before any claim
    # The same namespace is settled by the marker, a sibling is unrelated.
    graveler.create_repository("sibling", f"{tmp_path}/lake/inner-2")


def test_an_interrupted_creation_stops_blocking_after_its_ttl(graveler, tmp_path):
    announce(
        graveler,
        "crashed",
        f"{tmp_path}/lake/inner",
        time.time() - graveler_module.CREATION_TTL_SECONDS - 1,
    )
    graveler.create_repository("other", f"{tmp_path}/lake")


def test_announcements_are_removed_after_success_and_failure(graveler, tmp_path):
    graveler.create_repository("one", str(tmp_path / "one"))
    with pytest.raises(NamespaceInUse):
        graveler.create_repository("two", str(tmp_path / "one" / "in"))
    assert graveler.refs.list_creations() == []


def test_a_creation_slower_than_half_the_ttl_never_becomes_visible(graveler, tmp_path, monkeypatch):
    calls = iter(range(1000))
    # The first reading (the announcement) is now; every later one is far later.
    monkeypatch.setattr(
        graveler_module,
        "wall_clock",
        lambda: time.time() + (0 if next(calls) == 0 else graveler_module.CREATION_TTL_SECONDS),
    )
    with pytest.raises(Exception) as caught:
        graveler.create_repository("slow", str(tmp_path / "slow"))
    assert caught.value.reason == "ABORTED"
    monkeypatch.undo()
    assert [r.name for r in graveler.list_repositories()[0]] == []
    graveler.create_repository("fast", str(tmp_path / "slow"))  # its namespace is reusable


def test_a_retry_after_the_claims_answer_was_lost_succeeds(
    graveler, committed, tmp_path, monkeypatch
):
    real = committed.claim_namespace

    def claim_then_lose_the_answer(*args, **kwargs):
        real(*args, **kwargs)  # the marker is written...
        raise errors.Unavailable("connection reset")  # ...but the answer never arrives

    monkeypatch.setattr(committed, "claim_namespace", claim_then_lose_the_answer)
    with pytest.raises(errors.Unavailable):
        graveler.create_repository("lake", str(tmp_path / "lake"))
    assert (tmp_path / "lake" / MARKER_KEY).exists()
    monkeypatch.undo()
    repo = graveler.create_repository("lake", str(tmp_path / "lake"))  # the client's retry
    assert parse_marker((tmp_path / "lake" / MARKER_KEY).read_bytes()).owns(
        "lake", repo.instance_id
    )


def test_a_symlink_into_another_namespace_cannot_make_a_repository_inside_it(graveler, tmp_path):
    """The attack: a link into repository A's namespace, then a new subdirectory through
    it, looks like a fresh namespace to a lexical check but is a folder of A's."""
    owner = graveler.create_repository("owner", str(tmp_path / "lake" / "a"))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "link").symlink_to(tmp_path / "lake" / "a")
    for namespace in (
        f"{tmp_path}/elsewhere/link/sub",
        f"file://{tmp_path}/elsewhere/link/sub",
        f"{tmp_path}/elsewhere/link",  # the same directory
    ):
        with pytest.raises(NamespaceInUse) as caught:
            graveler.create_repository("intruder", namespace)
        assert caught.value.metadata["other_repository"] == "owner"
    assert not (tmp_path / "lake" / "a" / "sub").exists()  # refused before any claim
    # A link to the directory AROUND a namespace: the new one would contain it.
    (tmp_path / "elsewhere" / "up").symlink_to(tmp_path / "lake")
    with pytest.raises(NamespaceInUse):
        graveler.create_repository("intruder", f"{tmp_path}/elsewhere/up")
    assert [r.name for r in graveler.list_repositories()[0]] == [owner.name]


def test_a_namespace_is_recorded_by_its_real_path(graveler, tmp_path):
    """A link re-pointed after the creation never moves the repository's namespace."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    repo = graveler.create_repository("linked", f"{tmp_path}/link/ns")
    assert repo.storage_namespace == f"{tmp_path}/real/ns"
    assert (tmp_path / "real" / "ns" / MARKER_KEY).exists()
    uri = graveler.create_repository("linked-uri", f"file://{tmp_path}/link/ns2")
    assert uri.storage_namespace == f"file://{tmp_path}/real/ns2"
