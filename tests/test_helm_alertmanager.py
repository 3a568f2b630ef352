"""The chart's AlertmanagerConfig: prometheus/alertmanager.yml's routing and inhibition for kube-prometheus-stack.

Problem: under kube-prometheus-stack the inhibition that lets a cause alert replace GpuUtilizationLow
lived only in prometheus/alertmanager.yml, so operators got both alerts. The chart now renders that
file as a prometheus-operator AlertmanagerConfig (``alertmanagerConfig.enabled``). Without a
cluster, these tests check that

- the object passes the vendored AlertmanagerConfig CRD schema (prometheus-operator v0.93.0);
- it says what prometheus/alertmanager.yml says: the Alertmanager configuration the operator would
  generate from it (reproduced here from the operator's code: receivers named
  ``<namespace>/<name>/<receiver>``, first-level route with ``continue: true``, namespace matchers
  per ``alertmanagerConfigMatcherStrategy``) equals the file, route for route, rule for rule;
- a rendered kube-prometheus-stack (its chart, vendored in tests/data/kube-prometheus-stack) selects
  it, and its Alertmanager configuration merged with ours loads into a real Alertmanager, routes each
  of our alerts as the file does, leaves other alerts alone, and inhibits GpuUtilizationLow under a
  cause alert of the same GPU, with the matcher strategy the docs prescribe (and not without it).
"""

from __future__ import annotations

import base64
import copy
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from test_helm import crd_errors, crd_validators, matches

from testbed import alertmanager_alerts, post_alerts, run_alertmanager, wait_until

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "gpu-utilization-exporter"
AM_FILE = REPO / "prometheus" / "alertmanager.yml"
KPS_CHART = REPO / "tests" / "data" / "kube-prometheus-stack"
NAMESPACE = "monitoring"
RELEASE = "gpu"
CRD_KEY = ("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig")
EXCEPT_OWN = "OnNamespaceExceptForAlertmanagerNamespace"

helm.disable_logging()


def render(values: dict[str, Any], chart: Path = CHART, name: str = RELEASE) -> list[dict[str, Any]]:
    with helm.Chart.load(chart) as loaded:
        out = loaded.render(values, name=name, namespace=NAMESPACE, is_install=True)
    return [d for _, text in sorted(out.items()) if not _.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]


def alertmanager_config(values: dict[str, Any] | None = None) -> dict[str, Any]:
    docs = render({"alertmanagerConfig": {"enabled": True, **(values or {})}})
    (config,) = [d for d in docs if d["kind"] == "AlertmanagerConfig"]
    return config


def rule_alerts() -> dict[str, str]:
    """Every alert of prometheus/rules and its severity."""
    alerts = {}
    for path in sorted((REPO / "prometheus" / "rules").glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    alerts[rule["alert"]] = rule["labels"]["severity"]
    return alerts


# --- what the operator does with an AlertmanagerConfig (pkg/alertmanager/amcfg.go, v0.93) ----------

def snake(key: str) -> str:
    special = {"apiURL": "api_url", "requireTLS": "require_tls", "sourceMatch": "source_matchers",
               "targetMatch": "target_matchers"}
    return special.get(key) or re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def matcher_strings(matchers: list[dict[str, Any]]) -> list[str]:
    """Matcher.String(): name, matchType, the quoted value."""
    return [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in matchers]


def operator_route(route: dict[str, Any], prefix: str) -> dict[str, Any]:
    """convertRoute: snake_case keys, matcher strings, receivers prefixed with namespace/name/."""
    out: dict[str, Any] = {}
    for key, value in route.items():
        if key == "matchers":
            out["matchers"] = matcher_strings(value)
        elif key == "routes":
            out["routes"] = [operator_route(r, prefix) for r in value]
        elif key == "receiver":
            out["receiver"] = prefix + value
        else:
            out[snake(key)] = value
    return out


def operator_receiver(config: Any, secrets: dict[str, Path]) -> Any:
    """A receiver (part) in Alertmanager's spelling; a Secret key reference becomes ``<key>_file``
    (the operator inlines the Secret's value; a file holding it is the same configuration)."""
    if not isinstance(config, dict):
        return config
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and set(value) == {"name", "key"}:
            out[snake(key) + "_file"] = str(secrets[value["key"]])
        else:
            out[snake(key)] = operator_receiver(value, secrets) if isinstance(value, dict) else value
    return out


def operator_config(base: dict[str, Any], amc: dict[str, Any], strategy: str, am_namespace: str,
                    secrets: dict[str, Path]) -> dict[str, Any]:
    """The Alertmanager configuration the operator generates: ``base`` plus ``amc``
    (AddAlertmanagerConfigs with the enforcer of ``strategy``)."""
    namespace, name = amc["metadata"]["namespace"], amc["metadata"]["name"]
    prefix = f"{namespace}/{name}/"
    enforce = strategy == "OnNamespace" or (strategy == EXCEPT_OWN and namespace != am_namespace)
    own = f'namespace="{namespace}"'
    config = copy.deepcopy(base)
    spec = amc["spec"]
    for rule in spec.get("inhibitRules", []):
        converted = {"source_matchers": matcher_strings(rule["sourceMatch"]),
                     "target_matchers": matcher_strings(rule["targetMatch"]), "equal": rule["equal"]}
        if enforce:
            converted["source_matchers"].append(own)
            converted["target_matchers"].append(own)
        config.setdefault("inhibit_rules", []).append(converted)
    route = operator_route(spec["route"], prefix)
    if enforce:
        route["matchers"].append(own)
    route["continue"] = True
    config["route"]["routes"] = [route, *config["route"].get("routes", [])]
    for receiver in spec["receivers"]:
        converted = {k: [operator_receiver(c, secrets) for c in v] for k, v in receiver.items() if k != "name"}
        config["receivers"].append({"name": prefix + receiver["name"], **{snake(k): v for k, v in converted.items()}})
    return config


# --- the object itself ---------------------------------------------------------------------------

def test_off_by_default() -> None:
    assert not [d for d in render({}) if d["kind"] == "AlertmanagerConfig"]


def test_it_passes_the_crd_schema_and_the_check_can_fail() -> None:
    validators = crd_validators()
    assert CRD_KEY in validators, "tests/data/crds lacks the AlertmanagerConfig CRD"
    config = alertmanager_config({"namespace": "alerting", "labels": {"alertmanager": "main"},
                                  "secretName": "gpu-alert-secrets"})
    assert config["metadata"]["namespace"] == "alerting" and config["metadata"]["labels"]["alertmanager"] == "main"
    assert not crd_errors(validators, config), crd_errors(validators, config)
    broken = copy.deepcopy(config)
    broken["spec"]["route"]["matchers"][0]["matchType"] = "=="
    broken["spec"]["receivers"][0]["webhookConfigs"][0]["send_resolved"] = True
    errors = crd_errors(validators, broken)
    assert any("'=='" in e for e in errors) and any("send_resolved" in e for e in errors), errors


def test_it_says_what_prometheus_alertmanager_yml_says(tmp_path: Path) -> None:
    """The operator's configuration from the object, less the namespacing, equals the file."""
    shipped = yaml.safe_load(AM_FILE.read_text())
    config = alertmanager_config()
    secret = config["spec"]["receivers"][1]["webhookConfigs"][0]["httpConfig"]["authorization"]["credentials"]
    assert secret["name"] == f"{RELEASE}-gpu-utilization-exporter-alertmanager"
    secrets = {key: Path("/etc/alertmanager/secrets") / key for key in ("oncall-token", "slack-webhook-url",
                                                                        "smtp-password")}
    empty = {"route": {"receiver": "null", "routes": []}, "receivers": []}
    generated = operator_config(empty, config, "None", NAMESPACE, secrets)
    prefix = f"{NAMESPACE}/{config['metadata']['name']}/"

    def unprefix(route: dict[str, Any]) -> dict[str, Any]:
        route = {**route, "receiver": route["receiver"].removeprefix(prefix)}
        if "routes" in route:
            route["routes"] = [unprefix(r) for r in route["routes"]]
        return route

    route = unprefix(generated["route"]["routes"][0])
    assert route.pop("continue") is True
    scope, *matchers = route.pop("matchers")
    if matchers:
        route["matchers"] = matchers
    assert scope == f'alertname=~"{"|".join(sorted(rule_alerts()))}"'  # this chart's alerts, every one
    assert route == shipped["route"]
    assert generated["inhibit_rules"] == shipped["inhibit_rules"]
    receivers = [{**r, "name": r["name"].removeprefix(prefix)} for r in generated["receivers"]]
    smtp = {"smarthost": shipped["global"]["smtp_smarthost"], "from": shipped["global"]["smtp_from"],
            "require_tls": shipped["global"]["smtp_require_tls"]}
    expected = [{**r, "email_configs": [{**smtp, **c} for c in r["email_configs"]]} if "email_configs" in r else r
                for r in shipped["receivers"]]
    assert receivers == expected


TEAM = {"receivers": [{"name": "team", "webhook_configs": [
            {"url": "https://hooks.example.com/gpu", "send_resolved": True,
             "http_config": {"authorization": {"credentials_file": "/etc/alertmanager/secrets/team-token"}}}]}],
        "route": {"receiver": "team", "routes": []}}
"""Values a user sets instead of editing prometheus/alertmanager.yml: the inhibit rules, everything to team."""


def test_values_set_the_receivers_and_the_route(tmp_path: Path) -> None:
    """alertmanagerConfig.receivers replaces the file's receivers and alertmanagerConfig.route the keys
    of its top-level route ("inhibitions only, route to receiver team"); the inhibit rules stay the file's."""
    shipped = yaml.safe_load(AM_FILE.read_text())
    config = alertmanager_config(TEAM)
    assert not crd_errors(crd_validators(), config), crd_errors(crd_validators(), config)
    secrets = {"team-token": tmp_path / "team-token"}
    secrets["team-token"].write_text("secret\n")
    generated = operator_config({"route": {"receiver": "null", "routes": []}, "receivers": [{"name": "null"}]},
                                config, "None", NAMESPACE, secrets)
    prefix = f"{NAMESPACE}/{config['metadata']['name']}/"
    (route,) = generated["route"]["routes"]
    assert route["receiver"] == prefix + "team" and "routes" not in route  # no severity routes
    assert route["group_by"] == shipped["route"]["group_by"]  # the keys not set stay the file's
    assert route["matchers"] == [f'alertname=~"{"|".join(sorted(rule_alerts()))}"']
    assert generated["receivers"][1:] == [{"name": prefix + "team", "webhook_configs": [
        {"url": "https://hooks.example.com/gpu", "send_resolved": True,
         "http_config": {"authorization": {"credentials_file": str(secrets["team-token"])}}}]}]
    assert generated["inhibit_rules"] == shipped["inhibit_rules"]
    # amtool on the operator's configuration: every alert of this chart, whatever its severity, goes to team
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(generated))
    for alert, severity in {"GpuUninstrumentedInputBound": "warning", "GpuMissing": "critical",
                            "GpuUtilizationBelowTarget": "info"}.items():
        assert amtool_routes(path, {"alertname": alert, "severity": severity}) == {prefix + "team"}, alert
    with helm.Chart.load(CHART) as loaded:
        out = loaded.render({"alertmanagerConfig": {"enabled": True, **TEAM}}, name=RELEASE, namespace=NAMESPACE,
                            is_install=True)
    notes = next(text for name, text in out.items() if name.endswith("NOTES.txt"))
    assert "Receivers: team (alertmanagerConfig.receivers)" in notes and "oncall-token" not in notes
    # Only the route, with the file's receivers: warnings to a file receiver of the user's choice.
    assert alertmanager_config({"route": {"receiver": "slack", "routes": []}})["spec"]["route"]["receiver"] == "slack"


def test_a_route_to_an_undefined_receiver_or_an_unknown_key_stops_the_render() -> None:
    # the file's severity routes name slack, email, ...: replacing the receivers alone leaves them undefined
    with pytest.raises(helm.HelmRenderError, match='route sends to receiver "default-webhook", which is not defined'):
        alertmanager_config({"receivers": TEAM["receivers"]})
    with pytest.raises(helm.HelmRenderError, match='receiver "teams", which is not defined'):
        alertmanager_config({**TEAM, "route": {"receiver": "teams", "routes": []}})
    with pytest.raises(helm.HelmValuesError, match="mute_time_intervals"):
        alertmanager_config({**TEAM, "route": {"receiver": "team", "mute_time_intervals": ["nights"]}})
    with pytest.raises(helm.HelmValuesError, match="name"):
        alertmanager_config({"receivers": [{"webhook_configs": [{"url": "https://hooks.example.com/gpu"}]}]})


def test_notes_name_the_secret_and_the_matcher_strategy() -> None:
    with helm.Chart.load(CHART) as loaded:
        out = loaded.render({"alertmanagerConfig": {"enabled": True, "secretName": "am-secrets"}}, name=RELEASE,
                            namespace=NAMESPACE, is_install=True)
    notes = next(text for name, text in out.items() if name.endswith("NOTES.txt"))
    assert "Secret am-secrets" in notes and "OnNamespaceExceptForAlertmanagerNamespace" in notes
    with helm.Chart.load(CHART) as loaded:
        out = loaded.render({}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    assert "AlertmanagerConfig" not in next(text for name, text in out.items() if name.endswith("NOTES.txt"))


def test_the_packaged_chart_carries_alertmanager_yml(tmp_path: Path) -> None:
    """helm package follows the files/alertmanager.yml symlink: the archive renders the same object."""
    archive = helm.package(CHART, destination=tmp_path)
    values = {"alertmanagerConfig": {"enabled": True}}
    with helm.Chart.load(archive) as packaged:
        out = packaged.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    (text,) = [text for name, text in out.items() if name.endswith("alertmanagerconfig.yaml")]
    assert yaml.safe_load(text) == alertmanager_config()


def test_a_setting_it_cannot_translate_stops_the_render(tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart, symlinks=False)
    shipped = yaml.safe_load(AM_FILE.read_text())
    shipped["route"]["routes"][0]["mute_time_intervals"] = ["nights"]
    (chart / "files" / "alertmanager.yml").write_text(yaml.safe_dump(shipped))
    with pytest.raises(helm.HelmRenderError, match="route key mute_time_intervals"):
        render({"alertmanagerConfig": {"enabled": True}}, chart)


def test_runbook_url_pattern_value_rewrites_every_link() -> None:
    pattern = "https://wiki.example.com/gpu#{anchor}"
    docs = render({"prometheusRule": {"enabled": True}, "dashboards": {"enabled": True}, "runbookUrlPattern": pattern})
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    links = {r["alert"]: r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]
             if "alert" in r}
    assert links and links == {alert: pattern.format(anchor=alert.lower()) for alert in links}
    shipped = yaml.safe_load((REPO / "exporter" / "gpu_exporter" / "thresholds.yml").read_text())
    prefix = shipped["runbook_url_pattern"].split("{anchor}")[0]
    boards = [text for d in docs if d["kind"] == "ConfigMap" for text in d["data"].values()]
    assert boards and not any(prefix in text for text in boards)  # no generated link left
    rewritten = {m for text in boards for m in re.findall(r"https://wiki\.example\.com/gpu#([a-z0-9]+)", text)}
    assert rewritten and rewritten <= {alert.lower() for alert in links}, rewritten
    with pytest.raises(helm.HelmValuesError, match="runbookUrlPattern"):  # a pattern without {anchor}
        render({"prometheusRule": {"enabled": True}, "runbookUrlPattern": "https://wiki.example.com/gpu"})


# --- in a rendered kube-prometheus-stack, with a real Alertmanager ---------------------------------

def kube_prometheus_stack(strategy: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Alertmanager object, its base configuration) of kube-prometheus-stack rendered with defaults
    (and ``alertmanagerConfigMatcherStrategy.type: strategy`` when given)."""
    values: dict[str, Any] = {}
    if strategy:
        values = {"alertmanager": {"alertmanagerSpec": {"alertmanagerConfigMatcherStrategy": {"type": strategy}}}}
    docs = render(values, KPS_CHART, name="kube-prometheus-stack")
    (manager,) = [d for d in docs if d["kind"] == "Alertmanager"]
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].startswith("alertmanager-")]
    base = yaml.safe_load(base64.b64decode(secret["data"]["alertmanager.yaml"]))
    return manager, base


def amtool_routes(config_file: Path, labels: dict[str, str]) -> set[str]:
    amtool = shutil.which("amtool")
    assert amtool, "amtool not installed (apt-get install prometheus-alertmanager)"
    proc = subprocess.run([amtool, "config", "routes", "test", f"--config.file={config_file}",
                           *(f"{k}={v}" for k, v in labels.items())], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.strip().split(","))


def write_config(tmp_path: Path, strategy: str | None) -> tuple[Path, dict[str, Any], str]:
    manager, base = kube_prometheus_stack(strategy)
    amc = alertmanager_config()
    # kube-prometheus-stack's Alertmanager selects the object: by its labels, in its namespace
    assert matches(manager["spec"]["alertmanagerConfigSelector"], amc["metadata"]["labels"])
    assert manager["spec"]["alertmanagerConfigNamespaceSelector"] == {}  # {}: every namespace
    assert manager["metadata"]["namespace"] == amc["metadata"]["namespace"] == NAMESPACE
    rendered = manager["spec"].get("alertmanagerConfigMatcherStrategy", {}).get("type", "OnNamespace")
    assert rendered == (strategy or "OnNamespace")
    secrets = {}
    for key in ("oncall-token", "slack-webhook-url", "smtp-password"):
        secrets[key] = tmp_path / key
        secrets[key].write_text("https://hooks.example.com/x\n" if key == "slack-webhook-url" else "secret\n")
    base.pop("templates", None)  # the operator's template folder: none here
    config = operator_config(base, amc, rendered, NAMESPACE, secrets)
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    return path, config, f"{NAMESPACE}/{amc['metadata']['name']}/"


@pytest.mark.slow
def test_kube_prometheus_stack_routes_our_alerts_as_the_file_does(tmp_path: Path) -> None:
    path, _, prefix = write_config(tmp_path, EXCEPT_OWN)
    shipped = tmp_path / "shipped.yml"
    shipped.write_text(AM_FILE.read_text())
    for alert, severity in rule_alerts().items():
        labels = {"alertname": alert, "severity": severity, "namespace": "team-a", "uuid": "GPU-1"}
        expected = {prefix + r for r in amtool_routes(shipped, labels)}
        assert amtool_routes(path, labels) == expected, alert
    # another chart's alert keeps kube-prometheus-stack's own route
    assert amtool_routes(path, {"alertname": "KubePodCrashLooping", "severity": "warning"}) == {"null"}
    # with the operator's default strategy, an alert of a workload namespace misses the route
    default, _, _ = write_config(tmp_path, None)
    assert amtool_routes(default, {"alertname": "GpuUtilizationLow", "severity": "warning",
                                   "namespace": "team-a"}) == {"null"}


def inhibited(url: str) -> dict[tuple[str, str], bool]:
    return {(a["labels"]["alertname"], a["labels"]["uuid"]): bool(a["status"]["inhibitedBy"])
            for a in alertmanager_alerts(url)}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [EXCEPT_OWN, None])
def test_kube_prometheus_stack_inhibits_gpu_utilization_low_under_a_cause(tmp_path: Path, strategy: str | None) -> None:
    """A real Alertmanager with kube-prometheus-stack's configuration plus ours: GpuUtilizationLow
    of a GPU with a cause alert is inhibited; of another GPU it is not. Under the operator's default
    strategy (namespace matchers) nothing is inhibited: the alerts carry the workload's namespace."""
    _, config, _ = write_config(tmp_path, strategy)
    low = {"alertname": "GpuUtilizationLow", "severity": "warning", "namespace": "team-a"}
    with run_alertmanager(yaml.safe_dump(config)) as url:
        post_alerts(url, [{**low, "uuid": "GPU-1"}, {**low, "uuid": "GPU-2"},
                          {"alertname": "GpuTrainingInputBound", "severity": "warning", "namespace": "team-a",
                           "uuid": "GPU-1"}])

        def listed() -> dict[tuple[str, str], bool] | None:
            state = inhibited(url)
            return state if len(state) == 3 else None

        wait_until(listed, 30, what="the three alerts")
        if strategy:
            # inhibition is applied once the source alert is in; wait for it rather than a fixed time
            state = wait_until(lambda: (s := inhibited(url))[("GpuUtilizationLow", "GPU-1")] and s, 30,
                               what="GpuUtilizationLow of GPU-1 inhibited")
        else:
            time.sleep(2)  # what the other strategy needs to inhibit (above) is well under this
            state = inhibited(url)
    assert state[("GpuUtilizationLow", "GPU-1")] is bool(strategy)
    assert state[("GpuUtilizationLow", "GPU-2")] is False
    assert state[("GpuTrainingInputBound", "GPU-1")] is False
