"""The `quarry` command as a newcomer runs it: up, serve, version — as real processes."""

import json
import os
import signal
import stat
import subprocess
from pathlib import Path

import grpc

import quarry
from quarry.cli.main import SERVICE_MODULES
from quarry.kv.sqlite import SQLiteStore
from quarry.v1 import server_info_pb2, server_info_pb2_grpc
from support.processes import (
    VENV_BIN,
    free_port,
    quarry_env,
    quarry_serve,
    read_until,
    run_banner_commands,
    service_ports,
    start_quarry_up,
    wait_serving,
)
from support.wait import wait_until

DATABASE_FILES = ("kv.db", "kv.db-wal", "kv.db-shm")

REPO = Path(__file__).resolve().parents[2]


def test_version():
    result = subprocess.run(
        [str(VENV_BIN / "quarry"), "version"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0
    assert quarry.__version__ in result.stdout
    assert f"storage format version {quarry.FORMAT_VERSION}" in result.stdout
    # --json, as every command takes (it was a usage error here and for `settings`).
    for argv in (["version", "--json"], ["--json", "version"], ["settings", "--json"]):
        ran = subprocess.run(
            [str(VENV_BIN / "quarry"), *argv], capture_output=True, text=True, timeout=120
        )
        assert ran.returncode == 0, ran.stderr
        parsed = json.loads(ran.stdout)
        if argv[-1] == "--json" and argv[0] == "settings":
            assert any(row["variable"] == "QUARRY_HOME" for row in parsed)
        else:
            assert parsed["format_version"] == quarry.FORMAT_VERSION


def test_up_starts_the_suite_on_embedded_defaults_and_stops_on_ctrl_c(tmp_path):
    ports = {name: free_port() for name in SERVICE_MODULES}
    port = ports["kv-gateway"]
    env = quarry_env(
        tmp_path / "home",
        **service_ports(ports),
    )
    old_umask = os.umask(0o022)  # the usual umask, which made kv.db 0644 before
    try:
        child = start_quarry_up(env, REPO)
    finally:
        os.umask(old_umask)
    try:
        banner = read_until(child, "Press Ctrl-C")
        for name, p in ports.items():
            assert f"{name:<17} 127.0.0.1:{p}" in banner, banner
        assert "grpcurl -plaintext" in banner
        assert "s3 ls --recursive s3://demo/main/" in banner
        # Every shell command the banner offers works as printed, from another terminal
        # in the same directory (the Python line is for a PySpark session: not run here).
        assert len(run_banner_commands(banner, env, REPO)) >= 8, banner
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            info = server_info_pb2_grpc.ServerInfoStub(channel).GetServerInfo(
                server_info_pb2.GetServerInfoRequest(), timeout=5
            )
        assert info.service == "kv-gateway"
        # The embedded default: a SQLite file under QUARRY_HOME, stamped with the format.
        home = tmp_path / "home"
        assert (home / "kv.db").exists()
        # It holds every credential hash: only its owner may read it, or the directory
        # `quarry up` created for it (issue 23, item 4; tests/e2e/test_kv_file_modes.py for
        # the kv-gateway alone).
        wait_until(lambda: all((home / name).exists() for name in DATABASE_FILES), timeout=20)
        for name in DATABASE_FILES:
            assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        assert "stopped." in out
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    store = SQLiteStore(tmp_path / "home" / "kv.db")
    try:
        assert store.get(b"quarry", b"format-version").value == str(quarry.FORMAT_VERSION).encode()
    finally:
        store.close()


def test_serve_exits_cleanly_on_sigterm(tmp_path):
    port = free_port()
    env = quarry_env(tmp_path, QUARRY_KV_GATEWAY_PORT=str(port))
    with quarry_serve("kv-gateway", env) as child:
        wait_serving(f"127.0.0.1:{port}")
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=20)
        assert child.returncode == 0


def test_serve_refuses_another_format_version(tmp_path):
    store = SQLiteStore(tmp_path / "kv.db")
    store.set(b"quarry", b"format-version", b"2")  # an older store: the rebuild path
    store.close()
    env = quarry_env(tmp_path, QUARRY_KV_GATEWAY_PORT=str(free_port()))
    result = subprocess.run(
        [str(VENV_BIN / "quarry"), "serve", "kv-gateway"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "quarry store export" in result.stderr and "quarry store import" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_on_a_busy_port_says_so_without_a_traceback(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = quarry_env(tmp_path, QUARRY_KV_URL="memory://", QUARRY_KV_GATEWAY_PORT=str(port))
        result = subprocess.run(
            [str(VENV_BIN / "quarry"), "serve", "kv-gateway"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode != 0
    assert "cannot listen on" in result.stderr and "QUARRY_KV_GATEWAY_PORT" in result.stderr
    assert "Traceback" not in result.stderr


def test_up_stops_on_sigint_even_when_started_in_the_background(tmp_path):
    ports = {name: free_port() for name in SERVICE_MODULES}
    env = quarry_env(
        tmp_path / "home",
        **service_ports(ports),
    )
    # As a non-interactive shell does for `cmd &`: SIGINT ignored in the child.
    child = subprocess.Popen(
        [str(VENV_BIN / "quarry"), "up"],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        read_until(child, "Press Ctrl-C")
        child.send_signal(signal.SIGINT)
        child.communicate(timeout=120)
        assert child.returncode == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
