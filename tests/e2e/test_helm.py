"""End-to-end checks of the Helm chart in deploy/helm/quarry.

Runs the real helm binary (unpacked by `make tools` into .tools/bin/helm): `helm lint --strict`,
`helm template` with default and non-default values, and validates every rendered object
against the Kubernetes OpenAPI schemas bundled with kubernetes-validate (strict mode: unknown
fields are errors). The chart invariants checked here are the deployment contract of
docs/architecture.md §8: one Deployment + Service per service, gRPC health probes, config via
values, and only kv-gateway gets the DynamoDB table and its credentials.

A missing helm binary is a FAILURE (run `make tools`), never a skip.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import functools
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from support import k8s_validation as kubernetes_validate
from support.yaml_docs import documents

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "quarry"
HELM = REPO / ".tools" / "bin" / "helm"
RELEASE = "qa"
NAMESPACE = "quarry-test"

# name -> (values key, serving port, metrics port, default replicas); order = quarry.config.SERVICES
GRPC_SERVICES = {
    "kv-gateway": ("kvGateway", 7401, 9401, 2),
    "branch-manager": ("branchManager", 7402, 9402, 2),
    "committer": ("committer", 7403, 9403, 2),
    "compactor-sensor": ("compactorSensor", 7404, 9404, 1),
    "range-writer": ("rangeWriter", 7405, 9405, 2),
}
# The S3 gateway: an HTTP(S) service (the S3 API) on a port named "http".
S3_GATEWAY = "s3-gateway"
# The web console: HTTP(S) too, one replica (its sessions live in the pod's memory).
CONSOLE = "console"
HTTP_SERVICES = {S3_GATEWAY, CONSOLE}
SERVICES = {
    **GRPC_SERVICES,
    S3_GATEWAY: ("s3Gateway", 7406, 9406, 2),
    CONSOLE: ("console", 7407, 9407, 1),
}
# committer: it reads the action files of a commit or merge from their ranges; the console
# reads object bytes for downloads and previews.
OBJECT_STORE_USERS = {"range-writer", "branch-manager", "committer", S3_GATEWAY, CONSOLE}
GC = "gc"  # component (and name suffix) of the optional garbage-collection CronJob
GC_DEFAULT_OPTIONS = ["--grace-hours", "6", "--ephemeral-ttl-hours", "24", "--master", "local[*]"]

CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text())
APP_VERSION = str(CHART_META["appVersion"])
CHART_LABEL = f"{CHART_META['name']}-{CHART_META['version']}"

# Oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest bundled schema.
K8S_FLOOR = "1.27"
K8S_LATEST = kubernetes_validate.latest_version()
# Kinds without a bundled schema (CRDs) that the chart may render; checked structurally below.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}

# Everything optional switched on at once (used for lint and schema validation).
FULL_VALUES = (
    "--set",
    "serviceMonitor.enabled=true",
    "--set",
    "serviceMonitor.labels.release=kube-prometheus",
    "--set",
    "telemetry.otlpEndpoint=http://otel-collector.observability:4317",
    "--set",
    "telemetry.resourceAttributes.deployment\\.environment=test",
    "--set",
    "kv.dynamodb.table=quarry-meta",
    "--set",
    "kv.dynamodb.region=eu-west-1",
    "--set",
    "kv.dynamodb.endpointUrl=http://dynalite:4567",
    "--set",
    "kv.dynamodb.credentialsSecret=quarry-dynamodb",
    "--set-string",
    "kv.dynamodb.serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn="
    "arn:aws:iam::123456789012:role/quarry-dynamodb",
    "--set",
    "objectStore.s3.endpointUrl=http://minio:9000",
    "--set",
    "objectStore.s3.region=eu-west-1",
    "--set-string",
    "services.rangeWriter.serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn="
    "arn:aws:iam::123456789012:role/quarry-s3-rw",
    "--set",
    "extraEnv.QUARRY_MAX_WORKERS=64",
    "--set",
    "logLevel=DEBUG",
    "--set",
    "services.compactorSensor.replicas=2",
    "--set",
    "image.tag=0.1.0-rc1",
    "--set",
    "gc.enabled=true",
    "--set-string",
    "gc.serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn="
    "arn:aws:iam::123456789012:role/quarry-s3-gc",
    "--set",
    "gc.podAnnotations.example\\.com/team=lake",
)
# The gc CronJob with a repository list and dry runs (the other command shape).
GC_REPOSITORY_VALUES = (
    "--set",
    "gc.enabled=true",
    "--set",
    "gc.repositories={lake-a,lake-b,lake-c}",
    "--set",
    "gc.sweep=false",
    "--set",
    "objectStore.s3.endpointUrl=http://minio:9000",
)


# TLS from a named Secret with mTLS, named admin Secret, HPAs, NetworkPolicy extras.
SECURITY_AND_SCALING_VALUES = (
    "--set",
    "tls.existingSecret=quarry-tls",
    "--set",
    "tls.clientAuth=true",
    "--set",
    "tls.serverName=quarry.internal",
    "--set",
    "bootstrap.adminSecret=quarry-admin",
    "--set",
    "bootstrap.adminUser=ops@example.com",
    "--set",
    "services.branchManager.autoscaling.enabled=true",
    "--set",
    "services.committer.autoscaling.enabled=true",
    "--set",
    "services.rangeWriter.autoscaling.enabled=true",
    "--set",
    "services.rangeWriter.autoscaling.maxReplicas=10",
    "--set",
    "services.s3Gateway.autoscaling.enabled=true",
    "--set",
    "networkPolicy.extraInternalFrom[0].podSelector.matchLabels.app=toolbox",
    "--set",
    "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring",
    "--set",
    "gc.enabled=true",
)
# What `make kube-up` (deploy/local/kube.py) and tests/e2e/test_helm_podman.py render.
CI_PODMAN_VALUES = (
    "-f",
    str(REPO / "deploy" / "local" / "values.yaml"),
    "--set",
    "localData.hostPath=/tmp/quarry-ci",
    "--set",
    "localData.mountPath=/tmp/quarry-ci",
)


# ---------------------------------------------------------------------------------------------
# helpers


def port_name(service: str) -> str:
    """The name of a service's serving port (container and Service)."""
    return "http" if service in HTTP_SERVICES else "grpc"


def helm_binary() -> Path:
    if not HELM.is_file() or not os.access(HELM, os.X_OK):
        pytest.fail(
            f"helm binary not found at {HELM}. Run `make tools` (or `make .tools/bin/helm`) "
            f"in {REPO} to unpack it; the helm tests never skip.",
            pytrace=False,
        )
    return HELM


def run_helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(helm_binary()), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        # Keep helm away from the user's kube config, plugins, caches and repositories.
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(REPO / ".tools"),
            "KUBECONFIG": os.devnull,
            "HELM_CACHE_HOME": str(REPO / ".tools" / "helm-home" / "cache"),
            "HELM_CONFIG_HOME": str(REPO / ".tools" / "helm-home" / "config"),
            "HELM_DATA_HOME": str(REPO / ".tools" / "helm-home" / "data"),
        },
    )


@functools.cache
def _template(release: str, args: tuple[str, ...]) -> tuple[dict, ...]:
    proc = run_helm("template", release, str(CHART), "--namespace", NAMESPACE, *args)
    if proc.returncode != 0:
        pytest.fail(f"helm template {' '.join(args)} failed:\n{proc.stderr}", pytrace=False)
    docs = tuple(documents(proc.stdout))
    assert docs, "helm template rendered nothing"
    return docs


def render(*args: str, release: str = RELEASE) -> list[dict]:
    return list(_template(release, tuple(args)))


def render_error(*args: str) -> str:
    proc = run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert proc.returncode != 0, (
        f"helm template {' '.join(args)} should have failed but rendered:\n{proc.stdout[:2000]}"
    )
    assert not documents(proc.stdout or ""), "rendered despite error"
    return proc.stderr


def objects(docs: list[dict], kind: str) -> dict[str, dict]:
    found = [d for d in docs if d["kind"] == kind]
    by_name = {d["metadata"]["name"]: d for d in found}
    assert len(by_name) == len(found), (
        f"duplicate {kind} names: {[d['metadata']['name'] for d in found]}"
    )
    return by_name


def full_name(service: str, release: str = RELEASE) -> str:
    return f"{release}-{service}"


def deployment(docs: list[dict], service: str) -> dict:
    deployments = objects(docs, "Deployment")
    assert full_name(service) in deployments, f"no Deployment for {service}: {sorted(deployments)}"
    return deployments[full_name(service)]


def containers(dep: dict) -> list[dict]:
    pod = dep["spec"]["template"]["spec"]
    return pod.get("initContainers", []) + pod["containers"]


def main_container(dep: dict) -> dict:
    cs = dep["spec"]["template"]["spec"]["containers"]
    assert len(cs) == 1, f"{dep['metadata']['name']}: expected one container, got {len(cs)}"
    return cs[0]


def env_of(container: dict) -> dict[str, dict]:
    entries = container.get("env", [])
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names)), f"duplicate env entries in {container['name']}: {names}"
    return {e["name"]: e for e in entries}


def env_value(container: dict, name: str) -> str:
    entry = env_of(container).get(name)
    assert entry is not None, f"{container['name']}: env {name} missing"
    assert "value" in entry, f"{container['name']}: env {name} is not a literal value: {entry}"
    return entry["value"]


def container_env(docs: list[dict], container: dict) -> dict[str, str]:
    """The environment a container starts with: envFrom first, then env (env wins).
    Values taken from Secrets or the downward API are shown as "<from ...>"."""
    configmaps = objects(docs, "ConfigMap")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        prefix = source.get("prefix", "")
        if "configMapRef" in source:
            cm = configmaps.get(source["configMapRef"]["name"])
            assert cm is not None, f"envFrom references a ConfigMap that is not rendered: {source}"
            env.update({prefix + k: v for k, v in cm.get("data", {}).items()})
        else:  # a whole Secret as env: its keys are unknown, treat as carrying credentials
            env[prefix + "<secret:" + source["secretRef"]["name"] + ">"] = "<from secret>"
    for name, entry in env_of(container).items():
        env[name] = (
            entry["value"] if "value" in entry else f"<from {sorted(entry['valueFrom'])[0]}>"
        )
    return env


def effective_env_names(docs: list[dict], dep: dict) -> set[str]:
    """Every env var name a Deployment's containers get, through env AND envFrom."""
    names: set[str] = set()
    for c in containers(dep):
        names |= set(container_env(docs, c))
    return names


def configmap_data(docs: list[dict]) -> dict[str, str]:
    cms = objects(docs, "ConfigMap")
    assert len(cms) == 1, f"expected one shared ConfigMap, got {sorted(cms)}"
    return next(iter(cms.values()))["data"]


def grpc_probe_port(container: dict, probe: str) -> int:
    spec = container.get(probe)
    assert spec, f"{container['name']}: no {probe}"
    assert set(spec) & {"httpGet", "tcpSocket", "exec"} == set(), (
        f"{probe} is not a gRPC probe: {spec}"
    )
    assert "grpc" in spec, f"{container['name']}: {probe} is not a native gRPC probe: {spec}"
    return spec["grpc"]["port"]


def health_probe(container: dict, probe: str) -> tuple[int, str]:
    """(port, grpc.health.v1 service name) a probe checks, native gRPC or the image's exec
    probe (quarry.runtime.health_probe, what TLS needs: Kubernetes' gRPC probes are plaintext)."""
    spec = container.get(probe)
    assert spec, f"{container['name']}: no {probe}"
    assert set(spec) & {"httpGet", "tcpSocket"} == set(), f"{probe} is not a health probe: {spec}"
    if "grpc" in spec:
        return spec["grpc"]["port"], spec["grpc"].get("service", "")
    command = spec["exec"]["command"]
    assert command[:3] == ["python", "-m", "quarry.runtime.health_probe"], command
    host, port = command[3].rsplit(":", 1)
    assert host == "127.0.0.1", command  # the pod's own server (the certificate names it)
    service = command[command.index("--service") + 1] if "--service" in command else ""
    return int(port), service


# ---------------------------------------------------------------------------------------------
# helm itself and lint


def test_missing_helm_fails_instead_of_skipping(monkeypatch, tmp_path):
    monkeypatch.setattr(sys.modules[__name__], "HELM", tmp_path / "no-helm")
    with pytest.raises(pytest.fail.Exception, match="make tools"):
        helm_binary()


def test_helm_binary_runs():
    proc = run_helm("version", "--short")
    assert proc.returncode == 0, proc.stderr
    assert re.match(r"v[34]\.", proc.stdout.strip()), proc.stdout


@pytest.mark.parametrize("values", [(), FULL_VALUES], ids=["defaults", "all-options"])
def test_lint_strict(values):
    proc = run_helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, *values)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "0 chart(s) failed" in out, out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


# ---------------------------------------------------------------------------------------------
# default render


def test_default_render_objects():
    docs = render()
    kinds = collections.Counter(d["kind"] for d in docs)
    assert kinds == {
        "Deployment": 7,
        "Service": 7,
        "ServiceAccount": 7,
        "ConfigMap": 1,
        "PodDisruptionBudget": 5,  # every service but compactor-sensor and console (1 replica)
        # the auth signing key, the TLS CA and certificate, the first admin's credentials,
        # the console's session key
        "Secret": 4,
        "NetworkPolicy": 4,  # kv-gateway, range-writer, s3-gateway and console
        "Job": 1,  # the admin bootstrap (quarry setup)
    }, kinds
    expected = {full_name(s) for s in SERVICES}
    assert set(objects(docs, "Deployment")) == expected
    assert set(objects(docs, "Service")) == expected
    assert all(d["metadata"].get("namespace") == NAMESPACE for d in docs)


@pytest.mark.parametrize("service", GRPC_SERVICES)
def test_default_deployment(service):
    key, port, metrics_port, replicas = SERVICES[service]
    docs = render()
    dep = deployment(docs, service)
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    c = main_container(dep)

    assert spec["replicas"] == replicas
    selector = spec["selector"]["matchLabels"]
    assert selector == {
        "app.kubernetes.io/name": "quarry",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": service,
    }
    assert selector.items() <= spec["template"]["metadata"]["labels"].items()

    assert c["name"] == service
    assert c["command"] == ["quarry", "serve", service]
    assert c["image"] == f"localhost/quarry:{APP_VERSION}"
    assert c["imagePullPolicy"] == "IfNotPresent"

    ports = {p["name"]: p for p in c["ports"]}
    assert ports["grpc"]["containerPort"] == port and ports["grpc"].get("protocol", "TCP") == "TCP"
    assert ports["metrics"]["containerPort"] == metrics_port
    # TLS is on by default, so the probes are exec probes (Kubernetes' gRPC probes speak
    # plaintext only); test_probes_are_native_grpc_without_tls covers the other kind.
    assert "exec" in c["livenessProbe"] and "exec" in c["readinessProbe"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert health_probe(c, probe)[0] == port, probe
    if "startupProbe" in c:
        assert health_probe(c, "startupProbe") == (port, "quarry.v1.ServerInfo")
    # A service waiting for a dependency is NOT_SERVING overall: it must leave the endpoints
    # (readiness on "") but not be restarted (liveness on ServerInfo, SERVING while it runs).
    assert health_probe(c, "livenessProbe")[1] == "quarry.v1.ServerInfo"
    assert health_probe(c, "readinessProbe")[1] == ""

    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert c["resources"]["limits"]["memory"]

    pod_sc, sc = pod.get("securityContext", {}), c["securityContext"]
    assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert not sc.get("privileged", False)

    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    for path in ("/tmp", "/var/cache/quarry"):
        assert path in mounts, f"{path} not mounted: {mounts}"
        assert "emptyDir" in volumes[mounts[path]], volumes[mounts[path]]
        assert not [m for m in c["volumeMounts"] if m["mountPath"] == path and m.get("readOnly")]
    assert pod["terminationGracePeriodSeconds"] == 30

    cm_name = next(iter(objects(docs, "ConfigMap")))
    assert {"configMapRef": {"name": cm_name}} in c["envFrom"]
    env = container_env(docs, c)
    assert env["OTEL_SERVICE_NAME"] == f"quarry-{service}"
    assert env[f"QUARRY_{service.upper().replace('-', '_')}_PORT"] == str(port)
    # The services listen for metrics on QUARRY_METRICS_BASE_PORT + their index.
    assert int(env["QUARRY_METRICS_BASE_PORT"]) + list(SERVICES).index(service) == metrics_port
    assert 0 < float(env["QUARRY_SHUTDOWN_GRACE_SECONDS"]) < pod["terminationGracePeriodSeconds"]

    # No Kubernetes service-link variables (QUARRY_KV_GATEWAY_PORT=tcp://... for release "quarry").
    assert pod["enableServiceLinks"] is False
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] in objects(docs, "ServiceAccount")
    assert "checksum/config" in spec["template"]["metadata"]["annotations"]


@pytest.mark.parametrize("service", SERVICES)
def test_default_service(service):
    _, port, metrics_port, _ = SERVICES[service]
    docs = render()
    svc = objects(docs, "Service")[full_name(service)]
    dep = deployment(docs, service)
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    serving = port_name(service)
    assert set(ports) == {serving, "metrics"}
    assert ports[serving]["port"] == port and ports["metrics"]["port"] == metrics_port
    # TLS is on by default: the S3 gateway serves HTTPS, the others gRPC over TLS (h2).
    expected = "https" if service in HTTP_SERVICES else "kubernetes.io/h2c"
    assert ports[serving]["appProtocol"] == expected
    container_ports = {p["name"]: p["containerPort"] for p in main_container(dep)["ports"]}
    for name, p in ports.items():
        target = p.get("targetPort", p["port"])
        resolved = container_ports.get(target) if isinstance(target, str) else target
        assert resolved == container_ports[name], f"Service port {name} targets {target}"


def test_default_shared_configmap():
    data = configmap_data(render())
    expected = {
        "QUARRY_LISTEN_HOST": "0.0.0.0",
        "QUARRY_METRICS_HOST": "0.0.0.0",
        "QUARRY_CACHE_DIR": "/var/cache/quarry",
        "QUARRY_RANGE_CACHE_BYTES": str(256 * 1024 * 1024),
        "QUARRY_METARANGE_CACHE_BYTES": str(64 * 1024 * 1024),
        "QUARRY_LOG_LEVEL": "INFO",
        "OTEL_TRACES_EXPORTER": "none",
        # TLS on by default: the files of the mounted TLS Secret.
        "QUARRY_TLS_CERT_FILE": "/etc/quarry/tls/tls.crt",
        "QUARRY_TLS_KEY_FILE": "/etc/quarry/tls/tls.key",
        "QUARRY_TLS_CA_FILE": "/etc/quarry/tls/ca.crt",
        "QUARRY_TLS_CLIENT_AUTH": "false",
    }
    for service, (_, port, _, _) in SERVICES.items():
        expected[f"QUARRY_{service.upper().replace('-', '_')}_ADDRESS"] = (
            f"{RELEASE}-{service}:{port}"
        )
        expected[f"QUARRY_{service.upper().replace('-', '_')}_PORT"] = str(port)
    assert data == expected


def test_standard_labels_on_every_object():
    docs = render(*FULL_VALUES)
    for doc in docs:
        labels = doc["metadata"]["labels"]
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        assert labels.get("app.kubernetes.io/name") == "quarry", where
        assert labels.get("app.kubernetes.io/instance") == RELEASE, where
        assert labels.get("app.kubernetes.io/version") == APP_VERSION, where
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", where
        assert labels.get("helm.sh/chart") == CHART_LABEL, where
        if doc["kind"] in {"Deployment", "Service", "PodDisruptionBudget"}:
            assert labels.get("app.kubernetes.io/component") in SERVICES, where
        if doc["kind"] == "ServiceAccount":
            assert labels.get("app.kubernetes.io/component") in {*SERVICES, GC}, where
        if doc["kind"] == "CronJob":
            assert labels.get("app.kubernetes.io/component") == GC, where
        if doc["kind"] == "Deployment":
            pod_labels = doc["spec"]["template"]["metadata"]["labels"]
            assert labels.items() <= pod_labels.items(), where
        if doc["kind"] == "CronJob":
            job = doc["spec"]["jobTemplate"]
            assert labels.items() <= job["metadata"]["labels"].items(), where
            assert labels.items() <= job["spec"]["template"]["metadata"]["labels"].items(), where
    assert "CronJob" in {d["kind"] for d in docs}, "FULL_VALUES should render the gc CronJob"


# ---------------------------------------------------------------------------------------------
# the rendered environment is what the services' settings loader expects


@pytest.mark.parametrize("values", [(), FULL_VALUES], ids=["defaults", "all-options"])
def test_services_load_the_rendered_configuration(values):
    """Feed each container's rendered environment to quarry.config.load_settings (the loader
    `quarry serve` uses): it must parse, bind the declared ports and dial the Services."""
    from quarry import config

    assert tuple(config.SERVICES) == tuple(SERVICES), "service order/index changed in quarry.config"
    docs = render(*values)
    service_objs = objects(docs, "Service")
    for service in SERVICES:
        dep = deployment(docs, service)
        c = main_container(dep)
        env = container_env(docs, c)
        stray = {k for k in env if k.startswith("QUARRY_")} - {
            config.ENV_PREFIX + f.name.upper() for f in dataclasses.fields(config.Settings)
        }
        assert not stray, f"{service}: QUARRY_ variables unknown to quarry.config: {sorted(stray)}"
        settings = config.load_settings(env=env)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert settings.port_of(service) == ports[port_name(service)]
        assert settings.metrics_port_of(service) == ports["metrics"]
        assert settings.listen_host == "0.0.0.0" and settings.metrics_host == "0.0.0.0"
        assert settings.effective_cache_dir == "/var/cache/quarry"
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert settings.effective_cache_dir in mounts
        assert (
            settings.shutdown_grace_seconds
            < dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        )
        for other in SERVICES:
            host, port = settings.address_of(other).rsplit(":", 1)
            target = service_objs.get(host)
            assert target is not None, f"{service} dials {host}, which is not a rendered Service"
            assert int(port) in {
                p["port"] for p in target["spec"]["ports"] if p["name"] == port_name(other)
            }
        if service == "kv-gateway":
            assert settings.kv_url.startswith("dynamodb://")
        else:
            assert settings.kv_url == "", f"{service} has a KV URL"


# ---------------------------------------------------------------------------------------------
# Kubernetes schema validation of everything rendered


@pytest.mark.parametrize("k8s_version", [K8S_FLOOR, K8S_LATEST])
@pytest.mark.parametrize(
    "values",
    [(), FULL_VALUES, GC_REPOSITORY_VALUES, SECURITY_AND_SCALING_VALUES, CI_PODMAN_VALUES],
    ids=["defaults", "all-options", "gc-repositories", "security-and-scaling", "ci-podman"],
)
def test_rendered_documents_are_valid_kubernetes(values, k8s_version):
    docs = render(*values)
    validated = 0
    for doc in docs:
        where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue  # no bundled schema; ServiceMonitor is checked in its own test
        try:
            kubernetes_validate.validate(doc, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(
                f"{where} is invalid for Kubernetes {k8s_version}: {e.message} "
                f"at {'/'.join(map(str, e.absolute_path))}",
                pytrace=False,
            )
        except kubernetes_validate.SchemaNotFoundError:
            pytest.fail(
                f"{where}: {doc['apiVersion']} {doc['kind']} does not exist in "
                f"Kubernetes {k8s_version}",
                pytrace=False,
            )
        validated += 1
    assert validated >= 20, validated


def test_kube_version_floor_is_enforced():
    proc = run_helm("template", RELEASE, str(CHART), "--kube-version", "1.26.0")
    assert proc.returncode != 0 and "kubeVersion" in proc.stderr, proc.stderr
    render("--kube-version", f"{K8S_FLOOR}.0")


# ---------------------------------------------------------------------------------------------
# the KV backend is kv-gateway's alone


@pytest.mark.parametrize(
    ("values", "kv_gateway_aws_env"),
    [((), set()), (FULL_VALUES, {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"})],
    ids=["defaults", "credentials-secret-and-irsa"],
)
def test_only_kv_gateway_gets_kv_url_and_aws_credentials(values, kv_gateway_aws_env):
    docs = render(*values)
    for service in SERVICES:
        dep = deployment(docs, service)
        names = effective_env_names(docs, dep)
        aws = {n for n in names if n.startswith("AWS_") or n.startswith("<secret:")}
        # The only Secret a pod mounts is the TLS one (certificate, key, CA).
        secret_volumes = [
            v
            for v in dep["spec"]["template"]["spec"]["volumes"]
            if ("secret" in v and v["secret"]["secretName"] != full_name("tls")) or "projected" in v
        ]
        if service == "kv-gateway":
            assert "QUARRY_KV_URL" in names
            assert aws == kv_gateway_aws_env, aws
        else:
            assert "QUARRY_KV_URL" not in names, f"{service} gets QUARRY_KV_URL"
            assert aws == set(), f"{service} gets AWS credentials: {aws}"
            assert not any(
                "dynamodb" in str(v).lower() for v in env_of(main_container(dep)).values()
            )
        assert secret_volumes == [], f"{service} mounts secrets: {secret_volumes}"
    data = configmap_data(docs)
    assert not [k for k in data if k.startswith("AWS_") or k == "QUARRY_KV_URL"], data
    assert "dynamodb" not in str(data).lower()


def test_kv_gateway_credentials_come_from_the_named_secret():
    c = main_container(deployment(render(*FULL_VALUES), "kv-gateway"))
    env = env_of(c)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[key]["valueFrom"] == {"secretKeyRef": {"name": "quarry-dynamodb", "key": key}}
        assert "value" not in env[key]


def test_irsa_annotation_only_on_kv_gateway_service_account():
    docs = render(*FULL_VALUES)
    accounts = objects(docs, "ServiceAccount")
    role = "arn:aws:iam::123456789012:role/quarry-dynamodb"
    holders = [
        n
        for n, sa in accounts.items()
        if role in (sa["metadata"].get("annotations") or {}).values()
    ]
    assert holders == [full_name("kv-gateway")], holders
    for service in SERVICES:
        pod = deployment(docs, service)["spec"]["template"]["spec"]
        uses_dynamodb_identity = pod["serviceAccountName"] == full_name("kv-gateway")
        assert uses_dynamodb_identity == (service == "kv-gateway"), (
            service,
            pod["serviceAccountName"],
        )


def test_kv_url():
    default = main_container(deployment(render(), "kv-gateway"))
    assert env_value(default, "QUARRY_KV_URL") == "dynamodb://quarry?region=us-east-1"
    full = main_container(deployment(render(*FULL_VALUES), "kv-gateway"))
    assert env_value(full, "QUARRY_KV_URL") == (
        "dynamodb://quarry-meta?region=eu-west-1&endpoint_url=http%3A%2F%2Fdynalite%3A4567"
    )


def test_object_store_settings_only_for_the_services_that_read_or_write_objects():
    docs = render(*FULL_VALUES)
    for service in SERVICES:
        c = main_container(deployment(docs, service))
        env = env_of(c)
        if service in OBJECT_STORE_USERS:
            assert env_value(c, "QUARRY_S3_ENDPOINT_URL") == "http://minio:9000"
            assert env_value(c, "QUARRY_S3_REGION") == "eu-west-1"
        else:
            assert not [n for n in env if n.startswith("QUARRY_S3_")], (service, sorted(env))
    # Without an endpoint only the region is set.
    for service in OBJECT_STORE_USERS:
        env = env_of(main_container(deployment(render(), service)))
        assert (
            "QUARRY_S3_ENDPOINT_URL" not in env and env["QUARRY_S3_REGION"]["value"] == "us-east-1"
        )


def test_range_writer_processes_only_on_the_range_writer():
    # Default: none; a value reaches the range-writer's container and no other service's.
    for docs, expected in (
        (render(), "0"),
        (render("--set", "services.rangeWriter.processes=3"), "3"),
    ):
        for service in SERVICES:
            env = env_of(main_container(deployment(docs, service)))
            if service == "range-writer":
                assert env["QUARRY_RANGE_WRITER_PROCESSES"]["value"] == expected
            else:
                assert "QUARRY_RANGE_WRITER_PROCESSES" not in env, service
    assert "minimum" in render_error("--set", "services.rangeWriter.processes=-1")


@pytest.mark.parametrize(
    ("key", "service", "variable", "default"),
    [
        # One worker per core the container may use (0) by default.
        ("branchManager", "branch-manager", "QUARRY_BRANCH_MANAGER_WORKERS", "0"),
        # One process by default; 0 must stay 0 (not `default 1`'s 1).
        ("committer", "committer", "QUARRY_COMMITTER_WORKERS", "1"),
        ("s3Gateway", "s3-gateway", "QUARRY_S3_GATEWAY_WORKERS", "1"),
    ],
)
def test_worker_counts_reach_only_their_service(key, service, variable, default):
    for docs, expected in (
        (render(), default),
        (render("--set", f"services.{key}.workers=0"), "0"),
        (render("--set", f"services.{key}.workers=4"), "4"),
    ):
        for other in SERVICES:
            env = env_of(main_container(deployment(docs, other)))
            if other == service:
                assert env[variable]["value"] == expected
            else:
                assert variable not in env, other
    assert "minimum" in render_error("--set", f"services.{key}.workers=-1")


# ---------------------------------------------------------------------------------------------
# optional features


def test_service_monitor_and_otlp_when_enabled():
    docs = render(
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "serviceMonitor.interval=15s",
        "--set",
        "telemetry.otlpEndpoint=http://otel-collector:4317",
    )
    kinds = collections.Counter(d["kind"] for d in docs)
    assert kinds["Deployment"] == 7 and kinds["Service"] == 7 and kinds["ServiceMonitor"] == 1, (
        kinds
    )
    (sm,) = objects(docs, "ServiceMonitor").values()
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["namespace"] == NAMESPACE
    spec = sm["spec"]
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert [e["port"] for e in spec["endpoints"]] == ["metrics"]
    assert spec["endpoints"][0]["interval"] == "15s"
    # The selector picks exactly the six Quarry Services of this release (s3-gateway too).
    match_labels = spec["selector"]["matchLabels"]
    expressions = spec["selector"].get("matchExpressions", [])
    for svc in objects(docs, "Service").values():
        labels = svc["metadata"]["labels"]
        assert match_labels.items() <= labels.items(), svc["metadata"]["name"]
        for expr in expressions:
            assert expr["operator"] == "In" and labels[expr["key"]] in expr["values"]
        assert "metrics" in {p["name"] for p in svc["spec"]["ports"]}
    assert match_labels.get("app.kubernetes.io/instance") == RELEASE

    data = configmap_data(docs)
    assert data["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4317"
    assert data["OTEL_TRACES_EXPORTER"] == "otlp"
    for service in SERVICES:
        dep = deployment(docs, service)
        assert {
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_TRACES_EXPORTER",
            "OTEL_SERVICE_NAME",
        } <= effective_env_names(docs, dep)
        assert env_value(main_container(dep), "OTEL_SERVICE_NAME") == f"quarry-{service}"


def test_defaults_have_no_service_monitor_and_no_otlp_endpoint():
    docs = render()
    assert not objects(docs, "ServiceMonitor")
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in configmap_data(docs)
    for service in SERVICES:
        assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in effective_env_names(
            docs, deployment(docs, service)
        )


def test_replicas_drive_pod_disruption_budgets():
    docs = render(
        "--set",
        "services.kvGateway.replicas=1",
        "--set",
        "services.compactorSensor.replicas=3",
        "--set",
        "services.rangeWriter.replicas=0",
    )
    replicas = {s: deployment(docs, s)["spec"]["replicas"] for s in SERVICES}
    assert replicas == {
        "kv-gateway": 1,
        "branch-manager": 2,
        "committer": 2,
        "compactor-sensor": 3,
        "range-writer": 0,
        S3_GATEWAY: 2,
        CONSOLE: 1,
    }
    pdbs = objects(docs, "PodDisruptionBudget")
    assert set(pdbs) == {
        full_name(s) for s in ("branch-manager", "committer", "compactor-sensor", S3_GATEWAY)
    }
    for name, pdb in pdbs.items():
        dep = objects(docs, "Deployment")[name]
        assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
        assert pdb["spec"]["maxUnavailable"] == 1
    assert not objects(render("--set", "podDisruptionBudget.enabled=false"), "PodDisruptionBudget")


def test_ports_are_configurable_everywhere():
    docs = render(
        "--set", "services.kvGateway.port=8401", "--set", "services.kvGateway.metricsPort=9501"
    )
    dep = deployment(docs, "kv-gateway")
    c = main_container(dep)
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"grpc": 8401, "metrics": 9501}
    assert health_probe(c, "livenessProbe")[0] == health_probe(c, "readinessProbe")[0] == 8401
    assert container_env(docs, c)["QUARRY_KV_GATEWAY_PORT"] == "8401"
    assert env_value(c, "QUARRY_METRICS_BASE_PORT") == "9501"  # kv-gateway has index 0
    svc = objects(docs, "Service")[full_name("kv-gateway")]
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"grpc": 8401, "metrics": 9501}
    assert configmap_data(docs)["QUARRY_KV_GATEWAY_ADDRESS"] == f"{RELEASE}-kv-gateway:8401"


def test_release_name_prefixes_names_and_addresses():
    docs = render(release="prod")
    assert set(objects(docs, "Deployment")) == {f"prod-{s}" for s in SERVICES}
    data = configmap_data(docs)
    assert data["QUARRY_COMMITTER_ADDRESS"] == "prod-committer:7403"
    assert data["QUARRY_RANGE_WRITER_ADDRESS"] == "prod-range-writer:7405"
    docs = render("--set", "fullnameOverride=lake")
    assert set(objects(docs, "Service")) == {f"lake-{s}" for s in SERVICES}
    assert configmap_data(docs)["QUARRY_KV_GATEWAY_ADDRESS"] == "lake-kv-gateway:7401"


def test_values_reach_the_pods():
    docs = render(
        *FULL_VALUES,
        "--set",
        "terminationGracePeriodSeconds=120",
        "--set",
        "services.committer.terminationGracePeriodSeconds=300",
        "--set",
        "image.repository=registry.example.com/quarry",
        "--set",
        "image.pullPolicy=Always",
        "--set",
        "cache.rangeMemoryBytes=1073741824",
        "--set",
        "cache.metarangeMemoryBytes=0",
    )
    data = configmap_data(docs)
    assert data["QUARRY_MAX_WORKERS"] == "64"  # extraEnv
    assert data["QUARRY_RANGE_CACHE_BYTES"] == "1073741824"
    assert data["QUARRY_METARANGE_CACHE_BYTES"] == "0"
    assert data["QUARRY_LOG_LEVEL"] == "DEBUG"
    for service in SERVICES:
        dep = deployment(docs, service)
        c = main_container(dep)
        assert c["image"] == "registry.example.com/quarry:0.1.0-rc1"
        assert c["imagePullPolicy"] == "Always"
        grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace == (300 if service == "committer" else 120), service
        assert "QUARRY_MAX_WORKERS" in effective_env_names(docs, dep)


def test_config_change_rolls_the_pods():
    def checksums(*args):
        docs = render(*args)
        return {
            s: deployment(docs, s)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for s in SERVICES
        }

    before, after = checksums(), checksums("--set", "logLevel=DEBUG")
    assert all(before[s] != after[s] for s in SERVICES), (before, after)


# ---------------------------------------------------------------------------------------------
# the optional garbage-collection CronJob


def gc_cronjob(docs: list[dict]) -> dict:
    cronjobs = objects(docs, "CronJob")
    assert set(cronjobs) == {full_name(GC)}, sorted(cronjobs)
    return cronjobs[full_name(GC)]


def gc_pod(cronjob: dict) -> dict:
    return cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def gc_container(cronjob: dict) -> dict:
    cs = gc_pod(cronjob)["containers"]
    assert len(cs) == 1 and not gc_pod(cronjob).get("initContainers"), cs
    return cs[0]


def gc_invocations(container: dict) -> list[list[str]]:
    """The `quarry gc run` command lines the container runs, in order: its command itself, or
    the `quarry gc run ...` lines of its /bin/sh -c script."""
    command = container["command"]
    if command[0] == "quarry":
        return [command]
    assert command[:2] == ["/bin/sh", "-c"] and len(command) == 3, command
    lines = [
        ln.split("||", 1)[0] for ln in command[2].splitlines() if ln.strip().startswith("quarry ")
    ]
    return [shlex.split(ln) for ln in lines]


def test_no_gc_cronjob_by_default():
    docs = render()
    assert not objects(docs, "CronJob") and set(objects(docs, "Job")) == {full_name("bootstrap")}
    assert full_name(GC) not in objects(docs, "ServiceAccount")  # gc.serviceAccount.create is true
    assert not objects(render("--set-string", "gc.serviceAccount.annotations.a=b"), "CronJob")


def test_gc_cronjob_defaults():
    docs = render("--set", "gc.enabled=true")
    kinds = collections.Counter(d["kind"] for d in docs)
    assert kinds["CronJob"] == 1 and kinds["ServiceAccount"] == 8 and kinds["Deployment"] == 7, (
        kinds
    )
    cj = gc_cronjob(docs)
    assert cj["apiVersion"] == "batch/v1" and cj["metadata"]["namespace"] == NAMESPACE
    spec = cj["spec"]
    assert spec["schedule"] == "30 3 * * *"
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["successfulJobsHistoryLimit"] == 3 and spec["failedJobsHistoryLimit"] == 3
    job = spec["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0 and job["activeDeadlineSeconds"] == 21600
    pod = gc_pod(cj)
    assert pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == full_name(GC) in objects(docs, "ServiceAccount")
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    assert job["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == GC

    c = gc_container(cj)
    assert c["command"] == ["quarry", "gc", "run", "--all", "--sweep", *GC_DEFAULT_OPTIONS]
    assert "--json" not in c["command"]
    # The services' image with Java and PySpark (`make image-gc`), and the same security
    # conventions as the Deployments.
    dep_c = main_container(deployment(docs, "range-writer"))
    dep_pod = deployment(docs, "range-writer")["spec"]["template"]["spec"]
    assert c["image"] == f"localhost/quarry-gc:{APP_VERSION}"
    assert c["imagePullPolicy"] == dep_c["imagePullPolicy"]
    assert c["securityContext"] == dep_c["securityContext"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"] == dep_pod["securityContext"]
    assert c["resources"] == {"requests": {"cpu": 1, "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
    # Spark needs a writable home and /tmp on the read-only root filesystem.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    env = container_env(docs, c)
    assert env["HOME"] == "/tmp" and env["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert env["OTEL_SERVICE_NAME"] == "quarry-gc"


@pytest.mark.parametrize("sweep", [True, False], ids=["sweep", "dry-run"])
def test_gc_command_for_all_repositories(sweep):
    c = gc_container(
        gc_cronjob(
            render(
                "--set",
                "gc.enabled=true",
                "--set",
                f"gc.sweep={str(sweep).lower()}",
                "--set",
                "gc.graceHours=12",
                "--set",
                "gc.sparkMaster=local[2]",
            )
        )
    )
    expected = (
        ["quarry", "gc", "run", "--all"]
        + (["--sweep"] if sweep else [])
        + ["--grace-hours", "12", "--ephemeral-ttl-hours", "24", "--master", "local[2]"]
    )
    assert c["command"] == expected
    assert gc_invocations(c) == [expected]


@pytest.mark.parametrize("sweep", [True, False], ids=["sweep", "dry-run"])
def test_gc_command_per_repository(sweep):
    c = gc_container(
        gc_cronjob(
            render(
                "--set",
                "gc.enabled=true",
                "--set",
                "gc.repositories={lake-a,lake-b}",
                "--set",
                f"gc.sweep={str(sweep).lower()}",
            )
        )
    )
    options = (["--sweep"] if sweep else []) + GC_DEFAULT_OPTIONS
    assert gc_invocations(c) == [
        ["quarry", "gc", "run", "lake-a", *options],
        ["quarry", "gc", "run", "lake-b", *options],
    ]
    assert "--all" not in c["command"][2]


@pytest.mark.parametrize(
    "failing", [(), ("lake-a",), ("lake-a", "lake-c")], ids=["none", "first", "two"]
)
def test_gc_repository_script_runs_every_repository_and_fails_if_any_failed(tmp_path, failing):
    """Run the rendered script with a stub `quarry`: every repository is collected in order,
    a failure does not stop the others, and the script exits non-zero if any failed."""
    c = gc_container(gc_cronjob(render(*GC_REPOSITORY_VALUES)))
    log = tmp_path / "calls"
    stub = tmp_path / "quarry"
    stub.write_text(
        '#!/bin/sh\nprintf "%s\\n" "$*" >> "$QUARRY_STUB_LOG"\n'
        'case " $QUARRY_STUB_FAIL " in *" $3 "*) exit 1;; esac\n'
    )
    stub.chmod(0o755)
    proc = subprocess.run(
        c["command"],
        capture_output=True,
        text=True,
        timeout=30,
        env={
            "PATH": f"{tmp_path}:/usr/bin:/bin",
            "QUARRY_STUB_LOG": str(log),
            "QUARRY_STUB_FAIL": " ".join(failing),
        },
    )
    options = " ".join(GC_DEFAULT_OPTIONS)  # gc.sweep=false in GC_REPOSITORY_VALUES: no --sweep
    assert log.read_text().splitlines() == [
        f"gc run {r} {options}" for r in ("lake-a", "lake-b", "lake-c")
    ]
    assert (proc.returncode != 0) == bool(failing), (proc.returncode, proc.stderr)
    for repo in failing:
        assert repo in proc.stderr


@pytest.mark.parametrize(
    "values",
    [("--set", "gc.enabled=true"), FULL_VALUES, GC_REPOSITORY_VALUES],
    ids=["defaults", "all-options", "repositories"],
)
def test_gc_gets_service_addresses_and_object_store_settings(values):
    """The gc container reaches branch-manager and committer the way the services reach each
    other, gets range-writer's object-store settings, and nothing of the KV backend."""
    from quarry import config

    docs = render(*values)
    c = gc_container(gc_cronjob(docs))
    env = container_env(docs, c)
    service_objs = objects(docs, "Service")
    settings = config.load_settings(env=env)
    for service in ("branch-manager", "committer"):
        prefix = f"QUARRY_{service.upper().replace('-', '_')}_ADDRESS"
        assert env[prefix] == f"{full_name(service)}:{SERVICES[service][1]}"
        host, port = settings.address_of(service).rsplit(":", 1)
        assert int(port) in {
            p["port"] for p in service_objs[host]["spec"]["ports"] if p["name"] == "grpc"
        }
    writer_env = container_env(docs, main_container(deployment(docs, "range-writer")))
    s3 = {k: v for k, v in env.items() if k.startswith("QUARRY_S3_")}
    assert s3 == {k: v for k, v in writer_env.items() if k.startswith("QUARRY_S3_")}
    assert settings.s3_region == env["QUARRY_S3_REGION"]
    assert settings.s3_endpoint_url == env.get("QUARRY_S3_ENDPOINT_URL", "")
    assert "QUARRY_KV_URL" not in env and settings.kv_url == ""
    assert not [k for k in env if k.startswith("AWS_") or k.startswith("<secret:")], sorted(env)
    stray = {k for k in env if k.startswith("QUARRY_")} - {
        config.ENV_PREFIX + f.name.upper() for f in dataclasses.fields(config.Settings)
    }
    assert not stray, f"QUARRY_ variables unknown to quarry.config: {sorted(stray)}"
    assert not [
        v
        for v in gc_pod(gc_cronjob(docs))["volumes"]
        if ("secret" in v and v["secret"]["secretName"] != full_name("tls")) or "projected" in v
    ]


def test_gc_object_store_endpoint():
    env = env_of(gc_container(gc_cronjob(render(*GC_REPOSITORY_VALUES))))
    assert env["QUARRY_S3_ENDPOINT_URL"]["value"] == "http://minio:9000"
    env = env_of(gc_container(gc_cronjob(render("--set", "gc.enabled=true"))))
    assert "QUARRY_S3_ENDPOINT_URL" not in env and env["QUARRY_S3_REGION"]["value"] == "us-east-1"


def test_gc_service_account_annotation_only_on_gc_service_account():
    docs = render(*FULL_VALUES)
    accounts = objects(docs, "ServiceAccount")
    role = "arn:aws:iam::123456789012:role/quarry-s3-gc"
    holders = [
        n
        for n, sa in accounts.items()
        if role in (sa["metadata"].get("annotations") or {}).values()
    ]
    assert holders == [full_name(GC)], holders
    assert accounts[full_name(GC)]["automountServiceAccountToken"] is False
    cj = gc_cronjob(docs)
    assert gc_pod(cj)["serviceAccountName"] == full_name(GC)
    for service in SERVICES:
        assert deployment(docs, service)["spec"]["template"]["spec"][
            "serviceAccountName"
        ] != full_name(GC)
    annotations = cj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"example.com/team": "lake"}


def test_gc_existing_service_account():
    docs = render(
        "--set",
        "gc.enabled=true",
        "--set",
        "gc.serviceAccount.create=false",
        "--set",
        "gc.serviceAccount.name=lake-gc",
    )
    assert full_name(GC) not in objects(docs, "ServiceAccount")
    assert gc_pod(gc_cronjob(docs))["serviceAccountName"] == "lake-gc"
    docs = render("--set", "gc.enabled=true", "--set", "gc.serviceAccount.create=false")
    assert gc_pod(gc_cronjob(docs))["serviceAccountName"] == "default"


def test_gc_values_reach_the_cronjob():
    docs = render(
        "--set",
        "gc.enabled=true",
        "--set",
        "gc.schedule=@hourly",
        "--set",
        "gc.concurrencyPolicy=Replace",
        "--set",
        "gc.successfulJobsHistoryLimit=1",
        "--set",
        "gc.failedJobsHistoryLimit=5",
        "--set",
        "gc.backoffLimit=2",
        "--set",
        "gc.activeDeadlineSeconds=3600",
        "--set",
        "gc.ephemeralTtlHours=48",
        "--set",
        "gc.tmpSizeLimit=8Gi",
        "--set",
        "gc.resources.limits.memory=6Gi",
        "--set",
        "image.repository=registry.example.com/quarry",
        "--set",
        "imagePullSecrets[0].name=regcred",
        "--set",
        "nodeSelector.pool=batch",
    )
    cj = gc_cronjob(docs)
    spec, job = cj["spec"], cj["spec"]["jobTemplate"]["spec"]
    assert (spec["schedule"], spec["concurrencyPolicy"]) == ("@hourly", "Replace")
    assert (spec["successfulJobsHistoryLimit"], spec["failedJobsHistoryLimit"]) == (1, 5)
    assert (job["backoffLimit"], job["activeDeadlineSeconds"]) == (2, 3600)
    pod, c = gc_pod(cj), gc_container(cj)
    assert c["image"] == f"registry.example.com/quarry-gc:{APP_VERSION}"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}] and pod["nodeSelector"] == {
        "pool": "batch"
    }
    assert c["command"][c["command"].index("--ephemeral-ttl-hours") + 1] == "48"
    assert c["resources"]["limits"]["memory"] == "6Gi"
    tmp = next(v for v in pod["volumes"] if v["name"] == "tmp")
    assert tmp["emptyDir"]["sizeLimit"] == "8Gi"


# ---------------------------------------------------------------------------------------------
# invalid values fail to render, with a message naming the problem


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--set", "services.kvGateway.replicas=-1"), "/services/kvGateway/replicas"),
        (("--set", "services.compactorSensor.replicas=-1"), "/services/compactorSensor/replicas"),
        (("--set", "services.committer.replicas=two"), "/services/committer/replicas"),
        (("--set", "kv.dynamodb.table="), "/kv/dynamodb/table"),
        (("--set", "kv.dynamodb.table=null"), "table"),
        (("--set", "kv.dynamodb.region="), "/kv/dynamodb/region"),
        (("--set", "services.committer.port=70000"), "/services/committer/port"),
        (("--set", "services.rangeWriter.metricsPort=7405"), "port and metricsPort must differ"),
        (("--set", "image.pullPolicy=Sometimes"), "/image/pullPolicy"),
        (("--set", "replica=3"), "replica"),  # typo of a key: refused, not ignored
        (("--set", "services.kvGateway.serviceAccount.create=false"), "serviceAccount"),
        (("--set", "extraEnv.AWS_SECRET_ACCESS_KEY=x"), "kv-gateway only"),
        (("--set", "extraEnv.QUARRY_KV_URL=x"), "kv-gateway only"),
        (("--set", "extraEnv.QUARRY_LISTEN_HOST=::"), "managed by the chart"),
        (("--set", "extraEnv.QUARRY_COMMITTER_PORT=1"), "managed by the chart"),
        (("--set", "extraEnv.QUARRY_METRICS_BASE_PORT=1"), "managed by the chart"),
        (("--set", "services.rangeWriter.metricsPort=3"), "services.rangeWriter.metricsPort"),
        (("--set", "logLevel=verbose"), "/logLevel"),
        (("--set", "probes.type=tcp"), "/probes/type"),
        (("--set", "probes.type=grpc"), "gRPC probes speak plaintext"),  # TLS is on
        (("--set", "kv.backend=etcd"), "/kv/backend"),
        (("--set", "kv.backend=sqlite"), "localData.enabled"),
        (
            (
                "--set",
                "kv.backend=sqlite",
                "--set",
                "localData.enabled=true",
                "--set",
                "services.kvGateway.replicas=1",
            ),
            "localData.hostPath or localData.persistentVolumeClaim",
        ),
        (
            (
                "--set",
                "kv.backend=sqlite",
                "--set",
                "localData.enabled=true",
                "--set",
                "localData.hostPath=/srv/quarry",
            ),
            "replicas must be 1",  # kvGateway.replicas defaults to 2: one SQLite owner only
        ),
        (("--set", "services.kvGateway.autoscaling.enabled=true"), "autoscaling"),
        (("--set", "services.compactorSensor.autoscaling.enabled=true"), "autoscaling"),
        (
            (
                "--set",
                "services.committer.autoscaling.enabled=true",
                "--set",
                "services.committer.autoscaling.minReplicas=5",
                "--set",
                "services.committer.autoscaling.maxReplicas=3",
            ),
            "must not exceed maxReplicas",
        ),
        (("--set", "tls.validityDays=0"), "/tls/validityDays"),
        (("--set", "tls.existingSecret=Not_A_Name"), "/tls/existingSecret"),
        (("--set", "extraEnv.QUARRY_TLS_CA_FILE=/x"), "managed by the chart"),
        (("--set", "extraEnv.QUARRY_ALLOW_INSECURE_LISTEN=true"), "managed by the chart"),
        (("--set", "bootstrap.adminUser=a b"), "/bootstrap/adminUser"),
        (("--set", "localData.mountPath=relative"), "/localData/mountPath"),
        (("--set", "telemetry.otlpEndpoint=otel:4317"), "/telemetry/otlpEndpoint"),
        (("--set", "cache.dir=/tmp"), "cache.dir"),
        (("--set", "gc.enabled=true", "--set", "gc.repositories={Bad_Repo}"), "/gc/repositories/0"),
        (("--set", "gc.repositories={ab}"), "/gc/repositories/0"),  # too short, even disabled
        (("--set", "gc.enabled=true", "--set", "gc.schedule="), "/gc/schedule"),
        (("--set", "gc.enabled=true", "--set-string", "gc.schedule=  "), "/gc/schedule"),
        (("--set", "gc.enabled=true", "--set", "gc.schedule=null"), "schedule"),
        (("--set", "gc.enabled=true", "--set", "gc.retentionDays=7"), "/gc"),  # unknown key
        (
            ("--set", "gc.enabled=true", "--set", "gc.concurrencyPolicy=Sometimes"),
            "/gc/concurrencyPolicy",
        ),
        (("--set", "gc.enabled=true", "--set", "gc.sweep=yes"), "/gc/sweep"),
        (("--set", "gc.enabled=true", "--set", "gc.graceHours=-1"), "/gc/graceHours"),
        (("--set", "gc.enabled=true", "--set", "gc.sparkMaster="), "/gc/sparkMaster"),
        (("--set", "gc.enabled=true", "--set", "gc.backoffLimit=-1"), "/gc/backoffLimit"),
    ],
    ids=lambda v: v if isinstance(v, str) else v[1],
)
def test_invalid_values_fail_to_render(args, message):
    stderr = render_error(*args)
    assert message in stderr, f"expected {message!r} in helm's error:\n{stderr}"


# ---------------------------------------------------------------------------------------------
# NOTES.txt and values.yaml documentation


def test_notes_explain_grpcurl_via_port_forward():
    proc = run_helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client")
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    for service, (_, port, _, _) in SERVICES.items():
        assert f"kubectl -n {NAMESPACE} port-forward svc/{RELEASE}-{service} {port}:{port}" in notes
    # TLS is on by default: grpcurl verifies against the CA from the TLS Secret.
    assert re.search(r"grpcurl -cacert quarry-ca.crt localhost:\d+ list", notes), notes
    assert f"get secret {RELEASE}-tls" in notes
    assert "grpc.health.v1.Health/Check" in notes
    assert "Garbage collection" not in notes
    # The console is a web page, not one of the gRPC services grpcurl reaches.
    grpc_part = notes.split("The same works for every gRPC service", 1)[1].split("\n\n", 1)[0]
    assert f"svc/{RELEASE}-{CONSOLE} " not in grpc_part
    assert "https://localhost:7407/ in a browser" in notes
    # How to use the bootstrapped admin's credentials, without printing them.
    assert f"get secret {RELEASE}-admin" in notes and "QUARRY_SECRET_ACCESS_KEY=$(" in notes
    proc = run_helm(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
        "--set",
        "tls.enabled=false",
    )
    assert re.search(r"grpcurl -plaintext localhost:\d+ list", proc.stdout), proc.stdout


def install_notes(*args: str) -> str:
    """The NOTES `helm install --dry-run` prints with `args` (--set ...)."""
    proc = run_helm(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *args
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("NOTES:", 1)[1]


@pytest.mark.parametrize("server_name", ["", "quarry.internal"])
def test_notes_commands_continued_with_a_backslash_run_as_one(server_name):
    """A shell line ending in `\\` continues on the next: a comment line there would end the
    command (the S3 example's credentials would not reach `aws`)."""
    lines = install_notes("--set", f"tls.serverName={server_name}").splitlines()
    continued = [i for i, line in enumerate(lines) if line.rstrip().endswith("\\")]
    assert continued, lines
    for i in continued:
        assert lines[i + 1].strip() and not lines[i + 1].lstrip().startswith("#"), lines[i : i + 2]
    aws = [ln for ln in lines if "aws --endpoint-url" in ln]
    assert aws and (server_name or "localhost") in aws[0]


def test_notes_mention_gc_when_enabled():
    notes = install_notes

    (line,) = [
        ln for ln in notes("--set", "gc.enabled=true").splitlines() if "Garbage collection" in ln
    ]
    assert f'"{RELEASE}-gc"' in line and "all repositories" in line and "30 3 * * *" in line, line
    assert "sweep" in line
    (line,) = [ln for ln in notes(*GC_REPOSITORY_VALUES).splitlines() if "Garbage collection" in ln]
    assert "lake-a, lake-b, lake-c" in line and "dry run" in line, line


def test_every_values_key_is_documented():
    """Each key of values.yaml has a comment right above it, or sits under a documented key,
    or is a plain grouping whose children are all documented."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    documented: dict[int, bool] = {}
    stack: list[tuple[int, int]] = []  # (indent, line number)
    children: dict[int, list[int]] = collections.defaultdict(list)
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z0-9_.\-/]+):", line)
        if not m or line.lstrip().startswith("#"):
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if stack:
            children[stack[-1][1]].append(i)
        commented = i > 0 and lines[i - 1].strip().startswith("#")
        documented[i] = commented or any(documented[j] for _, j in stack)
        stack.append((indent, i))

    def ok(i: int) -> bool:
        return documented[i] or (bool(children[i]) and all(ok(j) for j in children[i]))

    missing = [lines[i].strip() for i in documented if not ok(i)]
    assert not missing, f"undocumented values.yaml keys: {missing}"
    assert (CHART / "values.schema.json").is_file()


def test_every_service_gets_auth_on_and_the_signing_key_from_a_secret():
    docs = render()
    secret_name = full_name("auth")
    secrets = objects(docs, "Secret")
    assert sorted(secrets) == sorted(
        [secret_name, full_name("tls"), full_name("admin"), full_name("console-session")]
    ), list(secrets)
    key = base64.b64decode(secrets[secret_name]["data"]["QUARRY_AUTH_SIGNING_KEY"])
    assert len(key) >= 32
    for dep in objects(docs, "Deployment").values():
        for container in containers(dep):
            env = env_of(container)
            assert env["QUARRY_AUTH_ENABLED"]["value"] == "true"
            assert env["QUARRY_AUTH_SIGNING_KEY"]["valueFrom"] == {
                "secretKeyRef": {"name": secret_name, "key": "QUARRY_AUTH_SIGNING_KEY"}
            }


def test_a_named_signing_key_secret_is_used_and_none_is_generated():
    docs = render("--set", "auth.signingKeySecret=my-quarry-key")
    assert full_name("auth") not in objects(docs, "Secret")
    for dep in objects(docs, "Deployment").values():
        for container in containers(dep):
            ref = env_of(container)["QUARRY_AUTH_SIGNING_KEY"]["valueFrom"]["secretKeyRef"]
            assert ref["name"] == "my-quarry-key"


# ---------------------------------------------------------------------------------------------
# TLS (on by default), probes, NetworkPolicy, HPA, the admin bootstrap, single-node data


def pod_templates(docs: list[dict]) -> dict[str, dict]:
    """Every rendered pod template by its owner's name (Deployments, Jobs, CronJobs)."""
    pods = {}
    for doc in docs:
        if doc["kind"] in {"Deployment", "Job"}:
            pods[doc["metadata"]["name"]] = doc["spec"]["template"]
        elif doc["kind"] == "CronJob":
            pods[doc["metadata"]["name"]] = doc["spec"]["jobTemplate"]["spec"]["template"]
    return pods


def selects(selector: dict, labels: dict) -> bool:
    """Kubernetes label selector semantics (matchLabels and In/NotIn/Exists/DoesNotExist)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def test_generated_tls_certificate_names_every_service_and_the_probe_address():
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import padding
    from cryptography.x509.oid import ExtendedKeyUsageOID

    docs = render()
    secret = objects(docs, "Secret")[full_name("tls")]
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    cert = x509.load_pem_x509_certificate(data["tls.crt"])
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = set(sans.get_values_for_type(x509.DNSName))
    ips = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    for service in SERVICES:
        svc = full_name(service)
        for name in (svc, f"{svc}.{NAMESPACE}", f"{svc}.{NAMESPACE}.svc"):
            assert name in names, (name, sorted(names))
    assert "127.0.0.1" in ips, ips  # the exec probes and the podman CI dial it
    # Signed by the CA the clients verify against; usable as server and (mTLS) client cert.
    ca.public_key().verify(
        cert.signature,
        cert.tbs_certificate_bytes,
        padding.PKCS1v15(),
        cert.signature_hash_algorithm,
    )
    usages = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= usages
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(data["tls.key"], password=None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()


def test_tls_material_is_mounted_read_only_in_every_pod():
    docs = render("--set", "gc.enabled=true")
    for owner, template in pod_templates(docs).items():
        pod = template["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == "tls")
        assert volume["secret"]["secretName"] == full_name("tls"), owner
        assert volume["secret"]["defaultMode"] == 0o440, owner  # no world-readable key
        for c in pod["containers"]:
            mount = next(m for m in c["volumeMounts"] if m["name"] == "tls")
            assert mount == {"name": "tls", "mountPath": "/etc/quarry/tls", "readOnly": True}
    data = configmap_data(docs)
    assert "QUARRY_ALLOW_INSECURE_LISTEN" not in data  # TLS on: plaintext stays refused


def test_named_tls_secret_and_mtls_settings():
    docs = render(*SECURITY_AND_SCALING_VALUES)
    assert full_name("tls") not in objects(docs, "Secret")
    assert full_name("admin") not in objects(docs, "Secret")
    data = configmap_data(docs)
    assert data["QUARRY_TLS_CLIENT_AUTH"] == "true"
    assert data["QUARRY_TLS_SERVER_NAME"] == "quarry.internal"
    for template in pod_templates(docs).values():
        tls = next(v for v in template["spec"]["volumes"] if v["name"] == "tls")
        assert tls["secret"]["secretName"] == "quarry-tls"


def test_probes_are_native_grpc_without_tls():
    docs = render("--set", "tls.enabled=false")
    assert full_name("tls") not in objects(docs, "Secret")
    data = configmap_data(docs)
    # Plaintext on 0.0.0.0 is the operator's explicit choice (tls.enabled=false).
    assert data["QUARRY_ALLOW_INSECURE_LISTEN"] == "true"
    assert not [k for k in data if k.startswith("QUARRY_TLS_")]
    for service, (_, port, _, _) in GRPC_SERVICES.items():
        c = main_container(deployment(docs, service))
        assert grpc_probe_port(c, "livenessProbe") == grpc_probe_port(c, "readinessProbe") == port
        assert c["startupProbe"]["grpc"]["service"] == "quarry.v1.ServerInfo"
        assert c["livenessProbe"]["grpc"]["service"] == "quarry.v1.ServerInfo"
        assert c["readinessProbe"]["grpc"].get("service", "") == ""
        assert not [m for m in c["volumeMounts"] if m["name"] == "tls"]


def test_exec_probe_command_runs_against_a_real_server():
    """The rendered exec probe's module, run against a real gRPC health server: 0 when
    SERVING, 1 when NOT_SERVING or unreachable (what the kubelet acts on)."""
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    c = main_container(deployment(render(), "kv-gateway"))
    command = c["readinessProbe"]["exec"]["command"]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    # Bound here, race-free: a port picked free first can be taken before the bind (seen
    # under load), and the probe then dials nobody.
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        probe = [sys.executable, *command[1:3], f"127.0.0.1:{port}", *command[4:]]
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUARRY_")}
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert subprocess.run(probe, env=env, timeout=60).returncode == 0
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        failed = subprocess.run(probe, env=env, timeout=60, capture_output=True, text=True)
        assert failed.returncode == 1 and "NOT_SERVING" in failed.stderr
    finally:
        server.stop(None)
    gone = subprocess.run(probe, env=env, timeout=60, capture_output=True, text=True)
    assert gone.returncode == 1 and "UNREACHABLE" in gone.stderr


def test_network_policy_lets_only_the_suite_reach_kv_gateway_and_range_writer():
    docs = render("--set", "gc.enabled=true")
    policies = objects(docs, "NetworkPolicy")
    assert set(policies) == {
        full_name(s) for s in ("kv-gateway", "range-writer", S3_GATEWAY, CONSOLE)
    }
    templates = pod_templates(docs)
    for service in ("kv-gateway", "range-writer"):
        _, port, metrics_port, _ = SERVICES[service]
        spec = policies[full_name(service)]["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        # It selects exactly this service's pods.
        selected = {
            o for o, t in templates.items() if selects(spec["podSelector"], t["metadata"]["labels"])
        }
        assert selected == {full_name(service)}, selected
        grpc_rules = [r for r in spec["ingress"] if {p["port"] for p in r["ports"]} == {port}]
        assert len(grpc_rules) == 1, spec["ingress"]
        # Every rendered pod the gRPC rule admits: branch-manager, committer, compactor-sensor
        # only — not range-writer, not kv-gateway, not s3-gateway, not the gc or bootstrap jobs.
        admitted = {
            owner
            for owner, t in templates.items()
            for peer in grpc_rules[0]["from"]
            if "podSelector" in peer
            and "namespaceSelector" not in peer
            and selects(peer["podSelector"], t["metadata"]["labels"])
        }
        assert admitted == {
            full_name(s) for s in ("branch-manager", "committer", "compactor-sensor")
        }, admitted
        assert all(set(peer) == {"podSelector"} for peer in grpc_rules[0]["from"])
        # No other rule opens the gRPC port.
        others = [r for r in spec["ingress"] if r is not grpc_rules[0]]
        assert [p["port"] for r in others for p in r["ports"]] == [metrics_port]
    # Public services get no policy (users reach them); disabled → none at all.
    assert not objects(render("--set", "networkPolicy.enabled=false"), "NetworkPolicy")


def test_network_policy_extra_peers():
    docs = render(*SECURITY_AND_SCALING_VALUES)
    spec = objects(docs, "NetworkPolicy")[full_name("kv-gateway")]["spec"]
    grpc_rule = next(r for r in spec["ingress"] if r["ports"][0]["port"] == 7401)
    assert {"podSelector": {"matchLabels": {"app": "toolbox"}}} in grpc_rule["from"]
    metrics_rule = next(r for r in spec["ingress"] if r["ports"][0]["port"] == 9401)
    assert metrics_rule["from"] == [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]


def test_hpa_option_for_branch_manager_committer_range_writer_and_s3_gateway():
    assert not objects(render(), "HorizontalPodAutoscaler")  # off by default
    docs = render(*SECURITY_AND_SCALING_VALUES)
    hpas = objects(docs, "HorizontalPodAutoscaler")
    scaled = {"branch-manager", "committer", "range-writer", S3_GATEWAY}
    assert set(hpas) == {full_name(s) for s in scaled}
    for service in SERVICES:
        dep = deployment(docs, service)
        if service in scaled:
            hpa = hpas[full_name(service)]["spec"]
            assert hpa["scaleTargetRef"] == {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": full_name(service),
            }
            assert hpa["minReplicas"] == 2
            assert hpa["maxReplicas"] == (10 if service == "range-writer" else 6)
            assert hpa["metrics"][0]["resource"]["target"]["averageUtilization"] == 70
            # The HPA owns the replica count: the Deployment must not reset it on upgrade.
            assert "replicas" not in dep["spec"]
        else:
            assert "replicas" in dep["spec"]
    # PodDisruptionBudgets follow minReplicas.
    one = render(
        "--set",
        "services.committer.autoscaling.enabled=true",
        "--set",
        "services.committer.autoscaling.minReplicas=1",
    )
    assert full_name("committer") not in objects(one, "PodDisruptionBudget")


def bootstrap_job(docs: list[dict]) -> dict:
    return objects(docs, "Job")[full_name("bootstrap")]


def test_bootstrap_job_runs_quarry_setup_with_the_admin_secret():
    docs = render()
    job = bootstrap_job(docs)
    hooks = job["metadata"]["annotations"]
    assert hooks["helm.sh/hook"] == "post-install,post-upgrade"
    assert hooks["helm.sh/hook-delete-policy"] == "before-hook-creation"
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    c = pod["containers"][0]
    assert c["image"] == f"localhost/quarry:{APP_VERSION}"
    assert c["command"][:2] == ["/bin/sh", "-c"] and "quarry setup" in c["command"][2]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    env = env_of(c)
    admin = full_name("admin")
    for var, key in (
        ("QUARRY_BOOTSTRAP_ACCESS_KEY_ID", "QUARRY_ACCESS_KEY_ID"),
        ("QUARRY_BOOTSTRAP_SECRET_ACCESS_KEY", "QUARRY_SECRET_ACCESS_KEY"),
    ):
        assert env[var]["valueFrom"] == {"secretKeyRef": {"name": admin, "key": key}}
    assert env["QUARRY_BOOTSTRAP_ADMIN_USER"]["value"] == "admin"
    # The client must not log in with the admin key before setup made it.
    assert "QUARRY_ACCESS_KEY_ID" not in env and "QUARRY_SECRET_ACCESS_KEY" not in env
    secret = objects(docs, "Secret")[admin]
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    key_id = base64.b64decode(secret["data"]["QUARRY_ACCESS_KEY_ID"]).decode()
    value = base64.b64decode(secret["data"]["QUARRY_SECRET_ACCESS_KEY"]).decode()
    assert re.fullmatch(r"AKIAQ[A-Z0-9]{15}", key_id) and len(value) >= 16
    # A named Secret is used as is; auth off or bootstrap off → no Job, no admin Secret.
    named = render("--set", "bootstrap.adminSecret=quarry-admin")
    ref = env_of(bootstrap_job(named)["spec"]["template"]["spec"]["containers"][0])
    assert ref["QUARRY_BOOTSTRAP_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == (
        "quarry-admin"
    )
    assert admin not in objects(named, "Secret")
    for off in ("auth.enabled=false", "bootstrap.enabled=false"):
        docs_off = render("--set", off)
        assert not objects(docs_off, "Job") and admin not in objects(docs_off, "Secret")


SECRET = "s3cr3t-Value-0123456789abcdef"


def run_bootstrap_script(
    tmp_path: Path, outcomes: list[tuple[int, str]]
) -> subprocess.CompletedProcess:
    """The rendered bootstrap script with a stub `quarry` answering `outcomes` in turn
    ((exit code, stderr line)), printing the secret on stdout as `quarry setup` does. A stub
    `sleep` keeps the retries instant."""
    c = bootstrap_job(render())["spec"]["template"]["spec"]["containers"][0]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state = tmp_path / "calls"
    state.write_text("0")
    script = [
        "#!/bin/sh",
        f"n=$(cat {state}); echo $((n + 1)) > {state}",
        'echo "$@" >> ' + str(tmp_path / "args"),
    ]
    script.append("case $n in")
    for i, (code, err) in enumerate(outcomes):
        # The secret on stdout every time (a stricter adversary than setup, which prints it
        # only on success): whatever the outcome, the script must keep stdout out of the log.
        body = f'echo "secret access key: {SECRET}"; ' + (f"echo '{err}' >&2; " if err else "")
        script.append(f"  {i}) {body}exit {code} ;;")
    script.append("esac")
    script.append("exit 99")
    (bin_dir / "quarry").write_text("\n".join(script) + "\n")
    (bin_dir / "sleep").write_text("#!/bin/sh\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "QUARRY_BOOTSTRAP_ADMIN_USER": "admin",
        "QUARRY_BOOTSTRAP_ACCESS_KEY_ID": "AKIAQEXAMPLE00000000",
        "QUARRY_BOOTSTRAP_SECRET_ACCESS_KEY": SECRET,
    }
    return subprocess.run(c["command"], env=env, capture_output=True, text=True, timeout=60)


def test_bootstrap_script_creates_the_admin_without_printing_the_secret(tmp_path):
    proc = run_bootstrap_script(tmp_path, [(0, "")])
    assert proc.returncode == 0, proc.stderr
    assert "created with access key id AKIAQEXAMPLE00000000" in proc.stdout
    # Safety rule: the secret never reaches the pod's log (setup's stdout shows it).
    assert SECRET not in proc.stdout + proc.stderr
    args = (tmp_path / "args").read_text().split()
    assert args[:3] == ["setup", "--user-id", "admin"]
    assert args[args.index("--access-key-id") + 1] == "AKIAQEXAMPLE00000000"


def test_bootstrap_script_is_idempotent_once_an_admin_exists(tmp_path):
    exists = (1, "quarry: ADMIN_EXISTS: this installation already has an admin")
    proc = run_bootstrap_script(tmp_path, [exists, (0, "")])
    assert proc.returncode == 0 and "has an admin already; nothing to do" in proc.stdout, proc
    assert int((tmp_path / "calls").read_text()) == 2  # setup once, then whoami: no retries
    assert (tmp_path / "args").read_text().splitlines()[1] == "auth whoami"
    assert SECRET not in proc.stdout + proc.stderr
    # A rotated admin Secret (its key not one of this installation's) is said to be so:
    # setup only creates the first admin, so that key would never work.
    (tmp_path / "rotated").mkdir()
    rotated = run_bootstrap_script(
        tmp_path / "rotated", [exists, (1, "quarry: INVALID_CREDENTIALS: unknown access key")]
    )
    assert rotated.returncode == 0, rotated
    assert "AKIAQEXAMPLE00000000 or its secret is not valid here" in rotated.stderr
    assert "nothing to do" not in rotated.stdout
    assert SECRET not in rotated.stdout + rotated.stderr


def test_bootstrap_script_waits_for_branch_manager_and_fails_on_bad_input(tmp_path):
    waiting = [(1, "quarry: UNAVAILABLE: branch-manager at x:7402 does not answer")] * 3
    proc = run_bootstrap_script(tmp_path, [*waiting, (0, "")])
    assert proc.returncode == 0 and "created" in proc.stdout, proc
    assert proc.stderr.count("waiting for branch-manager") == 3
    assert SECRET not in proc.stdout + proc.stderr
    (tmp_path / "bad").mkdir()
    bad = run_bootstrap_script(
        tmp_path / "bad",
        [(1, "quarry: INVALID_ARGUMENT: a chosen secret access key must be at least 16")],
    )
    assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr
    assert SECRET not in bad.stdout + bad.stderr


def test_single_node_sqlite_and_local_data():
    docs = render(*CI_PODMAN_VALUES, "--set", "tls.enabled=true")
    data = configmap_data(docs)
    for service, (_, port, _, _) in SERVICES.items():
        # No Services under podman: every address is 127.0.0.1:<port>.
        assert data[f"QUARRY_{service.upper().replace('-', '_')}_ADDRESS"] == f"127.0.0.1:{port}"
    uses_data = {"kv-gateway", *OBJECT_STORE_USERS}
    for service in SERVICES:
        dep = deployment(docs, service)
        pod = dep["spec"]["template"]["spec"]
        assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        c = main_container(dep)
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        if service in uses_data:
            assert mounts["data"] == "/tmp/quarry-ci"  # the host's path (kube.py sets both)
            volume = next(v for v in pod["volumes"] if v["name"] == "data")
            assert volume["hostPath"] == {"path": "/tmp/quarry-ci", "type": "Directory"}
        else:
            assert "data" not in mounts, service
        # auto probes under TLS: exec (gRPC) and an HTTPS GET (the S3 gateway), which
        # deploy/local/kube.py runs from the host.
        if service in HTTP_SERVICES:
            assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
        else:
            assert "exec" in c["readinessProbe"]
    kv = env_of(main_container(deployment(docs, "kv-gateway")))["QUARRY_KV_URL"]["value"]
    assert kv == "sqlite:///tmp/quarry-ci/kv.db"
    pvc = render(
        "--set",
        "kv.backend=sqlite",
        "--set",
        "services.kvGateway.replicas=1",
        "--set",
        "localData.enabled=true",
        "--set",
        "localData.persistentVolumeClaim=quarry-data",
    )
    volume = next(
        v
        for v in deployment(pvc, "range-writer")["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "data"
    )
    assert volume["persistentVolumeClaim"] == {"claimName": "quarry-data"}


# ---------------------------------------------------------------------------------------------
# the S3 gateway: an HTTP(S) service, the one clients reach from outside the suite


def http_probe(container: dict, probe: str) -> dict:
    """The S3 gateway's probe: an httpGet of /_health on its "http" port, or the image's
    health_probe with --http (what mTLS needs); as {"kind", "scheme"/"command", ...}."""
    spec = container.get(probe)
    assert spec, f"{container['name']}: no {probe}"
    assert set(spec) & {"grpc", "tcpSocket"} == set(), f"{probe} is not an HTTP probe: {spec}"
    if "httpGet" in spec:
        get = spec["httpGet"]
        assert get["path"] == "/_health" and get["port"] == "http", get
        return {"kind": "httpGet", "scheme": get.get("scheme", "HTTP")}
    command = spec["exec"]["command"]
    assert command[:3] == ["python", "-m", "quarry.runtime.health_probe"], command
    assert command[3] == f"127.0.0.1:{SERVICES[S3_GATEWAY][1]}", command
    assert command[4:] == ["--http", "/_health"], command
    return {"kind": "exec"}


def test_s3_gateway_deployment_serves_https_with_the_suite_certificate():
    docs = render()
    dep = deployment(docs, S3_GATEWAY)
    c = main_container(dep)
    pod = dep["spec"]["template"]["spec"]
    assert c["command"] == ["quarry", "serve", S3_GATEWAY]
    assert dep["spec"]["replicas"] == 2
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": 7406, "metrics": 9406}
    # TLS on (the default): every probe is an HTTPS GET of /_health on the "http" port.
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert http_probe(c, probe) == {"kind": "httpGet", "scheme": "HTTPS"}, probe
    # The certificate every service serves, read-only, named by the shared ConfigMap.
    mount = next(m for m in c["volumeMounts"] if m["name"] == "tls")
    assert mount == {"name": "tls", "mountPath": "/etc/quarry/tls", "readOnly": True}
    tls = next(v for v in pod["volumes"] if v["name"] == "tls")
    assert tls["secret"]["secretName"] == full_name("tls")
    env = container_env(docs, c)
    assert env["QUARRY_TLS_CERT_FILE"] == "/etc/quarry/tls/tls.crt"
    assert env["QUARRY_TLS_KEY_FILE"] == "/etc/quarry/tls/tls.key"
    assert "QUARRY_ALLOW_INSECURE_LISTEN" not in env
    # Its service token for Auth/VerifySignature is signed with the suite's key, as the
    # other services' are; it dials branch-manager and committer at their Services.
    assert env_of(c)["QUARRY_AUTH_SIGNING_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": full_name("auth"), "key": "QUARRY_AUTH_SIGNING_KEY"}
    }
    assert env["QUARRY_BRANCH_MANAGER_ADDRESS"] == f"{full_name('branch-manager')}:7402"
    assert env["QUARRY_COMMITTER_ADDRESS"] == f"{full_name('committer')}:7403"
    # Its own ServiceAccount (an IRSA role that may write the object store goes there).
    assert pod["serviceAccountName"] == full_name(S3_GATEWAY)
    assert full_name(S3_GATEWAY) in objects(docs, "ServiceAccount")
    assert full_name(S3_GATEWAY) in objects(docs, "PodDisruptionBudget")


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ((), {"kind": "httpGet", "scheme": "HTTPS"}),
        (("--set", "tls.enabled=false"), {"kind": "httpGet", "scheme": "HTTP"}),
        (
            ("--set", "tls.enabled=false", "--set", "probes.type=grpc"),
            {"kind": "httpGet", "scheme": "HTTP"},
        ),
        # A kubelet's HTTPS probe presents no client certificate: under mTLS it would fail.
        (("--set", "tls.clientAuth=true"), {"kind": "exec"}),
        (("--set", "probes.type=exec"), {"kind": "exec"}),
    ],
    ids=["tls", "plaintext", "plaintext-grpc-type", "mtls", "exec-type"],
)
def test_s3_gateway_probes_follow_tls_and_probe_type(values, expected):
    c = main_container(deployment(render(*values), S3_GATEWAY))
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert http_probe(c, probe) == expected, probe


def test_s3_gateway_http_probe_command_runs_against_a_real_https_server(tmp_path):
    """The rendered exec probe (health_probe --http), run with the pod's TLS settings against
    a real HTTPS server that requires a client certificate: 0 on 200, 1 on 503, 1 without
    the certificate, 1 when nothing listens."""
    import http.server
    import ssl
    import threading

    from support.processes import free_port
    from support.tls import make_pki

    pki = make_pki(tmp_path)
    c = main_container(deployment(render("--set", "tls.clientAuth=true"), S3_GATEWAY))
    command = c["readinessProbe"]["exec"]["command"]
    answer = {"status": 200}

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(answer["status"] if self.path == "/_health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Health)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca.ca_file))
    context.load_cert_chain(pki.server.cert_file, pki.server.key_file)
    context.verify_mode = ssl.CERT_REQUIRED
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    probe = [sys.executable, *command[1:3], f"127.0.0.1:{port}", *command[4:]]
    base = {k: v for k, v in os.environ.items() if not k.startswith("QUARRY_")}
    env = dict(base, **pki.env(client_auth=True))

    def run(environment):
        return subprocess.run(probe, env=environment, timeout=60, capture_output=True, text=True)

    try:
        assert run(env).returncode == 0
        answer["status"] = 503
        failed = run(env)
        assert failed.returncode == 1 and "HTTP 503" in failed.stderr, failed.stderr
        answer["status"] = 200
        no_cert = run(dict(base, QUARRY_TLS_CA_FILE=str(pki.ca.ca_file)))
        assert no_cert.returncode == 1 and "UNREACHABLE" in no_cert.stderr, no_cert.stderr
    finally:
        server.shutdown()
        server.server_close()
    gone = run(env)
    assert gone.returncode == 1 and "UNREACHABLE" in gone.stderr


def test_s3_gateway_network_policy_open_to_clients_egress_only_to_what_it_calls():
    docs = render(
        "--set",
        "objectStore.s3.endpointUrl=http://minio:9000",
        "--set",
        "telemetry.otlpEndpoint=http://otel-collector:4317",
    )
    spec = objects(docs, "NetworkPolicy")[full_name(S3_GATEWAY)]["spec"]
    templates = pod_templates(docs)
    selected = {
        o for o, t in templates.items() if selects(spec["podSelector"], t["metadata"]["labels"])
    }
    assert selected == {full_name(S3_GATEWAY)}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    # Ingress: S3 clients from anywhere (no "from"); the metrics port as metricsFrom says.
    by_port = {r["ports"][0]["port"]: r for r in spec["ingress"]}
    assert set(by_port) == {7406, 9406}
    assert "from" not in by_port[7406] and "from" not in by_port[9406]
    # Egress: DNS, branch-manager and committer pods on their gRPC ports (never kv-gateway or
    # range-writer), the object store's port and the OTLP endpoint's port; nothing else.
    egress = spec["egress"]
    ports = sorted(p["port"] for rule in egress for p in rule["ports"])
    assert ports == sorted([53, 53, 7402, 7403, 9000, 4317]), egress
    for rule in egress:
        rule_ports = {p["port"] for p in rule["ports"]}
        if rule_ports & {7402, 7403}:
            reached = {
                o
                for o, t in templates.items()
                for peer in rule["to"]
                if selects(peer["podSelector"], t["metadata"]["labels"])
            }
            expected = "branch-manager" if rule_ports == {7402} else "committer"
            assert reached == {full_name(expected)}, (rule, reached)
    # AWS S3 (no endpoint): 443; networkPolicy.objectStoreTo narrows the destination.
    narrowed = render("--set", "networkPolicy.objectStoreTo[0].ipBlock.cidr=10.0.0.0/8")
    spec = objects(narrowed, "NetworkPolicy")[full_name(S3_GATEWAY)]["spec"]
    store = next(r for r in spec["egress"] if r["ports"][0]["port"] == 443)
    assert store["to"] == [{"ipBlock": {"cidr": "10.0.0.0/8"}}]
    assert 4317 not in {p["port"] for r in spec["egress"] for p in r["ports"]}
    # The internal services' policies do not admit the gateway (it never calls them).
    for service in ("kv-gateway", "range-writer"):
        internal = objects(docs, "NetworkPolicy")[full_name(service)]["spec"]
        grpc_rule = next(r for r in internal["ingress"] if "from" in r)
        assert not any(
            selects(peer["podSelector"], templates[full_name(S3_GATEWAY)]["metadata"]["labels"])
            for peer in grpc_rule["from"]
        )


def test_s3_gateway_plaintext_and_ports_are_configurable():
    docs = render(
        "--set",
        "tls.enabled=false",
        "--set",
        "services.s3Gateway.port=8080",
        "--set",
        "services.s3Gateway.metricsPort=9600",
    )
    c = main_container(deployment(docs, S3_GATEWAY))
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": 8080, "metrics": 9600}
    env = container_env(docs, c)
    assert env["QUARRY_S3_GATEWAY_PORT"] == "8080"
    assert int(env["QUARRY_METRICS_BASE_PORT"]) + 5 == 9600  # s3-gateway has index 5
    svc = objects(docs, "Service")[full_name(S3_GATEWAY)]
    (http,) = [p for p in svc["spec"]["ports"] if p["name"] == "http"]
    assert http["port"] == 8080 and http["appProtocol"] == "http"
    # The one Service clients outside the cluster reach: its type on its own.
    exposed = objects(render("--set", "services.s3Gateway.serviceType=LoadBalancer"), "Service")
    assert {n: s["spec"]["type"] for n, s in exposed.items()} == {
        full_name(s): ("LoadBalancer" if s == S3_GATEWAY else "ClusterIP") for s in SERVICES
    }
    assert env["QUARRY_S3_GATEWAY_ADDRESS"] == f"{full_name(S3_GATEWAY)}:8080"


def test_s3_gateway_can_be_switched_off():
    docs = render("--set", "services.s3Gateway.enabled=false")
    for kind in ("Deployment", "Service", "ServiceAccount", "NetworkPolicy", "PodDisruptionBudget"):
        assert full_name(S3_GATEWAY) not in objects(docs, kind), kind
    assert not [k for k in configmap_data(docs) if k.startswith("QUARRY_S3_GATEWAY_")]
    assert len(objects(docs, "Deployment")) == 6
    # The generated certificate still names it: switching it on later needs no new one.
    from cryptography import x509

    secret = objects(docs, "Secret")[full_name("tls")]
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert full_name(S3_GATEWAY) in sans.get_values_for_type(x509.DNSName)
    sm = render("--set", "services.s3Gateway.enabled=false", "--set", "serviceMonitor.enabled=true")
    (monitor,) = objects(sm, "ServiceMonitor").values()
    (components,) = monitor["spec"]["selector"]["matchExpressions"]
    assert S3_GATEWAY not in components["values"]
    # Invalid gateway values are refused like the others'.
    assert "/services/s3Gateway/port" in render_error("--set", "services.s3Gateway.port=70000")
    assert "/services/s3Gateway/enabled" in render_error("--set", "services.s3Gateway.enabled=yes")


# ---------------------------------------------------------------------------------------------
# docs/deploy.md's cluster install values


def docs_deploy_values() -> str:
    """The YAML block after docs/deploy.md's `<!-- deploy-values` marker, dedented."""
    text = (REPO / "docs" / "deploy.md").read_text()
    assert "<!-- deploy-values" in text, "docs/deploy.md lost its deploy-values block"
    block = re.search(r"```yaml\n(.*?)\n[ ]*```", text.split("<!-- deploy-values", 1)[1], re.S)
    assert block is not None, "no ```yaml block after the deploy-values marker"
    return textwrap.dedent(block.group(1))


def test_docs_cluster_values_render_where_the_doc_says(tmp_path):
    """Every key of the doc's values exists (the schema refuses unknown ones, so a renamed
    value fails here) and lands where the doc says it does."""
    values = yaml.safe_load(docs_deploy_values())
    path = tmp_path / "quarry-values.yaml"
    path.write_text(yaml.safe_dump(values))
    docs = render("-f", str(path))
    for doc in docs:  # valid Kubernetes objects, as the other renderings
        if (doc["apiVersion"], doc["kind"]) not in CRD_KINDS:
            kubernetes_validate.validate(doc, K8S_LATEST, strict=True)
    image = f"{values['image']['repository']}:{CHART_META['appVersion']}"
    kv = env_of(main_container(deployment(docs, "kv-gateway")))
    dynamodb = values["kv"]["dynamodb"]
    assert kv["QUARRY_KV_URL"]["value"] == (
        f"dynamodb://{dynamodb['table']}?region={dynamodb['region']}"
    )
    accounts = objects(docs, "ServiceAccount")
    assert (
        accounts[full_name("kv-gateway")]["metadata"]["annotations"]
        == (dynamodb["serviceAccount"]["annotations"])
    )
    # Every service that reads or writes objects has an identity for S3 in the doc's values
    # (with IRSA and no node role, one without would be refused by S3).
    for service in OBJECT_STORE_USERS:
        key = re.sub(r"-(\w)", lambda m: m.group(1).upper(), service)  # range-writer: rangeWriter
        expected = values["services"][key]["serviceAccount"]["annotations"]
        assert expected.get("eks.amazonaws.com/role-arn"), service
        assert accounts[full_name(service)]["metadata"]["annotations"] == expected, service
    for service in OBJECT_STORE_USERS:
        env = env_of(main_container(deployment(docs, service)))
        assert env["QUARRY_S3_REGION"]["value"] == values["objectStore"]["s3"]["region"]
        assert "QUARRY_S3_ENDPOINT_URL" not in env  # empty: AWS S3
    config = configmap_data(docs)
    assert config["QUARRY_TLS_SERVER_NAME"] == values["tls"]["serverName"]
    assert config["QUARRY_TLS_CLIENT_AUTH"] == "true"
    for dep in objects(docs, "Deployment").values():
        container = main_container(dep)
        assert container["image"] == image
        tls = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
        assert tls["secret"]["secretName"] == values["tls"]["existingSecret"]
        signing = env_of(container)["QUARRY_AUTH_SIGNING_KEY"]["valueFrom"]["secretKeyRef"]
        assert signing == {
            "name": values["auth"]["signingKeySecret"],
            "key": "QUARRY_AUTH_SIGNING_KEY",
        }
    session = env_of(main_container(deployment(docs, CONSOLE)))["QUARRY_CONSOLE_SESSION_KEY"]
    assert session["valueFrom"]["secretKeyRef"] == {
        "name": values["auth"]["consoleSessionKeySecret"],
        "key": "QUARRY_CONSOLE_SESSION_KEY",
    }
    job = objects(docs, "Job")[full_name("bootstrap")]
    setup = env_of(job["spec"]["template"]["spec"]["containers"][0])
    assert setup["QUARRY_BOOTSTRAP_ADMIN_USER"]["value"] == values["bootstrap"]["adminUser"]
    for variable, key in (
        ("QUARRY_BOOTSTRAP_ACCESS_KEY_ID", "QUARRY_ACCESS_KEY_ID"),
        ("QUARRY_BOOTSTRAP_SECRET_ACCESS_KEY", "QUARRY_SECRET_ACCESS_KEY"),
    ):
        ref = setup[variable]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": values["bootstrap"]["adminSecret"], "key": key}
    # The signing key, the admin's key and the TLS material are the operator's Secrets: the
    # chart generates none of them.
    assert objects(docs, "Secret") == {}


# ---------------------------------------------------------------------------------------------
# the web console


def test_console_deployment_serves_http_with_probes_tls_and_the_object_store():
    docs = render()  # tls.enabled is the default
    dep = deployment(docs, CONSOLE)
    assert dep["spec"]["replicas"] == 1
    c = main_container(dep)
    assert c["command"] == ["quarry", "serve", CONSOLE]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": 7407, "metrics": 9407}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/_health", "port": "http", "scheme": "HTTPS"}
    env = container_env(docs, c)
    assert int(env["QUARRY_METRICS_BASE_PORT"]) + 6 == 9407  # console has index 6
    assert env["QUARRY_TLS_CERT_FILE"] and env["QUARRY_S3_REGION"]  # TLS; reads object bytes
    assert "QUARRY_KV_URL" not in env and "AWS_ACCESS_KEY_ID" not in env
    svc = objects(docs, "Service")[full_name(CONSOLE)]
    (http,) = [p for p in svc["spec"]["ports"] if p["name"] == "http"]
    assert http["port"] == 7407 and http["appProtocol"] == "https"
    # Under mTLS the probe presents the pod's certificate (an exec probe).
    mtls = main_container(deployment(render("--set", "tls.clientAuth=true"), CONSOLE))
    assert "--http" in mtls["readinessProbe"]["exec"]["command"]


def test_console_replicas_share_a_session_key_from_a_secret_kept_across_upgrades():
    """Sessions are sealed in their cookie: every replica needs the same key, from one
    Secret the chart generates once (kept: resource-policy keep, reused by lookup) unless
    the operator names theirs. No other service gets it."""
    docs = render("--set", "services.console.replicas=3")
    name = full_name("console-session")
    secret = objects(docs, "Secret")[name]
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(base64.b64decode(secret["data"]["QUARRY_CONSOLE_SESSION_KEY"])) >= 32
    dep = deployment(docs, CONSOLE)
    assert dep["spec"]["replicas"] == 3
    ref = env_of(main_container(dep))["QUARRY_CONSOLE_SESSION_KEY"]["valueFrom"]
    assert ref == {"secretKeyRef": {"name": name, "key": "QUARRY_CONSOLE_SESSION_KEY"}}
    for other in objects(docs, "Deployment").values():
        if other is not dep:
            assert "QUARRY_CONSOLE_SESSION_KEY" not in env_of(main_container(other))
    named = render("--set", "auth.consoleSessionKeySecret=my-console-key")
    assert name not in objects(named, "Secret")
    ref = env_of(main_container(deployment(named, CONSOLE)))["QUARRY_CONSOLE_SESSION_KEY"]
    assert ref["valueFrom"]["secretKeyRef"]["name"] == "my-console-key"
    off = render("--set", "services.console.enabled=false")
    assert name not in objects(off, "Secret")


def test_console_network_policy_open_to_browsers_egress_only_to_what_it_calls():
    docs = render("--set", "objectStore.s3.endpointUrl=http://minio:9000")
    spec = objects(docs, "NetworkPolicy")[full_name(CONSOLE)]["spec"]
    templates = pod_templates(docs)
    selected = {
        o for o, t in templates.items() if selects(spec["podSelector"], t["metadata"]["labels"])
    }
    assert selected == {full_name(CONSOLE)}
    by_port = {r["ports"][0]["port"]: r for r in spec["ingress"]}
    assert set(by_port) == {7407, 9407} and "from" not in by_port[7407]
    ports = sorted(p["port"] for rule in spec["egress"] for p in rule["ports"])
    assert ports == sorted([53, 53, 7402, 7403, 7404, 9000]), spec["egress"]
    for rule in spec["egress"]:
        if "to" not in rule:
            continue
        reached = {
            o
            for o, t in templates.items()
            for peer in rule["to"]
            if selects(peer["podSelector"], t["metadata"]["labels"])
        }
        port = rule["ports"][0]["port"]
        expected = {7402: "branch-manager", 7403: "committer", 7404: "compactor-sensor"}[port]
        assert reached == {full_name(expected)}, (rule, reached)
    # Never admitted by the internal services (it never calls kv-gateway or range-writer).
    for service in ("kv-gateway", "range-writer"):
        internal = objects(docs, "NetworkPolicy")[full_name(service)]["spec"]
        grpc_rule = next(r for r in internal["ingress"] if "from" in r)
        assert not any(
            selects(peer["podSelector"], templates[full_name(CONSOLE)]["metadata"]["labels"])
            for peer in grpc_rule["from"]
        )


def test_console_can_be_switched_off():
    docs = render("--set", "services.console.enabled=false")
    for kind in ("Deployment", "Service", "ServiceAccount", "NetworkPolicy"):
        assert full_name(CONSOLE) not in objects(docs, kind), kind
    assert not [k for k in configmap_data(docs) if k.startswith("QUARRY_CONSOLE_")]
    assert "/services/console/port" in render_error("--set", "services.console.port=70000")
