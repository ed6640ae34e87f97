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
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "quarry"
HELM = REPO / ".tools" / "bin" / "helm"
RELEASE = "qa"
NAMESPACE = "quarry-test"

# name -> (values key, gRPC port, metrics port, default replicas); order = quarry.config.SERVICES
SERVICES = {
    "kv-gateway": ("kvGateway", 7401, 9401, 2),
    "branch-manager": ("branchManager", 7402, 9402, 2),
    "committer": ("committer", 7403, 9403, 2),
    "compactor-sensor": ("compactorSensor", 7404, 9404, 1),
    "range-writer": ("rangeWriter", 7405, 9405, 2),
}
OBJECT_STORE_USERS = {"range-writer", "branch-manager"}
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


# ---------------------------------------------------------------------------------------------
# helpers


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
    docs = tuple(d for d in yaml.safe_load_all(proc.stdout) if d)
    assert docs, "helm template rendered nothing"
    return docs


def render(*args: str, release: str = RELEASE) -> list[dict]:
    return list(_template(release, tuple(args)))


def render_error(*args: str) -> str:
    proc = run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert proc.returncode != 0, (
        f"helm template {' '.join(args)} should have failed but rendered:\n{proc.stdout[:2000]}"
    )
    assert not [d for d in yaml.safe_load_all(proc.stdout or "") if d], "rendered despite error"
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
        "Deployment": 5,
        "Service": 5,
        "ServiceAccount": 5,
        "ConfigMap": 1,
        "PodDisruptionBudget": 4,  # every service but compactor-sensor (1 replica)
        "Secret": 1,  # the auth signing key the chart generates (auth.signingKeySecret empty)
    }, kinds
    expected = {full_name(s) for s in SERVICES}
    assert set(objects(docs, "Deployment")) == expected
    assert set(objects(docs, "Service")) == expected
    assert all(d["metadata"].get("namespace") == NAMESPACE for d in docs)


@pytest.mark.parametrize("service", SERVICES)
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
    assert c["image"] == f"quarry:{APP_VERSION}"
    assert c["imagePullPolicy"] == "IfNotPresent"

    ports = {p["name"]: p for p in c["ports"]}
    assert ports["grpc"]["containerPort"] == port and ports["grpc"].get("protocol", "TCP") == "TCP"
    assert ports["metrics"]["containerPort"] == metrics_port
    for probe in ("livenessProbe", "readinessProbe"):
        assert grpc_probe_port(c, probe) == port, probe
    if "startupProbe" in c:
        assert grpc_probe_port(c, "startupProbe") == port
        assert c["startupProbe"]["grpc"]["service"] == "quarry.v1.ServerInfo"
    # A service waiting for a dependency is NOT_SERVING overall: it must leave the endpoints
    # (readiness on "") but not be restarted (liveness on ServerInfo, SERVING while it runs).
    assert c["livenessProbe"]["grpc"]["service"] == "quarry.v1.ServerInfo"
    assert c["readinessProbe"]["grpc"].get("service", "") == ""

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
    assert set(ports) == {"grpc", "metrics"}
    assert ports["grpc"]["port"] == port and ports["metrics"]["port"] == metrics_port
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
        "QUARRY_LOG_LEVEL": "INFO",
        "OTEL_TRACES_EXPORTER": "none",
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
        assert settings.port_of(service) == ports["grpc"]
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
            assert int(port) in {p["port"] for p in target["spec"]["ports"] if p["name"] == "grpc"}
        if service == "kv-gateway":
            assert settings.kv_url.startswith("dynamodb://")
        else:
            assert settings.kv_url == "", f"{service} has a KV URL"


# ---------------------------------------------------------------------------------------------
# Kubernetes schema validation of everything rendered


@pytest.mark.parametrize("k8s_version", [K8S_FLOOR, K8S_LATEST])
@pytest.mark.parametrize(
    "values",
    [(), FULL_VALUES, GC_REPOSITORY_VALUES],
    ids=["defaults", "all-options", "gc-repositories"],
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
        secret_volumes = [
            v
            for v in dep["spec"]["template"]["spec"]["volumes"]
            if "secret" in v or "projected" in v
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


def test_object_store_settings_only_for_range_writer_and_branch_manager():
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
    assert kinds["Deployment"] == 5 and kinds["Service"] == 5 and kinds["ServiceMonitor"] == 1, (
        kinds
    )
    (sm,) = objects(docs, "ServiceMonitor").values()
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["namespace"] == NAMESPACE
    spec = sm["spec"]
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert [e["port"] for e in spec["endpoints"]] == ["metrics"]
    assert spec["endpoints"][0]["interval"] == "15s"
    # The selector picks exactly the five Quarry Services of this release.
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
    }
    pdbs = objects(docs, "PodDisruptionBudget")
    assert set(pdbs) == {full_name(s) for s in ("branch-manager", "committer", "compactor-sensor")}
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
    assert grpc_probe_port(c, "livenessProbe") == grpc_probe_port(c, "readinessProbe") == 8401
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
    )
    data = configmap_data(docs)
    assert data["QUARRY_MAX_WORKERS"] == "64"  # extraEnv
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
    assert not objects(docs, "CronJob") and not objects(docs, "Job")
    assert full_name(GC) not in objects(docs, "ServiceAccount")  # gc.serviceAccount.create is true
    assert not objects(render("--set-string", "gc.serviceAccount.annotations.a=b"), "CronJob")


def test_gc_cronjob_defaults():
    docs = render("--set", "gc.enabled=true")
    kinds = collections.Counter(d["kind"] for d in docs)
    assert kinds["CronJob"] == 1 and kinds["ServiceAccount"] == 6 and kinds["Deployment"] == 5, (
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
    # Same image and security conventions as the Deployments.
    dep_c = main_container(deployment(docs, "range-writer"))
    dep_pod = deployment(docs, "range-writer")["spec"]["template"]["spec"]
    assert (c["image"], c["imagePullPolicy"]) == (dep_c["image"], dep_c["imagePullPolicy"])
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
    assert not [v for v in gc_pod(gc_cronjob(docs))["volumes"] if "secret" in v or "projected" in v]


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
    assert c["image"] == f"registry.example.com/quarry:{APP_VERSION}"
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
    assert re.search(r"grpcurl -plaintext localhost:\d+ list", notes), notes
    assert "grpc.health.v1.Health/Check" in notes
    assert "Garbage collection" not in notes


def test_notes_mention_gc_when_enabled():
    def notes(*args):
        proc = run_helm(
            "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *args
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split("NOTES:", 1)[1]

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
    assert list(secrets) == [secret_name], list(secrets)
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
    assert "Secret" not in {d["kind"] for d in docs}
    for dep in objects(docs, "Deployment").values():
        for container in containers(dep):
            ref = env_of(container)["QUARRY_AUTH_SIGNING_KEY"]["valueFrom"]["secretKeyRef"]
            assert ref["name"] == "my-quarry-key"
