"""The shipped Prometheus and Alertmanager configurations: syntax, routing, Kubernetes relabeling."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_exporter.thresholds import read_thresholds_file
from gpu_exporter.verdict.alerts import TRAINING_BELOW_TARGET
from gpu_exporter.verdict.causes import BY_ID, CAUSES
from gpu_exporter.verdict.hints import EVIDENCE_ALERT
from gpu_exporter.verdict.levels import BY_LEVEL, LOW, TARGET

from testbed import alertmanager_alerts, free_port, http_get, post_alerts, run_alertmanager, run_prometheus, wait_until

REPO = Path(__file__).resolve().parents[1]
PROM = REPO / "prometheus"
AM_CONFIG = PROM / "alertmanager.yml"

promtool = shutil.which("promtool")
amtool = shutil.which("amtool")
needs_promtool = pytest.mark.skipif(promtool is None, reason="promtool not installed (apt-get install prometheus)")
needs_amtool = pytest.mark.skipif(amtool is None,
                                  reason="amtool not installed (apt-get install prometheus-alertmanager)")


def alert_rules() -> list[dict[str, Any]]:
    """Every alerting rule of the shipped (generated) alert rules file."""
    doc = yaml.safe_load((PROM / "rules" / "gpu-alerts.rules.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, cwd=cwd)


@needs_promtool
def test_compose_config_is_valid() -> None:
    proc = run([str(promtool), "check", "config", "prometheus.yml"], cwd=PROM)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 rule files found" in proc.stdout


def test_configs_scrape_with_node_label_and_share_rules() -> None:
    compose = yaml.safe_load((PROM / "prometheus.yml").read_text())
    kube = yaml.safe_load((PROM / "prometheus-kubernetes.yml").read_text())
    assert compose["rule_files"] == kube["rule_files"] == [
        "rules/gpu-recording.rules.yml", "rules/gpu-alerts.rules.yml"]
    assert compose["alerting"] == kube["alerting"]
    static = compose["scrape_configs"][0]["static_configs"][0]
    assert static["targets"] == ["exporter:9445"] and "node" in static["labels"]
    job_regex = read_thresholds_file(PROM / "thresholds.yml").text("exporter_job_regex")
    for cfg in (compose, kube):
        for job in cfg["scrape_configs"]:
            assert re.fullmatch(job_regex, job["job_name"]), f"{job['job_name']} escapes GpuExporterDown"
    assert "# remote_write:" in (PROM / "prometheus.yml").read_text()


def kubernetes_config_with_static_pods(targets: list[tuple[str, dict[str, str]]]) -> str:
    """prometheus-kubernetes.yml with pod discovery replaced by static targets carrying the same meta labels."""
    cfg: dict[str, Any] = yaml.safe_load((PROM / "prometheus-kubernetes.yml").read_text())
    for job in cfg["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        job["static_configs"] = [{"targets": [addr], "labels": labels} for addr, labels in targets]
    cfg.pop("rule_files")
    cfg.pop("alerting")
    return yaml.safe_dump(cfg)


def pod(name: str, app: str, port: str, phase: str = "Running") -> dict[str, str]:
    return {"__meta_kubernetes_pod_label_app_kubernetes_io_name": app,
            "__meta_kubernetes_pod_container_port_number": port,
            "__meta_kubernetes_pod_phase": phase,
            "__meta_kubernetes_pod_node_name": f"node-of-{name}",
            "__meta_kubernetes_namespace": "monitoring",
            "__meta_kubernetes_pod_name": name}


@pytest.mark.slow  # end-to-end: real processes
def test_kubernetes_relabeling_keeps_exporter_pods_and_sets_node(tmp_path: Path) -> None:
    targets = [(f"127.0.0.1:{free_port()}", pod("exporter-a", "gpu-utilization-exporter", "9445")),
               (f"127.0.0.1:{free_port()}", pod("exporter-b", "gpu-utilization-exporter", "9445")),
               (f"127.0.0.1:{free_port()}", pod("exporter-a", "gpu-utilization-exporter", "8080")),
               (f"127.0.0.1:{free_port()}", pod("web", "nginx", "9445")),
               (f"127.0.0.1:{free_port()}", pod("exporter-c", "gpu-utilization-exporter", "9445", "Pending"))]
    config = kubernetes_config_with_static_pods(targets)
    if promtool is not None:
        (tmp_path / "prometheus.yml").write_text(config)
        proc = run([str(promtool), "check", "config", str(tmp_path / "prometheus.yml")])
        assert proc.returncode == 0, proc.stdout + proc.stderr
    with run_prometheus(config) as url:
        def listed() -> dict[str, Any] | None:
            data: dict[str, Any] = json.loads(http_get(url + "/api/v1/targets?state=any"))["data"]
            return data if len(data["activeTargets"]) + len(data["droppedTargets"]) == len(targets) else None
        data = wait_until(listed, 20, what="targets to be discovered")
    active = sorted((t["labels"] for t in data["activeTargets"]), key=lambda labels: labels["exporter_pod"])
    assert [labels["node"] for labels in active] == ["node-of-exporter-a", "node-of-exporter-b"]
    for labels in active:
        assert labels["job"] == "gpu-exporter-kubernetes"
        assert labels["exporter_namespace"] == "monitoring"
        assert "namespace" not in labels
    assert len(data["droppedTargets"]) == 3


@needs_amtool
def test_alertmanager_config_is_valid() -> None:
    proc = run([str(amtool), "check-config", str(AM_CONFIG)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 inhibit rules" in proc.stdout and "4 receivers" in proc.stdout


@needs_amtool
@pytest.mark.parametrize(("labels", "receivers"), [
    (["severity=critical", "alertname=GpuMissing"], "oncall-webhook,slack"),
    (["severity=warning", "alertname=GpuUtilizationLow"], "slack"),
    (["severity=info", "alertname=GpuMemoryNearlyFull"], "email"),
    (["severity=info", "alertname=GpuTrainingBelowTarget", "cause=metrics_bound"], "email"),  # the low-noise one
    (["severity=info", "alertname=GpuUtilizationBelowTarget"], "email"),
    (["severity=warning", "alertname=GpuUninstrumentedInputBound", "level=low"], "slack"),  # evidence below 30%
    (["severity=info", "alertname=GpuUninstrumentedInputBound", "level=target"], "email"),
    (["alertname=SomethingElse"], "default-webhook"),
])
def test_alertmanager_routes_by_severity(labels: list[str], receivers: str) -> None:
    proc = run([str(amtool), "config", "routes", "test", f"--config.file={AM_CONFIG}", *labels])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == receivers


def test_alertmanager_groups_inhibits_and_reads_secrets_from_files() -> None:
    cfg = yaml.safe_load(AM_CONFIG.read_text())
    assert cfg["route"]["group_by"] == ["alertname", "node", "namespace"]
    causes = {cause.alert for cause in CAUSES}  # every cause alert of the one cause table
    rule = next(r for r in cfg["inhibit_rules"] if r["target_matchers"] == ['alertname="GpuUtilizationLow"'])
    assert rule["equal"] == ["uuid"]
    source = re.fullmatch(r'alertname=~"(.+)"', rule["source_matchers"][0])
    assert source is not None and causes <= set(source.group(1).split("|"))
    # /proc evidence (a hint, tried before "not instrumented" by the verdict ladder): below the low line its
    # warning (level low, the generated rules) replaces GpuUtilizationLow of the same GPU, and only that one ...
    (low,) = [r for r in cfg["inhibit_rules"]
              if r["target_matchers"] == ['alertname="GpuUtilizationLow"'] and r is not rule]
    warning = BY_LEVEL[LOW].severity
    assert low["source_matchers"] == [f'alertname="{EVIDENCE_ALERT}"', f'severity="{warning}"']
    assert low["equal"] == ["uuid"]
    levels = {(r["labels"]["level"], r["labels"]["severity"]) for r in alert_rules() if r["alert"] == EVIDENCE_ALERT}
    assert levels == {(LOW, warning), (TARGET, BY_LEVEL[TARGET].severity)}
    # ... and up to the target it replaces the generic below-target notification.
    (below,) = [r for r in cfg["inhibit_rules"] if r["target_matchers"] == ['alertname="GpuUtilizationBelowTarget"']]
    assert below["source_matchers"] == [f'alertname="{EVIDENCE_ALERT}"'] and below["equal"] == ["uuid"]
    kinds = {key for receiver in cfg["receivers"] for key in receiver if key.endswith("_configs")}
    assert kinds == {"webhook_configs", "slack_configs", "email_configs"}
    text = AM_CONFIG.read_text()
    for secret in ("credentials_file:", "api_url_file:", "auth_password_file:"):
        assert secret in text
    assert not re.search(r"^\s*(api_url|auth_password|credentials):", text, flags=re.M)


@pytest.mark.slow  # a real Alertmanager
def test_the_allocators_alert_holds_back_the_batch_too_small_alert_of_the_same_rank() -> None:
    """A real Alertmanager with the shipped inhibit rules (and a receiver that drops everything): while M4's alert
    (GpuMemoryAllocatorThrashing; GpuTrainingBelowTarget cause=allocator up to the target) holds for a run's rank,
    the same rank's M3 alert is inhibited; M3 of another rank on the same GPU, and M4 itself, are not."""
    shipped = yaml.safe_load(AM_CONFIG.read_text())
    config = {"route": {"receiver": "drop"}, "receivers": [{"name": "drop"}], "inhibit_rules": shipped["inhibit_rules"]}
    m3, m4 = BY_ID["batch_too_small"], BY_ID["allocator"]
    rank = {"uuid": "GPU-1", "run": "r", "rank": "0"}
    alerts = {  # name -> labels
        "m4": {"alertname": m4.alert, "severity": BY_LEVEL[LOW].severity, **rank},
        "m3": {"alertname": m3.alert, "severity": BY_LEVEL[LOW].severity, **rank},
        "m3 other rank": {"alertname": m3.alert, "severity": BY_LEVEL[LOW].severity, **rank, "rank": "1"},
        "m4 target": {"alertname": TRAINING_BELOW_TARGET, "cause": m4.cause, **rank, "run": "t"},
        "m3 target": {"alertname": TRAINING_BELOW_TARGET, "cause": m3.cause, **rank, "run": "t"},
    }

    def state(url: str) -> dict[str, bool] | None:
        listed = {tuple(sorted(a["labels"].items())): bool(a["status"]["inhibitedBy"])
                  for a in alertmanager_alerts(url)}
        keys = {name: tuple(sorted(labels.items())) for name, labels in alerts.items()}
        if not all(key in listed for key in keys.values()):
            return None
        found = {name: listed[key] for name, key in keys.items()}
        return found if found["m3"] and found["m3 target"] else None

    with run_alertmanager(yaml.safe_dump(config)) as url:
        post_alerts(url, list(alerts.values()))
        inhibited = wait_until(lambda: state(url), 30, what="the two M3 alerts of the rank with M4 inhibited")
    assert inhibited == {"m4": False, "m3": True, "m3 other rank": False, "m4 target": False, "m3 target": True}
