"""The common service runtime, exercised on a real kv-gateway over loopback."""

import threading

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

import quarry
from quarry import errors
from quarry.kv.memory import MemoryStore
from quarry.runtime.errors import from_rpc_error
from quarry.runtime.format_version import FormatVersionMismatch, ensure_format_version
from quarry.runtime.server import ServiceSpec, create_server
from quarry.v1 import kv_pb2, kv_pb2_grpc, server_info_pb2, server_info_pb2_grpc
from support.auth import service_channel
from support.processes import health_status
from support.servers import kv_gateway, settings_for_tests
from support.wait import wait_until


def error_info_of(error: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    status = rpc_status.from_call(error)
    assert status is not None, "no google.rpc.Status in the trailers"
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError("no ErrorInfo detail")


def test_health_server_info_and_reflection():
    with kv_gateway() as (_server, target), service_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "quarry.v1.KVGateway", "quarry.v1.ServerInfo"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        info = server_info_pb2_grpc.ServerInfoStub(channel).GetServerInfo(
            server_info_pb2.GetServerInfoRequest(), timeout=5
        )
        assert (info.service, info.version, info.format_version) == (
            "kv-gateway",
            quarry.__version__,
            quarry.FORMAT_VERSION,
        )

        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        names = {s.name for r in responses for s in r.list_services_response.service}
        assert {
            "quarry.v1.KVGateway",
            "quarry.v1.ServerInfo",
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
        } <= names


def test_domain_errors_become_rich_statuses():
    with kv_gateway() as (_server, target), service_channel(target) as channel:
        stub = kv_pb2_grpc.KVGatewayStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetItem(kv_pb2.GetItemRequest(partition_key=b"cleanup", key=b"nope"), timeout=5)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        info = error_info_of(caught.value)
        assert (info.reason, info.domain) == ("KEY_NOT_FOUND", "quarry.dev")

        with pytest.raises(grpc.RpcError) as caught:
            stub.SetItem(
                kv_pb2.SetItemRequest(partition_key=b"nonsense/x", key=b"k", value=b""), timeout=5
            )
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info_of(caught.value).reason == "UNKNOWN_PARTITION_CLASS"

        stub.SetItem(
            kv_pb2.SetItemRequest(partition_key=b"cleanup", key=b"k", value=b"1"), timeout=5
        )
        with pytest.raises(grpc.RpcError) as caught:
            stub.SetItemIf(
                kv_pb2.SetItemIfRequest(
                    partition_key=b"cleanup", key=b"k", value=b"2", if_absent=True
                ),
                timeout=5,
            )
        assert caught.value.code() == grpc.StatusCode.ABORTED
        assert error_info_of(caught.value).reason == "PREDICATE_FAILED"
        # The client side rebuilds the same domain exception class.
        from quarry.kv.store import PredicateFailed

        assert isinstance(from_rpc_error(caught.value), PredicateFailed)

        with pytest.raises(grpc.RpcError) as caught:
            stub.SetItemIf(
                kv_pb2.SetItemIfRequest(partition_key=b"cleanup", key=b"k", value=b"2"), timeout=5
            )
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info_of(caught.value).reason == "MISSING_PREDICATE"

        with pytest.raises(grpc.RpcError) as caught:
            stub.SetItem(kv_pb2.SetItemRequest(partition_key=b"cleanup", key=b"k2"), timeout=5)
        assert error_info_of(caught.value).reason == "MISSING_VALUE"


def _spec_with_handlers(name: str, handlers: dict) -> ServiceSpec:
    generic = grpc.method_handlers_generic_handler("test.v1.Test", handlers)
    return ServiceSpec(
        name=name,
        register=lambda s: s.add_generic_rpc_handlers((generic,)),
        grpc_service_names=["test.v1.Test"],
    )


def _identity(data: bytes) -> bytes:
    return data


def test_unexpected_exceptions_hide_the_stack_trace():
    def boom(request, context):
        raise KeyError("secret internal detail")

    def stream_boom(request, context):
        yield b"one"
        raise RuntimeError("secret stream detail")

    spec = _spec_with_handlers(
        "kv-gateway",
        {
            "Boom": grpc.unary_unary_rpc_method_handler(boom, _identity, _identity),
            "StreamBoom": grpc.unary_stream_rpc_method_handler(stream_boom, _identity, _identity),
        },
    )
    server, port = create_server(settings_for_tests(), spec, port=0, host="127.0.0.1")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.RpcError) as caught:
                channel.unary_unary("/test.v1.Test/Boom")(b"x", timeout=5)
            assert caught.value.code() == grpc.StatusCode.INTERNAL
            assert "secret" not in caught.value.details()
            assert "Traceback" not in caught.value.details()
            assert "incident" in caught.value.details()
            assert error_info_of(caught.value).reason == "INTERNAL"

            replies = channel.unary_stream("/test.v1.Test/StreamBoom")(b"x", timeout=5)
            with pytest.raises(grpc.RpcError) as caught:
                list(replies)
            assert caught.value.code() == grpc.StatusCode.INTERNAL
            assert "secret" not in caught.value.details()
    finally:
        server.stop(1)


def test_graceful_stop_lets_in_flight_calls_finish():
    started, release = threading.Event(), threading.Event()

    def slow(request, context):
        started.set()
        # Held until the graceful stop has begun, so the call is in flight during it.
        assert release.wait(10)
        return b"done"

    spec = _spec_with_handlers(
        "kv-gateway", {"Slow": grpc.unary_unary_rpc_method_handler(slow, _identity, _identity)}
    )
    server, port = create_server(settings_for_tests(), spec, port=0, host="127.0.0.1")
    results = []
    target = f"127.0.0.1:{port}"
    with grpc.insecure_channel(target) as channel:
        call = threading.Thread(
            target=lambda: results.append(
                channel.unary_unary("/test.v1.Test/Slow")(b"x", timeout=10)
            )
        )
        call.start()
        assert started.wait(5)
        stopping = threading.Thread(target=server.stop, kwargs={"grace": 5})
        stopping.start()
        # The server no longer reports SERVING (or no longer answers): the stop has begun.
        wait_until(
            lambda: health_status(target) != health_pb2.HealthCheckResponse.SERVING,
            what="the graceful stop to begin",
        )
        release.set()
        call.join(10)
        stopping.join(10)
    assert results == [b"done"]


def test_format_version_stamped_once_and_mismatch_refused():
    backend = MemoryStore()
    assert ensure_format_version(backend) == quarry.FORMAT_VERSION
    assert backend.get(b"quarry", b"format-version").value == str(quarry.FORMAT_VERSION).encode()
    assert ensure_format_version(backend) == quarry.FORMAT_VERSION  # idempotent

    backend.set(b"quarry", b"format-version", b"2")  # an older store
    with pytest.raises(FormatVersionMismatch) as caught:
        ensure_format_version(backend)
    assert "quarry store export" in str(caught.value) and "quarry store import" in str(caught.value)
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION

    from quarry.services.kv_gateway.service import build

    # The check runs behind the readiness gate, in create_server's first round: still refused.
    with pytest.raises(FormatVersionMismatch):
        create_server(
            settings_for_tests(),
            build(settings_for_tests(), backend=backend),
            port=0,
            host="127.0.0.1",
        )


def test_format_version_racing_first_starts_agree():
    backend = MemoryStore()
    results, failures = [], []

    def start():
        try:
            results.append(ensure_format_version(backend))
        except Exception as exc:
            failures.append(exc)

    threads = [threading.Thread(target=start) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert results == [quarry.FORMAT_VERSION] * 16


def test_error_classes_round_trip_by_reason():
    exc = errors.Aborted("lost a race", metadata={"attempts": "3"}, retry_delay=0.25)
    from quarry.runtime.errors import to_status

    status = to_status(exc)
    assert status.code == grpc.StatusCode.ABORTED.value[0]
    kinds = {d.type_url.rsplit("/", 1)[-1] for d in status.details}
    assert kinds == {"google.rpc.ErrorInfo", "google.rpc.RetryInfo"}
