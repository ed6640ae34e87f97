"""Run the Helm chart on this machine with podman: `make kube-up` / `make kube-down`.

    .venv/bin/python deploy/local/kube.py up   [--release R] [--state-dir D] [-f V] [--set K=V]
                                               [--set-string K=V] [--free-ports] [--timeout S]
    .venv/bin/python deploy/local/kube.py down [--release R] [--state-dir D] [same values]

`up` renders deploy/helm/quarry with deploy/local/values.yaml (host network, SQLite and local
storage namespaces in the state directory's `data/`, TLS on with the chart's generated CA),
adapts the rendered objects to what `podman kube play` (Debian bookworm's podman 4.3) can play
(`adapt`: each change says which gap it covers; a cluster needs none of them), creates the
Secrets, plays the Deployments, runs every container's rendered probes in it until they pass
(podman schedules no probes without systemd), then runs the rendered Jobs (the admin
bootstrap) as pods, writes a client configuration for the host's `quarry` CLI and prints the
endpoints. Services, ports and probes are read from the rendered manifests, so a service the
chart adds is picked up without changing this script.

A failed start prints what failed (the failing probe's output, every container's log tail)
and removes everything it created. `up` on a release that is up and healthy changes nothing
but re-runs the Jobs (as `helm upgrade` re-runs its post-upgrade hooks: the bootstrap finds
its admin and does nothing) and prints the endpoints again; a release left half-up is removed
first. `down` removes the pods, Secrets, volumes (and a kube network, should podman have made
one for them) and the state directory; with nothing to remove it succeeds.

Safety rule: `down` (and `up`'s clean-up) removes only podman objects the chart renders for
this release, by their exact names (recorded in the state directory before `up` creates
anything, and re-derived by rendering the chart, so a lost state directory still cleans up):
never another pod, Secret or volume, not even one whose name starts with the release's. It
deletes a state directory only when the directory holds this script's marker file, and the
kube network only when `up` created it and no container uses it.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

# libyaml's C parser when PyYAML has it (the pure-Python one is ~10x slower on a rendering).
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "quarry"
LOCAL_VALUES = REPO / "deploy" / "local" / "values.yaml"
HELM = REPO / ".tools" / "bin" / "helm"
# podman's settings for this kind of host (runc, ulimits), written by `make image`.
CONTAINERS_CONF = REPO / "build" / "image" / "containers.conf"
DEFAULT_STATE_ROOT = REPO / "build" / "kube"
DEFAULT_RELEASE = "quarry"
NAMESPACE = "default"
# The network `podman kube play` creates for its pods when none exists. `up` plays with
# `--network host`, so podman 4.3 creates none; should another podman create it anyway,
# `down` removes it when `up` created it (and no container uses it).
KUBE_NETWORK = "podman-default-kube-network"
MARKER = ".quarry-kube-state"
STATE_FILE = "state.json"
RENDERED_FILE = "rendered.yaml"
LOG_TAIL = 40
# Seconds a Job's pod may run (the chart's bootstrap.activeDeadlineSeconds default).
JOB_TIMEOUT = 900
# Probe kinds, in the order a kubelet applies them, and the handlers `run_probe` runs.
PROBES = ("startupProbe", "livenessProbe", "readinessProbe")
PROBE_HANDLERS = ("exec", "httpGet", "grpc", "tcpSocket")
PROBE_INTERVAL = 0.5
# Container states of a container that is starting or running (not exited, not stopped).
RUNNING = frozenset({"running", "created", "configured", "initialized"})


class KubeError(Exception):
    """A failure `up`/`down` reports to the user (no traceback)."""


# ---------------------------------------------------------------------------------------------
# podman and helm


def podman_env() -> dict[str, str]:
    env = dict(os.environ)
    if CONTAINERS_CONF.is_file():
        env["CONTAINERS_CONF"] = str(CONTAINERS_CONF)
    return env


def podman(
    *args: str, check: bool = True, stdin: bytes | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[bytes]:
    try:
        proc = subprocess.run(
            ["podman", *args], capture_output=True, env=podman_env(), input=stdin, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise KubeError(f"podman {' '.join(args)} did not finish in {timeout:g}s") from None
    if check and proc.returncode != 0:
        raise KubeError(
            f"podman {' '.join(args)} failed ({proc.returncode}):\n"
            f"{proc.stdout.decode(errors='replace')}{proc.stderr.decode(errors='replace')}"
        )
    return proc


def podman_names(*args: str) -> set[str]:
    """The names `podman <args>` lists (pod ps, secret ls, volume ls, network ls); a Go
    template, since podman 4.3's `secret ls --format json` prints no JSON."""
    proc = podman(*args, "--format", "{{.Name}}", check=False)
    if proc.returncode != 0:
        raise KubeError(f"podman {' '.join(args)}: {proc.stderr.decode(errors='replace')}")
    return {line.strip() for line in proc.stdout.decode().splitlines() if line.strip()}


def render(release: str, value_args: list[str]) -> list[dict[str, Any]]:
    """`helm template` of the chart (no cluster: helm never sees a kube config)."""
    if not HELM.is_file():
        raise KubeError(f"helm is not installed at {HELM}: run `make tools`")
    proc = subprocess.run(
        [str(HELM), "template", release, str(CHART), "--namespace", NAMESPACE, *value_args],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(REPO / ".tools"),
            "KUBECONFIG": os.devnull,
        },
    )
    if proc.returncode != 0:
        raise KubeError(f"helm template failed:\n{proc.stderr}")
    return [doc for doc in yaml.load_all(proc.stdout, Loader=YAML_LOADER) if doc]


# ---------------------------------------------------------------------------------------------
# The rendered chart, adapted for podman 4.3


def pod_spec_of(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
    return spec


def pod_names(doc: dict[str, Any]) -> list[str]:
    """The pods `podman kube play` makes of a played object: a Deployment's are
    `<name>-pod-<i>`, a Pod keeps its name."""
    name = doc["metadata"]["name"]
    if doc["kind"] == "Deployment":
        return [f"{name}-pod-{i}" for i in range(int(doc["spec"].get("replicas", 1) or 1))]
    return [name]


@dataclass
class Endpoint:
    component: str
    port_name: str
    port: int


@dataclass
class Adapted:
    """What `podman kube play` plays: the ConfigMaps, the Deployments, the Jobs as Pods (run
    after the services are healthy, in hook-weight order), and the Secrets (created with
    `podman secret create` in the form each use needs; `secret_payload`)."""

    configmaps: list[dict[str, Any]]
    deployments: list[dict[str, Any]]
    jobs: list[dict[str, Any]]
    secrets: list[dict[str, Any]]
    mounted_secrets: set[str]

    def pods(self) -> list[str]:
        return [p for doc in self.deployments + self.jobs for p in pod_names(doc)]

    def volumes(self) -> list[str]:
        """Named volumes podman makes: one per emptyDir (renamed per pod by `adapt`) and one
        per mounted Secret (named after the Secret; it outlives `podman kube down`)."""
        names = [
            v["name"]
            for doc in self.deployments + self.jobs
            for v in pod_spec_of(doc).get("volumes", [])
            if "emptyDir" in v
        ]
        return sorted(set(names) | self.mounted_secrets)


def adapt(docs: list[dict[str, Any]]) -> Adapted:
    """The rendered objects, adapted to podman 4.3's gaps; each change says which. Services,
    ServiceAccounts, NetworkPolicies, PodDisruptionBudgets, HPAs and CronJobs are not played
    (podman has none of them; the pods share the host's network instead of Services)."""
    configmaps = [copy.deepcopy(d) for d in docs if d["kind"] == "ConfigMap"]
    secrets = [copy.deepcopy(d) for d in docs if d["kind"] == "Secret"]
    deployments = [copy.deepcopy(d) for d in docs if d["kind"] == "Deployment"]
    jobs = []
    for doc in sorted(
        (d for d in docs if d["kind"] == "Job"),
        key=lambda d: int((d["metadata"].get("annotations") or {}).get("helm.sh/hook-weight", "0")),
    ):
        # podman 4.3 plays no Jobs: the Job's pod template as a Pod of the Job's name.
        template = copy.deepcopy(doc["spec"]["template"])
        jobs.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {**template.get("metadata", {}), "name": doc["metadata"]["name"]},
                "spec": template["spec"],
            }
        )
    for doc in deployments + jobs:
        pod = pod_spec_of(doc)
        name = doc["metadata"]["name"]
        for container in pod["containers"]:
            # Host network: podman 4.3 turns containerPorts into port mappings, which host
            # networking refuses (they only document the ports of a host-network pod).
            container.pop("ports", None)
            for entry in container.get("env", []):
                ref = entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                if ref == "metadata.namespace":  # podman 4.3 resolves metadata.name only
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
    mounted = {
        v["secret"]["secretName"]
        for doc in deployments + jobs
        for v in pod_spec_of(doc).get("volumes", [])
        if "secret" in v
    }
    return Adapted(configmaps, deployments, jobs, secrets, mounted)


def secret_payload(secret: dict[str, Any], mounted: bool) -> bytes:
    """What `podman secret create` gets for a rendered Secret. podman 4.3 stores a played
    Secret in a form its own secretKeyRef lookup cannot read ("is not valid JSON"), and reads
    the two uses differently: an env secretKeyRef wants the Secret's data as a JSON map
    (base64 values), a secret volume wants a Secret object whose data values it writes
    verbatim (so decoded). The chart uses no Secret both ways."""
    data = dict(secret.get("data") or {})
    for key, value in (secret.get("stringData") or {}).items():
        data[key] = base64.b64encode(value.encode()).decode()
    if mounted:
        decoded = {k: base64.b64decode(v).decode() for k, v in data.items()}
        content: Any = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret["metadata"]["name"]},
            "data": decoded,
        }
    else:
        content = data
    return json.dumps(content).encode()


def endpoints(docs: list[dict[str, Any]]) -> list[Endpoint]:
    """Every container port of every rendered Deployment (the pods use the host's network, so
    each is 127.0.0.1:<port>)."""
    found = []
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        labels = doc["metadata"].get("labels", {})
        component = labels.get("app.kubernetes.io/component", doc["metadata"]["name"])
        for container in pod_spec_of(doc)["containers"]:
            for port in container.get("ports", []):
                found.append(
                    Endpoint(component, port.get("name", "port"), int(port["containerPort"]))
                )
    return found


def secret_value(docs: list[dict[str, Any]], name: str, key: str) -> str | None:
    for doc in docs:
        if doc["kind"] == "Secret" and doc["metadata"]["name"] == name:
            if key in (doc.get("stringData") or {}):
                return str(doc["stringData"][key])
            if key in (doc.get("data") or {}):
                return base64.b64decode(doc["data"][key]).decode()
    return None


def configmap_value(docs: list[dict[str, Any]], key: str) -> str | None:
    for doc in docs:
        if doc["kind"] == "ConfigMap" and key in (doc.get("data") or {}):
            return str(doc["data"][key])
    return None


def file_in_pods(docs: list[dict[str, Any]], path: str) -> str | None:
    """The content of the file at `path` in the pods when a rendered Secret volume provides it
    (e.g. the TLS CA the ConfigMap's QUARRY_TLS_CA_FILE names)."""
    directory, _, key = path.rpartition("/")
    for doc in docs:
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        spec = pod_spec_of(doc)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in spec["containers"]:
            for mount in container.get("volumeMounts", []):
                volume = volumes.get(mount["name"], {})
                if mount["mountPath"].rstrip("/") == directory and "secret" in volume:
                    return secret_value(docs, volume["secret"]["secretName"], key)
    return None


def env_secret_ref(doc: dict[str, Any], name: str) -> tuple[str, str] | None:
    for container in pod_spec_of(doc)["containers"]:
        for entry in container.get("env", []):
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if entry["name"] == name and ref:
                return ref["name"], ref["key"]
    return None


# ---------------------------------------------------------------------------------------------
# Probes: what a kubelet would run, run by us


def container_name(pod: str, container: str) -> str:
    return f"{pod}-{container}"


def named_port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for entry in container.get("ports", []):
        if entry.get("name") == port:
            return int(entry["containerPort"])
    raise KubeError(f"probe port {port!r} is not a port of container {container['name']}")


def run_probe(name: str, container: dict[str, Any], probe: dict[str, Any]) -> tuple[bool, str]:
    """One probe of a container (host network: its ports are the host's); (passed, output)."""
    timeout = float(probe.get("timeoutSeconds", 1))
    if "exec" in probe:
        # `podman exec` itself takes seconds on a busy host: its share is not the probe's.
        try:
            proc = podman(
                "exec", name, *probe["exec"]["command"], check=False, timeout=timeout + 60
            )
        except KubeError as exc:  # timed out: a failed probe, as for a kubelet
            return False, str(exc)
        return proc.returncode == 0, (proc.stdout + proc.stderr).decode(errors="replace")
    if "httpGet" in probe:
        get = probe["httpGet"]
        scheme = get.get("scheme", "HTTP").lower()
        url = f"{scheme}://127.0.0.1:{named_port(container, get['port'])}{get.get('path', '/')}"
        # A kubelet does not verify an HTTPS probe's certificate either.
        context = ssl._create_unverified_context() if scheme == "https" else None
        try:
            with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
                return 200 <= response.status < 400, f"{url}: HTTP {response.status}"
        except OSError as exc:
            return False, f"{url}: {exc}"
    if "tcpSocket" in probe:
        port = named_port(container, probe["tcpSocket"]["port"])
        try:
            socket.create_connection(("127.0.0.1", port), timeout=timeout).close()
            return True, ""
        except OSError as exc:
            return False, f"127.0.0.1:{port}: {exc}"
    if "grpc" in probe:  # Kubernetes' native gRPC probe: plaintext grpc.health.v1
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        target = f"127.0.0.1:{int(probe['grpc']['port'])}"
        request = health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", ""))
        with grpc.insecure_channel(target) as channel:
            try:
                status = health_pb2_grpc.HealthStub(channel).Check(request, timeout=timeout).status
            except grpc.RpcError as exc:
                return False, f"{target}: {exc.code().name}"
        return status == health_pb2.HealthCheckResponse.SERVING, f"{target}: status {status}"
    raise KubeError(f"{name}: a probe of no kind this script runs: {sorted(probe)}")


def container_state(name: str) -> tuple[str, int]:
    proc = podman("inspect", "--format", "{{.State.Status}} {{.RestartCount}}", name, check=False)
    if proc.returncode != 0:
        return "missing", 0
    status, _, restarts = proc.stdout.decode().strip().partition(" ")
    return status, int(restarts or 0)


def logs(name: str, lines: int = LOG_TAIL) -> str:
    proc = podman("logs", "--tail", str(lines), name, check=False)
    return (proc.stdout + proc.stderr).decode(errors="replace")


@dataclass(frozen=True)
class ServiceContainer:
    """A played service container: its podman name and its rendered spec (probes resolve
    named ports against the rendered container; the adapted one lost its ports)."""

    name: str
    spec: dict[str, Any]

    def probes(self) -> list[tuple[str, dict[str, Any]]]:
        """(kind, probe) in a kubelet's order, each distinct check once (the chart's startup
        and liveness probes ask the same question)."""
        found: list[tuple[str, dict[str, Any]]] = []
        seen: list[dict[str, Any]] = []
        for kind in PROBES:
            probe = self.spec.get(kind) or {}
            handler = {k: v for k, v in probe.items() if k in PROBE_HANDLERS}
            if handler and handler not in seen:
                seen.append(handler)
                found.append((kind, probe))
        return found


def service_containers(adapted: Adapted, rendered: list[dict[str, Any]]) -> list[ServiceContainer]:
    """Every container of every Deployment's first pod."""
    by_name = {d["metadata"]["name"]: d for d in rendered if d["kind"] == "Deployment"}
    return [
        ServiceContainer(container_name(pod_names(doc)[0], container["name"]), container)
        for doc in adapted.deployments
        for container in pod_spec_of(by_name[doc["metadata"]["name"]])["containers"]
    ]


def wait_healthy(
    containers: list[ServiceContainer],
    timeout: float,
    log: Callable[[str], None],
    fresh: bool = True,
) -> None:
    """Every container's rendered probes pass, run the way a kubelet runs them; the
    containers are probed side by side. Fails at once when a container exits or restarts
    (podman restarts a crashed Deployment container: it would crash-loop): any restart of a
    `fresh` start, a new one of a running release."""
    deadline = time.monotonic() + timeout
    failed = threading.Event()

    def wait_one(container: ServiceContainer) -> None:
        allowed = 0 if fresh else container_state(container.name)[1]
        for kind, probe in container.probes():
            while not failed.is_set():
                status, restarts = container_state(container.name)
                if status not in RUNNING or restarts > allowed:
                    raise KubeError(
                        f"{container.name} crashed ({status}, {restarts} restarts) before "
                        f"its {kind} passed (its log is above)"
                    )
                passed, output = run_probe(container.name, container.spec, probe)
                if passed:
                    log(f"  {container.name}: {kind} passed")
                    break
                if time.monotonic() > deadline:
                    raise KubeError(
                        f"{container.name}: {kind} still failing after {timeout:g}s: "
                        f"{output.strip()}"
                    )
                time.sleep(PROBE_INTERVAL)

    with ThreadPoolExecutor(max_workers=max(1, len(containers))) as pool:
        futures = [pool.submit(wait_one, c) for c in containers]
        for future in as_completed(futures):
            if future.exception() is not None:
                failed.set()  # the others stop at their next check
                raise future.exception()  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# State: what `up` created, recorded before it creates anything


@dataclass
class State:
    """What `up` creates, saved in the state directory before it creates anything."""

    release: str
    directory: Path
    args: list[str] = field(default_factory=list)
    pods: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    network_created: bool = False
    up: bool = False  # the start finished

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def save(self) -> None:
        doc = {k: v for k, v in asdict(self).items() if k != "directory"}
        write_private(self.directory / STATE_FILE, json.dumps(doc, indent=2) + "\n")

    @classmethod
    def load(cls, release: str, directory: Path) -> State | None:
        try:
            doc = json.loads((directory / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        known = {f.name for f in fields(cls)} - {"release", "directory"}
        return cls(release, directory, **{k: v for k, v in doc.items() if k in known})


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by the owner only from the first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(temporary, path)


def prepare_state_dir(directory: Path) -> None:
    """Create the state directory (0700: it holds the rendered Secrets and the admin's
    credentials), or adopt one this script made; refuse any other non-empty directory."""
    if directory.exists() and not (directory / MARKER).exists() and any(directory.iterdir()):
        raise KubeError(
            f"{directory} exists and is not a state directory of this script (no {MARKER}): "
            "choose another --state-dir"
        )
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    (directory / MARKER).touch()


def remove_tree(path: Path) -> None:
    """Remove a directory the pods wrote into. Rootless podman maps the pods' user to a
    subordinate uid the caller cannot delete as: then through `podman unshare`."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return
    except PermissionError:
        podman("unshare", "rm", "-rf", str(path))


# ---------------------------------------------------------------------------------------------
# up and down


@dataclass
class Options:
    release: str
    state_dir: Path
    values: list[str]  # helm arguments: -f FILE / --set K=V, in the order given
    free_ports: bool = False
    timeout: float = 180.0


def value_args(options: Options, data: Path, extra: Iterable[str] = ()) -> list[str]:
    """helm's value arguments: the local values, the data directory (mounted at the same path
    in the pods as on the host, so a storage namespace names the same directory for the
    host's CLI (`quarry put --from`, `quarry cat`) and for the pods), then the caller's."""
    return [
        "-f",
        str(LOCAL_VALUES),
        "--set",
        f"localData.hostPath={data}",
        "--set",
        f"localData.mountPath={data}",
        *extra,
        *options.values,
    ]


def free_port_values() -> list[str]:
    """--set services.<key>.<port>=<free port> for every port value of every service in the
    chart's values.yaml (a service the chart adds is covered). The ports come from
    quarry.ports: below the kernel's ephemeral range, so no client socket takes one before
    its pod binds it, and held (a record lock) while this process runs, so no test or other
    `--free-ports` run picks one meanwhile."""
    from quarry.ports import free_ports

    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    wanted = [
        f"services.{key}.{name}"
        for key, settings in (chart_values.get("services") or {}).items()
        for name, value in (settings or {}).items()
        if (name == "port" or name.endswith("Port")) and isinstance(value, int)
    ]
    args = []
    for value, port in zip(wanted, free_ports(len(wanted)), strict=True):
        args += ["--set", f"{value}={port}"]
    return args


def ports_in_use(found: list[Endpoint]) -> list[str]:
    busy = []
    for endpoint in found:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", endpoint.port))
            except OSError:
                busy.append(f"{endpoint.port} ({endpoint.component} {endpoint.port_name})")
    return busy


POD_REMOVAL_ATTEMPTS = 4


def remove_objects(
    state: State, extra: Adapted | None, log: Callable[[str], None], stop_seconds: int = 10
) -> tuple[int, list[str]]:
    """Remove the release's pods, Secrets and volumes by exact name (the recorded ones and,
    when given, the ones a fresh rendering names); (how many were removed, the names of
    those still there after). The pods get `stop_seconds` to stop after SIGTERM."""
    pods, secrets, volumes = set(state.pods), set(state.secrets), set(state.volumes)
    if extra is not None:
        pods |= set(extra.pods())
        secrets |= {s["metadata"]["name"] for s in extra.secrets}
        volumes |= set(extra.volumes())
    existing_pods = podman_names("pod", "ps") & pods
    existing_secrets = podman_names("secret", "ls") & secrets
    existing_volumes = podman_names("volume", "ls") & volumes
    # A crash-looping container being restarted while its pod is removed can make podman
    # skip that pod ("container state improper"): remove what is left again, a few times.
    remaining = existing_pods
    for attempt in range(POD_REMOVAL_ATTEMPTS):
        if not remaining:
            break
        if attempt:
            time.sleep(1)
        podman(
            "pod",
            "rm",
            "--force",
            "--ignore",
            "--time",
            str(stop_seconds),
            *sorted(remaining),
            check=False,
            timeout=300,
        )
        remaining = podman_names("pod", "ps") & remaining
    if existing_secrets:
        podman("secret", "rm", *sorted(existing_secrets), check=False)
    if existing_volumes:  # after the pods: a volume in use cannot be removed
        podman("volume", "rm", "-f", *sorted(existing_volumes), check=False)
    if existing_pods or existing_secrets or existing_volumes:
        log(
            f"removed {len(existing_pods)} pods, {len(existing_secrets)} secrets, "
            f"{len(existing_volumes)} volumes of release {state.release}"
        )
    # Only a network `up` created, and never one a container still uses (no -f).
    if (
        state.network_created
        and KUBE_NETWORK in podman_names("network", "ls")
        and podman("network", "rm", KUBE_NETWORK, check=False).returncode == 0
    ):
        log(f"removed network {KUBE_NETWORK}")
        state.network_created = False
    left = sorted(
        (podman_names("pod", "ps") & pods)
        | (podman_names("secret", "ls") & secrets)
        | (podman_names("volume", "ls") & volumes)
    )
    return len(existing_pods) + len(existing_secrets) + len(existing_volumes), left


def down(options: Options, log: Callable[[str], None], stop_seconds: int = 10) -> int:
    """Remove the release (see the module's safety rule). The pods get `stop_seconds` after
    SIGTERM (the services drain in-flight calls); a failed start passes 0."""
    directory = options.state_dir
    state = State.load(options.release, directory) or State(options.release, directory)
    derived: Adapted | None = None
    if shutil.which("podman") is None:
        log("podman is not installed: no pod, secret or volume to remove")
    else:
        try:
            derived = adapt(render(options.release, value_args(options, state.data)))
        except KubeError as exc:  # e.g. a values file that is gone: the recorded names remain
            log(f"(could not render the chart to derive names: {exc}; using the recorded ones)")
        removed, left = remove_objects(state, derived, log, stop_seconds)
        if left:
            raise KubeError(f"still there after removal: {', '.join(left)}")
        if not removed:
            log(f"no pod, secret or volume of release {options.release} to remove")
    if (directory / MARKER).exists():
        remove_tree(directory)
        log(f"removed {directory}")
    elif directory.exists():
        log(f"kept {directory}: not a state directory of this script (no {MARKER})")
    log(f"release {options.release} is down")
    return 0


def client_config(state: State, docs: list[dict[str, Any]]) -> dict[str, str]:
    """The host CLI's settings (a TOML file for QUARRY_CONFIG_FILE): QUARRY_HOME with the
    admin's credentials, every service's address, and the TLS files the pods use."""
    from quarry.client.credentials import Credentials, write_credentials
    from quarry.config import describe_settings

    known = {s.name for s in describe_settings()}
    home = state.directory / "home"
    settings: dict[str, str] = {"home": str(home)}
    for endpoint in endpoints(docs):
        setting = f"{endpoint.component.replace('-', '_')}_address"
        # gRPC services, and the S3 gateway's HTTP(S) port (s3_gateway_address).
        if endpoint.port_name in ("grpc", "http") and setting in known:
            settings[setting] = f"127.0.0.1:{endpoint.port}"
    files = {"tls_ca_file": "QUARRY_TLS_CA_FILE"}
    if configmap_value(docs, "QUARRY_TLS_CLIENT_AUTH") == "true":  # mTLS: present the cert
        files |= {"tls_cert_file": "QUARRY_TLS_CERT_FILE", "tls_key_file": "QUARRY_TLS_KEY_FILE"}
    for setting, variable in files.items():
        in_pods = configmap_value(docs, variable)
        content = file_in_pods(docs, in_pods) if in_pods else None
        if content is not None:
            path = state.directory / "tls" / Path(in_pods or "").name
            write_private(path, content)
            settings[setting] = str(path)
    for job in docs:
        if job["kind"] != "Job":
            continue
        key_ref = env_secret_ref(job, "QUARRY_BOOTSTRAP_ACCESS_KEY_ID")
        secret_ref = env_secret_ref(job, "QUARRY_BOOTSTRAP_SECRET_ACCESS_KEY")
        if key_ref and secret_ref:
            key_id = secret_value(docs, *key_ref)
            secret = secret_value(docs, *secret_ref)
            if key_id and secret:
                write_credentials(Credentials(key_id, secret), home)
    # A JSON string is a TOML basic string (the same quotes and escapes).
    lines = [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    write_private(state.directory / "quarry.toml", "\n".join(lines) + "\n")
    return settings


def run_job(
    state: State, adapted: Adapted, pod: dict[str, Any], log: Callable[[str], None]
) -> None:
    """Play one Job's pod, wait until its containers exit; KubeError unless all exited 0."""
    path = state.directory / f"job-{pod['metadata']['name']}.yaml"
    write_private(path, yaml.safe_dump_all([*adapted.configmaps, pod]))
    podman("kube", "play", "--network", "host", str(path))
    names = [
        container_name(pod["metadata"]["name"], c["name"]) for c in pod_spec_of(pod)["containers"]
    ]
    try:
        deadline = time.monotonic() + JOB_TIMEOUT
        for name in names:
            while container_state(name)[0] not in ("exited", "stopped", "missing"):
                if time.monotonic() > deadline:
                    raise KubeError(f"{name} has not finished after {JOB_TIMEOUT}s")
                time.sleep(0.5)
            code = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.decode()
            output = logs(name).strip()
            log(f"  {name}: exit {code.strip()}: {output}")
            if code.strip() != "0":
                raise KubeError(f"job {pod['metadata']['name']} failed (exit {code.strip()})")
    finally:
        podman("kube", "down", str(path), check=False)
        podman("pod", "rm", "-f", "--ignore", pod["metadata"]["name"], check=False)
        for volume in pod_spec_of(pod).get("volumes", []):
            if "emptyDir" in volume:
                podman("volume", "rm", "-f", volume["name"], check=False)
        path.unlink(missing_ok=True)


# What an HTTP service's URL is for, in the endpoints kube-up prints.
HTTP_LABELS = {"s3-gateway": "s3", "console": "browser"}


def print_endpoints(state: State, docs: list[dict[str, Any]], settings: dict[str, str]) -> None:
    found = endpoints(docs)
    tls = configmap_value(docs, "QUARRY_TLS_CERT_FILE") is not None
    mtls = configmap_value(docs, "QUARRY_TLS_CLIENT_AUTH") == "true"
    print(f"\nQuarry is up under podman: release {state.release}, state in {state.directory}")
    width = max((len(e.component) for e in found), default=0)
    for component in dict.fromkeys(e.component for e in found):
        ports = "  ".join(
            f"{e.port_name} http://127.0.0.1:{e.port}/metrics"
            if e.port_name == "metrics"
            else f"{HTTP_LABELS.get(e.component, 'http')} {'https' if tls else 'http'}"
            f"://127.0.0.1:{e.port}"
            if e.port_name == "http"  # the S3 gateway's endpoint URL, the console's address
            else f"{e.port_name} 127.0.0.1:{e.port}"
            for e in found
            if e.component == component
        )
        print(f"  {component:<{width}}  {ports}")
    transport = (
        "gRPC, S3 and the console over TLS" if tls else "gRPC, S3 and the console in plaintext"
    )
    if mtls:
        transport += " with client certificates (mTLS)"
    print(f"  ({transport}; every pod runs in the host's network)")
    credentials = Path(settings["home"]) / "credentials.json"
    if credentials.exists():
        print(f"Admin credentials: {credentials}")
    config = state.directory / "quarry.toml"
    print(f"CLI settings (addresses, TLS CA, QUARRY_HOME with those credentials): {config}")
    print(f"  export QUARRY_CONFIG_FILE={config}")
    print("  quarry repo list")
    print(f"Storage namespaces go under {state.data}/lake/ (the pods see the same path):")
    print(f"  quarry repo create demo {state.data}/lake/demo")
    branch_manager = settings.get("branch_manager_address")
    if branch_manager:
        flags = "-plaintext"
        if tls:
            flags = f"-cacert {settings.get('tls_ca_file')}"
            if mtls:
                flags += (
                    f" -cert {settings.get('tls_cert_file')} -key {settings.get('tls_key_file')}"
                )
        print(f"  grpcurl {flags} {branch_manager} list")
    gateway = settings.get("s3_gateway_address")
    if gateway:
        ca = f" --ca-bundle {settings.get('tls_ca_file')}" if tls else ""
        print(
            "S3 through the gateway, with credentials from `quarry auth credentials create admin`:"
        )
        print(
            f"  aws --endpoint-url {'https' if tls else 'http'}://{gateway}{ca} s3 ls s3://demo/main/"
        )
    down = "make kube-down"
    if state.release != DEFAULT_RELEASE or state.directory != DEFAULT_STATE_ROOT / state.release:
        down += f' KUBE_ARGS="--release {state.release} --state-dir {state.directory}"'
    print(f"Stop and remove everything (pods, secrets, volumes, this state directory): {down}")


def is_up(state: State, adapted: Adapted) -> bool:
    """The release's start finished and every service pod is still running (after a reboot
    podman keeps the pods, stopped)."""
    proc = podman("pod", "ps", "--format", "{{.Name}} {{.Status}}")
    status = dict(line.split(" ", 1) for line in proc.stdout.decode().splitlines() if " " in line)
    return state.up and all(
        status.get(p) == "Running" for d in adapted.deployments for p in pod_names(d)
    )


def up(options: Options, log: Callable[[str], None]) -> int:
    directory = options.state_dir
    if shutil.which("podman") is None:
        raise KubeError("podman is not installed: run `make image-tools` (apt-get)")
    prepare_state_dir(directory)
    previous = State.load(options.release, directory)
    if previous is not None and previous.up:
        docs = list(yaml.load_all((directory / RENDERED_FILE).read_text(), Loader=YAML_LOADER))
        adapted = adapt(docs)
        if is_up(previous, adapted):
            return already_up(options, previous, docs, adapted, log)
        log(f"release {options.release} is half up (an interrupted start?): removing it first")
        down(options, log)
        prepare_state_dir(directory)
        previous = None
    state = previous or State(options.release, directory)
    state.args = list(options.values)
    state.data.mkdir(exist_ok=True)
    state.data.chmod(0o777)  # the pods run as the chart's uid (10001)
    extra = free_port_values() if options.free_ports else []
    docs = render(options.release, value_args(options, state.data, extra))
    adapted = adapt(docs)
    # Leftovers of an earlier run whose state is lost would break this one: remove them.
    _, left = remove_objects(state, adapted, log)
    if left:
        raise KubeError(f"could not remove leftovers: {', '.join(left)}")
    busy = ports_in_use(endpoints(docs))
    if busy:
        raise KubeError(
            f"port in use: {', '.join(busy)}. Stop what listens there (`quarry up`?), or "
            "run with --free-ports (make kube-up KUBE_ARGS=--free-ports)"
        )
    images = {
        c["image"] for d in adapted.deployments + adapted.jobs for c in pod_spec_of(d)["containers"]
    }
    for image in sorted(images):
        if podman("image", "exists", image, check=False).returncode != 0:
            raise KubeError(f"image {image} is not here: run `make image` (make kube-up does)")
    # Record every name before creating anything: a failure at any point cleans up fully.
    state.pods = adapted.pods()
    state.secrets = [s["metadata"]["name"] for s in adapted.secrets]
    state.volumes = adapted.volumes()
    state.network_created = KUBE_NETWORK not in podman_names("network", "ls")
    state.save()
    write_private(directory / RENDERED_FILE, yaml.safe_dump_all(docs))
    try:
        start(state, docs, adapted, options, log)
    except BaseException as exc:  # also Ctrl-C: nothing stays behind
        if isinstance(exc, KubeError):
            report_failure(adapted, docs, log)
            log(f"start failed: {exc}")
        else:
            log(f"start interrupted ({exc!r})")
        log("cleaning up")
        down(options, log, stop_seconds=0)  # nothing to drain: kill at once
        if isinstance(exc, KubeError):
            raise KubeError(
                f"release {options.release} did not start; everything it created is removed"
            ) from None
        raise
    return 0


def start(
    state: State,
    docs: list[dict[str, Any]],
    adapted: Adapted,
    options: Options,
    log: Callable[[str], None],
) -> None:
    started = time.monotonic()
    for secret in adapted.secrets:
        name = secret["metadata"]["name"]
        podman(
            "secret",
            "create",
            name,
            "-",
            stdin=secret_payload(secret, name in adapted.mounted_secrets),
        )
    services_file = state.directory / "services.yaml"
    write_private(services_file, yaml.safe_dump_all([*adapted.configmaps, *adapted.deployments]))
    log(f"playing {len(adapted.deployments)} deployments (release {state.release})")
    # Created first, started after: for every pod it plays, podman 4.3 re-creates (truncates,
    # then writes) the files of each Secret and ConfigMap volume the pod mounts — one volume
    # shared by all pods — and starts that pod at once. A pod started while later pods were
    # still being played could read its TLS certificate mid-rewrite (a fresh-clone run saw
    # the kv-gateway refuse it as "not a PEM certificate" and restart). With --start=false
    # every file is written before any container runs.
    podman("kube", "play", "--start=false", "--network", "host", str(services_file))
    podman("pod", "start", *[p for d in adapted.deployments for p in pod_names(d)])
    wait_healthy(service_containers(adapted, docs), options.timeout, log)
    log(f"all services healthy after {time.monotonic() - started:.1f}s")
    for pod in adapted.jobs:
        run_job(state, adapted, pod, log)
    settings = client_config(state, docs)
    state.up = True
    state.save()
    print_endpoints(state, docs, settings)


def report_failure(
    adapted: Adapted, docs: list[dict[str, Any]], log: Callable[[str], None]
) -> None:
    """Every service container's state and log tail, so a failure explains itself."""
    for container in service_containers(adapted, docs):
        name = container.name
        status, restarts = container_state(name)
        if status == "missing":
            continue
        log(f"--- {name}: {status}, restarts {restarts}; last {LOG_TAIL} log lines ---")
        log(logs(name).rstrip())


def already_up(
    options: Options,
    state: State,
    docs: list[dict[str, Any]],
    adapted: Adapted,
    log: Callable[[str], None],
) -> int:
    if options.values and options.values != state.args:
        log(
            f"note: release {options.release} is up with other values "
            f"({' '.join(state.args) or 'none'}): `make kube-down` first to apply new ones"
        )
    log(f"release {options.release} is up already: checking health, re-running its jobs")
    try:
        wait_healthy(service_containers(adapted, docs), options.timeout, log, fresh=False)
        for pod in adapted.jobs:
            run_job(state, adapted, pod, log)
    except KubeError as exc:
        report_failure(adapted, docs, log)
        raise KubeError(
            f"{exc}\nrelease {options.release} is up but not healthy: `make kube-down` and "
            "`make kube-up` start it afresh (kube-down deletes its data)"
        ) from None
    settings = client_config(state, docs)
    print_endpoints(state, docs, settings)
    return 0


def parse(argv: list[str]) -> tuple[str, Options]:
    parser = argparse.ArgumentParser(
        prog="kube.py", description="Run the Helm chart locally under podman (docs/deploy.md)."
    )
    parser.add_argument("command", choices=("up", "down"))
    parser.add_argument("--release", default=DEFAULT_RELEASE, help="release name (default: quarry)")
    parser.add_argument("--state-dir", type=Path, help="default: build/kube/<release>")
    # helm's value arguments, kept in the order given (later wins).
    for flags, make, metavar, help_text in (
        (("-f", "--values"), lambda v: ("-f", str(Path(v).absolute())), "FILE", "values file"),
        (("--set",), lambda v: ("--set", v), "KEY=VALUE", "a value"),
        (("--set-string",), lambda v: ("--set-string", v), "KEY=VALUE", "a string value"),
    ):
        parser.add_argument(
            *flags,
            dest="values",
            action="append",
            default=[],
            type=make,
            metavar=metavar,
            help=f"{help_text}, passed to helm (repeatable)",
        )
    parser.add_argument("--free-ports", action="store_true", help="give every service free ports")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for health")
    args = parser.parse_args(argv)
    values = [part for pair in args.values for part in pair]
    state_dir = (args.state_dir or DEFAULT_STATE_ROOT / args.release).absolute()
    return args.command, Options(args.release, state_dir, values, args.free_ports, args.timeout)


def main(argv: list[str] | None = None) -> int:
    command, options = parse(sys.argv[1:] if argv is None else argv)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        return up(options, log) if command == "up" else down(options, log)
    except KubeError as exc:
        log(f"kube {command}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
