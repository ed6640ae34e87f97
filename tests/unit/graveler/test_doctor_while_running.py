"""`quarry doctor` reads an installation that keeps working: a commit between its read of a
branch and its read of the cleanup queue (the token retired and queued), or a branch made
meanwhile, is no finding. It raised `staging_token_in_use_but_queued_for_drop` -- a data-loss
alarm -- for a healthy suite (2 of 6 runs of a soak)."""

from __future__ import annotations

from quarry.blob.local import LocalBlobStore
from quarry.doctor import ORPHAN_STAGING_TOKEN, QUEUED_TOKEN_IN_USE, Doctor
from quarry.graveler.layout import CLEANUP_PARTITION, QUARRY_PARTITION, staging_partitions
from quarry.graveler.model import Entry


def entry(path: str) -> Entry:
    return Entry(path, f"s3://b/{path}", 1, "c")


class CommitDuring:
    """The KV store doctor reads, running `action` just before doctor's first read of
    `partition` (the moment a real commit could land)."""

    def __init__(self, store, partition: bytes, action) -> None:
        self._store = store
        self._partition = partition
        self._action = action

    def scan(self, partition, *args, **kwargs):
        if partition == self._partition and self._action is not None:
            action, self._action = self._action, None
            action()
        return self._store.scan(partition, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_a_commit_while_doctor_runs_is_no_finding(graveler, repo):
    graveler.put_objects(repo, "main", [entry(f"d/{i}") for i in range(5)])
    old = graveler.get_branch(repo, "main").staging_token

    def commit() -> None:
        graveler.commit(repo, "main", "landed while doctor ran", "ada")

    store = CommitDuring(graveler.kv, CLEANUP_PARTITION, commit)
    candidates = list(staging_partitions(old))
    report = Doctor(store, LocalBlobStore, lambda: candidates).check()
    assert graveler.get_branch(repo, "main").staging_token != old  # the commit did land
    kinds = [f.kind for f in report.findings]
    assert QUEUED_TOKEN_IN_USE not in kinds and ORPHAN_STAGING_TOKEN not in kinds, kinds


def test_a_token_really_queued_while_in_use_is_still_found(graveler, repo):
    """The recheck must not hide the real problem: a token a branch still uses, queued."""
    graveler.put_objects(repo, "main", [entry("d/0")])
    token = graveler.get_branch(repo, "main").staging_token
    graveler.staging.queue_drop(list(staging_partitions(token)))  # not ahead of a change
    try:
        report = Doctor(graveler.kv, LocalBlobStore).check()
        found = [f for f in report.findings if f.kind == QUEUED_TOKEN_IN_USE]
        assert len(found) == len(staging_partitions(token))  # one per shard partition
        assert all(token in f.message for f in found)
    finally:
        for partition in staging_partitions(token):
            graveler.kv.delete(CLEANUP_PARTITION, partition)


class OnScans:
    """The KV store doctor reads, running actions[(partition, n)] just before its n-th scan
    (from 1) of that partition."""

    def __init__(self, store, actions: dict) -> None:
        self._store = store
        self._actions = actions
        self._scans: dict[bytes, int] = {}

    def scan(self, partition, *args, **kwargs):
        self._scans[partition] = self._scans.get(partition, 0) + 1
        action = self._actions.pop((partition, self._scans[partition]), None)
        if action is not None:
            action()
        return self._store.scan(partition, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_a_repository_deleted_and_dropped_while_doctor_runs_is_no_finding(graveler, repo, tmp_path):
    """tester hAQ: a repository made after doctor read the repositories, its staging
    partition seen with items, then deleted and dropped (queue entry and all) before doctor
    read the queue again: a false orphan_staging_token (exit 1). A suspect is reported only
    if it still has items."""
    made: list[bytes] = []

    def create_and_stage() -> None:
        graveler.create_repository("late", str(tmp_path / "late"))
        graveler.put_objects("late", "main", [entry(f"d/{i}") for i in range(3)])
        made.extend(staging_partitions(graveler.get_branch("late", "main").staging_token))

    def delete_and_drop() -> None:
        graveler.delete_repository("late")
        for _ in range(3):
            graveler.staging.drop_queued(grace_seconds=0)

    # Made after doctor listed the repositories (its first queue read); deleted and dropped
    # after it found the partition with items, before it reads the branches again (its
    # second listing of the repositories).
    store = OnScans(
        graveler.kv,
        {(CLEANUP_PARTITION, 1): create_and_stage, (QUARRY_PARTITION, 2): delete_and_drop},
    )
    report = Doctor(store, LocalBlobStore, lambda: list(made)).check()
    assert made and all(not list(graveler.kv.scan(p)) for p in made)  # the drop did happen
    assert ORPHAN_STAGING_TOKEN not in [f.kind for f in report.findings], report.findings
