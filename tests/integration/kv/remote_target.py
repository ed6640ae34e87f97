"""The "remote" conformance target: the KV suite run through a real kv-gateway over gRPC
(partition validation, metering, amortized reads and the error mapping all in the path)."""

from __future__ import annotations

from quarry.kv.remote import RemoteStore
from support.servers import kv_gateway


def make_remote_store(backend_store):
    with kv_gateway(backend_store) as (_server, target):
        store = RemoteStore(target)
        try:
            yield store
        finally:
            store.close()
