"""Fleets past one Prometheus: agent-mode Prometheus per cluster -> remote write -> central store.

Problem: past one Prometheus, the data reaches the rules and dashboards by remote write, with a
`cluster` label from each agent's external_labels. The shipped prometheus/prometheus-agent.yml,
the rules and the dashboards must work there, and two clusters with the same node names must
not merge.

The slow test runs two tiers for real (bench/fleet.py holds the machinery): two agent-mode
Prometheus servers (clusters "east" and "west", each scraping one simulated 8-GPU node named
gpu-node-1; east also a dead target) remote-write into a Prometheus started with
--web.enable-remote-write-receiver, which evaluates the shipped rules with durations shrunk 60-fold
(the transform of tests/test_alerting_e2e.py). Then alerts fire there with their cluster, and the
dashboards' queries return data carrying it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_alerting_e2e import SCALE, fast_rules

from bench import fleet
from testbed import free_port, http_get, promql, run_alertmanager, run_victoriametrics, run_vmalert, wait_until

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "prometheus" / "prometheus-agent.yml"
CLUSTERS = ("east", "west")
NODE = "gpu-node-1"  # the same node name in both clusters


def test_agent_config_is_valid_for_agent_mode() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    proc = subprocess.run([promtool, "check", "config", "--agent", str(AGENT)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_agent_config_labels_the_cluster_and_scrapes_exporter_jobs() -> None:
    cfg = yaml.safe_load(AGENT.read_text())
    thresholds = yaml.safe_load((REPO / "prometheus" / "thresholds.yml").read_text())
    assert set(cfg["global"]["external_labels"]) == {thresholds["cluster_label"]}
    for job in cfg["scrape_configs"]:
        assert re.fullmatch(thresholds["exporter_job_regex"], job["job_name"])
        for static in job["static_configs"]:
            assert "node" in static["labels"]
    (remote,) = cfg["remote_write"]
    assert remote["url"].endswith(fleet.REMOTE_WRITE_PATH)
    # Agent mode refuses rules and alerting: they run on the central store.
    assert "rule_files" not in cfg and "alerting" not in cfg


def test_agent_config_transform_keeps_the_shipped_settings() -> None:
    text = fleet.agent_config("east", {"a": "127.0.0.1:1"}, "http://127.0.0.1:2/api/v1/write",
                              scrape_interval="1s", batch_send_deadline="1s")
    cfg = yaml.safe_load(text)
    shipped = yaml.safe_load(AGENT.read_text())
    assert cfg["global"]["external_labels"] == {fleet.CLUSTER_LABEL: "east"}
    assert cfg["scrape_configs"][0]["job_name"] == shipped["scrape_configs"][0]["job_name"]
    assert cfg["scrape_configs"][0]["static_configs"] == [{"targets": ["127.0.0.1:1"], "labels": {"node": "a"}}]
    assert cfg["remote_write"][0]["queue_config"]["batch_send_deadline"] == "1s"


def test_dashboard_queries_have_every_variable_resolved() -> None:
    queries = fleet.dashboard_queries(fleet.grafana_variables())
    assert len(queries) > 20
    assert all("$" not in expr for _, _, expr in queries)
    with pytest.raises(ValueError, match="no value for"):
        fleet.dashboard_queries({})


def test_a_tables_queries_are_instant_and_a_time_series_are_not() -> None:
    """The bench times as a 5-minute range only the queries Grafana asks a range of: not a table's."""
    kinds = {(dashboard, title): instant for dashboard, title, _, instant in fleet.panel_queries(
        fleet.grafana_variables())}
    assert kinds["gpu-fleet-overview", "Effective utilization by GPU"] is True  # a table
    assert kinds["gpu-fleet-overview", "Busy vs effective utilization by GPU (5m mean)"] is False  # a time series
    assert 0 < sum(kinds.values()) < len(kinds)


def firing(url: str, alertname: str) -> list[dict[str, Any]]:
    """Firing alerts named ``alertname`` of a Prometheus or a vmalert (same API path)."""
    alerts: list[dict[str, Any]] = json.loads(http_get(url + "/api/v1/alerts"))["data"]["alerts"] or []
    return [a for a in alerts
            if (a["labels"].get("alertname") or a.get("name")) == alertname and a["state"] == "firing"]


def check_dashboards(store: str, cluster: str) -> None:
    """Every dashboard query for ``cluster`` runs on ``store``; each labelled series carries the
    cluster, the utilization, busy-time and memory panels have data, and most queries answer."""
    rate_window = f"{max(2, 300 // SCALE)}s"
    queries = fleet.dashboard_queries(fleet.grafana_variables(cluster, rate_interval=rate_window))
    answered = 0
    for dashboard, title, expr in queries:
        result = promql(store, expr)
        for series in result:
            labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
            if labels:
                assert labels.get(fleet.CLUSTER_LABEL) == cluster, (dashboard, title, expr, labels)
        answered += bool(result)
    must = [q for q in queries if re.search(r"gpu:gpu_utilization:avg5m|node:gpu_utilization:avg5m|"
                                            r"gpu_busy_seconds_total|gpu_memory_used_bytes", q[2])]
    assert len(must) >= 4
    empty = [(d, t, e) for d, t, e in must if not promql(store, e) and "< 0.3" not in e and "run" not in e]
    assert not empty, empty
    assert answered >= len(queries) // 2, f"only {answered} of {len(queries)} dashboard queries had data"


@pytest.fixture(scope="module")
def victoriametrics_tiers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """An agent of cluster east (one simulated node and a dead target) remote-writing into VictoriaMetrics' single-node
    server, with the shipped rules (shrunk) run by vmalert, which writes recording results back and notifies a real
    Alertmanager; yields (store URL, vmalert URL). Started once per module: the Prometheus tiers' test asks for it
    too, so that its windows fill and its alerts come due while that test waits for its own."""
    rules = {path.name: fast_rules(path) for path in sorted(fleet.RULES.glob("*.yml"))}
    dead = f"127.0.0.1:{free_port()}"
    with fleet.simulated_nodes(tmp_path_factory.mktemp("vm"), 1, first=1) as east_nodes, \
            run_victoriametrics() as store, \
            run_alertmanager("route: {receiver: none}\nreceivers: [{name: none}]\n") as alertmanager, \
            run_vmalert(rules, store, store, alertmanager, evaluation_interval="1s") as vmalert:
        nodes = {NODE: next(iter(east_nodes.values())), "gpu-node-dead": f"http://{dead}"}
        with fleet.run_agent("east", nodes, store, scrape_interval="1s", batch_send_deadline="1s"):
            yield store, vmalert


@pytest.mark.slow
@pytest.mark.usefixtures("victoriametrics_tiers")  # started first: its alerts come due meanwhile
def test_two_tiers_rules_alerts_and_dashboards_keep_the_cluster(tmp_path: Path) -> None:
    rules = {path.name: fast_rules(path) for path in sorted(fleet.RULES.glob("*.yml"))}
    dead = f"127.0.0.1:{free_port()}"  # nothing listens: the agent sends up == 0 for it
    with fleet.simulated_nodes(tmp_path, 1, first=1) as east_nodes, \
            fleet.simulated_nodes(tmp_path, 1, first=2) as west_nodes, \
            fleet.run_receiver(rules, evaluation_interval="1s") as central:
        nodes = {"east": {NODE: next(iter(east_nodes.values())), "gpu-node-dead": f"http://{dead}"},
                 "west": {NODE: next(iter(west_nodes.values()))}}
        with fleet.run_agent("east", nodes["east"], central, scrape_interval="1s", batch_send_deadline="1s"), \
                fleet.run_agent("west", nodes["west"], central, scrape_interval="1s", batch_send_deadline="1s"):
            # Raw series arrive with the cluster label, the two clusters' gpu-node-1 apart.
            per_cluster = wait_until(
                lambda: {r["metric"]["cluster"]: float(r["value"][1])
                         for r in promql(central, f'count by (cluster) (gpu_info{{node="{NODE}"}})')
                         } if len(promql(central, "count by (cluster) (gpu_info)")) == 2 else None,
                60, interval=1, what="both clusters' series on the central Prometheus")
            assert per_cluster == {"east": 8.0, "west": 8.0}

            # Recording rules run centrally and keep the clusters apart.
            def node_means() -> list[dict[str, Any]] | None:
                result = promql(central, "node:gpu_utilization:avg5m")
                return result if len(result) == 2 else None
            means = wait_until(node_means, 60, interval=1, what="node:gpu_utilization:avg5m per cluster")
            assert sorted((m["metric"]["cluster"], m["metric"]["node"]) for m in means) == [
                ("east", NODE), ("west", NODE)]
            counts = promql(central, "count by (cluster) (gpu:gpu_utilization:avg5m)")
            assert {c["metric"]["cluster"]: c["value"][1] for c in counts} == {"east": "8", "west": "8"}
            # The cardinality guard: the agents forward Prometheus's per-target scrape series, and its sum
            # keeps the clusters apart (east's dead target serves none).
            def series_sums() -> dict[str, float] | None:
                result = {r["metric"]["cluster"]: float(r["value"][1])
                          for r in promql(central, "cluster:gpu_exporter_series:sum")}
                return result if set(result) == set(CLUSTERS) else None
            sums = wait_until(series_sums, 60, interval=1, what="cluster:gpu_exporter_series:sum per cluster")
            assert min(sums.values()) > 8 * 30, sums

            # Alerts fire on the central Prometheus, each naming its cluster: the dead target of
            # east (GpuExporterDown), and the 20%-busy GPU 0 with processes in both (GpuUtilizationLow).
            down = wait_until(lambda: firing(central, "GpuExporterDown"), 60, interval=1,
                              what="GpuExporterDown to fire")
            assert [(a["labels"]["cluster"], a["labels"]["node"]) for a in down] == [("east", "gpu-node-dead")]
            def low_in_both() -> list[dict[str, Any]] | None:
                alerts = firing(central, "GpuUtilizationLow")
                return alerts if {a["labels"]["cluster"] for a in alerts} == set(CLUSTERS) else None
            low = wait_until(low_in_both, 90, interval=1, what="GpuUtilizationLow in both clusters")
            assert {(a["labels"]["cluster"], a["labels"]["node"], a["labels"]["gpu"]) for a in low} >= {
                ("east", NODE, "0"), ("west", NODE, "0")}

            check_dashboards(central, "east")
            # The same panel across clusters: one series per cluster for the shared node name.
            (by_node,) = [e for d, t, e in fleet.dashboard_queries(fleet.grafana_variables(".*"))
                          if e.startswith("node:gpu_utilization:avg5m")]
            assert sorted(r["metric"]["cluster"] for r in promql(central, by_node)) == sorted(CLUSTERS)


@pytest.mark.slow
def test_two_tiers_on_victoriametrics_with_vmalert(victoriametrics_tiers: tuple[str, str]) -> None:
    """The same agent, remote-writing into VictoriaMetrics' single-node server (Debian 1.79), with
    the shipped rules (shrunk) run by vmalert, which writes recording results back and notifies a
    real Alertmanager: series, rule results, alerts and dashboard queries keep the cluster."""
    store, vmalert = victoriametrics_tiers

    def gpus() -> list[dict[str, Any]] | None:
        result = promql(store, "count by (cluster, node) (gpu_info)")
        return result or None
    (count,) = wait_until(gpus, 60, interval=1, what="the agent's series in VictoriaMetrics")
    assert count["metric"] == {"cluster": "east", "node": NODE} and count["value"][1] == "8"

    def rule_results() -> list[dict[str, Any]] | None:
        result = promql(store, "count by (cluster) (gpu:gpu_utilization:avg5m)")
        return result if result and result[0]["value"][1] == "8" else None
    (rules_count,) = wait_until(rule_results, 60, interval=1, what="vmalert's recording results")
    assert rules_count["metric"] == {"cluster": "east"}

    def dead_down() -> list[dict[str, Any]] | None:
        alerts = [a for a in firing(vmalert, "GpuExporterDown") if a["labels"].get("node") == "gpu-node-dead"]
        return alerts or None
    (down,) = wait_until(dead_down, 60, interval=1, what="GpuExporterDown for the dead target")
    assert down["labels"]["cluster"] == "east"
    low = wait_until(lambda: firing(vmalert, "GpuUtilizationLow"), 90, interval=1,
                     what="GpuUtilizationLow in vmalert")
    assert ("east", NODE, "0") in {(a["labels"]["cluster"], a["labels"]["node"], a["labels"]["gpu"]) for a in low}
    check_dashboards(store, "east")


@pytest.mark.slow
def test_fleet_bench_measures_what_docs_fleet_reports() -> None:
    """bench/fleet.py on one node with 1 s intervals: every figure of docs/fleet.md is measured."""
    figures = fleet.measure(nodes=1, seconds=4, scrape_interval="1s")
    assert figures["gpus"] == 8 and figures["series_per_gpu"] >= 30
    assert figures["series_per_node"] > 8 * 30  # 30 device series per GPU, plus processes and health
    # Everything scraped is sent: about one sample per stored raw series per second.
    raw = figures["stored_series"] - figures["rule_series"]
    assert 0.5 * raw <= figures["samples_per_s"] <= 1.5 * raw, figures
    assert 1 < figures["bytes_per_s"] / figures["samples_per_s"] < 200
    assert figures["rule_series"] >= 6 * 8 and figures["rule_rounds"] >= 3 and figures["rule_eval_seconds"] > 0
    assert figures["queries"] == len(fleet.dashboard_queries(fleet.grafana_variables()))
    text = fleet.report(figures)
    assert "per 1,000 GPUs at 15 s" in text and "slowest rules" in text
