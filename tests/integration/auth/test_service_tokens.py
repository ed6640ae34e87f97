"""The services' own outgoing calls carry THEIR service token, checked where it arrives:
a recording server stands in for the callee and verifies what each call presents.

(Test code's channels carry the test admin's token underneath — support.auth — so a
service that forgot its token would present `user:admin` here, not its own name.)
"""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from quarry.auth.tokens import TokenAuthority
from quarry.config import load_settings
from quarry.kv.memory import MemoryStore
from quarry.v1 import committer_pb2, committer_pb2_grpc
from support.auth import TEST_SIGNING_KEY


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
