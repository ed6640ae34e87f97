"""Identity and access over real gRPC on loopback.

The IAM store against a real kv-gateway; and a server with the ErrorInterceptor and the
AuthInterceptor in front of the REAL Auth, BranchManager, Committer and KVGateway servicers
(branch-manager and committer talk to a real kv-gateway and range-writer): Login → token →
WhoAmI, every bad token, open methods, service-only RPCs, the audit log, revocation, and an
authorization matrix (allowed / explicit deny / no grant) over representative RPCs of the
declaration table. (The full matrix over the running suite: test_authorization_matrix.py.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from concurrent import futures
from dataclasses import dataclass

import grpc
import jwt
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from quarry.auth import interceptor as auth_interceptor
from quarry.auth.authorizer import Authorizer
from quarry.auth.bootstrap import DEVELOPERS, VIEWERS, setup_admin
from quarry.auth.declarations import RULES
from quarry.auth.interceptor import AuthInterceptor
from quarry.auth.policy import document
from quarry.auth.store import IamStore
from quarry.auth.tokens import TokenAuthority
from quarry.config import load_settings
from quarry.kv.memory import MemoryStore
from quarry.kv.partitions import AUTH_PARTITION
from quarry.kv.remote import RemoteStore
from quarry.runtime.errors import ErrorInterceptor, from_rpc_error
from quarry.runtime.server import ServerInfoServicer, create_server
from quarry.v1 import (
    auth_pb2,
    auth_pb2_grpc,
    branch_manager_pb2,
    branch_manager_pb2_grpc,
    committer_pb2,
    committer_pb2_grpc,
    kv_pb2,
    kv_pb2_grpc,
    server_info_pb2,
    server_info_pb2_grpc,
    types_pb2,
)
from support.auth import TEST_SIGNING_KEY, raw_channel, service_channel
from support.clocks import MovableClock
from support.counting import CountingStore

CACHE_SECONDS = 2.0
FAST_HASH = 2**10


@dataclass
class Secured:
    target: str
    iam: IamStore
    tokens: TokenAuthority
    authorizer: Authorizer
    channel: grpc.Channel
    namespace_root: str
    backend: CountingStore
    clock: MovableClock  # the authorizer's: a test moves it past the cache lifetime

    def auth(self):
        return auth_pb2_grpc.AuthStub(self.channel)

    def bm(self):
        return branch_manager_pb2_grpc.BranchManagerStub(self.channel)

    def committer(self):
        return committer_pb2_grpc.CommitterStub(self.channel)

    def kv(self):
        return kv_pb2_grpc.KVGatewayStub(self.channel)

    def token_of(self, user_id: str) -> str:
        record, secret = self.iam.create_credentials(user_id)
        reply = self.auth().Login(
            auth_pb2.LoginRequest(access_key_id=record.access_key_id, secret_access_key=secret)
        )
        return reply.token


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def failure(call, *args, **kwargs):
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, **kwargs)
    return from_rpc_error(caught.value)


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    from quarry.services.branch_manager.auth_servicer import AuthServicer
    from quarry.services.branch_manager.service import build as build_branch_manager
    from quarry.services.committer.service import build as build_committer
    from quarry.services.kv_gateway.service import build as build_kv_gateway
    from quarry.services.range_writer.service import build as build_range_writer

    home = tmp_path_factory.mktemp("auth-home")
    backend = CountingStore(MemoryStore())
    settings = load_settings(
        env={},
        home=str(home),
        metrics_base_port=0,
        compactor_enabled=False,
        auth_signing_key=TEST_SIGNING_KEY,
    )
    with contextlib.ExitStack() as stack:
        kv_server, kv_port = create_server(
            settings, build_kv_gateway(settings, backend=backend), port=0, host="127.0.0.1"
        )
        stack.callback(kv_server.stop, 1.0)
        settings = settings.replace(kv_gateway_address=f"127.0.0.1:{kv_port}")
        rw_server, rw_port = create_server(
            settings, build_range_writer(settings), port=0, host="127.0.0.1"
        )
        stack.callback(rw_server.stop, 1.0)
        settings = settings.replace(range_writer_address=f"127.0.0.1:{rw_port}")

        # The IAM store talks to the kv-gateway as a service would (writes are service-only).
        iam = IamStore(
            RemoteStore(service_channel(settings.kv_gateway_address)), hash_cost=FAST_HASH
        )
        tokens = TokenAuthority(TEST_SIGNING_KEY)
        clock = MovableClock()
        authorizer = Authorizer(iam, cache_seconds=CACHE_SECONDS, clock=clock)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8),
            interceptors=[ErrorInterceptor(), AuthInterceptor(tokens, authorizer)],
        )
        specs = [
            build_branch_manager(settings),
            build_committer(settings),
            build_kv_gateway(settings, backend=backend),
        ]
        for spec in specs:
            spec.register(server)
            for work in spec.on_ready:
                work()
            for closer in spec.on_stop:
                stack.callback(closer)
        # After the specs: this Auth servicer (sharing the interceptor's authorizer) replaces
        # the one branch-manager's spec registers.
        auth_pb2_grpc.add_AuthServicer_to_server(AuthServicer(iam, tokens, authorizer), server)
        server_info_pb2_grpc.add_ServerInfoServicer_to_server(ServerInfoServicer("test"), server)
        health_servicer = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(["quarry.v1.Auth", reflection.SERVICE_NAME], server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        stack.callback(lambda: server.stop(1.0).wait())
        channel = raw_channel(f"127.0.0.1:{port}")  # no test token
        stack.callback(channel.close)
        root = home / "lake"
        root.mkdir()
        yield Secured(
            f"127.0.0.1:{port}", iam, tokens, authorizer, channel, str(root), backend, clock
        )


@pytest.fixture(scope="module")
def admin(secured):
    _, credential, secret = setup_admin(secured.iam, "admin")
    reply = secured.auth().Login(
        auth_pb2.LoginRequest(access_key_id=credential.access_key_id, secret_access_key=secret)
    )
    return reply.token


# ---- the IAM store against the real kv-gateway ----------------------------------------------


def test_iam_store_over_the_kv_gateway(secured, admin):  # admin first: Setup is once
    iam = secured.iam
    for i in range(7):
        iam.create_user(f"gw-user{i}")
    iam.create_group("gw-group")
    iam.create_policy(
        "gw-policy", document({"Effect": "Allow", "Action": "fs:Read*", "Resource": "*"})
    )
    iam.add_group_member("gw-group", "gw-user3")
    iam.attach_group_policy("gw-group", "gw-policy")
    record, secret = iam.create_credentials("gw-user3")
    pages, token, seen = 0, "", []
    while True:
        page, token = iam.list_users(page_size=3, page_token=token)
        seen += [u.id for u in page if u.id.startswith("gw-")]
        pages += 1
        if not token:
            break
    assert seen == [f"gw-user{i}" for i in range(7)] and pages >= 3
    assert [p.id for p in iam.effective_policy_records("gw-user3")] == ["gw-policy"]
    assert iam.authenticate(record.access_key_id, secret).user_id == "gw-user3"
    remote = RemoteStore(secured.iam._kv._channel)
    for item in remote.scan(AUTH_PARTITION):
        assert secret.encode() not in item.value and secret.encode() not in item.key
    iam.delete_group("gw-group")
    iam.delete_user("gw-user3")
    left = [
        item.key
        for item in remote.scan(AUTH_PARTITION)
        if b"gw-user3" in item.key or b"gw-group" in item.key
    ]
    assert left == []


# ---- sessions and tokens --------------------------------------------------------------------


def test_login_token_whoami(secured, admin, caplog):
    secured.iam.create_user("wendy")
    record, secret = secured.iam.create_credentials("wendy")
    with caplog.at_level(logging.DEBUG):
        reply = secured.auth().Login(
            auth_pb2.LoginRequest(access_key_id=record.access_key_id, secret_access_key=secret)
        )
        assert reply.expires_at.seconds > time.time() + 3000
        me = secured.auth().WhoAmI(auth_pb2.WhoAmIRequest(), metadata=bearer(reply.token))
    assert (me.principal_kind, me.principal_id, me.user.id) == ("user", "wendy", "wendy")
    assert all(secret not in r.getMessage() for r in caplog.records)
    wrong = failure(
        secured.auth().Login,
        auth_pb2.LoginRequest(access_key_id=record.access_key_id, secret_access_key=secret[::-1]),
    )
    assert (wrong.code.name, wrong.reason) == ("UNAUTHENTICATED", "INVALID_CREDENTIALS")


def test_credentials_created_over_grpc_show_the_secret_once(secured, admin):
    stub = secured.auth()
    stub.CreateUser(auth_pb2.CreateUserRequest(user_id="oscar"), metadata=bearer(admin))
    created = stub.CreateCredentials(
        auth_pb2.CreateCredentialsRequest(user_id="oscar"), metadata=bearer(admin)
    )
    assert len(created.secret_access_key) == 40
    listed = stub.ListCredentials(
        auth_pb2.ListCredentialsRequest(user_id="oscar"), metadata=bearer(admin)
    )
    assert [c.access_key_id for c in listed.credentials] == [created.credentials.access_key_id]
    assert created.secret_access_key not in str(listed)


def test_every_bad_token_is_unauthenticated_with_its_reason(secured, admin):
    who = secured.auth().WhoAmI
    request = auth_pb2.WhoAmIRequest()
    past = TokenAuthority(secured.tokens._key, clock=lambda: time.time() - 7200)
    now = int(time.time())
    claims = {"sub": "admin", "typ": "user", "iss": "quarry", "iat": now, "exp": now + 600}
    cases = {
        "TOKEN_MISSING": [],
        "TOKEN_MALFORMED": [("authorization", "Basic YWRtaW46YWRtaW4=")],
        "TOKEN_EXPIRED": bearer(past.issue_user_token("admin")[0]),
        "TOKEN_INVALID_SIGNATURE": bearer(TokenAuthority(b"z" * 32).issue_user_token("admin")[0]),
        "TOKEN_ALGORITHM": bearer(jwt.encode(claims, None, algorithm="none")),
        "TOKEN_TYPE_UNKNOWN": bearer(
            jwt.encode({**claims, "typ": "root"}, secured.tokens._key, algorithm="HS256")
        ),
        "PRINCIPAL_UNKNOWN": bearer(secured.tokens.issue_user_token("ghost")[0]),
        # Signed with the real key (a leaked key): still no far-future or ageless token.
        "TOKEN_NOT_YET_VALID": bearer(
            jwt.encode(
                {**claims, "iat": now + 3600, "exp": now + 7200},
                secured.tokens._key,
                algorithm="HS256",
            )
        ),
        "TOKEN_LIFETIME_EXCEEDED": bearer(
            jwt.encode({**claims, "exp": 2**40}, secured.tokens._key, algorithm="HS256")
        ),
    }
    for reason, metadata in cases.items():
        error = failure(who, request, metadata=metadata)
        assert (error.code.name, error.reason) == ("UNAUTHENTICATED", reason)
        # A mutating RPC is refused the same way, before the servicer runs.
        error = failure(
            secured.bm().CreateRepository,
            branch_manager_pb2.CreateRepositoryRequest(
                name="never", storage_namespace=f"{secured.namespace_root}/never"
            ),
            metadata=metadata,
        )
        assert error.reason == reason
    never = failure(
        secured.bm().GetRepository,
        branch_manager_pb2.GetRepositoryRequest(name="never"),
        metadata=bearer(admin),
    )
    assert never.code.name == "NOT_FOUND"  # no refused call reached the servicer


def test_health_reflection_and_serverinfo_stay_open(secured):
    health_stub = health_pb2_grpc.HealthStub(secured.channel)
    assert (
        health_stub.Check(health_pb2.HealthCheckRequest()).status
        == health_pb2.HealthCheckResponse.SERVING
    )
    info = server_info_pb2_grpc.ServerInfoStub(secured.channel).GetServerInfo(
        server_info_pb2.GetServerInfoRequest()
    )
    assert info.service == "test"
    stub = reflection_pb2_grpc.ServerReflectionStub(secured.channel)
    replies = list(
        stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    )
    assert any(s.name == "quarry.v1.Auth" for s in replies[0].list_services_response.service)


def test_a_deleted_user_and_a_revoked_credential_stop_working(secured, admin):
    secured.iam.create_user("temp")
    secured.iam.add_group_member(VIEWERS, "temp")
    token = secured.token_of("temp")
    who = secured.auth().WhoAmI
    assert who(auth_pb2.WhoAmIRequest(), metadata=bearer(token)).principal_id == "temp"
    key_id = secured.iam.list_credentials("temp")[0][0].access_key_id
    # Revoked through another process's store: within the cache lifetime.
    IamStore(RemoteStore(secured.iam._kv._channel)).delete_credentials("temp", key_id)
    secured.clock.advance(CACHE_SECONDS)
    assert (
        failure(who, auth_pb2.WhoAmIRequest(), metadata=bearer(token)).reason
        == "CREDENTIAL_REVOKED"
    )
    # Deleted through the Auth service of this process: at once.
    token = secured.token_of("temp")
    assert who(auth_pb2.WhoAmIRequest(), metadata=bearer(token)).principal_id == "temp"
    secured.auth().DeleteUser(auth_pb2.DeleteUserRequest(user_id="temp"), metadata=bearer(admin))
    assert failure(who, auth_pb2.WhoAmIRequest(), metadata=bearer(token)).reason in (
        "PRINCIPAL_UNKNOWN",
        "CREDENTIAL_REVOKED",
    )


# ---- internal RPCs ---------------------------------------------------------------------------


def test_kv_writes_accept_only_service_principals(secured, admin):
    item = kv_pb2.SetItemRequest(partition_key=b"quarry", key=b"format-version", value=b"99")
    error = failure(secured.kv().SetItem, item, metadata=bearer(admin))
    assert (error.code.name, error.reason) == ("PERMISSION_DENIED", "SERVICE_PRINCIPAL_REQUIRED")
    got = secured.kv().GetItem(
        kv_pb2.GetItemRequest(partition_key=b"quarry", key=b"format-version"),
        metadata=bearer(admin),
    )
    assert got.value != b"99"  # admin may read (kv:Read), not write
    service = secured.tokens.issue_service_token("branch-manager")[0]
    probe = kv_pb2.SetItemRequest(partition_key=b"cleanup", key=b"auth-test", value=b"")
    secured.kv().SetItem(probe, metadata=bearer(service))
    secured.kv().DeleteItem(
        kv_pb2.DeleteItemRequest(partition_key=b"cleanup", key=b"auth-test"),
        metadata=bearer(service),
    )


# ---- the authorization matrix ------------------------------------------------------------------


@pytest.fixture(scope="module")
def matrix(secured, admin):
    """A repository with one commit; three users per the matrix."""
    bm = secured.bm()
    md = bearer(admin)
    bm.CreateRepository(
        branch_manager_pb2.CreateRepositoryRequest(
            name="demo", storage_namespace=f"{secured.namespace_root}/demo"
        ),
        metadata=md,
    )
    bm.PutObject(
        branch_manager_pb2.PutObjectRequest(
            repository="demo",
            branch="main",
            entry=types_pb2.Entry(path="a/one", physical_address="s3://b/one", size_bytes=1),
        ),
        metadata=md,
    )
    secured.committer().Commit(
        committer_pb2.CommitRequest(
            repository="demo", branch="main", message="first", committer="admin"
        ),
        metadata=md,
    )
    iam = secured.iam
    iam.create_policy("matrix-all", document({"Effect": "Allow", "Action": ["*"], "Resource": "*"}))
    iam.create_policy(
        "matrix-deny",
        document({"Effect": "Deny", "Action": ["fs:*", "auth:*", "kv:Read"], "Resource": "*"}),
    )
    iam.create_policy(
        "matrix-allow",
        document(
            {
                "Effect": "Allow",
                "Action": ["fs:*", "auth:CreateUser", "kv:Read"],
                "Resource": [
                    "arn:quarry:fs:::repository/demo*",
                    # staging s3://b/... at its own address (fs:ImportFromStorage)
                    "arn:quarry:fs:::storage/s3://b/*",
                    "arn:quarry:auth:::user/m-*",
                    "arn:quarry:kv:::partition/*",
                ],
            }
        ),
    )
    for user, policies in {
        "m-allowed": ["matrix-allow"],
        "m-denied": ["matrix-all", "matrix-deny"],
        "m-nogrant": [],
    }.items():
        iam.create_user(user)
        for policy in policies:
            iam.attach_user_policy(user, policy)
    return {user: secured.token_of(user) for user in ("m-allowed", "m-denied", "m-nogrant")}


def _calls(secured):
    bm, committer, auth, kv = (secured.bm(), secured.committer(), secured.auth(), secured.kv())
    entry = types_pb2.Entry(path="a/two", physical_address="s3://b/two", size_bytes=2)
    bmp, cp = branch_manager_pb2, committer_pb2
    return {
        "BranchManager/StatObject": lambda md: bm.StatObject(
            bmp.StatObjectRequest(repository="demo", ref="main", path="a/one"), metadata=md
        ),
        "BranchManager/ListObjects": lambda md: bm.ListObjects(
            bmp.ListObjectsRequest(repository="demo", ref="main"), metadata=md
        ),
        "BranchManager/PutObject": lambda md: bm.PutObject(
            bmp.PutObjectRequest(repository="demo", branch="main", entry=entry), metadata=md
        ),
        "BranchManager/PutObjects": lambda md: bm.PutObjects(
            iter([bmp.PutObjectsRequest(repository="demo", branch="main", entries=[entry])]),
            metadata=md,
        ),
        "BranchManager/CreateBranch": lambda md: bm.CreateBranch(
            bmp.CreateBranchRequest(
                repository="demo", name=f"b-{uuid.uuid4().hex[:8]}", source_ref="main"
            ),
            metadata=md,
        ),
        "Committer/Log": lambda md: committer.Log(
            cp.LogRequest(repository="demo", ref="main"), metadata=md
        ),
        "Committer/Commit": lambda md: committer.Commit(
            cp.CommitRequest(repository="demo", branch="main", message="m", allow_empty=True),
            metadata=md,
        ),
        "Auth/CreateUser": lambda md: auth.CreateUser(
            auth_pb2.CreateUserRequest(user_id=f"m-{uuid.uuid4().hex[:8]}"), metadata=md
        ),
        "KVGateway/ScanItems": lambda md: list(
            kv.ScanItems(kv_pb2.ScanItemsRequest(partition_key=b"quarry"), metadata=md)
        ),
        "KVGateway/GetItem": lambda md: kv.GetItem(
            kv_pb2.GetItemRequest(partition_key=b"quarry", key=b"format-version"), metadata=md
        ),
    }


@pytest.mark.parametrize(
    "rpc",
    sorted(
        [
            "BranchManager/StatObject",
            "BranchManager/ListObjects",
            "BranchManager/PutObject",
            "BranchManager/PutObjects",
            "BranchManager/CreateBranch",
            "Committer/Log",
            "Committer/Commit",
            "Auth/CreateUser",
            "KVGateway/GetItem",
            "KVGateway/ScanItems",
        ]
    ),
)
def test_authorization_matrix(secured, matrix, rpc):
    rule = RULES[f"/quarry.v1.{rpc}"]
    call = _calls(secured)[rpc]
    call(bearer(matrix["m-allowed"]))  # succeeds: allowed
    for user, decision in (("m-denied", "deny"), ("m-nogrant", "no_grant")):
        error = failure(call, bearer(matrix[user]))
        assert (error.code.name, error.reason) == ("PERMISSION_DENIED", "PERMISSION_DENIED")
        assert error.metadata["action"] == rule.action
        assert error.metadata["decision"] == decision
        assert rule.action in error.message and error.metadata["resource"] in error.message


def test_check_permission_answers_the_callers_own_permission(secured, matrix):
    """Auth/CheckPermission decides as a call of that action would be decided: allowed ->
    OK; an explicit Deny or no grant -> PERMISSION_DENIED naming action and resource; a
    service is allowed; an action no policy names -> INVALID_ARGUMENT; no token ->
    UNAUTHENTICATED."""
    check = secured.auth().CheckPermission
    inside = auth_pb2.CheckPermissionRequest(
        action="fs:WriteObject", resource="arn:quarry:fs:::repository/demo/object/a/x"
    )
    outside = auth_pb2.CheckPermissionRequest(
        action="fs:WriteObject", resource="arn:quarry:fs:::repository/other/object/a/x"
    )
    check(inside, metadata=bearer(matrix["m-allowed"]))
    for user, request, decision in (
        ("m-allowed", outside, "no_grant"),
        ("m-denied", inside, "deny"),
        ("m-nogrant", inside, "no_grant"),
    ):
        error = failure(check, request, metadata=bearer(matrix[user]))
        assert (error.code.name, error.metadata["decision"]) == ("PERMISSION_DENIED", decision)
        assert error.metadata["resource"] == request.resource
    service, _ = secured.tokens.issue_service_token("s3-gateway")
    check(outside, metadata=bearer(service))
    unknown = auth_pb2.CheckPermissionRequest(action="fs:Everything", resource=inside.resource)
    error = failure(check, unknown, metadata=bearer(matrix["m-allowed"]))
    assert (error.code.name, error.reason) == ("INVALID_ARGUMENT", "UNKNOWN_ACTION")
    assert failure(check, inside).code.name == "UNAUTHENTICATED"


def test_a_refused_permission_check_is_audited_as_the_refused_write(secured, matrix, caplog):
    """A service checks a write it then never sends (the s3-gateway's multipart upload, the
    console's upload): a refusal is one audit line naming the action and resource checked
    (tester hAQ: those refusals left none); an allowed check, a read, none."""
    check = secured.auth().CheckPermission
    resource = "arn:quarry:fs:::repository/demo/object/a/audited-check"
    request = auth_pb2.CheckPermissionRequest(action="fs:WriteObject", resource=resource)
    with caplog.at_level(logging.INFO, logger=auth_interceptor.AUDIT_LOGGER):
        check(request, metadata=bearer(matrix["m-allowed"]))
        failure(check, request, metadata=bearer(matrix["m-nogrant"]))
    lines = [
        json.loads(r.getMessage())
        for r in caplog.records
        if r.name == auth_interceptor.AUDIT_LOGGER and "CheckPermission" in r.getMessage()
    ]
    assert [(l["principal"], l["action"], l["resource"], l["outcome"]) for l in lines] == [
        ("user:m-nogrant", "fs:WriteObject", resource, "denied")
    ]


def test_a_stream_is_authorized_message_by_message(secured, admin):
    secured.iam.create_user("streamer")
    secured.iam.add_group_member(DEVELOPERS, "streamer")
    secured.iam.create_policy(
        "no-locked",
        document(
            {
                "Effect": "Deny",
                "Action": ["fs:WriteObject", "fs:DeleteObject"],
                "Resource": "arn:quarry:fs:::repository/demo/object/locked/*",
            }
        ),
    )
    secured.iam.attach_user_policy("streamer", "no-locked")
    token = secured.token_of("streamer")
    bmp = branch_manager_pb2

    def entry(path):
        # Inside demo's namespace: staging there needs no fs:ImportFromStorage.
        address = f"{secured.namespace_root}/demo/{path}"
        return types_pb2.Entry(path=path, physical_address=address, size_bytes=1)

    messages = [
        bmp.PutObjectsRequest(repository="demo", branch="main", entries=[entry("open/1")]),
        bmp.PutObjectsRequest(entries=[entry("open/2"), entry("locked/3")]),
    ]
    error = failure(secured.bm().PutObjects, iter(messages), metadata=bearer(token))
    assert error.code.name == "PERMISSION_DENIED"
    assert error.metadata["resource"].endswith("/object/locked/3")
    bulk_delete = failure(
        secured.bm().DeleteObjects,
        bmp.DeleteObjectsRequest(repository="demo", branch="main", paths=["a/one", "locked/9"]),
        metadata=bearer(token),
    )
    assert bulk_delete.metadata["resource"].endswith("/object/locked/9")
    missing = failure(
        secured.bm().StatObject,
        bmp.StatObjectRequest(repository="demo", ref="main", path="locked/3"),
        metadata=bearer(admin),
    )
    assert missing.code.name == "NOT_FOUND"


def test_one_audit_line_per_mutating_call(secured, matrix, caplog):
    request_id = str(uuid.uuid4())
    bmp = branch_manager_pb2
    entry = types_pb2.Entry(path="a/audited", physical_address="s3://b/x", size_bytes=1)
    with caplog.at_level(logging.INFO, logger=auth_interceptor.AUDIT_LOGGER):
        secured.bm().PutObject(
            bmp.PutObjectRequest(
                repository="demo", branch="main", entry=entry, request_id=request_id
            ),
            metadata=bearer(matrix["m-allowed"]),
        )
        failure(
            secured.bm().PutObject,
            bmp.PutObjectRequest(repository="demo", branch="main", entry=entry),
            metadata=bearer(matrix["m-nogrant"]),
        )
        secured.bm().StatObject(
            bmp.StatObjectRequest(repository="demo", ref="main", path="a/one"),
            metadata=bearer(matrix["m-allowed"]),
        )
    time.sleep(0.1)
    lines = [
        json.loads(r.getMessage())
        for r in caplog.records
        if r.name == auth_interceptor.AUDIT_LOGGER
    ]
    assert len(lines) == 2  # the read wrote none
    ok, denied = lines
    assert ok.pop("peer").startswith("ipv4:127.0.0.1:")
    assert ok == {
        "principal": "user:m-allowed",
        "method": "/quarry.v1.BranchManager/PutObject",
        "action": "fs:WriteObject",
        "resource": "arn:quarry:fs:::repository/demo/object/a/audited",
        "outcome": "ok",
        "code": "OK",
        "request_id": request_id,
    }
    assert denied["outcome"] == "denied" and denied["code"] == "PERMISSION_DENIED"
    assert denied["principal"] == "user:m-nogrant" and denied["request_id"]


def test_every_login_is_audited_with_the_key_tried_and_never_the_secret(secured, admin, caplog):
    """A guessed secret leaves a line naming the key and the peer (a brute force shows in
    the logs, not only in a metric); a good one names the user it signed in."""
    secured.iam.create_user("login-audited")
    record, secret = secured.iam.create_credentials("login-audited")
    wrong = "not-" + secret
    with caplog.at_level(logging.INFO, logger=auth_interceptor.AUDIT_LOGGER):
        refused = failure(
            secured.auth().Login,
            auth_pb2.LoginRequest(access_key_id=record.access_key_id, secret_access_key=wrong),
        )
        secured.auth().Login(
            auth_pb2.LoginRequest(access_key_id=record.access_key_id, secret_access_key=secret)
        )
    assert refused.code.name == "UNAUTHENTICATED"
    lines = [
        json.loads(r.getMessage())
        for r in caplog.records
        if r.name == auth_interceptor.AUDIT_LOGGER
        and json.loads(r.getMessage())["method"] == "/quarry.v1.Auth/Login"
    ]
    assert [(line["outcome"], line["access_key_id"]) for line in lines] == [
        ("unauthenticated", record.access_key_id),
        ("ok", record.access_key_id),
    ]
    assert lines[0]["peer"].startswith("ipv4:127.0.0.1:") and lines[1]["user"] == "login-audited"
    for line in caplog.records:
        assert secret not in line.getMessage() and wrong not in line.getMessage()


def test_steady_state_calls_read_nothing_from_the_auth_partition(secured, matrix):
    """The hot path: once a user's permissions are cached, StatObject and PutObject add no
    KV read of IAM data (the seed's read optimization is not paid for by security)."""
    bmp = branch_manager_pb2
    md = bearer(matrix["m-allowed"])
    stat = bmp.StatObjectRequest(repository="demo", ref="main", path="a/one")
    secured.bm().StatObject(stat, metadata=md)  # warm the cache
    secured.backend.reset()
    for i in range(10):
        secured.bm().StatObject(stat, metadata=md)
        secured.bm().PutObject(
            bmp.PutObjectRequest(
                repository="demo",
                branch="main",
                entry=types_pb2.Entry(path=f"hot/{i}", physical_address="s3://b/h", size_bytes=1),
            ),
            metadata=md,
        )
    assert secured.backend.total(cls="auth") == 0
    assert secured.backend.total() > 0  # the calls themselves did read and write
