"""StagingReporter against a real gRPC server on loopback: batching, fire-and-forget, drops."""

import threading
import time

import pytest
from prometheus_client import REGISTRY

from quarry.compaction.reporter import StagingReporter
from quarry.runtime.server import ServiceSpec, create_server
from quarry.v1 import compactor_sensor_pb2 as pb
from quarry.v1 import compactor_sensor_pb2_grpc
from support.auth import service_token_source
from support.servers import settings_for_tests
from support.wait import wait_until


class RecordingSensor(compactor_sensor_pb2_grpc.CompactorSensorServicer):
    def __init__(self, delay=0.0):
        self.delay = delay
        self.requests: list[pb.ReportStagingActivityRequest] = []
        self.received = threading.Event()
        self.started = threading.Event()  # a report reached the servicer

    def ReportStagingActivity(self, request, context):
        self.started.set()
        if self.delay:
            time.sleep(self.delay)
        self.requests.append(request)
        self.received.set()
        return pb.ReportStagingActivityResponse()


@pytest.fixture
def sensor_server():
    servers = []

    def start(servicer):
        spec = ServiceSpec(
            name="compactor-sensor",
            register=lambda s: compactor_sensor_pb2_grpc.add_CompactorSensorServicer_to_server(
                servicer, s
            ),
            grpc_service_names=[pb.DESCRIPTOR.services_by_name["CompactorSensor"].full_name],
        )
        server, port = create_server(settings_for_tests(), spec, port=0, host="127.0.0.1")
        servers.append(server)
        return server, f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(grace=0)


# The sensor takes reports from Quarry's services only: a reporter carries a service token.
AS_BRANCH_MANAGER = service_token_source("branch-manager")


def dropped():
    return REGISTRY.get_sample_value("quarry_staging_reports_dropped_total") or 0.0


def lines(request):
    return sorted(
        (r.repository, r.branch, r.staging_token, r.puts, r.deletes) for r in request.reports
    )


def test_records_are_aggregated_into_one_call_per_flush(sensor_server):
    sensor = RecordingSensor()
    _, target = sensor_server(sensor)
    reporter = StagingReporter(
        target, interval_seconds=60, token_source=AS_BRANCH_MANAGER
    )  # flushed by hand
    try:
        for _ in range(100):
            reporter.record("lake", "main", "t1", 1, 0)
        reporter.record("lake", "main", "t1", 0, 3)
        reporter.record("lake", "main", "t2", 2, 0)
        reporter.record("lake", "dev", "t3", 0, 1)
        reporter.record("lake", "dev", "t3", 0, 0)  # nothing: not even a line
        assert reporter.pending() == 3
        assert reporter.flush() is True
        assert reporter.flush() is True  # nothing left: no call
    finally:
        reporter.stop()
    [request] = sensor.requests
    assert lines(request) == [
        ("lake", "dev", "t3", 0, 1),
        ("lake", "main", "t1", 100, 3),
        ("lake", "main", "t2", 2, 0),
    ]
    assert reporter.sent == 3 and reporter.dropped == 0


def test_background_thread_flushes_on_its_interval(sensor_server):
    sensor = RecordingSensor()
    _, target = sensor_server(sensor)
    reporter = StagingReporter(
        target, interval_seconds=0.05, token_source=AS_BRANCH_MANAGER
    ).start()
    try:
        reporter.record("lake", "main", "t", 1, 0)
        assert sensor.received.wait(5)
    finally:
        reporter.stop()
    assert lines(sensor.requests[0]) == [("lake", "main", "t", 1, 0)]


def test_sensor_down_drops_the_batch_and_counts_it():
    before = dropped()
    # Nothing listens on this port (bound and closed by the OS for us).
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reporter = StagingReporter(
        f"127.0.0.1:{port}",
        interval_seconds=60,
        timeout_seconds=0.5,
        token_source=AS_BRANCH_MANAGER,
    )
    try:
        reporter.record("lake", "main", "t", 1, 0)
        reporter.record("lake", "dev", "t", 0, 1)
        started = time.monotonic()
        assert reporter.flush() is False
        assert time.monotonic() - started < 2
        assert reporter.pending() == 0  # dropped, not retried: memory stays bounded
    finally:
        reporter.stop()
    assert reporter.dropped == 2
    assert dropped() == before + 2


def test_record_never_waits_for_a_slow_sensor(sensor_server):
    # A record that waited for the flush would wait its whole timeout (1 s): the bound below
    # is half of that, far above a record's microseconds even on a stalled machine.
    slow = RecordingSensor(delay=2.0)
    _, target = sensor_server(slow)
    reporter = StagingReporter(
        target, interval_seconds=60, timeout_seconds=1.0, token_source=AS_BRANCH_MANAGER
    )
    try:
        reporter.record("lake", "main", "t", 1, 0)
        flusher = threading.Thread(target=reporter.flush)
        flusher.start()
        wait_until(slow.started.is_set, what="the flush waiting for the sensor")
        worst = 0.0
        for _ in range(1000):
            started = time.perf_counter()
            reporter.record("lake", "main", "t", 1, 0)
            worst = max(worst, time.perf_counter() - started)
        flusher.join()
        assert worst < 0.5
        assert reporter.dropped == 1  # the timed-out batch
        assert reporter.pending() == 1  # the next batch, aggregated: 1,000 puts on one line
    finally:
        reporter.stop(flush=False)


def test_pending_lines_are_bounded():
    reporter = StagingReporter(
        "127.0.0.1:1", interval_seconds=60, max_pending=10, token_source=AS_BRANCH_MANAGER
    )
    try:
        for i in range(15):
            reporter.record("lake", f"b{i}", "t", 1, 0)
        reporter.record("lake", "b0", "t", 1, 0)  # an existing line still aggregates
        assert reporter.pending() == 10 and reporter.dropped == 5
    finally:
        reporter.stop(flush=False)
