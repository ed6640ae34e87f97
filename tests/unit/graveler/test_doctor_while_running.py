"""`quarry doctor` reads an installation that keeps working: a commit between its read of a
branch and its read of the cleanup queue (the token retired and queued), or a branch made
meanwhile, is no finding. It raised `staging_token_in_use_but_queued_for_drop` -- a data-loss
alarm -- for a healthy suite (2 of 6 runs of a soak)."""

from __future__ import annotations

from quarry.blob.local import LocalBlobStore
from quarry.doctor import ORPHAN_STAGING_TOKEN, QUEUED_TOKEN_IN_USE, Doctor
from quarry.graveler.layout import CLEANUP_PARTITION, staging_partitions
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
