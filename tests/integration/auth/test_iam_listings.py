"""IAM listings (issue 23, items 5 and 6) over real gRPC.

Item 5: ListPolicies once answered 8.5 MB in one response, past grpcurl's (and most
clients') 4 MB limit, with no page token. Every IAM listing now cuts its pages by count and
by encoded bytes (quarry.paging, as ListObjects): policies totalling far more than 4 MB list
completely through the real grpcurl and through the real `quarry` CLI, page after page.

Item 6: one corrupt IAM record broke unrelated calls (a corrupt membership: ListGroupMembers
of Admins, DeleteGroup of any group, Setup; a corrupt user or policy: the whole ListUsers or
ListPolicies). A listing skips and counts it (skipped_corrupt_records), the call that needs
that very record is DATA_LOSS / CORRUPT_RECORD, nothing else notices.
"""

from __future__ import annotations

import json

import grpc
import pytest
from auth_harness import auth_server

from quarry.auth.bootstrap import ADMINS, BUILTIN_POLICIES
from quarry.auth.policy import document
from quarry.auth.store import GROUPS, POLICIES, USER_GROUPS, USERS, IamStore
from quarry.kv.memory import MemoryStore
from quarry.kv.partitions import AUTH_PARTITION
from quarry.runtime.errors import from_rpc_error
from quarry.v1 import auth_pb2, auth_pb2_grpc
from support.auth import FAST_HASH, admin_token_source, bearer, raw_channel
from support.cli import run_quarry
from support.grpcurl import grpcurl
from support.processes import quarry_env
from support.suite import running_suite

GRPC_DEFAULT_RECEIVE_LIMIT = 4 * 1024 * 1024
BIG_POLICIES = 60
GARBAGE = b"\xff\xff\xff\xff not a record"


def big_document(index: int) -> str:
    # ~40 KB of JSON; the API message carries it and its flattened statements (~2x).
    return document(
        *(
            {
                "Effect": "Allow",
                "Action": ["fs:ReadObject"],
                "Resource": f"arn:quarry:fs:::repository/big-{index}-{j:03d}/object/" + "p" * 300,
            }
            for j in range(100)
        )
    )


@pytest.fixture(scope="module")
def big_suite(tmp_path_factory):
    backend = MemoryStore()
    with running_suite(tmp_path_factory.mktemp("iam-pages"), backend=backend) as suite:
        iam = IamStore(backend, hash_cost=FAST_HASH)
        for i in range(BIG_POLICIES):
            iam.create_policy(f"big-{i:03d}", big_document(i))
        iam.create_user("big-user")
        for i in range(BIG_POLICIES):
            iam.attach_user_policy("big-user", f"big-{i:03d}")
        yield suite


def expected_policy_ids() -> set[str]:
    return {f"big-{i:03d}" for i in range(BIG_POLICIES)}


@pytest.mark.parametrize(
    ("method", "fields"),
    [
        ("ListPolicies", {}),
        ("ListUserPolicies", {"user_id": "big-user"}),
        ("ListEffectivePolicies", {"user_id": "big-user"}),
    ],
)
def test_policies_past_4_mb_list_completely_through_grpcurl(big_suite, method, fields):
    target = big_suite.targets["branch-manager"]
    token = admin_token_source()()
    seen: list[str] = []
    sizes: list[int] = []
    page_token = ""
    while True:
        request = {**fields, "page_size": 1000, "page_token": page_token}
        result = grpcurl(target, f"quarry.v1.Auth/{method}", data=request, token=token)
        assert result.returncode == 0, result.stderr[-2000:]
        reply = json.loads(result.stdout)
        sizes.append(len(result.stdout))
        seen += [p["id"] for p in reply.get("policies", [])]
        page_token = reply.get("next_page_token", "")  # grpcurl keeps the proto's names
        if not page_token:
            break
    assert expected_policy_ids() <= set(seen), (sizes, len(seen))
    assert len(seen) == len(set(seen)), "a policy listed twice"
    assert len(sizes) >= 2  # the whole set does not fit one default-sized response
    assert sum(sizes) > GRPC_DEFAULT_RECEIVE_LIMIT


def test_policies_past_4_mb_list_completely_through_the_cli(big_suite, tmp_path):
    env = quarry_env(tmp_path / "cli-home", QUARRY_COMMITTER_ADDRESS=big_suite.targets["committer"])
    for args in (
        ["auth", "policies", "list"],
        ["auth", "policies", "list", "--user", "big-user", "--effective"],
    ):
        result = run_quarry(
            [*args, "--json", "--branch-manager", big_suite.targets["branch-manager"]], env
        )
        assert result.returncode == 0, result.stderr[-2000:]
        listed = [p["id"] for p in json.loads(result.stdout)]
        assert expected_policy_ids() <= set(listed)
        assert len(listed) == len(set(listed))


def test_iam_pages_are_cut_by_encoded_bytes_in_the_store():
    iam = IamStore(MemoryStore(), hash_cost=FAST_HASH, max_response_bytes=200_000)
    for i in range(12):
        iam.create_policy(f"big-{i:03d}", big_document(i))
    pages, token, seen = 0, "", []
    while True:
        page, token = iam.list_policies(page_size=1000, page_token=token)
        assert page, "a page always holds at least one item"
        seen += [p.id for p in page]
        pages += 1
        if not token:
            break
    assert seen == [f"big-{i:03d}" for i in range(12)]
    assert pages >= 6  # ~80 KB per policy message: at most two per 200 KB page


# ---- item 6: one corrupt record ----------------------------------------------------------


def _refused(call, *args, **kwargs):
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, **kwargs)
    return from_rpc_error(caught.value)


@pytest.fixture
def corrupt_server(tmp_path):
    with auth_server(tmp_path) as srv, raw_channel(srv.target) as channel:
        stub = auth_pb2_grpc.AuthStub(channel)
        setup = stub.Setup(auth_pb2.SetupRequest(user_id="admin"))
        login = stub.Login(
            auth_pb2.LoginRequest(
                access_key_id=setup.credentials.access_key_id,
                secret_access_key=setup.credentials.secret_access_key,
            )
        )
        yield srv, stub, list(bearer(login.token))


def test_a_corrupt_membership_breaks_no_other_call(corrupt_server):
    srv, stub, as_admin = corrupt_server
    srv.iam.create_user("bob")
    srv.iam.create_group("Devs")
    srv.iam.create_group("Temp")
    srv.iam.add_group_member("Devs", "bob")
    srv.iam.add_group_member("Temp", "bob")
    srv.iam._kv.set(AUTH_PARTITION, USER_GROUPS + b"bob/Devs", GARBAGE)

    members = stub.ListGroupMembers(
        auth_pb2.ListGroupMembersRequest(group_id=ADMINS), metadata=as_admin
    )
    assert [u.id for u in members.users] == ["admin"]
    # The corrupt membership's own group still lists bob: both ids are in the key.
    members = stub.ListGroupMembers(
        auth_pb2.ListGroupMembersRequest(group_id="Devs"), metadata=as_admin
    )
    assert [u.id for u in members.users] == ["bob"]
    stub.DeleteGroup(auth_pb2.DeleteGroupRequest(group_id="Temp"), metadata=as_admin)
    assert not srv.iam._exists(USER_GROUPS + b"bob/Temp")
    assert srv.iam._exists(USER_GROUPS + b"bob/Devs")  # another group's: untouched
    groups = stub.ListUserGroups(auth_pb2.ListUserGroupsRequest(user_id="bob"), metadata=as_admin)
    assert [g.id for g in groups.groups] == ["Devs"]
    error = _refused(stub.Setup, auth_pb2.SetupRequest(user_id="mallory"))
    assert error.reason == "ADMIN_EXISTS"
    # bob's decisions still work (his groups come from the keys).
    assert srv.iam.effective_policy_records("bob") == []


@pytest.mark.parametrize(
    ("prefix", "record_id", "list_call", "field", "get_call", "get_request"),
    [
        (
            USERS,
            "zed",
            ("ListUsers", auth_pb2.ListUsersRequest()),
            "users",
            "GetUser",
            auth_pb2.GetUserRequest(user_id="zed"),
        ),
        (
            POLICIES,
            "zed-policy",
            ("ListPolicies", auth_pb2.ListPoliciesRequest()),
            "policies",
            "GetPolicy",
            auth_pb2.GetPolicyRequest(policy_id="zed-policy"),
        ),
        (
            GROUPS,
            "zed-group",
            ("ListGroups", auth_pb2.ListGroupsRequest()),
            "groups",
            "GetGroup",
            auth_pb2.GetGroupRequest(group_id="zed-group"),
        ),
    ],
)
def test_a_corrupt_entity_is_skipped_and_counted_by_its_listing_only(
    corrupt_server, prefix, record_id, list_call, field, get_call, get_request
):
    srv, stub, as_admin = corrupt_server
    srv.iam.create_user("amy")
    srv.iam.create_group("amy-group")
    srv.iam.create_policy(
        "amy-policy", document({"Effect": "Allow", "Action": "fs:Read*", "Resource": "*"})
    )
    srv.iam._kv.set(AUTH_PARTITION, prefix + record_id.encode(), GARBAGE)

    method, request = list_call
    reply = getattr(stub, method)(request, metadata=as_admin)
    listed = [item.id for item in getattr(reply, field)]
    assert record_id not in listed and listed  # the others are all there
    assert reply.skipped_corrupt_records == 1
    # Paged one by one: counted once in all, every other record listed.
    token, paged, skipped = "", [], 0
    while True:
        request.page_size, request.page_token = 1, token
        reply = getattr(stub, method)(request, metadata=as_admin)
        paged += [item.id for item in getattr(reply, field)]
        skipped += reply.skipped_corrupt_records
        token = reply.next_page_token
        if not token:
            break
    assert (paged, skipped) == (listed, 1)
    # The call that needs the corrupt record itself: DATA_LOSS naming it.
    error = _refused(getattr(stub, get_call), get_request, metadata=as_admin)
    assert (error.code, error.reason) == (grpc.StatusCode.DATA_LOSS, "CORRUPT_RECORD")
    assert record_id in error.metadata["key"]


def test_a_corrupt_policy_fails_only_its_users_decisions(corrupt_server):
    srv, stub, as_admin = corrupt_server
    for user in ("carol", "dave"):
        srv.iam.create_user(user)
    srv.iam.create_policy(
        "carol-deny", document({"Effect": "Deny", "Action": "fs:*", "Resource": "*"})
    )
    srv.iam.attach_user_policy("carol", "carol-deny")
    srv.iam._kv.set(AUTH_PARTITION, POLICIES + b"carol-deny", GARBAGE)
    # Listing carol's policies: skipped and counted.
    reply = stub.ListEffectivePolicies(
        auth_pb2.ListEffectivePoliciesRequest(user_id="carol"), metadata=as_admin
    )
    assert (list(reply.policies), reply.skipped_corrupt_records) == ([], 1)
    # Deciding for carol: never skipped (it might be a Deny): DATA_LOSS.
    with pytest.raises(Exception) as caught:
        srv.iam.effective_policy_records("carol")
    assert getattr(caught.value, "reason", "") == "CORRUPT_RECORD"
    assert srv.iam.effective_policy_records("dave") == []
    assert sorted(BUILTIN_POLICIES) == sorted(
        p.id for p in srv.iam.list_policies(page_size=1000)[0]
    )
