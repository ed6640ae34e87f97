"""Start real Quarry servers on loopback for tests (port 0 = a free port)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import grpc

from quarry.config import load_settings
from quarry.kv.memory import MemoryStore
from quarry.kv.store import Store
from quarry.runtime.server import QuarryServer, create_server
from support.auth import TEST_SIGNING_KEY, service_channel, setup_test_admin


def settings_for_tests(**overrides):
    """Settings isolated from the developer's environment; auth on with the test signing
    key (support.auth)."""
    overrides.setdefault("auth_signing_key", TEST_SIGNING_KEY)
    return load_settings(env={}, metrics_base_port=0, **overrides)


@contextlib.contextmanager
def kv_gateway(backend: Store | None = None, **overrides) -> Iterator[tuple[QuarryServer, str]]:
    """A kv-gateway over `backend` (default: a fresh MemoryStore); yields (server, target)."""
    from quarry.services.kv_gateway.service import build

    settings = settings_for_tests(**overrides)
    backend = backend if backend is not None else MemoryStore()
    setup_test_admin(backend)
    spec = build(settings, backend=backend)
    server, port = create_server(settings, spec, port=0, host="127.0.0.1")
    try:
        yield server, f"127.0.0.1:{port}"
    finally:
        server.stop(grace=1.0)


def channel(target: str) -> grpc.Channel:
    """A channel whose calls carry a service token (test code standing in for a service)."""
    return service_channel(target)


def remote_store_target(backend_store: Store) -> Iterator[Store]:
    """A RemoteStore through a real kv-gateway over `backend_store` (generator: the store,
    then cleanup); the KV contract's "remote" target: partition validation, metering,
    amortized reads and the error mapping all in the path."""
    from quarry.kv.remote import RemoteStore

    with kv_gateway(backend_store) as (_server, target):
        store = RemoteStore(target)
        try:
            yield store
        finally:
            store.close()
