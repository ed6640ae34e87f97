"""Traces cross the gRPC hop; each service exposes Prometheus metrics on 127.0.0.1."""

import urllib.request

import pytest

from quarry import telemetry
from quarry.kv.remote import RemoteStore
from quarry.v1 import kv_pb2, kv_pb2_grpc
from support.auth import service_channel
from support.processes import free_port, quarry_env, quarry_serve, wait_serving
from support.servers import kv_gateway


def test_one_trace_spans_client_and_server():
    exporter = telemetry.use_in_memory_exporter()
    exporter.clear()
    with kv_gateway() as (_server, target):
        store = RemoteStore(target)  # an instrumented channel
        tracer = telemetry.tracer("test")
        with tracer.start_as_current_span("caller") as caller:
            store.set(b"cleanup", b"k", b"v")
            assert store.get(b"cleanup", b"k").value == b"v"
        store.close()
    spans = exporter.get_finished_spans()
    trace_id = caller.get_span_context().trace_id
    names = [(s.name, s.kind.name) for s in spans if s.context.trace_id == trace_id]
    assert ("/quarry.v1.KVGateway/GetItem", "CLIENT") in names
    assert ("/quarry.v1.KVGateway/GetItem", "SERVER") in names
    assert ("/quarry.v1.KVGateway/SetItem", "SERVER") in names


def test_a_failed_calls_server_span_records_its_status():
    """A call that fails (here NOT_FOUND, a domain error through the error interceptor)
    carries its gRPC code on the server's span too, not only on the client's
    (abort_with_status alone once left server spans at code 0). The span's status stays
    unset: OpenTelemetry's conventions count a caller's NOT_FOUND as no server error."""
    from quarry.kv.store import KeyNotFound

    exporter = telemetry.use_in_memory_exporter()
    exporter.clear()
    with kv_gateway() as (_server, target):
        store = RemoteStore(target)
        with pytest.raises(KeyNotFound):
            store.get(b"cleanup", b"never-set")
        store.close()
    (server,) = [
        s
        for s in exporter.get_finished_spans()
        if s.name == "/quarry.v1.KVGateway/GetItem" and s.kind.name == "SERVER"
    ]
    assert server.attributes["rpc.grpc.status_code"] == 5  # NOT_FOUND


def test_prometheus_endpoint_per_service(tmp_path):
    port, metrics_port = free_port(), free_port()
    env = quarry_env(
        tmp_path,
        QUARRY_KV_URL="memory://",
        QUARRY_KV_GATEWAY_PORT=str(port),
        QUARRY_METRICS_BASE_PORT=str(metrics_port),
    )
    with quarry_serve("kv-gateway", env):
        target = f"127.0.0.1:{port}"
        wait_serving(target)
        with service_channel(target) as channel:
            stub = kv_pb2_grpc.KVGatewayStub(channel)
            stub.SetItem(
                kv_pb2.SetItemRequest(partition_key=b"staging/t1", key=b"a", value=b"x" * 3000),
                timeout=5,
            )
            report = stub.GetCapacityReport(kv_pb2.GetCapacityReportRequest(top_n=3), timeout=5)
        body = (
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
            .read()
            .decode()
        )
    assert 'quarry_kv_write_units_total{partition_class="staging"} 3.0' in body
    classes = {c.partition_class: c.usage for c in report.classes}
    assert classes["staging"].write_units == 3  # 3,000-byte value + key overhead → 3 WCU
    assert report.hottest_partitions[0].partition_key == b"staging/t1"


def test_a_commit_is_one_trace_with_a_span_per_step(tmp_path):
    """Client → committer → kv-gateway / range-writer, with the commit's steps as spans."""
    from support.suite import running_suite

    exporter = telemetry.use_in_memory_exporter()
    with running_suite(tmp_path) as suite, suite.client() as client:
        client.create_repository("traced", suite.namespace("traced"))
        client.put_object("traced", "main", path="a", physical_address="x", checksum="c")
        exporter.clear()
        with telemetry.tracer("test").start_as_current_span("user") as user:
            client.commit("traced", "main", "traced commit")
    trace_id = user.get_span_context().trace_id
    spans = [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]
    names = {s.name for s in spans}
    assert {
        "graveler.commit",
        "graveler.seal",
        "graveler.apply",
        "graveler.write_commit",
        "graveler.swap_branch",
    } <= names
    assert "/quarry.v1.Committer/Commit" in names
    assert "/quarry.v1.RangeWriter/ApplyChanges" in names
    assert "/quarry.v1.KVGateway/SetItemIf" in names
    commit_span = next(s for s in spans if s.name == "graveler.commit")
    assert commit_span.attributes["quarry.attempts"] == 1


def test_a_channel_opened_before_tracing_was_configured_is_traced(monkeypatch):
    """The bug of issue 13: serve() built its channels before configuring tracing, and the
    channels decided at creation. Now they decide per call."""
    exporter = telemetry.use_in_memory_exporter()
    with kv_gateway() as (_server, target):
        monkeypatch.setattr(telemetry, "_configured", False)
        store = RemoteStore(target)  # opened while tracing is off
        store.set(b"cleanup", b"k", b"v")
        monkeypatch.setattr(telemetry, "_configured", True)  # then turned on
        exporter.clear()
        with telemetry.tracer("test").start_as_current_span("caller") as caller:
            store.get(b"cleanup", b"k")
        store.close()
    trace_id = caller.get_span_context().trace_id
    names = {
        (s.name, s.kind.name)
        for s in exporter.get_finished_spans()
        if s.context.trace_id == trace_id
    }
    assert ("/quarry.v1.KVGateway/GetItem", "CLIENT") in names
    assert ("/quarry.v1.KVGateway/GetItem", "SERVER") in names


def test_background_calls_record_no_span_on_either_side_and_root_span_starts_a_trace():
    exporter = telemetry.use_in_memory_exporter()
    with kv_gateway() as (_server, target):
        store = RemoteStore(target)
        store.set(b"cleanup", b"k", b"v")
        exporter.clear()
        with telemetry.background():
            store.get(b"cleanup", b"k")  # a background loop's read
            assert not exporter.get_finished_spans()
            with telemetry.root_span("work") as work:  # work worth a trace of its own
                store.get(b"cleanup", b"k")
        store.close()
    spans = exporter.get_finished_spans()
    assert {s.context.trace_id for s in spans} == {work.get_span_context().trace_id}
    assert {(s.name, s.kind.name) for s in spans} == {
        ("work", "INTERNAL"),
        ("/quarry.v1.KVGateway/GetItem", "CLIENT"),
        ("/quarry.v1.KVGateway/GetItem", "SERVER"),
    }


def test_health_checks_make_no_server_spans():
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from quarry.runtime.channels import open_channel

    exporter = telemetry.use_in_memory_exporter()
    with kv_gateway() as (_server, target):
        exporter.clear()
        with open_channel(target, traced=False) as channel:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert not exporter.get_finished_spans()


def test_every_call_is_counted_and_timed_with_its_status_code():
    from prometheus_client import REGISTRY

    from quarry.kv.store import KeyNotFound

    def sample(name: str, code: str) -> float:
        labels = {"service": "kv-gateway", "method": "quarry.v1.KVGateway/GetItem", "code": code}
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = {c: sample("quarry_rpc_requests_total", c) for c in ("OK", "NOT_FOUND")}
    timed = sample("quarry_rpc_duration_seconds_count", "NOT_FOUND")
    with kv_gateway() as (_server, target):
        store = RemoteStore(target)
        store.set(b"cleanup", b"k", b"v")
        store.get(b"cleanup", b"k")
        store.get(b"cleanup", b"k")
        with pytest.raises(KeyNotFound):
            store.get(b"cleanup", b"missing")
        store.close()
    assert sample("quarry_rpc_requests_total", "OK") == before["OK"] + 2
    assert sample("quarry_rpc_requests_total", "NOT_FOUND") == before["NOT_FOUND"] + 1
    assert sample("quarry_rpc_duration_seconds_count", "NOT_FOUND") == timed + 1


def test_health_checks_are_not_counted_with_users_calls():
    """A kubelet's probes would outnumber a quiet service's real calls."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from prometheus_client import REGISTRY

    from quarry.runtime.channels import open_channel

    def health_samples() -> list[str]:
        return [
            sample.labels["method"]
            for family in REGISTRY.collect()
            if family.name == "quarry_rpc_requests"
            for sample in family.samples
            if sample.labels.get("method", "").startswith("grpc.")
        ]

    with kv_gateway() as (_server, target):
        with open_channel(target, traced=False) as channel:
            for _ in range(3):
                health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=5
                )
        store = RemoteStore(target)
        store.set(b"cleanup", b"health", b"v")
        store.close()
    assert health_samples() == []
    labels = {"service": "kv-gateway", "method": "quarry.v1.KVGateway/SetItem", "code": "OK"}
    assert (REGISTRY.get_sample_value("quarry_rpc_requests_total", labels) or 0) >= 1
