"""The Helm chart runs the image, for real, the way a user runs it: `make kube-up` (deploy/
local/kube.py: `helm template` of deploy/helm/quarry with deploy/local/values.yaml, adapted for
podman 4.3, `podman kube play`, the rendered probes run until they pass, the rendered bootstrap
Job creating the admin), then the host's `quarry` CLI pointed at the pods only through the
QUARRY_CONFIG_FILE that kube-up printed (repo create, put --from, commit, merge, log, ls,
cat), boto3 through the S3 gateway's pod (HTTPS with the chart's CA, mTLS with the client
certificate) with credentials made by `quarry auth credentials create`, then `make kube-down`,
after which no pod, secret, volume, container or network of the run is left. The same after a failed start (a setting every service refuses). `make kube-down`
removes only what the chart names for the release: a decoy sharing the release's prefix stays.

The fixture builds the image (`make image`: a no-op when it is up to date); `make test` leaves it
to this fixture, which tests/conftest.py starts first, so the build overlaps the other tests.
Skipped only when podman is missing and cannot be installed (`make image-tools` needs root or
sudo for apt-get); on CI and on this kind of machine it runs. The podman tests share the host's
podman: they never run concurrently (xdist group "podman").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import subprocess
import time
import tomllib
from pathlib import Path

import boto3
import botocore.exceptions
import pytest
import yaml
from botocore.config import Config

from support.console import Browser
from support.processes import health_status

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "quarry"
CONTAINERS_CONF = REPO / "build" / "image" / "containers.conf"
QUARRY = REPO / ".venv" / "bin" / "quarry"

pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("podman")]


def podman(*args: str, check: bool = True, stdin: str | None = None):
    proc = subprocess.run(
        ["podman", *args],
        capture_output=True,
        text=True,
        input=stdin,
        env=dict(os.environ, CONTAINERS_CONF=str(CONTAINERS_CONF)),
        timeout=300,
    )
    assert not check or proc.returncode == 0, f"podman {args}: {proc.stdout}{proc.stderr}"
    return proc


def podman_objects() -> set[str]:
    """Every pod, container, secret, volume and network podman has, as "kind name"."""
    found = set()
    for kind, args, field in (
        ("pod", ("pod", "ps"), "{{.Name}}"),
        ("container", ("ps", "-a"), "{{.Names}}"),
        ("secret", ("secret", "ls"), "{{.Name}}"),
        ("volume", ("volume", "ls"), "{{.Name}}"),
        ("network", ("network", "ls"), "{{.Name}}"),
    ):
        listing = podman(*args, "--format", field).stdout
        found |= {f"{kind} {name}" for name in listing.split()}
    return found


@pytest.fixture(scope="module")
def image() -> str:
    """`make image` (a no-op when the image is up to date); the image reference."""
    if shutil.which("podman") is None:
        tools = subprocess.run(
            ["make", "--no-print-directory", "image-tools"], cwd=REPO, capture_output=True
        )
        if tools.returncode != 0 or shutil.which("podman") is None:
            pytest.skip(
                "podman is missing and `make image-tools` could not install it (apt-get needs "
                f"root or sudo): {tools.stderr.decode(errors='replace')[-500:]}"
            )
    started = time.monotonic()
    proc = subprocess.run(
        ["make", "--no-print-directory", "image"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, f"make image failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    print(f"make image: {time.monotonic() - started:.1f}s; {proc.stdout.strip().splitlines()[-1]}")
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    return f"localhost/quarry:{version}"


class Kube:
    """`make kube-up` / `make kube-down` of one release with its own state directory and
    free ports, exactly as a user runs them (KUBE_ARGS)."""

    def __init__(self, release: str, state: Path, *values: str) -> None:
        self.release = release
        self.state = state
        self.args = ["--release", release, "--state-dir", str(state), "--free-ports", *values]

    def make(self, target: str) -> subprocess.CompletedProcess[str]:
        started = time.monotonic()
        proc = subprocess.run(
            ["make", "--no-print-directory", target, f"KUBE_ARGS={' '.join(self.args)}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith(("QUARRY_", "OTEL_"))},
            timeout=600,
        )
        print(f"make {target}: exit {proc.returncode} after {time.monotonic() - started:.1f}s")
        return proc

    def up(self) -> subprocess.CompletedProcess[str]:
        return self.make("kube-up")

    def down(self) -> subprocess.CompletedProcess[str]:
        return self.make("kube-down")

    def cleanup(self) -> None:
        """After a failed test: kube-down, unless the test's own kube-down left nothing."""
        if self.state.exists() or any(self.release in o for o in podman_objects()):
            self.down()


def output(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout + proc.stderr


def cli_env(config: Path, **overrides: str) -> dict[str, str]:
    """The user's environment after `export QUARRY_CONFIG_FILE=...` (and nothing else)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUARRY_", "OTEL_"))}
    return dict(env, QUARRY_CONFIG_FILE=str(config), NO_COLOR="1", **overrides)


def cli(env: dict[str, str], *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(QUARRY), *args], capture_output=True, text=True, env=env, timeout=120
    )
    if ok:
        assert proc.returncode == 0, f"quarry {' '.join(args)}: {output(proc)}"
    return proc


@pytest.mark.parametrize("client_auth", [False, True], ids=["tls", "mtls"])
def test_kube_up_round_trip_and_down(image, tmp_path, client_auth):
    """TLS on as the chart defaults (its generated CA); with mTLS the services present their
    certificate to each other and the host's CLI presents it too, and the S3 gateway runs as
    two worker processes in its pod (services.s3Gateway.workers)."""
    before = podman_objects()
    release = f"kt{os.getpid() % 10000}{int(client_auth)}"
    values = ["--set", "tls.clientAuth=true", "--set", "services.s3Gateway.workers=2"]
    kube = Kube(release, tmp_path / "state", *(values * client_auth))
    try:
        # Down on nothing is a success.
        nothing = kube.down()
        assert nothing.returncode == 0 and "to remove" in output(nothing), output(nothing)

        started = time.monotonic()
        first = kube.up()
        assert first.returncode == 0, output(first)
        up_seconds = time.monotonic() - started
        config_path = kube.state / "quarry.toml"
        config_text = config_path.read_text()
        assert f"export QUARRY_CONFIG_FILE={config_path}" in first.stdout, first.stdout
        config = tomllib.loads(config_text)
        credentials_file = Path(config["home"]) / "credentials.json"
        assert f"Admin credentials: {credentials_file}" in first.stdout
        assert credentials_file.stat().st_mode & 0o077 == 0
        secret = json.loads(credentials_file.read_text())["secret_access_key"]
        assert secret not in output(first)  # the bootstrap's log is shown, the secret never
        assert "created with access key id" in output(first)
        branch_manager = config["branch_manager_address"]
        assert f"grpc {branch_manager}" in first.stdout
        assert f'make kube-down KUBE_ARGS="--release {release} --state-dir {kube.state}"' in (
            first.stdout
        )

        # The services speak TLS only: a plaintext health check gets no answer, and the
        # CLI without the CA (under mTLS: without a client certificate) cannot connect.
        env = cli_env(config_path)
        assert health_status(branch_manager) is None
        no_ca = cli_env(config_path, QUARRY_TLS_CA_FILE="")
        assert cli(no_ca, "repo", "list", ok=False).returncode != 0
        if client_auth:
            no_cert = cli_env(config_path, QUARRY_TLS_CERT_FILE="", QUARRY_TLS_KEY_FILE="")
            assert cli(no_cert, "repo", "list", ok=False).returncode != 0

        # The round trip, as docs/deploy.md shows it: the storage namespace is a path the
        # host's CLI (put --from, cat) and the pods (range-writer) share.
        data = kube.state / "data"
        namespace = f"{data}/lake/demo"
        assert f"quarry repo create demo {namespace}" in first.stdout
        table = tmp_path / "part-0.csv"
        table.write_text("id,name\n1,alpha\n2,beta\n")
        cli(env, "repo", "create", "demo", namespace)
        cli(env, "branch", "create", "demo", "feature", "--source", "main")
        cli(env, "put", "demo", "feature", "tables/a/part-0.csv", "--from", str(table))
        cli(env, "commit", "demo", "feature", "-m", "add part-0")
        cli(env, "merge", "demo", "feature", "main", "-m", "merge feature")
        log = json.loads(cli(env, "log", "demo", "main", "--json").stdout)
        assert [c["message"] for c in log][:2] == ["merge feature", "add part-0"], log
        assert "part-0.csv" in cli(env, "ls", "demo", "main", "tables/a/").stdout
        assert cli(env, "cat", "demo", "main", "tables/a/part-0.csv").stdout == table.read_text()
        # kv-gateway's SQLite file and range-writer's ranges are in the data directory: the
        # pods really used the chart's volume.
        assert (data / "kv.db").is_file()
        assert any((data / "lake" / "demo" / "_quarry").rglob("*"))
        # Auth is on in the pods: a wrong secret is refused. (A QUARRY_HOME of its own: the
        # CLI's token cache in the admin's home would answer without a login.)
        bad = cli_env(
            config_path,
            QUARRY_HOME=str(tmp_path / "wrong-secret-home"),
            QUARRY_ACCESS_KEY_ID=json.loads(credentials_file.read_text())["access_key_id"],
            QUARRY_SECRET_ACCESS_KEY="not-the-secret-0123456789",
        )
        refused = cli(bad, "repo", "list", ok=False)
        assert refused.returncode != 0 and "INVALID_CREDENTIALS" in refused.stderr, refused

        # S3 through the gateway's pod: boto3 with credentials `quarry auth credentials create`
        # makes (their secret is sealed for SigV4), verifying the gateway against the chart's
        # CA (under mTLS presenting the certificate). A gateway write is what the CLI reads,
        # a CLI write is what S3 reads.
        gateway = config["s3_gateway_address"]
        assert f"s3 https://{gateway}" in first.stdout, first.stdout
        made = json.loads(cli(env, "auth", "credentials", "create", "admin", "--json").stdout)
        client_cert = (config["tls_cert_file"], config["tls_key_file"]) if client_auth else None

        def s3(cert: tuple[str, str] | None = client_cert):
            return boto3.client(
                "s3",
                endpoint_url=f"https://{gateway}",
                aws_access_key_id=made["access_key_id"],
                aws_secret_access_key=made["secret_access_key"],
                region_name="us-east-1",
                verify=config["tls_ca_file"],
                config=Config(
                    s3={"addressing_style": "path"},
                    retries={"max_attempts": 1},
                    client_cert=cert,
                ),
            )

        got = s3().get_object(Bucket="demo", Key="main/tables/a/part-0.csv")["Body"].read()
        assert got.decode() == table.read_text()
        # The gateway writes into a repository of its own: the pods run as uid 10001, and
        # demo's data/ directory is the host CLI's (`put --from`, mode 0755), not theirs.
        cli(env, "repo", "create", "s3demo", f"{data}/lake/s3demo")
        body = b"written through the S3 gateway pod\n"
        s3().put_object(Bucket="s3demo", Key="main/s3/hello.txt", Body=body)
        assert cli(env, "cat", "s3demo", "main", "s3/hello.txt").stdout == body.decode()
        listed = s3().list_objects_v2(Bucket="s3demo", Prefix="main/", Delimiter="/")
        assert [p["Prefix"] for p in listed.get("CommonPrefixes", [])] == ["main/s3/"]
        # Who served that: one process per gateway container, or (mTLS variant) a supervisor
        # and its two workers.
        gateways = [
            name
            for name in podman("ps", "--format", "{{.Names}}").stdout.split()
            if name.startswith(release) and name.endswith("-s3-gateway")
        ]
        assert gateways, podman("ps", "--format", "{{.Names}}").stdout
        for name in gateways:
            processes = podman("top", name, "args").stdout
            expected = 3 if client_auth else 1
            assert processes.count("serve s3-gateway") == expected, processes
        # The branch-manager's and committer's pods: even one process with the default caches
        # (resident ~2 × 320 MiB + 150 MiB once they fill) overshoots three quarters of the
        # chart's 1 GiB limit, so each process fitted its caches to the limit it read from its
        # cgroup, and said so (Settings.caches_fitted) — not OOM-killed later.
        names = podman("ps", "--format", "{{.Names}}").stdout.split()
        for suffix in ("-branch-manager", "-committer"):
            pods = [n for n in names if n.startswith(release) and n.endswith(suffix)]
            assert pods, names
            for name in pods:
                logged = podman("logs", name)
                logs = logged.stdout + logged.stderr
                assert "do not fit the container's memory limit of 1024 MiB" in logs, logs
        # The console's pod: a sign-in over HTTPS with the chart's CA (under mTLS presenting
        # the certificate) as the admin, whose session the chart's session key seals, then
        # the repositories page lists what the CLI made.
        console = re.search(r"browser https://127\.0\.0\.1:(\d+)", first.stdout)
        assert console, first.stdout
        context = ssl.create_default_context(cafile=config["tls_ca_file"])
        if client_auth:
            context.load_cert_chain(config["tls_cert_file"], config["tls_key_file"])
        browser = Browser(int(console.group(1)), tls=context)
        admin = json.loads(credentials_file.read_text())
        signed_in = browser.sign_in(admin["access_key_id"], admin["secret_access_key"])
        assert signed_in.status == 303, signed_in.text
        repositories = browser.get("/repos")
        assert repositories.status == 200 and "s3demo" in repositories.text, repositories.text
        if client_auth:
            # No client certificate, no TLS session: the gateway never answers (no S3 error).
            with pytest.raises(botocore.exceptions.BotoCoreError):
                s3(cert=None).list_buckets()

        if not client_auth:
            # kube-up twice: the release is up, so nothing is recreated; the bootstrap Job
            # runs again (as on `helm upgrade`), finds the admin and changes nothing.
            again = kube.up()
            assert again.returncode == 0, output(again)
            assert "up already" in output(again) and "has an admin already" in output(again)
            assert "nothing to do" in output(again)  # the Secret's key is the admin's
            assert "is not valid here" not in output(again)
            assert secret not in output(again)
            assert config_path.read_text() == config_text
            assert cli(env, "cat", "demo", "main", "tables/a/part-0.csv").stdout

        gone = kube.down()
        assert gone.returncode == 0, output(gone)
        assert podman_objects() - before == set()
        assert not kube.state.exists()
        print(f"kube-up: {up_seconds:.1f}s")
    finally:
        kube.cleanup()


def test_failed_start_leaves_nothing(image, tmp_path):
    """A setting every service refuses: the containers crash-loop, kube-up fails fast with
    their logs, and everything it had created (secrets, pods, volumes, the state directory)
    is removed; a second kube-down finds nothing."""
    before = podman_objects()
    kube = Kube(
        f"kf{os.getpid() % 10000}",
        tmp_path / "state",
        "--set-string",
        "extraEnv.QUARRY_MAX_WORKERS=many",
    )
    try:
        failed = kube.up()
        assert failed.returncode != 0, output(failed)
        text = output(failed)
        assert "QUARRY_MAX_WORKERS: 'many' is not a valid int" in text, text
        assert "did not start; everything it created is removed" in text, text
        assert podman_objects() - before == set()
        assert not kube.state.exists()
        again = kube.down()
        assert again.returncode == 0 and "to remove" in output(again), output(again)
    finally:
        kube.cleanup()


def test_kube_down_removes_only_what_the_chart_names(image, tmp_path):
    """Safety rule of kube.py: down removes pods, secrets and volumes by the exact names the
    chart renders for the release, never another one sharing the release's prefix, and
    deletes a state directory only when it holds kube.py's marker."""
    release = f"kd{os.getpid() % 10000}"
    state = tmp_path / "mine"
    state.mkdir()
    (state / "notes.txt").write_text("not kube.py's")
    decoys = [
        ("secret", f"{release}-admin-backup"),
        ("volume", f"{release}-data"),
        ("pod", f"{release}-kv-gateway-pod-9"),
    ]
    try:
        podman("secret", "create", decoys[0][1], "-", stdin="keep me")
        podman("volume", "create", decoys[1][1])
        podman("pod", "create", "--infra=false", "--name", decoys[2][1])
        proc = Kube(release, state).down()
        assert proc.returncode == 0, output(proc)
        assert {f"{kind} {name}" for kind, name in decoys} <= podman_objects()
        assert (state / "notes.txt").read_text() == "not kube.py's"
        assert "kept" in output(proc), output(proc)
    finally:
        podman("secret", "rm", decoys[0][1], check=False)
        podman("volume", "rm", "-f", decoys[1][1], check=False)
        podman("pod", "rm", "-f", decoys[2][1], check=False)
