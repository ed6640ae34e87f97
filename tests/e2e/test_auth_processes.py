"""Auth across process boundaries: `quarry serve` children (kv-gateway, range-writer,
branch-manager, committer) with auth on, the test signing key and a SQLite store, called over
loopback with tokens made here.

Every bad token is UNAUTHENTICATED with its reason; the kv-gateway refuses the admin's token
for writes but allows reads (kv:Read) and accepts a service token; a revoked credential
stops working in ANOTHER process (the committer) within its cache lifetime; the services'
own calls to each other carry service tokens (a write through branch-manager and a commit
reach the kv-gateway and the range-writer); a service refuses to start without a signing
key.
"""

from __future__ import annotations

import contextlib
import subprocess
import time

import grpc
import jwt
import pytest

from quarry.auth.tokens import TokenAuthority
from quarry.runtime.errors import from_rpc_error
from quarry.v1 import (
    auth_pb2,
    auth_pb2_grpc,
    branch_manager_pb2,
    branch_manager_pb2_grpc,
    committer_pb2,
    committer_pb2_grpc,
    kv_pb2,
    kv_pb2_grpc,
)
from support.auth import (
    TEST_ACCESS_KEY_ID,
    TEST_ADMIN,
    TEST_SECRET_ACCESS_KEY,
    TEST_SIGNING_KEY,
    bearer,
    raw_channel,
    service_token,
    setup_admin_over_grpc,
)
from support.processes import (
    VENV_BIN,
    free_port,
    quarry_env,
    quarry_serve,
    service_ports,
    wait_serving,
)

CACHE_SECONDS = 1.0
SERVICES = ("kv-gateway", "range-writer", "branch-manager", "committer")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    home = tmp_path_factory.mktemp("auth-procs")
    ports = {name: free_port() for name in SERVICES}
    extra = service_ports(ports)
    env = quarry_env(
        home,
        QUARRY_COMPACTOR_ENABLED="false",
        QUARRY_AUTH_CACHE_SECONDS=str(CACHE_SECONDS),
        **extra,
    )
    targets = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    with contextlib.ExitStack() as stack:
        for name in SERVICES:
            stack.enter_context(quarry_serve(name, env))
        for name in SERVICES:
            wait_serving(targets[name])
        setup_admin_over_grpc(targets["branch-manager"])
        channels = {name: stack.enter_context(raw_channel(t)) for name, t in targets.items()}
        yield {"targets": targets, "channels": channels, "home": home}


def login(cluster, access_key_id=TEST_ACCESS_KEY_ID, secret=TEST_SECRET_ACCESS_KEY) -> str:
    stub = auth_pb2_grpc.AuthStub(cluster["channels"]["branch-manager"])
    return stub.Login(
        auth_pb2.LoginRequest(access_key_id=access_key_id, secret_access_key=secret), timeout=10
    ).token


def refused(call, *args, **kwargs):
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, **kwargs)
    return from_rpc_error(caught.value)


def test_setup_is_refused_once_the_admin_exists(cluster):
    stub = auth_pb2_grpc.AuthStub(cluster["channels"]["branch-manager"])
    error = refused(stub.Setup, auth_pb2.SetupRequest(user_id="intruder"), timeout=10)
    assert (error.code.name, error.reason) == ("FAILED_PRECONDITION", "ADMIN_EXISTS")
    admin = login(cluster)
    me = stub.WhoAmI(auth_pb2.WhoAmIRequest(), metadata=bearer(admin), timeout=10)
    assert (me.principal_kind, me.principal_id) == ("user", TEST_ADMIN)
    error = refused(
        stub.GetUser, auth_pb2.GetUserRequest(user_id="intruder"), metadata=bearer(admin)
    )
    assert error.reason == "USER_NOT_FOUND"  # the refused Setup created nobody


def test_every_bad_token_is_unauthenticated_with_its_reason(cluster):
    admin = login(cluster)
    stub = auth_pb2_grpc.AuthStub(cluster["channels"]["branch-manager"])
    stub.CreateUser(auth_pb2.CreateUserRequest(user_id="leaver"), metadata=bearer(admin))
    leaver = TokenAuthority(TEST_SIGNING_KEY).issue_user_token("leaver")[0]
    stub.DeleteUser(auth_pb2.DeleteUserRequest(user_id="leaver"), metadata=bearer(admin))
    past = TokenAuthority(TEST_SIGNING_KEY, clock=lambda: time.time() - 7200)
    claims = {"sub": TEST_ADMIN, "typ": "user", "iss": "quarry", "iat": 1, "exp": 2**40}
    cases = {
        "TOKEN_MISSING": (),
        "TOKEN_MALFORMED": (("authorization", "Bearer not-a-jwt"),),
        "TOKEN_EXPIRED": bearer(past.issue_user_token(TEST_ADMIN)[0]),
        "TOKEN_INVALID_SIGNATURE": bearer(
            TokenAuthority(b"another-key-of-32-bytes-at-least!").issue_user_token(TEST_ADMIN)[0]
        ),
        "TOKEN_ALGORITHM": bearer(jwt.encode(claims, None, algorithm="none")),
        "PRINCIPAL_UNKNOWN": bearer(leaver),
    }
    bm = branch_manager_pb2_grpc.BranchManagerStub(cluster["channels"]["branch-manager"])
    committer = committer_pb2_grpc.CommitterStub(cluster["channels"]["committer"])
    for reason, metadata in cases.items():
        for call, request in (
            (bm.ListRepositories, branch_manager_pb2.ListRepositoriesRequest()),
            (committer.Log, committer_pb2.LogRequest(repository="r", ref="main")),
        ):
            error = refused(call, request, metadata=metadata, timeout=10)
            assert (error.code.name, error.reason) == ("UNAUTHENTICATED", reason), error
            assert error.message  # says why


def test_kv_gateway_refuses_the_admin_writes_allows_reads_and_takes_service_tokens(cluster):
    kv = kv_pb2_grpc.KVGatewayStub(cluster["channels"]["kv-gateway"])
    admin = login(cluster)
    write = kv_pb2.SetItemRequest(partition_key=b"quarry", key=b"format-version", value=b"999")
    error = refused(kv.SetItem, write, metadata=bearer(admin), timeout=10)
    assert (error.code.name, error.reason) == ("PERMISSION_DENIED", "SERVICE_PRINCIPAL_REQUIRED")
    read = kv_pb2.GetItemRequest(partition_key=b"quarry", key=b"format-version")
    version = kv.GetItem(read, metadata=bearer(admin), timeout=10).value
    assert version != b"999"  # the refused write changed nothing
    service = service_token("branch-manager")
    kv.SetItem(
        kv_pb2.SetItemRequest(partition_key=b"staging/auth-e2e", key=b"k", value=b"v"),
        metadata=bearer(service),
        timeout=10,
    )
    got = kv.GetItem(
        kv_pb2.GetItemRequest(partition_key=b"staging/auth-e2e", key=b"k"),
        metadata=bearer(service),
        timeout=10,
    )
    assert got.value == b"v"


def test_services_call_each_other_with_service_tokens(cluster):
    """A repository, a write and a commit: branch-manager and the committer reach the
    kv-gateway and the range-writer (both service-only for writes) with their own tokens."""
    admin = bearer(login(cluster))
    bm = branch_manager_pb2_grpc.BranchManagerStub(cluster["channels"]["branch-manager"])
    committer = committer_pb2_grpc.CommitterStub(cluster["channels"]["committer"])
    namespace = cluster["home"] / "lake" / "wired"
    namespace.mkdir(parents=True)
    bm.CreateRepository(
        branch_manager_pb2.CreateRepositoryRequest(name="wired", storage_namespace=str(namespace)),
        metadata=admin,
        timeout=30,
    )
    from quarry.v1 import types_pb2

    bm.PutObject(
        branch_manager_pb2.PutObjectRequest(
            repository="wired",
            branch="main",
            entry=types_pb2.Entry(path="a", physical_address=f"{namespace}/a", size_bytes=1),
        ),
        metadata=admin,
        timeout=30,
    )
    reply = committer.Commit(
        committer_pb2.CommitRequest(repository="wired", branch="main", message="m"),
        metadata=admin,
        timeout=30,
    )
    # Committed by the authenticated principal (the request named no one).
    assert reply.commit.committer == TEST_ADMIN


def test_a_revoked_credential_stops_in_another_process_within_the_cache_lifetime(cluster):
    admin = bearer(login(cluster))
    auth = auth_pb2_grpc.AuthStub(cluster["channels"]["branch-manager"])
    auth.CreateUser(auth_pb2.CreateUserRequest(user_id="temp"), metadata=admin)
    auth.AddGroupMember(
        auth_pb2.AddGroupMemberRequest(group_id="Viewers", user_id="temp"), metadata=admin
    )
    created = auth.CreateCredentials(
        auth_pb2.CreateCredentialsRequest(user_id="temp"), metadata=admin
    )
    token = login(cluster, created.credentials.access_key_id, created.secret_access_key)
    committer = committer_pb2_grpc.CommitterStub(cluster["channels"]["committer"])
    request = committer_pb2.LogRequest(repository="nowhere", ref="main")
    # Accepted by the committer (its cache now holds the credential).
    assert refused(committer.Log, request, metadata=bearer(token), timeout=10).code.name == (
        "NOT_FOUND"
    )
    auth.DeleteCredentials(
        auth_pb2.DeleteCredentialsRequest(
            user_id="temp", access_key_id=created.credentials.access_key_id
        ),
        metadata=admin,
    )
    revoked_at = time.monotonic()
    while True:
        error = refused(committer.Log, request, metadata=bearer(token), timeout=10)
        if error.reason == "CREDENTIAL_REVOKED":
            break
        assert error.code.name == "NOT_FOUND"
        assert time.monotonic() - revoked_at < CACHE_SECONDS + 1.0, "still accepted"
        time.sleep(0.05)
    assert error.code.name == "UNAUTHENTICATED"


def test_serve_refuses_to_start_with_auth_on_and_no_signing_key(tmp_path):
    env = quarry_env(tmp_path, QUARRY_KV_URL="memory://", QUARRY_KV_GATEWAY_PORT=str(free_port()))
    del env["QUARRY_AUTH_SIGNING_KEY"]
    result = subprocess.run(
        [str(VENV_BIN / "quarry"), "serve", "kv-gateway"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "no signing key" in result.stderr and "QUARRY_AUTH_SIGNING_KEY" in result.stderr


def test_a_repository_dump_restores_across_quarry_serve_processes(cluster, tmp_path):
    """`quarry repo dump` / `restore` as a user runs them: the CLI as a child process, logged
    in with its access key, against `quarry serve` children with auth on; the dump refused to
    a user without read rights, the restore to one without fs:ImportFromStorage."""
    from support.processes import VENV_BIN

    targets = cluster["targets"]
    env = quarry_env(
        tmp_path / "cli-home",
        QUARRY_BRANCH_MANAGER_ADDRESS=targets["branch-manager"],
        QUARRY_COMMITTER_ADDRESS=targets["committer"],
    )

    def quarry(*args: str, expect: int = 0) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [str(VENV_BIN / "quarry"), *args], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == expect, (args, done.stdout, done.stderr)
        return done

    namespace = cluster["home"] / "lake" / "dumped"
    source = tmp_path / "rows.csv"
    source.write_text("id\n1\n")
    quarry("repo", "create", "dumped", str(namespace))
    quarry("put", "dumped", "main", "rows.csv", "--from", str(source))
    quarry("commit", "dumped", "main", "-m", "rows")
    dump = tmp_path / "dumped.jsonl"
    assert "2 commits, 1 branch, 0 tags" in quarry("repo", "dump", "dumped", "-o", str(dump)).stdout
    quarry("repo", "delete", "dumped", "--yes")
    quarry("repo", "restore", "dumped", str(namespace), "--from", str(dump))
    assert quarry("cat", "dumped", "main", "rows.csv").stdout == "id\n1\n"

    # A user allowed to create repositories but not to import from storage: no restore.
    admin = bearer(login(cluster))
    auth = auth_pb2_grpc.AuthStub(cluster["channels"]["branch-manager"])
    from quarry.auth.policy import document

    auth.CreateUser(auth_pb2.CreateUserRequest(user_id="maker"), metadata=admin, timeout=30)
    auth.CreatePolicy(
        auth_pb2.CreatePolicyRequest(
            policy_id="MakeRepositories",
            document=document(
                {"Effect": "Allow", "Action": ["fs:CreateRepository"], "Resource": "*"}
            ),
        ),
        metadata=admin,
        timeout=30,
    )
    auth.AttachPolicy(
        auth_pb2.AttachPolicyRequest(policy_id="MakeRepositories", user_id="maker"),
        metadata=admin,
        timeout=30,
    )
    made = auth.CreateCredentials(
        auth_pb2.CreateCredentialsRequest(user_id="maker"), metadata=admin, timeout=30
    )
    quarry("repo", "delete", "dumped", "--yes")
    env.update(
        QUARRY_ACCESS_KEY_ID=made.credentials.access_key_id,
        QUARRY_SECRET_ACCESS_KEY=made.secret_access_key,
    )
    refused_restore = quarry(
        "repo", "restore", "dumped", str(namespace), "--from", str(dump), expect=1
    )
    assert "PERMISSION_DENIED" in refused_restore.stderr
    assert "fs:ImportFromStorage" in refused_restore.stderr
