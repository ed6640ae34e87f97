"""The services' own outgoing calls carry THEIR service token, checked where it arrives:
a recording server stands in for the callee and verifies what each call presents.

(Test code's channels carry the test admin's token underneath — support.auth — so a
service that forgot its token would present `user:admin` here, not its own name.)
"""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from quarry.auth.service_tokens import ServiceTokens
from quarry.auth.tokens import TokenAuthority
from quarry.config import load_settings
from quarry.kv.memory import MemoryStore
from quarry.v1 import committer_pb2, committer_pb2_grpc, kv_pb2, kv_pb2_grpc
from support.auth import TEST_SIGNING_KEY, raw_channel


class RecordingCommitter(committer_pb2_grpc.CommitterServicer):
    def __init__(self):
        self.tokens: list[str] = []

    def Compact(self, request, context):
        for key, value in context.invocation_metadata():
            if key == "authorization":
                self.tokens.append(value.removeprefix("Bearer "))
        return committer_pb2.CompactResponse(compacted_metarange_id="m", tokens_compacted=1)


@pytest.fixture
def committer():
    servicer = RecordingCommitter()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    committer_pb2_grpc.add_CommitterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


def test_the_compactor_sensor_calls_compact_as_itself(committer, tmp_path):
    from quarry.services.compactor_sensor.service import assemble

    servicer, target = committer
    settings = load_settings(
        env={},
        home=str(tmp_path),
        metrics_base_port=0,
        committer_address=target,
        auth_signing_key=TEST_SIGNING_KEY,
        compactor_enabled=False,
    )
    assembled = assemble(settings, kv_store=MemoryStore())
    try:
        assembled.sensor.compactor.compact("repo", "main")
    finally:
        for stop in assembled.spec.on_stop:
            stop()
    principal = TokenAuthority(TEST_SIGNING_KEY).verify(servicer.tokens[-1])
    assert (principal.kind, principal.id) == ("service", "compactor-sensor")


class RecordingGateway(kv_pb2_grpc.KVGatewayServicer):
    """A kv-gateway stand-in that records the bearer token of every call."""

    def __init__(self):
        self.tokens: list[tuple[str, str]] = []

    def _record(self, method, context):
        token = dict(context.invocation_metadata()).get("authorization", "")
        self.tokens.append((method, token.removeprefix("Bearer ")))

    def GetItem(self, request, context):
        self._record("GetItem", context)
        return kv_pb2.GetItemResponse(value=b"v", predicate=b"v")

    def ScanItems(self, request, context):
        self._record("ScanItems", context)
        yield kv_pb2.ScanItemsResponse()


@pytest.fixture
def gateway():
    servicer = RecordingGateway()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    kv_pb2_grpc.add_KVGatewayServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


def test_branch_manager_kv_calls_carry_its_token_as_call_metadata(gateway, tmp_path):
    """The branch-manager's KV store sends its own service token on every call (gets and
    scans), as call metadata (test channels carry the admin's token underneath: a store that
    sent none would present `user:admin` here)."""
    from quarry.kv.remote import RemoteStore
    from quarry.runtime.wiring import core_dependencies

    servicer, target = gateway
    settings = load_settings(
        env={},
        home=str(tmp_path),
        metrics_base_port=0,
        kv_gateway_address=target,
        auth_signing_key=TEST_SIGNING_KEY,
    )
    authority = TokenAuthority(TEST_SIGNING_KEY)
    tokens = ServiceTokens(authority, "branch-manager", 3600.0)
    deps = core_dependencies(
        settings, committed=object(), range_writer=object(), start_dropper=False, tokens=tokens
    )
    try:
        store = deps.graveler.kv
        assert isinstance(store, RemoteStore)
        store.get(b"quarry", b"k")
        list(store.scan(b"quarry"))
    finally:
        for close in deps.closers:
            close()
    assert [method for method, _ in servicer.tokens] == ["GetItem", "ScanItems"]
    for _, token in servicer.tokens:
        principal = authority.verify(token)
        assert (principal.kind, principal.id) == ("service", "branch-manager")


def test_remote_store_sends_the_renewed_token(gateway):
    """When the token source renews its token, the next call carries the new one (the
    metadata is cached only as long as the token is the same)."""
    from quarry.kv.remote import RemoteStore

    servicer, target = gateway
    issued = iter(["first", "first", "second"])
    store = RemoteStore(raw_channel(target), token_source=lambda: next(issued))
    for _ in range(3):
        store.get(b"quarry", b"k")
    assert [token for _, token in servicer.tokens] == ["first", "first", "second"]
