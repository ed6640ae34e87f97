"""Readiness in the common runtime (quarry.runtime.server): health follows the declared
dependencies, start-up work waits behind the gate, calls are refused with a reason while not
ready — exercised with real kv-gateways on loopback as the dependencies."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2
from grpc_status import rpc_status

import quarry
from quarry.kv.memory import MemoryStore
from quarry.kv.remote import RemoteStore
from quarry.runtime.format_version import FormatVersionMismatch, ensure_format_version
from quarry.runtime.periodic import PeriodicWorker
from quarry.runtime.server import Dependency, create_server, service_dependency
from quarry.v1 import kv_pb2, kv_pb2_grpc, server_info_pb2, server_info_pb2_grpc
from support.auth import service_channel
from support.processes import free_port, health_status, wait_health
from support.servers import settings_for_tests
from support.wait import wait_until

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
FAST = dict(interval=0.1, retry_initial=0.02, retry_max=0.1, probe_timeout=0.5)


def gateway_spec(backend=None):
    from quarry.services.kv_gateway.service import build

    return build(settings_for_tests(), backend=backend if backend is not None else MemoryStore())


def start(spec, port: int = 0):
    return create_server(settings_for_tests(), spec, port=port, host="127.0.0.1", **FAST)


def reason_of(error: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    status = rpc_status.from_call(error)
    assert status is not None, error
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError("no ErrorInfo")


def scan(target: str) -> list:
    with service_channel(target) as channel:
        return list(
            kv_pb2_grpc.KVGatewayStub(channel).ScanItems(
                kv_pb2.ScanItemsRequest(partition_key=b"cleanup"), timeout=5
            )
        )


def test_health_and_calls_follow_a_dependency_that_comes_and_goes():
    """Gateway B declares gateway A as its dependency. B's streaming ScanItems is refused
    while A is away; health and ServerInfo answer throughout."""
    a_port = free_port()
    spec = gateway_spec()
    spec.dependencies = [service_dependency("kv-gateway", f"127.0.0.1:{a_port}")]
    b, b_port = start(spec)
    b_target = f"127.0.0.1:{b_port}"
    try:
        for name in ("", "quarry.v1.KVGateway"):
            assert health_status(b_target, name) == NOT_SERVING
        assert health_status(b_target, "quarry.v1.ServerInfo") == SERVING
        with grpc.insecure_channel(b_target) as channel:
            assert (
                server_info_pb2_grpc.ServerInfoStub(channel)
                .GetServerInfo(server_info_pb2.GetServerInfoRequest(), timeout=5)
                .service
                == "kv-gateway"
            )
        with pytest.raises(grpc.RpcError) as caught:
            scan(b_target)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        info = reason_of(caught.value)
        assert info.reason == "DEPENDENCY_UNAVAILABLE"
        assert info.metadata["dependency"] == "kv-gateway"
        assert info.metadata["address"] == f"127.0.0.1:{a_port}"

        a, _ = start(gateway_spec(), port=a_port)
        wait_health(b_target, SERVING, timeout=10)
        assert health_status(b_target, "quarry.v1.KVGateway") == SERVING
        assert scan(b_target) == []

        a.stop(grace=0)
        wait_health(b_target, NOT_SERVING, timeout=10)
        with pytest.raises(grpc.RpcError) as caught:
            scan(b_target)
        assert reason_of(caught.value).reason == "DEPENDENCY_UNAVAILABLE"

        a, _ = start(gateway_spec(), port=a_port)
        wait_health(b_target, SERVING, timeout=10)
        a.stop(grace=0)
    finally:
        b.stop(grace=0)


def test_start_up_work_waits_until_it_can_run_and_runs_once():
    """The format check reads the KV store through a gateway that is not up yet: the
    service starts anyway, NOT_SERVING ("is starting"), and runs the check once it can."""
    a_port = free_port()
    backend = MemoryStore()
    remote = RemoteStore(f"127.0.0.1:{a_port}", timeout=1)
    runs = []

    def check_format() -> None:
        runs.append(ensure_format_version(remote))

    probe_rounds = []  # a dependency that always answers: counts B's probe rounds
    spec = gateway_spec()
    spec.on_ready = [check_format]
    spec.dependencies = [
        *spec.dependencies,
        Dependency("round-counter", "-", lambda timeout: probe_rounds.append(1)),
    ]
    b, b_port = start(spec)
    b_target = f"127.0.0.1:{b_port}"
    try:
        assert health_status(b_target) == NOT_SERVING and b.failure is None
        with pytest.raises(grpc.RpcError) as caught:
            scan(b_target)
        assert reason_of(caught.value).reason == "DEPENDENCY_UNAVAILABLE"
        assert "is starting" in caught.value.details()

        a, _ = start(gateway_spec(backend), port=a_port)
        try:
            wait_health(b_target, SERVING, timeout=10)
            # Several more probe rounds: the work is not run again.
            rounds_when_ready = len(probe_rounds)
            wait_until(
                lambda: len(probe_rounds) >= rounds_when_ready + 3, what="three more probe rounds"
            )
            assert runs == [quarry.FORMAT_VERSION]
            assert (
                backend.get(b"quarry", b"format-version").value
                == str(quarry.FORMAT_VERSION).encode()
            )
        finally:
            a.stop(grace=0)
    finally:
        b.stop(grace=0)
        remote.close()


def test_a_format_version_mismatch_found_later_still_refuses():
    """Dependencies answer only after start, and then the store holds another format
    version: the service records the refusal (serve() exits with it), stops probing and
    never reports SERVING."""
    a_port = free_port()
    backend = MemoryStore()
    backend.set(b"quarry", b"format-version", b"2")  # an older store
    remote = RemoteStore(f"127.0.0.1:{a_port}", timeout=1)
    spec = gateway_spec()
    spec.dependencies = [service_dependency("kv-gateway", f"127.0.0.1:{a_port}")]
    spec.on_ready = [lambda: ensure_format_version(remote)]
    b, b_port = start(spec)
    b_target = f"127.0.0.1:{b_port}"
    other_build = gateway_spec(backend)
    other_build.on_ready.clear()  # a gateway of another build serves that store
    a, _ = start(other_build, port=a_port)
    try:
        wait_until(lambda: b.failure is not None, what="the refusal to be recorded")
        assert isinstance(b.failure, FormatVersionMismatch)
        assert "quarry store export" in str(b.failure)
        wait_until(lambda: not b.readiness.worker.running, what="the probe loop to end")
        assert not b.readiness.worker.running  # no retry loop on a refusal
        assert health_status(b_target) == NOT_SERVING
    finally:
        a.stop(grace=0)
        b.stop(grace=0)
        remote.close()


def test_a_mismatch_at_start_refuses_and_frees_the_port():
    backend = MemoryStore()
    backend.set(b"quarry", b"format-version", b"2")  # an older store
    port = free_port()
    with pytest.raises(FormatVersionMismatch):
        start(gateway_spec(backend), port=port)
    server, _ = start(gateway_spec(), port=port)  # the port was released
    server.stop(grace=0)


def test_periodic_worker_backs_off_with_jitter_and_resets():
    worker = PeriodicWorker("test", lambda: None, interval=1.0, retry_initial=0.1, retry_max=0.8)
    delays = [worker.next_delay(False) for _ in range(6)]
    for delay, ceiling in zip(delays, [0.1, 0.2, 0.4, 0.8, 0.8, 0.8], strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert worker.next_delay(True) == 1.0
    assert worker.next_delay(False) <= 0.1


def test_periodic_worker_stop_is_bounded_while_a_step_blocks():
    release = threading.Event()
    entered = threading.Event()

    def step():
        entered.set()
        release.wait(30)

    worker = PeriodicWorker("blocked", step, interval=0.01).start()
    try:
        assert entered.wait(5)
        started = time.monotonic()
        assert worker.stop(timeout=0.3) is False
        assert time.monotonic() - started < 10  # gave up, did not wait the step's 30 s
    finally:
        release.set()


def test_a_probe_that_hangs_past_its_timeout_is_a_dependency_away():
    """A probe bounded by its own client's timeout only (boto3's 30 s read timeout, against a
    DynamoDB that takes the connection and never answers) kept the kv-gateway SERVING for a
    minute while every call waited 30 s: the round waits for it no longer than the probe
    timeout. The gauges an alert reads follow."""
    from prometheus_client import REGISTRY

    answering = threading.Event()
    answering.set()
    release = threading.Event()

    def probe(timeout: float) -> None:
        if not answering.is_set():
            release.wait(60)  # ignores its timeout, as the hung read did

    spec = gateway_spec()
    spec.dependencies = [Dependency("kv-backend", "dynamodb://hung", probe)]
    server, port = start(spec)
    target = f"127.0.0.1:{port}"
    try:
        wait_health(target, SERVING, timeout=10)
        assert REGISTRY.get_sample_value("quarry_dependency_up", {"dependency": "kv-backend"}) == 1
        answering.clear()
        started = time.monotonic()
        wait_health(target, NOT_SERVING, timeout=20)
        # Two failed rounds of at most probe_timeout + slack each, not the probe's 60 s.
        assert time.monotonic() - started < 20
        with pytest.raises(grpc.RpcError) as caught:
            scan(target)
        info = reason_of(caught.value)
        assert info.reason == "DEPENDENCY_UNAVAILABLE"
        assert "does not answer within" in caught.value.details()
        assert REGISTRY.get_sample_value("quarry_dependency_up", {"dependency": "kv-backend"}) == 0
        assert REGISTRY.get_sample_value("quarry_serving") == 0
        # The store answers again while the stuck probes still hang (their connections
        # lost): fresh probes see it, rather than waiting the stuck ones out.
        answering.set()
        wait_health(target, SERVING, timeout=10)
        assert REGISTRY.get_sample_value("quarry_serving") == 1
    finally:
        release.set()
        server.stop(grace=0)
