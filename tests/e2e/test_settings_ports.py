"""Changing a service's port moves both ends (issue 11, item 9): real `quarry serve`
processes on non-default ports, given only QUARRY_*_PORT (no *_ADDRESS), find each other,
and the CLI, given the same environment, reaches them."""

from __future__ import annotations

import contextlib
import subprocess

from quarry.kv import open_store
from support.auth import setup_admin_over_grpc
from support.processes import VENV_BIN, free_port, quarry_env, quarry_serve, wait_serving

SERVICES = ("kv-gateway", "range-writer", "branch-manager", "committer", "compactor-sensor")
STARTED = ("kv-gateway", "range-writer", "branch-manager")


def test_a_port_alone_moves_the_listener_and_the_dialled_address(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    ports = {name: free_port() for name in SERVICES}
    env = quarry_env(
        home,
        QUARRY_COMPACTOR_ENABLED="false",
        **{
            f"QUARRY_{name.upper().replace('-', '_')}_PORT": str(port)
            for name, port in ports.items()
        },
    )
    assert not any(key.endswith("_ADDRESS") for key in env)
    with contextlib.ExitStack() as stack:
        for name in STARTED:
            stack.enter_context(quarry_serve(name, env))
        # branch-manager is SERVING only once it reaches the kv-gateway: at the address
        # derived from QUARRY_KV_GATEWAY_PORT, since no address was given.
        for name in STARTED:
            wait_serving(f"127.0.0.1:{ports[name]}", timeout=60)
        setup_admin_over_grpc(f"127.0.0.1:{ports['branch-manager']}")  # support.auth

        def quarry(*args: str) -> str:
            result = subprocess.run(
                [str(VENV_BIN / "quarry"), *args],
                env=env,
                text=True,
                capture_output=True,
                timeout=60,
            )
            assert result.returncode == 0, result.stderr
            return result.stdout

        # The CLI dials branch-manager at QUARRY_BRANCH_MANAGER_PORT, which dials the
        # range-writer and the kv-gateway at theirs.
        quarry("repo", "create", "moved", str(tmp_path / "lake"))
        assert "moved" in quarry("repo", "list")
    # The repository landed in this suite's own KV store (not a suite on default ports).
    store = open_store(f"sqlite:///{home.resolve() / 'kv.db'}")
    try:
        assert store.get(b"quarry", b"repos/moved").value
    finally:
        store.close()
