"""The Helm chart, rendered and linted with Helm's own Go SDK (helm-python-sdk), checked offline.

The chart's PrometheusRule and dashboard ConfigMaps read prometheus/rules and grafana/dashboards
through symlinks under files/; Helm follows them when loading and packaging (proved below).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from gpu_exporter.config import SETTINGS

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "gpu-utilization-exporter"
CI_FILES = sorted((CHART / "ci").glob("*.yaml"))
KUBE_VERSION = "1.30.0"
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}

helm.disable_logging()
logging.getLogger().setLevel(logging.WARNING)


@pytest.fixture(scope="module")
def chart() -> Any:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: Any, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every manifest the chart renders, as dicts."""
    out = chart.render(values or {}, name="gpu", namespace="monitoring", is_install=True)
    docs: list[dict[str, Any]] = []
    for name, text in sorted(out.items()):
        if name.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def kind(docs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == name]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = kind(docs, "DaemonSet")
    (ctr,) = ds["spec"]["template"]["spec"]["containers"]
    assert isinstance(ctr, dict)
    return ctr


def ci_values(path: Path) -> dict[str, Any]:
    values = yaml.safe_load(path.read_text())
    assert isinstance(values, dict)
    return values


SCENARIOS = [pytest.param({}, id="defaults")] + [pytest.param(ci_values(p), id=p.stem) for p in CI_FILES]


@pytest.mark.parametrize("values", SCENARIOS)
def test_renders_lints_and_validates(chart: Any, values: dict[str, Any]) -> None:
    chart.validate_schema(values)
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert not problems, problems
    docs = render(chart, values)
    assert kind(docs, "DaemonSet")
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_ci_scenarios_cover_the_toggles() -> None:
    names = {p.stem for p in CI_FILES}
    assert {"monitors-values", "tls-values", "no-attribution-values", "scheduling-values"} <= names


def test_default_daemonset_security_probes_and_scheduling(chart: Any) -> None:
    docs = render(chart)
    (ds,) = kind(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["hostPID"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    ctr = container(docs)
    sc = ctr["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["privileged"] is False
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # Pod attribution is on by default: root (the socket's owner), but with no capabilities.
    assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTP"}
    assert ctr["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics", "scheme": "HTTP"}
    assert ctr["resources"]["requests"] and ctr["resources"]["limits"]["memory"]
    mounts = {m["name"]: m for m in ctr["volumeMounts"]}
    assert mounts["pod-resources"] == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources",
                                       "readOnly": True}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["pod-resources"]["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    (service,) = kind(docs, "Service")
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    (account,) = kind(docs, "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    assert not kind(docs, "Role") and not kind(docs, "ClusterRole")
    for off in CRD_KINDS | {"ConfigMap", "Secret"}:
        assert not kind(docs, off), f"{off} is rendered although its toggle is off"


def test_without_attribution_the_container_is_non_root(chart: Any) -> None:
    docs = render(chart, {"podAttribution": {"enabled": False}})
    ctr = container(docs)
    assert ctr["securityContext"]["runAsNonRoot"] is True and ctr["securityContext"]["runAsUser"] == 10001
    assert "pod-resources" not in {m["name"] for m in ctr["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    assert env["GPU_EXPORTER_KUBERNETES_ENABLED"] == "false"


def test_every_exporter_env_var_is_a_known_setting(chart: Any) -> None:
    known = {s.env for s in SETTINGS}
    for values in [{}, *(ci_values(p) for p in CI_FILES)]:
        env = container(render(chart, values))["env"]
        names = {e["name"] for e in env if e["name"].startswith("GPU_EXPORTER_")}
        assert names <= known, names - known


def test_monitor_toggles_and_relabeling(chart: Any) -> None:
    docs = render(chart, {"serviceMonitor": {"enabled": True}})
    assert len(kind(docs, "ServiceMonitor")) == 1 and not kind(docs, "PodMonitor")
    docs = render(chart, {"podMonitor": {"enabled": True}})
    assert len(kind(docs, "PodMonitor")) == 1 and not kind(docs, "ServiceMonitor")
    docs = render(chart, ci_values(CHART / "ci" / "monitors-values.yaml"))
    (sm,) = kind(docs, "ServiceMonitor")
    (endpoint,) = sm["spec"]["endpoints"]
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    relabel = endpoint["relabelings"]
    assert {"action": "replace", "targetLabel": "job", "replacement": "gpu-exporter"} in relabel
    assert {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": "node"} in relabel
    assert relabel[-1] == {"action": "labeldrop", "regex": "(pod|namespace|container)"}
    assert "honorLabels" not in endpoint
    thresholds = yaml.safe_load((REPO / "prometheus" / "thresholds.yml").read_text())
    assert re.fullmatch(thresholds["exporter_job_regex"], "gpu-exporter")


def test_service_monitor_without_service_fails_clearly(chart: Any) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"serviceMonitor\.enabled needs service\.enabled"):
        render(chart, {"serviceMonitor": {"enabled": True}, "service": {"enabled": False}})


def test_prometheus_rule_equals_prometheus_rules(chart: Any) -> None:
    docs = render(chart, {"prometheusRule": {"enabled": True}})
    (rule,) = kind(docs, "PrometheusRule")
    expected = []
    files = sorted((REPO / "prometheus" / "rules").glob("*.yml"))
    assert files, "prometheus/rules has no rule files"
    for path in files:
        expected.extend(yaml.safe_load(path.read_text())["groups"])
    assert rule["spec"]["groups"] == expected


def test_dashboard_configmaps_equal_grafana_dashboards(chart: Any) -> None:
    docs = render(chart, {"dashboards": {"enabled": True, "annotations": {"grafana_folder": "GPU"}}})
    maps = kind(docs, "ConfigMap")
    files = sorted((REPO / "grafana" / "dashboards").glob("*.json"))
    assert files and len(maps) == len(files)
    by_key = {key: (cm, text) for cm in maps for key, text in cm["data"].items()}
    for path in files:
        cm, text = by_key[path.name]
        assert json.loads(text) == json.loads(path.read_text())
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU"}


def test_packaged_chart_carries_the_shared_files(tmp_path: Path) -> None:
    archive = helm.package(CHART, destination=tmp_path)
    with helm.Chart.load(archive) as packaged:
        names = {f["name"] for f in packaged.files}
    for path in (REPO / "prometheus" / "rules").glob("*.yml"):
        assert f"files/rules/{path.name}" in names
    for path in (REPO / "grafana" / "dashboards").glob("*.json"):
        assert f"files/dashboards/{path.name}" in names
    assert not any(n.startswith("ci/") for n in names)


def test_tls_scenario_uses_https_and_mounts_the_web_config(chart: Any) -> None:
    values = ci_values(CHART / "ci" / "tls-values.yaml")
    docs = render(chart, values)
    ctr = container(docs)
    assert ctr["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert ctr["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    assert env["GPU_EXPORTER_WEB_CONFIG_FILE"] == "/etc/gpu-exporter/web/web.yml"
    (secret,) = kind(docs, "Secret")
    assert yaml.safe_load(secret["stringData"]["web.yml"]) == values["webConfig"]["config"]
    (ds,) = kind(docs, "DaemonSet")
    assert "checksum/web-config" in ds["spec"]["template"]["metadata"]["annotations"]
    (sm,) = kind(docs, "ServiceMonitor")
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    assert endpoint["basicAuth"]["password"] == {"name": "gpu-exporter-scrape", "key": "password"}


def test_web_config_in_the_chart_is_accepted_by_the_exporter(tmp_path: Path) -> None:
    from gpu_exporter.web_config import WebConfigError, parse_web_config

    config = ci_values(CHART / "ci" / "tls-values.yaml")["webConfig"]["config"]
    web = parse_web_config(yaml.safe_dump(config), tmp_path)
    assert web.tls is not None and set(web.basic_auth_users) == {"prometheus"}
    with pytest.raises(WebConfigError, match="cannot load cert_file"):
        web.ssl_context()  # the certificate only exists inside the pod


@pytest.mark.parametrize("bad", [
    {"port": 70000},
    {"unknownKey": True},
    {"image": {"repository": "x", "pullPolicy": "Sometimes"}},
    {"podAttribution": {"socketDir": "relative/path"}},
    {"monitor": {"jobName": "gpu"}},
    {"monitor": {"interval": "fifteen"}},
    {"webConfig": {"scheme": "FTP"}},
    {"webConfig": {"config": {"basic_auth_users": {"prometheus": "plaintext"}}}},
    {"logLevel": "verbose"},
    {"tolerations": {"key": "nvidia.com/gpu"}},
])
def test_schema_rejects_bad_values(chart: Any, bad: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(bad)
