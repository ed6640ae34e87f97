"""Stopping `quarry up` never orphans a service (issue 23, item 9): real `quarry up`
processes stopped the ways they are stopped in practice — a process-group SIGTERM under
`make run` (make forwards it: a second SIGTERM), a double Ctrl-C, a Ctrl-C repeated while a
service will not stop, and `quarry up` killed outright. Each must leave no service process
running — nor a worker process of branch-manager, which `quarry up` runs with one worker per
core (quarry.runtime.workers) — and no service port listened on."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from quarry.cli.main import SERVICE_MODULES, start_order
from quarry.cli.services import REPEATED_SIGNAL_SECONDS
from quarry.config import usable_cores
from support.processes import (
    VENV_BIN,
    children_of,
    free_port,
    port_listened,
    process_running,
    quarry_env,
    service_ports,
    wait_gone,
)
from support.wait import wait_until

# QUARRY_SHUTDOWN_GRACE_SECONDS unless a test says otherwise. No test waits it out: long
# enough that a service draining slowly on a loaded machine is not killed at its end.
GRACE = 10.0


class Up:
    """One `quarry up` (possibly under a parent such as make) in a session of its own, its
    output in a file; its service processes and ports."""

    def __init__(self, tmp_path: Path, grace: float = GRACE):
        self.ports = {name: free_port() for name in SERVICE_MODULES}
        self.env = quarry_env(
            tmp_path / "home",
            QUARRY_SHUTDOWN_GRACE_SECONDS=str(grace),
            **service_ports(self.ports),
        )
        self.out = tmp_path / "up.out"
        self.err = tmp_path / "up.err"
        self.leader: subprocess.Popen | None = None  # the process group's leader
        self.up_pid = 0
        self.services: dict[str, int] = {}  # service → pid
        self.workers: list[int] = []  # the services' own children: branch-manager's workers

    def start(self, argv: list[str]) -> None:
        """Run `argv` (which runs `quarry up`) as a new session's leader, as a terminal or a
        supervisor does; wait until every service serves."""
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.leader = subprocess.Popen(
                argv, env=self.env, stdout=out, stderr=err, start_new_session=True
            )
        wait_until(
            lambda: "Press Ctrl-C" in self.out.read_text() or self.leader.poll() is not None,
            timeout=120,  # a hang bound: a loaded machine (a load average of 15) took over 60 s
            what="quarry up to be ready",
        )
        assert "Press Ctrl-C" in self.out.read_text(), self.output()
        self.up_pid = self._find_up(self.leader.pid)
        by_pid = {pid: _service_of(pid) for pid in children_of(self.up_pid)}
        self.services = {name: pid for pid, name in by_pid.items() if name}
        assert set(self.services) == set(SERVICE_MODULES), by_pid
        self.workers = [w for pid in self.services.values() for w in children_of(pid)]
        # branch-manager: a worker per core by default (one process, no supervisor, on one).
        cores = usable_cores()
        branch_manager_workers = children_of(self.services["branch-manager"])
        assert len(branch_manager_workers) == (cores if cores > 1 else 0), self.output()
        assert all(port_listened(p) for p in self.ports.values()), self.output()

    def _find_up(self, pid: int) -> int:
        """`quarry up`'s pid: `pid` itself or a descendant (make may run it through sh)."""
        queue = [pid]
        while queue:
            candidate = queue.pop(0)
            if "up" in _argv(candidate)[-1:] and "quarry" in " ".join(_argv(candidate)):
                return candidate
            queue.extend(children_of(candidate))
        raise AssertionError(f"no quarry up under {pid}: {self.output()}")

    def signal_group(self, signum: int) -> None:
        assert self.leader is not None
        os.killpg(self.leader.pid, signum)

    def wait_stopping(self) -> None:
        wait_until(
            lambda: "stopping..." in self.out.read_text(), timeout=10, what="the stop to begin"
        )

    def output(self) -> str:
        return f"stdout:\n{self.out.read_text()}\nstderr:\n{self.err.read_text()}"

    def wait_up_gone(self, timeout: float) -> None:
        assert self.leader is not None
        self.leader.wait(timeout=timeout)
        assert wait_gone([self.up_pid], timeout=timeout) == [], self.output()

    def assert_nothing_left(self) -> None:
        """No service process, no service port listened on (what the orphans did)."""
        left = wait_gone([*self.services.values(), *self.workers], timeout=GRACE + 10)
        orphans = {name: pid for name, pid in self.services.items() if pid in left}
        assert not orphans, f"services still running: {orphans}\n{self.output()}"
        workers = [pid for pid in self.workers if pid in left]
        assert not workers, f"worker processes still running: {workers}\n{self.output()}"
        listened = {name: p for name, p in self.ports.items() if port_listened(p)}
        assert not listened, f"ports still listened on: {listened}\n{self.output()}"

    def close(self) -> None:
        """Whatever the test did: kill everything it started (orphans included)."""
        for pid in [self.up_pid, *self.services.values(), *self.workers]:
            if pid and process_running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
        if self.leader is not None and self.leader.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.leader.pid, signal.SIGKILL)
            self.leader.wait()


def reported_stopped(out: str) -> list[str]:
    """The services `quarry up` reported stopped, in order. (Their exit codes vary: on a
    loaded machine the repeated signal may come late enough to hurry the stop.)"""
    return re.findall(r"^  (\S+) stopped \(exit -?\d+\)$", out, re.M)


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []


def _service_of(pid: int) -> str:
    """The service a `quarry serve NAME` process runs ("" for anything else)."""
    argv = _argv(pid)
    return argv[-1] if "serve" in argv[-2:-1] else ""


@pytest.fixture
def up(tmp_path):
    running = Up(tmp_path)
    try:
        yield running
    finally:
        running.close()


def test_sigterm_to_make_runs_process_group_stops_every_service(up, tmp_path):
    # `make run` as a supervisor, a closed terminal or CI stops it: SIGTERM to the whole
    # process group. make also forwards SIGTERM to its child: `quarry up` gets two.
    makefile = tmp_path / "Makefile"
    makefile.write_text(f"run:\n\t{VENV_BIN / 'quarry'} up\n")
    up.start(["make", "--no-print-directory", "-f", str(makefile), "run"])
    up.signal_group(signal.SIGTERM)
    # The second SIGTERM while the stop runs (one arriving at once may merge with the
    # first in Python's signal handling, hiding the bug this guards against).
    up.wait_stopping()
    up.signal_group(signal.SIGTERM)
    up.wait_up_gone(timeout=60)
    up.assert_nothing_left()
    out = up.out.read_text()
    # The orderly stop ran to its end: every service reported, dependents first.
    assert reported_stopped(out) == [*reversed(start_order())], up.output()
    assert "stopped." in out, up.output()


def test_double_ctrl_c_stops_every_service_in_order(up):
    # A terminal sends Ctrl-C to the foreground process group; pressed again at once, while
    # the stop runs (within REPEATED_SIGNAL_SECONDS: the same request, the stop stays orderly).
    up.start([str(VENV_BIN / "quarry"), "up"])
    up.signal_group(signal.SIGINT)
    up.wait_stopping()
    up.signal_group(signal.SIGINT)
    up.wait_up_gone(timeout=60)
    up.assert_nothing_left()
    out = up.out.read_text()
    assert reported_stopped(out) == [*reversed(start_order())], up.output()


def test_a_repeated_ctrl_c_hurries_a_stuck_stop_and_leaves_nothing(tmp_path):
    # A long grace, and the first service stopped (the compactor-sensor) frozen: an orderly
    # stop would wait grace + 5 s for it. A Ctrl-C repeated after REPEATED_SIGNAL_SECONDS
    # stops every service at once and kills what has not stopped within a short grace.
    up = Up(tmp_path, grace=60.0)
    try:
        up.start([str(VENV_BIN / "quarry"), "up"])
        stuck = start_order()[-1]
        os.kill(up.services[stuck], signal.SIGSTOP)
        first = time.monotonic()
        up.signal_group(signal.SIGINT)
        up.wait_stopping()
        wait_until(
            lambda: time.monotonic() - first > REPEATED_SIGNAL_SECONDS + 0.1,
            what="a Ctrl-C later than a repeated delivery",
        )
        up.signal_group(signal.SIGINT)
        # Well below the 65 s the frozen service would hold an unhurried stop.
        up.wait_up_gone(timeout=30)
        up.assert_nothing_left()
        err = up.err.read_text()
        assert "hurrying" in err, up.output()
        assert f"{stuck} did not stop in time; killing it" in err, up.output()
    finally:
        up.close()


def test_services_stop_when_quarry_up_is_killed_outright(up):
    # SIGKILL (or the OOM killer): nothing in `quarry up` runs; its lifeline closes.
    up.start([str(VENV_BIN / "quarry"), "up"])
    os.kill(up.up_pid, signal.SIGKILL)
    up.wait_up_gone(timeout=10)
    up.assert_nothing_left()
