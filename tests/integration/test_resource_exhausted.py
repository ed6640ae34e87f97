"""RESOURCE_EXHAUSTED over real gRPC: retried only when it carries RetryInfo (throttling);
a message over a size limit — refused by gRPC itself or by the server's interceptor —
comes back as MESSAGE_TOO_LARGE and fails at once.

Tiny real gRPC servers answer exactly the statuses under test; the last test goes through
the whole suite, with the kv-gateway's limiter throttling branch-manager's writes."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest

from quarry import errors
from quarry.client import Client, RetryPolicy
from quarry.runtime.errors import ErrorInterceptor, error_info, from_rpc_error
from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import branch_manager_pb2_grpc, types_pb2
from support.suite import running_suite

# A generous policy: only the rule under test may stop a retry.
PATIENT = RetryPolicy(base_delay=0.01, max_delay=0.05, budget=10.0, max_attempts=0)


class Attempts(grpc.ServerInterceptor):
    """Counts calls per method as they start (before gRPC reads the request, so a request
    gRPC refuses as too large is counted too)."""

    def __init__(self):
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def intercept_service(self, continuation, details):
        with self._lock:
            name = details.method.rsplit("/", 1)[-1]
            self.calls[name] = self.calls.get(name, 0) + 1
        return continuation(details)


class Scripted(branch_manager_pb2_grpc.BranchManagerServicer):
    def __init__(self, get_branch):
        self._get_branch = get_branch

    def GetBranch(self, request, context):
        return self._get_branch(request, context)

    def PutObject(self, request, context):
        return bm.PutObjectResponse()


@pytest.fixture
def serve():
    servers = []

    def start(get_branch, options=(), max_message_bytes=None):
        attempts = Attempts()
        interceptors = [attempts] + (
            [ErrorInterceptor(max_message_bytes)] if max_message_bytes else [ErrorInterceptor()]
        )
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4),
            interceptors=interceptors,
            options=list(options),
        )
        branch_manager_pb2_grpc.add_BranchManagerServicer_to_server(Scripted(get_branch), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}", attempts

    yield start
    for server in servers:
        server.stop(None).wait()


def test_resource_exhausted_without_retry_info_fails_at_once(serve):
    def quota(request, context):
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "quota exceeded")

    target, attempts = serve(quota)
    with Client(target, target, retry=PATIENT) as client:
        started = time.monotonic()
        with pytest.raises(errors.ResourceExhausted) as caught:
            client.get_branch("repo", "main")
        elapsed = time.monotonic() - started
    assert attempts.calls["GetBranch"] == 1  # no retry: the proof it failed at once
    assert elapsed < 5.0  # did not spend the 10 s budget (not a speed floor)
    assert caught.value.retry_delay is None


def test_resource_exhausted_with_retry_info_is_retried(serve):
    answers = iter(
        [
            errors.ResourceExhausted("slow down", retry_delay=0.05),
            errors.ResourceExhausted("slow down", retry_delay=0.05),
        ]
    )

    def throttled_twice(request, context):
        answer = next(answers, None)
        if answer is not None:
            raise answer
        return bm.GetBranchResponse(branch=types_pb2.Branch(name=request.name, commit_id="c1"))

    target, attempts = serve(throttled_twice)
    with Client(target, target, retry=PATIENT) as client:
        started = time.monotonic()
        assert client.get_branch("repo", "main").commit_id == "c1"
        assert time.monotonic() - started >= 0.1  # the server's delays were honoured
    assert attempts.calls["GetBranch"] == 3


def test_request_over_the_server_receive_limit_is_message_too_large(serve):
    def unused(request, context):
        raise AssertionError("never reached")

    target, attempts = serve(unused, options=[("grpc.max_receive_message_length", 2048)])
    with Client(target, target, retry=PATIENT) as client:
        started = time.monotonic()
        with pytest.raises(errors.MessageTooLarge) as caught:
            client.put_object("repo", "main", {"path": "a", "metadata": {"k": "v" * 8000}})
        elapsed = time.monotonic() - started
    assert caught.value.reason == "MESSAGE_TOO_LARGE"
    assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert attempts.calls["PutObject"] == 1 and elapsed < 5.0  # no retry in the 10 s budget


def test_response_over_the_server_send_limit_carries_error_info(serve):
    def huge(request, context):
        return bm.GetBranchResponse(branch=types_pb2.Branch(name="x" * 5000))

    target, attempts = serve(huge, max_message_bytes=4096)
    channel = grpc.insecure_channel(target)
    try:
        with pytest.raises(grpc.RpcError) as raw:
            branch_manager_pb2_grpc.BranchManagerStub(channel).GetBranch(
                bm.GetBranchRequest(repository="repo", name="main"), timeout=5
            )
    finally:
        channel.close()
    assert raw.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    info, _ = error_info(raw.value)
    assert info is not None and info.reason == "MESSAGE_TOO_LARGE"
    assert info.metadata["limit_bytes"] == "4096"
    assert isinstance(from_rpc_error(raw.value), errors.MessageTooLarge)
    with Client(target, target, retry=PATIENT) as client, pytest.raises(errors.MessageTooLarge):
        client.get_branch("repo", "main")
    assert attempts.calls["GetBranch"] == 2  # one raw call, one client call: no retry


def test_kv_throttling_reaches_the_client_with_retry_info_and_is_retried(tmp_path):
    """kv-gateway limiter → Throttled with RetryInfo → branch-manager's RemoteStore → the
    same error re-sent by branch-manager → the client retries it."""
    with running_suite(
        tmp_path, kv_limiter_enabled=True, kv_limiter_write_units_per_second=40.0
    ) as suite:
        with suite.client(retry=PATIENT) as client:
            client.create_repository("throttled", suite.namespace("throttled"))
        metadata = {"k": "v" * 4000}  # ~5 write units per staged entry
        channel = grpc.insecure_channel(suite.targets["branch-manager"])
        stub = branch_manager_pb2_grpc.BranchManagerStub(channel)
        refused = None
        try:
            for i in range(200):
                try:
                    stub.PutObject(
                        bm.PutObjectRequest(
                            repository="throttled",
                            branch="main",
                            entry=types_pb2.Entry(path=f"raw/{i}", metadata=metadata),
                        ),
                        timeout=10,
                    )
                except grpc.RpcError as error:
                    refused = error
                    break
        finally:
            channel.close()
        assert refused is not None, "the limiter never throttled"
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        rebuilt = from_rpc_error(refused)
        assert rebuilt.reason == "THROTTLED" and rebuilt.retry_delay is not None

        with suite.client(retry=PATIENT) as client:
            for i in range(30):
                client.put_object(
                    "throttled", "main", {"path": f"client/{i:02d}", "metadata": metadata}
                )
            listed = [e.path for e in client.iter_objects("throttled", "main", prefix="client/")]
        assert listed == [f"client/{i:02d}" for i in range(30)]
