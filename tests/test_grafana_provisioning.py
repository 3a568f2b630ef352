"""Grafana provisioning files: they parse, reference only what exists, and alert like Prometheus does.

The Grafana-managed alert rules must use the same query, threshold, window and pending period as
GpuUtilizationLow and GpuIdleButAllocated in prometheus/rules/, which come from prometheus/thresholds.yml.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
GRAFANA = REPO / "grafana"
PROVISIONING = GRAFANA / "provisioning"
ENV_REF = re.compile(r"^\$\{?([A-Z][A-Z0-9_]*)\}?$")

# Grafana rule title -> (threshold key, pending-period key) in prometheus/thresholds.yml.
MIRRORED_ALERTS = {
    "GpuUtilizationLow": ("utilization_low_threshold", "utilization_low_for"),
    "GpuIdleButAllocated": ("idle_utilization_threshold", "idle_for"),
}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def thresholds() -> dict[str, Any]:
    data: dict[str, Any] = load_yaml(REPO / "prometheus" / "thresholds.yml")
    return data


def datasources() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for path in sorted((PROVISIONING / "datasources").glob("*.yml")):
        found.extend(load_yaml(path)["datasources"])
    return found


def alerting() -> dict[str, Any]:
    merged: dict[str, list[Any]] = {"groups": [], "contactPoints": [], "policies": []}
    for path in sorted((PROVISIONING / "alerting").glob("*.yml")):
        doc = load_yaml(path)
        assert doc["apiVersion"] == 1, path
        for key in merged:
            merged[key].extend(doc.get(key, []))
    return merged


def grafana_rules() -> dict[str, dict[str, Any]]:
    return {rule["title"]: rule for group in alerting()["groups"] for rule in group["rules"]}


def prometheus_alerts() -> dict[str, dict[str, Any]]:
    rules: dict[str, dict[str, Any]] = {}
    for path in sorted((REPO / "prometheus" / "rules").glob("*.yml")):
        for group in load_yaml(path)["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    rules[rule["alert"]] = rule
    return rules


def recording_rules() -> dict[str, str]:
    rules: dict[str, str] = {}
    for path in sorted((REPO / "prometheus" / "rules").glob("*.yml")):
        for group in load_yaml(path)["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    rules[rule["record"]] = rule["expr"]
    return rules


def dashboards() -> dict[str, dict[str, Any]]:
    return {d["uid"]: d for d in (json.loads(p.read_text()) for p in sorted((GRAFANA / "dashboards").rglob("*.json")))}


def squash(expr: str) -> str:
    return re.sub(r"\s+", "", expr)


def test_one_prometheus_datasource_with_fixed_uid_and_url_from_the_environment() -> None:
    sources = datasources()
    assert len(sources) == 1
    (ds,) = sources
    assert ds["type"] == "prometheus" and ds["access"] == "proxy" and ds["isDefault"] is True
    assert re.fullmatch(r"[a-z0-9-]+", ds["uid"])
    # Grafana expands $VAR / ${VAR} in provisioning files; compose and Kubernetes set the variable.
    assert ENV_REF.match(ds["url"]), f"url should come from an environment variable, not {ds['url']!r}"


def test_dashboard_provider_reads_the_shipped_folder_with_folders_from_files() -> None:
    (provider,) = load_yaml(PROVISIONING / "dashboards" / "gpu-exporter.yml")["providers"]
    assert provider["type"] == "file"
    options = provider["options"]
    assert options["foldersFromFilesStructure"] is True
    # Grafana ignores foldersFromFilesStructure when folder or folderUid is set.
    assert "folder" not in provider and "folderUid" not in provider
    assert options["path"].startswith("/") and options["path"].rstrip("/").endswith("/dashboards")
    files = sorted((GRAFANA / "dashboards").rglob("*.json"))
    assert len(files) >= 4
    for path in files:
        assert isinstance(json.loads(path.read_text()), dict), path


def test_dashboards_default_to_the_provisioned_datasource() -> None:
    uid = datasources()[0]["uid"]
    for dash in dashboards().values():
        (var,) = [v for v in dash["templating"]["list"] if v["name"] == "datasource"]
        assert var["current"]["value"] == uid, dash["uid"]


def test_alert_rules_reference_existing_datasources_refids_dashboards_and_panels() -> None:
    uid = datasources()[0]["uid"]
    boards = dashboards()
    rules = grafana_rules()
    assert set(rules) == set(MIRRORED_ALERTS)
    uids = [r["uid"] for r in rules.values()]
    assert len(uids) == len(set(uids))
    for title, rule in rules.items():
        refs = {q["refId"] for q in rule["data"]}
        assert rule["condition"] in refs, title
        for query in rule["data"]:
            assert query["datasourceUid"] in (uid, "__expr__"), title
            assert query["model"]["refId"] == query["refId"]
            if query["datasourceUid"] == "__expr__":
                assert query["model"]["expression"] in refs, title
        ann = rule["annotations"]
        board = boards[ann["__dashboardUid__"]]
        assert int(ann["__panelId__"]) in {p["id"] for p in board["panels"]}, title
        assert rule["labels"]["severity"] in ("info", "warning", "critical")


def test_contact_point_forwards_to_an_external_alertmanager_from_the_environment() -> None:
    doc = alerting()
    names = {cp["name"] for cp in doc["contactPoints"]}
    (policy,) = doc["policies"]
    assert policy["receiver"] in names
    (receiver,) = [r for cp in doc["contactPoints"] for r in cp["receivers"]]
    assert receiver["type"] == "prometheus-alertmanager"
    assert ENV_REF.match(receiver["settings"]["url"])


@pytest.mark.parametrize("title", sorted(MIRRORED_ALERTS))
def test_grafana_alert_matches_the_prometheus_alert_and_thresholds_file(title: str) -> None:
    threshold_key, for_key = MIRRORED_ALERTS[title]
    limits = thresholds()
    grafana = grafana_rules()[title]
    prom = prometheus_alerts()[title]

    # Pending period: thresholds.yml == Prometheus rule == Grafana rule.
    assert grafana["for"] == prom["for"] == limits[for_key]

    # Threshold: the Grafana threshold expression compares the reduced query with the same number
    # that the Prometheus expression writes after the 5m utilization recording rule.
    by_ref = {q["refId"]: q["model"] for q in grafana["data"]}
    condition = by_ref[grafana["condition"]]
    assert condition["type"] == "threshold"
    (evaluator,) = [c["evaluator"] for c in condition["conditions"]]
    assert evaluator["type"] == "lt"
    assert evaluator["params"] == [limits[threshold_key]]
    comparison = f"gpu:gpu_utilization:avg5m < {limits[threshold_key]}"
    assert comparison in prom["expr"]

    # Query and window: Grafana's query is the Prometheus expression without the comparison, so the
    # same recording rule (and so the same rate window) and the same "has work" condition apply.
    (query,) = [m for m in by_ref.values() if "expr" in m]
    assert squash(query["expr"]) == squash(prom["expr"].replace(comparison, "gpu:gpu_utilization:avg5m"))
    window = re.fullmatch(r"rate\(gpu_busy_seconds_total\[(\w+)\]\)", recording_rules()["gpu:gpu_utilization:avg5m"])
    assert window is not None and window.group(1) == "5m"

    # Labels and runbook: the same severity and the same runbook section.
    assert grafana["labels"]["severity"] == prom["labels"]["severity"]
    assert grafana["annotations"]["runbook_url"] == prom["annotations"]["runbook_url"]
