"""request_ids.requested_id: the one reader of the ids of the Auth requests docs/api.md names
by `id` (and that keep `user_id` / `group_id` / `policy_id`), and the declaration table
reading them through it, so what is authorized is what the servicer acts on."""

from __future__ import annotations

import pytest

from quarry.auth import errors as auth_errors
from quarry.auth.declarations import RULES
from quarry.auth.policy import group_arn, policy_arn, user_arn
from quarry.auth.request_ids import ID_ALIASES, requested_id
from quarry.v1 import auth_pb2

# docs/api.md (and ../shared/API.md): the RPCs whose request names its entity `id`.
NAMED_BY_ID = {
    "CreateUser": "user_id",
    "GetUser": "user_id",
    "DeleteUser": "user_id",
    "CreateGroup": "group_id",
    "GetGroup": "group_id",
    "DeleteGroup": "group_id",
    "CreatePolicy": "policy_id",
    "GetPolicy": "policy_id",
    "UpdatePolicy": "policy_id",
    "DeletePolicy": "policy_id",
}
ARN_OF = {"user_id": user_arn, "group_id": group_arn, "policy_id": policy_arn}
AUTH = auth_pb2.DESCRIPTOR.services_by_name["Auth"]


def request_of(rpc: str, **fields: str):
    return getattr(auth_pb2, f"{rpc}Request")(**fields)


def test_the_aliases_are_exactly_the_requests_the_contract_names_by_id():
    by_method = {
        method.name: ID_ALIASES[method.input_type.full_name]
        for method in AUTH.methods
        if method.input_type.full_name in ID_ALIASES
    }
    assert by_method == NAMED_BY_ID
    # Every Auth request with an `id` field is in the table (a new one cannot skip it).
    with_id = {m.name for m in AUTH.methods if "id" in m.input_type.fields_by_name}
    assert with_id == set(NAMED_BY_ID)


@pytest.mark.parametrize("rpc", sorted(NAMED_BY_ID))
def test_both_names_are_plain_string_fields_not_a_oneof(rpc):
    """A oneof would keep whichever field was set last, silently: refused by design."""
    message = AUTH.methods_by_name[rpc].input_type
    for name in ("id", NAMED_BY_ID[rpc]):
        field = message.fields_by_name[name]
        assert field.type == field.TYPE_STRING, (rpc, name)
        assert field.containing_oneof is None, (rpc, name)


@pytest.mark.parametrize("rpc", sorted(NAMED_BY_ID))
def test_either_name_or_both_the_same_give_the_id(rpc):
    field = NAMED_BY_ID[rpc]
    assert requested_id(request_of(rpc, id="alice"), field) == "alice"
    assert requested_id(request_of(rpc, **{field: "alice"}), field) == "alice"
    assert requested_id(request_of(rpc, id="alice", **{field: "alice"}), field) == "alice"
    # Neither: "" as before, which the IAM store refuses (INVALID_IAM_ID).
    assert requested_id(request_of(rpc), field) == ""


@pytest.mark.parametrize("rpc", sorted(NAMED_BY_ID))
def test_two_different_ids_are_refused_naming_both_fields(rpc):
    field = NAMED_BY_ID[rpc]
    for named, legacy in (("bob", "alice"), ("alice", "bob")):
        with pytest.raises(auth_errors.ConflictingIds) as caught:
            requested_id(request_of(rpc, id=named, **{field: legacy}), field)
        error = caught.value
        assert (error.code.name, error.reason) == ("INVALID_ARGUMENT", "CONFLICTING_IDS")
        assert error.metadata == {"id": named, field: legacy}
        assert f"id {named!r}" in str(error) and f"{field} {legacy!r}" in str(error)


def test_a_huge_id_is_quoted_cut_short():
    with pytest.raises(auth_errors.ConflictingIds) as caught:
        requested_id(request_of("GetUser", id="x" * 100_000, user_id="alice"), "user_id")
    assert len(caught.value.metadata["id"]) == 200
    assert len(str(caught.value)) < 1000


def test_a_request_without_the_alias_reads_its_own_field_only():
    # CreateCredentials(user_id) has no `id`; AttachPolicy names a policy and a principal.
    assert requested_id(auth_pb2.CreateCredentialsRequest(user_id="alice"), "user_id") == "alice"
    request = auth_pb2.AttachPolicyRequest(policy_id="p", user_id="alice")
    assert requested_id(request, "policy_id") == "p"
    assert requested_id(request, "user_id") == "alice"


@pytest.mark.parametrize("rpc", sorted(NAMED_BY_ID))
def test_the_declaration_authorizes_the_id_the_request_names_by_either_name(rpc):
    """Safety: the resource checked is the id the servicer will act on, whichever field
    names it; a request naming two different ids is refused before any decision."""
    field = NAMED_BY_ID[rpc]
    resources = RULES[f"/quarry.v1.Auth/{rpc}"].resources
    arn = ARN_OF[field]
    assert resources(request_of(rpc, id="bob")) == (arn("bob"),)
    assert resources(request_of(rpc, **{field: "bob"})) == (arn("bob"),)
    assert resources(request_of(rpc, id="bob", **{field: "bob"})) == (arn("bob"),)
    assert resources(request_of(rpc)) == (arn(""),)
    for named, legacy in (("bob", "alice"), ("alice", "bob")):
        with pytest.raises(auth_errors.ConflictingIds):
            resources(request_of(rpc, id=named, **{field: legacy}))
