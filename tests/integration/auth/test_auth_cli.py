"""`quarry setup` and `quarry auth ...` as a user runs them, against a server with
authentication on (auth_harness) in this process (the commands in process as a child would
see them, support.cli)."""

from __future__ import annotations

import json
import stat
import subprocess

import grpc
import pytest
from auth_harness import auth_server

from quarry.v1 import auth_pb2, auth_pb2_grpc
from support.cli import run_quarry
from support.processes import quarry_env


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with auth_server(tmp_path_factory.mktemp("auth-cli")) as running:
        yield running


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("cli-home")


def run(server, home, *args: str, expect: int = 0, **env: str) -> subprocess.CompletedProcess:
    child_env = quarry_env(home, QUARRY_COMMITTER_ADDRESS=server.target)
    # This server's admin is made by `quarry setup` here and its key is its own: not the
    # suite-wide test admin and key.
    for name in ("QUARRY_ACCESS_KEY_ID", "QUARRY_SECRET_ACCESS_KEY", "QUARRY_AUTH_SIGNING_KEY"):
        child_env.pop(name, None)
    child_env.update(env)
    result = run_quarry([*args, "--branch-manager", server.target], child_env)
    assert result.returncode == expect, (args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result


def fields(text: str) -> dict[str, str]:
    pairs = (line.partition(":") for line in text.splitlines())
    return {key.strip(): value.split()[0] if value.split() else "" for key, _, value in pairs}


@pytest.fixture(scope="module")
def admin_home(server, home):
    """`quarry setup`: the admin's credentials stored in the home, mode 0600."""
    out = run(server, home, "setup").stdout
    path = home / "credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = json.loads(path.read_text())
    shown = fields(out)
    assert shown["access key id"] == stored["access_key_id"]
    assert shown["secret access key"] == stored["secret_access_key"]
    return home


def test_setup_refuses_to_overwrite_credentials_and_a_second_admin(server, admin_home, tmp_path):
    """Safety: an existing credentials file is never replaced (it may be the only copy of a
    key), and a second setup of the installation is refused by the server."""
    before = (admin_home / "credentials.json").read_bytes()
    err = run(server, admin_home, "setup", expect=1).stderr
    assert "CREDENTIALS_FILE_EXISTS" in err
    assert (admin_home / "credentials.json").read_bytes() == before
    err = run(server, tmp_path, "setup", expect=1).stderr
    assert "ADMIN_EXISTS" in err
    assert not (tmp_path / "credentials.json").exists()


def test_whoami_users_and_credentials(server, admin_home, tmp_path):
    assert fields(run(server, admin_home, "auth", "whoami").stdout)["id"] == "admin"
    run(server, admin_home, "auth", "users", "create", "bob", "--email", "bob@example.com")
    listed = run(server, admin_home, "auth", "users", "list", "--json").stdout
    assert "bob" in [u["id"] for u in json.loads(listed)]
    created = fields(run(server, admin_home, "auth", "credentials", "create", "bob").stdout)
    key_id, secret = created["access key id"], created["secret access key"]
    listed = run(server, admin_home, "auth", "credentials", "list", "bob").stdout
    assert key_id in listed and secret not in listed
    # bob, by the environment, in an empty home
    as_bob = {"QUARRY_ACCESS_KEY_ID": key_id, "QUARRY_SECRET_ACCESS_KEY": secret}
    assert fields(run(server, tmp_path, "auth", "whoami", **as_bob).stdout)["id"] == "bob"
    err = run(server, tmp_path, "auth", "users", "create", "eve", expect=1, **as_bob).stderr
    assert "PERMISSION_DENIED" in err and "auth:CreateUser" in err
    # Deleting asks first; without --yes off a terminal nothing is deleted.
    err = run(server, admin_home, "auth", "users", "delete", "bob", expect=1).stderr
    assert "CONFIRMATION_REQUIRED" in err
    assert server.iam.get_user("bob").id == "bob"
    run(server, admin_home, "auth", "credentials", "delete", "bob", key_id, "--yes")
    err = run(server, tmp_path, "auth", "whoami", expect=1, **as_bob).stderr
    assert "INVALID_CREDENTIALS" in err
    run(server, admin_home, "auth", "users", "delete", "bob", "--yes")


def test_groups_and_policies(server, admin_home, tmp_path):
    run(server, admin_home, "auth", "users", "create", "carol")
    run(server, admin_home, "auth", "groups", "create", "readers", "--description", "read")
    run(server, admin_home, "auth", "groups", "add-member", "readers", "carol")
    assert "readers" in run(server, admin_home, "auth", "groups", "list").stdout
    policy = tmp_path / "policy.json"
    policy.write_text(
        json.dumps({"Statement": [{"Effect": "Allow", "Action": ["fs:Read*"], "Resource": "*"}]})
    )
    run(server, admin_home, "auth", "policies", "create", "read-all", "--file", str(policy))
    run(server, admin_home, "auth", "policies", "attach", "read-all", "--group", "readers")
    effective = run(
        server, admin_home, "auth", "policies", "list", "--user", "carol", "--effective"
    ).stdout
    assert "read-all" in effective
    assert "fs:Read*" in run(server, admin_home, "auth", "policies", "show", "read-all").stdout
    policy.write_text('{"Statement": [{"Effect": "Allow", "Action": ["fs:Nope"]}]}')
    err = run(
        server, admin_home, "auth", "policies", "create", "bad", "--file", str(policy), expect=1
    ).stderr
    assert "INVALID_POLICY" in err
    run(server, admin_home, "auth", "policies", "detach", "read-all", "--group", "readers")
    run(server, admin_home, "auth", "groups", "remove-member", "readers", "carol")
    run(server, admin_home, "auth", "policies", "delete", "read-all", "--yes")
    run(server, admin_home, "auth", "groups", "delete", "readers", "--yes")
    assert "read-all" not in run(server, admin_home, "auth", "policies", "list").stdout


def test_policies_update_and_attach_to_a_user(server, admin_home, tmp_path):
    run(server, admin_home, "auth", "users", "create", "dave")
    policy = tmp_path / "policy.json"
    policy.write_text(
        json.dumps({"Statement": [{"Effect": "Allow", "Action": ["fs:Read*"], "Resource": "*"}]})
    )
    run(server, admin_home, "auth", "policies", "create", "dave-p", "--file", str(policy))
    run(server, admin_home, "auth", "policies", "attach", "dave-p", "--user", "dave")
    assert "dave-p" in run(server, admin_home, "auth", "policies", "list", "--user", "dave").stdout
    policy.write_text(
        json.dumps({"Statement": [{"Effect": "Deny", "Action": ["fs:*"], "Resource": "*"}]})
    )
    out = run(server, admin_home, "auth", "policies", "update", "dave-p", "--file", str(policy))
    assert "Updated policy dave-p" in out.stdout
    shown = run(server, admin_home, "auth", "policies", "show", "dave-p").stdout
    assert "Deny" in shown and "fs:Read*" not in shown
    err = run(
        server, admin_home, "auth", "policies", "update", "nobody", "--file", str(policy), expect=1
    ).stderr
    assert "POLICY_NOT_FOUND" in err
    policy.write_text('{"Statement": [{"Effect": "Allow", "Action": ["fs:Nope"]}]}')
    err = run(
        server, admin_home, "auth", "policies", "update", "dave-p", "--file", str(policy), expect=1
    ).stderr
    assert "INVALID_POLICY" in err
    assert "Deny" in run(server, admin_home, "auth", "policies", "show", "dave-p").stdout
    run(server, admin_home, "auth", "policies", "detach", "dave-p", "--user", "dave")
    assert (
        "dave-p" not in run(server, admin_home, "auth", "policies", "list", "--user", "dave").stdout
    )


def test_without_credentials_the_cli_says_how_to_get_them(server, admin_home, tmp_path):
    err = run(server, tmp_path, "repo", "list", expect=1).stderr
    assert "TOKEN_MISSING" in err and "quarry setup" in err
    doctor = ("doctor", "--kv-gateway", server.target)
    assert "TOKEN_MISSING" in run(server, tmp_path, *doctor, expect=1).stderr
    err = run(server, tmp_path, "auth", "token", expect=1).stderr
    assert "NO_CREDENTIALS" in err and "QUARRY_ACCESS_KEY_ID" in err


def test_doctor_reads_the_kv_gateway_with_the_callers_token(server, admin_home):
    out = run(server, admin_home, "doctor", "--kv-gateway", server.target).stdout
    assert "no problems found" in out


def test_tokens_for_grpcurl_and_for_services(server, admin_home):
    token = run(server, admin_home, "auth", "token").stdout.strip()
    with grpc.insecure_channel(server.target) as channel:
        me = auth_pb2_grpc.AuthStub(channel).WhoAmI(
            auth_pb2.WhoAmIRequest(), metadata=[("authorization", f"Bearer {token}")]
        )
    assert me.principal_id == "admin"
    minted = run(
        server,
        admin_home,
        "auth",
        "token",
        "--service",
        "committer",
        QUARRY_AUTH_SIGNING_KEY=server.signing_key,
    ).stdout.strip()
    principal = server.tokens.verify(minted)
    assert (principal.kind, principal.id) == ("service", "committer")
    key_file = admin_home / "signing.key"
    key_file.write_text(server.signing_key + "\n")
    minted = run(server, admin_home, "auth", "token", "--service", "kv-gateway").stdout.strip()
    assert server.tokens.verify(minted).id == "kv-gateway"
    key_file.unlink()
    err = run(server, admin_home, "auth", "token", "--service", "kv-gateway", expect=1).stderr
    assert "NO_SIGNING_KEY" in err


@pytest.fixture(autouse=True)
def _clients_send_only_their_own_tokens(monkeypatch):
    """These tests are about the client's own login: no test-wide token on its channels."""
    import grpc

    from support.auth import RAW_INSECURE_CHANNEL

    monkeypatch.setattr(grpc, "insecure_channel", RAW_INSECURE_CHANNEL)
