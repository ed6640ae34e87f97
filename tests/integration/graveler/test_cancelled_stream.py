"""A client that cancels its stream mid-way is not an internal error: the server logs no
internal-error incident for it (issue 23, item 8). A real PutObjects client stream over
gRPC, cancelled while the server waits for its next message."""

from __future__ import annotations

import logging
import threading
import uuid

import grpc

from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import types_pb2
from support.wait import wait_until


def test_a_cancelled_client_stream_is_not_an_internal_error(suite, stubs, caplog):
    name = f"cancel-{uuid.uuid4().hex[:8]}"
    stubs.bm.CreateRepository(
        bm.CreateRepositoryRequest(name=name, storage_namespace=suite.namespace(name))
    )
    first_sent = threading.Event()
    release = threading.Event()

    def messages():
        yield bm.PutObjectsRequest(
            repository=name,
            branch="main",
            entries=[types_pb2.Entry(path="a", physical_address="s3://b/a", size_bytes=1)],
        )
        first_sent.set()
        release.wait(30)  # the server now waits for a message that never comes

    with caplog.at_level(logging.INFO):
        call = stubs.bm.PutObjects.future(messages())
        assert first_sent.wait(10)
        call.cancel()
        release.set()
        wait_until(
            lambda: any("call cancelled" in r.getMessage() for r in caplog.records),
            timeout=20,
            what="the server's note that the client cancelled",
        )
    assert call.cancelled() or call.code() == grpc.StatusCode.CANCELLED
    incidents = [r for r in caplog.records if "internal error" in r.getMessage()]
    assert not incidents, [r.getMessage() for r in incidents]
