"""The shipped rules' cost on one Prometheus at 100, 1,000 and 10,000 GPUs (issue 30, items 1-3).

Problem: every GPU costs its Prometheus series, rule evaluation, memory and query time, and a
rule group that takes longer than its interval misses evaluations (its alerts go quiet). This
bench measures those costs on a real Prometheus with the shipped rules (prometheus/rules), scraping
a simulated fleet (bench/fleet_sim.py: one process, one ``/node/<i>/metrics`` target per 8-GPU node,
payloads from the exporter's own renderer, counters moving, instrumented single- and multi-node
training runs with causes), and checks the budgets of docs/fleet.md::

    python -m bench.fleet_scale                          # 96 and 992 GPUs measured, 10,000 extrapolated
    python -m bench.fleet_scale --nodes 12 124 248 --seconds 300
    python -m bench.fleet_scale --update-docs            # and write its section of docs/benchmarks.md
    python -m bench.fleet_scale --annotations-ab --nodes 124 --seconds 180   # what the alert templates cost
    python -m bench.fleet_scale --ab-revision HEAD~1 --nodes 124 --seconds 180  # these rules against older ones
    python -m bench.fleet_scale --victoriametrics --nodes 124 --seconds 180      # in VictoriaMetrics + vmalert
    python -m bench.fleet_scale --victoriametrics --ab-revision HEAD~1 --nodes 124   # the same, side by side
    python -m bench.fleet_scale --diagnose-ab HEAD~1                 # fleet-wide diagnose against an older one

Each size runs its own Prometheus (Debian's 2.42), scraping every ``--scrape-interval`` (5 s by
default, so the rate windows fill fast: a 5m window then holds 3x the samples of a 15 s scrape,
which can only overstate the rules' cost) and evaluating each group at its shipped ``interval``
(``rule_interval`` in thresholds.yml: every minute). After the first rule results appear and
``--warmup`` seconds more, it samples ``prometheus_rule_group_last_duration_seconds`` of each group
once per evaluation for ``--seconds``, then reads the series counts, Prometheus' memory, runs every
panel query of the dashboards (instant, and as a range over the last 5 minutes at a 15 s step) and
``gpu-exporter diagnose --prometheus-url`` over the whole fleet. The 10,000-GPU column is extrapolated: a straight line
through the two largest measured sizes (the measured slope), marked ``~``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO / "tests", REPO / "exporter"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from gpu_exporter import catalog  # noqa: E402
from gpu_exporter.thresholds import read_thresholds_file  # noqa: E402
from servers import http_get, promql, run_prometheus, wait_until  # noqa: E402

from bench import fleet, fleet_sim  # noqa: E402

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
    queries: list[tuple[float, float, str, str, int]] = field(default_factory=list)
    """(wall seconds instant, wall seconds range over 5m, dashboard, panel, result series)"""
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


def _metrics(url: str) -> str:
    return http_get(url + "/metrics", timeout=30)


def _metric_values(text: str, name: str) -> list[tuple[str, float]]:
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
    text = _metrics(url)
    stamps = {_group_of(h): v
              for h, v in _metric_values(text, "prometheus_rule_group_last_evaluation_timestamp_seconds")}
    durations = {_group_of(h): (stamps.get(_group_of(h), 0.0), v)
                 for h, v in _metric_values(text, "prometheus_rule_group_last_duration_seconds")}
    intervals = {_group_of(h): v for h, v in _metric_values(text, "prometheus_rule_group_interval_seconds")}
    missed = sum(v for _, v in _metric_values(text, "prometheus_rule_group_iterations_missed_total"))
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


def _cpu_seconds(pid: int) -> float:
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
    text = _metrics(prom)
    figures.rss_bytes = _metric_values(text, catalog.PROCESS_RESIDENT_MEMORY_BYTES.name)[0][1]
    figures.heap_bytes = _metric_values(text, "go_memstats_heap_inuse_bytes")[0][1]
    figures.head_series = _metric_values(text, "prometheus_tsdb_head_series")[0][1]
    figures.stored_series = scalar(prom, 'count({__name__=~".+"})')
    figures.alert_series = scalar(prom, 'count(ALERTS) or vector(0)')
    figures.recorded_run_series = scalar(prom, 'count({__name__=~".+:.+", run!=""}) or vector(0)')
    figures.recorded_gpu_series = scalar(
        prom, 'count({__name__=~".+:.+", run="", uuid!=""} or {__name__=~".+:.+", run="", gpu!=""}) or vector(0)')
    recorded = scalar(prom, 'count({__name__=~".+:.+"})')
    figures.recorded_other_series = recorded - figures.recorded_run_series - figures.recorded_gpu_series
    figures.runs = int(scalar(prom, f"count(count by (run) ({catalog.GPU_TRAINING_STEPS_TOTAL.name})) or vector(0)"))
    if queries:
        for dashboard, title, expr in fleet.dashboard_queries(fleet.grafana_variables(rate_interval="1m"),
                                                              picked(prom)):
            instant, size = timed_query(prom, expr)
            ranged, _ = timed_query(prom, expr, range_seconds=300)
            figures.queries.append((instant, ranged, dashboard, title, size))
    if diagnose:
        runs = [timed_command(prom) for _ in range(rounds)]
        figures.diagnose_seconds, figures.diagnose_status = statistics.median(t for t, _ in runs), runs[-1][1]
    return figures


def measure(nodes: int, seconds: float, scrape_interval: float = 5.0, warmup: float = 660.0,
            rounds: int = ROUNDS, context: str = fleet_sim.DEFAULT_CONTEXT) -> Figures:
    """Run the simulated fleet of ``nodes`` nodes and a Prometheus with the shipped rules; measure."""
    with simulator(nodes, context) as (hostport, sim):
        cpu0 = _cpu_seconds(sim.pid)
        figures = Figures(nodes=nodes, gpus=nodes * fleet_sim.GPUS_PER_NODE, runs=0, scrape_interval=scrape_interval,
                          seconds=seconds, load=(os.getloadavg()[0], 0.0), warmup=warmup, rounds=rounds)
        started = time.monotonic()
        with run_prometheus(prometheus_config(nodes, hostport, scrape_interval), files=fleet.shipped_rules(),
                            ready_timeout=60, rule_intervals=True) as prom:
            measure_prometheus(prom, figures, hostport, seconds, warmup, rounds=rounds)
        figures.simulator_cpu_seconds = (_cpu_seconds(sim.pid) - cpu0) / (time.monotonic() - started)
        figures.load = (figures.load[0], os.getloadavg()[0])
    return figures


def rules_without_annotations() -> dict[str, str]:
    """The shipped rule files with every alert's annotations removed (no template queries)."""
    out = {}
    for name, text in fleet.shipped_rules().items():
        doc = yaml.safe_load(text)
        for group in doc["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)
        out[name] = str(yaml.safe_dump(doc, sort_keys=False))
    return out


def rules_at(revision: str) -> dict[str, str]:
    """The rule files of prometheus/rules as committed at git ``revision`` (the shipped ones' names)."""
    return {name: subprocess.run(["git", "show", f"{revision}:{fleet.RULES.relative_to(REPO)}/{name}"], cwd=REPO,
                                 check=True, capture_output=True, text=True).stdout
            for name in fleet.shipped_rules()}


def rules_ab(nodes: int, seconds: float, other: dict[str, str], other_name: str, scrape_interval: float = 5.0) -> str:
    """Two Prometheus servers scrape the same fleet at once, one with the shipped rules and one with ``other``;
    the median evaluation of each group in both, as a table. Started together and sampled from their first
    rule results, so both are in the warm-up (every GPU pending low, the most alerts active): side by side,
    the load of the machine is the same for both."""
    with simulator(nodes) as (hostport, _):
        config = prometheus_config(nodes, hostport, scrape_interval)
        with run_prometheus(config, files=fleet.shipped_rules(), ready_timeout=60) as shipped, \
                run_prometheus(config, files=other, ready_timeout=60) as bare:
            for prom in (shipped, bare):
                wait_until(lambda p=prom: len(promql(p, catalog.NODE_UTILIZATION_AVG5M.name)) >= nodes,
                           60 + nodes * 0.2,
                           interval=1, what=f"{catalog.NODE_UTILIZATION_AVG5M.name} for every node")
            a: dict[str, list[float]] = {}
            b: dict[str, list[float]] = {}
            start = time.monotonic()
            while time.monotonic() - start < seconds:
                sample_rule_groups(shipped, EVALUATION_INTERVAL / 4, EVALUATION_INTERVAL / 4, a)
                sample_rule_groups(bare, EVALUATION_INTERVAL / 4, EVALUATION_INTERVAL / 4, b)
            alerts = (scalar(shipped, "count(ALERTS)"), scalar(bare, "count(ALERTS)"))
    lines = [f"{nodes * fleet_sim.GPUS_PER_NODE:,} GPUs, {seconds:g} s from the first rule results, active alerts "
             f"{alerts[0]:.0f} / {alerts[1]:.0f}", "",
             f"| rule group | shipped, ms | {other_name}, ms |", "|---|---|---|"]
    for group in sorted(set(a) | set(b)):
        lines.append(f"| `{group}` | {statistics.median(a.get(group) or [0.0]) * 1000:,.1f} | "
                     f"{statistics.median(b.get(group) or [0.0]) * 1000:,.1f} |")
    lines.append(f"| all groups (sum) | {sum(statistics.median(v) for v in a.values()) * 1000:,.1f} | "
                 f"{sum(statistics.median(v) for v in b.values()) * 1000:,.1f} |")
    return "\n".join(lines)


REPORT_FLEET = ("report", "--fleet", "--from=-2m", "--step", "15s", "--output", "json")
"""``report --fleet`` as the A/B bench times it: the last 2 minutes, a point every 15 s (9 points judged)."""


def diagnose_ab(sizes: Sequence[int], revision: str, rounds: int = ROUNDS, scrape_interval: float = 5.0) -> str:
    """Fleet-wide ``diagnose --prometheus-url`` of this tree and of git ``revision``, side by side: for each fleet
    size, one Prometheus with the shipped rules, and the two commands run in turn ``rounds`` times once every
    GPU has its utilization series (the order swapped every round, so neither tree always lands on the other's
    load), then :data:`REPORT_FLEET` of each once. The median wall time of each, and each extrapolated to 10,000
    GPUs."""
    times: dict[tuple[str, str], list[float]] = {}
    with contextlib.ExitStack() as stack:
        old = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="diagnose-ab-")))
        archive = subprocess.run(["git", "archive", revision, "exporter"], cwd=REPO, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        trees = {"this tree": REPO / "exporter", revision: old / "exporter"}
        for nodes in sizes:
            with simulator(nodes) as (hostport, _), \
                    run_prometheus(prometheus_config(nodes, hostport, scrape_interval), files=fleet.shipped_rules(),
                                   ready_timeout=60, rule_intervals=True) as prom:
                count = nodes * fleet_sim.GPUS_PER_NODE
                wait_until(lambda p=prom, n=count: len(promql(p, catalog.GPU_UTILIZATION_AVG5M.name)) >= n,
                           180 + count * 0.05, interval=1, what=f"{catalog.GPU_UTILIZATION_AVG5M.name} for every GPU")
                time.sleep(120)  # the report's 2 minutes hold data
                runs: dict[str, list[float]] = {name: [] for name in trees}
                for round_ in range(rounds):
                    for name, tree in list(trees.items())[::1 if round_ % 2 == 0 else -1]:
                        runs[name].append(timed_command(prom, tree)[0])
                for name, tree in trees.items():
                    times.setdefault(("`diagnose --prometheus-url`", name), []).append(statistics.median(runs[name]))
                    times.setdefault(("`report --fleet`, 9 points", name), []).append(
                        timed_command(prom, tree, REPORT_FLEET)[0])
                    print(f"fleet_scale: {count} GPUs, {name}: diagnose runs {sorted(runs[name])}, report --fleet "
                          f"{times[('`report --fleet`, 9 points', name)][-1]:.2f} s", file=sys.stderr, flush=True)
    gpus = [n * fleet_sim.GPUS_PER_NODE for n in sizes]
    line = extrapolates(gpus)
    lines = [f"| whole fleet, s (diagnose: median of {rounds}) | tree | "
             + " | ".join(f"{g:,} GPUs" for g in gpus) + (f" | ~{TARGET_GPUS:,} GPUs |" if line else " |"),
             "|---|---|" + "---|" * (len(gpus) + line)]
    for (command, name), values in times.items():
        lines.append(f"| {command} | {name} | " + " | ".join(f"{v:.2f}" for v in values)
                     + (f" | ~{extrapolated(gpus, values):.1f} |" if line else " |"))
    return "\n".join(lines)


@contextlib.contextmanager
def victoriametrics(nodes: int, hostport: str, scrape_interval: float,
                    rules: dict[str, str]) -> Iterator[tuple[str, str]]:
    """VictoriaMetrics' single-node server (Debian 1.79) scraping the fleet at ``hostport`` itself
    (``-promscrape.config``), and vmalert evaluating ``rules`` with each group at its own ``interval`` (the shipped
    ``rule_interval``: every minute), writing the results back; yields (store URL, vmalert URL)."""
    from testbed import free_port, run_server, run_vmalert

    cfg = yaml.safe_load(prometheus_config(nodes, hostport, scrape_interval))
    promscrape = str(yaml.safe_dump({"global": {"scrape_interval": cfg["global"]["scrape_interval"]},
                                     "scrape_configs": cfg["scrape_configs"]}, sort_keys=False))
    with run_server(["victoria-metrics"], "victoria-metrics", "scrape.yml", promscrape,
                     lambda d, port: [f"-storageDataPath={d / 'data'}", f"-httpListenAddr=127.0.0.1:{port}",
                                      "-search.latencyOffset=1s", f"-promscrape.config={d / 'scrape.yml'}",
                                      # count({__name__=~".+"}) of 10,000 GPUs selects ~770,000 series, over 1.79's
                                      # default of 300,000 a query (a 10,000-GPU run got 503 for it)
                                      "-search.maxUniqueTimeseries=5000000"],
                     None, 60) as store, \
            run_vmalert(rules, store, store, f"http://127.0.0.1:{free_port()}",
                        evaluation_interval=f"{EVALUATION_INTERVAL:g}s", ready_timeout=60,
                        rule_intervals=True) as vmalert:
        yield store, vmalert


def vmalert_iterations(url: str) -> dict[str, tuple[float, float]]:
    """{group: (evaluations so far, their seconds in all)} from vmalert's ``vmalert_iteration_duration_seconds``."""
    text = _metrics(url)
    out: dict[str, tuple[float, float]] = {}
    for suffix, at in (("_count", 0), ("_sum", 1)):
        for head, value in _metric_values(text, "vmalert_iteration_duration_seconds" + suffix):
            match = re.search(r'group="([^"]+)"', head)
            if match:
                pair = list(out.get(match.group(1), (0.0, 0.0)))
                pair[at] += value
                out[match.group(1)] = (pair[0], pair[1])
    return out


def sample_vmalert(urls: Sequence[str], seconds: float, every: float = 5.0) -> list[dict[str, list[float]]]:
    """Each evaluation's duration of every group of each vmalert in ``urls``, for ``seconds``, polling them in turn
    every ``every`` seconds: the growth of its duration sum over the growth of its count (one evaluation, mostly)."""
    seen = [vmalert_iterations(url) for url in urls]
    out: list[dict[str, list[float]]] = [{} for _ in urls]
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        time.sleep(every)
        for i, url in enumerate(urls):
            now = vmalert_iterations(url)
            for group, (count, total) in now.items():
                count0, total0 = seen[i].get(group, (0.0, 0.0))
                if count > count0:
                    out[i].setdefault(group, []).extend([(total - total0) / (count - count0)] * int(count - count0))
            seen[i] = now
    return out


def store_cpu(store: str) -> float:
    """CPU seconds a VictoriaMetrics (or any Go server) has used: its ``process_cpu_seconds_total``."""
    return _metric_values(_metrics(store), catalog.PROCESS_CPU_SECONDS_TOTAL.name)[0][1]


def stored_series(store: str) -> float:
    """``count({__name__=~".+"})`` of a store, NaN when it refuses (the groups' figures are not lost for it)."""
    try:
        return scalar(store, 'count({__name__=~".+"})')
    except OSError as err:  # urllib's HTTPError and URLError are OSErrors
        print(f"fleet_scale: counting the series failed: {err}", file=sys.stderr, flush=True)
        return float("nan")


def measure_victoriametrics(nodes: int, seconds: float, scrape_interval: float = 5.0) -> str:
    """The same fleet scraped by VictoriaMetrics' single-node server (Debian 1.79, ``-promscrape.config``)
    with vmalert evaluating each shipped group at its own interval (results written back): the median duration
    of each group's evaluations over ``seconds`` from the first results (the warm-up: windows filling), the
    store's memory and series, every panel query's wall time, and fleet-wide diagnose. A table."""
    load = os.getloadavg()[0]
    with simulator(nodes) as (hostport, _), \
            victoriametrics(nodes, hostport, scrape_interval, fleet.shipped_rules()) as (store, vmalert):
        wait_until(lambda: len(promql(store, catalog.NODE_UTILIZATION_AVG5M.name)) >= nodes, 120 + nodes * 0.2,
                   interval=1, what=f"vmalert's {catalog.NODE_UTILIZATION_AVG5M.name} for every node")
        cpu0 = store_cpu(store)
        sampled = sample_vmalert([vmalert], seconds)[0]
        cpu = (store_cpu(store) - cpu0) / seconds * 60
        groups = {g: statistics.median(v) for g, v in sampled.items()}
        vm = _metrics(store)
        rss = _metric_values(vm, catalog.PROCESS_RESIDENT_MEMORY_BYTES.name)[0][1]
        series = stored_series(store)
        timings = []
        for dashboard, title, expr in fleet.dashboard_queries(fleet.grafana_variables(rate_interval="1m"),
                                                              picked(store)):
            try:
                timings.append((timed_query(store, expr)[0], dashboard, title))
            except Exception as err:  # MetricsQL may refuse a query: say which
                timings.append((float("nan"), dashboard, f"{title} (failed: {str(err)[:80]})"))
        try:
            diagnose, status = timed_command(store)
        except RuntimeError as err:  # at 10,000 GPUs VictoriaMetrics refused one of its queries (HTTP 422)
            diagnose, status = float("nan"), -1
            print(f"fleet_scale: {err}", file=sys.stderr, flush=True)
    gpus = nodes * fleet_sim.GPUS_PER_NODE
    ok = [t for t in timings if t[0] == t[0]]
    lines = [f"VictoriaMetrics 1.79 + vmalert, {gpus:,} GPUs, scrape every {scrape_interval:g} s, each group "
             f"every {RULE_INTERVAL:g} s (its interval), {seconds:g} s after the first results (warm-up); load "
             f"average {load:.1f} -> {os.getloadavg()[0]:.1f}", "",
             "| figure | value |", "|---|---|",
             f"| series stored per GPU | {series / gpus:.1f} |",
             f"| VictoriaMetrics RSS, MiB (KiB per GPU) | {rss / 2**20:,.0f} ({rss / 1024 / gpus:.0f}) |",
             f"| VictoriaMetrics CPU, s a minute (scrapes, ingestion, the rules' queries) | {cpu:.1f} |"]
    lines += [f"| vmalert `{g}`, ms per evaluation (median of {len(sampled[g])}) | {v * 1000:,.1f} |"
              for g, v in sorted(groups.items())]
    lines.append(f"| vmalert, all groups, ms per round (sum of medians) | {sum(groups.values()) * 1000:,.1f} |")
    lines += [f"| dashboard query, instant, slowest / median, ms | {max(t[0] for t in ok) * 1000:,.0f} / "
              f"{statistics.median(t[0] for t in ok) * 1000:,.1f} |",
              f"| dashboard queries that failed | {len(timings) - len(ok)} of {len(timings)} |",
              f"| `diagnose --prometheus-url`, whole fleet, ms (exit status {status}) | {diagnose * 1000:,.0f} |"]
    failed = [t[2] for t in timings if t[0] != t[0]]
    return "\n".join(lines + ([""] + [f"- failed: {f}" for f in failed] if failed else []))


def victoriametrics_ab(nodes: int, seconds: float, other: dict[str, str], other_name: str,
                       scrape_interval: float = 5.0) -> str:
    """Two VictoriaMetrics + vmalert pairs scrape the same fleet at once, one with the shipped rules and one with
    ``other``: the median evaluation of each group in both vmalerts, sampled in turn over the same ``seconds`` from
    the first results (the load of the machine is the same for both), and each store's CPU a minute."""
    load = os.getloadavg()[0]
    with simulator(nodes) as (hostport, _), \
            victoriametrics(nodes, hostport, scrape_interval, fleet.shipped_rules()) as (store_a, vmalert_a), \
            victoriametrics(nodes, hostport, scrape_interval, other) as (store_b, vmalert_b):
        for store in (store_a, store_b):
            wait_until(lambda s=store: len(promql(s, catalog.NODE_UTILIZATION_AVG5M.name)) >= nodes,
                       120 + nodes * 0.2, interval=1, what=f"vmalert's {catalog.NODE_UTILIZATION_AVG5M.name}")
        cpu0 = (store_cpu(store_a), store_cpu(store_b))
        a, b = sample_vmalert([vmalert_a, vmalert_b], seconds)
        cpu = ((store_cpu(store_a) - cpu0[0]) / seconds * 60, (store_cpu(store_b) - cpu0[1]) / seconds * 60)
        series = (stored_series(store_a), stored_series(store_b))
    gpus = nodes * fleet_sim.GPUS_PER_NODE

    def cell(values: list[float] | None) -> str:
        return f"{statistics.median(values) * 1000:,.1f}" if values else "-"

    def ratio(group: str) -> str:
        return (f"{statistics.median(a[group]) / statistics.median(b[group]):.2f}"
                if a.get(group) and b.get(group) and statistics.median(b[group]) else "-")

    lines = [f"VictoriaMetrics 1.79 + vmalert, {gpus:,} GPUs, scrape every {scrape_interval:g} s, each group every "
             f"{RULE_INTERVAL:g} s, {seconds:g} s from the first results; load average {load:.1f} -> "
             f"{os.getloadavg()[0]:.1f}", "",
             f"| rule group | shipped, ms | {other_name}, ms | shipped / {other_name} |", "|---|---|---|---|"]
    lines += [f"| `{group}` | {cell(a.get(group))} | {cell(b.get(group))} | {ratio(group)} |"
              for group in sorted(set(a) | set(b))]
    lines += [f"| all groups (sum of medians) | {sum(statistics.median(v) for v in a.values()) * 1000:,.1f} | "
              f"{sum(statistics.median(v) for v in b.values()) * 1000:,.1f} | |",
              f"| VictoriaMetrics CPU, s a minute | {cpu[0]:.1f} | {cpu[1]:.1f} | |",
              f"| series stored per GPU | {series[0] / gpus:.2f} | {series[1] / gpus:.2f} | |"]
    return "\n".join(lines)


# -- the table ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    name: str
    values: tuple[float, ...]
    fmt: str
    budget: str = ""
    """the budget, in words, when a budget applies"""
    extrapolate: bool = True


def extrapolates(gpus: Sequence[int]) -> bool:
    """Whether a table has a ~10,000-GPU column: two sizes or more, all below it (else measured, or no line)."""
    return len(gpus) > 1 and max(gpus) < TARGET_GPUS


def extrapolated(gpus: Sequence[int], values: Sequence[float], target: int = TARGET_GPUS) -> float:
    """The value at ``target`` GPUs on the straight line through the two largest measured sizes."""
    (g1, v1), (g2, v2) = sorted(zip(gpus, values, strict=True))[-2:]
    slope = max(0.0, (v2 - v1) / (g2 - g1)) if g2 != g1 else 0.0  # a cost does not shrink with the fleet
    return v2 + slope * (target - g2)


def group_stat(f: Figures, group: str) -> float:
    """A group's evaluation time: the median of its sampled last durations."""
    return statistics.median(f.groups.get(group) or [0.0])


def rows(figs: Sequence[Figures]) -> list[Row]:
    out = [
        Row("series per GPU, exporter (shared node: 8 processes per GPU)",
            tuple(f.exporter_series_per_gpu.get("shared", 0.0) for f in figs), "{:.1f}", extrapolate=False),
        Row("series per GPU, exporter (instrumented node: 1 process, 1 rank per GPU)",
            tuple(f.exporter_series_per_gpu.get("solo", 0.0) for f in figs), "{:.1f}", extrapolate=False),
        Row("series per GPU, dcgm-exporter's default counters (for comparison)",
            tuple(float(DCGM_DEFAULT_FIELDS) for _ in figs), "{:.0f}", extrapolate=False),
        Row("series stored per GPU (all: exporter, scrape, recorded, ALERTS)",
            tuple(f.series_per_gpu for f in figs), "{:.1f}", f"< {SERIES_PER_GPU_BUDGET:g}", extrapolate=False),
        Row("recorded series per GPU (GPU-level rules)", tuple(f.recorded_gpu_series / f.gpus for f in figs), "{:.2f}",
            extrapolate=False),
        Row("recorded series per training run (run-level rules)",
            tuple(f.recorded_run_series / max(1, f.runs) for f in figs), "{:.1f}", extrapolate=False),
        Row("active alerts (ALERTS series, pending or firing) per GPU", tuple(f.alert_series / f.gpus for f in figs),
            "{:.2f}", extrapolate=False),
        Row("head series", tuple(f.head_series for f in figs), "{:,.0f}"),
        Row("Prometheus RSS, MiB", tuple(f.rss_bytes / 2**20 for f in figs), "{:,.0f}"),
        Row("Prometheus RSS per GPU, KiB", tuple(f.rss_bytes / 1024 / f.gpus for f in figs), "{:.0f}",
            extrapolate=False),
        Row("Go heap in use, MiB", tuple(f.heap_bytes / 2**20 for f in figs), "{:,.0f}"),
    ]
    groups = sorted({g for f in figs for g in f.groups})
    for group in groups:
        interval = max((f.intervals.get(group, EVALUATION_INTERVAL) for f in figs), default=EVALUATION_INTERVAL)
        out.append(Row(f"rule group `{group}`, ms per evaluation (median)",
                       tuple(group_stat(f, group) * 1000 for f in figs), "{:,.1f}",
                       f"< {RULE_BUDGET_SHARE * interval * 1000:,.0f} ms ({RULE_BUDGET_SHARE:.0%} of {interval:g} s)"))
    out.append(Row("all rule groups, ms per round (median sum)",
                   tuple(sum(group_stat(f, g) for g in groups) * 1000 for f in figs), "{:,.1f}"))
    if all(f.startup_groups for f in figs):
        out.append(Row("all rule groups during the warm-up (windows filling, every GPU pending low), ms per "
                       "round (median sum)", tuple(sum(statistics.median(v) for v in f.startup_groups.values()) * 1000
                                                   for f in figs), "{:,.1f}"))
    if all(f.queries for f in figs):
        out += [
            Row("dashboard query, instant, slowest, ms", tuple(max(q[0] for q in f.queries) * 1000 for f in figs),
                "{:,.0f}", f"< {QUERY_BUDGET_SECONDS * 1000:,.0f} ms"),
            Row("dashboard query, instant, median, ms",
                tuple(statistics.median(q[0] for q in f.queries) * 1000 for f in figs), "{:,.1f}"),
            Row("dashboard query, 5 min range at 15 s step, slowest, ms",
                tuple(max(q[1] for q in f.queries) * 1000 for f in figs), "{:,.0f}",
                f"< {QUERY_BUDGET_SECONDS * 1000:,.0f} ms"),
        ]
    if all(f.diagnose_seconds for f in figs):
        out.append(Row(f"`diagnose --prometheus-url`, whole fleet, ms (fresh processes, median of {figs[0].rounds})",
                       tuple(f.diagnose_seconds * 1000 for f in figs), "{:,.0f}",
                       f"< {QUERY_BUDGET_SECONDS * 1000:,.0f} ms"))
    return out


def budget_misses(figs: Sequence[Figures]) -> list[str]:
    """Budgets missed at 10,000 GPUs (extrapolated where not measured), in words."""
    gpus = [f.gpus for f in figs]
    misses = []
    for row in rows(figs):
        if not row.budget:
            continue
        limit = float(re.sub(r"[^\d.]", "", row.budget.split("(")[0].replace(",", "")))
        value = extrapolated(gpus, row.values) if row.extrapolate and len(figs) > 1 else max(row.values)
        if value >= limit:
            misses.append(f"{row.name}: {row.fmt.format(value)} at {TARGET_GPUS:,} GPUs, budget {row.budget}")
    return misses


def table(figs: Sequence[Figures]) -> str:
    gpus = [f.gpus for f in figs]
    extra = extrapolates(gpus)
    head = ["figure", *(f"{g:,} GPUs (measured)" for g in gpus)]
    if extra:
        head.append(f"{TARGET_GPUS:,} GPUs (~ extrapolated)")
    head.append("budget at 10,000 GPUs")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows(figs):
        cells = [row.name, *(row.fmt.format(v) for v in row.values)]
        if extra:
            value = extrapolated(gpus, row.values) if row.extrapolate else row.values[-1]
            cells.append("~" + row.fmt.format(value))  # per-GPU figures: the largest size's, carried over
        cells.append(row.budget)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def details(figs: Sequence[Figures]) -> str:
    out = []
    for f in figs:
        slow = sorted(f.queries, reverse=True)[:3]
        out.append(
            f"- {f.gpus:,} GPUs ({f.nodes} nodes, {f.runs} training runs): scrape every {f.scrape_interval:g} s, "
            f"rule groups every {'/'.join(sorted({f'{v:g}' for v in f.intervals.values()})) or '?'} s, "
            f"{f.seconds:g} s sampled "
            f"({min(len(v) for v in f.groups.values()) if f.groups else 0} evaluations per group); load average "
            f"{f.load[0]:.1f} -> {f.load[1]:.1f} on {os.cpu_count()} CPUs; evaluations missed: {f.missed:g}; "
            f"ALERTS series: {f.alert_series:g}; recorded series not per GPU or run: {f.recorded_other_series:g}; "
            f"simulator CPU {f.simulator_cpu_seconds * 1000:.0f} ms/s; diagnose exit status {f.diagnose_status}; "
            "slowest instant queries: " + "; ".join(f"{d}/{t} {s * 1000:.0f} ms" for s, _, d, t, _ in slow)
            + "; slowest rules: " + ", ".join(f"{n} ({g}) {s * 1000:.0f} ms" for s, g, n in f.slowest_rules))
    return "\n".join(out)


def report(figs: Sequence[Figures], command: str) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=False).stdout.strip()
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    misses = budget_misses(figs)
    how = "measured" if max(f.gpus for f in figs) >= TARGET_GPUS else "extrapolated"
    verdict = (f"every budget met ({TARGET_GPUS:,} GPUs {how})" if not misses
               else "budgets missed:\n" + "\n".join(f"- {m}" for m in misses))
    return (f"`{command}` on {when}, commit {commit}\n\n{table(figs)}\n\n{details(figs)}\n\n{verdict}\n")


BEGIN, END = "<!-- bench.fleet_scale: begin -->", "<!-- bench.fleet_scale: end -->"
"""The markers around the section that ``--update-docs`` owns in docs/benchmarks.md."""
DOC = REPO / "docs" / "benchmarks.md"


def section(text: str) -> str:
    return "\n".join([BEGIN, "## The shipped rules at fleet scale", "",
                      "Written by `python -m bench.fleet_scale --update-docs` (bench/fleet_scale.py says how it "
                      "measures; docs/fleet.md sets the budgets and reads the figures). `~`: extrapolated on the "
                      "straight line through the two largest measured sizes.", "", text.rstrip("\n"), END, ""])


def update_docs(doc: str, new: str) -> str:
    """``doc`` with its marked section replaced by ``new`` (appended when there is none)."""
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        return head + new.rstrip("\n") + rest.split(END, 1)[1]
    return doc.rstrip("\n") + "\n\n" + new


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, nargs="+", default=[12, 124],
                        help="fleet sizes in 8-GPU nodes (default 12 124: 96 and 992 GPUs)")
    parser.add_argument("--seconds", type=float, default=180,
                        help="rule evaluations sampled for (default 180: three of a group at rule_interval 1m)")
    parser.add_argument("--warmup", type=float, default=660,
                        help="seconds after the first rule results before sampling (default 660: the 10m "
                             "windows of the alerts' hysteresis fill, and the low rates of the start leave them)")
    parser.add_argument("--scrape-interval", type=float, default=5.0, help="scrape interval, s (default 5)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help=f"fresh diagnose processes per figure, their median (default {ROUNDS})")
    parser.add_argument("--context", choices=sorted(fleet_sim.CONTEXTS), default=fleet_sim.DEFAULT_CONTEXT,
                        help="what each simulated rank's context reports (bench/fleet_sim.py CONTEXTS; default "
                             f"{fleet_sim.DEFAULT_CONTEXT}: all a CUDA job sends; loader: the four DataLoader settings "
                             "the runs in the docs before 2026-12-06 sent)")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--annotations-ab", action="store_true",
                        help="instead: compare the shipped rules with the same rules without annotations, side by "
                             "side on one fleet (the first --nodes), for --seconds")
    parser.add_argument("--ab-revision", metavar="REV",
                        help="instead: compare the shipped rules with the rules committed at git REV, side by side "
                             "on one fleet (the first --nodes), for --seconds")
    parser.add_argument("--victoriametrics", action="store_true",
                        help="instead: the same fleet (the first --nodes) in VictoriaMetrics + vmalert, for --seconds; "
                             "with --ab-revision or --annotations-ab, two VictoriaMetrics + vmalert pairs side by side")
    parser.add_argument("--diagnose-ab", metavar="REV",
                        help="instead: fleet-wide diagnose of this tree and of git REV, side by side at each --nodes")
    parser.add_argument("--from-json", type=Path, help="print the report of figures --json wrote, measure nothing")
    parser.add_argument("--update-docs", action="store_true",
                        help=f"replace the fleet-scale section of {DOC.relative_to(REPO)}")
    args = parser.parse_args(argv)
    if args.annotations_ab or args.ab_revision:
        other, name = ((rules_at(args.ab_revision), f"rules at {args.ab_revision}") if args.ab_revision else
                       (rules_without_annotations(), "without annotations"))
        if args.victoriametrics:
            print(victoriametrics_ab(args.nodes[0], args.seconds, other, name, args.scrape_interval))
        else:
            print(rules_ab(args.nodes[0], args.seconds, other, name, args.scrape_interval))
        return 0
    if args.diagnose_ab:
        print(diagnose_ab(args.nodes, args.diagnose_ab, args.rounds, args.scrape_interval))
        return 0
    if args.victoriametrics:
        print(measure_victoriametrics(args.nodes[0], args.seconds, args.scrape_interval))
        return 0
    figs = []
    if args.from_json:
        figs = [Figures(**{**d, "load": tuple(d["load"])}) for d in json.loads(args.from_json.read_text())]
    for nodes in [] if args.from_json else args.nodes:
        print(f"fleet_scale: {nodes} nodes ({nodes * fleet_sim.GPUS_PER_NODE} GPUs)...", file=sys.stderr, flush=True)
        figs.append(measure(nodes, args.seconds, args.scrape_interval, args.warmup, args.rounds, args.context))
        if args.json:
            args.json.write_text(json.dumps([f.__dict__ for f in figs], indent=1, default=str))
    if args.from_json:
        command = f"python -m bench.fleet_scale --nodes {' '.join(str(f.nodes) for f in figs)} --seconds " \
                  f"{figs[0].seconds:g} --warmup {figs[0].warmup:g} --scrape-interval {figs[0].scrape_interval:g}"
    else:
        command = "python -m bench.fleet_scale " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(figs, command.strip())
    print(text)
    if args.update_docs:
        DOC.write_text(update_docs(DOC.read_text(), section(text)))
    return 1 if budget_misses(figs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
