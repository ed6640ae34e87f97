"""Multi-process serving's parts that need no process: the workers' metrics summed as one
process's, the worker-count setting, and the pid on spans and JSON log lines
(tests/e2e/test_workers.py runs the real thing)."""

from __future__ import annotations

import os

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from quarry import errors
from quarry.config import load_settings, setting_given, usable_cores
from quarry.runtime.workers import WORKER_ENV, sum_metrics, worker_role


def worker_text(calls: int, seconds: list[float], cache_bytes: float) -> str:
    """One worker's /metrics text."""
    registry = CollectorRegistry()
    counter = Counter("rpc_requests", "calls", ["method"], registry=registry)
    counter.labels("Stat").inc(calls)
    histogram = Histogram("rpc_seconds", "time", buckets=(0.1, 1.0), registry=registry)
    for value in seconds:
        histogram.observe(value)
    Gauge("cache_bytes", "bytes cached", registry=registry).set(cache_bytes)
    return generate_latest(registry).decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_workers_metrics_read_as_one_process():
    first = worker_text(3, [0.05, 0.5], 100)
    second = worker_text(4, [2.0], 50)
    registry = CollectorRegistry()

    class Summed:
        def collect(self):
            return sum_metrics([first, second])

    registry.register(Summed())
    got = samples(generate_latest(registry).decode())
    assert got[("rpc_requests_total", (("method", "Stat"),))] == 7
    assert got[("rpc_seconds_bucket", (("le", "0.1"),))] == 1
    assert got[("rpc_seconds_bucket", (("le", "1.0"),))] == 2
    assert got[("rpc_seconds_bucket", (("le", "+Inf"),))] == 3
    assert got[("rpc_seconds_count", ())] == 3
    assert got[("rpc_seconds_sum", ())] == pytest.approx(2.55)
    assert got[("cache_bytes", ())] == 150
    # A creation time is the earliest worker's, never a sum.
    created = [samples(t)[("rpc_requests_created", (("method", "Stat"),))] for t in (first, second)]
    assert got[("rpc_requests_created", (("method", "Stat"),))] == min(created)


def test_constants_are_not_multiplied_by_the_workers():
    text = 'python_info{implementation="CPython"} 1.0\nprocess_max_fds 1024.0\n'
    got = samples(generate_latest(_registry_of(sum_metrics([text, text, text]))).decode())
    assert got[("python_info", (("implementation", "CPython"),))] == 1
    assert got[("process_max_fds", ())] == 1024


def _registry_of(metrics):
    registry = CollectorRegistry()

    class Fixed:
        def collect(self):
            return metrics

    registry.register(Fixed())
    return registry


def test_the_worker_count_setting():
    assert load_settings({}).workers_of("branch-manager") == 1  # one process: today's
    env = {"QUARRY_BRANCH_MANAGER_WORKERS": "3"}
    assert load_settings(env).workers_of("branch-manager") == 3
    auto = load_settings({"QUARRY_BRANCH_MANAGER_WORKERS": "0"})
    assert auto.workers_of("branch-manager") == usable_cores() >= 1
    assert usable_cores() <= len(os.sched_getaffinity(0))
    # The committer has a count of its own (default one process); services without the
    # setting run one process.
    assert load_settings(env).workers_of("committer") == 1
    assert load_settings({"QUARRY_COMMITTER_WORKERS": "2"}).workers_of("committer") == 2
    assert load_settings({"QUARRY_COMMITTER_WORKERS": "2"}).workers_of("kv-gateway") == 1
    with pytest.raises(errors.InvalidArgument, match="committer_workers"):
        load_settings({"QUARRY_COMMITTER_WORKERS": "-1"})
    with pytest.raises(errors.InvalidArgument, match="branch_manager_workers"):
        load_settings({"QUARRY_BRANCH_MANAGER_WORKERS": "-1"})
    # The s3-gateway (an HTTP service) has workers too; the console has none.
    assert load_settings({}).workers_of("s3-gateway") == 1
    gateway = load_settings({"QUARRY_S3_GATEWAY_WORKERS": "0"})
    assert gateway.workers_of("s3-gateway") == usable_cores()
    assert gateway.workers_of("console") == 1
    with pytest.raises(errors.InvalidArgument, match="s3_gateway_workers"):
        load_settings({"QUARRY_S3_GATEWAY_WORKERS": "-1"})


def test_quarry_up_keeps_a_worker_count_that_was_given(tmp_path):
    assert not setting_given("branch_manager_workers", {})
    assert setting_given("branch_manager_workers", {"QUARRY_BRANCH_MANAGER_WORKERS": "1"})
    config = tmp_path / "quarry.toml"
    config.write_text("branch_manager_workers = 1\n")
    assert setting_given("branch_manager_workers", {"QUARRY_CONFIG_FILE": str(config)})
    config.write_text("max_workers = 8\n")
    assert not setting_given("branch_manager_workers", {"QUARRY_CONFIG_FILE": str(config)})


def test_a_worker_knows_its_role_only_from_its_supervisor():
    assert worker_role({}) is None
    role = worker_role({WORKER_ENV: "1:3:7402"})
    assert role is not None and (role.index, role.count, role.port) == (1, 3, 7402)


def test_spans_and_json_log_lines_name_the_worker_process():
    import json
    import logging

    from quarry import telemetry
    from quarry.telemetry.logs import JsonFormatter

    provider = telemetry._provider("branch-manager")
    assert provider.resource.attributes["process.pid"] == os.getpid()
    record = logging.LogRecord("quarry.x", logging.INFO, __file__, 1, "hello", None, None)
    assert json.loads(JsonFormatter("branch-manager").format(record))["pid"] == os.getpid()
