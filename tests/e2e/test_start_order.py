"""Start order does not matter and stopping is order-independent (issue 10, item 6): real
`quarry serve` / `quarry up` processes, started the way users start them."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2
from grpc_status import rpc_status

from quarry.cli.main import SERVICE_MODULES, start_order
from quarry.client import Client
from quarry.client.retry import RetryPolicy
from quarry.v1 import (
    branch_manager_pb2,
    branch_manager_pb2_grpc,
    committer_pb2,
    committer_pb2_grpc,
    compactor_sensor_pb2,
    compactor_sensor_pb2_grpc,
    server_info_pb2,
    server_info_pb2_grpc,
)
from support.auth import setup_admin_over_grpc
from support.processes import VENV_BIN, free_port, quarry_env, service_ports, wait_health
from support.wait import wait_until

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# QUARRY_SHUTDOWN_GRACE_SECONDS of every process here. Long, because the tests prove a stop
# is prompt by its ending well inside the grace (3 s left too little room for a process's
# exit on a loaded machine); a test that waits the grace out sets FROZEN_GRACE.
GRACE = 10.0
FROZEN_GRACE = 3.0
SERVICES = ("kv-gateway", "range-writer", "branch-manager", "committer", "compactor-sensor")


class Processes:
    """`quarry serve SERVICE` children on fixed free ports, sharing one QUARRY_HOME (so a
    restarted kv-gateway serves the same SQLite file)."""

    def __init__(self, home: Path, **extra: str):
        self.ports = {name: free_port() for name in SERVICES}
        settings = service_ports(self.ports)
        settings.update(
            QUARRY_SHUTDOWN_GRACE_SECONDS=str(GRACE),
            # The dropper polls the (dead) gateway while we stop things.
            QUARRY_STAGING_DROP_INTERVAL_SECONDS="0.2",
            QUARRY_COMPACTION_CHECK_INTERVAL_SECONDS="0.2",
        )
        settings.update(extra)
        self.env = quarry_env(home, **settings)
        self.children: dict[str, subprocess.Popen] = {}
        self.home = home

    def target(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def start(self, name: str) -> subprocess.Popen:
        log = open(self.home / f"{name}.log", "a")  # noqa: SIM115 — closed with the child
        child = subprocess.Popen(
            [str(VENV_BIN / "quarry"), "serve", name],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        log.close()
        self.children[name] = child
        return child

    def log(self, name: str) -> str:
        return (self.home / f"{name}.log").read_text()

    def close(self) -> None:
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGCONT)
                child.kill()
                child.wait()


@pytest.fixture
def procs(tmp_path):
    (tmp_path / "home").mkdir()
    processes = Processes(tmp_path / "home")
    try:
        yield processes
    finally:
        processes.close()


def refusal(call) -> tuple[grpc.StatusCode, error_details_pb2.ErrorInfo]:
    """Make `call` (no retries) and return its status code and ErrorInfo."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    status = rpc_status.from_call(caught.value)
    assert status is not None, caught.value
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return caught.value.code(), info
    raise AssertionError(f"no ErrorInfo in {caught.value}")


def assert_waits_for(procs: Processes, dependency: str) -> None:
    """branch-manager and committer answer, NOT_SERVING, and refuse calls naming it."""
    with grpc.insecure_channel(procs.target("branch-manager")) as channel:
        code, info = refusal(
            lambda: branch_manager_pb2_grpc.BranchManagerStub(channel).ListRepositories(
                branch_manager_pb2.ListRepositoriesRequest(), timeout=5
            )
        )
        assert code == grpc.StatusCode.UNAVAILABLE
        assert info.reason == "DEPENDENCY_UNAVAILABLE"
        assert dependency in info.metadata["dependency"].split(",")
        assert procs.target(dependency) in info.metadata["address"]
    with grpc.insecure_channel(procs.target("committer")) as channel:
        code, info = refusal(
            lambda: committer_pb2_grpc.CommitterStub(channel).Log(
                committer_pb2.LogRequest(repository="demo", ref="main"), timeout=5
            )
        )
        assert code == grpc.StatusCode.UNAVAILABLE
        assert info.reason == "DEPENDENCY_UNAVAILABLE"
        assert dependency in info.metadata["dependency"].split(",")


def wait_all(procs: Processes, names, status) -> None:
    for name in names:
        wait_health(procs.target(name), status, child=procs.children[name])


DEPENDENTS = ["branch-manager", "committer", "compactor-sensor"]


def test_services_started_before_the_kv_gateway_wait_for_it_and_follow_it(procs, tmp_path):
    for name in DEPENDENTS:
        procs.start(name)
    # Up, listening and NOT_SERVING (overall and per service) — not exited.
    wait_all(procs, DEPENDENTS, NOT_SERVING)
    for name, service in (
        ("branch-manager", "quarry.v1.BranchManager"),
        ("committer", "quarry.v1.Committer"),
        ("compactor-sensor", "quarry.v1.CompactorSensor"),
    ):
        wait_health(procs.target(name), NOT_SERVING, service=service)
        with grpc.insecure_channel(procs.target(name)) as channel:
            info = server_info_pb2_grpc.ServerInfoStub(channel).GetServerInfo(
                server_info_pb2.GetServerInfoRequest(), timeout=5
            )
        assert info.service == name
    assert_waits_for(procs, "kv-gateway")
    with grpc.insecure_channel(procs.target("committer")) as channel:
        _code, info = refusal(
            lambda: committer_pb2_grpc.CommitterStub(channel).Log(
                committer_pb2.LogRequest(repository="demo", ref="main"), timeout=5
            )
        )
    assert set(info.metadata["dependency"].split(",")) == {"kv-gateway", "range-writer"}
    # The sensor waits for the committer too, which answers but is NOT_SERVING.
    with grpc.insecure_channel(procs.target("compactor-sensor")) as channel:
        code, info = refusal(
            lambda: compactor_sensor_pb2_grpc.CompactorSensorStub(channel).GetBranchStagingStats(
                compactor_sensor_pb2.GetBranchStagingStatsRequest(repository="demo", branch="main"),
                timeout=5,
            )
        )
    assert (code, info.reason) == (grpc.StatusCode.UNAVAILABLE, "DEPENDENCY_UNAVAILABLE")
    assert set(info.metadata["dependency"].split(",")) == {"kv-gateway", "committer"}

    procs.start("kv-gateway")
    procs.start("range-writer")
    wait_all(procs, DEPENDENTS, SERVING)
    assert all(procs.children[name].poll() is None for name in DEPENDENTS)
    setup_admin_over_grpc(procs.target("branch-manager"))  # the test admin (support.auth)
    namespace = tmp_path / "lake" / "demo"
    with Client(
        procs.target("branch-manager"),
        procs.target("committer"),
        compactor_sensor=procs.target("compactor-sensor"),
    ) as client:
        client.create_repository("demo", str(namespace))
        client.put_object(
            "demo",
            "main",
            path="t/a.parquet",
            physical_address="s3://bucket/a.parquet",
            size_bytes=10,
        )
        # The sensor's statistics (its loop started behind the gate) see the staged write.
        wait_until(
            lambda: client.branch_staging_stats("demo", "main").puts >= 1,
            timeout=20,
            interval=0.1,
            what="the sensor to count the write",
        )
        first = client.commit("demo", "main", "first").commit

    # The kv-gateway dies: health follows, calls are refused with the reason.
    procs.children["kv-gateway"].kill()
    procs.children["kv-gateway"].wait()
    wait_all(procs, DEPENDENTS, NOT_SERVING)
    assert_waits_for(procs, "kv-gateway")

    # It comes back: SERVING again, and the data is there.
    procs.start("kv-gateway")
    wait_all(procs, DEPENDENTS, SERVING)
    with Client(procs.target("branch-manager"), procs.target("committer")) as client:
        assert (
            client.stat_object("demo", "main", "t/a.parquet").physical_address
            == "s3://bucket/a.parquet"
        )
        client.put_object(
            "demo",
            "main",
            path="t/b.parquet",
            physical_address="s3://bucket/b.parquet",
            size_bytes=20,
        )
        second = client.commit("demo", "main", "second").commit
        assert list(second.parents) == [first.id]

    # Gone again: SIGTERM still ends both within their grace period.
    procs.children["kv-gateway"].kill()
    procs.children["kv-gateway"].wait()
    wait_all(procs, DEPENDENTS, NOT_SERVING)
    for name in DEPENDENTS:
        child = procs.children[name]
        started = time.monotonic()
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=GRACE + 10)
        elapsed = time.monotonic() - started
        assert child.returncode == 0, procs.log(name)
        print(f"{name} stopped in {elapsed:.2f}s without its kv-gateway (grace {GRACE}s)")
        assert elapsed < GRACE, f"{name} took {elapsed:.2f}s to stop"
        if name != "compactor-sensor":  # its per-branch warnings carry tracebacks
            assert "Traceback" not in procs.log(name)


def test_setup_run_right_after_starting_the_services_waits_for_them(procs, tmp_path):
    """docs/tls.md's order: `quarry serve ... &` lines, then `quarry setup` at once. Setup
    waits for the branch-manager still starting instead of failing SERVICE_UNREACHABLE."""
    env = {
        k: v
        for k, v in procs.env.items()
        if k not in ("QUARRY_ACCESS_KEY_ID", "QUARRY_SECRET_ACCESS_KEY")
    }
    setup = subprocess.Popen(
        [str(VENV_BIN / "quarry"), "setup"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Nothing listens yet: a setup that did not wait would have exited by now.
        with contextlib.suppress(subprocess.TimeoutExpired):
            setup.wait(timeout=1.5)
        assert setup.poll() is None, setup.communicate()
        for name in SERVICES:
            procs.start(name)
        out, err = setup.communicate(timeout=60)
    finally:
        if setup.poll() is None:
            setup.kill()
    assert setup.returncode == 0, (out, err)
    assert "Created admin user admin" in out
    assert (procs.home / "credentials.json").is_file()


def test_setup_waits_only_for_a_branch_manager_that_is_starting(tmp_path):
    """Nothing listening: setup waits within --timeout, then answers as every command does
    (SERVICE_UNREACHABLE, "Is Quarry running?"). A name that does not resolve is not waited
    out at all (it waited 30 s and lost the DNS error)."""
    env = quarry_env(tmp_path / "home")
    for name in ("QUARRY_ACCESS_KEY_ID", "QUARRY_SECRET_ACCESS_KEY"):
        env.pop(name, None)
    # A port held bound and not listening: connections are refused, and no other process
    # can take it while the test runs.
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    closed_port = held.getsockname()[1]
    refused = subprocess.run(
        [
            str(VENV_BIN / "quarry"),
            "setup",
            "--timeout",
            "2",
            "--branch-manager",
            f"127.0.0.1:{closed_port}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    held.close()
    assert refused.returncode == 1, refused
    assert "waiting for the branch-manager" in refused.stderr
    assert "SERVICE_UNREACHABLE" in refused.stderr, refused.stderr
    started = time.monotonic()
    unknown = subprocess.run(
        [str(VENV_BIN / "quarry"), "setup", "--branch-manager", "no-such-host.invalid:7402"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unknown.returncode == 1, unknown
    assert "waiting for" not in unknown.stderr, unknown.stderr
    assert time.monotonic() - started < 25  # a hang bound: it waited the whole 30 s
    assert "no-such-host.invalid" in unknown.stderr


def test_a_service_stops_within_its_grace_period_while_its_dependency_hangs(procs, tmp_path):
    """The kv-gateway is frozen (SIGSTOP: connections open, nothing answers — a network
    partition), a write is in flight and the dropper is polling: SIGTERM still ends
    branch-manager about when its grace period ends, not when a KV deadline would."""
    procs.env["QUARRY_COMPACTOR_ENABLED"] = "false"
    procs.env["QUARRY_SHUTDOWN_GRACE_SECONDS"] = str(FROZEN_GRACE)  # waited out below
    procs.start("kv-gateway")
    procs.start("range-writer")
    branch_manager = procs.start("branch-manager")
    wait_all(procs, ["branch-manager"], SERVING)
    target = procs.target("branch-manager")
    setup_admin_over_grpc(target)  # the test admin (support.auth)
    with Client(target, procs.target("committer")) as client:
        client.create_repository("demo", str(tmp_path / "lake" / "demo"))
    gateway = procs.children["kv-gateway"]
    gateway.send_signal(signal.SIGSTOP)
    outcome: list = []

    def write() -> None:  # blocks in branch-manager on the frozen gateway
        with grpc.insecure_channel(target) as channel:
            try:
                branch_manager_pb2_grpc.BranchManagerStub(channel).PutObject(
                    branch_manager_pb2.PutObjectRequest(
                        repository="demo",
                        branch="main",
                        entry={"path": "x", "physical_address": "s3://b/x", "size_bytes": 1},
                    ),
                    timeout=60,
                )
                outcome.append("ok")
            except grpc.RpcError as error:
                outcome.append(error.code())

    writer = threading.Thread(target=write)
    writer.start()
    wait_health(target, NOT_SERVING, child=branch_manager)  # the probe times out
    started = time.monotonic()
    branch_manager.send_signal(signal.SIGTERM)
    branch_manager.wait(timeout=FROZEN_GRACE + 20)
    elapsed = time.monotonic() - started
    writer.join(10)
    print(
        f"branch-manager stopped in {elapsed:.2f}s with a frozen kv-gateway (grace {FROZEN_GRACE}s)"
    )
    assert branch_manager.returncode == 0, procs.log("branch-manager")
    # Drains for the grace period, then cancels what still waits on the frozen gateway. The
    # KV call's own deadline is 30 s: a bound well below it proves the stop did not wait for
    # it, with room for a loaded machine (GRACE + 1.5 s failed at a load average of 30).
    assert elapsed < FROZEN_GRACE + 8, f"branch-manager took {elapsed:.2f}s to stop"
    assert outcome and outcome[0] != "ok"


def test_a_dependent_service_still_refuses_another_format_version(procs):
    """branch-manager starts before the kv-gateway; the gateway that then appears (another
    build) serves a store of another format version: branch-manager exits non-zero with the
    export/import message instead of waiting forever."""
    from quarry.kv.memory import MemoryStore
    from quarry.runtime.server import create_server
    from quarry.services.kv_gateway.service import build
    from support.servers import settings_for_tests

    branch_manager = procs.start("branch-manager")
    wait_health(procs.target("branch-manager"), NOT_SERVING, child=branch_manager)
    backend = MemoryStore()
    backend.set(b"quarry", b"format-version", b"2")  # an older store: the rebuild path
    other_build = build(settings_for_tests(), backend=backend)
    other_build.on_ready.clear()  # a gateway of another build: it serves that store
    gateway, _ = create_server(
        settings_for_tests(), other_build, port=procs.ports["kv-gateway"], host="127.0.0.1"
    )
    try:
        branch_manager.wait(timeout=30)
    finally:
        gateway.stop(grace=0)
    log = procs.log("branch-manager")
    assert branch_manager.returncode not in (0, None), log
    assert "quarry store export" in log and "quarry store import" in log
    assert "Traceback" not in log


def _stop_times(stderr: str) -> tuple[dict[str, datetime], dict[str, datetime]]:
    """When each service began draining and when it had stopped, from its own log lines."""
    pattern = re.compile(
        r"^(\S+ \S+) \S+ INFO quarry\.runtime\.server: (\S+)(: signal \d+, "
        r"draining| stopped)",
        re.M,
    )
    began, ended = {}, {}
    for stamp, name, what in pattern.findall(stderr):
        when = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
        (ended if what == " stopped" else began).setdefault(name, when)
    return began, ended


def test_up_stops_dependents_first_and_promptly_on_ctrl_c(tmp_path):
    ports = {name: free_port() for name in SERVICE_MODULES}
    env = quarry_env(
        tmp_path / "home",
        QUARRY_SHUTDOWN_GRACE_SECONDS=str(GRACE),
        **service_ports(ports),
    )
    # A session of its own, so Ctrl-C can be sent the way a terminal sends it: to the whole
    # foreground process group.
    up = subprocess.Popen(
        [str(VENV_BIN / "quarry"), "up"],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        seen = []
        while not any("Press Ctrl-C" in line for line in seen):
            line = up.stdout.readline()
            assert line, "".join(seen)
            seen.append(line)
        # The test admin (support.auth); refused harmlessly if `quarry up` made one.
        setup_admin_over_grpc(f"127.0.0.1:{ports['branch-manager']}")
        with Client(
            f"127.0.0.1:{ports['branch-manager']}",
            f"127.0.0.1:{ports['committer']}",
            retry=RetryPolicy(budget=20),
        ) as client:
            client.create_repository("demo", str(tmp_path / "lake" / "demo"))
            client.put_object("demo", "main", path="a", physical_address="s3://b/a", size_bytes=1)
            client.commit("demo", "main", "one")
        started = time.monotonic()
        os.killpg(up.pid, signal.SIGINT)
        out, err = up.communicate(timeout=60)
        elapsed = time.monotonic() - started
    finally:
        if up.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(up.pid, signal.SIGKILL)
            up.wait()
    assert up.returncode == 0, err
    assert "did not stop in time" not in err
    reported = re.findall(r"^  (\S+) stopped \(exit (-?\d+)\)$", out, re.M)
    assert reported == [(name, "0") for name in reversed(start_order())], out
    # Observed by the services themselves: each dependency began draining only after
    # everything that depends on it had stopped.
    began, ended = _stop_times(err)
    assert set(began) == set(ended) == set(SERVICE_MODULES), err
    import importlib

    for name, module in SERVICE_MODULES.items():
        for dependency in importlib.import_module(module).DEPENDS_ON:
            assert ended[name] <= began[dependency], (name, dependency, err)
    print(f"quarry up stopped in {elapsed:.2f}s; stop order {[n for n, _ in reported]}")
    # Promptly: no service waited out its grace period (each drained its idle server and
    # stopped), as its own log says. Not a wall-clock bound on the whole stop: on a loaded
    # machine six process exits in a row take what they take (the communicate timeout above
    # is the hang bound).
    for name in SERVICE_MODULES:
        drained = (ended[name] - began[name]).total_seconds()
        assert drained < GRACE, f"{name} took {drained:.2f}s of its {GRACE}s grace to stop"
