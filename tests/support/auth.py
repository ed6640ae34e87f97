"""Auth in the test environment: a fixed signing key and fixed admin credentials, the admin
created on every suite's own store, and tokens for test clients.

Every test suite runs with auth ON (the default). `QUARRY_AUTH_SIGNING_KEY`,
`QUARRY_ACCESS_KEY_ID` and `QUARRY_SECRET_ACCESS_KEY` hold the values below in the test
process (tests/conftest.py) and in every `quarry` child process (processes.quarry_env).

Clients (in the test process and in child processes: the CLI, Spark's Python workers) log
in with those env vars themselves (quarry.client.Credentials). Test code's own bare stubs
get a token from `install_client_tokens` (installed for the session in tests/conftest.py):
a user token of the fixed admin minted with the test key, attached by
quarry.runtime.channels.BearerToken; a header the Client's own login adds wins over it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from quarry import errors
from quarry.auth.bootstrap import setup_admin
from quarry.auth.store import IamStore
from quarry.auth.tokens import TokenAuthority
from quarry.runtime.channels import TokenSource, with_token
from quarry.v1 import auth_pb2, auth_pb2_grpc

TEST_SIGNING_KEY = "quarry-tests-signing-key-0123456789abcdef"  # >= 32 bytes
TEST_ADMIN = "admin"
TEST_ACCESS_KEY_ID = "AKIAQTESTADMIN000001"
TEST_SECRET_ACCESS_KEY = "quarry-tests-admin-secret-0123456789abcdef"
# Seals the console's session cookies in tests (quarry.console.sessions); >= 32 bytes.
TEST_CONSOLE_SESSION_KEY = "quarry-tests-console-session-key-0123456789"
TEST_SERVICE = "quarry-tests"  # the service name of test code acting as a service

AUTH_ENV = {
    "QUARRY_AUTH_SIGNING_KEY": TEST_SIGNING_KEY,
    "QUARRY_ACCESS_KEY_ID": TEST_ACCESS_KEY_ID,
    "QUARRY_SECRET_ACCESS_KEY": TEST_SECRET_ACCESS_KEY,
}

# A cheap scrypt cost for users tests create in bulk (the admin keeps the production cost).
FAST_HASH = 2**10


def authority() -> TokenAuthority:
    return TokenAuthority(TEST_SIGNING_KEY)


def _cached(mint: Callable[[], tuple[str, float]]) -> TokenSource:
    state = {"token": "", "expires_at": 0.0}

    def source() -> str:
        import time

        if not state["token"] or time.time() > state["expires_at"] - 60:
            state["token"], state["expires_at"] = mint()
        return state["token"]

    return source


def admin_token_source() -> TokenSource:
    """The fixed admin's user token (issued against its access key, like Login's)."""
    return _cached(
        lambda: authority().issue_user_token(TEST_ADMIN, access_key_id=TEST_ACCESS_KEY_ID)
    )


def service_token_source(name: str = TEST_SERVICE) -> TokenSource:
    return _cached(lambda: authority().issue_service_token(name))


def user_token(user_id: str, access_key_id: str = "") -> str:
    return authority().issue_user_token(user_id, access_key_id=access_key_id)[0]


def service_token(name: str = TEST_SERVICE) -> str:
    return authority().issue_service_token(name)[0]


def bearer(token: str) -> tuple[tuple[str, str]]:
    """Call metadata carrying `token`."""
    return (("authorization", f"Bearer {token}"),)


def setup_test_admin(store: Any) -> None:
    """The fixed admin (member of Admins, with the fixed access key) on `store`, a KV store
    holding the suite's IAM data; nothing when it is there already."""
    with contextlib.suppress(errors.FailedPrecondition):  # ADMIN_EXISTS: a reused store
        setup_admin(
            IamStore(store),
            TEST_ADMIN,
            access_key_id=TEST_ACCESS_KEY_ID,
            secret_access_key=TEST_SECRET_ACCESS_KEY,
        )


def setup_admin_over_grpc(branch_manager: str, timeout: float = 10.0) -> None:
    """Auth/Setup of the fixed admin on a running branch-manager (a `quarry serve` child);
    an installation that has its admin already is left as it is."""
    with RAW_INSECURE_CHANNEL(branch_manager) as channel:
        try:
            auth_pb2_grpc.AuthStub(channel).Setup(
                auth_pb2.SetupRequest(
                    user_id=TEST_ADMIN,
                    access_key_id=TEST_ACCESS_KEY_ID,
                    secret_access_key=TEST_SECRET_ACCESS_KEY,
                ),
                timeout=timeout,
                wait_for_ready=True,
            )
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise


def admin_channel(target: str) -> grpc.Channel:
    """A channel whose calls carry the fixed admin's token."""
    return with_token(RAW_INSECURE_CHANNEL(target), admin_token_source())


def service_channel(target: str, name: str = TEST_SERVICE) -> grpc.Channel:
    """A channel whose calls carry a service token (test code standing in for a service)."""
    return with_token(RAW_INSECURE_CHANNEL(target), service_token_source(name))


RAW_INSECURE_CHANNEL = grpc.insecure_channel  # before any patch: no token at all


def raw_channel(target: str) -> grpc.Channel:
    """A channel that sends no token whatever the test patches (bad-token tests)."""
    return RAW_INSECURE_CHANNEL(target)


def install_client_tokens(module_patch: Callable[[Any, str, Any], None]) -> None:
    """Patch (via `module_patch`, e.g. monkeypatch.setattr) how test code dials: every
    grpc.insecure_channel carries the fixed admin's user token (Client, CLI in process, the
    tests' own stubs); RemoteStore and RemoteRangeWriter opened on an address (test code
    talking to a kv-gateway or range-writer directly, as a service would) carry a service
    token. A call that already has a token keeps it, so the services' own service tokens
    win on their channels — and a service that forgot its token reaches the kv-gateway and
    range-writer only as the admin user, which may not write there: it still fails."""
    import quarry.committed.remote as committed_remote
    import quarry.kv.remote as kv_remote
    from quarry.runtime import channels

    admin = admin_token_source()
    service = service_token_source()

    def insecure_channel(target: str, options: Any = None, compression: Any = None):
        return with_token(RAW_INSECURE_CHANNEL(target, options, compression), admin)

    def service_channel_for(target):
        if isinstance(target, str):
            return channels.open_channel(target, token_source=service), True
        return target, False

    for module, name, value in (
        (grpc, "insecure_channel", insecure_channel),
        (kv_remote, "channel_for", service_channel_for),
        (committed_remote, "channel_for", service_channel_for),
    ):
        _UNPATCHED.setdefault((module, name), getattr(module, name))
        module_patch(module, name, value)


# What install_client_tokens replaced, as it was before any patch.
_UNPATCHED: dict[tuple[Any, str], Any] = {}


@contextlib.contextmanager
def without_client_tokens() -> Iterator[None]:
    """Undo install_client_tokens for a with block: code in it dials as a child process
    would, with no token lent (support.cli runs the CLI in process this way)."""
    patched = [(module, name, getattr(module, name)) for module, name in _UNPATCHED]
    for (module, name), original in _UNPATCHED.items():
        setattr(module, name, original)
    try:
        yield
    finally:
        for module, name, value in patched:
            setattr(module, name, value)


@contextlib.contextmanager
def client_tokens() -> Iterator[None]:
    """install_client_tokens for the duration of a with block (restored after)."""
    saved: list[tuple[Any, str, Any]] = []

    def patch(module: Any, name: str, value: Any) -> None:
        saved.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    install_client_tokens(patch)
    try:
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)


def refused(call: Callable[..., Any], *args: Any, **kwargs: Any) -> errors.QuarryError:
    """The domain error a gRPC call that must fail answers (AssertionError if it succeeds)."""
    import pytest

    from quarry.runtime.errors import from_rpc_error

    with pytest.raises(grpc.RpcError) as caught:
        call(*args, **kwargs)
    return from_rpc_error(caught.value)


def put_as(bm: Any, token: str, repository: str, path: str, address: str) -> Any:
    """BranchManager/PutObject of one entry at `address` on main, as the token's principal."""
    from quarry.v1 import branch_manager_pb2, types_pb2

    return bm.PutObject(
        branch_manager_pb2.PutObjectRequest(
            repository=repository,
            branch="main",
            entry=types_pb2.Entry(path=path, physical_address=address, size_bytes=1),
        ),
        metadata=bearer(token),
        timeout=20,
    )
