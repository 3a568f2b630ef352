"""bench.fleet_scale --victoriametrics: the same simulated fleet scraped by VictoriaMetrics' single-node server,
with vmalert evaluating the shipped rules and writing the results back; each group's evaluations sampled from
vmalert's own metrics, the store's CPU, memory and series, the panels' queries and fleet-wide diagnose timed.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import sys
import time
from collections.abc import Iterator, Sequence

import yaml
from gpu_exporter import catalog

from bench import fleet, fleet_sim
from bench.fleet_measure import (
    EVALUATION_INTERVAL,
    RULE_INTERVAL,
    metric_values,
    metrics_text,
    picked,
    prometheus_config,
    scalar,
    simulator,
    timed_command,
    timed_query,
)
from testbed import free_port, promql, run_server, run_vmalert, wait_until


@contextlib.contextmanager
def victoriametrics(nodes: int, hostport: str, scrape_interval: float,
                    rules: dict[str, str]) -> Iterator[tuple[str, str]]:
    """VictoriaMetrics' single-node server (Debian 1.79) scraping the fleet at ``hostport`` itself
    (``-promscrape.config``), and vmalert evaluating ``rules`` with each group at its own ``interval`` (the shipped
    ``rule_interval``: every minute), writing the results back; yields (store URL, vmalert URL)."""
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
    text = metrics_text(url)
    out: dict[str, tuple[float, float]] = {}
    for suffix, at in (("_count", 0), ("_sum", 1)):
        for head, value in metric_values(text, "vmalert_iteration_duration_seconds" + suffix):
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
    return metric_values(metrics_text(store), catalog.PROCESS_CPU_SECONDS_TOTAL.name)[0][1]


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
        vm = metrics_text(store)
        rss = metric_values(vm, catalog.PROCESS_RESIDENT_MEMORY_BYTES.name)[0][1]
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
