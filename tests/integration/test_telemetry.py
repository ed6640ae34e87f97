"""Traces cross the gRPC hop; each service exposes Prometheus metrics on 127.0.0.1."""

import urllib.request

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
