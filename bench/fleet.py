"""Fleets past one Prometheus, measured: simulated GPU nodes -> agent-mode Prometheus -> remote write
-> a central Prometheus that runs the rules and answers the dashboards' queries.

Problem: a fleet that outgrows one Prometheus needs figures to size its central store (series,
samples per second, bytes on the wire) and proof that the rules and dashboards still work when
the data arrives by remote write with a `cluster` label. This module holds the machinery (also
used by tests/test_fleet.py) and, run as a script, measures the figures of docs/fleet.md:

    python -m bench.fleet --nodes 16 --seconds 120

Every process is real: one `gpu-exporter --simulate` per node (the packaged eight_gpus
scenario, own seed, so own GPU UUIDs), Debian's Prometheus 2.42 as the agent
(`--enable-feature=agent`, config derived from prometheus/prometheus-agent.yml) and as the
receiver (`--web.enable-remote-write-receiver`, the shipped rules). All on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "exporter") not in sys.path:  # a plain checkout: the package's sources
    sys.path.insert(0, str(REPO / "exporter"))

from gpu_exporter import catalog  # noqa: E402
from gpu_exporter.thresholds import load_thresholds  # noqa: E402

from testbed import http_get, promql, run_exporter, run_prometheus, wait_until  # noqa: E402

AGENT_CONFIG = REPO / "prometheus" / "prometheus-agent.yml"
RULES = REPO / "prometheus" / "rules"
DASHBOARDS = REPO / "grafana" / "dashboards"
NODE_SCENARIO = REPO / "exporter" / "gpu_exporter" / "simulate" / "scenarios" / "eight_gpus.yaml"
CLUSTER_LABEL = load_thresholds().cluster_label
REMOTE_WRITE_PATH = "/api/v1/write"


def node_scenario(folder: Path, index: int, base: Path = NODE_SCENARIO) -> Path:
    """``base`` with seed ``index``: each simulated node gets its own GPU UUIDs."""
    doc = yaml.safe_load(base.read_text())
    doc["seed"] = index
    path = folder / f"node-{index}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@contextlib.contextmanager
def simulated_nodes(folder: Path, count: int, base: Path = NODE_SCENARIO,
                    first: int = 0) -> Iterator[dict[str, str]]:
    """``count`` exporter processes on simulated nodes; yields {node name: base URL}."""
    with contextlib.ExitStack() as stack:
        yield {f"gpu-node-{i}": stack.enter_context(run_exporter(["--simulate", str(node_scenario(folder, i, base))]))
               for i in range(first, first + count)}


def agent_config(cluster: str, targets: Mapping[str, str], remote_write_url: str,
                 scrape_interval: str | None = None, batch_send_deadline: str | None = None) -> str:
    """prometheus/prometheus-agent.yml with its cluster name, targets ({node: host:port}) and
    remote-write URL replaced; everything else as shipped."""
    cfg: dict[str, Any] = yaml.safe_load(AGENT_CONFIG.read_text())
    cfg["global"]["external_labels"] = {CLUSTER_LABEL: cluster}
    if scrape_interval:
        cfg["global"]["scrape_interval"] = scrape_interval
    (job,) = cfg["scrape_configs"]
    job["static_configs"] = [{"targets": [hostport], "labels": {"node": node}} for node, hostport in targets.items()]
    (remote,) = cfg["remote_write"]
    remote["url"] = remote_write_url
    if batch_send_deadline:
        remote["queue_config"]["batch_send_deadline"] = batch_send_deadline
    return str(yaml.safe_dump(cfg, sort_keys=False))


def run_agent(cluster: str, nodes: Mapping[str, str], receiver_url: str,
              **kwargs: str) -> contextlib.AbstractContextManager[str]:
    """An agent-mode Prometheus scraping ``nodes`` ({node: exporter URL}) into ``receiver_url``."""
    targets = {node: url.removeprefix("http://") for node, url in nodes.items()}
    config = agent_config(cluster, targets, receiver_url + REMOTE_WRITE_PATH, **kwargs)
    return run_prometheus(config, agent=True)


def run_receiver(rule_files: Mapping[str, str],
                 evaluation_interval: str = "15s") -> contextlib.AbstractContextManager[str]:
    """The central Prometheus: accepts remote write and evaluates ``rule_files`` ({name: text})."""
    config = {"global": {"evaluation_interval": evaluation_interval}, "rule_files": sorted(rule_files)}
    return run_prometheus(yaml.safe_dump(config), files=dict(rule_files),
                          extra_args=["--web.enable-remote-write-receiver"])


def shipped_rules() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(RULES.glob("*.yml"))}


def dashboard_queries(variables: Mapping[str, str], single: Mapping[str, str] | None = None,
                      dashboards: Mapping[str, str] | None = None) -> list[tuple[str, str, str]]:
    """(dashboard, panel title, PromQL) of :func:`panel_queries`."""
    return [(dashboard, title, expr) for dashboard, title, expr, _ in panel_queries(variables, single, dashboards)]


def panel_queries(variables: Mapping[str, str], single: Mapping[str, str] | None = None,
                  dashboards: Mapping[str, str] | None = None) -> list[tuple[str, str, str, bool]]:
    """(dashboard, panel title, PromQL, instant) for every panel query, with Grafana's variables replaced;
    ``instant``: the target is an instant query (``"instant": true`` and not ``"range": true``: a table's), which
    Grafana never asks for as a range. A dashboard
    variable that takes one value (no multi-value, no All: the node of the node detail, the run of the
    training run) gets its value from ``single`` when it has one, as a user picks one; else from ``variables``.
    A textbox variable (the cost dashboard's ``$price``) keeps its default text unless ``variables`` has it.
    ``dashboards``: {file name: JSON text} to read instead of grafana/dashboards (another revision's)."""
    out = []
    files = dashboards or {path.name: path.read_text() for path in DASHBOARDS.glob("*.json")}
    for name in sorted(files):
        path, doc = Path(name), json.loads(files[name])
        listed = doc.get("templating", {}).get("list", [])
        one = {v["name"] for v in listed
               if v.get("type") == "query" and not v.get("multi") and not v.get("includeAll")}
        text = {v["name"]: str(v["current"]["value"]) for v in listed if v.get("type") == "textbox"}
        values = {**text, **variables, **{k: v for k, v in (single or {}).items() if k in one}}
        stack = list(doc.get("panels", []))
        while stack:
            panel = stack.pop(0)
            stack.extend(panel.get("panels", []))
            for target in panel.get("targets", []):
                expr = target.get("expr")
                if not expr:
                    continue
                for name in sorted(values, key=len, reverse=True):
                    expr = expr.replace(f"${{{name}}}", values[name]).replace(f"${name}", values[name])
                unresolved = re.findall(r"\$\{?\w+", expr)
                if unresolved:
                    raise ValueError(f"{path.name} {panel.get('title')!r}: no value for {unresolved} in {expr!r}")
                instant = bool(target.get("instant")) and not target.get("range")
                out.append((path.stem, str(panel.get("title")), expr, instant))
    return out


def grafana_variables(cluster: str = ".*", rate_interval: str = "1m", range_: str = "5m") -> dict[str, str]:
    """Values for the dashboards' variables: regex matchers match everything but the cluster."""
    return {"cluster": cluster, "node": ".*", "gpu": ".*", "namespace": ".*", "pod": ".*", "run": ".*",
            "rank": ".*", "__rate_interval": rate_interval, "__range": range_, "__interval": "15s",
            "__interval_ms": "15000"}


def query_seconds(prom: str, expr: str, range_seconds: float = 0, step: str = "15s") -> tuple[float, int]:
    """Prometheus' own evaluation time (stats=all) and result size of an instant query, or of a
    range query over the last ``range_seconds`` (as a Grafana panel asks) when that is not 0."""
    params = {"query": expr, "stats": "all"}
    endpoint = "query"
    if range_seconds:
        now = time.time()
        params.update(start=f"{now - range_seconds:.3f}", end=f"{now:.3f}", step=step)
        endpoint = "query_range"
    q = urllib.parse.urlencode(params)
    body = json.loads(http_get(f"{prom}/api/v1/{endpoint}?{q}", timeout=30))
    if body.get("status") != "success":
        raise RuntimeError(f"query {expr!r} failed: {body}")
    return float(body["data"]["stats"]["timings"]["evalTotalTime"]), len(body["data"]["result"])


def counter_total(url: str, name: str) -> float:
    """The sum of a metric's samples on a /metrics page (an agent answers no queries)."""
    total = 0.0
    for line in http_get(url + "/metrics").splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def rule_group_seconds(url: str) -> dict[str, float]:
    """{rule group: duration of its last evaluation} from a Prometheus' own /metrics."""
    out = {}
    for line in http_get(url + "/metrics").splitlines():
        if line.startswith("prometheus_rule_group_last_duration_seconds{"):
            match = re.search(r'rule_group="[^"]*;([^"]+)"', line)
            if match:
                out[match.group(1)] = float(line.rsplit(" ", 1)[1])
    return out


def scalar(prom: str, expr: str) -> float:
    result = promql(prom, expr)
    return float(result[0]["value"][1]) if result else float("nan")


def series_counts(url: str) -> tuple[int, int]:
    """(series on the node, series carrying gpu="0") of one exporter's /metrics."""
    lines = [line for line in http_get(url + "/metrics").splitlines() if line and not line.startswith("#")]
    return len(lines), sum('gpu="0"' in line for line in lines)


def measure(nodes: int, seconds: float, scrape_interval: str) -> dict[str, Any]:
    """Run the two tiers with ``nodes`` simulated nodes for ``seconds``; return the figures."""
    with tempfile.TemporaryDirectory() as tmp, simulated_nodes(Path(tmp), nodes) as exporters, \
            run_receiver(shipped_rules(), evaluation_interval=scrape_interval) as receiver, \
            run_agent("bench", exporters, receiver, scrape_interval=scrape_interval) as agent:
        node_series, gpu0_series = series_counts(next(iter(exporters.values())))
        gpus = nodes * len(yaml.safe_load(NODE_SCENARIO.read_text())["gpus"])
        wait_until(lambda: promql(receiver, catalog.NODE_UTILIZATION_AVG5M.name), 120, interval=1,
                   what="rules to produce on the receiver")
        sent = [counter_total(agent, "prometheus_remote_storage_samples_total"),
                counter_total(agent, "prometheus_remote_storage_bytes_total")]
        start = time.monotonic()
        # One round of every rule group, as the receiver reports it on its own /metrics (it does
        # not scrape itself), sampled once per evaluation interval.
        rounds = []
        interval = float(scrape_interval.rstrip("s"))
        while time.monotonic() - start < seconds:
            time.sleep(interval)
            rounds.append(rule_group_seconds(receiver))
        elapsed = time.monotonic() - start
        samples_per_s = (counter_total(agent, "prometheus_remote_storage_samples_total") - sent[0]) / elapsed
        bytes_per_s = (counter_total(agent, "prometheus_remote_storage_bytes_total") - sent[1]) / elapsed
        slow_rules = sorted(((float(rule["evaluationTime"]), rule["name"])
                             for group in json.loads(http_get(receiver + "/api/v1/rules"))["data"]["groups"]
                             for rule in group["rules"]), reverse=True)[:3]
        stored = scalar(receiver, 'count({__name__=~".+"})')
        rule_series = scalar(receiver, 'count({__name__=~"[a-z]+:.+"})')
        timings, range_timings = [], []
        for dashboard, title, expr in dashboard_queries(grafana_variables()):
            took, size = query_seconds(receiver, expr)
            timings.append((took, dashboard, title, size))
            took, size = query_seconds(receiver, expr, range_seconds=elapsed, step=scrape_interval)
            range_timings.append((took, dashboard, title, size))
        timings.sort(reverse=True)
        range_timings.sort(reverse=True)
    return {"nodes": nodes, "gpus": gpus, "scrape_interval": scrape_interval, "seconds": round(elapsed),
            "series_per_node": node_series, "series_per_gpu": gpu0_series,
            "samples_per_s": samples_per_s, "bytes_per_s": bytes_per_s, "stored_series": stored,
            "rule_series": rule_series, "rule_eval_seconds": statistics.median(sum(r.values()) for r in rounds),
            "rule_eval_max_seconds": max(sum(r.values()) for r in rounds), "rule_rounds": len(rounds),
            "rule_groups": sorted(((statistics.median(r.get(g, 0.0) for r in rounds), g) for g in rounds[-1]),
                                  reverse=True),
            "load_average": os.getloadavg()[0], "slowest_rules": slow_rules,
            "queries": len(timings), "query_median_seconds": statistics.median(t[0] for t in timings),
            "query_slowest": timings[:3],
            "range_median_seconds": statistics.median(t[0] for t in range_timings),
            "range_slowest": range_timings[:3]}


def report(f: dict[str, Any]) -> str:
    interval = float(f["scrape_interval"].rstrip("s"))
    per_gpu_samples = f["samples_per_s"] / f["gpus"]
    bytes_per_sample = f["bytes_per_s"] / f["samples_per_s"]
    at15 = per_gpu_samples * interval / 15 * 1000
    lines = [
        f"nodes {f['nodes']} x 8 GPUs = {f['gpus']} GPUs, scrape and evaluation every {f['scrape_interval']}, "
        f"measured over {f['seconds']} s (1-minute load average at the end: {f['load_average']:.1f} "
        f"on {os.cpu_count()} CPUs)",
        f"series per node (exporter /metrics): {f['series_per_node']}; per GPU (gpu=\"0\"): {f['series_per_gpu']}",
        f"series stored on the receiver: {f['stored_series']:.0f} ({f['stored_series'] / f['gpus']:.1f} per GPU), "
        f"of which recording rules: {f['rule_series']:.0f}",
        f"remote write: {f['samples_per_s']:.0f} samples/s, {f['bytes_per_s'] / 1024:.1f} KiB/s, "
        f"{bytes_per_sample:.2f} bytes/sample (snappy-compressed protobuf)",
        f"per 1,000 GPUs at 15 s: {at15:.0f} samples/s, {at15 * bytes_per_sample / 1024:.0f} KiB/s "
        f"({at15 * bytes_per_sample * 86400 / 1e9:.1f} GB/day on the wire)",
        f"rule evaluation (all groups, one round; {f['rule_rounds']} rounds sampled): median "
        f"{f['rule_eval_seconds'] * 1000:.1f} ms, max {f['rule_eval_max_seconds'] * 1000:.1f} ms; by group (median): "
        + ", ".join(f"{g} {s * 1000:.1f} ms" for s, g in f["rule_groups"]),
        "slowest rules (last round): " + ", ".join(f"{n} {s * 1000:.1f} ms" for s, n in f["slowest_rules"]),
        f"dashboard queries ({f['queries']}), instant: median {f['query_median_seconds'] * 1000:.1f} ms; slowest: "
        + "; ".join(f"{d}/{t} {s * 1000:.1f} ms" for s, d, t, _ in f["query_slowest"]),
        f"dashboard queries over the {f['seconds']} s window (step {f['scrape_interval']}): median "
        f"{f['range_median_seconds'] * 1000:.1f} ms; slowest: "
        + "; ".join(f"{d}/{t} {s * 1000:.1f} ms" for s, d, t, _ in f["range_slowest"]),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=16, help="simulated 8-GPU nodes (default 16)")
    parser.add_argument("--seconds", type=float, default=120, help="measurement window (default 120)")
    parser.add_argument("--scrape-interval", default="15s", help="agent scrape and rule interval (default 15s)")
    args = parser.parse_args(argv)
    print(report(measure(args.nodes, args.seconds, args.scrape_interval)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
