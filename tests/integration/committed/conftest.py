"""A real S3 API (moto_server on loopback) for the committed-storage integration tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Iterator

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _moto_binary() -> str | None:
    beside = Path(sys.executable).with_name("moto_server")
    if beside.exists():
        return str(beside)
    return shutil.which("moto_server")


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """`moto_server -H 127.0.0.1 -p <free port>`; yields its endpoint URL."""
    binary = _moto_binary()
    if binary is None:
        # A missing tool must not quietly turn S3 coverage off.
        pytest.fail("moto_server not found: install the dev extras (`make install`)",
                    pytrace=False)
    port = _free_port()
    proc = subprocess.Popen([binary, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                pytest.fail(f"moto_server exited with {proc.returncode}: {err}", pytrace=False)
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=1)
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"moto_server did not answer on {url}", pytrace=False)
                time.sleep(0.05)
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


@pytest.fixture
def s3_bucket(moto_endpoint, monkeypatch) -> str:
    """A fresh bucket on the moto server (with dummy credentials in the environment)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}))
    name = f"quarry-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return name
