"""A service whose port another process listens on stops at once with one line naming the
setting that moves it (exit 2), never a traceback: the gRPC services and the HTTP ones (the
s3-gateway and the console bind their socket themselves)."""

from __future__ import annotations

import socket
import subprocess

import pytest

from support.processes import VENV_BIN, free_port, quarry_env


@pytest.mark.parametrize("service", ["kv-gateway", "s3-gateway", "console"])
def test_a_taken_port_is_one_line_and_exit_2(tmp_path, service):
    port = free_port()
    setting = f"QUARRY_{service.upper().replace('-', '_')}_PORT"
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        ran = subprocess.run(
            [str(VENV_BIN / "quarry"), "serve", service],
            # (The console needs its session key before it binds.)
            env=quarry_env(tmp_path, QUARRY_CONSOLE_SESSION_KEY="k" * 40, **{setting: str(port)}),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert ran.returncode == 2, ran.stderr
    assert "Traceback" not in ran.stderr, ran.stderr
    assert (
        f"quarry serve {service}: UNAVAILABLE: {service} cannot listen on 127.0.0.1:{port} "
        f"(address in use?); choose another with {setting}"
    ) in ran.stderr, ran.stderr
