"""The chart's monitors and PrometheusRule in a real Prometheus, as the Prometheus Operator would load them.

Problem: a chart can render objects that pass every schema and still double series (a
ServiceMonitor and a PodMonitor on the same pods) or lose them (a selector that matches no
Service). Without a cluster, this test does what the operator does with the rendered objects:

- each ServiceMonitor endpoint / PodMonitor endpoint becomes a scrape job with the operator's
  relabeling (keep on the selector's labels and the port name, then the target labels namespace,
  service, pod, container, job and endpoint, then the monitor's own relabelings, then the
  shard hashmod) and the endpoint's metricRelabelings;
- Kubernetes discovery is replaced by static targets carrying the ``__meta_kubernetes_*`` labels
  that discovery would give the chart's Service endpoints and DaemonSet pods, plus decoys (another
  service's endpoints, another port of ours) that must be dropped;
- the targets are real exporter processes on simulated GPUs, one per "node";
- the PrometheusRule's groups become the rule file.

Then every series the exporters serve is in Prometheus exactly once per node, and every recording
rule series exactly once per GPU.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from testbed import http_get, promql, run_exporter, run_prometheus, wait_until

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "gpu-utilization-exporter"
SCENARIO = REPO / "exporter" / "gpu_exporter" / "simulate" / "scenarios" / "default.yaml"
NAMESPACE = "monitoring"
NODES = ("gpu-node-a", "gpu-node-b")

helm.disable_logging()


def snake(key: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def relabel_configs(crd_relabelings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """prometheus-operator RelabelConfig (camelCase, any action case) -> Prometheus relabel_config."""
    out = []
    for r in crd_relabelings:
        cfg = {snake(k): v for k, v in r.items()}
        if "action" in cfg:
            cfg["action"] = cfg["action"].lower()
        out.append(cfg)
    return out


def meta_name(label: str) -> str:
    """A Kubernetes label key as discovery spells it in a meta label name."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def selector_keeps(prefix: str, selector: dict[str, Any]) -> list[dict[str, Any]]:
    assert set(selector) <= {"matchLabels"}, "this test translates matchLabels selectors only"
    return [{"source_labels": [f"{prefix}_label_{meta_name(k)}", f"{prefix}_labelpresent_{meta_name(k)}"],
             "regex": f"({re.escape(v)});true", "action": "keep"}
            for k, v in selector.get("matchLabels", {}).items()]


def operator_job(monitor: dict[str, Any], index: int, endpoint: dict[str, Any], interval: str) -> dict[str, Any]:
    """The scrape job the operator generates for one endpoint of a ServiceMonitor or PodMonitor."""
    name, namespace = monitor["metadata"]["name"], monitor["metadata"]["namespace"]
    if monitor["kind"] == "ServiceMonitor":
        job_name = f"serviceMonitor/{namespace}/{name}/{index}"
        relabel = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
                   *selector_keeps("__meta_kubernetes_service", monitor["spec"]["selector"]),
                   {"source_labels": ["__meta_kubernetes_endpoint_port_name"],
                    "regex": re.escape(endpoint["port"]), "action": "keep"},
                   {"source_labels": ["__meta_kubernetes_endpoint_address_target_kind",
                                      "__meta_kubernetes_endpoint_address_target_name"],
                    "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
                   {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                   {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
                   {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                   {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
                   {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)",
                    "action": "drop"},
                   {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job",
                    "replacement": "${1}"},
                   {"target_label": "endpoint", "replacement": endpoint["port"]}]
    else:
        job_name = f"podMonitor/{namespace}/{name}/{index}"
        relabel = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
                   *selector_keeps("__meta_kubernetes_pod", monitor["spec"]["selector"]),
                   {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)",
                    "action": "drop"},
                   {"source_labels": ["__meta_kubernetes_pod_container_port_name"],
                    "regex": re.escape(endpoint["port"]), "action": "keep"},
                   {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                   {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
                   {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                   {"target_label": "job", "replacement": f"{namespace}/{name}"},
                   {"target_label": "endpoint", "replacement": endpoint["port"]}]
    relabel += relabel_configs(endpoint.get("relabelings", []))
    relabel += [{"source_labels": ["__address__"], "target_label": "__tmp_hash", "modulus": 1, "action": "hashmod"},
                {"source_labels": ["__tmp_hash"], "regex": "0", "action": "keep"}]
    return {"job_name": job_name, "honor_labels": bool(endpoint.get("honorLabels", False)),
            "scrape_interval": interval, "scrape_timeout": interval,
            "metrics_path": endpoint.get("path", "/metrics"), "scheme": endpoint.get("scheme", "http"),
            "relabel_configs": relabel,
            "metric_relabel_configs": relabel_configs(endpoint.get("metricRelabelings", []))}


def discovered(docs: list[dict[str, Any]], addresses: dict[str, str], decoy: str) -> list[dict[str, Any]]:
    """Static targets with the meta labels endpoints and pod discovery would give, plus decoys."""
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    (ctr,) = ds["spec"]["template"]["spec"]["containers"]
    services = [d for d in docs if d["kind"] == "Service"]
    targets = []
    for node, address in addresses.items():
        pod = f"{ds['metadata']['name']}-{node[-1]}"
        meta = {"__meta_kubernetes_namespace": NAMESPACE, "__meta_kubernetes_pod_name": pod,
                "__meta_kubernetes_pod_node_name": node, "__meta_kubernetes_pod_phase": "Running",
                "__meta_kubernetes_pod_container_name": ctr["name"]}
        for k, v in pod_labels.items():
            meta[f"__meta_kubernetes_pod_label_{meta_name(k)}"] = v
            meta[f"__meta_kubernetes_pod_labelpresent_{meta_name(k)}"] = "true"
        for port in ctr["ports"]:  # pod discovery: one target per container port
            targets.append({"targets": [address], "labels": {
                **meta, "__meta_kubernetes_pod_container_port_name": port["name"]}})
        for svc in services:  # endpoints discovery: one target per endpoint port of each service
            svc_meta = {"__meta_kubernetes_service_name": svc["metadata"]["name"],
                        "__meta_kubernetes_endpoint_address_target_kind": "Pod",
                        "__meta_kubernetes_endpoint_address_target_name": pod}
            for k, v in svc["metadata"]["labels"].items():
                svc_meta[f"__meta_kubernetes_service_label_{meta_name(k)}"] = v
                svc_meta[f"__meta_kubernetes_service_labelpresent_{meta_name(k)}"] = "true"
            for port in svc["spec"]["ports"]:
                targets.append({"targets": [address], "labels": {
                    **meta, **svc_meta, "__meta_kubernetes_endpoint_port_name": port["name"]}})
        # Decoys: the kubelet's endpoints on the same node, and a second port name of our pod.
        targets.append({"targets": [decoy], "labels": {
            **meta, "__meta_kubernetes_service_name": "kube-prometheus-stack-kubelet",
            "__meta_kubernetes_service_label_k8s_app": "kubelet",
            "__meta_kubernetes_service_labelpresent_k8s_app": "true",
            "__meta_kubernetes_endpoint_port_name": "https-metrics",
            "__meta_kubernetes_pod_container_port_name": "https-metrics"}})
    return targets


def scenario_for(node_index: int, tmp: Path) -> Path:
    """The default 4-GPU scenario with its own seed, so that each node has its own GPU UUIDs."""
    doc = yaml.safe_load(SCENARIO.read_text())
    doc["seed"] = 100 + node_index
    path = tmp / f"node-{node_index}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def exporters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One simulated exporter per node, {node: URL}, shared by the monitor kinds (each test only scrapes them)."""
    tmp = tmp_path_factory.mktemp("nodes")
    with contextlib.ExitStack() as stack:
        yield {node: stack.enter_context(run_exporter(["--simulate", str(scenario_for(i, tmp))]))
               for i, node in enumerate(NODES)}


def series(prom: str, match: str) -> list[dict[str, str]]:
    start = time.time() - 30
    q = urllib.parse.urlencode({"match[]": match, "start": f"{start:.0f}"})
    data: list[dict[str, str]] = json.loads(http_get(f"{prom}/api/v1/series?{q}"))["data"]
    return data


def exporter_series(url: str, dropped: re.Pattern[str]) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    out = set()
    for family in text_string_to_metric_families(http_get(url + "/metrics")):
        for s in family.samples:
            if not dropped.fullmatch(s.name):  # Prometheus stores no empty-valued label
                out.add((s.name, frozenset((k, v) for k, v in s.labels.items() if v)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("monitor_kind", ["serviceMonitor", "podMonitor"])
def test_each_series_exactly_once_through_the_operator_relabeling(exporters: dict[str, str], monitor_kind: str) -> None:
    values: dict[str, Any] = yaml.safe_load((CHART / "ci" / "monitors-values.yaml").read_text())
    values.pop("serviceMonitor", None)
    values[monitor_kind] = {"enabled": True}
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)
        out = chart.render(values, name="gpu", namespace=NAMESPACE, is_install=True)
    docs = [d for name, text in sorted(out.items()) if not name.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]
    monitors = [d for d in docs if d["kind"] in ("ServiceMonitor", "PodMonitor")]
    assert len(monitors) == 1
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    (dropped_rule,) = values["monitor"]["metricRelabelings"]
    dropped = re.compile(dropped_rule["regex"])

    hostports = {node: url.removeprefix("http://") for node, url in exporters.items()}
    decoy = "127.0.0.1:1"  # nothing listens: a kept decoy would show as a down target
    jobs = []
    for mon in monitors:
        endpoints = mon["spec"].get("endpoints") or mon["spec"]["podMetricsEndpoints"]
        for i, endpoint in enumerate(endpoints):
            job = operator_job(mon, i, endpoint, "1s")
            job["static_configs"] = discovered(docs, hostports, decoy)
            jobs.append(job)
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": ["rules.yml"], "scrape_configs": jobs}
    rules = yaml.safe_dump({"groups": rule["spec"]["groups"]})
    with run_prometheus(yaml.safe_dump(config), files={"rules.yml": rules}) as prom:
        def targets_up() -> list[dict[str, Any]] | None:
            active = json.loads(http_get(prom + "/api/v1/targets"))["data"]["activeTargets"]
            return active if active and all(t["health"] == "up" for t in active) else None
        active = wait_until(targets_up, 30, what="targets to be scraped")
        # One target per node: the Service's other ports, pod ports and the decoys are dropped.
        assert sorted(t["labels"]["node"] for t in active) == sorted(NODES)
        for t in active:
            labels = t["labels"]
            assert labels["job"] == values["monitor"].get("jobName", "gpu-exporter")
            assert labels["cluster"] == values["monitor"]["cluster"]
            assert labels["team"] == "ml-platform"  # the user's relabeling
            assert labels["exporter_namespace"] == NAMESPACE
            assert not {"pod", "namespace", "container"} & set(labels)

        # The GPUs with a busy-time counter (a MIG-enabled GPU has none): one rule series each.
        busy_uuids = {dict(labels)["uuid"] for url in exporters.values()
                      for name, labels in exporter_series(url, dropped) if name == "gpu_busy_seconds_total"}
        assert len(busy_uuids) >= 2 * len(NODES)

        def rule_series() -> list[dict[str, Any]] | None:
            result = promql(prom, "gpu:gpu_utilization:avg5m")
            return result if {r["metric"]["uuid"] for r in result} == busy_uuids else None
        gpus = wait_until(rule_series, 30, what="a recording-rule series per GPU")
        assert len(gpus) == len(busy_uuids), gpus
        for sample in gpus:
            assert sample["metric"]["cluster"] == values["monitor"]["cluster"]
        # GpuExporterDown's selector sees each exporter once.
        ups = promql(prom, 'up{job=~"gpu-exporter.*"}')
        assert sorted(u["metric"]["node"] for u in ups) == sorted(NODES)

        # Every series each exporter serves is stored exactly once for its node, and nothing
        # of the dropped family is stored at all.
        target_labels = set(active[0]["labels"])
        for node, url in exporters.items():
            expected = exporter_series(url, dropped)
            stored = Counter(
                (s["__name__"], frozenset((k, v) for k, v in s.items()
                                          if k not in target_labels and k != "__name__"))
                for s in series(prom, f'{{node="{node}",job="gpu-exporter"}}')
                if s["__name__"] not in {"up", "scrape_duration_seconds", "scrape_samples_scraped",
                                         "scrape_samples_post_metric_relabeling", "scrape_series_added"})
            assert stored, f"nothing stored for {node}"
            doubled = {k: n for k, n in stored.items() if n != 1}
            assert not doubled, doubled
            stable = {k for k in expected if not k[0].startswith("gpu_exporter_")}
            missing = {k for k in stable if k not in stored}
            assert not missing, sorted(missing)[:5]
            assert not any(dropped.fullmatch(name) for name, _ in stored)
