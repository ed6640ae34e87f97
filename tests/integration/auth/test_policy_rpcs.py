"""API.md's policy RPCs over real gRPC on loopback (auth_harness: the ErrorInterceptor and
AuthInterceptor in front of the real Auth and BranchManager servicers): AttachPolicy /
DetachPolicy to a user or a group, UpdatePolicy, the structured statements form, and their
refusals. The authorizer's cache lives far longer than any test here, so a permission that
changes at once changed because the mutation invalidated the cache, not because it expired.
"""

from __future__ import annotations

import json

import grpc
import pytest
from auth_harness import auth_server

from quarry.auth import errors as auth_errors
from quarry.auth.bootstrap import setup_admin
from quarry.auth.policy import document
from quarry.runtime.errors import from_rpc_error
from quarry.v1 import auth_pb2, auth_pb2_grpc, branch_manager_pb2, branch_manager_pb2_grpc
from support.auth import RAW_INSECURE_CHANNEL

CACHE_SECONDS = 600.0
LIST_REPOS = document({"Effect": "Allow", "Action": ["fs:ListRepositories"], "Resource": "*"})
READ_REPOS = document({"Effect": "Allow", "Action": ["fs:ReadRepository"], "Resource": "*"})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with auth_server(
        tmp_path_factory.mktemp("policy-rpcs"), cache_seconds=CACHE_SECONDS
    ) as running:
        yield running


@pytest.fixture(scope="module")
def channel(server):
    with RAW_INSECURE_CHANNEL(server.target) as opened:
        yield opened


def token_of(server, channel, user_id: str) -> list[tuple[str, str]]:
    record, secret = server.iam.create_credentials(user_id)
    reply = auth_pb2_grpc.AuthStub(channel).Login(
        auth_pb2.LoginRequest(access_key_id=record.access_key_id, secret_access_key=secret)
    )
    return [("authorization", f"Bearer {reply.token}")]


@pytest.fixture(scope="module")
def admin(server, channel):
    setup_admin(server.iam, "admin")
    return token_of(server, channel, "admin")


@pytest.fixture
def auth(channel):
    return auth_pb2_grpc.AuthStub(channel)


def failure(call, request, metadata):
    with pytest.raises(grpc.RpcError) as caught:
        call(request, metadata=metadata)
    return from_rpc_error(caught.value)


def may_list_repositories(channel, metadata) -> bool:
    """Whether the user behind `metadata` may call ListRepositories (fs:ListRepositories);
    any refusal but PERMISSION_DENIED fails the test."""
    stub = branch_manager_pb2_grpc.BranchManagerStub(channel)
    try:
        stub.ListRepositories(branch_manager_pb2.ListRepositoriesRequest(), metadata=metadata)
    except grpc.RpcError as error:
        assert error.code() is grpc.StatusCode.PERMISSION_DENIED, error.details()
        return False
    return True


def fresh_user(server, channel, name: str, group: str = "") -> list[tuple[str, str]]:
    server.iam.create_user(name)
    if group:
        server.iam.create_group(group)
        server.iam.add_group_member(group, name)
    token = token_of(server, channel, name)
    # Load the user's (empty) policies into the authorizer's cache: what follows must
    # invalidate it to be seen.
    assert not may_list_repositories(channel, token)
    return token


def test_attach_policy_to_a_user_grants_and_detach_revokes_at_once(server, channel, admin, auth):
    user = fresh_user(server, channel, "att-user")
    server.iam.create_policy("att-user-list", LIST_REPOS)
    auth.AttachPolicy(
        auth_pb2.AttachPolicyRequest(policy_id="att-user-list", user_id="att-user"),
        metadata=admin,
    )
    assert may_list_repositories(channel, user)
    assert [p.id for p in server.iam.list_user_policies("att-user")[0]] == ["att-user-list"]
    # Attaching twice is no error, as AttachPolicyToUser.
    auth.AttachPolicy(
        auth_pb2.AttachPolicyRequest(policy_id="att-user-list", user_id="att-user"),
        metadata=admin,
    )
    auth.DetachPolicy(
        auth_pb2.DetachPolicyRequest(policy_id="att-user-list", user_id="att-user"),
        metadata=admin,
    )
    assert not may_list_repositories(channel, user)
    again = failure(
        auth.DetachPolicy,
        auth_pb2.DetachPolicyRequest(policy_id="att-user-list", user_id="att-user"),
        admin,
    )
    assert again.code.name == "NOT_FOUND"


def test_attach_policy_to_a_group_grants_its_members_and_detach_revokes(
    server, channel, admin, auth
):
    member = fresh_user(server, channel, "att-member", group="att-group")
    server.iam.create_policy("att-group-list", LIST_REPOS)
    auth.AttachPolicy(
        auth_pb2.AttachPolicyRequest(policy_id="att-group-list", group_id="att-group"),
        metadata=admin,
    )
    assert may_list_repositories(channel, member)
    assert [p.id for p in server.iam.list_group_policies("att-group")[0]] == ["att-group-list"]
    auth.DetachPolicy(
        auth_pb2.DetachPolicyRequest(policy_id="att-group-list", group_id="att-group"),
        metadata=admin,
    )
    assert not may_list_repositories(channel, member)


def test_update_policy_changes_what_its_users_may_do_at_once(server, channel, admin, auth):
    """Directly attached and through a group: the next call after UpdatePolicy is decided
    by the new document, long before the cache would expire."""
    direct = fresh_user(server, channel, "upd-direct")
    member = fresh_user(server, channel, "upd-member", group="upd-group")
    server.iam.create_policy("upd-policy", LIST_REPOS)
    server.iam.attach_user_policy("upd-direct", "upd-policy")
    server.iam.attach_group_policy("upd-group", "upd-policy")
    server.authorizer.invalidate()  # the attachments were made beside the server
    assert may_list_repositories(channel, direct) and may_list_repositories(channel, member)

    reply = auth.UpdatePolicy(
        auth_pb2.UpdatePolicyRequest(policy_id="upd-policy", document=READ_REPOS), metadata=admin
    )
    assert reply.policy.document == READ_REPOS
    assert not may_list_repositories(channel, direct)
    assert not may_list_repositories(channel, member)

    auth.UpdatePolicy(
        auth_pb2.UpdatePolicyRequest(
            policy_id="upd-policy",
            statements=[
                auth_pb2.PolicyStatement(
                    effect="Allow", actions=["fs:ListRepositories"], resource="*"
                )
            ],
        ),
        metadata=admin,
    )
    assert may_list_repositories(channel, direct) and may_list_repositories(channel, member)
    # The attachments and the creation time stayed.
    assert [p.id for p in server.iam.list_group_policies("upd-group")[0]] == ["upd-policy"]


def test_update_policy_refusals_change_nothing(server, admin, auth):
    server.iam.create_policy("upd-keep", LIST_REPOS)
    before = server.iam.get_policy("upd-keep")
    missing = failure(
        auth.UpdatePolicy,
        auth_pb2.UpdatePolicyRequest(policy_id="upd-ghost", document=LIST_REPOS),
        admin,
    )
    assert (missing.code.name, missing.reason) == ("NOT_FOUND", "POLICY_NOT_FOUND")
    with pytest.raises(auth_errors.PolicyNotFound):
        server.iam.get_policy("upd-ghost")  # not created by the update
    bad = failure(
        auth.UpdatePolicy,
        auth_pb2.UpdatePolicyRequest(
            policy_id="upd-keep",
            statements=[
                auth_pb2.PolicyStatement(effect="Allow", actions=["fs:Nope"], resource="*")
            ],
        ),
        admin,
    )
    assert (bad.code.name, bad.reason) == ("INVALID_ARGUMENT", "INVALID_POLICY")
    assert bad.metadata["position"] == "Statement[0].Action[0]"
    for request in (
        auth_pb2.UpdatePolicyRequest(policy_id="upd-keep"),
        auth_pb2.UpdatePolicyRequest(
            policy_id="upd-keep",
            document=READ_REPOS,
            statements=[auth_pb2.PolicyStatement(effect="Allow", actions=["fs:*"], resource="*")],
        ),
    ):
        error = failure(auth.UpdatePolicy, request, admin)
        assert (error.code.name, error.reason) == ("INVALID_ARGUMENT", "INVALID_POLICY")
    assert server.iam.get_policy("upd-keep") == before


@pytest.mark.parametrize("verb", ["Attach", "Detach"])
@pytest.mark.parametrize(
    "principal", [{}, {"user_id": "one-user", "group_id": "one-group"}], ids=["neither", "both"]
)
def test_neither_or_both_principals_are_invalid_argument(server, admin, auth, verb, principal):
    if not server.iam.user_exists("one-user"):
        server.iam.create_user("one-user")
        server.iam.create_group("one-group")
        server.iam.create_policy("one-policy", LIST_REPOS)
        server.iam.attach_user_policy("one-user", "one-policy")
    request = getattr(auth_pb2, f"{verb}PolicyRequest")(policy_id="one-policy", **principal)
    error = failure(getattr(auth, f"{verb}Policy"), request, admin)
    assert (error.code.name, error.reason) == ("INVALID_ARGUMENT", "ONE_PRINCIPAL_REQUIRED")
    # Nothing attached to the group, nothing detached from the user.
    assert server.iam.list_group_policies("one-group")[0] == []
    assert [p.id for p in server.iam.list_user_policies("one-user")[0]] == ["one-policy"]


@pytest.mark.parametrize(
    ("request_fields", "reason"),
    [
        ({"policy_id": "nf-ghost", "user_id": "nf-user"}, "POLICY_NOT_FOUND"),
        ({"policy_id": "nf-ghost", "group_id": "nf-group"}, "POLICY_NOT_FOUND"),
        ({"policy_id": "nf-policy", "user_id": "nf-ghost"}, "USER_NOT_FOUND"),
        ({"policy_id": "nf-policy", "group_id": "nf-ghost"}, "GROUP_NOT_FOUND"),
    ],
)
def test_attach_to_anything_missing_is_not_found(server, admin, auth, request_fields, reason):
    if not server.iam.user_exists("nf-user"):
        server.iam.create_user("nf-user")
        server.iam.create_group("nf-group")
        server.iam.create_policy("nf-policy", LIST_REPOS)
    error = failure(auth.AttachPolicy, auth_pb2.AttachPolicyRequest(**request_fields), admin)
    assert (error.code.name, error.reason) == ("NOT_FOUND", reason)
    assert server.iam.list_user_policies("nf-user")[0] == []
    assert server.iam.list_group_policies("nf-group")[0] == []


def test_a_non_admin_is_refused_naming_the_action_and_resource(server, channel, admin, auth):
    """Safety: a user who may not manage IAM cannot grant itself a policy, detach one, or
    rewrite one attached to it."""
    user = fresh_user(server, channel, "na-user")
    server.iam.create_policy("na-policy", LIST_REPOS)
    server.iam.create_policy("na-mine", READ_REPOS)
    server.iam.attach_user_policy("na-user", "na-mine")
    server.authorizer.invalidate()
    cases = [
        (
            auth.AttachPolicy,
            auth_pb2.AttachPolicyRequest(policy_id="na-policy", user_id="na-user"),
            "auth:AttachPolicy",
            "arn:quarry:auth:::user/na-user",
        ),
        (
            auth.DetachPolicy,
            auth_pb2.DetachPolicyRequest(policy_id="na-mine", user_id="na-user"),
            "auth:DetachPolicy",
            "arn:quarry:auth:::user/na-user",
        ),
        (
            auth.UpdatePolicy,
            auth_pb2.UpdatePolicyRequest(policy_id="na-mine", document=LIST_REPOS),
            "auth:UpdatePolicy",
            "arn:quarry:auth:::policy/na-mine",
        ),
    ]
    for call, request, action, resource in cases:
        error = failure(call, request, user)
        assert (error.code.name, error.metadata["action"], error.metadata["resource"]) == (
            "PERMISSION_DENIED",
            action,
            resource,
        )
        assert action in error.message
    assert [p.id for p in server.iam.list_user_policies("na-user")[0]] == ["na-mine"]
    assert server.iam.get_policy("na-mine").document == READ_REPOS
    assert not may_list_repositories(channel, user)


def test_create_with_statements_and_policies_read_back_structured(server, admin, auth):
    statements = [
        auth_pb2.PolicyStatement(effect="Allow", actions=["fs:Read*", "fs:List*"], resource="*"),
        auth_pb2.PolicyStatement(
            effect="Deny",
            actions=["fs:ReadObject"],
            resource="arn:quarry:fs:::repository/r/object/secret/*",
        ),
    ]
    created = auth.CreatePolicy(
        auth_pb2.CreatePolicyRequest(policy_id="st-policy", statements=statements), metadata=admin
    ).policy
    assert list(created.statements) == statements
    assert json.loads(created.document)["Statement"][1]["Effect"] == "Deny"
    got = auth.GetPolicy(auth_pb2.GetPolicyRequest(policy_id="st-policy"), metadata=admin).policy
    assert (list(got.statements), got.document) == (statements, created.document)
    # A JSON document reads back structured too: one statement per resource.
    auth.CreatePolicy(
        auth_pb2.CreatePolicyRequest(
            policy_id="st-json",
            document=document(
                {
                    "effect": "allow",
                    "action": "fs:ReadRepository",
                    "resource": ["arn:quarry:fs:::repository/a", "arn:quarry:fs:::repository/b"],
                }
            ),
        ),
        metadata=admin,
    )
    listed = {
        p.id: list(p.statements)
        for p in auth.ListPolicies(auth_pb2.ListPoliciesRequest(), metadata=admin).policies
    }
    assert listed["st-json"] == [
        auth_pb2.PolicyStatement(
            effect="Allow",
            actions=["fs:ReadRepository"],
            resource=f"arn:quarry:fs:::repository/{r}",
        )
        for r in ("a", "b")
    ]
    assert listed["st-policy"] == statements
    for request in (
        auth_pb2.CreatePolicyRequest(policy_id="st-neither"),
        auth_pb2.CreatePolicyRequest(
            policy_id="st-both", document=LIST_REPOS, statements=statements
        ),
        auth_pb2.CreatePolicyRequest(
            policy_id="st-bad",
            statements=[
                statements[0],
                auth_pb2.PolicyStatement(effect="Maybe", actions=["fs:*"], resource="*"),
            ],
        ),
    ):
        error = failure(auth.CreatePolicy, request, admin)
        assert (error.code.name, error.reason) == ("INVALID_ARGUMENT", "INVALID_POLICY")
        with pytest.raises(auth_errors.PolicyNotFound):
            server.iam.get_policy(request.policy_id)
    assert error.metadata["position"] == "Statement[1].Effect"
