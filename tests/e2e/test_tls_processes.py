"""The whole suite under TLS and under mTLS, as users run it: five `quarry serve` processes on
127.0.0.1 sharing one certificate (QUARRY_TLS_CERT_FILE/KEY_FILE/CA_FILE, and
QUARRY_TLS_CLIENT_AUTH for mTLS), driven by the `quarry` CLI with the CA (and under mTLS
a client certificate) in its environment (its entry point run as a child would see it,
support.cli), and by grpcurl with -cacert/-cert/-key.

A plaintext CLI, a CLI trusting another CA, and under mTLS a CLI without a certificate are
refused with one line naming TLS, no traceback. `quarry serve` refuses a non-loopback
plaintext listener (unless QUARRY_ALLOW_INSECURE_LISTEN) and unusable TLS settings, exiting
non-zero with a message naming the setting.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quarry.config import load_settings
from quarry.runtime.channels import open_channel
from quarry.runtime.tls import channel_security
from support.auth import TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY, admin_token_source
from support.cli import run_quarry
from support.processes import (
    READY_TIMEOUT,
    VENV_BIN,
    free_port,
    quarry_env,
    quarry_serve,
    wait_serving,
)
from support.tls import make_pki

SERVICES = ("kv-gateway", "range-writer", "branch-manager", "committer", "compactor-sensor")
GRPCURL = Path(sys.executable).parent / "grpcurl"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def _addresses(ports: dict[str, int]) -> dict[str, str]:
    return {
        f"QUARRY_{name.upper().replace('-', '_')}_{what}": value
        for name, port in ports.items()
        for what, value in (("PORT", str(port)), ("ADDRESS", f"127.0.0.1:{port}"))
    }


def _wait_serving_tls(
    target: str, tls_env: dict[str, str], children, timeout: float = READY_TIMEOUT
):
    """Poll health over a channel secured as `tls_env` says, failing early if a child died."""
    security = channel_security(load_settings(env=tls_env))
    deadline = time.monotonic() + timeout
    with open_channel(target, security=security, traced=False) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                if (
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    == health_pb2.HealthCheckResponse.SERVING
                ):
                    return
            except grpc.RpcError:
                pass
            for name, child in children:
                if child.poll() is not None:
                    raise AssertionError(f"{name} exited: {child.stderr.read()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{target} not SERVING over TLS within {timeout}s")
            time.sleep(0.1)


@pytest.fixture(scope="module", params=["tls", "mtls"])
def cluster(request, pki, tmp_path_factory):
    mtls = request.param == "mtls"
    home = tmp_path_factory.mktemp(f"{request.param}-home")
    ports = {name: free_port() for name in SERVICES}
    service_env = quarry_env(
        home,
        QUARRY_COMPACTION_CHECK_INTERVAL_SECONDS="0.5",
        **_addresses(ports),
        **pki.env(client_auth=mtls),
    )
    client_tls = pki.client_env(with_certificate=mtls)
    cli_env = quarry_env(home / "cli", **_addresses(ports), **client_tls)
    with contextlib.ExitStack() as stack:
        children = [
            (name, stack.enter_context(quarry_serve(name, service_env))) for name in SERVICES
        ]
        for name in SERVICES:
            _wait_serving_tls(f"127.0.0.1:{ports[name]}", client_tls, children)
        yield {
            "mode": request.param,
            "ports": ports,
            "cli_env": cli_env,
            "home": home,
            "children": children,
        }
        for name, child in children:
            assert child.poll() is None, f"{name} died: {child.stderr.read()}"


def quarry(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`quarry ARGS` with `env` as its environment (its entry point, in this process as a
    child would see it: support.cli); the services it calls are the TLS processes."""
    return run_quarry(args, env)


def ok(env: dict[str, str], *args: str) -> str:
    result = quarry(env, *args)
    assert result.returncode == 0, f"quarry {' '.join(args)}: {result.stderr}"
    return result.stdout


def test_the_cli_round_trip_over_tls(cluster, tmp_path):
    env = cluster["cli_env"]
    setup = quarry(
        env,
        "setup",
        "--access-key-id",
        TEST_ACCESS_KEY_ID,
        "--secret-access-key",
        TEST_SECRET_ACCESS_KEY,
    )
    assert setup.returncode == 0, setup.stderr
    namespace = tmp_path / "lake"
    ok(env, "repo", "create", "tls-demo", str(namespace))
    ok(env, "put", "tls-demo", "main", "a/one.parquet", "--address", "s3://b/1", "--size", "1")
    ok(env, "commit", "tls-demo", "main", "-m", "first")
    ok(env, "branch", "create", "tls-demo", "feature", "--source", "main")
    ok(env, "put", "tls-demo", "feature", "a/two.parquet", "--address", "s3://b/2", "--size", "2")
    ok(env, "commit", "tls-demo", "feature", "-m", "second")
    ok(env, "merge", "tls-demo", "feature", "main", "-m", "merge feature")
    log = json.loads(ok(env, "log", "tls-demo", "main", "--json"))
    messages = [commit["message"] for commit in _commits(log)]
    assert messages[:3] == ["merge feature", "second", "first"], messages
    listing = ok(env, "ls", "tls-demo", "main", "--recursive")
    assert "a/one.parquet" in listing and "a/two.parquet" in listing


def _commits(log) -> list[dict]:
    return log["commits"] if isinstance(log, dict) else log


def test_grpcurl_over_tls(cluster, pki):
    if not GRPCURL.exists():
        pytest.fail(f"grpcurl not found at {GRPCURL}: run `make install`")
    tls_flags = ["-cacert", str(pki.ca.ca_file)]
    if cluster["mode"] == "mtls":
        tls_flags += ["-cert", str(pki.client.cert_file), "-key", str(pki.client.key_file)]
    target = f"127.0.0.1:{cluster['ports']['branch-manager']}"
    listed = subprocess.run(
        [str(GRPCURL), *tls_flags, target, "list"], capture_output=True, text=True, timeout=30
    )
    assert listed.returncode == 0, listed.stderr
    assert "quarry.v1.BranchManager" in listed.stdout
    repos = subprocess.run(
        [
            str(GRPCURL),
            *tls_flags,
            "-H",
            f"authorization: Bearer {admin_token_source()()}",
            "-d",
            "{}",
            target,
            "quarry.v1.BranchManager/ListRepositories",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert repos.returncode == 0, repos.stderr
    # And grpcurl's plaintext mode does not get in.
    plain = subprocess.run(
        [str(GRPCURL), "-plaintext", target, "list"], capture_output=True, text=True, timeout=30
    )
    assert plain.returncode != 0


def _refused(result: subprocess.CompletedProcess, reason: str) -> str:
    assert result.returncode == 1, result.stdout
    assert f"quarry: {reason}:" in result.stderr, result.stderr
    assert "TLS" in result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


def test_the_cli_without_the_right_tls_settings_is_refused_naming_tls(cluster, pki):
    base = {k: v for k, v in cluster["cli_env"].items() if not k.startswith("QUARRY_TLS_")}
    # Plaintext against TLS: the server hangs up during set-up.
    _refused(quarry(base, "repo", "list"), "CONNECTION_CLOSED_AT_SETUP")
    # Another CA: the handshake fails, at once (not retried).
    started = time.monotonic()
    wrong = dict(base, QUARRY_TLS_CA_FILE=str(pki.other_ca.ca_file))
    _refused(quarry(wrong, "repo", "list"), "TLS_HANDSHAKE_FAILED")
    assert time.monotonic() - started < 20
    if cluster["mode"] == "mtls":
        no_cert = dict(base, QUARRY_TLS_CA_FILE=str(pki.ca.ca_file))
        message = _refused(quarry(no_cert, "repo", "list"), "CONNECTION_CLOSED_AT_SETUP")
        assert "client certificates" in message


def _serve_refused(env: dict[str, str], *needles: str) -> None:
    result = subprocess.run(
        [str(VENV_BIN / "quarry"), "serve", "kv-gateway"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    for needle in needles:
        assert needle in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_serve_refuses_plaintext_beyond_loopback_unless_allowed(tmp_path):
    port = free_port()
    env = quarry_env(
        tmp_path,
        QUARRY_KV_URL="memory://",
        QUARRY_LISTEN_HOST="0.0.0.0",
        QUARRY_KV_GATEWAY_PORT=str(port),
    )
    _serve_refused(env, "INSECURE_LISTEN_REFUSED", "QUARRY_ALLOW_INSECURE_LISTEN", "without TLS")
    with quarry_serve("kv-gateway", dict(env, QUARRY_ALLOW_INSECURE_LISTEN="true")) as child:
        wait_serving(f"127.0.0.1:{port}")
        assert child.poll() is None


def test_serve_refuses_unusable_tls_settings(tmp_path, pki):
    env = quarry_env(tmp_path, QUARRY_KV_URL="memory://", QUARRY_KV_GATEWAY_PORT=str(free_port()))
    _serve_refused(
        dict(env, QUARRY_TLS_CERT_FILE=str(pki.server.cert_file)),
        "TLS_MISCONFIGURED",
        "QUARRY_TLS_KEY_FILE",
    )
    _serve_refused(
        env | pki.env() | {"QUARRY_TLS_CA_FILE": str(tmp_path / "missing.pem")},
        "QUARRY_TLS_CA_FILE",
        "missing.pem",
    )
    _serve_refused(
        env | pki.env() | {"QUARRY_TLS_KEY_FILE": str(pki.client.key_file)},
        "QUARRY_TLS_KEY_FILE",
    )
    _serve_refused(
        dict(env, **{k: v for k, v in pki.env().items() if k != "QUARRY_TLS_CA_FILE"})
        | {"QUARRY_TLS_CLIENT_AUTH": "true"},
        "QUARRY_TLS_CA_FILE",
    )


def test_up_under_tls_prints_commands_that_work_as_printed(tmp_path, pki):
    """`quarry up` with the suite's certificate: every shell command of its banner (the CLI,
    grpcurl with -cacert, the AWS CLI with --ca-bundle through the s3-gateway's HTTPS)
    works exactly as printed. It printed `grpcurl -plaintext` and an aws line without the
    CA, which fail against TLS."""
    import signal

    from quarry.cli.main import SERVICE_MODULES
    from support.processes import (
        read_until,
        run_banner_commands,
        service_ports,
        start_quarry_up,
    )

    ports = {name: free_port() for name in SERVICE_MODULES}
    env = quarry_env(
        tmp_path / "home",
        **service_ports(ports),
        QUARRY_TLS_CERT_FILE=str(pki.server.cert_file),
        QUARRY_TLS_KEY_FILE=str(pki.server.key_file),
        QUARRY_TLS_CA_FILE=str(pki.ca.ca_file),
    )
    repo_root = Path(__file__).resolve().parents[2]
    child = start_quarry_up(env, repo_root)
    try:
        banner = read_until(child, "Press Ctrl-C")
        assert "-plaintext" not in banner and "--ca-bundle" in banner, banner
        commands = run_banner_commands(banner, env, repo_root)
        assert any("grpcurl" in c for c in commands) and any(" s3 ls " in c for c in commands)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_service_with_an_expired_certificate_says_so_in_its_log(tmp_path, pki):
    """`quarry serve` with a certificate that has expired (a rotation that installed an old
    one) starts, and its log says why every client will refuse it."""
    expired = pki.ca.issue("expired-kv-gateway", days=-1)
    env = quarry_env(
        tmp_path,
        QUARRY_KV_URL="memory://",
        QUARRY_KV_GATEWAY_PORT=str(free_port()),
        QUARRY_TLS_CERT_FILE=str(expired.cert_file),
        QUARRY_TLS_KEY_FILE=str(expired.key_file),
        QUARRY_TLS_CA_FILE=str(pki.ca.ca_file),
    )
    with quarry_serve("kv-gateway", env) as child:
        assert child.stdout is not None
        ready = child.stdout.readline()  # the ready line: it started
        assert "kv-gateway" in ready, ready
        child.terminate()
        _, log = child.communicate(timeout=30)
    assert f"QUARRY_TLS_CERT_FILE={expired.cert_file} expired on" in log, log
    assert "Traceback" not in log
