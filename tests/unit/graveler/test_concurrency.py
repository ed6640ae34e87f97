"""Writers, readers and committers on one branch, in-process (the integration suite runs
the same scenario against real servers over gRPC)."""

import contextlib

from quarry.graveler import errors as gerrors
from quarry.graveler.model import Entry
from quarry.graveler.staging import Dropper
from support.hammer import hammer


def test_no_acknowledged_write_is_lost_and_no_stale_read(graveler, repo):
    def put(path, version):
        graveler.put_objects(
            repo, "main", [Entry(path, f"addr/{path}/{version}", version, f"v{version}")]
        )

    def read(path):
        try:
            return int(graveler.stat_object(repo, "main", path).checksum[1:])
        except gerrors.ObjectNotFound:
            return None

    def commit():
        try:
            graveler.commit(repo, "main", "hammer")
            return True
        except gerrors.NoChanges:
            return False

    # Retired tokens are deleted at once (no grace period): a reader holding a stale
    # branch record must notice through its validation read.
    dropper = Dropper(graveler.staging, interval_seconds=0.005, grace_seconds=0).start()
    try:
        result = hammer(
            put,
            read,
            commit,
            writers=4,
            readers=3,
            committers=2,
            retryable=(gerrors.BranchContended,),
            min_writes=300,
            min_reads=150,
            min_commits=5,
        )
    finally:
        dropper.stop()
    assert not result.errors, result.errors[:5]
    assert not result.stale_reads, result.stale_reads[:5]
    for path, version in result.acked.items():
        assert read(path) == version, path
    with contextlib.suppress(gerrors.NoChanges):
        graveler.commit(repo, "main", "final")
    for path, version in result.acked.items():
        entry = graveler.stat_object(repo, "main@", path)
        assert entry.checksum == f"v{version}", path
    branch = graveler.get_branch(repo, "main")
    assert list(branch.sealed_tokens) == []
