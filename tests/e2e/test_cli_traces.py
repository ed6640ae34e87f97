"""Traces one command away (issue 25): `quarry up --traces` runs a trace receiver and the
services export to it; `quarry ... --trace` makes the command the root of its trace; the
trace is printed as a tree with durations and written to $QUARRY_HOME/traces.jsonl. All as
users run it: real processes, the real OTLP exporters."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from support.otlp import quarry_up_with_traces
from support.processes import VENV_BIN, free_port, quarry_env
from support.wait import wait_until

# tgkill's system call number on x86-64 and on arm64.
SYS_TGKILL = {"x86_64": 234, "aarch64": 131}[platform.machine()]


def _drain(child: subprocess.Popen, lines: list[str]) -> None:
    for line in child.stdout:
        lines.append(line)


def _started_traces(env: dict[str, str], *args: str) -> tuple[subprocess.Popen, list[str]]:
    """`quarry traces ARGS` once its banner is out; (the process, its output lines so far,
    drained by a thread)."""
    child = subprocess.Popen(
        [str(VENV_BIN / "quarry"), "traces", *args], env=env, text=True, stdout=subprocess.PIPE
    )
    out: list[str] = []
    threading.Thread(target=_drain, args=(child, out), daemon=True).start()
    try:
        wait_until(lambda: "Press Ctrl-C" in "".join(out), timeout=30, what="the banner")
    except BaseException:
        child.kill()
        child.wait()
        raise
    return child, out


def test_a_cli_commit_with_trace_on_is_one_trace_rooted_at_the_cli(tmp_path):
    with quarry_up_with_traces(tmp_path) as up:
        endpoint = up.endpoint
        assert f"traces: {endpoint}" in up.printed()
        quarry = up.quarry

        source = tmp_path / "data.csv"
        source.write_text("a,b\n1,2\n")
        quarry("repo", "create", "demo", str(tmp_path / "lake"))
        quarry("put", "demo", "main", "t/data.csv", "--from", str(source))
        committed = quarry(
            "commit",
            "demo",
            "main",
            "-m",
            "traced",
            "--trace",
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        )
        assert "warning" not in committed.stderr

        def cli_traces() -> list[dict]:
            return [t for t in up.traces() if any(s["service"] == "quarry-cli" for s in t["spans"])]

        wait_until(lambda: cli_traces(), timeout=30, what="the CLI's trace in traces.jsonl")
        (trace,) = cli_traces()  # ONE trace
        assert f"quarry: trace {trace['trace_id']}" in committed.stderr
        spans = trace["spans"]
        roots = [s for s in spans if not s["parent_id"]]
        assert [(r["service"], r["name"]) for r in roots] == [("quarry-cli", "quarry commit")]
        ids = {s["span_id"] for s in spans}
        assert all(s["parent_id"] in ids for s in spans if s["parent_id"]), spans
        services = {s["service"] for s in spans}
        assert {"quarry-committer", "quarry-range-writer", "quarry-kv-gateway"} <= services
        assert all(s["duration_ms"] >= 0 for s in spans)
        # Printed as a tree, the command at the top, durations on every line.
        wait_until(
            lambda: "quarry-cli: quarry commit (INTERNAL)" in up.printed(),
            timeout=10,
            what="the printed tree",
        )
        printed = up.printed().split(f"trace {trace['trace_id']}\n", 1)[1].split("\n\n", 1)[0]
        assert printed.splitlines()[0].startswith("quarry-cli: quarry commit (INTERNAL)")
        assert all(
            line.rstrip().endswith(" ms") or "[events" in line for line in printed.splitlines()
        )
        assert any(line.startswith("    quarry-committer: ") for line in printed.splitlines())


def test_a_client_asking_for_tracing_without_a_collector_is_told(tmp_path):
    """configure_tracing() without OTEL_* is not silent, and flush() is safe without it."""
    script = (
        "from quarry import telemetry\n"
        "assert telemetry.configure_tracing('my-job') is False\n"
        "assert telemetry.flush() is True\n"
    )
    env = quarry_env(tmp_path)
    ran = subprocess.run(
        [str(VENV_BIN / "python"), "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert "tracing is not configured" in ran.stderr
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in ran.stderr
    quiet = subprocess.run(
        [str(VENV_BIN / "python"), "-c", script],
        env={**env, "OTEL_TRACES_EXPORTER": "none"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_quarry_traces_prints_a_received_trace_as_a_tree(tmp_path):
    """`quarry traces` alone, fed by a traced Python client with the real OTLP exporter."""
    port = free_port()
    env = quarry_env(tmp_path)
    output = tmp_path / "t.jsonl"
    child, out = _started_traces(
        env, "--port", str(port), "--output", str(output), "--settle", "0.5"
    )
    try:
        script = (
            "from quarry import telemetry\n"
            "assert telemetry.configure_tracing('job')\n"
            "with telemetry.root_span('outer'):\n"
            "    with telemetry.tracer().start_as_current_span('inner'):\n"
            "        pass\n"
            "assert telemetry.flush()\n"
        )
        ran = subprocess.run(
            [str(VENV_BIN / "python"), "-c", script],
            env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ran.returncode == 0, ran.stderr
        wait_until(lambda: "quarry-job: inner" in "".join(out), timeout=20, what="the tree")
        text = "".join(out)
        assert "quarry-job: outer (INTERNAL)" in text
        assert "\n  quarry-job: inner (INTERNAL)" in text
        (line,) = Path(output).read_text().splitlines()
        assert [s["name"] for s in json.loads(line)["spans"]] == ["outer", "inner"]
    finally:
        child.send_signal(signal.SIGINT)
        child.wait(timeout=30)


def test_quarry_traces_on_a_taken_port_says_so_in_one_line(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ran = subprocess.run(
            [str(VENV_BIN / "quarry"), "traces", "--port", str(port)],
            env=quarry_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert ran.returncode == 1
    assert ran.stderr == (
        f"quarry traces: cannot listen on 127.0.0.1:{port} (address in use?); "
        "choose another with --port\n"
    )


def _signal_thread(pid: int, tid: int, signum: int) -> None:
    """tgkill(2): the signal to one thread of a process, as the kernel may pick any thread
    that does not block it for a signal sent to the process."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_TGKILL, pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill {pid} {tid}")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_quarry_traces_stops_whichever_of_its_threads_gets_the_signal(tmp_path, signum):
    """A Ctrl-C the kernel hands to one of gRPC's threads stops `quarry traces` as one the
    main thread gets (an untimed wait in the main thread never woke: the stop hung)."""
    child, _out = _started_traces(quarry_env(tmp_path), "--port", str(free_port()))
    try:
        others = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        others.remove(child.pid)
        assert others, "gRPC's server threads"
        _signal_thread(child.pid, max(others), signum)
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
        child.wait()
