"""One loopback gRPC server with authentication on, for the client-side auth tests: the
ErrorInterceptor and the AuthInterceptor in front of the REAL Auth, BranchManager, Committer
and KVGateway servicers (the first two call a kv-gateway and a range-writer of their own on
the same KV backend), built the way
test_auth_service.py's `secured` fixture builds them.
The servicer is the real AuthServicer, counting logins and Setup calls for the tests.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from quarry.auth.authorizer import Authorizer
from quarry.auth.interceptor import AuthInterceptor
from quarry.auth.store import IamStore
from quarry.auth.tokens import TokenAuthority
from quarry.config import load_settings
from quarry.kv.memory import MemoryStore
from quarry.kv.remote import RemoteStore
from quarry.runtime.errors import ErrorInterceptor
from quarry.runtime.server import ServerInfoServicer, create_server
from quarry.v1 import auth_pb2_grpc, server_info_pb2_grpc

FAST_HASH = 2**10


@dataclass
class AuthServer:
    target: str
    iam: IamStore
    tokens: TokenAuthority
    authorizer: Authorizer
    namespace_root: Path
    signing_key: str
    setup_requests: list = field(default_factory=list)
    logins: list = field(default_factory=list)


def _servicer_class():
    from quarry.services.branch_manager.auth_servicer import AuthServicer

    class Counting(AuthServicer):
        """The real servicer; records which key ids logged in (never the secrets)."""

        harness: AuthServer

        def Login(self, request, context):
            self.harness.logins.append(request.access_key_id)
            return super().Login(request, context)

        def Setup(self, request, context):
            self.harness.setup_requests.append(request.user_id)
            return super().Setup(request, context)

    return Counting


@contextlib.contextmanager
def auth_server(
    home: Path,
    token_lifetime: float = 3600,
    clock: Callable[[], float] = time.time,
    cache_seconds: float = 0.5,
    login_throttle: Any = None,
) -> Iterator[AuthServer]:
    """The server (module docstring); `clock` is the token authority's (tests move it to
    expire tokens); `cache_seconds` the authorizer's cache lifetime."""
    from quarry.services.branch_manager.service import build as build_branch_manager
    from quarry.services.committer.service import build as build_committer
    from quarry.services.kv_gateway.service import build as build_kv_gateway
    from quarry.services.range_writer.service import build as build_range_writer

    backend = MemoryStore()
    # The front server below authenticates itself (its own AuthInterceptor); the back-end
    # servers it builds run with auth off.
    settings = load_settings(
        env={}, home=str(home), metrics_base_port=0, compactor_enabled=False, auth_enabled=False
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

        iam = IamStore(RemoteStore(settings.kv_gateway_address), hash_cost=FAST_HASH)
        tokens = TokenAuthority(secrets.token_hex(32), clock=clock)
        authorizer = Authorizer(iam, cache_seconds=cache_seconds)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8),
            interceptors=[ErrorInterceptor(), AuthInterceptor(tokens, authorizer)],
        )
        root = home / "lake"
        root.mkdir(parents=True, exist_ok=True)
        harness = AuthServer("", iam, tokens, authorizer, root, tokens._key.decode())
        servicer_class = _servicer_class()
        servicer_class.harness = harness
        auth_pb2_grpc.add_AuthServicer_to_server(
            servicer_class(
                iam,
                tokens,
                authorizer,
                token_lifetime=token_lifetime,
                login_throttle=login_throttle,
            ),
            server,
        )
        specs = (
            build_branch_manager(settings),
            build_committer(settings),
            build_kv_gateway(settings, backend=backend),
        )
        for spec in specs:
            spec.register(server)
            for work in spec.on_ready:
                work()
            for closer in spec.on_stop:
                stack.callback(closer)
        server_info_pb2_grpc.add_ServerInfoServicer_to_server(ServerInfoServicer("test"), server)
        health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        stack.callback(lambda: server.stop(1.0).wait())
        harness.target = f"127.0.0.1:{port}"
        yield harness
