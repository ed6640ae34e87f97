"""Branch protection over gRPC (lakeFS semantics): rules stored and read back with a
checksum, a stale checksum refused, staging writes and commits refused on protected
branches (FAILED_PRECONDITION / BRANCH_PROTECTED) while other branches, merges into the
protected branch and compaction still work."""

from __future__ import annotations

import uuid

import pytest

from quarry import errors
from quarry.v1 import branch_manager_pb2 as bm

STAGING_WRITE = bm.BRANCH_PROTECTION_BLOCKED_ACTION_STAGING_WRITE
COMMIT = bm.BRANCH_PROTECTION_BLOCKED_ACTION_COMMIT


def rule(pattern, *actions):
    return bm.BranchProtectionRule(pattern=pattern, blocked_actions=list(actions))


def entry(path, version=1):
    return {
        "path": path,
        "physical_address": f"s3://b/{path}/{version}",
        "size_bytes": version,
        "checksum": f"sum-{path}-{version}",
    }


@pytest.fixture
def client(suite):
    with suite.client() as c:
        yield c


@pytest.fixture
def repo(suite, client):
    name = f"protect-{uuid.uuid4().hex[:10]}"
    client.create_repository(name, suite.namespace(name))
    return name


def refused(call, *args, **kwargs):
    with pytest.raises(errors.FailedPrecondition) as caught:
        call(*args, **kwargs)
    assert caught.value.reason == "BRANCH_PROTECTED", caught.value
    return caught.value


def test_rules_round_trip_with_checksum(client, repo):
    rules, empty_checksum = client.get_branch_protection_rules(repo)
    assert rules == [] and empty_checksum

    checksum = client.set_branch_protection_rules(
        repo,
        [rule("main", STAGING_WRITE, COMMIT), rule("release-*", COMMIT)],
        if_checksum=empty_checksum,
    )
    rules, read_checksum = client.get_branch_protection_rules(repo)
    assert read_checksum == checksum != empty_checksum
    assert [(r.pattern, list(r.blocked_actions)) for r in rules] == [
        ("main", [STAGING_WRITE, COMMIT]),
        ("release-*", [COMMIT]),
    ]

    # Without if_checksum, Set replaces unconditionally (lakeFS: if-match is optional).
    client.set_branch_protection_rules(repo, [rule("dev", STAGING_WRITE)])
    assert [r.pattern for r in client.get_branch_protection_rules(repo)[0]] == ["dev"]
    client.set_branch_protection_rules(repo, [])
    assert client.get_branch_protection_rules(repo) == ([], empty_checksum)


def test_stale_checksum_is_refused_and_nothing_changes(client, repo):
    _, first = client.get_branch_protection_rules(repo)
    second = client.set_branch_protection_rules(repo, [rule("main", COMMIT)], if_checksum=first)
    # A writer that read `first` lost the race: refused, the rules stay as the winner set them.
    for stale in (first, "0" * 64, "not-a-checksum"):
        with pytest.raises(errors.FailedPrecondition) as caught:
            client.set_branch_protection_rules(repo, [rule("other", COMMIT)], if_checksum=stale)
        assert caught.value.reason == "PRECONDITION_FAILED"
    rules, checksum = client.get_branch_protection_rules(repo)
    assert checksum == second and [r.pattern for r in rules] == ["main"]
    client.put_object(repo, "main", entry("still-writable"))  # staging writes not blocked


@pytest.mark.parametrize(
    "rules, reason",
    [
        ([rule("", COMMIT)], "INVALID_NAME"),
        ([rule("main")], "INVALID_NAME"),
        ([rule("main", COMMIT), rule("main", STAGING_WRITE)], "INVALID_NAME"),
        ([rule("a/b", COMMIT)], "INVALID_NAME"),
        ([rule("main", 7)], "INVALID_NAME"),
    ],
)
def test_invalid_rules_are_refused_and_nothing_is_stored(client, repo, rules, reason):
    before = client.get_branch_protection_rules(repo)
    with pytest.raises(errors.InvalidArgument) as caught:
        client.set_branch_protection_rules(repo, rules)
    assert caught.value.reason == reason
    assert client.get_branch_protection_rules(repo) == before


def test_staging_writes_refused_on_protected_branch_only(client, repo):
    client.put_object(repo, "main", entry("before"))
    client.commit(repo, "main", "before protection")
    client.create_branch(repo, "dev", "main")
    client.put_object(repo, "main", entry("staged-before"))
    client.set_branch_protection_rules(repo, [rule("main", STAGING_WRITE)])

    exc = refused(client.put_object, repo, "main", entry("x"))
    assert exc.metadata["branch"] == "main" and exc.metadata["pattern"] == "main"
    refused(client.put_objects, repo, "main", [entry("y"), entry("z")])
    refused(client.delete_object, repo, "main", "before")
    refused(client.delete_objects, repo, "main", ["before"])
    refused(client.discard_changes, repo, "main")
    refused(client.discard_changes, repo, "main", path="staged-before")
    # Nothing was staged or dropped on main.
    assert client.stat_object(repo, "main", "before").checksum == "sum-before-1"
    assert client.stat_object(repo, "main", "staged-before").checksum == "sum-staged-before-1"
    with pytest.raises(errors.NotFound):
        client.stat_object(repo, "main", "x")

    # Other branches are unaffected; commit on main is not blocked by this rule.
    client.put_object(repo, "dev", entry("x"))
    client.delete_object(repo, "dev", "before")
    client.commit(repo, "dev", "on dev")
    client.commit(repo, "main", "commit is not blocked by a staging-write rule")


def test_commit_refused_but_merge_into_protected_branch_works(client, repo):
    client.set_branch_protection_rules(repo, [rule("main", COMMIT)])
    client.create_branch(repo, "dev", "main")
    client.put_object(repo, "dev", entry("feature"))
    feature = client.commit(repo, "dev", "feature").commit

    client.put_object(repo, "main", entry("direct"))  # staging is not blocked by this rule
    exc = refused(client.commit, repo, "main", "direct commit")
    assert exc.metadata["blocked_action"] == "commit"
    refused(client.cherry_pick, repo, "main", feature.id)
    client.discard_changes(repo, "main")

    merged = client.merge(repo, "dev", "main")  # lakeFS: merges into a protected branch work
    assert client.get_branch(repo, "main").commit_id == merged.commit.id
    assert client.stat_object(repo, "main", "feature").checksum == "sum-feature-1"
    refused(client.revert, repo, "main", merged.commit.id, parent_number=1)
    refused(client.reset_branch, repo, "main", feature.parents[0])
    assert client.get_branch(repo, "main").commit_id == merged.commit.id


def test_compaction_of_a_protected_branch_still_works(client, repo):
    client.put_object(repo, "main", entry("a"))
    client.set_branch_protection_rules(repo, [rule("main", STAGING_WRITE, COMMIT)])
    outcome = client.compact(repo, "main")
    assert outcome.compacted_metarange_id
    assert client.stat_object(repo, "main", "a").checksum == "sum-a-1"


def test_patterns_match_whole_branch_names(client, repo):
    client.set_branch_protection_rules(
        repo, [rule("release-*", STAGING_WRITE), rule("v?", STAGING_WRITE)]
    )
    for branch in ("release-1", "release-2024-q1", "v1", "release", "main2", "v10", "xrelease-1"):
        client.create_branch(repo, branch, "main")
    for branch in ("release-1", "release-2024-q1", "v1"):
        exc = refused(client.put_object, repo, branch, entry("p"))
        assert exc.metadata["branch"] == branch
    for branch in ("release", "main", "main2", "v10", "xrelease-1"):
        client.put_object(repo, branch, entry("p"))
