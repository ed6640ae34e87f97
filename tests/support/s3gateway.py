"""The S3 gateway for end-to-end tests: the in-process suite (support.suite) plus a real
`quarry serve s3-gateway` process dialing it, and S3 credentials made through the Auth
service (so their secret is sealed, as every credential created from now on)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
from botocore.config import Config

from support.cli import run_quarry
from support.processes import VENV_BIN, free_port, quarry_env
from support.suite import Suite, running_suite
from support.wait import wait_until


@dataclass
class Gateway:
    suite: Suite
    endpoint: str
    process: subprocess.Popen
    log: Path  # the gateway's stderr (JSON log lines)
    metrics: str  # its Prometheus endpoint

    def credentials(self, user: str = "admin") -> tuple[str, str]:
        """New credentials of `user` (created through Auth/CreateCredentials)."""
        with self.suite.client() as client:
            made = client.create_credentials(user)
        return made.credentials.access_key_id, made.secret_access_key

    def quarry(self, *args: str) -> str:
        """`quarry ARGS` against this gateway's suite (in process as a child would see it,
        support.cli); its stdout (asserts it ran)."""
        env = quarry_env(
            self.suite.home,
            QUARRY_BRANCH_MANAGER_ADDRESS=self.suite.targets["branch-manager"],
            QUARRY_COMMITTER_ADDRESS=self.suite.targets["committer"],
        )
        done = run_quarry(args, env)
        assert done.returncode == 0, f"quarry {' '.join(args)}: {done.stderr}"
        return done.stdout

    def s3(self, key: tuple[str, str] | None = None, verify: str | None = None, **config):
        key_id, secret = key or self.credentials()
        config.setdefault("retries", {"max_attempts": 1})
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
            region_name="us-east-1",
            verify=verify,
            # s3v4 also for presigned URLs (boto3 presigns with SigV2 unless told).
            config=Config(s3={"addressing_style": "path"}, signature_version="s3v4", **config),
        )


def _answers(endpoint: str, ca_file: str = "") -> bool:
    import ssl
    import urllib.request

    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    try:
        with urllib.request.urlopen(endpoint + "/_health", timeout=1, context=context) as response:
            return response.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def running_gateway(
    home: Path,
    gateway_env: dict[str, str] | None = None,
    ca_file: str = "",
    **overrides,
) -> Iterator[Gateway]:
    """`gateway_env`: extra environment of the gateway process (e.g. its TLS certificate);
    `ca_file`: the CA to verify it with when it serves HTTPS."""
    home.mkdir(parents=True, exist_ok=True)
    with running_suite(home, **overrides) as suite:
        port, metrics_port = free_port(), free_port()
        env = quarry_env(
            home,
            QUARRY_S3_GATEWAY_PORT=str(port),
            # The s3-gateway's metrics port is the base + 5 (its index in config.SERVICES).
            QUARRY_METRICS_BASE_PORT=str(metrics_port - 5),
            QUARRY_BRANCH_MANAGER_ADDRESS=suite.targets["branch-manager"],
            QUARRY_COMMITTER_ADDRESS=suite.targets["committer"],
            QUARRY_LOG_FORMAT="json",
            **(gateway_env or {}),
        )
        # Its log (a line per request) goes to a file: a pipe nobody drains would fill and
        # stop the gateway mid-request.
        log_path = home / "s3-gateway.log"
        with open(log_path, "wb") as log:
            child = subprocess.Popen(
                [str(VENV_BIN / "quarry"), "serve", "s3-gateway"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        try:
            endpoint = f"{'https' if ca_file else 'http'}://127.0.0.1:{port}"

            def up() -> bool:
                if child.poll() is not None:
                    raise AssertionError(f"s3-gateway exited: {log_path.read_text()}")
                return _answers(endpoint, ca_file)

            wait_until(up, timeout=30, interval=0.05, what="the s3-gateway to answer")
            yield Gateway(suite, endpoint, child, log_path, f"http://127.0.0.1:{metrics_port}")
        finally:
            child.terminate()
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
