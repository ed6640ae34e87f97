"""The client's bearer token: TokenSource (when it logs in) and the interceptor on a real
gRPC server (port 0) behind the real error interceptor: the header on every call, one
re-login and retry on TOKEN_EXPIRED, none on another UNAUTHENTICATED, none without
credentials."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
import pytest

from quarry import errors
from quarry.auth import errors as auth_errors
from quarry.client import Client, Credentials, RetryPolicy
from quarry.client.session import NoCredentials, TokenSource
from quarry.runtime.errors import ErrorInterceptor
from quarry.v1 import auth_pb2, auth_pb2_grpc
from support.auth import RAW_INSECURE_CHANNEL

CREDS = Credentials("AKIAQTEST", "secret-of-the-test")


class Logins:
    """A login function: token-1, token-2, ... each valid `lifetime` from `clock()`."""

    def __init__(self, clock, lifetime: float) -> None:
        self.clock, self.lifetime, self.count = clock, lifetime, 0

    def __call__(self, credentials: Credentials) -> tuple[str, float]:
        assert credentials == CREDS
        self.count += 1
        return f"token-{self.count}", self.clock() + self.lifetime


def test_logs_in_lazily_then_reuses_the_token_until_it_nears_expiry():
    now = [1000.0]
    logins = Logins(lambda: now[0], lifetime=3600)
    source = TokenSource(logins, CREDS, clock=lambda: now[0], margin=60)
    assert logins.count == 0
    assert source.token() == "token-1" and source.token() == "token-1"
    now[0] += 3600 - 61  # still more than the margin left
    assert source.token() == "token-1"
    now[0] += 2  # within the margin: renewed before it expires
    assert source.token() == "token-2" and logins.count == 2


def test_expired_forces_a_new_login_only_for_the_token_it_names():
    logins = Logins(lambda: 0.0, lifetime=3600)
    source = TokenSource(logins, CREDS, clock=lambda: 0.0)
    first = source.token()
    source.expired("some-older-token")  # another thread renewed already: nothing to do
    assert source.token() == first
    source.expired(first)
    assert source.token() == "token-2"


def test_a_given_token_without_credentials_is_never_renewed():
    source = TokenSource(lambda c: pytest.fail("no login without credentials"), None, "t0")
    assert source.token() == "t0" and not source.can_refresh
    source.expired("t0")
    assert source.token() == "t0"


def test_no_credentials_no_token():
    source = TokenSource(lambda c: pytest.fail("no login"), None, None)
    assert not source.active
    with pytest.raises(NoCredentials):
        source.token()


def test_logins_are_serialized():
    """Concurrent first calls log in once, not once per thread."""
    gate = threading.Event()
    count = [0]

    def slow_login(credentials):
        count[0] += 1
        gate.wait(1.0)
        return "token", 1e12

    source = TokenSource(slow_login, CREDS)
    threads = [threading.Thread(target=source.token) for _ in range(8)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert count[0] == 1


# ---- the interceptor over a real server ------------------------------------------------------


class ScriptedAuth(auth_pb2_grpc.AuthServicer):
    """Login hands out token-N; WhoAmI raises the scripted errors, then answers with the
    token it saw."""

    def __init__(self) -> None:
        self.logins = 0
        self.failures: list[Exception] = []
        self.seen: list[str | None] = []

    def Login(self, request, context):
        self.logins += 1
        return auth_pb2.LoginResponse(token=f"token-{self.logins}", expires_at={"seconds": 2**40})

    def WhoAmI(self, request, context):
        header = dict(context.invocation_metadata()).get("authorization")
        self.seen.append(header)
        if self.failures:
            raise self.failures.pop(0)
        return auth_pb2.WhoAmIResponse(principal_kind="user", principal_id=header or "")


@pytest.fixture
def scripted():
    servicer = ScriptedAuth()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4), interceptors=[ErrorInterceptor()]
    )
    auth_pb2_grpc.add_AuthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    servicer.target = f"127.0.0.1:{port}"
    try:
        yield servicer
    finally:
        server.stop(None).wait()


def client_of(scripted, **kwargs) -> Client:
    return Client(scripted.target, scripted.target, retry=RetryPolicy.none(), **kwargs)


def test_token_expired_once_logs_in_again_and_retries(scripted):
    with client_of(scripted, credentials=CREDS) as client:
        client.whoami()
        scripted.failures.append(auth_errors.TokenExpired("expired"))
        assert client.whoami().principal_id == "Bearer token-2"
    assert scripted.logins == 2
    assert scripted.seen == ["Bearer token-1", "Bearer token-1", "Bearer token-2"]


def test_token_expired_twice_is_retried_only_once(scripted):
    with client_of(scripted, credentials=CREDS) as client:
        scripted.failures += [auth_errors.TokenExpired("expired")] * 2
        with pytest.raises(errors.QuarryError) as caught:
            client.whoami()
    assert caught.value.reason == "TOKEN_EXPIRED"
    assert len(scripted.seen) == 2 and scripted.logins == 2


@pytest.mark.parametrize(
    "refusal",
    [
        auth_errors.CredentialRevoked("revoked"),
        auth_errors.PrincipalUnknown("gone"),
        auth_errors.TokenInvalidSignature("forged"),
    ],
)
def test_other_unauthenticated_is_not_retried(scripted, refusal):
    """Safety: a revoked credential or deleted user must not be papered over by a re-login."""
    with client_of(scripted, credentials=CREDS) as client:
        scripted.failures.append(refusal)
        with pytest.raises(errors.QuarryError) as caught:
            client.whoami()
    assert caught.value.reason == refusal.reason
    assert len(scripted.seen) == 1 and scripted.logins == 1


def test_no_credentials_sends_no_header(scripted, monkeypatch, tmp_path):
    monkeypatch.delenv("QUARRY_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("QUARRY_SECRET_ACCESS_KEY", raising=False)
    monkeypatch.setenv("QUARRY_HOME", str(tmp_path))
    monkeypatch.setattr(grpc, "insecure_channel", RAW_INSECURE_CHANNEL)  # no test-wide token
    with client_of(scripted) as client:
        client.whoami()
    assert scripted.seen == [None] and scripted.logins == 0


def test_a_server_without_the_auth_service_gets_no_header(fake):
    """Credentials against a server with auth off (no Auth service): calls go on as
    before, without a header."""
    with fake.client(credentials=CREDS) as client:
        client.create_repository("plain", "/tmp/plain")
        assert client.get_repository("plain").name == "plain"


def test_no_header_on_unary_calls_while_the_login_gave_no_token(fake, monkeypatch):
    """Safety: with credentials against a server without the Auth service (auth off), the
    unary calls that carry the token as call metadata (TokenStub) send no header at all,
    not an empty `Bearer `."""
    monkeypatch.setattr(grpc, "insecure_channel", RAW_INSECURE_CHANNEL)  # no test-wide token
    with fake.client(credentials=CREDS) as client:
        client.get_repository("plain")
        client.get_repository("plain")
    assert fake.branch_manager.authorization == [None, None]


def test_spark_executors_log_in_with_the_drivers_credentials(scripted, monkeypatch, tmp_path):
    """An executor has no credentials of its own (no env, empty home): the Connection the
    driver pickled into the task brings them."""
    import pickle

    from quarry.spark import common

    monkeypatch.delenv("QUARRY_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("QUARRY_SECRET_ACCESS_KEY", raising=False)
    monkeypatch.setenv("QUARRY_HOME", str(tmp_path))
    shipped = pickle.dumps(common.Connection(scripted.target, scripted.target, credentials=CREDS))
    connection = pickle.loads(shipped)
    client = common.client_for(connection)
    try:
        client.whoami()
    finally:
        with common._clients_lock:
            common._clients.clear()
        client.close()
    assert scripted.seen == ["Bearer token-1"] and scripted.logins == 1


# ---- the token cache (the CLI's, between processes) ----------------------------------------


def test_a_cached_token_is_reused_by_the_next_process_until_near_expiry(tmp_path):
    from quarry.client.token_cache import TokenCache

    now = [1000.0]
    logins = Logins(lambda: now[0], lifetime=3600)

    def process() -> TokenSource:  # a new CLI run: a new source over the same file
        cache = TokenCache(tmp_path, clock=lambda: now[0])
        return TokenSource(logins, CREDS, clock=lambda: now[0], cache=cache, endpoint="bm:1")

    assert process().token() == "token-1"
    assert process().token() == "token-1" and logins.count == 1
    now[0] += 3600 - 59  # within the margin: the next process logs in
    assert process().token() == "token-2" and logins.count == 2


def test_a_cached_token_never_goes_to_another_endpoint_or_key(tmp_path):
    """Safety rule: a token is only sent where, and for whom, it was obtained."""
    from quarry.client.token_cache import TokenCache

    logins = Logins(lambda: 0.0, lifetime=3600)
    cache = TokenCache(tmp_path, clock=lambda: 0.0)
    assert TokenSource(logins, CREDS, clock=lambda: 0.0, cache=cache, endpoint="bm:1").token()
    other = TokenSource(logins, CREDS, clock=lambda: 0.0, cache=cache, endpoint="bm:2")
    assert other.token() == "token-2"
    someone = Credentials("AKIAQOTHER", "another-secret")
    assert cache.lookup("bm:1", someone, 60) is None
    assert cache.lookup("bm:1", CREDS, 60) == ("token-1", 3600.0)
    # The right key id with a wrong secret: no token from the cache; Login decides.
    mistyped = Credentials(CREDS.access_key_id, "not-the-secret")
    assert cache.lookup("bm:1", mistyped, 60) is None
    asked = []

    def login(credentials):
        asked.append(credentials)
        return "token-for-the-mistyped", 3600.0

    source = TokenSource(login, mistyped, clock=lambda: 0.0, cache=cache, endpoint="bm:1")
    assert source.token() == "token-for-the-mistyped" and asked == [mistyped]
    assert "another-secret" not in (tmp_path / "tokens.json").read_text()


def test_a_refused_cached_token_is_dropped_once_and_a_fresh_one_is_final(tmp_path):
    from quarry.client.token_cache import TokenCache

    logins = Logins(lambda: 0.0, lifetime=3600)
    cache = TokenCache(tmp_path, clock=lambda: 0.0)
    TokenSource(logins, CREDS, clock=lambda: 0.0, cache=cache, endpoint="bm:1").token()
    source = TokenSource(logins, CREDS, clock=lambda: 0.0, cache=cache, endpoint="bm:1")
    cached = source.token()
    assert cached == "token-1"
    assert source.refused(cached, "TOKEN_INVALID")  # from the cache: log in again
    assert cache.lookup("bm:1", CREDS, 60) is None
    fresh = source.token()
    assert fresh == "token-2"
    assert not source.refused(fresh, "TOKEN_INVALID")  # a fresh token's refusal is final


def test_the_token_file_is_private_and_a_broken_one_is_ignored(tmp_path):
    from quarry.client.token_cache import TokenCache

    cache = TokenCache(tmp_path, clock=lambda: 0.0)
    (tmp_path / "tokens.json").write_text("{not json")
    assert cache.lookup("bm:1", CREDS, 60) is None
    cache.store("bm:1", CREDS, "t", 3600.0)
    assert (tmp_path / "tokens.json").stat().st_mode & 0o777 == 0o600
    assert cache.lookup("bm:1", CREDS, 60) == ("t", 3600.0)
    assert CREDS.secret_access_key not in (tmp_path / "tokens.json").read_text()


def test_a_client_given_no_compactor_sensor_address_never_dials_one(scripted):
    """Every call carries the token: a default sensor port would hand it to whatever
    listens there (the console's sessions once did)."""
    with (
        client_of(scripted, token="the-users-token") as client,
        pytest.raises(ValueError, match="no compactor-sensor address"),
    ):
        client.branch_staging_stats("repo", "main")
