"""The measuring core of bench.fleet_scale (its docstring says what and how): a simulated fleet's own process,
a Prometheus with the shipped rules scraping it, each rule group's evaluations sampled, series, memory, every
dashboard panel's query and fleet-wide ``diagnose --prometheus-url`` timed, into :class:`Figures`, and the
budgets those figures are held to (docs/fleet.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "exporter") not in sys.path:  # a plain checkout: the package's sources
    sys.path.insert(0, str(REPO / "exporter"))

from gpu_exporter import catalog  # noqa: E402
from gpu_exporter.thresholds import read_thresholds_file  # noqa: E402

from bench import fleet, fleet_sim  # noqa: E402
from testbed import http_get, promql, run_prometheus, wait_until  # noqa: E402

EVALUATION_INTERVAL = 15.0
"""The shipped server's evaluation interval (prometheus/prometheus.yml); every shipped group sets its own,
``rule_interval`` (thresholds.yml), which the bench's Prometheus keeps."""
RULE_INTERVAL = read_thresholds_file().seconds("rule_interval")
RULE_BUDGET_SHARE = 0.10
"""Budget: every rule group evaluates in under 10% of its interval at 10,000 GPUs."""
QUERY_BUDGET_SECONDS = 2.0
"""Budget: every dashboard query and a fleet-wide diagnose answer in under 2 s at 10,000 GPUs."""
SERIES_PER_GPU_BUDGET = 80.0
"""Budget: series stored per GPU (exporter series, scrape series and recording-rule results) on
the simulated mix (docs/fleet.md)."""
TARGET_GPUS = 10_000
ROUNDS = 7
"""Fresh ``diagnose --prometheus-url`` processes timed per fleet size (and tree): a figure is their median, as one
run's wall time varies by tens of ms on this shared machine, and the line to 10,000 GPUs multiplies that by ten."""
DCGM_DEFAULT_FIELDS = 25
"""Metric fields in dcgm-exporter's etc/default-counters.csv (main, 2026-05: 26 entries, one of them,
DCGM_FI_DRIVER_VERSION, a label): one series per GPU each (docs/fleet.md)."""


@dataclass
class Figures:
    """What one size measured."""

    nodes: int
    gpus: int
    runs: int
    scrape_interval: float
    seconds: float
    load: tuple[float, float]
    exporter_series_per_gpu: dict[str, float] = field(default_factory=dict)
    """Per kind of node: its /metrics sample lines / 8."""
    stored_series: float = 0.0
    head_series: float = 0.0
    recorded_gpu_series: float = 0.0
    recorded_run_series: float = 0.0
    recorded_other_series: float = 0.0
    alert_series: float = 0.0
    groups: dict[str, list[float]] = field(default_factory=dict)
    """{group: its evaluations' durations, after the warm-up}"""
    startup_groups: dict[str, list[float]] = field(default_factory=dict)
    """{group: its evaluations' durations during the warm-up, while the 5m and 10m windows fill (rates
    read low, so every GPU is pending in GpuUtilizationLow)}"""
    intervals: dict[str, float] = field(default_factory=dict)
    missed: float = 0.0
    rss_bytes: float = 0.0
    heap_bytes: float = 0.0
    queries: list[tuple[float, float, str, str, int, str]] = field(default_factory=list)
    """(wall seconds instant, wall seconds range over 5m, dashboard, panel, result series, the PromQL sent); figures
    written before 2026-12-07 have no PromQL (five fields)"""
    diagnose_seconds: float = 0.0
    """The median wall time of ``rounds`` fresh ``diagnose --prometheus-url`` processes over the whole fleet."""
    rounds: int = 1
    diagnose_status: int = 0
    simulator_cpu_seconds: float = 0.0
    warmup: float = 0.0
    slowest_rules: list[tuple[float, str, str]] = field(default_factory=list)
    """(seconds of its last evaluation, group, rule name): the slowest rules"""

    @property
    def series_per_gpu(self) -> float:
        return self.stored_series / self.gpus


def metrics_text(url: str) -> str:
    return http_get(url + "/metrics", timeout=30)


def metric_values(text: str, name: str) -> list[tuple[str, float]]:
    out = []
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            head, _, value = line.rpartition(" ")
            out.append((head, float(value)))
    return out


def _group_of(head: str) -> str:
    match = re.search(r'rule_group="[^"]*;([^"]+)"', head)
    return match.group(1) if match else head


def rule_groups(url: str) -> tuple[dict[str, tuple[float, float]], dict[str, float], float]:
    """({group: (last evaluation's timestamp, its duration)}, {group: interval}, evaluations missed in all)
    from a Prometheus' own /metrics."""
    text = metrics_text(url)
    stamps = {_group_of(h): v
              for h, v in metric_values(text, "prometheus_rule_group_last_evaluation_timestamp_seconds")}
    durations = {_group_of(h): (stamps.get(_group_of(h), 0.0), v)
                 for h, v in metric_values(text, "prometheus_rule_group_last_duration_seconds")}
    intervals = {_group_of(h): v for h, v in metric_values(text, "prometheus_rule_group_interval_seconds")}
    missed = sum(v for _, v in metric_values(text, "prometheus_rule_group_iterations_missed_total"))
    return durations, intervals, missed


def sample_rule_groups(url: str, seconds: float, every: float,
                       into: dict[str, list[float]]) -> tuple[dict[str, float], float]:
    """Append each new evaluation's duration of every group to ``into`` for ``seconds``, polling
    every ``every`` seconds; return (intervals, evaluations missed)."""
    seen: dict[str, float] = {}
    start = time.monotonic()
    while True:
        durations, intervals, missed = rule_groups(url)
        for group, (stamp, value) in durations.items():
            if stamp and seen.get(group) != stamp:
                seen[group] = stamp
                into.setdefault(group, []).append(value)
        if time.monotonic() - start >= seconds:
            return intervals, missed
        time.sleep(every)


def timed_query(prom: str, expr: str, range_seconds: float = 0.0, step: float = 15.0) -> tuple[float, int]:
    """Wall seconds (what Grafana waits) and result size of an instant or range query."""
    params = {"query": expr}
    endpoint = "query"
    if range_seconds:
        now = time.time()
        params.update(start=f"{now - range_seconds:.3f}", end=f"{now:.3f}", step=f"{step:g}")
        endpoint = "query_range"
    url = f"{prom}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}"
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as resp:
        body = json.loads(resp.read())
    took = time.perf_counter() - started
    if body.get("status") != "success":
        raise RuntimeError(f"query {expr!r} failed: {body}")
    return took, len(body["data"]["result"])


def picked(prom: str) -> dict[str, str]:
    """What a user picks for a dashboard variable that takes one value: a node, and the run with the most ranks
    (the largest a training-run dashboard shows)."""
    node = promql(prom, f"topk(1, count by (node) ({catalog.GPU_INFO.name}))")
    run = promql(prom, f"topk(1, count by (run) ({catalog.GPU_TRAINING_CURRENT_PHASE.name} == 1))")
    return {"node": node[0]["metric"]["node"] if node else ".*", "run": run[0]["metric"]["run"] if run else ".*"}


def scalar(prom: str, expr: str) -> float:
    """An instant query's single value (NaN when empty), waiting up to a minute."""
    body = json.loads(http_get(f"{prom}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=60))
    result = body["data"]["result"]
    return float(result[0]["value"][1]) if result else float("nan")


def prometheus_config(nodes: int, hostport: str, scrape_interval: float,
                      evaluation_interval: float = EVALUATION_INTERVAL) -> str:
    rules = sorted(p.name for p in fleet.RULES.glob("*.yml"))
    cfg = {"global": {"scrape_interval": f"{scrape_interval:g}s", "scrape_timeout": f"{min(scrape_interval, 10):g}s",
                      "evaluation_interval": f"{evaluation_interval:g}s"},
           "rule_files": rules,
           "scrape_configs": [{"job_name": "gpu-exporter", "static_configs": list(fleet_sim.targets(nodes, hostport))}]}
    return str(yaml.safe_dump(cfg, sort_keys=False))


@contextlib.contextmanager
def simulator(nodes: int, context: str = fleet_sim.DEFAULT_CONTEXT) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``python -m bench.fleet_sim --nodes N --context C`` in its own process; yields (host:port, process)."""
    proc = subprocess.Popen([sys.executable, "-m", "bench.fleet_sim", "--nodes", str(nodes), "--context", context],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.match(r"http://([^/]+)/", line)
        if not match:
            raise RuntimeError(f"fleet simulator did not start: {line!r}")
        yield match.group(1), proc
    finally:
        proc.terminate()
        proc.wait(10)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_command(prom: str, exporter: Path = REPO / "exporter",
                 command: Sequence[str] = ("diagnose", "--output", "json")) -> tuple[float, int]:
    """Wall seconds and exit status of ``gpu-exporter diagnose --prometheus-url`` (or another ``command``) over the
    fleet (a fresh Python process, as an operator runs it), with the package at ``exporter``."""
    env = dict(os.environ, PYTHONPATH=str(exporter))
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "gpu_exporter", command[0], "--prometheus-url", prom, *command[1:]],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    took = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{command[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return took, proc.returncode


def measure_prometheus(prom: str, figures: Figures, hostport: str, seconds: float, warmup: float,
                       queries: bool = True, diagnose: bool = True, rounds: int = ROUNDS) -> Figures:
    """Fill ``figures`` from a Prometheus scraping the fleet at ``hostport``."""
    nodes = figures.nodes
    node_utilization = catalog.NODE_UTILIZATION_AVG5M.name
    wait_until(lambda: len(promql(prom, node_utilization)) >= nodes, 2 * RULE_INTERVAL + nodes * 0.2,
               interval=1, what=f"{node_utilization} for every node")
    sample_rule_groups(prom, warmup, EVALUATION_INTERVAL / 4, figures.startup_groups)
    for kind in dict.fromkeys(fleet_sim.node_kind(i) for i in range(nodes)):
        index = next(i for i in range(nodes) if fleet_sim.node_kind(i) == kind)
        text = http_get(f"http://{hostport}/node/{index}/metrics")
        lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
        figures.exporter_series_per_gpu[kind] = len(lines) / fleet_sim.GPUS_PER_NODE
    figures.intervals, figures.missed = sample_rule_groups(prom, seconds, EVALUATION_INTERVAL / 4, figures.groups)
    groups = json.loads(http_get(prom + "/api/v1/rules", timeout=30))["data"]["groups"]
    figures.slowest_rules = sorted(((float(r["evaluationTime"]), g["name"], r["name"]) for g in groups
                                    for r in g["rules"]), reverse=True)[:8]
    text = metrics_text(prom)
    figures.rss_bytes = metric_values(text, catalog.PROCESS_RESIDENT_MEMORY_BYTES.name)[0][1]
    figures.heap_bytes = metric_values(text, "go_memstats_heap_inuse_bytes")[0][1]
    figures.head_series = metric_values(text, "prometheus_tsdb_head_series")[0][1]
    figures.stored_series = scalar(prom, 'count({__name__=~".+"})')
    figures.alert_series = scalar(prom, 'count(ALERTS) or vector(0)')
    figures.recorded_run_series = scalar(prom, 'count({__name__=~".+:.+", run!=""}) or vector(0)')
    figures.recorded_gpu_series = scalar(
        prom, 'count({__name__=~".+:.+", run="", uuid!=""} or {__name__=~".+:.+", run="", gpu!=""}) or vector(0)')
    recorded = scalar(prom, 'count({__name__=~".+:.+"})')
    figures.recorded_other_series = recorded - figures.recorded_run_series - figures.recorded_gpu_series
    figures.runs = int(scalar(prom, f"count(count by (run) ({catalog.GPU_TRAINING_STEPS_TOTAL.name})) or vector(0)"))
    if queries:
        for dashboard, title, expr, instant_only in fleet.panel_queries(fleet.grafana_variables(rate_interval="1m"),
                                                                        picked(prom)):
            instant, size = timed_query(prom, expr)
            # a table's target is an instant query: Grafana never asks for it as a range (0: not timed so)
            ranged = 0.0 if instant_only else timed_query(prom, expr, range_seconds=300)[0]
            figures.queries.append((instant, ranged, dashboard, title, size, expr))
    if diagnose:
        runs = [timed_command(prom) for _ in range(rounds)]
        figures.diagnose_seconds, figures.diagnose_status = statistics.median(t for t, _ in runs), runs[-1][1]
    return figures


def measure(nodes: int, seconds: float, scrape_interval: float = 5.0, warmup: float = 660.0,
            rounds: int = ROUNDS, context: str = fleet_sim.DEFAULT_CONTEXT) -> Figures:
    """Run the simulated fleet of ``nodes`` nodes and a Prometheus with the shipped rules; measure."""
    with simulator(nodes, context) as (hostport, sim):
        cpu0 = cpu_seconds(sim.pid)
        figures = Figures(nodes=nodes, gpus=nodes * fleet_sim.GPUS_PER_NODE, runs=0, scrape_interval=scrape_interval,
                          seconds=seconds, load=(os.getloadavg()[0], 0.0), warmup=warmup, rounds=rounds)
        started = time.monotonic()
        with run_prometheus(prometheus_config(nodes, hostport, scrape_interval), files=fleet.shipped_rules(),
                            ready_timeout=60, rule_intervals=True) as prom:
            measure_prometheus(prom, figures, hostport, seconds, warmup, rounds=rounds)
        figures.simulator_cpu_seconds = (cpu_seconds(sim.pid) - cpu0) / (time.monotonic() - started)
        figures.load = (figures.load[0], os.getloadavg()[0])
    return figures
