"""Auth/Setup is open to anonymous callers, so it must succeed at most once per installation,
atomically, and never depend on mutable data such as group members (issue 23, item 1).

Each test does what an attacker did, over real gRPC (the auth harness: ErrorInterceptor and
AuthInterceptor in front of the real Auth servicer, IAM over a real kv-gateway):
  * the admin moves itself into another admin group and empties / deletes Admins; an
    anonymous Setup then must not mint a new admin;
  * 8 concurrent anonymous Setup calls on a fresh installation: exactly one admin;
  * an installation set up before the installation record existed (users, no record) is
    installed: Setup refused, the record written for it.
"""

from __future__ import annotations

import json
import logging
import threading

import grpc
import pytest
from auth_harness import auth_server

from quarry.auth import interceptor as auth_interceptor
from quarry.auth.bootstrap import ADMINS
from quarry.auth.store import INSTALLED
from quarry.kv.partitions import AUTH_PARTITION
from quarry.runtime.errors import from_rpc_error
from quarry.v1 import auth_pb2, auth_pb2_grpc
from support.auth import bearer, raw_channel


def _anonymous_setup(target: str, user_id: str) -> auth_pb2.SetupResponse:
    with raw_channel(target) as channel:  # no token at all
        return auth_pb2_grpc.AuthStub(channel).Setup(
            auth_pb2.SetupRequest(user_id=user_id), timeout=30
        )


def _refused(call, *args, **kwargs):
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, **kwargs)
    return from_rpc_error(caught.value)


def _login(stub, setup: auth_pb2.SetupResponse) -> list[tuple[str, str]]:
    reply = stub.Login(
        auth_pb2.LoginRequest(
            access_key_id=setup.credentials.access_key_id,
            secret_access_key=setup.credentials.secret_access_key,
        )
    )
    return list(bearer(reply.token))


@pytest.mark.parametrize("admins_group", ["emptied", "deleted"])
def test_setup_stays_closed_when_the_admin_leaves_the_admins_group(tmp_path, admins_group):
    with auth_server(tmp_path) as srv, raw_channel(srv.target) as channel:
        stub = auth_pb2_grpc.AuthStub(channel)
        first = _anonymous_setup(srv.target, "admin")
        as_admin = _login(stub, first)
        # The attack: a second admin group holding the admin, then Admins emptied or gone.
        stub.CreateGroup(auth_pb2.CreateGroupRequest(group_id="Admins2"), metadata=as_admin)
        stub.AttachPolicyToGroup(
            auth_pb2.AttachPolicyToGroupRequest(group_id="Admins2", policy_id="AuthFullAccess"),
            metadata=as_admin,
        )
        stub.AddGroupMember(
            auth_pb2.AddGroupMemberRequest(group_id="Admins2", user_id="admin"),
            metadata=as_admin,
        )
        if admins_group == "deleted":
            stub.DeleteGroup(auth_pb2.DeleteGroupRequest(group_id=ADMINS), metadata=as_admin)
        else:
            stub.RemoveGroupMember(
                auth_pb2.RemoveGroupMemberRequest(group_id=ADMINS, user_id="admin"),
                metadata=as_admin,
            )
        srv.authorizer.invalidate()

        error = _refused(_anonymous_setup, srv.target, "mallory")

        assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "ADMIN_EXISTS")
        assert not srv.iam.user_exists("mallory")
        users, _ = srv.iam.list_users()
        assert [u.id for u in users] == ["admin"]
        # The installation record names the admin Setup created and where the call came from.
        record = srv.iam.installation()
        assert record is not None and record.admin_user_id == "admin"
        assert record.client_address.startswith("ipv4:127.0.0.1:")
        assert not record.migrated


def test_concurrent_setups_on_a_fresh_installation_create_exactly_one_admin(tmp_path):
    callers = 8
    with auth_server(tmp_path) as srv:
        start = threading.Barrier(callers)
        outcomes: dict[str, object] = {}

        def setup(user_id: str) -> None:
            start.wait()
            try:
                outcomes[user_id] = _anonymous_setup(srv.target, user_id)
            except grpc.RpcError as error:
                outcomes[user_id] = from_rpc_error(error)

        threads = [threading.Thread(target=setup, args=(f"racer{i}",)) for i in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        winners = [u for u, o in outcomes.items() if isinstance(o, auth_pb2.SetupResponse)]
        assert len(winners) == 1, outcomes
        refused = [o for u, o in outcomes.items() if u not in winners]
        assert {(e.code, e.reason) for e in refused} == {  # type: ignore[attr-defined]
            (grpc.StatusCode.FAILED_PRECONDITION, "ADMIN_EXISTS")
        }
        users, _ = srv.iam.list_users()
        assert [u.id for u in users] == winners
        members, _ = srv.iam.list_group_members(ADMINS)
        assert [m.id for m in members] == winners


def test_an_installation_from_before_the_record_is_installed(tmp_path):
    with auth_server(tmp_path) as srv:
        # As an older version left it: an admin (member of Admins), no installation record.
        srv.iam.create_user("old-admin")
        srv.iam.create_group(ADMINS)
        srv.iam.add_group_member(ADMINS, "old-admin")
        assert srv.iam.installation() is None
        # ... and then Admins emptied, as in the attack.
        srv.iam.remove_group_member(ADMINS, "old-admin")

        error = _refused(_anonymous_setup, srv.target, "mallory")

        assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "ADMIN_EXISTS")
        assert not srv.iam.user_exists("mallory")
        record = srv.iam.installation()
        assert record is not None and record.migrated
        # From now on only the record decides: even with every user gone, Setup stays closed.
        srv.iam.delete_user("old-admin")
        error = _refused(_anonymous_setup, srv.target, "mallory")
        assert error.reason == "ADMIN_EXISTS"


def test_a_corrupt_installation_record_keeps_setup_closed(tmp_path):
    with auth_server(tmp_path) as srv:
        srv.iam._kv.set(AUTH_PARTITION, INSTALLED, b"\xff\xff not a record")
        error = _refused(_anonymous_setup, srv.target, "mallory")
        assert error.reason == "ADMIN_EXISTS"
        assert not srv.iam.user_exists("mallory")


# ---- the audit lines of these calls (issue 23, item 8) -------------------------------------


def _audit_lines(caplog) -> list[dict]:
    return [
        json.loads(r.getMessage())
        for r in caplog.records
        if r.name == auth_interceptor.AUDIT_LOGGER
    ]


def test_the_setup_audit_line_names_the_admin_it_created_and_the_client(tmp_path, caplog):
    with (
        auth_server(tmp_path) as srv,
        caplog.at_level(logging.INFO, logger=auth_interceptor.AUDIT_LOGGER),
    ):
        created = _anonymous_setup(srv.target, "admin")
        _refused(_anonymous_setup, srv.target, "mallory")
    ok, refused = [line for line in _audit_lines(caplog) if line["method"].endswith("/Setup")]
    assert ok["outcome"] == "ok" and ok["principal"] == "anonymous"
    assert ok["created_user"] == "admin"
    assert ok["created_access_key_id"] == created.credentials.access_key_id
    assert ok["peer"].startswith("ipv4:127.0.0.1:")
    assert created.credentials.secret_access_key not in json.dumps(ok)
    assert refused["outcome"] == "failed" and refused["code"] == "FAILED_PRECONDITION"
    assert "created_user" not in refused and refused["peer"].startswith("ipv4:127.0.0.1:")


def test_a_refused_call_is_audited_as_the_principal_its_token_proves(tmp_path, caplog):
    with auth_server(tmp_path) as srv, raw_channel(srv.target) as channel:
        stub = auth_pb2_grpc.AuthStub(channel)
        _anonymous_setup(srv.target, "admin")
        srv.iam.create_user("bob")
        record, secret = srv.iam.create_credentials("bob")
        token = stub.Login(
            auth_pb2.LoginRequest(access_key_id=record.access_key_id, secret_access_key=secret)
        ).token
        srv.iam.delete_credentials("bob", record.access_key_id)  # revoked: token refused
        srv.authorizer.invalidate()
        with caplog.at_level(logging.INFO, logger=auth_interceptor.AUDIT_LOGGER):
            error = _refused(
                stub.CreateUser, auth_pb2.CreateUserRequest(user_id="eve"), metadata=bearer(token)
            )
        assert error.code == grpc.StatusCode.UNAUTHENTICATED
        (line,) = [x for x in _audit_lines(caplog) if x["method"].endswith("/CreateUser")]
        assert line["outcome"] == "unauthenticated"
        assert line["principal"] == "user:bob"  # not "anonymous": the token proves who
