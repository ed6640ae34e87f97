"""The Helm chart runs the image, for real: `make image` builds localhost/quarry:<version>,
`helm template` renders deploy/helm/quarry with deploy/helm/ci-values.yaml, `podman kube play`
runs the rendered Deployments, ConfigMaps and Secrets in the host's network, the rendered
bootstrap Job creates the admin (`quarry setup`), and the CLI on the host does a
create-repository / put / commit / merge / log round trip against the pods with the admin's
credentials from the rendered Secret. `podman kube down` always runs at the end.

podman here is Debian bookworm's 4.3, which plays the rendered objects with a few gaps; the
test adapts the rendered YAML for exactly those, each documented in `for_podman` and
`create_secrets` (a cluster needs none of it): Secrets are created with `podman secret
create` in the form each use needs, Jobs run as Pods,
host-network pods lose their `ports` list, `metadata.namespace` env entries become literals,
and emptyDir volumes get per-pod names. podman schedules no probes without systemd, so the
test runs each container's rendered probe command in the container itself.

Skipped only when podman is missing and cannot be installed (`make image-tools` needs root or
sudo for apt-get); on CI and on this kind of machine it runs.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from support.processes import free_port, health_status
from support.wait import wait_until

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "quarry"
CI_VALUES = REPO / "deploy" / "helm" / "ci-values.yaml"
HELM = REPO / ".tools" / "bin" / "helm"
CONTAINERS_CONF = REPO / "build" / "image" / "containers.conf"
QUARRY = REPO / ".venv" / "bin" / "quarry"
NAMESPACE = "default"
SERVICES = {  # name -> values key, in quarry.config.SERVICES order
    "kv-gateway": "kvGateway",
    "branch-manager": "branchManager",
    "committer": "committer",
    "compactor-sensor": "compactorSensor",
    "range-writer": "rangeWriter",
}

pytestmark = pytest.mark.timeout(900)


def podman_env() -> dict[str, str]:
    return dict(os.environ, CONTAINERS_CONF=str(CONTAINERS_CONF))


def podman(*args: str, check: bool = True, input: bytes | None = None, timeout: float = 120):
    proc = subprocess.run(
        ["podman", *args],
        capture_output=True,
        env=podman_env(),
        input=input,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} failed ({proc.returncode}):\n"
            f"{proc.stdout.decode(errors='replace')}\n{proc.stderr.decode(errors='replace')}"
        )
    return proc


@pytest.fixture(scope="module")
def image() -> str:
    """`make image` (quick when nothing changed); the image reference it built."""
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


def render(release: str, values: list[str]) -> list[dict]:
    proc = subprocess.run(
        [
            str(HELM),
            "template",
            release,
            str(CHART),
            "--namespace",
            NAMESPACE,
            "-f",
            str(CI_VALUES),
            *values,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(REPO / ".tools"),
            "KUBECONFIG": os.devnull,
        },
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def pod_spec_of(doc: dict) -> dict:
    return doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]


def for_podman(docs: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """(Secrets, what `podman kube play` plays for the services, the bootstrap Job as a Pod),
    adapted to podman 4.3's gaps — each change says which:"""
    secrets = [d for d in docs if d["kind"] == "Secret"]
    configmaps = [d for d in docs if d["kind"] == "ConfigMap"]
    workloads = []
    for doc in docs:
        if doc["kind"] == "Deployment":
            workloads.append(copy.deepcopy(doc))
        elif doc["kind"] == "Job":
            # podman 4.3 plays no Jobs: the Job's pod template as a Pod of the Job's name.
            template = copy.deepcopy(doc["spec"]["template"])
            workloads.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": doc["metadata"]["name"], **template["metadata"]},
                    "spec": template["spec"],
                }
            )
    for doc in workloads:
        pod = pod_spec_of(doc)
        name = doc["metadata"]["name"]
        for container in pod["containers"]:
            # Host network: podman 4.3 turns containerPorts into port mappings, which host
            # networking refuses (they only document the ports of a host-network pod).
            container.pop("ports", None)
            for entry in container.get("env", []):
                field = entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                if field == "metadata.namespace":  # podman 4.3 resolves metadata.name only
                    entry.pop("valueFrom")
                    entry["value"] = NAMESPACE
        # podman 4.3 plays an emptyDir as a named volume shared by every pod that uses the
        # same volume name: make each pod's its own.
        renamed = {
            v["name"]: f"{name}-{v['name']}" for v in pod.get("volumes", []) if "emptyDir" in v
        }
        for volume in pod.get("volumes", []):
            volume["name"] = renamed.get(volume["name"], volume["name"])
        for container in pod["containers"]:
            for mount in container.get("volumeMounts", []):
                mount["name"] = renamed.get(mount["name"], mount["name"])
    services = configmaps + [d for d in workloads if d["kind"] == "Deployment"]
    bootstrap = configmaps + [d for d in workloads if d["kind"] == "Pod"]
    return secrets, services, bootstrap


def create_secrets(secrets: list[dict], workloads: list[dict]) -> None:
    """podman 4.3 stores a played Secret in a form its own secretKeyRef lookup cannot read
    ("is not valid JSON"), and reads the two uses differently: an env secretKeyRef wants the
    Secret's data as a JSON map (base64 values), a secret volume wants a Secret object whose
    data values it writes verbatim (so decoded). Each rendered Secret is created in the form
    its use needs (the chart uses none both ways). A secret volume becomes a named volume
    (the Secret's name) that outlives `podman kube down`: removed before and after."""
    mounted = {
        v["secret"]["secretName"]
        for doc in workloads
        if doc["kind"] in {"Deployment", "Pod"}
        for v in pod_spec_of(doc).get("volumes", [])
        if "secret" in v
    }
    for secret in secrets:
        name = secret["metadata"]["name"]
        if name in mounted:
            decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
            content = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}}
            content["data"] = decoded
        else:
            content = secret["data"]
        podman("secret", "rm", name, check=False)
        podman("volume", "rm", "-f", name, check=False)
        podman("secret", "create", name, "-", input=json.dumps(content).encode())


def secret_value(docs: list[dict], name: str, key: str) -> str:
    secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == name)
    return base64.b64decode(secret["data"][key]).decode()


def container_name(pod: str, container: str) -> str:
    return f"{pod}-{container}"


def logs(name: str) -> str:
    proc = podman("logs", name, check=False)
    return (proc.stdout + proc.stderr).decode(errors="replace")[-3000:]


def probe_command(docs: list[dict], service: str, release: str, probe: str) -> list[str]:
    """The exec command of the service container's rendered `probe`."""
    dep = next(
        d
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"] == f"{release}-{service}"
    )
    return pod_spec_of(dep)["containers"][0][probe]["exec"]["command"]


def run_probe(docs: list[dict], service: str, release: str, probe: str) -> bool:
    """The container's rendered probe command, run in the container (what a kubelet does)."""
    command = probe_command(docs, service, release, probe)
    name = container_name(f"{release}-{service}-pod-0", service)
    state = podman("inspect", "--format", "{{.State.Status}}", name, check=False)
    if state.stdout.decode().strip() not in ("running", "created", "configured"):
        raise AssertionError(f"{name} is {state.stdout.decode().strip()}:\n{logs(name)}")
    return podman("exec", name, *command, check=False, timeout=60).returncode == 0


def wait_for_probe(docs: list[dict], service: str, release: str, probe: str) -> None:
    """Wait for the rendered probe to pass; on a timeout the error carries the probe's own
    output and every service container's log tail, so a CI failure explains itself."""
    try:
        wait_until(
            lambda: run_probe(docs, service, release, probe),
            timeout=180,
            interval=1.0,
            what=f"{service} {probe}",
        )
    except AssertionError as timeout:
        command = probe_command(docs, service, release, probe)
        name = container_name(f"{release}-{service}-pod-0", service)
        last = podman("exec", name, *command, check=False, timeout=60)
        report = [f"{timeout}", f"probe {command}: exit {last.returncode}"]
        report.append((last.stdout + last.stderr).decode(errors="replace"))
        for other in SERVICES:
            other_name = container_name(f"{release}-{other}-pod-0", other)
            report.append(f"--- podman logs {other_name} ---\n{logs(other_name)}")
        raise AssertionError("\n".join(report)) from None


def play_file(path: Path, docs: list[dict]) -> Path:
    path.write_text(yaml.safe_dump_all(docs))
    return path


def run_bootstrap(work: Path, bootstrap: list[dict], release: str, attempt: int) -> tuple[int, str]:
    """Play the bootstrap Job's pod, wait for it to finish; (exit code, log)."""
    docs = copy.deepcopy(bootstrap)
    pod = docs[-1]
    pod["metadata"]["name"] = f"{release}-bootstrap-{attempt}"
    path = play_file(work / f"bootstrap-{attempt}.yaml", docs)
    podman("kube", "play", str(path))
    name = container_name(pod["metadata"]["name"], "setup")
    try:
        wait_until(
            lambda: (
                podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip() == b"exited"
            ),
            timeout=180,
            interval=0.5,
            what=f"{name} to finish",
        )
        code = int(podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip())
        return code, logs(name)
    finally:
        podman("kube", "down", str(path), check=False)


def cli(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(
        [str(QUARRY), *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, f"quarry {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return proc.stdout


@pytest.mark.parametrize("client_auth", [False, True], ids=["tls", "mtls"])
def test_chart_runs_the_image_under_podman(image, client_auth):
    """TLS on, as the chart defaults (its generated CA and certificate); with mTLS the
    services present their certificate to each other, and the host's CLI presents it too."""
    release = f"pq{os.getpid() % 10000}{int(client_auth)}"
    ports = {name: (free_port(), free_port()) for name in SERVICES}
    work = Path(tempfile.mkdtemp(prefix="quarry-podman-"))
    data = work / "data"
    data.mkdir()
    os.chmod(data, 0o777)  # the pods run as uid 10001
    values = [
        "--set",
        f"localData.hostPath={data}",
        "--set",
        "tls.enabled=true",
        "--set",
        f"tls.clientAuth={str(client_auth).lower()}",
    ]
    for name, key in SERVICES.items():
        grpc_port, metrics_port = ports[name]
        values += ["--set", f"services.{key}.port={grpc_port}"]
        values += ["--set", f"services.{key}.metricsPort={metrics_port}"]
    docs = render(release, values)
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert {c["image"] for d in deployments for c in pod_spec_of(d)["containers"]} == {image}
    secrets, services, bootstrap = for_podman(docs)
    services_file = play_file(work / "services.yaml", services)
    started = time.monotonic()
    try:
        create_secrets(secrets, services + bootstrap)
        podman("kube", "play", str(services_file))

        # Every service answers its own rendered probes (startup/liveness: ServerInfo;
        # readiness: overall SERVING, i.e. its dependencies answer too).
        for name in SERVICES:
            for probe in ("livenessProbe", "readinessProbe"):
                wait_for_probe(docs, name, release, probe)
        ready = time.monotonic() - started

        # The bootstrap Job: creates the admin with the key from the admin Secret, never
        # printing the secret; a second run changes nothing and succeeds.
        admin_secret = f"{release}-admin"
        key_id = secret_value(docs, admin_secret, "QUARRY_ACCESS_KEY_ID")
        secret = secret_value(docs, admin_secret, "QUARRY_SECRET_ACCESS_KEY")
        code, log = run_bootstrap(work, bootstrap, release, 1)
        assert code == 0 and f"created with access key id {key_id}" in log, log
        assert secret not in log
        code, log = run_bootstrap(work, bootstrap, release, 2)
        assert code == 0 and "has an admin already" in log, log
        assert secret not in log

        # The CLI on the host, as an operator with the admin's credentials.
        home = work / "home"
        home.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("QUARRY_", "OTEL_"))}
        env.update(
            QUARRY_HOME=str(home),
            QUARRY_ACCESS_KEY_ID=key_id,
            QUARRY_SECRET_ACCESS_KEY=secret,
            QUARRY_KV_GATEWAY_ADDRESS=f"127.0.0.1:{ports['kv-gateway'][0]}",
            QUARRY_BRANCH_MANAGER_ADDRESS=f"127.0.0.1:{ports['branch-manager'][0]}",
            QUARRY_COMMITTER_ADDRESS=f"127.0.0.1:{ports['committer'][0]}",
        )
        # The services speak TLS only: a plaintext health check gets no answer, and the
        # CLI without the CA cannot connect.
        assert health_status(f"127.0.0.1:{ports['branch-manager'][0]}") is None
        no_ca = subprocess.run(
            [str(QUARRY), "repo", "list"], capture_output=True, text=True, env=env, timeout=120
        )
        assert no_ca.returncode != 0, no_ca.stdout
        tls_secret = f"{release}-tls"
        for key, var in (
            ("ca.crt", "QUARRY_TLS_CA_FILE"),
            *(
                (("tls.crt", "QUARRY_TLS_CERT_FILE"), ("tls.key", "QUARRY_TLS_KEY_FILE"))
                if client_auth
                else ()
            ),
        ):
            path = home / key
            path.write_text(secret_value(docs, tls_secret, key))
            path.chmod(0o600)
            env[var] = str(path)
        if client_auth:  # the servers ask for a client certificate: the CA alone is refused
            no_cert = {
                k: v
                for k, v in env.items()
                if k not in {"QUARRY_TLS_CERT_FILE", "QUARRY_TLS_KEY_FILE"}
            }
            refused = subprocess.run(
                [str(QUARRY), "repo", "list"],
                capture_output=True,
                text=True,
                env=no_cert,
                timeout=120,
            )
            assert refused.returncode != 0, refused.stdout
        mount_path = yaml.safe_load((CHART / "values.yaml").read_text())["localData"]["mountPath"]
        namespace = f"{mount_path}/lake/demo"
        cli(env, "repo", "create", "demo", namespace)
        cli(env, "branch", "create", "demo", "feature", "--source", "main")
        cli(
            env,
            "put",
            "demo",
            "feature",
            "tables/a/part-0.parquet",
            "--address",
            f"{namespace}/data/part-0.parquet",
            "--size",
            "123",
        )
        cli(env, "commit", "demo", "feature", "-m", "add part-0")
        cli(env, "merge", "demo", "feature", "main", "-m", "merge feature")
        messages = [c["message"] for c in json.loads(cli(env, "log", "demo", "main", "--json"))]
        assert messages[:2] == ["merge feature", "add part-0"], messages
        listing = cli(env, "ls", "demo", "main", "tables/a/")
        assert "part-0.parquet" in listing, listing
        # range-writer wrote the commit's ranges into the shared directory, kv-gateway its
        # SQLite file: the pods really used the chart's volumes.
        assert (data / "kv.db").is_file()
        assert any((data / "lake" / "demo").rglob("*")), list((data / "lake").rglob("*"))

        # Auth is on in the pods: a wrong secret is refused.
        bad = dict(env, QUARRY_SECRET_ACCESS_KEY="not-the-secret-0123456789")
        proc = subprocess.run(
            [str(QUARRY), "repo", "list"], capture_output=True, text=True, env=bad, timeout=120
        )
        assert proc.returncode != 0 and "INVALID_CREDENTIALS" in proc.stderr, proc.stderr
        print(
            f"pods ready after {ready:.1f}s; round trip done after {time.monotonic() - started:.1f}s"
        )
    finally:
        podman("kube", "down", str(services_file), check=False)
        for pod in [f"{release}-{name}-pod-0" for name in SERVICES] + [
            f"{release}-bootstrap-{n}" for n in (1, 2)
        ]:
            podman("pod", "rm", "-f", pod, check=False)
        for secret_doc in secrets:
            podman("secret", "rm", secret_doc["metadata"]["name"], check=False)
            podman("volume", "rm", "-f", secret_doc["metadata"]["name"], check=False)
        with contextlib.suppress(OSError):
            shutil.rmtree(work)
