"""Staging tokens a branch change retires are queued BEFORE the change (queue_retiring_tokens)
and dropped only once the branch no longer references them. Queued after the change, a
commit whose process died (or lost the KV store) right after its swap left the retired
token's items in the KV store for good (a soak and a kill -9 run found one)."""

from __future__ import annotations

import pytest

from quarry.graveler import layout
from quarry.graveler import staging as staging_module
from quarry.graveler.layout import CLEANUP_PARTITION, staging_partitions
from quarry.graveler.model import Entry


def entry(path: str) -> Entry:
    return Entry(path, f"s3://b/{path}", 1, "c")


def items(graveler, token: str) -> int:
    return sum(len(list(graveler.kv.scan(p))) for p in staging_partitions(token))


def queued(graveler) -> set[bytes]:
    return {item.key for item in graveler.kv.scan(CLEANUP_PARTITION)}


class ProcessDied(BaseException):
    """What a kill -9 right after the swap leaves: nothing after it runs."""


def test_a_commit_that_dies_right_after_its_swap_leaves_no_orphan_token(graveler, repo):
    graveler.put_objects(repo, "main", [entry(f"d/{i}") for i in range(10)])
    old = graveler.get_branch(repo, "main").staging_token
    update_branch = graveler.refs.update_branch

    def swap_then_die(*args, **kwargs):
        done = update_branch(*args, **kwargs)
        if kwargs.get("step") == "swap_branch":
            raise ProcessDied()  # the branch moved; nothing after the swap runs
        return done

    graveler.refs.update_branch = swap_then_die
    with pytest.raises(ProcessDied):
        graveler.commit(repo, "main", "landed, then the process died", "ada")
    graveler.refs.update_branch = update_branch
    after = graveler.get_branch(repo, "main")
    assert old not in (after.staging_token, *after.sealed_tokens)  # the swap happened
    assert items(graveler, old) == 10
    graveler.staging.drop_queued(grace_seconds=0)
    assert items(graveler, old) == 0  # dropped: nothing left behind
    assert not queued(graveler)
    # The commit's changes are there, read from the commit.
    listed, _, _ = graveler.list_objects(repo, "main", page_size=100)
    assert len(listed) == 10


def test_a_token_queued_ahead_of_a_change_that_never_came_is_never_dropped(
    graveler, repo, monkeypatch
):
    """Safety rule: a swap that lost its race, or never ran, must not cost the branch its
    staged changes: the token it still references is kept, and the queue entry forgotten
    after RETIRING_EXPIRY_SECONDS."""
    graveler.put_objects(repo, "main", [entry(f"d/{i}") for i in range(5)])
    live = graveler.get_branch(repo, "main").staging_token
    partition = graveler.repo(repo).partition
    graveler.staging.queue_retiring_tokens([live], partition, "main")
    graveler.staging.drop_queued(grace_seconds=0)
    assert items(graveler, live) == 5  # still the branch's: kept
    assert queued(graveler) == set(staging_partitions(live))  # and still waiting
    # Nor is it a doctor finding: a token queued ahead of its branch's change is in use
    # until the change is made.
    from quarry.blob.local import LocalBlobStore
    from quarry.doctor import QUEUED_TOKEN_IN_USE, Doctor

    report = Doctor(graveler.kv, LocalBlobStore).check()
    assert QUEUED_TOKEN_IN_USE not in [f.kind for f in report.findings]
    monkeypatch.setattr(staging_module, "RETIRING_EXPIRY_SECONDS", 0)
    graveler.staging.drop_queued(grace_seconds=0)
    assert items(graveler, live) == 5
    assert not queued(graveler)  # forgotten: the change is not coming
    listed, _, _ = graveler.list_objects(repo, "main", page_size=100)
    assert len(listed) == 5


def _queued_ahead_on_a_clock(graveler, repo, monkeypatch) -> tuple[str, bytes, list[float]]:
    """main's token (one staged entry) queued ahead of a change of main, the staging
    manager on a clock the test moves (clock[0]): (token, repository partition, clock)."""
    graveler.put_objects(repo, "main", [entry("x")])
    live = graveler.get_branch(repo, "main").staging_token
    partition = graveler.repo(repo).partition
    clock = [1000.0]
    monkeypatch.setattr(graveler.staging, "_clock", lambda: clock[0])
    graveler.staging.queue_retiring_tokens([live], partition, "main")
    return live, partition, clock


def test_an_expired_record_queued_afresh_meanwhile_is_kept(graveler, repo, monkeypatch):
    """The dropper forgets an expired record only if it is still the one it read: a change
    about to retire the same token queues it afresh under the same key, and that record
    must stay, or the token is never dropped once the change retires it (tester hAE)."""
    live, partition, clock = _queued_ahead_on_a_clock(graveler, repo, monkeypatch)
    clock[0] += staging_module.RETIRING_EXPIRY_SECONDS + 1
    still_referenced = graveler.staging._still_referenced

    def queued_afresh_meanwhile(record):
        referenced = still_referenced(record)
        graveler.staging.queue_retiring_tokens([live], partition, "main")  # a commit, now
        return referenced

    monkeypatch.setattr(graveler.staging, "_still_referenced", queued_afresh_meanwhile)
    graveler.staging.drop_queued(grace_seconds=0)
    assert queued(graveler) == set(staging_partitions(live))  # the fresh record stayed


def test_a_branch_that_is_gone_references_nothing(graveler, repo):
    from quarry.graveler.layout import branch_key

    graveler.create_branch(repo, "gone", "main")
    graveler.put_objects(repo, "gone", [entry("x")])
    token = graveler.get_branch(repo, "gone").staging_token
    partition = graveler.repo(repo).partition
    graveler.staging.queue_retiring_tokens([token], partition, "gone")
    graveler.kv.delete(partition, branch_key("gone"))  # its record gone, nothing else
    graveler.staging.drop_queued(grace_seconds=0)
    assert items(graveler, token) == 0


@pytest.mark.parametrize("change", ["discard", "reset", "delete"])
def test_any_branch_change_that_dies_right_after_leaves_no_orphan_token(graveler, repo, change):
    """Discard, reset and branch deletion queue the tokens they retire ahead too (they
    queued them after: a process that died in between left an orphan)."""
    graveler.create_branch(repo, "work", "main")
    graveler.put_objects(repo, "work", [entry(f"w/{i}") for i in range(4)])
    old = graveler.get_branch(repo, "work").staging_token
    if change == "delete":
        real = graveler.refs.delete_branch

        def then_die(*args, **kwargs):
            real(*args, **kwargs)
            raise ProcessDied()

        graveler.refs.delete_branch = then_die
    else:
        real = graveler.refs.update_branch

        def then_die(*args, **kwargs):
            real(*args, **kwargs)
            raise ProcessDied()

        graveler.refs.update_branch = then_die
    with pytest.raises(ProcessDied):
        if change == "discard":
            graveler.discard_changes(repo, "work")
        elif change == "reset":
            graveler.reset_branch(repo, "work", "main", force=True)
        else:
            graveler.delete_branch(repo, "work")
    assert items(graveler, old) == 4
    graveler.staging.drop_queued(grace_seconds=0)
    assert items(graveler, old) == 0


def _partitions_of(graveler, repo_partition: bytes) -> int:
    return len(list(graveler.kv.scan(repo_partition)))


def test_a_repository_deletion_that_dies_right_after_leaves_nothing_behind(graveler, repo):
    """The branches' tokens are queued before the record goes (tester hAE); the instance,
    queued only after (tester hAJ), is found through its deleted-instance record by the
    dropper's pass over them, and a token a seal installed after the deletion listed the
    branches goes with it."""
    graveler.create_branch(repo, "work", "main")
    graveler.put_objects(repo, "work", [entry(f"w/{i}") for i in range(4)])
    listed = graveler.get_branch(repo, "work").staging_token
    instance = graveler.repo(repo).partition
    record_deleted = graveler.refs.record_deleted_instance

    def seal_then_record(repository):
        # A commit's seal lands between the listing and the deletion: a new token, staged.
        graveler.commits.seal(graveler.refs.get_repository(repo, fresh=True), "work")
        graveler.put_objects(repo, "work", [entry("late")])
        record_deleted(repository)

    graveler.refs.record_deleted_instance = seal_then_record
    real = graveler.refs.delete_repository_record

    def then_die(repository):
        real(repository)
        raise ProcessDied()

    graveler.refs.delete_repository_record = then_die
    with pytest.raises(ProcessDied):
        graveler.delete_repository(repo)
    branch = layout.decode_branch(
        instance, "work", graveler.kv.get(instance, layout.branch_key("work")).value
    )
    assert branch.staging_token != listed and items(graveler, branch.staging_token) == 1
    assert instance not in queued(graveler)
    # A dropper's first pass (at every start, then hourly) finds it, and drops it.
    dropper = staging_module.Dropper(graveler.staging, grace_seconds=0)
    dropper._drop_due()
    dropper._drop_due()
    assert _partitions_of(graveler, instance) == 0
    assert items(graveler, listed) == 0 and items(graveler, branch.staging_token) == 0
    assert not queued(graveler)
    assert graveler.staging.queue_dead_instances() == 0  # nothing left to find


def test_a_live_repository_is_never_queued_whatever_its_deletion_died_at(graveler, repo):
    """Safety rule (tester hAJ): while a repository record names an instance, its partition
    is never in the cleanup queue -- a dropper of an older build drops whatever is queued
    there without asking, and emptied a live repository whose deletion had died after
    queuing it. Not by the deletion (however far it got before dying), nor by the pass
    over deleted-instance records (one is written before the record goes)."""
    graveler.put_objects(repo, "main", [entry("kept")])
    instance = graveler.repo(repo).partition
    for step in ("record_deleted_instance", "delete_repository_record"):
        real = getattr(graveler.refs, step)

        def die(*args, **kwargs):
            raise ProcessDied()

        setattr(graveler.refs, step, die)
        with pytest.raises(ProcessDied):
            graveler.delete_repository(repo)
        setattr(graveler.refs, step, real)
        if step == "delete_repository_record":
            assert graveler.refs.is_deleted_instance(graveler.repo(repo).instance_id)
        assert instance not in queued(graveler), step
        assert graveler.staging.queue_dead_instances() == 0
        assert instance not in queued(graveler), step
    graveler.staging.drop_queued(grace_seconds=0)
    assert graveler.stat_object(repo, "main", "kept").path == "kept"


def test_a_repository_deletion_that_never_happened_keeps_everything(graveler, repo, monkeypatch):
    """Queued ahead of a deletion that died before the record went: the live instance's
    tokens are never dropped, and the queue entries are forgotten after expiry."""
    graveler.put_objects(repo, "main", [entry("kept")])
    instance = graveler.repo(repo).partition
    token = graveler.get_branch(repo, "main").staging_token
    real = graveler.refs.record_deleted_instance

    def die(*args, **kwargs):
        raise ProcessDied()

    graveler.refs.record_deleted_instance = die
    with pytest.raises(ProcessDied):
        graveler.delete_repository(repo)
    graveler.refs.record_deleted_instance = real
    graveler.staging.drop_queued(grace_seconds=0)
    assert _partitions_of(graveler, instance) > 0 and items(graveler, token) == 1
    monkeypatch.setattr(staging_module, "RETIRING_EXPIRY_SECONDS", 0)
    graveler.staging.drop_queued(grace_seconds=0)
    assert not queued(graveler)
    assert graveler.stat_object(repo, "main", "kept").path == "kept"


def test_a_deletion_that_lost_a_race_never_deletes_the_repository_made_again(
    graveler, repo, tmp_path
):
    """Safety rule (tester hAO): a deletion paused after reading the repository, while
    another deleted it and it was created again under its name, deletes nothing of the new
    instance (its record is compared-and-deleted by instance): NOT_FOUND, and the new
    repository, its branch and its staged object stay."""
    from quarry.graveler import errors as gerrors

    old = graveler.get_repository(repo)
    namespace = old.storage_namespace
    graveler.delete_repository(repo)
    graveler.create_repository(repo, namespace)
    graveler.put_objects(repo, "main", [entry("new")])
    new = graveler.refs.get_repository(repo, fresh=True)
    assert new.instance_id != old.instance_id
    with pytest.raises(gerrors.RepositoryNotFound):
        graveler.refs.delete_repository_record(old)  # the slow deletion's last step
    graveler.staging.queue_dead_instances()
    graveler.staging.drop_queued(grace_seconds=0)
    assert graveler.refs.get_repository(repo, fresh=True).instance_id == new.instance_id
    assert graveler.stat_object(repo, "main", "new").path == "new"
    assert new.partition not in queued(graveler)
    # A settings change of the same instance meanwhile is no reason to refuse its deletion.
    graveler.update_repository(repo, staging_shards=2)
    graveler.refs.delete_repository_record(new)
    with pytest.raises(gerrors.RepositoryNotFound):
        graveler.get_repository(repo)


def test_a_long_kept_queue_entry_is_looked_at_again_only_now_and_then(graveler, repo, monkeypatch):
    """tester hAO: thousands of entries queued ahead of a deletion that died were each read
    again on every dropper pass for an hour, holding up the dropping of due ones. One kept
    past KEPT_BACKOFF_AFTER_SECONDS is looked at again only every KEPT_RECHECK_SECONDS;
    before that, on every pass (a change in progress); it is still never dropped while in
    use, and dropped once it is not."""
    live, partition, clock = _queued_ahead_on_a_clock(graveler, repo, monkeypatch)
    looked = []
    still_referenced = graveler.staging._still_referenced
    monkeypatch.setattr(
        graveler.staging, "_still_referenced", lambda r: looked.append(r) or still_referenced(r)
    )
    shards = len(staging_partitions(live))
    graveler.staging.drop_queued(grace_seconds=0)
    graveler.staging.drop_queued(grace_seconds=0)
    assert len(looked) == 2 * shards  # young: every pass
    clock[0] += staging_module.KEPT_BACKOFF_AFTER_SECONDS
    looked.clear()
    for _ in range(5):
        graveler.staging.drop_queued(grace_seconds=0)
    assert len(looked) == shards  # old: once, then not for a while
    assert items(graveler, live) == 1
    # Retired meanwhile: dropped at the next look.
    graveler.commit(repo, "main", "retire it")
    clock[0] += staging_module.KEPT_RECHECK_SECONDS
    graveler.staging.drop_queued(grace_seconds=0)
    assert items(graveler, live) == 0
