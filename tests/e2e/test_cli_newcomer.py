"""The `quarry` command as a newcomer meets it (issue 25), run as users run it: the real
console script in a child process against the suite running in this process — the token
kept between runs, global flags before the command, help, HEAD, merges already done,
deletes that need --force, unreachable services, usage errors, the --json vocabulary."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest
from prometheus_client import REGISTRY

from support.processes import VENV_BIN, quarry_env
from support.suite import running_suite


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    with running_suite(tmp_path_factory.mktemp("suite")) as running:
        yield running


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("cli-home")


def _targets(suite) -> list[str]:
    return [
        "--branch-manager",
        suite.targets["branch-manager"],
        "--committer",
        suite.targets["committer"],
    ]


@pytest.fixture(scope="module")
def quarry(suite, home):
    env = quarry_env(home)

    def run(*args: str, expect: int = 0, extra_env: dict[str, str] | None = None):
        result = subprocess.run(
            [str(VENV_BIN / "quarry"), *args, *_targets(suite)],
            env={**env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == expect, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        return result

    return run


def bare(*args: str, home, extra_env: dict[str, str] | None = None):
    """`quarry ARGS` exactly as given (no connection options appended)."""
    return subprocess.run(
        [str(VENV_BIN / "quarry"), *args],
        env={**quarry_env(home), **(extra_env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def _logins() -> float:
    labels = {"service": "branch-manager", "method": "quarry.v1.Auth/Login", "code": "OK"}
    return REGISTRY.get_sample_value("quarry_rpc_requests_total", labels) or 0.0


# ---- the token kept between runs ---------------------------------------------------------


def test_two_commands_log_in_once_and_the_token_file_is_private(quarry, home):
    (home / "tokens.json").unlink(missing_ok=True)
    before = _logins()
    quarry("repo", "list")
    quarry("repo", "list")
    assert _logins() == before + 1
    mode = stat.S_IMODE(os.stat(home / "tokens.json").st_mode)
    assert mode == 0o600, oct(mode)


def test_a_refused_cached_token_is_dropped_and_the_cli_logs_in_once(quarry, home):
    quarry("repo", "list")  # a cached token
    path = home / "tokens.json"
    tokens = json.loads(path.read_text())
    assert len(tokens) == 1
    for entry in tokens.values():
        entry["token"] = entry["token"][:-4] + ("AAAA" if entry["token"][-4:] != "AAAA" else "BBBB")
    path.write_text(json.dumps(tokens))
    before = _logins()
    quarry("repo", "list")  # refused (bad signature): dropped, one Login, the call retried
    assert _logins() == before + 1
    quarry("repo", "list")  # the new token was cached
    assert _logins() == before + 1
