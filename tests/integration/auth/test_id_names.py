"""The contract's `id` of the user, group and policy RPCs (docs/api.md: CreateUser(id),
GetUser(id), ..., DeletePolicy) over real gRPC on loopback (auth_harness: the ErrorInterceptor
and AuthInterceptor in front of the real Auth servicer), next to the older `user_id` /
`group_id` / `policy_id`: either name, or both naming the same id, works; two different ids
are INVALID_ARGUMENT / CONFLICTING_IDS and change nothing.

Safety: authorization reads the id before the servicer runs. A user allowed on one user,
group or policy tries on purpose to reach another one through the other field (the
authorize-one/act-on-other attack): it is refused and the other one is unchanged.
"""

from __future__ import annotations

import base64
import json

import grpc
import pytest
from auth_harness import auth_server
from google.rpc import error_details_pb2

from quarry.auth.bootstrap import setup_admin
from quarry.auth.policy import document, group_arn, policy_arn, user_arn
from quarry.runtime.errors import from_rpc_error
from quarry.v1 import auth_pb2, auth_pb2_grpc
from support.auth import RAW_INSECURE_CHANNEL
from support.grpcurl import GRPCURL, grpcurl, proto_args

LIST_REPOS = document({"Effect": "Allow", "Action": ["fs:ListRepositories"], "Resource": "*"})
READ_REPOS = document({"Effect": "Allow", "Action": ["fs:ReadRepository"], "Resource": "*"})
# RPC → (the older field, the ARN of what it names, extra fields a valid request needs).
RPCS = {
    "CreateUser": ("user_id", user_arn, {"email": "x@example.com"}),
    "GetUser": ("user_id", user_arn, {}),
    "DeleteUser": ("user_id", user_arn, {}),
    "CreateGroup": ("group_id", group_arn, {"description": "d"}),
    "GetGroup": ("group_id", group_arn, {}),
    "DeleteGroup": ("group_id", group_arn, {}),
    "CreatePolicy": ("policy_id", policy_arn, {"document": LIST_REPOS}),
    "GetPolicy": ("policy_id", policy_arn, {}),
    "UpdatePolicy": ("policy_id", policy_arn, {"document": READ_REPOS}),
    "DeletePolicy": ("policy_id", policy_arn, {}),
}
# The scoped user may do anything to these three, and nothing to anything else.
ALLOWED = {"user_id": "sc-alice", "group_id": "sc-team", "policy_id": "sc-pol"}
# What the attacks aim at: existing ones (Get/Update/Delete) and new ones (Create).
VICTIM = {"user_id": "sc-bob", "group_id": "sc-other", "policy_id": "sc-victim"}
NEW_VICTIM = {"user_id": "sc-new-user", "group_id": "sc-new-group", "policy_id": "sc-new-pol"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with auth_server(tmp_path_factory.mktemp("id-names")) as running:
        yield running


@pytest.fixture(scope="module")
def channel(server):
    with RAW_INSECURE_CHANNEL(server.target) as opened:
        yield opened


def login(server, channel, user_id: str) -> str:
    record, secret = server.iam.create_credentials(user_id)
    reply = auth_pb2_grpc.AuthStub(channel).Login(
        auth_pb2.LoginRequest(access_key_id=record.access_key_id, secret_access_key=secret)
    )
    return reply.token


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


@pytest.fixture(scope="module")
def admin_token(server, channel):
    setup_admin(server.iam, "admin")
    return login(server, channel, "admin")


@pytest.fixture(scope="module")
def admin(admin_token):
    return bearer(admin_token)


@pytest.fixture
def auth(channel):
    return auth_pb2_grpc.AuthStub(channel)


def call(auth, rpc: str, metadata, **fields):
    return getattr(auth, rpc)(getattr(auth_pb2, f"{rpc}Request")(**fields), metadata=metadata)


def failure(auth, rpc: str, metadata, **fields):
    with pytest.raises(grpc.RpcError) as caught:
        call(auth, rpc, metadata, **fields)
    return from_rpc_error(caught.value)


def iam_state(server) -> dict:
    """Every user, group and policy as stored, with memberships and attachments."""
    iam = server.iam
    users = iam.list_users(1000)[0]
    groups = iam.list_groups(1000)[0]
    return {
        "users": [u.SerializeToString() for u in users],
        "groups": [g.SerializeToString() for g in groups],
        "policies": [p.SerializeToString() for p in iam.list_policies(1000)[0]],
        "memberships": {u.id: [g.id for g in iam.list_user_groups(u.id)[0]] for u in users},
        "user_policies": {u.id: [p.id for p in iam.list_user_policies(u.id)[0]] for u in users},
        "group_policies": {g.id: [p.id for p in iam.list_group_policies(g.id)[0]] for g in groups},
    }


@pytest.mark.parametrize("both", [False, True], ids=["id", "id-and-old-name"])
def test_users_groups_and_policies_are_managed_by_id(server, auth, admin, both):
    suffix = "b" if both else "i"
    user, group, policy = f"byid-user-{suffix}", f"byid-group-{suffix}", f"byid-pol-{suffix}"

    def named(field: str, value: str) -> dict:
        return {"id": value, field: value} if both else {"id": value}

    created = call(auth, "CreateUser", admin, email="u@example.com", **named("user_id", user))
    assert (created.user.id, created.user.email) == (user, "u@example.com")
    assert server.iam.get_user(user).email == "u@example.com"
    assert call(auth, "GetUser", admin, **named("user_id", user)).user.id == user

    call(auth, "CreateGroup", admin, description="team", **named("group_id", group))
    assert server.iam.get_group(group).description == "team"
    assert call(auth, "GetGroup", admin, **named("group_id", group)).group.description == "team"

    statement = auth_pb2.PolicyStatement(
        effect="Allow", actions=["fs:ListRepositories"], resource="*"
    )
    made = call(auth, "CreatePolicy", admin, statements=[statement], **named("policy_id", policy))
    assert made.policy.id == policy and list(made.policy.statements) == [statement]
    updated = call(auth, "UpdatePolicy", admin, document=READ_REPOS, **named("policy_id", policy))
    assert updated.policy.document == READ_REPOS
    assert server.iam.get_policy(policy).document == READ_REPOS
    assert call(auth, "GetPolicy", admin, **named("policy_id", policy)).policy.document == (
        READ_REPOS
    )

    call(auth, "DeletePolicy", admin, **named("policy_id", policy))
    call(auth, "DeleteGroup", admin, **named("group_id", group))
    call(auth, "DeleteUser", admin, **named("user_id", user))
    assert not server.iam.user_exists(user)
    assert [g.id for g in server.iam.list_groups(1000)[0] if g.id == group] == []
    assert [p.id for p in server.iam.list_policies(1000)[0] if p.id == policy] == []


def _ensure_conflict_fixture(server) -> None:
    if server.iam.user_exists("cf-a"):
        return
    for suffix in ("a", "b"):
        server.iam.create_user(f"cf-{suffix}")
        server.iam.create_group(f"cf-{suffix}")
        server.iam.create_policy(f"cf-{suffix}", LIST_REPOS)
        server.iam.add_group_member(f"cf-{suffix}", f"cf-{suffix}")
        server.iam.attach_user_policy(f"cf-{suffix}", f"cf-{suffix}")


@pytest.mark.parametrize("rpc", sorted(RPCS))
def test_two_different_ids_are_invalid_argument_and_change_nothing(server, auth, admin, rpc):
    field, _, extra = RPCS[rpc]
    _ensure_conflict_fixture(server)
    existing = ("cf-a", "cf-b")
    fresh = ("cf-new-1", "cf-new-2")
    before = iam_state(server)
    for named, legacy in (existing, existing[::-1], fresh, (existing[0], fresh[0])):
        error = failure(auth, rpc, admin, id=named, **{field: legacy}, **extra)
        assert (error.code.name, error.reason) == ("INVALID_ARGUMENT", "CONFLICTING_IDS")
        assert error.metadata == {"id": named, field: legacy}
        assert "id" in error.message and field in error.message
    assert iam_state(server) == before


@pytest.mark.parametrize("rpc", sorted(RPCS))
def test_neither_name_is_the_invalid_id_it_always_was(server, auth, admin, rpc):
    _, _, extra = RPCS[rpc]
    before = iam_state(server)
    error = failure(auth, rpc, admin, **extra)
    assert (error.code.name, error.reason) == ("INVALID_ARGUMENT", "INVALID_IAM_ID")
    assert iam_state(server) == before


@pytest.fixture(scope="module")
def scoped(server, channel):
    """A user allowed every auth: action on sc-alice, sc-team and sc-pol only; and the
    victims (sc-bob, sc-other, sc-victim) with relationships an attack could destroy."""
    iam = server.iam
    for user in ("sc-user", "sc-alice", "sc-bob"):
        iam.create_user(user)
    for group in ("sc-team", "sc-other"):
        iam.create_group(group)
    iam.add_group_member("sc-other", "sc-bob")
    iam.create_policy("sc-pol", LIST_REPOS)
    iam.create_policy("sc-victim", LIST_REPOS)
    iam.attach_user_policy("sc-bob", "sc-victim")
    iam.attach_group_policy("sc-other", "sc-victim")
    scope = document(
        {
            "Effect": "Allow",
            "Action": ["auth:*"],
            "Resource": [user_arn("sc-alice"), group_arn("sc-team"), policy_arn("sc-pol")],
        }
    )
    iam.create_policy("sc-scope", scope)
    iam.attach_user_policy("sc-user", "sc-scope")
    return bearer(login(server, channel, "sc-user"))


@pytest.mark.parametrize("rpc", [r for r in sorted(RPCS) if r.startswith("Get")])
def test_the_scoped_user_reaches_its_own_by_either_name(auth, scoped, rpc):
    """The control: the refusals below are about the id, not a user who may do nothing."""
    field, _, _ = RPCS[rpc]
    allowed = ALLOWED[field]
    for fields in ({"id": allowed}, {field: allowed}, {"id": allowed, field: allowed}):
        reply = call(auth, rpc, scoped, **fields)
        assert getattr(reply, field.removesuffix("_id")).id == allowed


@pytest.mark.parametrize("rpc", sorted(RPCS))
def test_a_user_allowed_on_one_cannot_act_on_another_through_either_field(
    server, auth, scoped, rpc
):
    field, arn, extra = RPCS[rpc]
    allowed = ALLOWED[field]
    victim = (NEW_VICTIM if rpc.startswith("Create") else VICTIM)[field]
    before = iam_state(server)
    attacks = [
        # First the one a split reading would let through: authorized on the allowed id (in
        # one field), acting on the victim (in the other).
        ({"id": victim, field: allowed}, "CONFLICTING_IDS"),
        ({"id": victim}, "PERMISSION_DENIED"),
        ({field: victim}, "PERMISSION_DENIED"),
        ({"id": allowed, field: victim}, "CONFLICTING_IDS"),
    ]
    for fields, reason in attacks:
        error = failure(auth, rpc, scoped, **fields, **extra)
        if reason == "PERMISSION_DENIED":
            # Checked on the id the request names, whichever field names it.
            assert (error.code.name, error.metadata["resource"]) == (reason, arn(victim)), fields
        else:
            assert (error.code.name, error.reason) == ("INVALID_ARGUMENT", reason), fields
        assert iam_state(server) == before, fields
    if rpc.startswith("Create"):
        assert not server.iam.user_exists(NEW_VICTIM["user_id"])
    else:
        assert server.iam.user_exists("sc-bob")
        assert server.iam.get_policy("sc-victim").document == LIST_REPOS


def test_grpcurl_with_the_contracts_id(server, admin_token):
    """As docs/api.md writes it: grpcurl -d '{"id": ...}' (from the proto files: this server
    has no reflection)."""
    if not GRPCURL.exists():
        pytest.fail(f"grpcurl not found at {GRPCURL}: run `make install`")
    target = server.target

    def run(method: str, data: dict):
        return grpcurl(
            *proto_args(), target, f"quarry.v1.Auth/{method}", data=data, token=admin_token
        )

    created = run("CreateUser", {"id": "gc-user"})
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["user"]["id"] == "gc-user"
    assert server.iam.user_exists("gc-user")
    got = run("GetUser", {"id": "gc-user", "user_id": "gc-user"})
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["user"]["id"] == "gc-user"
    conflict = run("DeleteUser", {"id": "gc-user", "user_id": "admin"})
    assert conflict.returncode != 0
    status = json.loads(conflict.stderr)
    assert status["code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    # Without reflection grpcurl prints the ErrorInfo detail undecoded.
    info = error_details_pb2.ErrorInfo.FromString(base64.b64decode(status["details"][0]["@value"]))
    assert (info.reason, dict(info.metadata)) == (
        "CONFLICTING_IDS",
        {"id": "gc-user", "user_id": "admin"},
    )
    assert server.iam.user_exists("gc-user") and server.iam.user_exists("admin")
    deleted = run("DeleteUser", {"id": "gc-user"})
    assert deleted.returncode == 0, deleted.stderr
    assert not server.iam.user_exists("gc-user")
