"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DYNALITE = REPO_ROOT / ".tools" / "node_modules" / ".bin" / "dynalite"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def dynalite() -> Iterator[str]:
    """A real dynalite (DynamoDB) server on loopback, in memory; yields its endpoint URL."""
    binary = Path(os.environ.get("QUARRY_DYNALITE", DEFAULT_DYNALITE))
    if not binary.exists():
        # A missing tool must not quietly turn DynamoDB coverage off.
        pytest.fail(f"dynalite not found at {binary}: run `make tools` "
                    "(or set QUARRY_DYNALITE to the dynalite binary)", pytrace=False)
    port = free_port()
    proc = subprocess.Popen(
        [str(binary), "--host", "127.0.0.1", "--port", str(port),
         "--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_answering(proc, url, timeout=20.0)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


def _wait_until_answering(proc: subprocess.Popen, url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            pytest.fail(f"dynalite exited with {proc.returncode}: {err}", pytrace=False)
        try:
            # Any HTTP answer (dynalite replies 400 to an unsigned GET) means it is serving.
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"dynalite did not answer on {url} within {timeout:.0f}s",
                            pytrace=False)
            time.sleep(0.05)
