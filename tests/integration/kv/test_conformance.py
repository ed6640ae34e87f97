"""The KV store contract (quarry.testing.kv) against every target in conftest.TARGETS:
memory, sqlite, dynamodb (real dynalite) and remote (the kv-gateway over gRPC)."""

from __future__ import annotations

from quarry.testing.kv import KVContract


class TestKVContract(KVContract):
    """`kv_store` is conftest.py's session fixture, one store per target."""
