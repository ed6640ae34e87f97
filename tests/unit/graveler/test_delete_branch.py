"""Deleting a branch (issue 23, item 11): the record goes through compare-and-delete
(RefManager.delete_branch). It must never delete a record it did not read: a seal (or any
branch update) landing between the read and the delete would otherwise leave the staging
token the seal installed in no record and in no cleanup queue — orphaned for good."""

from __future__ import annotations

import pytest

from quarry.graveler import errors as gerrors
from quarry.graveler.layout import CLEANUP_PARTITION, staging_partitions
from quarry.graveler.model import Entry
from quarry.graveler.retry import RetryPolicy


def queued_partitions(kv_store) -> set[bytes]:
    iterator = kv_store.scan(CLEANUP_PARTITION)
    try:
        return {item.key for item in iterator}
    finally:
        iterator.close()


def _entry(path: str) -> Entry:
    return Entry(path=path, physical_address=f"s3://b/{path}", checksum="c", size_bytes=1)


def test_a_seal_between_the_read_and_the_delete_orphans_no_token(graveler, repo, kv_store):
    graveler.create_branch(repo, "feature", "main")
    graveler.put_objects(repo, "feature", [_entry("a")])
    before = graveler.get_branch(repo, "feature")
    refs = graveler.refs
    real_delete_if = refs.delete_branch_if
    sealed: list = []

    def seal_first(repo_, name, predicate):
        # The race on purpose: after delete_branch read the record, a commit seals it.
        if not sealed:
            sealed.append(graveler.commits.seal(refs.get_repository(repo), name))
        return real_delete_if(repo_, name, predicate)

    refs.delete_branch_if = seal_first
    graveler.delete_branch(repo, "feature")

    [after_seal] = sealed
    assert after_seal.staging_token != before.staging_token  # the seal did land
    assert list(after_seal.sealed_tokens) == [before.staging_token]
    with pytest.raises(gerrors.BranchNotFound):
        graveler.get_branch(repo, "feature")
    # Every token the deleted record held is queued for the dropper: the one installed by
    # the seal too (a blind delete queued only those of the record it read first).
    queued = queued_partitions(kv_store)
    # (every shard of a sharded token)
    assert set(staging_partitions(after_seal.staging_token)) <= set(queued)
    assert set(staging_partitions(before.staging_token)) <= set(queued)


def test_a_branch_deleted_meanwhile_is_not_found(graveler, repo, kv_store):
    graveler.create_branch(repo, "feature", "main")
    refs = graveler.refs
    real_delete_if = refs.delete_branch_if

    def deleted_by_another(repo_, name, predicate):
        refs.delete_branch_if = real_delete_if
        real_delete_if(repo_, name, predicate)  # another caller's delete wins
        return real_delete_if(repo_, name, predicate)

    refs.delete_branch_if = deleted_by_another
    with pytest.raises(gerrors.BranchNotFound):
        graveler.delete_branch(repo, "feature")


def test_a_branch_that_keeps_changing_is_contended_and_kept(graveler, repo):
    graveler.create_branch(repo, "feature", "main")
    refs = graveler.refs
    real_delete_if = refs.delete_branch_if

    def always_moved(repo_, name, predicate):
        seen.append(name)
        refs.update_branch(
            repo_, name, lambda b: (setattr(b, "compacted_metarange_id", f"m{len(seen)}"), b)[1]
        )
        return real_delete_if(repo_, name, predicate)

    seen: list[str] = []
    refs.delete_branch_if = always_moved
    with pytest.raises(gerrors.BranchContended):
        refs.delete_branch(
            refs.get_repository(repo),
            "feature",
            policy=RetryPolicy(max_attempts=3, base_seconds=0, cap_seconds=0),
        )
    assert seen == ["feature"] * 3
    assert graveler.get_branch(repo, "feature").compacted_metarange_id == "m3"
