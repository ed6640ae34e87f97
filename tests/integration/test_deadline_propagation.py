"""quarry.runtime.deadlines on a real server (create_server) over loopback: a handler sees
its caller's deadline in every timeout it computes, work past the deadline or cancelled by
the caller stops at its next loop point, and work with no incoming call keeps its defaults.
(tests/e2e/test_deadlines.py: the same across the committer and the range-writer.)"""

from __future__ import annotations

import queue
import threading

import grpc
import pytest

from quarry import errors
from quarry.runtime import deadlines
from quarry.runtime.server import ServiceSpec, create_server
from support.servers import settings_for_tests

DEFAULT = 30.0  # an outgoing call's own default timeout in these handlers
# gRPC encodes a deadline as a grpc-timeout header and "encoding may round up arbitrarily"
# (grpc core, timeout_encoding.h): a 2.0 s call reached the server as 2.0074 s remaining.
TIMEOUT_ENCODING_SLACK = 0.1


def _identity(data: bytes) -> bytes:
    return data


@pytest.fixture
def server():
    seen: queue.Queue = queue.Queue()
    release = threading.Event()

    def timeout_seen(request, context):
        seen.put(deadlines.timeout(DEFAULT))
        return b"ok"

    def loop_until_stopped(request, context):
        # Long work: a loop point each round, until the call ends.
        seen.put("started")
        rounds = 0
        try:
            while not release.wait(0.01):
                deadlines.check()
                rounds += 1
        except errors.QuarryError as stopped:
            seen.put((type(stopped), rounds))
            raise
        return b"done"

    def streamed_requests(request_iterator, context):
        try:
            for _ in request_iterator:
                deadlines.check()
            # gRPC may end the request iterator quietly when the call ended (a loaded
            # machine starts the handler after the deadline): the work's next loop point
            # still stops it as such.
            deadlines.check()
        except errors.QuarryError as stopped:
            seen.put(type(stopped))
            raise
        return b"done"

    generic = grpc.method_handlers_generic_handler(
        "test.v1.Test",
        {
            "Timeout": grpc.unary_unary_rpc_method_handler(timeout_seen, _identity, _identity),
            "Loop": grpc.unary_unary_rpc_method_handler(loop_until_stopped, _identity, _identity),
            "Stream": grpc.stream_unary_rpc_method_handler(streamed_requests, _identity, _identity),
        },
    )
    spec = ServiceSpec(
        name="kv-gateway",
        register=lambda s: s.add_generic_rpc_handlers((generic,)),
        grpc_service_names=["test.v1.Test"],
    )
    started, port = create_server(settings_for_tests(), spec, port=0, host="127.0.0.1")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel, seen
    finally:
        release.set()
        started.stop(0)


def test_outgoing_timeouts_carry_the_remaining_deadline(server):
    channel, seen = server
    call = channel.unary_unary("/test.v1.Test/Timeout")
    call(b"x", timeout=2.0)
    carried = seen.get(timeout=5)
    assert 0 < carried <= 2.0 + TIMEOUT_ENCODING_SLACK  # not the handler's own 30 s
    call(b"x")  # no deadline: the default stands
    assert seen.get(timeout=5) == DEFAULT


def test_work_without_an_incoming_call_keeps_its_defaults():
    # Background loops (the dropper, probes, reporters) have no caller to follow.
    assert deadlines.current() is None
    assert deadlines.timeout(DEFAULT) == DEFAULT
    deadlines.check()  # never stops them


def test_work_past_its_deadline_stops_at_its_next_loop_point(server):
    channel, seen = server
    with pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary("/test.v1.Test/Loop")(b"x", timeout=0.5)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert seen.get(timeout=10) == "started"
    stopped, rounds = seen.get(timeout=10)
    assert stopped is errors.DeadlineExceeded and rounds > 0


def test_work_the_caller_cancelled_stops_at_its_next_loop_point(server):
    channel, seen = server
    future = channel.unary_unary("/test.v1.Test/Loop").future(b"x")
    assert seen.get(timeout=10) == "started"
    future.cancel()
    stopped, _rounds = seen.get(timeout=10)
    assert stopped is errors.Cancelled


def test_a_request_stream_ended_by_its_deadline_stops_the_handler_as_such(server):
    channel, seen = server
    stop = threading.Event()

    def requests():
        yield b"first"
        stop.wait(10)  # the caller produces nothing more; its deadline passes meanwhile

    try:
        with pytest.raises(grpc.RpcError) as caught:
            channel.stream_unary("/test.v1.Test/Stream")(requests(), timeout=0.5)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # The handler saw DeadlineExceeded, not gRPC's bare RpcError.
        assert seen.get(timeout=10) is errors.DeadlineExceeded
    finally:
        stop.set()
