"""Run `quarry` commands as real processes for end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quarry.ports import free_port as free_port  # lives in quarry.ports; re-exported
from quarry.ports import free_ports as free_ports
from support.auth import AUTH_ENV
from support.wait import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent

T = TypeVar("T")


def process_running(pid: int) -> bool:
    """Whether `pid` is a live process: not gone, not a zombie (exited, not yet reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pids: list[int], timeout: float = 15) -> list[int]:
    """Wait up to `timeout` for every process of `pids` to end; those still running."""
    deadline = time.monotonic() + timeout
    while any(process_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if process_running(pid)]


def outlived(pids: list[int], timeout: float = 30) -> list[int]:
    """The processes of `pids` still running after `timeout` (wait_gone), each then killed,
    so a test that fails on them leaves no process behind."""
    left = wait_gone(pids, timeout=timeout)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


@contextlib.contextmanager
def connection_per_worker(
    workers: list[int], connect: Callable[[], T], served_by: Callable[[T], int]
) -> Iterator[dict[int, T]]:
    """{worker pid: a connection to that worker} for a service whose workers share a port
    (the kernel picks a worker per connection): new connections (`connect`) until each worker
    has one, `served_by` telling which worker answered one. Every connection made is closed
    on exit."""

    found: dict[int, T] = {}
    extra: list[T] = []
    try:

        def one_more() -> bool:
            connection = connect()
            pid = served_by(connection)
            assert pid in workers, f"answered by {pid}, not a worker of {workers}"
            (extra.append(connection) if pid in found else found.setdefault(pid, connection))
            return len(found) == len(workers)

        wait_until(one_more, timeout=30, interval=0, what="a connection to every worker")
        yield found
    finally:
        for connection in [*found.values(), *extra]:
            connection.close()  # type: ignore[attr-defined]


def check_supervisor_stop(
    process: subprocess.Popen,
    workers: list[int],
    port: int,
    stop: int,
    service: str,
    log: Callable[[], str],
) -> None:
    """Stop a supervisor of worker processes with signal `stop` and assert what must hold:
    no worker outlives it and its port is free. SIGKILL runs none of its code (each worker
    sees its lifeline close and stops); after SIGTERM it exits 0 and every worker drained
    and logged "`service` stopped" (JSON lines of `log()`, with their pid)."""
    os.kill(process.pid, stop)
    process.wait(30)
    left = outlived(workers)
    assert left == [], f"workers outlived a supervisor ({stop!r})"
    assert not port_listened(port)
    if stop == signal.SIGTERM:
        assert process.returncode == 0
        stopped = [line for line in log().splitlines() if f'"{service} stopped"' in line]
        assert {int(re.search(r'"pid": (\d+)', line)[1]) for line in stopped} >= set(workers)


def start_quarry_up(env: dict[str, str], cwd: Path) -> subprocess.Popen:
    """`quarry up` as a user starts it, from `cwd`, text output piped (read_until)."""
    return subprocess.Popen(
        [str(VENV_BIN / "quarry"), "up"],
        env=env,
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def read_until(child: subprocess.Popen, marker: str, timeout: float = 120.0) -> str:
    """A child's output (text stdout) up to the line holding `marker`; the timeout bounds a
    hang (a loaded machine starts slowly)."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        seen.append(line)
        if marker in line:
            return "".join(seen)
    raise AssertionError(f"never printed {marker!r}; got:\n{''.join(seen)}")


def run_banner_commands(banner: str, env: dict[str, str], cwd: Path) -> list[str]:
    """Run every shell command `quarry up`'s banner offers (its indented lines after "Try
    it from another terminal:", the PySpark line excepted) as a user would from another
    terminal, asserting each succeeds; the commands run."""
    commands = [
        line.strip()
        for line in banner.split("Try it from another terminal:", 1)[1].splitlines()
        if line.startswith("  ") and not line.strip().startswith("import ")
    ]
    for command in commands:
        ran = subprocess.run(
            ["bash", "-c", command], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
        )
        assert ran.returncode == 0, (command, ran.stdout, ran.stderr)
        assert "Traceback" not in ran.stderr, (command, ran.stderr)
        if "ListObjects" in command or "s3 ls" in command:
            assert "docs/README.md" in ran.stdout, (command, ran.stdout)
    return commands


def json_lines(path: Path) -> list[dict]:
    """The JSON lines a live process has written to `path` so far: the complete lines that
    hold a JSON object (a reader can catch the last line half-written, and a log can hold
    a plain-text line)."""
    if not path.exists():
        return []
    text = path.read_text()
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.startswith("{")]


def quarry_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a `quarry` child process: the developer's QUARRY_*/OTEL_* removed,
    auth on with the fixed test signing key and admin credentials (support.auth)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("QUARRY_") and not k.startswith("OTEL_")
    }
    env.update(QUARRY_HOME=str(home), QUARRY_METRICS_BASE_PORT="0", PYTHONUNBUFFERED="1")
    # `quarry up` starts the s3-gateway and the console too: never on the default port other suites share.
    env.update(QUARRY_S3_GATEWAY_PORT=str(free_port()))
    env.update(QUARRY_CONSOLE_PORT=str(free_port()))  # the console too
    env.update(AUTH_ENV)
    # Tests import and link files of their own temporary directories (see support.suite).
    env.update(QUARRY_IMPORT_LOCAL_PREFIXES=tempfile.gettempdir())
    env.update(extra)
    return env


def service_ports(ports: dict[str, int]) -> dict[str, str]:
    """QUARRY_<SERVICE>_PORT and QUARRY_<SERVICE>_ADDRESS (127.0.0.1) for each service of
    `ports`: the settings that put a suite on those ports and point its services at them."""
    return {
        f"QUARRY_{name.upper().replace('-', '_')}_{what}": value
        for name, port in ports.items()
        for what, value in (("PORT", str(port)), ("ADDRESS", f"127.0.0.1:{port}"))
    }


# How long a test waits for a process to start serving (or reach another health status):
# a bound on a hang, not a time anything should take. A service's start costs seconds of
# CPU (imports); on a loaded machine (more test workers than cores) 20 s was not enough.
READY_TIMEOUT = 90.0


def wait_serving(target: str, timeout: float = READY_TIMEOUT) -> None:
    wait_health(target, health_pb2.HealthCheckResponse.SERVING, timeout=timeout)


def health_status(target: str, service: str = "") -> int | None:
    """grpc.health.v1 status of `service` ("" = overall) at `target`; None if no answer."""
    with grpc.insecure_channel(target) as channel:
        try:
            return (
                health_pb2_grpc.HealthStub(channel)
                .Check(health_pb2.HealthCheckRequest(service=service), timeout=1)
                .status
            )
        except grpc.RpcError:
            return None


def wait_health(
    target: str,
    status: int,
    service: str = "",
    timeout: float = READY_TIMEOUT,
    child: subprocess.Popen | None = None,
) -> None:
    """Poll until `service` at `target` reports `status` (e.g. NOT_SERVING); fail early if
    `child` (the process serving it) exits meanwhile."""
    seen: list[object] = [None]
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        def reached() -> bool:
            try:
                seen[0] = stub.Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=1
                ).status
            except grpc.RpcError as error:
                seen[0] = error.code()
            if seen[0] == status:
                return True
            if child is not None and child.poll() is not None:
                raise AssertionError(
                    f"the process serving {target} exited with "
                    f"{child.returncode} (health was {seen[0]})"
                )
            return False

        name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
        try:
            wait_until(
                reached,
                timeout=timeout,
                interval=0.05,
                what=f"{target} to report {name} for {service!r}",
            )
        except AssertionError as timed_out:
            if child is not None and child.poll() is not None:
                raise
            raise TimeoutError(
                f"{target} did not report {name} for {service!r} within "
                f"{timeout}s (last: {seen[0]})"
            ) from timed_out


@contextlib.contextmanager
def quarry_serve(service: str, env: dict[str, str]) -> Iterator[subprocess.Popen]:
    """`quarry serve SERVICE` in a child process; SIGTERM and wait on exit."""
    child = subprocess.Popen(
        [str(VENV_BIN / "quarry"), "serve", service],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield child
    finally:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def port_listened(port: int) -> bool:
    """Whether some process still listens on 127.0.0.1:`port`: a new listener (with
    SO_REUSEADDR, as every server sets it; connections in TIME_WAIT do not block it) cannot
    bind it."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False
