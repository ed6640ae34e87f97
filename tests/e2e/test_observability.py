"""Observability over real processes (issue 13): one `quarry serve` process per service,
started the way users start them, each exporting traces with the real OTLP exporter to a
receiver this test runs (support.otlp), serving Prometheus /metrics, logging JSON.

  * a Commit, a Merge and a Compact made by the Python client here are each ONE trace with
    spans from the client, committer, range-writer and kv-gateway (graveler steps included,
    CAS retries as `cas.retry` events);
  * idle background loops (readiness probes, the sensor's scans, the dropper, staging
    reports) export no spans;
  * every service counts and times its RPCs; each exposes only its own metrics; branch
    labels are capped (no `_quarry-spark-*` series);
  * JSON log lines carry the trace id of the request they belong to;
  * the Grafana dashboard only queries metrics the services export.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from quarry.client import Client
from quarry.errors import QuarryError
from quarry.ports import free_port_block
from support.auth import setup_admin_over_grpc
from support.otlp import OtlpReceiver, ReceivedSpan, exporting_to, otlp_receiver, tree
from support.processes import VENV_BIN, free_port, json_lines, quarry_env, wait_serving
from support.wait import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "quarry.json"
# Start order as `quarry up` (any order works; this one is SERVING soonest).
SERVICES = ("kv-gateway", "range-writer", "committer", "compactor-sensor", "branch-manager")
# As the services name themselves in traces (OTEL_SERVICE_NAME default: quarry-<service>).
TRACED = {name: f"quarry-{name}" for name in SERVICES}
EPHEMERAL = "_quarry-spark-20260101T000000-0123456789ab"  # a Spark write's branch name


def _metrics_base_port() -> int:
    """A base port with the four ports after it free too (port = base + service index)."""
    return free_port_block(5)


@dataclass
class Observed:
    home: Path
    receiver: OtlpReceiver
    targets: dict[str, str]
    metrics_urls: dict[str, str]
    client_service: str = ""
    children: dict[str, subprocess.Popen] = field(default_factory=dict)
    traces: dict[str, str] = field(default_factory=dict)  # what -> trace id

    def client(self) -> Client:
        return Client(
            self.targets["branch-manager"],
            self.targets["committer"],
            compactor_sensor=self.targets["compactor-sensor"],
        )

    def scrape(self, name: str) -> str:
        return urllib.request.urlopen(self.metrics_urls[name], timeout=5).read().decode()


@pytest.fixture(scope="module")
def observed(tmp_path_factory) -> Iterator[Observed]:
    home = tmp_path_factory.mktemp("observed")
    ports = {name: free_port() for name in SERVICES}
    base = _metrics_base_port()
    from quarry.config import SERVICES as ORDER  # the metrics port index of each service

    with otlp_receiver() as receiver, exporting_to(receiver) as client_service:
        env = quarry_env(
            home,
            **{f"QUARRY_{n.upper().replace('-', '_')}_PORT": str(p) for n, p in ports.items()},
            **{
                f"QUARRY_{n.upper().replace('-', '_')}_ADDRESS": f"127.0.0.1:{p}"
                for n, p in ports.items()
            },
            QUARRY_METRICS_BASE_PORT=str(base),
            QUARRY_LOG_FORMAT="json",
            # Busy background loops: any span they made would show within seconds.
            QUARRY_COMPACTION_CHECK_INTERVAL_SECONDS="0.3",
            QUARRY_STAGING_DROP_INTERVAL_SECONDS="0.3",
            QUARRY_STAGING_REPORT_INTERVAL_SECONDS="0.2",
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_BSP_SCHEDULE_DELAY="100",
        )
        observed = Observed(
            home=home,
            receiver=receiver,
            targets={n: f"127.0.0.1:{p}" for n, p in ports.items()},
            metrics_urls={n: f"http://127.0.0.1:{base + ORDER.index(n)}/metrics" for n in SERVICES},
            client_service=client_service,
        )
        try:
            for name in SERVICES:
                with open(home / f"{name}.log", "w") as log:
                    observed.children[name] = subprocess.Popen(
                        [str(VENV_BIN / "quarry"), "serve", name],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
            for name in SERVICES:
                wait_serving(observed.targets[name], timeout=60)
            setup_admin_over_grpc(observed.targets["branch-manager"])
            _workload(observed)
            yield observed
        finally:
            for child in observed.children.values():
                child.send_signal(signal.SIGTERM)
            for child in observed.children.values():
                try:
                    child.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()


def _client_trace(observed: Observed, method: str, since: int) -> str:
    """The trace id of the newest client span of `method` ("/quarry.v1.Committer/Commit")
    this process started after `since` (ns) — the root of what that call caused."""
    found: list[ReceivedSpan] = []

    def arrived() -> bool:
        found[:] = [
            s
            for s in observed.receiver.spans()
            if s.service == observed.client_service
            and s.name == method
            and s.kind == "CLIENT"
            and s.start >= since
        ]
        return bool(found)

    wait_until(arrived, timeout=20, what=f"the client span of {method}")
    return max(found, key=lambda s: s.start).trace_id


def _workload(observed: Observed) -> None:
    """Commits (one racing a concurrent writer, for CAS retries), a merge, a compaction,
    clean and dirty reads, a read of an ephemeral branch and a NOT_FOUND."""
    with observed.client() as client:
        client.create_repository("lake", str(observed.home / "lake"))
        for i in range(20):
            client.put_object("lake", "main", path=f"t/{i:03d}", physical_address=f"a/{i}")
        since = time.time_ns()
        client.commit("lake", "main", "first")
        observed.traces["commit"] = _client_trace(observed, "/quarry.v1.Committer/Commit", since)

        # Commits racing writers and compactions of the same branch: a staged write marks
        # the fresh staging token dirty and a compaction seals and swaps, each moving the
        # branch record under the commit's seal or swap (a CAS retry).
        stop = threading.Event()

        def writer(prefix: str) -> None:
            with observed.client() as other:
                n = 0
                while not stop.is_set():
                    other.put_object("lake", "main", path=f"{prefix}/{n:05d}", physical_address="w")
                    n += 1

        def compactor() -> None:
            with observed.client() as other:
                while not stop.is_set():
                    with contextlib.suppress(QuarryError):
                        other.compact("lake", "main")

        threads = [
            threading.Thread(target=writer, args=("w1",), daemon=True),
            threading.Thread(target=writer, args=("w2",), daemon=True),
            threading.Thread(target=compactor, daemon=True),
        ]
        for thread in threads:
            thread.start()
        retried: list[str] = []
        try:
            for attempt in range(30):
                since = time.time_ns()
                try:
                    client.commit("lake", "main", f"racing {attempt}")
                except QuarryError:
                    continue  # nothing staged yet, or contended: try again
                trace_id = _client_trace(observed, "/quarry.v1.Committer/Commit", since)
                time.sleep(0.3)  # the services' exporters batch every 100 ms
                if any(
                    name == "cas.retry"
                    for s in observed.receiver.trace(trace_id)
                    for name, _ in s.events
                ):
                    retried.append(trace_id)
                    break
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=10)
        if retried:
            observed.traces["retried commit"] = retried[0]
        with contextlib.suppress(QuarryError):  # what the writer staged last
            client.commit("lake", "main", "after the race")

        client.create_branch("lake", "feature", "main")
        for i in range(5):
            client.put_object("lake", "feature", path=f"f/{i}", physical_address=f"f/{i}")
        client.commit("lake", "feature", "feature work")
        since = time.time_ns()
        client.merge("lake", "feature", "main", message="merge feature")
        observed.traces["merge"] = _client_trace(observed, "/quarry.v1.Committer/Merge", since)

        for i in range(5):
            client.put_object("lake", "main", path=f"c/{i}", physical_address=f"c/{i}")
        since = time.time_ns()
        client.compact("lake", "main")
        observed.traces["compact"] = _client_trace(observed, "/quarry.v1.Committer/Compact", since)

        client.commit("lake", "main", "clean again")
        client.stat_object("lake", "main", "t/001")  # a clean branch
        client.put_object("lake", "main", path="d/0", physical_address="d")
        client.stat_object("lake", "main", "t/001")  # a dirty one
        client.create_branch("lake", EPHEMERAL, "main")
        client.stat_object("lake", EPHEMERAL, "t/001")
        with pytest.raises(QuarryError):
            client.stat_object("lake", "main", "no/such/object")


# ---- traces ---------------------------------------------------------------------------------


def _assert_one_trace(observed: Observed, what: str, server_method: str, steps: set[str]) -> None:
    trace_id = observed.traces[what]
    services = {observed.client_service, *(TRACED[n] for n in ("committer", "range-writer"))}
    services.add(TRACED["kv-gateway"])
    observed.receiver.wait_for(trace_id, services)
    time.sleep(0.5)  # the rest of the batches
    spans = observed.receiver.trace(trace_id)
    shown = f"{what} trace:\n{tree(spans)}"
    print(shown)
    roots = [s for s in spans if not s.parent_id]
    assert len(roots) == 1, shown
    (root,) = roots
    assert (root.service, root.name, root.kind) == (
        observed.client_service,
        server_method,
        "CLIENT",
    ), shown
    # Every span hangs off the client's call: no orphans, no second trace.
    ids = {s.span_id for s in spans}
    assert all(s.parent_id in ids for s in spans if s is not root), shown
    by_service = {s.service for s in spans}
    assert services <= by_service, shown
    names = {(s.service, s.name, s.kind) for s in spans}
    assert (TRACED["committer"], server_method, "SERVER") in names, shown
    assert {n for s, n, _ in names if s == TRACED["committer"]} >= steps, shown
    assert any(
        s == TRACED["kv-gateway"] and n.startswith("/quarry.v1.KVGateway/") and k == "SERVER"
        for s, n, k in names
    ), shown
    assert any(
        s == TRACED["range-writer"] and n.startswith("/quarry.v1.RangeWriter/") and k == "SERVER"
        for s, n, k in names
    ), shown


def test_a_commit_is_one_trace_across_client_committer_range_writer_and_kv_gateway(observed):
    _assert_one_trace(
        observed,
        "commit",
        "/quarry.v1.Committer/Commit",
        {
            "graveler.commit",
            "graveler.seal",
            "graveler.apply",
            "graveler.write_commit",
            "graveler.swap_branch",
            "/quarry.v1.RangeWriter/ApplyChanges",
            "/quarry.v1.KVGateway/SetItemIf",
        },
    )


def test_a_commit_racing_a_writer_records_its_cas_retries(observed):
    assert "retried commit" in observed.traces, "no commit lost a CAS race to the writer"
    _assert_one_trace(
        observed,
        "retried commit",
        "/quarry.v1.Committer/Commit",
        {"graveler.commit", "graveler.swap_branch"},
    )
    events = [
        (span.name, attributes)
        for span in observed.receiver.trace(observed.traces["retried commit"])
        for name, attributes in span.events
        if name == "cas.retry"
    ]
    assert events and all(a["step"] and a["attempt"] >= 1 for _, a in events), events


def test_a_merge_is_one_trace(observed):
    _assert_one_trace(
        observed,
        "merge",
        "/quarry.v1.Committer/Merge",
        {"graveler.merge", "/quarry.v1.RangeWriter/MergeMetaRanges"},
    )


def test_a_compaction_is_one_trace(observed):
    _assert_one_trace(
        observed,
        "compact",
        "/quarry.v1.Committer/Compact",
        {"graveler.compact", "graveler.seal", "graveler.swap_branch"},
    )


def test_idle_background_loops_emit_no_spans(observed):
    """Readiness probes every second, the sensor's scans and the dropper every 0.3 s, the
    reporter every 0.2 s: over four idle seconds, not one span from any service."""
    receiver = observed.receiver

    def quiet() -> bool:  # what the workload caused has been exported
        before = len(receiver.spans())
        time.sleep(1.0)
        return len(receiver.spans()) == before

    wait_until(quiet, timeout=30, what="the spans to stop arriving (do background loops trace?)")
    receiver.clear()
    time.sleep(4.0)
    spans = receiver.spans()
    assert not spans, tree(spans)


# ---- logs -----------------------------------------------------------------------------------


def test_json_log_lines_carry_the_trace_id_of_their_request(observed):
    commit_trace = observed.traces["commit"]
    records = json_lines(observed.home / "committer.log")
    assert records and all(
        {"time", "level", "service", "logger", "message"} <= r.keys() for r in records
    )
    assert {r["service"] for r in records} == {"committer"}
    in_commit = [r for r in records if r.get("trace_id") == commit_trace]
    # The audit line of the Commit call is written while serving it.
    assert any(r["logger"] == "quarry.audit" and "Commit" in r["message"] for r in in_commit), (
        records[-20:]
    )
    assert all(re.fullmatch(r"[0-9a-f]{16}", r["span_id"]) for r in in_commit)
    # Every audit line is written within a traced request: every one has its trace id.
    audit = [r for r in records if r["logger"] == "quarry.audit"]
    assert audit and all("trace_id" in r for r in audit), audit


# ---- metrics --------------------------------------------------------------------------------

# Families only one service may expose (prefix -> the service).
OWNED_PREFIXES = {
    "quarry_kv_": "kv-gateway",
    "quarry_range_writer_": "range-writer",
    "quarry_compaction": "compactor-sensor",
    "quarry_compactions": "compactor-sensor",
    "quarry_branch_sealed_tokens": "compactor-sensor",
    "quarry_staging_reports_": "branch-manager",
}


@dataclass
class Scrape:
    families: dict[str, object]  # family name -> prometheus_client Metric
    samples: list[tuple[str, dict[str, str], float]]

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples named `name` whose labels include `labels`."""
        return sum(
            v
            for n, sample_labels, v in self.samples
            if n == name and labels.items() <= sample_labels.items()
        )

    def label_values(self, name: str, label: str) -> set[str]:
        return {ls[label] for n, ls, _ in self.samples if n == name and label in ls}

    def exported_names(self) -> set[str]:
        """Every series name a query may use, samples or not yet (a labelled family with no
        children yet is declared by its HELP/TYPE lines)."""
        names = {n for n, _, _ in self.samples}
        for name, family in self.families.items():
            kind = family.type
            if kind == "counter":
                names |= {f"{name}_total", f"{name}_created"}
            elif kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_count", f"{name}_sum", f"{name}_created"}
            else:
                names.add(name)
        return names


def scrape(observed: Observed, name: str) -> Scrape:
    families = {f.name: f for f in text_string_to_metric_families(observed.scrape(name))}
    samples = [(s.name, dict(s.labels), s.value) for f in families.values() for s in f.samples]
    return Scrape(families, samples)


def settled_scrape(observed: Observed, name: str) -> Scrape:
    """A scrape between two calls: the same RPC counts and timings as the scrape before it.
    A scrape reads one family after another, so a call a background loop (the staging
    dropper's DeleteItem) makes meanwhile may be in one family and not yet in the next."""
    rpc = ("quarry_rpc_requests_total", "quarry_rpc_duration_seconds_count")

    def counts(got: Scrape) -> list:
        return sorted((n, sorted(ls.items()), v) for n, ls, v in got.samples if n in rpc)

    last = scrape(observed, name)
    for _ in range(50):
        got = scrape(observed, name)
        if counts(got) == counts(last):
            return got
        last = got
        time.sleep(0.1)
    return last  # never quiet: the assertions say what differs


@pytest.fixture(scope="module")
def scrapes(observed) -> dict[str, Scrape]:
    return {name: settled_scrape(observed, name) for name in SERVICES}


@pytest.mark.parametrize("service", SERVICES)
def test_every_service_counts_and_times_its_rpcs_by_method_and_code(scrapes, service):
    got = scrapes[service]
    assert got.label_values("quarry_rpc_requests_total", "service") == {service}
    methods = got.label_values("quarry_rpc_requests_total", "method")
    # Its own gRPC service's calls (health probes are not counted).
    own = {
        "kv-gateway": "quarry.v1.KVGateway/",
        "range-writer": "quarry.v1.RangeWriter/",
        "committer": "quarry.v1.Committer/",
        "compactor-sensor": "quarry.v1.CompactorSensor/",
        "branch-manager": "quarry.v1.BranchManager/",
    }[service]
    assert any(m.startswith(own) for m in methods), methods
    for method in methods:
        count = got.value("quarry_rpc_requests_total", service=service, method=method)
        timed = got.value("quarry_rpc_duration_seconds_count", service=service, method=method)
        assert count == timed > 0, method


def test_status_codes_are_labels(scrapes):
    bm = scrapes["branch-manager"]
    stat = "quarry.v1.BranchManager/StatObject"
    assert bm.value("quarry_rpc_requests_total", method=stat, code="OK") >= 3
    assert bm.value("quarry_rpc_requests_total", method=stat, code="NOT_FOUND") == 1
    # The committer's Commit latency (the dashboard's commit/merge panel).
    cm = scrapes["committer"]
    assert cm.value("quarry_rpc_duration_seconds_count", method="quarry.v1.Committer/Commit") >= 3
    assert cm.value("quarry_rpc_duration_seconds_count", method="quarry.v1.Committer/Merge") == 1


def test_kv_latency_by_operation_and_partition_class(scrapes):
    kv = scrapes["kv-gateway"]
    name = "quarry_kv_operation_duration_seconds_count"
    ops = kv.label_values(name, "op")
    assert {"get", "set_if", "scan_page", "batch_set"} <= ops, ops
    classes = kv.label_values(name, "partition_class")
    assert {"repo", "staging"} <= classes, classes
    assert kv.value(name, op="get", partition_class="repo") > 0
    assert kv.value("quarry_kv_read_units_total", partition_class="staging") > 0


def test_range_writer_ranges_bytes_and_latency(scrapes):
    rw = scrapes["range-writer"]
    assert rw.value("quarry_range_writer_ranges_total", op="apply", kind="written") >= 1
    # Reuse needs a base of several ranges (this lake is one range): the series is there.
    assert rw.label_values("quarry_range_writer_ranges_total", "kind") == {"written", "reused"}
    assert rw.value("quarry_range_writer_bytes_written_total") > 0
    assert rw.value("quarry_range_writer_range_files_total", result="written") >= 1
    for op in ("apply", "merge", "write_metarange"):
        assert (
            rw.value("quarry_range_writer_operation_duration_seconds_count", op=op, outcome="ok")
            >= 1
        ), op


def test_each_service_exposes_only_its_own_metrics(scrapes):
    for service, got in scrapes.items():
        for family in got.families:
            for prefix, owner in OWNED_PREFIXES.items():
                if family.startswith(prefix):
                    assert service == owner, f"{family} on {service}"
    sensor = scrapes["compactor-sensor"]
    assert "quarry_compaction_entries_compacted" in sensor.families
    assert "quarry_kv_read_units" in scrapes["kv-gateway"].families
    assert "quarry_staging_reports_sent" in scrapes["branch-manager"].families


def test_branch_labels_leave_out_ephemeral_branches(scrapes):
    bm = scrapes["branch-manager"]
    branches = bm.label_values("graveler_branch_reads_total", "branch")
    assert "main" in branches and "_ephemeral" in branches, branches
    assert not any(b.startswith("_quarry-") for b in branches), branches
    # The branch read optimization: clean reads skip staging, dirty ones look into it.
    assert bm.value("graveler_branch_reads_total", branch="main", dirty="false") >= 1
    assert bm.value("graveler_branch_reads_total", branch="main", dirty="true") >= 1
    assert bm.value("graveler_staging_read_attempts_total", branch="main") >= 1
    for got in scrapes.values():
        for _name, labels, _value in got.samples:
            assert not labels.get("branch", "").startswith("_quarry-"), labels


# ---- the Grafana dashboard ------------------------------------------------------------------

METRIC_NAME = re.compile(r"\b((?:quarry|graveler)_[a-z0-9_]+)\b")


def test_the_dashboard_queries_only_metrics_the_services_export(scrapes):
    """The gRPC services' panels; the S3 gateway's (quarry_s3_*) are checked against a
    running gateway in test_s3_gateway.py."""
    dashboard = json.loads(DASHBOARD.read_text())
    exported = set().union(*(got.exported_names() for got in scrapes.values()))
    used: dict[str, str] = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            for name in METRIC_NAME.findall(target["expr"]):
                if not name.startswith("quarry_s3_"):
                    used[name] = panel["title"]
    assert used, "the dashboard queries nothing"
    missing = {name: title for name, title in used.items() if name not in exported}
    assert not missing, missing


# ---- a Spark write --------------------------------------------------------------------------


def test_a_spark_write_is_one_trace_from_driver_and_executors(observed, spark, python_writer):
    """The driver (this process) and the executors' Python workers (their own processes,
    exporting as quarry-spark-executor) and every service they call: one trace."""
    context = spark.sparkContext
    # Executors' Python workers get this environment (new workers: a new environment).
    executor_env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": observed.receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    executor = "quarry-spark-executor"
    saved = dict(context.environment)
    context.environment.update(executor_env)
    try:
        root, spans = traced_spark_write(observed, spark, "sparked", also={executor})
    finally:
        context.environment.clear()
        context.environment.update(saved)
    shown = tree(spans)
    print(f"spark write trace:\n{shown}")
    assert [s for s in spans if not s.parent_id] == [root], shown
    tasks = [s for s in spans if s.service == executor and s.name == "quarry.spark.write_task"]
    assert len(tasks) == 2, shown  # one per partition
    puts = [
        s
        for s in spans
        if s.service == TRACED["branch-manager"]
        and s.name.endswith("/PutObjects")
        and s.kind == "SERVER"
    ]
    task_ids = {t.span_id for t in tasks}
    # The staged writes are the executors' calls, under their task spans.
    client_puts = {
        s.span_id: s.parent_id
        for s in spans
        if s.service == executor and s.name.endswith("/PutObjects") and s.kind == "CLIENT"
    }
    assert puts and all(client_puts.get(p.parent_id) in task_ids for p in puts), shown
    assert any(
        s.service == TRACED["committer"] and s.name == "/quarry.v1.Committer/Merge" for s in spans
    ), shown


def test_a_write_through_sparks_own_writer_is_one_trace(observed, spark):
    """With Spark's own file writer (quarry.spark.native: the rows never reach Python, so the
    executors make no Quarry calls) the driver's write and every service call it makes for
    the files Spark committed are still one trace under the driver's write span."""
    from quarry.spark.native import FILE_WRITER_CONF

    spark.conf.set(FILE_WRITER_CONF, "spark")
    try:
        root, spans = traced_spark_write(observed, spark, "sparked-native")
    finally:
        spark.conf.unset(FILE_WRITER_CONF)
    shown = tree(spans)
    assert [s for s in spans if not s.parent_id] == [root], shown
    assert not [s for s in spans if s.service == "quarry-spark-executor"], shown
    staged = [
        s for s in spans if s.service == TRACED["branch-manager"] and s.name.endswith("/PutObjects")
    ]
    assert staged, shown  # the committed files were staged inside the write's trace


def traced_spark_write(observed, spark, repo, also=frozenset()):
    """quarry.spark.write of a small DataFrame into a new repository REPO; the driver's write
    span (the one this write started) and its trace, once spans of the test process, every
    service the write calls and the services in `also` have arrived."""
    import quarry.spark as qs

    def write_spans() -> set[str]:
        return {
            s.span_id
            for s in observed.receiver.spans()
            if s.name == "quarry.spark.write" and s.service == observed.client_service
        }

    before = write_spans()
    df = spark.range(0, 100, numPartitions=2).selectExpr("id", "id * 2 AS doubled")
    connection = qs.Connection(observed.targets["branch-manager"], observed.targets["committer"])
    with observed.client() as client:
        client.create_repository(repo, str(observed.home / repo))
    qs.write(df, f"quarry://{repo}/main/t", connection=connection)

    def this_write() -> list[ReceivedSpan]:
        new = write_spans() - before
        return [s for s in observed.receiver.spans() if s.span_id in new]

    (root,) = wait_until(this_write, timeout=20, what="the driver's write span")
    observed.receiver.wait_for(
        root.trace_id,
        {
            observed.client_service,
            TRACED["branch-manager"],
            TRACED["committer"],
            TRACED["range-writer"],
            TRACED["kv-gateway"],
            *also,
        },
        timeout=60,
    )
    time.sleep(0.5)
    return root, observed.receiver.trace(root.trace_id)
