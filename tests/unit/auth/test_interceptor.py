"""The interceptor on a small real gRPC server (loopback): undeclared quarry.v1 methods are
refused, never served unauthenticated; open methods need no token."""

from __future__ import annotations

import secrets
from concurrent import futures

import grpc
import pytest

from quarry.auth.authorizer import Authorizer
from quarry.auth.declarations import RULES
from quarry.auth.interceptor import AuthInterceptor, bearer_token
from quarry.auth.store import IamStore
from quarry.auth.tokens import TokenAuthority
from quarry.kv.memory import MemoryStore
from quarry.runtime.errors import ErrorInterceptor, from_rpc_error
from quarry.runtime.server import ServerInfoServicer
from quarry.v1 import server_info_pb2, server_info_pb2_grpc
from support.auth import raw_channel


def serve(rules):
    tokens = TokenAuthority(secrets.token_bytes(32))
    authorizer = Authorizer(IamStore(MemoryStore()), cache_seconds=0)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        interceptors=[ErrorInterceptor(), AuthInterceptor(tokens, authorizer, rules=rules)],
    )
    server_info_pb2_grpc.add_ServerInfoServicer_to_server(ServerInfoServicer("t"), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    # raw_channel: no test token (support.auth)
    return server, raw_channel(f"127.0.0.1:{port}"), tokens


@pytest.mark.parametrize("declared", [True, False])
def test_an_undeclared_method_is_refused_even_for_a_service(declared):
    server, channel, tokens = serve(RULES if declared else {})
    try:
        stub = server_info_pb2_grpc.ServerInfoStub(channel)
        service_token = tokens.issue_service_token("committer")[0]
        call = lambda: stub.GetServerInfo(
            server_info_pb2.GetServerInfoRequest(),
            metadata=[("authorization", f"Bearer {service_token}")],
        )
        if declared:
            assert call().service == "t"  # OPEN: a token is not even looked at
            assert stub.GetServerInfo(server_info_pb2.GetServerInfoRequest()).service == "t"
        else:
            with pytest.raises(grpc.RpcError) as caught:
                call()
            error = from_rpc_error(caught.value)
            assert error.code.name == "PERMISSION_DENIED"
            assert "no access declaration" in error.message
    finally:
        channel.close()
        server.stop(0)


def test_bearer_header_parsing():
    assert bearer_token([("authorization", "Bearer abc")]) == "abc"
    assert bearer_token([("Authorization", "bearer  abc ")]) == "abc"
    assert bearer_token([("x-other", "1")]) is None
    with pytest.raises(Exception) as caught:
        bearer_token([("authorization", "Basic abc")])
    assert caught.value.reason == "TOKEN_MALFORMED"


def test_a_remembered_token_is_refused_once_expired_and_a_bad_one_never_remembered():
    """The verified-token memory must never accept what TokenAuthority.verify refuses: a
    token past its expiry (by the authority's clock, here moved on purpose) and a token
    signed with another key, however often it is sent."""
    now = [1_000_000.0]
    tokens = TokenAuthority(secrets.token_bytes(32), clock=lambda: now[0])
    interceptor = AuthInterceptor(tokens, Authorizer(IamStore(MemoryStore()), cache_seconds=0))
    token, expires_at = tokens.issue_service_token("committer", lifetime=60)
    assert interceptor._verify(token).id == "committer"
    assert interceptor._verify(token).id == "committer"  # remembered
    now[0] = expires_at + 1
    with pytest.raises(Exception) as caught:
        interceptor._verify(token)
    assert caught.value.reason == "TOKEN_EXPIRED"
    forged = TokenAuthority(secrets.token_bytes(32)).issue_service_token("committer")[0]
    for _ in range(2):
        with pytest.raises(Exception) as caught:
            interceptor._verify(forged)
        assert caught.value.reason == "TOKEN_INVALID_SIGNATURE"
