"""API.md's policy names in the domain, without gRPC: the structured statements form
(document_of / flat_statements), IamStore.update_policy (validated like create, never
recreating a deleted policy, never overwriting a concurrent change unseen) and
IamStore.attach_policy / detach_policy (exactly one principal)."""

from __future__ import annotations

import pytest

from quarry.auth import errors as auth_errors
from quarry.auth.authorizer import Authorizer
from quarry.auth.policy import (
    Decision,
    FlatStatement,
    decide,
    document,
    document_of,
    flat_statements,
    parse_policy,
)
from quarry.auth.store import IamStore
from quarry.kv import store as kv
from quarry.kv.memory import MemoryStore
from quarry.kv.partitions import AUTH_PARTITION
from quarry.storage.v1 import auth_records_pb2 as records

FAST_HASH = 2**10
READ = document({"Effect": "Allow", "Action": "fs:ReadObject", "Resource": "*"})
WRITE = document({"Effect": "Allow", "Action": ["fs:WriteObject"], "Resource": "*"})


@pytest.fixture
def backend():
    return MemoryStore()


@pytest.fixture
def iam(backend):
    return IamStore(backend, hash_cost=FAST_HASH)


# ---- the structured form ----------------------------------------------------------------


def test_statements_become_the_document_parse_policy_reads():
    statements = [
        FlatStatement("Allow", ("fs:Read*",), "*"),
        FlatStatement("Deny", ("fs:ReadObject",), "arn:quarry:fs:::repository/r/object/secret"),
    ]
    text = document_of("p", "", statements)
    parsed = parse_policy("p", text)
    assert flat_statements(parsed) == statements
    assert (
        decide([parsed], "fs:ReadObject", ["arn:quarry:fs:::repository/r/object/a"], "u")[0]
        is Decision.ALLOW
    )
    assert decide(
        [parsed], "fs:ReadObject", ["arn:quarry:fs:::repository/r/object/secret"], "u"
    ) == (Decision.DENY, "arn:quarry:fs:::repository/r/object/secret")


def test_a_json_document_is_taken_as_given():
    assert document_of("p", READ, []) == READ


@pytest.mark.parametrize(
    ("text", "statements", "word"),
    [("", [], "neither"), (READ, [FlatStatement("Allow", ("fs:ReadObject",), "*")], "both")],
)
def test_exactly_one_of_document_and_statements(text, statements, word):
    with pytest.raises(auth_errors.InvalidPolicy) as caught:
        document_of("p", text, statements)
    assert (caught.value.code.name, caught.value.reason) == ("INVALID_ARGUMENT", "INVALID_POLICY")
    assert word in caught.value.message


@pytest.mark.parametrize(
    ("statements", "position"),
    [
        (
            [
                FlatStatement("Allow", ("fs:ReadObject",), "*"),
                FlatStatement("Maybe", ("fs:*",), "*"),
            ],
            "Statement[1].Effect",
        ),
        ([FlatStatement("Allow", ("fs:ReadObject", "fs:Nope"), "*")], "Statement[0].Action[1]"),
        ([FlatStatement("Allow", (), "*")], "Statement[0].Action"),
        ([FlatStatement("Allow", ("fs:ReadObject",), "bucket/x")], "Statement[0].Resource[0]"),
        ([FlatStatement("Allow", ("fs:ReadObject",), "")], "Statement[0].Resource[0]"),
    ],
)
def test_bad_statements_name_their_position(statements, position):
    with pytest.raises(auth_errors.InvalidPolicy) as caught:
        parse_policy("p", document_of("p", "", statements))
    assert caught.value.metadata["position"] == position


def test_a_statement_of_several_resources_is_listed_once_per_resource_with_the_same_meaning():
    text = document(
        {
            "Effect": "allow",
            "Action": "fs:ReadObject",
            "Resource": ["arn:quarry:fs:::repository/a", "arn:quarry:fs:::repository/b"],
        }
    )
    flat = flat_statements(parse_policy("p", text))
    assert flat == [
        FlatStatement("Allow", ("fs:ReadObject",), "arn:quarry:fs:::repository/a"),
        FlatStatement("Allow", ("fs:ReadObject",), "arn:quarry:fs:::repository/b"),
    ]
    again = parse_policy("p", document_of("p", "", flat))
    for repo in ("a", "b", "c"):
        resource = [f"arn:quarry:fs:::repository/{repo}"]
        assert decide([again], "fs:ReadObject", resource, "u") == decide(
            [parse_policy("p", text)], "fs:ReadObject", resource, "u"
        )


# ---- update_policy ----------------------------------------------------------------------


def test_update_replaces_the_document_and_keeps_id_creation_time_and_attachments(iam):
    created = iam.create_policy("p", READ)
    iam.create_user("u")
    iam.attach_user_policy("u", "p")
    updated = iam.update_policy("p", WRITE)
    assert (updated.id, updated.created_at, updated.document) == ("p", created.created_at, WRITE)
    assert iam.get_policy("p") == updated
    assert [p.id for p in iam.effective_policy_records("u")] == ["p"]
    assert iam.effective_policies("u")[0].statements[0].actions == ("fs:WriteObject",)


def test_update_of_a_missing_policy_is_not_found_and_creates_nothing(iam, backend):
    with pytest.raises(auth_errors.PolicyNotFound):
        iam.update_policy("ghost", READ)
    assert list(backend.scan(AUTH_PARTITION)) == []


def test_an_invalid_update_is_refused_and_changes_nothing(iam):
    iam.create_policy("p", READ)
    with pytest.raises(auth_errors.InvalidPolicy) as caught:
        iam.update_policy("p", document({"Effect": "Allow", "Action": "fs:Nope", "Resource": "*"}))
    assert caught.value.metadata["position"] == "Statement[0].Action[0]"
    with pytest.raises(auth_errors.InvalidIamId):
        iam.update_policy("bad/id", READ)
    assert iam.get_policy("p").document == READ


class RaceBeforeWrite(kv.Store):
    """Runs `meanwhile` once, just before the first conditional write: another process
    changing the policy between update_policy's read and its write."""

    def __init__(self, inner: kv.Store, meanwhile):
        self.inner, self.meanwhile = inner, meanwhile

    def set_if(self, partition, key, value, predicate):
        if self.meanwhile is not None and isinstance(predicate, kv.Equals):
            meanwhile, self.meanwhile = self.meanwhile, None
            meanwhile()
        self.inner.set_if(partition, key, value, predicate)

    def get(self, partition, key):
        return self.inner.get(partition, key)

    def set(self, partition, key, value):
        self.inner.set(partition, key, value)

    def delete(self, partition, key):
        self.inner.delete(partition, key)

    def delete_if(self, partition, key, predicate):
        self.inner.delete_if(partition, key, predicate)

    def scan(self, partition, start=b"", end=None, batch_size=kv.DEFAULT_SCAN_BATCH_SIZE):
        return self.inner.scan(partition, start, end, batch_size)

    def batch_get(self, items):
        return self.inner.batch_get(items)

    def batch_set(self, items):
        self.inner.batch_set(items)

    def batch_delete(self, items):
        self.inner.batch_delete(items)


def test_an_update_racing_a_delete_never_recreates_the_policy(iam, backend):
    """Safety: the policy deleted between the update's read and write (its attachments
    pruned) stays deleted; the update is ABORTED, not a resurrected policy."""
    iam.create_policy("p", READ)
    racing = IamStore(RaceBeforeWrite(backend, lambda: iam.delete_policy("p")), hash_cost=FAST_HASH)
    with pytest.raises(auth_errors.PolicyChanged) as caught:
        racing.update_policy("p", WRITE)
    assert (caught.value.code.name, caught.value.reason) == ("ABORTED", "POLICY_CHANGED")
    with pytest.raises(auth_errors.PolicyNotFound):
        iam.get_policy("p")


def test_an_update_racing_another_update_never_overwrites_it_unseen(iam, backend):
    iam.create_policy("p", READ)
    other = document({"Effect": "Deny", "Action": "fs:*", "Resource": "*"})
    racing = IamStore(
        RaceBeforeWrite(backend, lambda: iam.update_policy("p", other)), hash_cost=FAST_HASH
    )
    with pytest.raises(auth_errors.PolicyChanged):
        racing.update_policy("p", WRITE)
    assert iam.get_policy("p").document == other


def test_a_cached_authorizer_sees_an_update_after_invalidate():
    """What the servicer relies on: invalidate() after update_policy makes the next decision
    use the new document, whatever the cache lifetime."""
    iam = IamStore(MemoryStore(), hash_cost=FAST_HASH)
    iam.create_user("u")
    iam.create_policy("p", READ)
    iam.attach_user_policy("u", "p")
    authorizer = Authorizer(iam, cache_seconds=3600)
    assert decide(authorizer.effective_policies("u"), "fs:ReadObject", ["*"], "u")[0] is (
        Decision.ALLOW
    )
    iam.update_policy("p", WRITE)
    assert authorizer.effective_policies("u")[0].statements[0].actions == ("fs:ReadObject",)
    authorizer.invalidate()
    assert authorizer.effective_policies("u")[0].statements[0].actions == ("fs:WriteObject",)


# ---- attach_policy / detach_policy ------------------------------------------------------


def test_attach_and_detach_to_a_user_or_a_group(iam, backend):
    iam.create_user("u")
    iam.create_group("g")
    iam.add_group_member("g", "u")
    iam.create_policy("mine", READ)
    iam.create_policy("ours", WRITE)
    iam.attach_policy("mine", user_id="u")
    iam.attach_policy("mine", user_id="u")  # twice: no error, as attach_user_policy
    iam.attach_policy("ours", group_id="g")
    assert [p.id for p in iam.list_user_policies("u")[0]] == ["mine"]
    assert [p.id for p in iam.list_group_policies("g")[0]] == ["ours"]
    assert [p.id for p in iam.effective_policy_records("u")] == ["mine", "ours"]
    record = records.AttachmentRecord.FromString(
        backend.get(AUTH_PARTITION, b"iam/group_policies/g/ours").value
    )
    assert (record.principal_kind, record.principal_id) == ("group", "g")
    iam.detach_policy("ours", group_id="g")
    iam.detach_policy("mine", user_id="u")
    assert iam.effective_policy_records("u") == []
    with pytest.raises(auth_errors.errors.NotFound):
        iam.detach_policy("mine", user_id="u")


@pytest.mark.parametrize("verb", ["attach_policy", "detach_policy"])
@pytest.mark.parametrize(("user", "group"), [("", ""), ("u", "g")])
def test_neither_or_both_principals_are_refused_and_nothing_is_written(
    iam, backend, verb, user, group
):
    iam.create_user("u")
    iam.create_group("g")
    iam.create_policy("p", READ)
    iam.attach_user_policy("u", "p")
    before = list(backend.scan(AUTH_PARTITION))
    with pytest.raises(auth_errors.OnePrincipalRequired) as caught:
        getattr(iam, verb)("p", user_id=user, group_id=group)
    assert (caught.value.code.name, caught.value.reason) == (
        "INVALID_ARGUMENT",
        "ONE_PRINCIPAL_REQUIRED",
    )
    assert list(backend.scan(AUTH_PARTITION)) == before


@pytest.mark.parametrize(
    ("kwargs", "missing"),
    [
        ({"user_id": "ghost"}, auth_errors.UserNotFound),
        ({"group_id": "ghost"}, auth_errors.GroupNotFound),
        ({"user_id": "u", "policy_id": "ghost"}, auth_errors.PolicyNotFound),
        ({"group_id": "g", "policy_id": "ghost"}, auth_errors.PolicyNotFound),
    ],
)
def test_attach_to_anything_missing_is_not_found(iam, kwargs, missing):
    iam.create_user("u")
    iam.create_group("g")
    iam.create_policy("p", READ)
    policy_id = kwargs.pop("policy_id", "p")
    with pytest.raises(missing):
        iam.attach_policy(policy_id, **kwargs)
