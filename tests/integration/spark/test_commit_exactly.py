"""The driver's last step before the merge, against real services and without Spark: the
ephemeral branch is committed with exactly the files the successful task attempts
reported, whatever failed or losing speculative attempts staged — before the commit, and
while it is being made."""

from __future__ import annotations

import pytest

from quarry.client import make_entry
from quarry.spark.common import Connection, QuarryUri
from quarry.spark.executor import WriteSpec, file_entry, object_path
from quarry.spark.writer import WriteIncomplete, _Job, _JobOptions
from support.suite import suite_fixture

suite = suite_fixture()


@pytest.fixture
def job(suite, request):
    client = suite.client()
    repo = "exact-" + request.node.name.replace("_", "-")[5:40].strip("-")
    client.create_repository(repo, suite.namespace(repo))
    connection = Connection(suite.targets["branch-manager"], suite.targets["committer"])
    options = _JobOptions(QuarryUri(repo, "main", "t"), "parquet", "append", "test", {}, "", 0)
    job = _Job(client, None, connection, options)
    job.spec = WriteSpec(connection, repo, job.branch, suite.namespace(repo), "t/", job.job_id)
    client.create_branch(repo, job.branch, "main")
    yield job
    client.close()


def row(job, partition: int, attempt: int) -> dict:
    return {
        "path": object_path(job.spec, partition, 0),
        "physical_address": f"s3://b/ns/data/p{partition}-t{attempt}",
        "size_bytes": 5,
        "checksum": f"c{partition}-{attempt}",
        "mtime_us": 1_700_000_000_000_000,
        "rows": 3,
        "partition": partition,
    }


def reported_of(job, rows):
    return {r["path"]: file_entry(job.spec, r) for r in rows}


def committed(job, commit_id: str) -> dict:
    return {
        e.path: e.physical_address
        for e in job.client.iter_objects(job.target.repository, commit_id, prefix="t/")
    }


def test_stray_and_wrong_attempt_entries_are_fixed_before_the_commit(job):
    good = [row(job, 0, 1), row(job, 1, 1)]
    repo = job.target.repository
    # Staged by attempts: partition 0's winning entry, partition 1 from a losing attempt
    # (another file), and partition 2 that no successful attempt reported.
    job.client.put_objects(
        repo,
        job.branch,
        [
            file_entry(job.spec, good[0]),
            file_entry(job.spec, row(job, 1, 0)),
            file_entry(job.spec, row(job, 2, 0)),
        ],
    )
    commit = job._commit_exactly(reported_of(job, good), {})
    assert committed(job, commit.id) == {r["path"]: r["physical_address"] for r in good}
    assert commit.parents  # one commit on top of main


def test_a_write_landing_during_the_commit_is_fixed_by_another_round(job, monkeypatch):
    good = [row(job, 0, 1)]
    repo = job.target.repository
    real_commit = job.client.commit
    rounds = []

    def commit_with_a_late_attempt(*args, **kwargs):
        if not rounds:  # a speculative attempt stages just before the first commit seals
            job.client.put_objects(
                repo,
                job.branch,
                [file_entry(job.spec, row(job, 0, 7)), file_entry(job.spec, row(job, 5, 7))],
            )
        rounds.append(1)
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(job.client, "commit", commit_with_a_late_attempt)
    commit = job._commit_exactly(reported_of(job, good), {"k": "v"})
    assert len(rounds) == 2
    assert committed(job, commit.id) == {good[0]["path"]: good[0]["physical_address"]}
    assert job.client.get_commit(repo, commit.id).metadata["k"] == "v"


def test_attempts_that_never_stop_changing_the_files_end_the_write(job, monkeypatch):
    repo = job.target.repository
    real_commit = job.client.commit

    def always_late(*args, **kwargs):
        job.client.put_object(
            repo,
            job.branch,
            entry=make_entry(
                object_path(job.spec, 9, 0), physical_address="s3://b/late", size_bytes=1
            ),
        )
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(job.client, "commit", always_late)
    with pytest.raises(WriteIncomplete) as failure:
        job._commit_exactly(reported_of(job, [row(job, 0, 1)]), {})
    assert failure.value.reason == "SPARK_WRITE_UNSETTLED"


def test_unrelated_paths_on_the_branch_are_left_alone(job):
    repo = job.target.repository
    job.client.put_object(repo, job.branch, entry=make_entry("t/other-file", "s3://b/o", 1))
    another_job = "t/part-20200101T000000-000000000000-00000-c000.snappy.parquet"
    job.client.put_object(repo, job.branch, entry=make_entry(another_job, "s3://b/x", 1))
    commit = job._commit_exactly(reported_of(job, [row(job, 0, 1)]), {})
    assert set(committed(job, commit.id)) == {
        "t/other-file",
        another_job,
        object_path(job.spec, 0, 0),
    }


def test_a_committed_attempt_with_the_same_content_at_another_address_is_replaced(job):
    """Issue 10.1: a losing attempt wrote the same bytes (same size and checksum) to its own
    file and got committed on the ephemeral branch; the reported file differs only by its
    address. That is a change (the identity covers the address): the next commit takes the
    reported file, where the old rule saw no change and the write never settled."""
    repo = job.target.repository
    good = row(job, 0, 1)
    loser = dict(good, physical_address="s3://b/ns/data/p0-t0")
    job.client.put_objects(repo, job.branch, [file_entry(job.spec, loser)])
    job.client.commit(repo, job.branch, "a losing attempt's commit")
    commit = job._commit_exactly(reported_of(job, [good]), {})
    assert committed(job, commit.id) == {good["path"]: good["physical_address"]}
