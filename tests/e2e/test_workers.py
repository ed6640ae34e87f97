"""Multi-process serving (issue 29, item 3): a real `quarry serve branch-manager` with
QUARRY_BRANCH_MANAGER_WORKERS, next to real kv-gateway, range-writer and committer processes.

Its connections land on every worker; a write through one worker is read through another
at once (the replica tests of test_hot_branch_reads.py, across processes); its one metrics
port reports the workers' sum; stopping it — SIGTERM, or SIGKILL, when none of its code
runs — leaves no worker; one worker dying stops the service; and it never joins a port
another process listens on. A committer with QUARRY_COMMITTER_WORKERS commits through every
worker and loses nothing."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
import urllib.request
import uuid
from collections.abc import Iterator

import grpc
import pytest

from quarry.config import SERVICES
from quarry.runtime.errors import from_rpc_error
from quarry.v1 import (
    auth_pb2,
    auth_pb2_grpc,
    branch_manager_pb2_grpc,
    committer_pb2_grpc,
    server_info_pb2,
    server_info_pb2_grpc,
    types_pb2,
)
from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import committer_pb2 as cm
from support.auth import AUTH_ENV
from support.processes import (
    check_supervisor_stop,
    children_of,
    connection_per_worker,
    free_port,
    outlived,
    quarry_env,
    quarry_serve,
    service_ports,
    wait_gone,
    wait_serving,
)
from support.wait import wait_until

DEPENDENCIES = ("kv-gateway", "range-writer", "committer")
WORKERS = 2


@pytest.fixture(scope="module")
def dependencies(tmp_path_factory) -> Iterator[tuple[dict[str, str], dict[str, int]]]:
    """kv-gateway, range-writer and committer processes; (the environment a branch-manager
    needs to join them, the ports)."""
    home = tmp_path_factory.mktemp("workers") / "home"
    ports = {name: free_port() for name in (*DEPENDENCIES, "branch-manager")}
    env = quarry_env(
        home, QUARRY_AUTH_ENABLED="false", QUARRY_COMPACTOR_ENABLED="false", **service_ports(ports)
    )
    with contextlib.ExitStack() as stack:
        for name in DEPENDENCIES:
            stack.enter_context(quarry_serve(name, env))
        for name in DEPENDENCIES:
            wait_serving(f"127.0.0.1:{ports[name]}")
        yield env, ports


def accepts(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port`."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


class Supervisor:
    """One `quarry serve SERVICE` with workers: its supervisor and worker pids."""

    def __init__(self, process: subprocess.Popen, target: str, metrics_port: int) -> None:
        self.process = process
        self.target = target
        self.metrics_port = metrics_port
        wait_serving(target)
        # Serving means one worker answers: wait for all of them and for the supervisor's
        # metrics endpoint too (a loaded machine starts them seconds apart).
        wait_until(
            lambda: len(children_of(process.pid)) >= WORKERS and accepts(metrics_port),
            timeout=60,
            interval=0.1,  # each poll reads every process's /proc entry
            what="every worker and the metrics endpoint",
        )
        self.workers = sorted(children_of(process.pid))


@contextlib.contextmanager
def serving_with_workers(service: str, env: dict[str, str]) -> Iterator[Supervisor]:
    """`quarry serve SERVICE` with WORKERS workers, on a port and a metrics port of its own
    (a test's own service may run beside the module's)."""
    port, metrics_port = free_port(), free_port()
    env = dict(
        env,
        **service_ports({service: port}),
        **{f"QUARRY_{service.upper().replace('-', '_')}_WORKERS": str(WORKERS)},
        # The service's metrics port is this base + its service index.
        QUARRY_METRICS_BASE_PORT=str(metrics_port - SERVICES.index(service)),
        QUARRY_LOG_FORMAT="json",
    )
    with quarry_serve(service, env) as process:
        yield Supervisor(process, f"127.0.0.1:{port}", metrics_port)


def serving_branch_manager(env: dict[str, str]) -> contextlib.AbstractContextManager[Supervisor]:
    return serving_with_workers("branch-manager", env)


@pytest.fixture(scope="module")
def shared_branch_manager(dependencies) -> Iterator[Supervisor]:
    """One branch-manager for the tests that only call it (each in a repository of its own,
    counting metrics as differences): a start costs a supervisor and WORKERS processes."""
    with serving_branch_manager(dependencies[0]) as running:
        yield running


@pytest.fixture
def branch_manager(dependencies) -> Iterator[Supervisor]:
    """A branch-manager of the test's own, for a test that stops or kills it."""
    with serving_branch_manager(dependencies[0]) as running:
        yield running


def own_connection(target: str) -> grpc.Channel:
    """A channel with a TCP connection of its own (the kernel picks its worker per
    connection; channels otherwise share one through gRPC's global subchannel pool)."""
    return grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


def served_by(channel: grpc.Channel) -> int:
    stub = server_info_pb2_grpc.ServerInfoStub(channel)
    return stub.GetServerInfo(server_info_pb2.GetServerInfoRequest(), timeout=10).process_id


def channel_per_worker(
    target: str, workers: list[int]
) -> contextlib.AbstractContextManager[dict[int, grpc.Channel]]:
    """{worker pid: a channel connected to that worker}."""
    return connection_per_worker(workers, lambda: own_connection(target), served_by)


def entry(path: str, checksum: str) -> types_pb2.Entry:
    return types_pb2.Entry(path=path, physical_address=f"s3://b/{path}", checksum=checksum)


def test_a_branch_manager_with_workers_serves_on_every_worker(shared_branch_manager):
    branch_manager = shared_branch_manager
    assert len(branch_manager.workers) == WORKERS
    # Connections land on every worker, each answering for itself (ServerInfo.process_id).
    with channel_per_worker(branch_manager.target, branch_manager.workers) as channels:
        assert sorted(channels) == branch_manager.workers
    # The supervisor serves no gRPC itself: it is never the one that answers.
    assert branch_manager.process.pid not in branch_manager.workers


def test_a_write_through_one_worker_is_read_through_another(
    shared_branch_manager, dependencies, tmp_path
):
    branch_manager = shared_branch_manager
    _env, ports = dependencies
    with (
        channel_per_worker(branch_manager.target, branch_manager.workers) as channels,
        grpc.insecure_channel(f"127.0.0.1:{ports['committer']}") as committer_channel,
    ):
        one, other = (branch_manager_pb2_grpc.BranchManagerStub(c) for c in channels.values())
        committer = committer_pb2_grpc.CommitterStub(committer_channel)
        repo = "across-workers"
        one.CreateRepository(
            bm.CreateRepositoryRequest(name=repo, storage_namespace=str(tmp_path / "lake"))
        )
        # The repository another worker has just created is there at once.
        other.PutObject(bm.PutObjectRequest(repository=repo, branch="main", entry=entry("a", "1")))
        # A call repeated with its request_id through another worker is answered with the
        # first answer (the request log is in the KV store), not run again (BRANCH_EXISTS).
        request_id = str(uuid.uuid4())
        create = bm.CreateBranchRequest(
            repository=repo, name="dev", source_ref="main", request_id=request_id
        )
        first = one.CreateBranch(create)
        assert other.CreateBranch(create) == first
        with pytest.raises(grpc.RpcError) as reused:
            other.CreateBranch(
                bm.CreateBranchRequest(
                    repository=repo, name="dev2", source_ref="main", request_id=request_id
                )
            )
        assert from_rpc_error(reused.value).reason == "REQUEST_ID_REUSED"
        for round_ in range(20):
            writer, reader = (one, other) if round_ % 2 else (other, one)
            path, checksum = f"p/{round_:02d}", f"c{round_}"
            writer.PutObject(
                bm.PutObjectRequest(repository=repo, branch="main", entry=entry(path, checksum))
            )
            got = reader.StatObject(bm.StatObjectRequest(repository=repo, ref="main", path=path))
            assert got.entry.checksum == checksum
            if round_ % 5 == 4:
                # Committed (a clean branch: readers skip staging) and then overwritten.
                committer.Commit(cm.CommitRequest(repository=repo, branch="main", message="m"))
                writer.PutObject(
                    bm.PutObjectRequest(repository=repo, branch="main", entry=entry(path, "new"))
                )
                got = reader.StatObject(
                    bm.StatObjectRequest(repository=repo, ref="main", path=path)
                )
                assert got.entry.checksum == "new"
                reader.DeleteObject(
                    bm.DeleteObjectRequest(repository=repo, branch="main", path=path)
                )
                with pytest.raises(grpc.RpcError) as gone:
                    writer.StatObject(bm.StatObjectRequest(repository=repo, ref="main", path=path))
                assert gone.value.code() == grpc.StatusCode.NOT_FOUND


def rpc_count(metrics_text: str, method: str) -> float:
    found = re.findall(
        rf'^quarry_rpc_requests_total\{{[^}}]*method="{re.escape(method)}"[^}}]*\}} (\S+)$',
        metrics_text,
        re.M,
    )
    return sum(float(value) for value in found)


def test_the_metrics_port_reports_the_sum_of_the_workers(shared_branch_manager):
    branch_manager = shared_branch_manager
    method = "quarry.v1.ServerInfo/GetServerInfo"
    calls = {pid: 3 + i for i, pid in enumerate(branch_manager.workers)}

    def scrape() -> str:
        url = f"http://127.0.0.1:{branch_manager.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.read().decode()

    before = rpc_count(scrape(), method)
    with channel_per_worker(branch_manager.target, branch_manager.workers) as channels:
        # (Finding the channels made calls too: counted from here on.)
        before = rpc_count(scrape(), method)
        for pid, channel in channels.items():
            for _ in range(calls[pid]):
                assert served_by(channel) == pid
    text = scrape()
    assert rpc_count(text, method) - before == sum(calls.values())
    assert re.search(r'^quarry_workers\{service="branch-manager"\} 2\.0$', text, re.M), text
    # One family each, in the text format Prometheus reads (no duplicate HELP/TYPE lines).
    assert text.count("# TYPE quarry_rpc_requests_total counter") == 1


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_supervisor_leaves_no_worker(branch_manager, stop):
    port = int(branch_manager.target.rsplit(":", 1)[1])
    workers = branch_manager.workers
    assert len(workers) == WORKERS
    check_supervisor_stop(
        branch_manager.process,
        workers,
        port,
        stop,
        "branch-manager",
        branch_manager.process.stderr.read,
    )


def test_a_worker_that_dies_stops_the_service(branch_manager):
    """Never a service quietly running at part of its capacity: whatever supervises it
    (quarry up, Kubernetes) sees it end and restarts it."""
    dying, *others = branch_manager.workers
    os.kill(dying, signal.SIGKILL)
    assert branch_manager.process.wait(30) != 0
    left = outlived(others)
    assert left == []


def test_it_never_joins_a_port_another_process_listens_on(dependencies):
    """Safety rule: SO_REUSEPORT lets any socket of this user that set it share a port; the
    supervisor must refuse a port already listened on — even by a listener that set
    SO_REUSEPORT — rather than take a share of someone else's connections."""
    env, _ports = dependencies
    port = free_port()
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        env = dict(
            env,
            QUARRY_BRANCH_MANAGER_WORKERS=str(WORKERS),
            QUARRY_BRANCH_MANAGER_PORT=str(port),
            QUARRY_BRANCH_MANAGER_ADDRESS=f"127.0.0.1:{port}",
        )
        with quarry_serve("branch-manager", env) as process:
            assert process.wait(60) == 2
            assert "address in use" in process.stderr.read()
            assert children_of(process.pid) == []


def test_the_login_throttle_is_never_multiplied_by_the_workers(dependencies):
    """Safety rule: each worker throttles Auth/Login on its own, so each must admit only its
    share of QUARRY_AUTH_LOGIN_ATTEMPTS_PER_MINUTE_PER_KEY; a guesser whose connections land
    on every worker must never get more scrypts (guesses) than the setting."""
    env, ports = dependencies
    per_minute = 2  # one per worker; it refills one per minute per worker
    env = dict(
        env,
        **AUTH_ENV,
        QUARRY_AUTH_ENABLED="true",
        QUARRY_BRANCH_MANAGER_WORKERS=str(WORKERS),
        QUARRY_AUTH_LOGIN_ATTEMPTS_PER_MINUTE_PER_KEY=str(per_minute),
        QUARRY_AUTH_LOGIN_ATTEMPTS_PER_MINUTE_PER_ADDRESS="1000",
    )
    target = f"127.0.0.1:{ports['branch-manager']}"
    with quarry_serve("branch-manager", env) as process:
        wait_serving(target)
        workers = sorted(children_of(process.pid))
        attempts = dict.fromkeys(workers, 0)
        admitted = 0

        def guess() -> bool:
            nonlocal admitted
            with own_connection(target) as channel:
                attempts[served_by(channel)] += 1
                try:
                    auth_pb2_grpc.AuthStub(channel).Login(
                        auth_pb2.LoginRequest(
                            access_key_id="AKIAGUESSEDKEY000000", secret_access_key="guess"
                        ),
                        timeout=30,
                    )
                except grpc.RpcError as refused:
                    if refused.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        admitted += 1  # a scrypt ran: a wrong secret
                else:
                    raise AssertionError("a guessed secret logged in")
            return min(attempts.values()) >= 3

        wait_until(guess, timeout=60, interval=0, what="3 guesses on every worker")
    assert admitted <= per_minute, f"{admitted} guesses admitted over {attempts}"


def test_a_committer_with_workers_commits_through_every_worker_and_loses_nothing(
    shared_branch_manager, dependencies, tmp_path
):
    """QUARRY_COMMITTER_WORKERS: commits through both workers at once on one branch (each
    worker a whole committer, as replicas are) lose no staged object and keep one linear
    history; a Commit repeated with its request_id through the other worker gets the first
    answer; SIGTERM drains and stops every worker."""
    env, _ports = dependencies
    with (
        serving_with_workers("committer", env) as committer,
        channel_per_worker(committer.target, committer.workers) as channels,
        grpc.insecure_channel(shared_branch_manager.target) as bm_channel,
    ):
        branch_manager = branch_manager_pb2_grpc.BranchManagerStub(bm_channel)
        stubs = [committer_pb2_grpc.CommitterStub(c) for c in channels.values()]
        repo = "committer-workers"
        branch_manager.CreateRepository(
            bm.CreateRepositoryRequest(name=repo, storage_namespace=str(tmp_path / "lake"))
        )
        paths = [f"w{k}/{i:02d}" for k in range(len(stubs)) for i in range(10)]
        outcomes: list[str] = []

        def write_and_commit(k: int) -> None:
            for path in paths[k * 10 : (k + 1) * 10]:
                branch_manager.PutObject(
                    bm.PutObjectRequest(repository=repo, branch="main", entry=entry(path, "c"))
                )
                try:
                    stubs[k].Commit(cm.CommitRequest(repository=repo, branch="main", message=path))
                    outcomes.append("OK")
                except grpc.RpcError as exc:
                    # The other worker's commit took this object with its own.
                    assert from_rpc_error(exc).reason == "NO_CHANGES", exc
                    outcomes.append("NO_CHANGES")

        threads = [threading.Thread(target=write_and_commit, args=(k,)) for k in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(outcomes) == len(paths)
        listed = branch_manager.ListObjects(
            bm.ListObjectsRequest(repository=repo, ref="main", page_size=1000)
        )
        assert sorted(e.path for e in listed.entries) == sorted(paths)
        uncommitted = branch_manager.DiffUncommitted(
            bm.DiffUncommittedRequest(repository=repo, branch="main")
        )
        assert list(uncommitted.changes) == []  # everything staged was committed
        log = stubs[0].Log(cm.LogRequest(repository=repo, ref="main", page_size=100))
        # One commit per successful Commit, each the child of the one before, and the
        # repository's first commit.
        assert len(log.commits) == outcomes.count("OK") + 1
        for child, parent in zip(log.commits, log.commits[1:], strict=False):
            assert list(child.parents) == [parent.id]
        # Idempotency across workers: the request log is in the KV store.
        branch_manager.PutObject(
            bm.PutObjectRequest(repository=repo, branch="main", entry=entry("last", "c"))
        )
        request = cm.CommitRequest(
            repository=repo, branch="main", message="once", request_id=str(uuid.uuid4())
        )
        first = stubs[0].Commit(request)
        assert stubs[1].Commit(request).commit.id == first.commit.id
        workers = committer.workers
        committer.process.send_signal(signal.SIGTERM)
        assert committer.process.wait(30) == 0
        assert wait_gone(workers, timeout=30) == []
