"""bench.fleet_scale's A/B runs: the shipped rules against other rules (``--annotations-ab``: the same without
annotations; ``--ab-revision REV``: as committed at git REV) on two servers scraping one fleet side by side
(Prometheus, or VictoriaMetrics + vmalert with ``--victoriametrics``), and fleet-wide diagnose of this tree
against git REV's (``--diagnose-ab REV``), and the dashboards' changed panel queries against git REV's on one
Prometheus (``--panels-ab REV``). Side by side, the machine's load is the same for both; each prints a
markdown table.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import yaml
from gpu_exporter import catalog

from bench import fleet, fleet_sim
from bench.fleet_doc import extrapolated, extrapolates
from bench.fleet_measure import (
    EVALUATION_INTERVAL,
    ROUNDS,
    RULE_INTERVAL,
    TARGET_GPUS,
    picked,
    prometheus_config,
    sample_rule_groups,
    scalar,
    simulator,
    timed_command,
    timed_query,
)
from bench.fleet_vm import sample_vmalert, store_cpu, stored_series, victoriametrics
from testbed import promql, run_prometheus, wait_until

REPO = Path(__file__).resolve().parents[1]


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


def dashboards_at(revision: str) -> dict[str, str]:
    """The dashboards of grafana/dashboards as committed at git ``revision`` ({file name: JSON text})."""
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{revision}:{fleet.DASHBOARDS.relative_to(REPO)}"],
                           cwd=REPO, check=True, capture_output=True, text=True).stdout.split()
    return {name: subprocess.run(["git", "show", f"{revision}:{fleet.DASHBOARDS.relative_to(REPO)}/{name}"],
                                 cwd=REPO, check=True, capture_output=True, text=True).stdout
            for name in names if name.endswith(".json")}


def panels_ab(nodes: int, revision: str, rounds: int = ROUNDS, scrape_interval: float = 15.0,
              warmup: float = 300.0) -> str:
    """The panel queries that differ between this tree's dashboards and git ``revision``'s, timed side by side on
    one Prometheus with this tree's rules (a query of ``revision`` that reads a recorded series works on this tree's
    as long as the series keeps the labels it reads): once every GPU has its SM activity and ``warmup`` seconds
    more (the 5-minute range full), each query instant and as a 5-minute range at a 15 s step, ``rounds`` times in
    turn (the order swapped every round); the median wall time of each as a table."""
    variables = fleet.grafana_variables(rate_interval="1m")
    with simulator(nodes) as (hostport, _), \
            run_prometheus(prometheus_config(nodes, hostport, scrape_interval), files=fleet.shipped_rules(),
                           ready_timeout=60, rule_intervals=True) as prom:
        count = nodes * fleet_sim.GPUS_PER_NODE
        sm = catalog.GPU_SM_ACTIVE_AVG5M.name
        wait_until(lambda: len(promql(prom, sm)) >= count // 2, 300 + count * 0.05, interval=5,
                   what=f"{sm} for the GPUs with a source")
        time.sleep(warmup)
        single = picked(prom)
        ours = {(d, t, i): e for i, (d, t, e) in enumerate(fleet.dashboard_queries(variables, single))}
        theirs = {(d, t, i): e for i, (d, t, e) in enumerate(fleet.dashboard_queries(variables, single,
                                                                                      dashboards_at(revision)))}
        # timed as a range too, whether or not Grafana asks for it so (a table's instant target: it does not)
        changed = sorted(k for k in ours.keys() & theirs.keys() if ours[k] != theirs[k])
        times: dict[tuple[tuple[str, str, int], str, str], list[float]] = {}
        sizes: dict[tuple[tuple[str, str, int], str], int] = {}
        for round_ in range(rounds):
            for key in changed:
                for name, expr in [("this tree", ours[key]), (revision, theirs[key])][::1 if round_ % 2 == 0 else -1]:
                    for kind, span in (("instant", 0.0), ("range", 300.0)):
                        took, sizes[key, name] = timed_query(prom, expr, span)
                        times.setdefault((key, name, kind), []).append(took)
    lines = [f"{count:,} GPUs, scrape {scrape_interval:g} s; the panel queries that differ, median of {rounds} "
             f"(wall, ms)", "",
             f"| panel | instant, this tree | instant, {revision} | 5-min range, this tree | 5-min range, {revision} "
             "| series, this tree / REV |", "|---|---|---|---|---|---|"]
    for key in changed:
        med = {(n, k): statistics.median(times[(key, n, k)]) * 1000 for n in ("this tree", revision)
               for k in ("instant", "range")}
        lines.append(f"| {key[0]} / {key[1]} | {med['this tree', 'instant']:,.0f} | {med[revision, 'instant']:,.0f} "
                     f"| {med['this tree', 'range']:,.0f} | {med[revision, 'range']:,.0f} "
                     f"| {sizes[key, 'this tree']} / {sizes[key, revision]} |")
    return "\n".join(lines)


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
