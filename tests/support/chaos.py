"""Fault injection over real processes: the suite as `quarry serve SERVICE` children on fixed
free ports (so a restarted service is found where it was), SIGKILL and restart, and a
history of every call (invocation and completion) for a checker (support/history_check.py).

Services are (re)started in dependency order — kv-gateway, range-writer, committer,
compactor-sensor, branch-manager — and only one is down at a time: today branch-manager
and committer exit at once when the kv-gateway is not up (issue 10 item 6), so a service is
only restarted while its dependencies serve.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from support.auth import setup_admin_over_grpc
from support.processes import READY_TIMEOUT, VENV_BIN, free_port, quarry_env, wait_serving

START_ORDER = ("kv-gateway", "range-writer", "committer", "compactor-sensor", "branch-manager")

# Client channels reconnect quickly after a restart (the default backoff grows to minutes).
FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]


class ServiceProcess:
    """One `quarry serve NAME` child; its output goes to a log file (a pipe nobody reads
    would fill up and block it)."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path):
        self.name = name
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.target = env[f"QUARRY_{name.upper().replace('-', '_')}_ADDRESS"]
        self.child: subprocess.Popen | None = None
        self.starts = 0
        self.kills = 0
        self.unexpected_exits: list[int] = []

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        with open(self.log_path, "a") as log:
            log.write(f"\n==== start {self.starts + 1} at {time.time():.3f}\n")
            log.flush()
            self.child = subprocess.Popen(
                [str(VENV_BIN / "quarry"), "serve", self.name],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.starts += 1
        try:
            wait_serving(self.target, timeout=timeout)
        except TimeoutError:
            raise TimeoutError(
                f"{self.name} did not serve within {timeout}s after start "
                f"{self.starts}; exit code {self.child.poll()}; see "
                f"{self.log_path}"
            ) from None

    def alive(self) -> bool:
        return self.child is not None and self.child.poll() is None

    def sigkill(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGKILL)
            self.child.wait()
            self.kills += 1

    def stop(self) -> None:
        if self.child is None or self.child.poll() is not None:
            return
        self.child.terminate()
        try:
            self.child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()


class Cluster:
    """The five services as processes over one SQLite KV file and a local namespace."""

    def __init__(self, home: Path, **extra_env: str):
        self.home = home
        ports = {name: free_port() for name in START_ORDER}
        env_vars = {"QUARRY_KV_URL": f"sqlite:///{home / 'kv.db'}", "QUARRY_LOG_LEVEL": "WARNING"}
        for name, port in ports.items():
            key = name.upper().replace("-", "_")
            env_vars[f"QUARRY_{key}_PORT"] = str(port)
            env_vars[f"QUARRY_{key}_ADDRESS"] = f"127.0.0.1:{port}"
        env_vars.update(extra_env)
        env = quarry_env(home, **env_vars)
        log_dir = home / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.services = {name: ServiceProcess(name, env, log_dir) for name in START_ORDER}

    def target(self, name: str) -> str:
        return self.services[name].target

    def start(self) -> None:
        for name in START_ORDER:
            self.services[name].start()
        # Auth is on: the test admin (support.auth) on this cluster's own store.
        setup_admin_over_grpc(self.target("branch-manager"))

    def stop(self) -> None:
        for name in reversed(START_ORDER):
            self.services[name].stop()

    def restart_dead(self) -> list[str]:
        """Restart (in dependency order) any service that died on its own; their names."""
        dead = [name for name in START_ORDER if not self.services[name].alive()]
        for name in dead:
            self.services[name].unexpected_exits.append(self.services[name].child.returncode)
            self.services[name].start()
        return dead

    def kill_and_restart(self, name: str, down_seconds: float) -> None:
        service = self.services[name]
        service.sigkill()
        time.sleep(down_seconds)
        service.start()

    def log_tail(self, name: str, lines: int = 30) -> str:
        text = self.services[name].log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


# ------------------------------------------------------------------------------- history

UNKNOWN_OUTCOME = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN", "INTERNAL"}


@dataclass
class Op:
    """One invocation: what was asked, when, and how it completed ("ok", a status code
    name, or "pending" until it does)."""

    id: int
    actor: str
    kind: str
    branch: str
    args: dict[str, Any]
    t_invoke: float
    t_complete: float = float("inf")
    outcome: str = "pending"
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def unknown(self) -> bool:
        """Failed in a way that says nothing about whether it applied."""
        return self.outcome in UNKNOWN_OUTCOME or self.outcome == "pending"


class History:
    """Thread-safe log of every call; also appended to a JSON-lines file as it happens."""

    def __init__(self, path: Path):
        self._lock = threading.Lock()
        self._next = 0
        self.ops: list[Op] = []
        # Open for the History's life (appended as calls happen), closed by close().
        self._file = open(path, "w")  # noqa: SIM115

    def invoke(self, actor: str, kind: str, branch: str, **args: Any) -> Op:
        with self._lock:
            op = Op(self._next, actor, kind, branch, args, time.monotonic())
            self._next += 1
            self.ops.append(op)
            self._file.write(
                json.dumps(
                    {
                        "event": "invoke",
                        "id": op.id,
                        "actor": actor,
                        "kind": kind,
                        "branch": branch,
                        "t": op.t_invoke,
                        "args": args,
                    },
                    default=str,
                )
                + "\n"
            )
        return op

    def complete(self, op: Op, outcome: str, **result: Any) -> None:
        with self._lock:
            op.t_complete = time.monotonic()
            op.outcome = outcome
            op.result = result
            self._file.write(
                json.dumps(
                    {
                        "event": "complete",
                        "id": op.id,
                        "t": op.t_complete,
                        "outcome": outcome,
                        "result": result,
                    },
                    default=str,
                )
                + "\n"
            )

    def close(self) -> None:
        self._file.close()

    def dump(self) -> list[dict]:
        return [asdict(op) for op in self.ops]


def run_logged(
    history: History,
    actor: str,
    kind: str,
    branch: str,
    rpc: Callable[[], Any],
    summarize: Callable[[Any], dict] = lambda _: {},
    **args: Any,
) -> tuple[Op, Any]:
    """Invoke `rpc()`, logging invocation and completion; (op, response or None)."""
    op = history.invoke(actor, kind, branch, **args)
    try:
        response = rpc()
    except grpc.RpcError as exc:
        code = exc.code().name if hasattr(exc, "code") and exc.code() else "UNKNOWN"
        history.complete(op, code, details=(exc.details() or "")[:300])
        return op, None
    history.complete(op, "ok", **summarize(response))
    return op, response


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))
