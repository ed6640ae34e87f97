"""The Grafana dashboard (deploy/grafana/quarry.json) is well-formed, and the chart ships it
next to the ServiceMonitor when asked. That it queries only metrics the services export is
checked against live services in test_observability.py."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from support import k8s_validation as kubernetes_validate
from support.yaml_docs import documents

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "quarry.json"
CHART = REPO / "deploy" / "helm" / "quarry"
HELM = REPO / ".tools" / "bin" / "helm"

# What operators need to see (issue 13): a metric family per concern.
REQUIRED = {
    "RPC rate / errors": "quarry_rpc_requests_total",
    "RPC latency": "quarry_rpc_duration_seconds_bucket",
    "dirty vs clean reads": "graveler_branch_reads_total",
    "staging read attempts": "graveler_staging_read_attempts_total",
    "capacity units": "quarry_kv_read_units_total",
    "throttles": "quarry_kv_throttled_total",
    "compaction": "quarry_compactions_total",
    "range writer": "quarry_range_writer_ranges_total",
    "S3 gateway requests": "quarry_s3_requests_total",
    "S3 gateway staging calls": "quarry_s3_staging_calls_total",
}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_the_dashboard_is_well_formed():
    board = dashboard()
    assert board["title"] and board["uid"] and board["schemaVersion"] >= 30
    datasource = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert [v["query"] for v in datasource] == ["prometheus"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    queried = []
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            # Balanced brackets: a truncated query would fail in Grafana only.
            for open_, close in ("()", "{}", "[]"):
                assert expr.count(open_) == expr.count(close), (panel["title"], expr)
            queried.append(expr)
    for concern, metric in REQUIRED.items():
        assert any(re.search(rf"\b{metric}\b", q) for q in queried), concern


def test_no_panel_queries_per_branch_series_unbounded():
    """Per-branch panels aggregate with topk: the labels are capped, the panel too."""
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            if "by (repo, branch)" in target["expr"]:
                assert target["expr"].startswith("topk("), panel["title"]


def _render(*values: str) -> list[dict]:
    proc = subprocess.run(
        [str(HELM), "template", "qa", str(CHART), "--namespace", "q", *values],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return documents(proc.stdout)


def test_the_chart_ships_the_dashboard_with_the_service_monitor():
    docs = _render(
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "serviceMonitor.grafanaDashboard.enabled=true",
    )
    (board,) = [d for d in docs if d["kind"] == "ConfigMap" and "quarry.json" in d["data"]]
    assert json.loads(board["data"]["quarry.json"]) == dashboard()
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["metadata"]["namespace"] == "q"
    kubernetes_validate.validate(board, kubernetes_validate.latest_version(), strict=True)
    assert [d["kind"] for d in docs].count("ServiceMonitor") == 1


def test_no_dashboard_without_the_service_monitor_or_by_default():
    for values in ((), ("--set", "serviceMonitor.enabled=true")):
        docs = _render(*values, "--set", "serviceMonitor.grafanaDashboard.enabled=false")
        assert not [d for d in docs if "quarry.json" in (d.get("data") or {})]
    docs = _render("--set", "serviceMonitor.grafanaDashboard.enabled=true")
    assert not [d for d in docs if "quarry.json" in (d.get("data") or {})]
