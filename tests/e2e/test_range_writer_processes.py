"""A real `quarry serve range-writer` with QUARRY_RANGE_WRITER_PROCESSES: it starts its span
worker processes, a large apply sent to it gives the metarange of one apply (and its metrics
count the workers' files), its workers end with it, whether it stops cleanly (SIGTERM) or is
killed (SIGKILL), and a worker that stops answering holds an apply no longer than
QUARRY_RANGE_WRITER_SPAN_TIMEOUT_SECONDS."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from quarry.blob import LocalBlobStore
from quarry.committed import CommittedManager
from quarry.committed.remote import RemoteRangeWriter
from quarry.config import SERVICES
from quarry.graveler.model import Entry
from support.processes import (
    free_port,
    quarry_env,
    quarry_serve,
    wait_gone,
    wait_serving,
)


def workers_of(pid: int) -> list[int]:
    """The span worker processes whose parent is `pid` (not its resource tracker)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z" and b"spawn_main" in cmdline:
            found.append(int(stat.parent.name))
    return sorted(found)


def wait_started(pid: int, timeout: float = 120.0) -> None:
    """Until worker `pid` has started: asleep (waiting for work) with no CPU used over half a
    second. A fresh worker spends its first seconds importing (longer on a busy machine);
    a span it got meanwhile could outlast a short span timeout and have it replaced too."""
    deadline = time.monotonic() + timeout

    def state_and_cpu() -> tuple[str, int]:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        return fields[0], int(fields[11]) + int(fields[12])

    previous = state_and_cpu()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        current = state_and_cpu()
        if current[0] == "S" and current == previous:
            return
        previous = current
    raise AssertionError(f"worker {pid} did not settle in {timeout} s")


def entry(path: str, version: int = 0) -> Entry:
    return Entry(path, f"/data/{path}@{version}", len(path) + version, f"{version:032x}")


@dataclass
class Reference:
    """A large base metarange (120,000 entries: enough ranges for spans of
    MIN_RANGES_PER_SPAN) and what one apply by one manager gives for each version of changes.
    Written once per module: the tests copy the base's namespace (ids do not depend on it)."""

    namespace: Path
    base: str
    applies: dict[int, tuple[list, object]]

    def lake(self, tmp_path: Path) -> str:
        """A copy of the base's namespace for one test's range-writer to write into."""
        copy = tmp_path / "lake"
        shutil.copytree(self.namespace, copy)
        return str(copy)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Reference:
    root = tmp_path_factory.mktemp("reference")
    entries = [entry(f"d{i // 1000:03d}/f{i:06d}") for i in range(120_000)]
    manager = CommittedManager(LocalBlobStore, None)
    base = manager.write_metarange(str(root / "lake"), entries).metarange_id
    applies = {}
    for version in (1, 2):
        # Changes to every 40th entry, and their result applied in one apply.
        changes = [(e.path, entry(e.path, version)) for e in entries[::40]]
        other = str(root / f"other{version}")
        other_base = manager.write_metarange(other, entries).metarange_id
        applies[version] = (changes, manager.apply_changes(other, other_base, changes))
    return Reference(root / "lake", base, applies)


def range_files(namespace: str) -> set[str]:
    return set(os.listdir(os.path.join(namespace, "_quarry", "ranges")))


def written_range_files_metric(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
    found = re.search(
        rb'^quarry_range_writer_range_files_total\{result="written"\} (\S+)$', text, re.M
    )
    assert found, "the range-writer exports no quarry_range_writer_range_files_total"
    return float(found.group(1))


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL])
def test_range_writer_worker_processes(tmp_path, stop, reference):
    port = free_port()
    # The range-writer listens for metrics on QUARRY_METRICS_BASE_PORT + its service index.
    metrics_port = free_port()
    env = quarry_env(
        tmp_path / "home",
        QUARRY_AUTH_ENABLED="false",
        QUARRY_METRICS_BASE_PORT=str(metrics_port - SERVICES.index("range-writer")),
        QUARRY_RANGE_WRITER_PORT=str(port),
        QUARRY_RANGE_WRITER_PROCESSES="2",
        QUARRY_RANGE_WRITER_FAN_OUT_MIN_CHANGES="100",
    )
    namespace, base = reference.lake(tmp_path), reference.base
    changes, expected = reference.applies[1]
    with quarry_serve("range-writer", env) as server:
        wait_serving(f"127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        while len(workers_of(server.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = workers_of(server.pid)
        assert len(workers) == 2, "the range-writer did not start its 2 worker processes"
        before = range_files(namespace)
        with RemoteRangeWriter(f"127.0.0.1:{port}", timeout=120) as remote:
            result = remote.apply_changes(namespace, base, changes)
        assert result.metarange_id == expected.metarange_id
        assert result.summary == expected.summary
        # Its metrics count every range file the apply wrote, the workers' included.
        new_files = len(range_files(namespace) - before)
        assert new_files == result.ranges_written > 0
        assert written_range_files_metric(metrics_port) == new_files
        assert workers_of(server.pid) == workers  # the workers served it, none was lost
        os.kill(server.pid, stop)
        server.wait(30)
        assert wait_gone(workers) == [], f"workers outlived a range-writer stopped by {stop!r}"


# The span timeout of the stopped-worker test. It must outlast a fresh worker's first span,
# which the test needs answered: that span is cold (the worker reads every base range of it
# for the first time, and pyarrow imports pandas on its first array), and on a loaded
# machine it took 15 s (3 s expired: the fresh worker was replaced too), and over 30 s at a
# load average of 16. The test waits it out once, asleep, for the stopped worker.
STOPPED_WORKER_SPAN_TIMEOUT = 60


def test_a_stopped_worker_does_not_hold_a_commit(tmp_path, reference):
    """A worker that stops answering (SIGSTOP) costs a large apply only the span timeout: the
    range-writer applies that span itself, kills its worker and starts a fresh one, which
    takes the next apply's span. (One worker: a stopped worker holds no span while another
    worker of the pool can take it.)"""
    port = free_port()
    env = quarry_env(
        tmp_path / "home",
        QUARRY_AUTH_ENABLED="false",
        QUARRY_RANGE_WRITER_PORT=str(port),
        QUARRY_RANGE_WRITER_PROCESSES="1",
        QUARRY_RANGE_WRITER_FAN_OUT_MIN_CHANGES="100",
        QUARRY_RANGE_WRITER_SPAN_TIMEOUT_SECONDS=str(STOPPED_WORKER_SPAN_TIMEOUT),
    )
    namespace, base = reference.lake(tmp_path), reference.base
    stopped: list[int] = []
    with quarry_serve("range-writer", env) as server:
        wait_serving(f"127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        while not workers_of(server.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = workers_of(server.pid)
        assert len(workers) == 1
        try:
            os.kill(workers[0], signal.SIGSTOP)
            stopped.append(workers[0])
            with RemoteRangeWriter(
                f"127.0.0.1:{port}", timeout=STOPPED_WORKER_SPAN_TIMEOUT + 120
            ) as remote:
                for version in (1, 2):
                    changes, expected = reference.applies[version]
                    started = time.monotonic()
                    result = remote.apply_changes(namespace, base, changes)
                    assert result.metarange_id == expected.metarange_id
                    # About the span timeout, not a wait that only ends with the worker.
                    assert time.monotonic() - started < STOPPED_WORKER_SPAN_TIMEOUT + 60
                    if version == 1:
                        # The stopped worker was killed and a fresh one started.
                        assert wait_gone(workers) == [], "the stopped worker was left behind"
                        deadline = time.monotonic() + 60
                        while not workers_of(server.pid) and time.monotonic() < deadline:
                            time.sleep(0.1)
                        fresh = workers_of(server.pid)
                        assert len(fresh) == 1 and fresh != workers
                        wait_started(fresh[0])
            # The fresh worker served the second apply: it was not replaced again.
            assert workers_of(server.pid) == fresh
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_a_stopped_peer_range_writer_does_not_hold_a_commit(tmp_path, reference):
    """Two real range-writers, A with B as its peer (QUARRY_RANGE_WRITER_PEERS). B takes a
    span of a first large apply, then is stopped (SIGSTOP: a frozen or partitioned pod, the
    connection still open). A second large apply through A still returns the metarange of
    one apply, in about QUARRY_RANGE_WRITER_SPAN_TIMEOUT_SECONDS."""
    a_port, b_port = free_port(), free_port()
    common = {
        "QUARRY_AUTH_ENABLED": "false",
        "QUARRY_RANGE_WRITER_FAN_OUT_MIN_CHANGES": "100",
        "QUARRY_RANGE_WRITER_SPAN_TIMEOUT_SECONDS": "3",
    }
    env_b = quarry_env(tmp_path / "b", QUARRY_RANGE_WRITER_PORT=str(b_port), **common)
    env_a = quarry_env(
        tmp_path / "a",
        QUARRY_RANGE_WRITER_PORT=str(a_port),
        QUARRY_RANGE_WRITER_PEERS=f"127.0.0.1:{b_port}",
        **common,
    )
    namespace, base = reference.lake(tmp_path), reference.base
    with quarry_serve("range-writer", env_b) as peer, quarry_serve("range-writer", env_a):
        wait_serving(f"127.0.0.1:{b_port}")
        wait_serving(f"127.0.0.1:{a_port}")
        try:
            with RemoteRangeWriter(f"127.0.0.1:{a_port}", timeout=120) as remote:
                for version in (1, 2):
                    if version == 2:
                        os.kill(peer.pid, signal.SIGSTOP)
                    changes, expected = reference.applies[version]
                    started = time.monotonic()
                    result = remote.apply_changes(namespace, base, changes)
                    assert time.monotonic() - started < 60
                    assert result.metarange_id == expected.metarange_id
                    assert result.summary == expected.summary
        finally:
            os.kill(peer.pid, signal.SIGCONT)
