"""Branch protection over gRPC (lakeFS semantics): rules stored and read back with a
checksum, a stale checksum refused, staging writes and commits refused on protected
branches (FAILED_PRECONDITION / BRANCH_PROTECTED) and so is deleting one (it could be
recreated at an older commit), while other branches, merges into the protected branch and
compaction still work."""

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


@pytest.mark.parametrize("blocked", [(COMMIT,), (STAGING_WRITE,), (STAGING_WRITE, COMMIT)])
def test_a_protected_branch_cannot_be_deleted_and_recreated_at_an_older_commit(
    client, repo, blocked
):
    """The attack (issue 23): ResetBranch is refused, so delete the protected branch and
    create it again at an older commit. Deleting it is refused; nothing moves."""
    client.create_branch(repo, "release-1", "main")
    client.put_object(repo, "release-1", entry("v1"))
    old = client.commit(repo, "release-1", "old").commit
    client.put_object(repo, "release-1", entry("v2"))
    head = client.commit(repo, "release-1", "head").commit
    client.set_branch_protection_rules(repo, [rule("release-*", *blocked)])

    exc = refused(client.delete_branch, repo, "release-1")
    assert exc.metadata["blocked_action"] == "delete" and exc.metadata["pattern"] == "release-*"
    with pytest.raises(errors.AlreadyExists):
        client.create_branch(repo, "release-1", old.id)
    assert client.get_branch(repo, "release-1").commit_id == head.id
    assert client.stat_object(repo, "release-1", "v2").checksum == "sum-v2-1"
    # Unprotected branches are deleted as before.
    client.create_branch(repo, "scratch", "main")
    client.delete_branch(repo, "scratch")
    with pytest.raises(errors.NotFound):
        client.get_branch(repo, "scratch")


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


class RacingClient:
    """A real client whose first read of the rules is followed, before the caller writes,
    by another writer's change (`competing`): the lost race the CLI must not overwrite."""

    def __init__(self, client, competing, races=1):
        self._client = client
        self._competing = competing
        self.races = races

    def __getattr__(self, name):
        return getattr(self._client, name)

    def get_branch_protection_rules(self, repository):
        read = self._client.get_branch_protection_rules(repository)
        if self.races:
            self.races -= 1
            rules, checksum = read
            self._client.set_branch_protection_rules(
                repository, [*rules, self._competing], if_checksum=checksum
            )
        return read


def test_cli_read_modify_write_retries_a_lost_race_once(client, repo):
    from types import SimpleNamespace

    from quarry.cli.protect import _update

    client.set_branch_protection_rules(repo, [rule("main", COMMIT)])

    def add_third(rules):
        return [*rules, rule("third", STAGING_WRITE)]

    racing = RacingClient(client, rule("other", COMMIT))
    _update(SimpleNamespace(client=racing), repo, add_third)
    # The competing rule survives: the CLI re-read and applied its change on top.
    assert [r.pattern for r in client.get_branch_protection_rules(repo)[0]] == [
        "main",
        "other",
        "third",
    ]

    # Losing twice in a row is reported, and the winners' rules stay.
    def add_fifth(rules):
        return [*rules, rule("fifth", STAGING_WRITE)]

    with pytest.raises(errors.FailedPrecondition) as caught:
        _update(SimpleNamespace(client=_Twice(client)), repo, add_fifth)
    assert caught.value.reason == "PRECONDITION_FAILED"
    assert [r.pattern for r in client.get_branch_protection_rules(repo)[0]][3:] == ["w1", "w2"]


class _Twice(RacingClient):
    """Another writer wins both of the CLI's attempts."""

    def __init__(self, client):
        super().__init__(client, None, races=2)
        self._n = 0

    def get_branch_protection_rules(self, repository):
        read = self._client.get_branch_protection_rules(repository)
        if self.races:
            self.races -= 1
            self._n += 1
            rules, checksum = read
            self._client.set_branch_protection_rules(
                repository, [*rules, rule(f"w{self._n}", COMMIT)], if_checksum=checksum
            )
        return read
