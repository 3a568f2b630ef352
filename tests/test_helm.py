"""The Helm chart, rendered and linted with Helm's own Go SDK (helm-python-sdk), checked offline.

The chart's PrometheusRule and dashboard ConfigMaps read prometheus/rules and grafana/dashboards
through symlinks under files/; Helm follows them when loading and packaging (proved below).
"""

from __future__ import annotations

import functools
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

pytestmark = pytest.mark.slow  # end-to-end: real processes

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "gpu-utilization-exporter"
CI_FILES = sorted((CHART / "ci").glob("*.yaml"))
KUBE_VERSION = "1.30.0"
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
# every prometheus-operator kind the chart renders (AlertmanagerConfig is monitoring.coreos.com/v1alpha1)
OPERATOR_KINDS = {*CRD_KINDS, "AlertmanagerConfig"}

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
        if doc["kind"] in OPERATOR_KINDS:
            assert doc["apiVersion"].startswith("monitoring.coreos.com/")
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
    for off in OPERATOR_KINDS | {"ConfigMap", "Secret"}:
        assert not kind(docs, off), f"{off} is rendered although its toggle is off"


def test_without_attribution_the_container_is_non_root(chart: Any) -> None:
    docs = render(chart, {"podAttribution": {"enabled": False}})
    ctr = container(docs)
    assert ctr["securityContext"]["runAsNonRoot"] is True and ctr["securityContext"]["runAsUser"] == 10001
    assert "pod-resources" not in {m["name"] for m in ctr["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    assert env["GPU_EXPORTER_KUBERNETES_ENABLED"] == "false"


def test_sampling_is_off_by_default_and_when_on_gets_the_rate_ptrace_and_root(chart: Any) -> None:
    default = container(render(chart))
    assert "GPU_EXPORTER_SAMPLING_RATE" not in {e["name"] for e in default["env"]}
    assert "add" not in default["securityContext"]["capabilities"]
    docs = render(chart, {"sampling": {"rate": 20}, "hostPID": True, "podAttribution": {"enabled": False}})
    (ds,) = kind(docs, "DaemonSet")
    assert ds["spec"]["template"]["spec"]["hostPID"] is True
    ctr = container(docs)
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    assert env["GPU_EXPORTER_SAMPLING_RATE"] == "20"
    sc = ctr["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False and sc["allowPrivilegeEscalation"] is False


def test_sampling_without_host_pid_is_refused_with_the_reason(chart: Any) -> None:
    with pytest.raises(Exception, match=r"sampling\.rate needs hostPID: true"):
        render(chart, {"sampling": {"rate": 5}})


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
    # The chart's relabelings, then the user's, unchanged; metricRelabelings pass through too.
    values = ci_values(CHART / "ci" / "monitors-values.yaml")
    user = values["monitor"]["relabelings"]
    assert relabel[-1 - len(user)] == {"action": "labeldrop", "regex": "(pod|namespace|container)"}
    assert relabel[-len(user):] == user
    assert endpoint["metricRelabelings"] == values["monitor"]["metricRelabelings"]
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
    assert "files/thresholds.yml" in names  # the cluster label's name
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


# --- kube-prometheus-stack drop-in (issue 12 item 3) ---------------------------------------------

CRD_DIR = REPO / "tests" / "data" / "crds"
KPS_DEFAULTS = REPO / "tests" / "data" / "kube-prometheus-stack-defaults.yaml"
KPS_RELEASE = "kube-prometheus-stack"


def strict(schema: Any) -> Any:
    """An openAPIV3Schema as the API server's strict field validation applies it: an object with
    declared properties rejects unknown ones (unless it preserves unknown fields)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


class CrdLoader(yaml.SafeLoader):
    """YAML as Kubernetes reads it: a bare ``=`` (an enum value of AlertmanagerConfig's matchType) is
    a string, not YAML 1.1's value tag that PyYAML cannot construct."""


CrdLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:value"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


@functools.cache
def crd_validators() -> dict[tuple[str, str], Any]:
    """(apiVersion, kind) -> a jsonschema validator built from the vendored prometheus-operator CRDs. Built once
    per session (the CRDs' ~1 MB of YAML took 3-4 s to parse on each of the ~9 calls); read it, never change it."""
    import jsonschema

    validators: dict[tuple[str, str], Any] = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        for crd in yaml.load_all(path.read_text(), Loader=CrdLoader):  # CrdLoader is a SafeLoader
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            spec = crd["spec"]
            for version in spec["versions"]:
                if version.get("served"):
                    schema = strict(version["schema"]["openAPIV3Schema"])
                    key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                    validators[key] = jsonschema.Draft7Validator(schema)
    return validators


def test_crds_are_vendored_with_their_license() -> None:
    validators = crd_validators()
    for crd_kind in CRD_KINDS:
        assert ("monitoring.coreos.com/v1", crd_kind) in validators, f"tests/data/crds lacks the {crd_kind} CRD"
    assert "Apache License" in (CRD_DIR / "LICENSE").read_text()


def crd_errors(validators: dict[tuple[str, str], Any], doc: dict[str, Any]) -> list[str]:
    validator = validators[(doc["apiVersion"], doc["kind"])]
    return [f"{doc['kind']} {'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(doc)]


@pytest.mark.parametrize("values", [
    pytest.param({"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}, id="service-monitor"),
    pytest.param({"podMonitor": {"enabled": True}}, id="pod-monitor"),
    *(pytest.param(ci_values(p), id=p.stem) for p in CI_FILES
      if any(ci_values(p).get(k, {}).get("enabled") for k in ("serviceMonitor", "podMonitor", "prometheusRule"))),
])
def test_operator_objects_match_the_prometheus_operator_crds(chart: Any, values: dict[str, Any]) -> None:
    validators = crd_validators()
    docs = [d for d in render(chart, values) if d["kind"] in OPERATOR_KINDS]
    assert docs
    problems = [err for doc in docs for err in crd_errors(validators, doc)]
    assert not problems, problems


def test_crd_check_catches_what_the_operator_would_refuse() -> None:
    """The check can fail: a snake_case relabeling, a bad action and a missing selector are refused."""
    validators = crd_validators()
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
               "metadata": {"name": "x"},
               "spec": {"endpoints": [{"port": "metrics", "relabelings": [
                   {"source_labels": ["a"], "action": "replace"}, {"action": "rename"}]}]}}
    errors = crd_errors(validators, monitor)
    assert any("source_labels" in e for e in errors) and any("rename" in e for e in errors)
    assert any("selector" in e for e in errors)


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label selector semantics: matchLabels and matchExpressions; {} matches everything."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        present, value = expr["key"] in labels, labels.get(expr["key"])
        ok = {"In": present and value in expr["values"], "NotIn": not present or value not in expr["values"],
              "Exists": present, "DoesNotExist": not present}[expr["operator"]]
        if not ok:
            return False
    return True


def kps_defaults(release: str = KPS_RELEASE) -> dict[str, Any]:
    text = KPS_DEFAULTS.read_text().replace("{release}", release)
    defaults: dict[str, Any] = yaml.safe_load(text)
    return defaults


def test_label_selector_semantics() -> None:
    assert matches({}, {}) and matches({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"})
    assert not matches({"matchLabels": {"a": "1"}}, {"a": "2"})
    assert matches({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"})
    assert not matches({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"b": "1"})


@pytest.mark.parametrize("monitor_kind", ["serviceMonitor", "podMonitor"])
def test_kube_prometheus_stack_discovers_monitor_rules_and_dashboards(chart: Any, monitor_kind: str) -> None:
    """Every object is selected by a default kube-prometheus-stack of the release named in monitor.release."""
    kps = kps_defaults()
    values = {monitor_kind: {"enabled": True}, "prometheusRule": {"enabled": True},
              "dashboards": {"enabled": True}, "monitor": {"release": KPS_RELEASE}}
    chart.validate_schema(values)
    docs = render(chart, values)
    (ds,) = kind(docs, "DaemonSet")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    (ctr,) = ds["spec"]["template"]["spec"]["containers"]
    pod_ports = {p["name"] for p in ctr["ports"]}
    if monitor_kind == "serviceMonitor":
        (mon,) = kind(docs, "ServiceMonitor")
        assert matches(kps["prometheus"]["serviceMonitorSelector"], mon["metadata"]["labels"])
        (svc,) = kind(docs, "Service")
        assert matches(mon["spec"]["selector"], svc["metadata"]["labels"])
        assert matches({"matchLabels": svc["spec"]["selector"]}, pod_labels)
        service_ports = {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]}
        for endpoint in mon["spec"]["endpoints"]:
            assert service_ports[endpoint["port"]] in pod_ports
    else:
        (mon,) = kind(docs, "PodMonitor")
        assert matches(kps["prometheus"]["podMonitorSelector"], mon["metadata"]["labels"])
        assert matches(mon["spec"]["selector"], pod_labels)
        assert {e["port"] for e in mon["spec"]["podMetricsEndpoints"]} <= pod_ports
    assert mon["spec"]["namespaceSelector"] == {"matchNames": ["monitoring"]}
    (rule,) = kind(docs, "PrometheusRule")
    assert matches(kps["prometheus"]["ruleSelector"], rule["metadata"]["labels"])
    sidecar = kps["grafana"]["sidecar"]["dashboards"]
    maps = kind(docs, "ConfigMap")
    assert maps
    for cm in maps:
        assert cm["metadata"]["labels"][sidecar["label"]] == sidecar["labelValue"]
        assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU"}


def test_without_release_a_default_kube_prometheus_stack_finds_nothing(chart: Any) -> None:
    """The failure the release key fixes: no release label, no discovery (NOTES.txt says so)."""
    kps = kps_defaults()
    values = {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}
    docs = render(chart, values)
    (mon,) = kind(docs, "ServiceMonitor")
    (rule,) = kind(docs, "PrometheusRule")
    assert not matches(kps["prometheus"]["serviceMonitorSelector"], mon["metadata"]["labels"])
    assert not matches(kps["prometheus"]["ruleSelector"], rule["metadata"]["labels"])
    notes = chart.render(values, name="gpu", namespace="monitoring", is_install=True)
    text = next(v for k, v in notes.items() if k.endswith("NOTES.txt"))
    assert "monitor.release is empty" in text


def test_service_and_pod_monitor_are_mutually_exclusive(chart: Any) -> None:
    both = {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}
    with pytest.raises(helm.HelmValuesError, match=r"podMonitor/enabled"):
        chart.validate_schema(both)
    for path in CI_FILES:
        values = ci_values(path)
        on = [k for k in ("serviceMonitor", "podMonitor") if values.get(k, {}).get("enabled")]
        assert len(on) <= 1, f"{path.name} enables {on}: every series would be scraped twice"


def test_schema_accepts_relabelings_and_rejects_snake_case(chart: Any) -> None:
    values = ci_values(CHART / "ci" / "monitors-values.yaml")
    chart.validate_schema(values)
    with pytest.raises(helm.HelmValuesError, match="source_labels"):
        chart.validate_schema({"monitor": {"relabelings": [{"source_labels": ["a"], "action": "keep"}]}})


def test_cluster_label_comes_from_thresholds(chart: Any) -> None:
    from gpu_exporter import thresholds as thresholds_module

    name = yaml.safe_load(Path(thresholds_module.__file__).with_name("thresholds.yml").read_text())["cluster_label"]
    docs = render(chart, {"podMonitor": {"enabled": True}, "monitor": {"cluster": "eu-1"}})
    (mon,) = kind(docs, "PodMonitor")
    relabel = mon["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert {"action": "replace", "targetLabel": name, "replacement": "eu-1"} in relabel
    (mon,) = kind(render(chart, {"podMonitor": {"enabled": True}}), "PodMonitor")
    assert not any(r.get("targetLabel") == name for r in mon["spec"]["podMetricsEndpoints"][0]["relabelings"])


def test_priority_class_defaults_to_system_node_critical(chart: Any) -> None:
    (ds,) = kind(render(chart), "DaemonSet")
    assert ds["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"
    (ds,) = kind(render(chart, {"priorityClassName": ""}), "DaemonSet")
    assert "priorityClassName" not in ds["spec"]["template"]["spec"]


def test_network_policy_admits_only_the_chosen_namespaces(chart: Any) -> None:
    assert not kind(render(chart), "NetworkPolicy")
    values = ci_values(CHART / "ci" / "monitors-values.yaml")
    docs = render(chart, values)
    (policy,) = kind(docs, "NetworkPolicy")
    (ds,) = kind(docs, "DaemonSet")
    assert matches(policy["spec"]["podSelector"], ds["spec"]["template"]["metadata"]["labels"])
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    admitted: set[str] = set()
    for rule in policy["spec"]["ingress"]:
        assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
        for peer in rule["from"]:
            (expr,) = peer["namespaceSelector"]["matchExpressions"]
            assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "In"
            admitted |= set(expr["values"])
    policy_values = values["networkPolicy"]
    assert admitted == set(policy_values["scrapeNamespaces"]) | set(policy_values["trainingNamespaces"])

    def admits(namespace: str) -> bool:
        return any(matches(peer["namespaceSelector"], {"kubernetes.io/metadata.name": namespace})
                   for rule in policy["spec"]["ingress"] for peer in rule["from"])
    assert admits("monitoring") and admits("research") and not admits("default")
    with pytest.raises(helm.HelmRenderError, match="admits nobody"):
        render(chart, {"networkPolicy": {"enabled": True, "scrapeNamespaces": []}})


def test_ingest_token_from_a_created_or_existing_secret(chart: Any) -> None:
    values = ci_values(CHART / "ci" / "monitors-values.yaml")
    docs = render(chart, values)
    (secret,) = [s for s in kind(docs, "Secret") if s["metadata"]["name"].endswith("-ingest-token")]
    assert secret["stringData"] == {"token": values["ingest"]["token"]["value"]}
    ctr = container(docs)
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    assert env["GPU_EXPORTER_INGEST_TOKEN_FILE"] == "/etc/gpu-exporter/ingest/token"
    assert {"name": "ingest-token", "mountPath": "/etc/gpu-exporter/ingest", "readOnly": True} in ctr["volumeMounts"]
    (ds,) = kind(docs, "DaemonSet")
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["ingest-token"]["secret"]["secretName"] == secret["metadata"]["name"]
    assert "checksum/ingest-token" in ds["spec"]["template"]["metadata"]["annotations"]

    docs = render(chart, ci_values(CHART / "ci" / "tls-values.yaml"))
    assert not [s for s in kind(docs, "Secret") if s["metadata"]["name"].endswith("-ingest-token")]
    (ds,) = kind(docs, "DaemonSet")
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["ingest-token"]["secret"] == {"secretName": "gpu-exporter-ingest",
                                                 "items": [{"key": "bearer", "path": "bearer"}]}
    env = {e["name"]: e.get("value") for e in container(docs)["env"]}
    assert env["GPU_EXPORTER_INGEST_TOKEN_FILE"] == "/etc/gpu-exporter/ingest/bearer"
    with pytest.raises(helm.HelmRenderError, match=r"ingest\.token\.enabled needs ingest\.token\.value"):
        render(chart, {"ingest": {"token": {"enabled": True}}})


def test_ingest_token_file_from_the_chart_is_read_by_the_exporter(tmp_path: Path) -> None:
    """The mounted file (the Secret's value, as the kubelet writes it) is what the exporter accepts."""
    from gpu_exporter.ingest import _read_token

    value = ci_values(CHART / "ci" / "monitors-values.yaml")["ingest"]["token"]["value"]
    (tmp_path / "token").write_text(value)
    assert _read_token(str(tmp_path / "token")) == value.encode()


def test_default_image_is_a_placeholder_that_notes_point_out(chart: Any) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"].startswith("registry.example.com/")
    out = chart.render({}, name="gpu", namespace="monitoring", is_install=True)
    notes = next(v for k, v in out.items() if k.endswith("NOTES.txt"))
    assert "WARNING: image.repository is still the placeholder" in notes
    assert "--set image.repository=" in notes
    out = chart.render({"image": {"repository": "ghcr.io/acme/gpu-utilization-exporter"}},
                       name="gpu", namespace="monitoring", is_install=True)
    assert "WARNING" not in next(v for k, v in out.items() if k.endswith("NOTES.txt"))


def test_chart_app_version_is_the_package_version() -> None:
    import tomllib

    chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert chart_meta["appVersion"] == version
    (ctr_image,) = {container(render_default())["image"]}
    assert ctr_image.endswith(f":{version}")


def render_default() -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as loaded:
        return render(loaded)
