"""The Python client against a real server with authentication on (auth_harness): login with
credentials, the token on every channel, re-login on an expired token, no retry on a revoked
one, no header without credentials, Auth/Setup and `quarry up`'s first-start setup, and the
Auth RPC wrappers."""

from __future__ import annotations

import io
import stat

import grpc
import pytest
from auth_harness import auth_server

from quarry import errors
from quarry.auth.bootstrap import setup_admin
from quarry.cli.setup import first_start_setup
from quarry.client import Client, Credentials, RetryPolicy, load_credentials
from quarry.client.credentials import ACCESS_KEY_ENV, SECRET_KEY_ENV

NO_RETRY = RetryPolicy.none()


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch, tmp_path):
    """Only the credentials a test gives: none from the environment or a QUARRY_HOME."""
    monkeypatch.delenv(ACCESS_KEY_ENV, raising=False)
    monkeypatch.delenv(SECRET_KEY_ENV, raising=False)
    monkeypatch.setenv("QUARRY_HOME", str(tmp_path / "client-home"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with auth_server(tmp_path_factory.mktemp("auth-client")) as running:
        yield running


@pytest.fixture(scope="module")
def admin(server) -> Credentials:
    _, credential, secret = setup_admin(server.iam, "admin")
    return Credentials(credential.access_key_id, secret)


def user_with_credentials(server, user_id: str, group: str = "") -> Credentials:
    server.iam.create_user(user_id)
    if group:
        server.iam.add_group_member(group, user_id)
    record, secret = server.iam.create_credentials(user_id)
    return Credentials(record.access_key_id, secret)


def test_a_client_with_credentials_logs_in_once_and_every_channel_carries_the_token(server, admin):
    before = len(server.logins)
    # The committer on a channel of the caller's own: it is authenticated too.
    with (
        grpc.insecure_channel(server.target) as committer,
        Client(server.target, committer, credentials=admin, retry=NO_RETRY) as client,
    ):
        assert len(server.logins) == before  # lazily: no call yet, no login
        client.create_repository("authed", str(server.namespace_root / "authed"))
        client.put_object("authed", "main", path="a", physical_address="s3://b/a", size_bytes=1)
        # Commit needs fs:CreateCommit: it went through with the token on that channel.
        assert client.commit("authed", "main", "first").commit.message == "first"
        me = client.whoami()
    assert (me.principal_kind, me.principal_id) == ("user", "admin")
    assert server.logins[before:] == [admin.access_key_id]


def test_credentials_are_found_in_the_environment(server, admin, monkeypatch):
    monkeypatch.setenv(ACCESS_KEY_ENV, admin.access_key_id)
    monkeypatch.setenv(SECRET_KEY_ENV, admin.secret_access_key)
    with Client(server.target, server.target, retry=NO_RETRY) as client:
        assert client.whoami().principal_id == "admin"


def test_without_credentials_no_header_and_unauthenticated_with_a_reason(server, admin):
    assert load_credentials() is None
    with Client(server.target, server.target, retry=NO_RETRY) as client:
        with pytest.raises(errors.QuarryError) as caught:
            client.get_repository("authed")
        assert (caught.value.code, caught.value.reason) == (
            grpc.StatusCode.UNAUTHENTICATED,
            "TOKEN_MISSING",
        )
        with pytest.raises(errors.QuarryError) as caught:
            client.token()
        assert caught.value.reason == "NO_CREDENTIALS"
        assert "quarry setup" in caught.value.message


def test_wrong_credentials_fail_the_call_with_invalid_credentials(server, admin):
    wrong = Credentials(admin.access_key_id, admin.secret_access_key[::-1])
    client = Client(server.target, server.target, credentials=wrong, retry=NO_RETRY)
    with client, pytest.raises(errors.QuarryError) as caught:
        client.whoami()
    assert caught.value.reason == "INVALID_CREDENTIALS"
    assert wrong.secret_access_key not in str(caught.value)


def test_a_given_token_is_sent_as_is(server, admin):
    with Client(server.target, server.target, credentials=admin) as logged_in:
        token = logged_in.token()
    with Client(server.target, server.target, token=token, retry=NO_RETRY) as client:
        assert client.whoami().principal_id == "admin"
        assert client.token() == token


def test_an_expired_token_is_renewed_once_and_the_call_retried(tmp_path):
    """The server's clock jumps two hours: the client's token (fresh by its own clock) is
    refused TOKEN_EXPIRED; the client logs in again and the call succeeds."""
    import time

    skew = [0.0]
    with auth_server(tmp_path / "srv", clock=lambda: time.time() + skew[0]) as srv:
        _, credential, secret = setup_admin(srv.iam, "admin")
        creds = Credentials(credential.access_key_id, secret)
        with Client(srv.target, srv.target, credentials=creds, retry=NO_RETRY) as client:
            assert client.whoami().principal_id == "admin"
            assert len(srv.logins) == 1
            skew[0] = 7200.0
            assert client.whoami().principal_id == "admin"
            assert len(srv.logins) == 2
            assert client.whoami().principal_id == "admin"
            assert len(srv.logins) == 2


def test_a_short_lived_token_is_renewed_before_each_call(tmp_path):
    """Tokens living less than the refresh margin (60 s) are renewed before they expire."""
    with auth_server(tmp_path / "srv", token_lifetime=30) as srv:
        _, credential, secret = setup_admin(srv.iam, "admin")
        creds = Credentials(credential.access_key_id, secret)
        with Client(srv.target, srv.target, credentials=creds, retry=NO_RETRY) as client:
            for _ in range(3):
                client.whoami()
        assert len(srv.logins) == 3


def test_a_revoked_credential_is_not_retried(server, admin):
    """Safety: UNAUTHENTICATED other than TOKEN_EXPIRED is final: no re-login (which would
    hide a revocation) and no second attempt."""
    creds = user_with_credentials(server, "revoked-user", group="Viewers")
    with Client(server.target, server.target, credentials=creds, retry=NO_RETRY) as client:
        assert client.whoami().principal_id == "revoked-user"
        logins = len(server.logins)
        server.iam.delete_credentials("revoked-user", creds.access_key_id)
        server.authorizer.invalidate()
        with pytest.raises(errors.QuarryError) as caught:
            client.whoami()
        assert caught.value.reason == "CREDENTIAL_REVOKED"
        assert len(server.logins) == logins


def test_setup_creates_the_first_admin_once_and_up_stores_its_credentials(tmp_path):
    home = tmp_path / "home"
    with auth_server(tmp_path / "srv") as srv:
        with Client(srv.target, srv.target, retry=NO_RETRY) as client:
            out = io.StringIO()
            first_start_setup(client, home, out)
        stored = load_credentials(home)
        assert stored is not None
        assert stat.S_IMODE((home / "credentials.json").stat().st_mode) == 0o600
        assert stored.access_key_id in out.getvalue()
        assert stored.secret_access_key not in out.getvalue()
        with Client(srv.target, srv.target, credentials=stored, retry=NO_RETRY) as client:
            assert client.whoami().principal_id == "admin"
            # A second setup is refused: the installation has an admin.
            with pytest.raises(errors.QuarryError) as caught:
                client.setup("admin2")
            assert (caught.value.code, caught.value.reason) == (
                grpc.StatusCode.FAILED_PRECONDITION,
                "ADMIN_EXISTS",
            )
            # `quarry up` again: the file is kept as it is.
            before = (home / "credentials.json").read_bytes()
            out = io.StringIO()
            first_start_setup(client, home, out)
            assert (home / "credentials.json").read_bytes() == before
            # Another machine's home, same installation: told how to get credentials.
            other = tmp_path / "other"
            out = io.StringIO()
            first_start_setup(client, other, out)
            assert "has an admin already" in out.getvalue()
            assert not (other / "credentials.json").exists()
        assert srv.setup_requests == ["admin", "admin2", "admin"]


def test_auth_wrappers_manage_users_credentials_groups_and_policies(server, admin):
    with Client(server.target, server.target, credentials=admin, retry=NO_RETRY) as client:
        client.create_user("wrap-user", email="w@example.com")
        assert "wrap-user" in [u.id for u in client.iter_users()]
        created = client.create_credentials("wrap-user")
        keys = [c.access_key_id for c in client.iter_credentials("wrap-user")]
        assert keys == [created.credentials.access_key_id]
        client.create_group("wrap-group")
        client.add_group_member("wrap-group", "wrap-user")
        assert [u.id for u in client.iter_group_members("wrap-group")] == ["wrap-user"]
        assert [g.id for g in client.iter_user_groups("wrap-user")] == ["wrap-group"]
        document = '{"Statement":[{"Effect":"Allow","Action":["fs:Read*"],"Resource":"*"}]}'
        client.create_policy("wrap-read", document)
        client.attach_policy("wrap-read", group="wrap-group")
        effective = [p.id for p in client.iter_user_policies("wrap-user", effective=True)]
        assert effective == ["wrap-read"]
        client.detach_policy("wrap-read", group="wrap-group")
        assert list(client.iter_user_policies("wrap-user", effective=True)) == []
        with pytest.raises(errors.InvalidArgument):
            client.create_policy("wrap-bad", '{"Statement":[{"Effect":"Maybe"}]}')
        with pytest.raises(errors.InvalidArgument):
            client.attach_policy("wrap-read", user="wrap-user", group="wrap-group")
        # The new user's credentials work, with its own (lack of) rights.
        user = Credentials(created.credentials.access_key_id, created.secret_access_key)
        with Client(server.target, server.target, credentials=user, retry=NO_RETRY) as theirs:
            assert theirs.whoami().principal_id == "wrap-user"
            with pytest.raises(errors.QuarryError) as caught:
                theirs.create_user("not-allowed")
            assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED
        client.remove_group_member("wrap-group", "wrap-user")
        client.delete_group("wrap-group")
        client.delete_policy("wrap-read")
        client.delete_credentials("wrap-user", created.credentials.access_key_id)
        client.delete_user("wrap-user")
        with pytest.raises(errors.NotFound):
            client.get_user("wrap-user")


def test_policy_wrappers_attach_to_a_user_and_update(server, admin):
    """attach_policy/detach_policy (Auth/AttachPolicy, DetachPolicy) to a user, and
    update_policy: the user's rights follow at once."""
    read = '{"Statement":[{"Effect":"Allow","Action":["fs:ListRepositories"],"Resource":"*"}]}'
    other = '{"Statement":[{"Effect":"Allow","Action":["fs:ReadRepository"],"Resource":"*"}]}'
    with Client(server.target, server.target, credentials=admin, retry=NO_RETRY) as client:
        client.create_user("upd-user")
        created = client.create_credentials("upd-user")
        client.create_policy("upd-read", read)
        client.attach_policy("upd-read", user="upd-user")
        assert [p.id for p in client.iter_user_policies("upd-user")] == ["upd-read"]
        user = Credentials(created.credentials.access_key_id, created.secret_access_key)
        with Client(server.target, server.target, credentials=user, retry=NO_RETRY) as theirs:
            theirs.list_repositories()
            updated = client.update_policy("upd-read", other)
            assert (updated.document, updated.statements[0].actions) == (
                other,
                ["fs:ReadRepository"],
            )
            with pytest.raises(errors.QuarryError) as caught:
                theirs.list_repositories()
            assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(errors.NotFound):
            client.update_policy("upd-ghost", other)
        client.detach_policy("upd-read", user="upd-user")
        assert list(client.iter_user_policies("upd-user")) == []


def test_quarry_up_first_start_waits_for_branch_manager_then_stores_credentials(tmp_path, capsys):
    """`quarry up`'s step after the services start (cli.services._first_start_setup)."""
    from quarry.cli.services import _first_start_setup
    from quarry.config import load_settings

    home = tmp_path / "home"
    with auth_server(tmp_path / "srv") as srv:
        settings = load_settings(
            env={}, home=str(home), branch_manager_address=srv.target, committer_address=srv.target
        )
        _first_start_setup(settings, home)
        stored = load_credentials(home)
        assert stored is not None and stored.access_key_id in capsys.readouterr().out
        _first_start_setup(settings, home)  # second start: the file is kept
        assert load_credentials(home) == stored
        assert srv.setup_requests == ["admin"]


@pytest.fixture(autouse=True)
def _clients_send_only_their_own_tokens(monkeypatch):
    """These tests are about the client's own login: no test-wide token on its channels."""
    import grpc

    from support.auth import RAW_INSECURE_CHANNEL

    monkeypatch.setattr(grpc, "insecure_channel", RAW_INSECURE_CHANNEL)


def test_whoami_answers_the_callers_own_effective_policies_only_when_asked(server, admin):
    """Any user may read their own effective policies through WhoAmI (the console shows only
    the controls they allow), though their policies do not allow auth:ReadUser; never
    another user's, whose ListEffectivePolicies stays PERMISSION_DENIED."""
    viewer = user_with_credentials(server, "whoami-viewer", group="Viewers")
    with Client(server.target, server.target, credentials=viewer, retry=NO_RETRY) as client:
        plain = client.whoami()
        assert list(plain.effective_policies) == []
        mine = client.whoami(include_effective_policies=True)
        assert mine.principal_id == "whoami-viewer"
        assert {p.id for p in mine.effective_policies} == {
            "FSReadAll",
            "AuthManageOwnCredentials",
        }
        assert not mine.effective_policies_truncated
        with pytest.raises(errors.QuarryError) as refused:
            client.list_page("ListEffectivePolicies", user_id="admin")
        assert refused.value.code.name == "PERMISSION_DENIED"
