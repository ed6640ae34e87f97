"""A flow that changes refs must never act on a dead repository instance (issue 10, "no
acknowledged change is ever lost"): a process whose cached repository record (RefManager's
REPOSITORY_TTL_SECONDS) still names an instance deleted and re-created under the same name
acts on the new one. Two cores on one store stand for two processes (e.g. branch-manager
and committer); the dead instance's records are still there, as they are until the dropper's
grace period has passed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from quarry.graveler import errors as gerrors
from quarry.graveler.graveler import Graveler
from quarry.graveler.model import Entry
from quarry.graveler.refs import RefManager
from quarry.v1 import types_pb2


def entry(path: str, checksum: str = "c") -> Entry:
    return Entry(path, f"s3://b/{path}/{checksum}", 1, checksum)


def paths(g: Graveler, repo: str, ref: str) -> list[str]:
    return [e.path for e in g.list_objects(repo, ref)[0]]


@dataclass(frozen=True)
class Case:
    prepare: Callable[[Graveler, str], object]  # in the new instance, through a fresh core
    act: Callable[[Graveler, str, object], object]  # through the stale core: its result
    check: Callable[[Graveler, str, object, object], None]  # (prepared, result), seen fresh


def _committed(g: Graveler, repo: str, *names: str) -> list[str]:
    ids = []
    for name in names:
        g.put_objects(repo, "main", [entry(name)])
        ids.append(g.commit(repo, "main", name).commit.id)
    return ids


def _source_branch(g: Graveler, repo: str) -> str:
    g.create_branch(repo, "dev", "main")
    g.put_objects(repo, "dev", [entry("picked")])
    return g.commit(repo, "dev", "pick me").commit.id


def _stage_new(g: Graveler, repo: str) -> None:
    g.put_objects(repo, "main", [entry("new")])


def _nothing(g: Graveler, repo: str) -> None:
    return None


def _main_lists(expected: list[str]) -> Callable[[Graveler, str, object, object], None]:
    def check(g: Graveler, repo: str, prepared: object, result: object) -> None:
        assert paths(g, repo, "main") == expected

    return check


def _check_commit(g, repo, prepared, outcome):
    assert paths(g, repo, outcome.commit.id) == ["new"]
    assert g.get_branch(repo, "main").commit_id == outcome.commit.id


def _check_compact(g, repo, prepared, result):
    compacted, tokens = result
    assert tokens == 1
    assert g.get_branch(repo, "main").compacted_metarange_id == compacted


def _check_reset(g, repo, ids, result):
    assert g.get_branch(repo, "main").commit_id == ids[0]


def _check_branch_created(g, repo, prepared, result):
    assert g.get_branch(repo, "feature").commit_id == g.get_branch(repo, "main").commit_id


def _check_branch_deleted(g, repo, prepared, result):
    with pytest.raises(gerrors.BranchNotFound):
        g.get_branch(repo, "gone")


def _check_tag_created(g, repo, prepared, result):
    assert g.get_tag(repo, "v1").commit_id == g.get_branch(repo, "main").commit_id


def _check_tag_deleted(g, repo, prepared, result):
    with pytest.raises(gerrors.TagNotFound):
        g.get_tag(repo, "v0")


def _check_gc_rules(g, repo, prepared, result):
    assert g.get_gc_rules(repo).default_retention_days == 7


RULES = types_pb2.GarbageCollectionRules(default_retention_days=7)

CASES = {
    "commit": Case(_stage_new, lambda s, r, _: s.commit(r, "main", "the write"), _check_commit),
    "compact": Case(_stage_new, lambda s, r, _: s.compact(r, "main"), _check_compact),
    "merge": Case(
        _source_branch, lambda s, r, _: s.merge(r, "dev", "main"), _main_lists(["picked"])
    ),
    "revert": Case(
        lambda g, r: _committed(g, r, "reverted"),
        lambda s, r, _: s.revert(r, "main", "main"),
        _main_lists([]),
    ),
    "cherry-pick": Case(
        _source_branch, lambda s, r, _: s.cherry_pick(r, "main", "dev"), _main_lists(["picked"])
    ),
    "reset": Case(
        lambda g, r: _committed(g, r, "one", "two"),
        lambda s, r, ids: s.reset_branch(r, "main", ids[0]),
        _check_reset,
    ),
    "create branch": Case(
        _nothing, lambda s, r, _: s.create_branch(r, "feature", "main"), _check_branch_created
    ),
    "delete branch": Case(
        lambda g, r: g.create_branch(r, "gone", "main"),
        lambda s, r, _: s.delete_branch(r, "gone"),
        _check_branch_deleted,
    ),
    "create tag": Case(_nothing, lambda s, r, _: s.create_tag(r, "v1", "main"), _check_tag_created),
    "delete tag": Case(
        lambda g, r: g.create_tag(r, "v0", "main"),
        lambda s, r, _: s.delete_tag(r, "v0"),
        _check_tag_deleted,
    ),
    "discard": Case(_stage_new, lambda s, r, _: s.discard_changes(r, "main"), _main_lists([])),
    "delete objects": Case(
        lambda g, r: _committed(g, r, "doomed"),
        lambda s, r, _: s.delete_objects(r, "main", ["doomed"]),
        _main_lists([]),
    ),
    "gc rules": Case(_nothing, lambda s, r, _: s.set_gc_rules(r, RULES), _check_gc_rules),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_stale_repository_record_never_acts_on_the_dead_instance(
    graveler, repo, tmp_path, monkeypatch, name
):
    case = CASES[name]
    # However slow the machine, every step below runs within the cache window.
    monkeypatch.setattr(RefManager, "REPOSITORY_TTL_SECONDS", 600.0)
    # The dead instance holds what a stale flow could act on: branches and a tag of the
    # same names, and a staged write on main.
    graveler.create_branch(repo, "gone", "main")
    graveler.create_tag(repo, "v0", "main")
    graveler.put_objects(repo, "main", [entry("old")])
    stale = Graveler(graveler.kv, graveler.committed, graveler.range_writer)
    stale.get_branch(repo, "main")  # caches the repository record
    old = stale.refs.get_repository(repo)

    graveler.delete_repository(repo)
    graveler.create_repository(repo, str(tmp_path / "again"))
    assert graveler.get_repository(repo).instance_id != old.instance_id
    prepared = case.prepare(graveler, repo)
    result = case.act(stale, repo, prepared)
    case.check(graveler, repo, prepared, result)
