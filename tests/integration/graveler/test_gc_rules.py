"""A repository's garbage-collection rules over gRPC: stored, read back, replaced, deleted,
validated, and gone with their repository."""

from __future__ import annotations

import uuid

import pytest

from quarry import errors


@pytest.fixture
def client(suite):
    with suite.client() as c:
        yield c


@pytest.fixture
def repo(suite, client):
    name = f"gc-{uuid.uuid4().hex[:10]}"
    client.create_repository(name, suite.namespace(name))
    return name


def test_rules_round_trip_replace_and_delete(client, repo):
    with pytest.raises(errors.NotFound) as missing:
        client.get_gc_rules(repo)
    assert missing.value.reason == "GC_RULES_NOT_FOUND"

    client.set_gc_rules(repo, 14, {"main": 90, "dev": 0.5})
    rules = client.get_gc_rules(repo)
    assert rules.default_retention_days == 14
    assert dict(rules.branch_retention_days) == {"main": 90, "dev": 0.5}

    client.set_gc_rules(repo, 7)
    rules = client.get_gc_rules(repo)
    assert rules.default_retention_days == 7 and not rules.branch_retention_days

    client.delete_gc_rules(repo)
    with pytest.raises(errors.NotFound):
        client.get_gc_rules(repo)
    with pytest.raises(errors.NotFound):
        client.delete_gc_rules(repo)


@pytest.mark.parametrize(
    "default, branches, reason",
    [
        (-1, {}, "INVALID_RETENTION_RULES"),
        (float("nan"), {}, "INVALID_RETENTION_RULES"),
        (7, {"main": 1e9}, "INVALID_RETENTION_RULES"),
        (7, {"no/slashes": 3}, "INVALID_NAME"),
    ],
)
def test_invalid_rules_are_refused_and_nothing_is_stored(client, repo, default, branches, reason):
    client.set_gc_rules(repo, 21)
    with pytest.raises(errors.InvalidArgument) as failure:
        client.set_gc_rules(repo, default, branches)
    assert failure.value.reason == reason
    assert client.get_gc_rules(repo).default_retention_days == 21


def test_rules_of_a_missing_or_recreated_repository(suite, client):
    with pytest.raises(errors.NotFound) as failure:
        client.get_gc_rules("no-such-repo")
    assert failure.value.reason == "REPOSITORY_NOT_FOUND"
    name = f"gc-{uuid.uuid4().hex[:10]}"
    client.create_repository(name, suite.namespace(name))
    client.set_gc_rules(name, 3)
    client.delete_repository(name)
    client.create_repository(name, suite.namespace(name + "-2"))
    with pytest.raises(errors.NotFound):
        client.get_gc_rules(name)  # a new repository starts without the old one's rules
