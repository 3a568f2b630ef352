"""Scrapes at the floor: the scrape right after a poll against the cached one and against nvitop-exporter.

Prometheus scrapes every 15 s or so while the exporter polls every second, so the scrape that
matters is the first one after a poll, not a repeat that hits the cache. This bench starts
each exporter on each simulated node (bench/scrape.py: same simulated NVML for both, metered)
and measures, side by side: polling CPU alone, a steady scraper, ``burst`` back-to-back
scrapes (the cached body's cost), and ``spaced`` scrapes one every 1.1 s (each after a fresh
poll). ``python -m bench`` includes the same stages and section; this entry point runs just
them, from 1 GPU to 64 GPUs with 512 processes, and prints the section of docs/benchmarks.md::

    PYTHONPATH=exporter python -m bench.spaced            # about 6 minutes on 2 cores
    PYTHONPATH=exporter python -m bench.spaced --nodes 1x0,64x512 --spaced 10
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from bench import scrape
from bench.node import Sleepers, write_scenario
from bench.scrape import Durations, ScrapeResult

NODES: tuple[tuple[int, int], ...] = ((1, 0), (8, 64), (16, 256), (64, 512))
DURATIONS = Durations(warmup=2.0, idle=4.0, scrape=5.0, rate=4.0, burst=40, spaced=20, floor=20)
OURS, PEER = "gpu-exporter", "nvitop-exporter"
AFTER_POLL_FACTOR = 1.5
"""Goal: the spaced p50 at most this many times the same server's back-to-back p50."""
PEER_SHARE = 0.5
"""Goal: spaced p50 and p99, and polling CPU net of the simulation, at most this share of nvitop-exporter's."""


def measure_nodes(nodes: Sequence[tuple[int, int]], durations: Durations,
                  say: Callable[[str], None] = lambda _: None) -> list[ScrapeResult]:
    """Both exporters on every node (the order alternates between nodes), one at a time."""
    results = []
    with tempfile.TemporaryDirectory(prefix="gpu-exporter-bench-") as tmp, \
            Sleepers(max(p for _, p in nodes)) as pids:
        folder = Path(tmp)
        for i, (gpus, processes) in enumerate(nodes):
            scenario = write_scenario(folder, gpus, pids[:processes])
            specs = [scrape.ours(scenario, folder / f"site-ours-{gpus}-{processes}"),
                     scrape.nvitop(scenario, folder / f"site-nvitop-{gpus}-{processes}")]
            for spec in specs if i % 2 == 0 else specs[::-1]:
                say(f"{spec.name} on {gpus} GPU(s), {processes} processes")
                results.append(scrape.measure(spec, durations, gpus, processes))
    return results


def pairs(results: Sequence[ScrapeResult]) -> list[tuple[ScrapeResult, ScrapeResult]]:
    """(ours, nvitop-exporter's) per node, in node order, for nodes where both have spaced scrapes."""
    by = {(r.exporter, r.gpus, r.processes): r for r in results if r.spaced_scrapes}
    nodes = sorted({(r.gpus, r.processes) for r in results})
    return [(by[OURS, g, p], by[PEER, g, p]) for g, p in nodes if (OURS, g, p) in by and (PEER, g, p) in by]


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf


def _net_poll(r: ScrapeResult) -> float:
    return max(0.0, r.poll_cpu_s_per_min - r.sim_poll_s_per_min)


def goals(results: Sequence[ScrapeResult]) -> list[tuple[str, str, bool]]:
    """(goal, worst measured, met) for the scrape right after a poll and the polling CPU."""
    both = pairs(results)
    if not both:
        return []
    floor = max(_ratio(o.spaced_p50_ms, o.burst_p50_ms) for o, _ in both)
    idle = [_ratio(o.spaced_p50_ms, o.floor_p50_ms) for o, _ in both if not math.isnan(o.floor_p50_ms)]
    p50 = max(_ratio(o.spaced_p50_ms, p.spaced_p50_ms) for o, p in both)
    p99 = max(_ratio(o.spaced_p99_ms, p.spaced_p99_ms) for o, p in both)
    poll = max(_ratio(_net_poll(o), _net_poll(p)) for o, p in both)
    return [
        (f"scrape right after a poll: p50 within {AFTER_POLL_FACTOR:g}x of the same server's back-to-back p50 "
         "on every node", f"worst {floor:.2f}x", floor <= AFTER_POLL_FACTOR),
        *([(f"scrape right after a poll: p50 within {AFTER_POLL_FACTOR:g}x of the same server's cached body at the "
            "same pace (spaced scrapes, no poll since: an idle server's floor) on every node",
            f"worst {max(idle):.2f}x", max(idle) <= AFTER_POLL_FACTOR)] if idle else []),
        (f"scrape right after a poll: p50 at most {PEER_SHARE:g}x nvitop-exporter's on every node",
         f"worst {p50:.2f}x", p50 <= PEER_SHARE),
        (f"scrape right after a poll: p99 at most {PEER_SHARE:g}x nvitop-exporter's on every node",
         f"worst {p99:.2f}x", p99 <= PEER_SHARE),
        (f"polling CPU at most {PEER_SHARE:g}x nvitop-exporter's on every node, net of the simulated NVML",
         f"worst {poll:.2f}x", poll <= PEER_SHARE),
    ]


def _ms(x: float) -> str:
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def section(results: Sequence[ScrapeResult], durations: Durations, with_goals: bool = False) -> list[str]:
    """The markdown section: one row per exporter and node, the ratios, and (``with_goals``) the goals."""
    rows = []
    for o, p in pairs(results):
        for r in (o, p):
            idle = "—" if math.isnan(r.floor_p50_ms) else _ms(r.floor_p50_ms)
            idle_ratio = "—" if math.isnan(r.floor_p50_ms) else f"{_ratio(r.spaced_p50_ms, r.floor_p50_ms):.2f}x"
            rows.append(f"| {_node(r)} | {r.exporter} | {_ms(r.burst_p50_ms)} | {idle} | {_ms(r.spaced_p50_ms)} | "
                        f"{_ms(r.spaced_p99_ms)} | {_ratio(r.spaced_p50_ms, r.burst_p50_ms):.2f}x | {idle_ratio} | "
                        f"{r.spaced_scrapes} |")
    ratios = [f"| {_node(o)} | {_ratio(o.spaced_p50_ms, p.spaced_p50_ms):.2f}x | "
              f"{_ratio(o.spaced_p99_ms, p.spaced_p99_ms):.2f}x | {_ratio(_net_poll(o), _net_poll(p)):.2f}x |"
              for o, p in pairs(results)]
    goal_rows = [f"| {goal} | {measured} | {'met' if met else '**missed**'} |"
                 for goal, measured, met in goals(results)]
    return [
        "## Scrapes right after a poll", "",
        f"Prometheus scrapes every 15 s or so and the exporters poll every second, so the scrape that matters "
        f"comes right after a fresh poll. Each exporter, on each node: {durations.burst} scrapes back to back "
        f"(nearly all repeat a poll: the cached body), then {durations.spaced} scrapes one every "
        f"{scrape.SPACING:g} s (each after a fresh poll). gpu-exporter renders text straight from its "
        "collectors' rows with each series' label prefix kept, gzips the unchanged parts once, and, when a "
        "scraper's interval says a scrape is due before the next poll, does that work on the polling thread "
        "right after the poll (a poll no scrape is expected to read is not rendered). nvitop-exporter "
        "renders its prometheus_client registry at every scrape.", "",
        f"*Idle floor*: gpu-exporter started again with a poll interval of an hour, so it polls once and "
        f"serves that cached body: {durations.floor} scrapes one every {scrape.SPACING:g} s after 10 back to "
        "back. No poll and no render stands between two of them, so what they cost above the back-to-back "
        "scrapes is arriving at a server that sat idle for a second (the serving thread's wake-up, cold "
        "caches): the least a scrape at Prometheus's pace can cost.", "",
        "| node | exporter | back-to-back p50 ms | idle floor p50 ms | after a poll p50 ms | after a poll p99 ms | "
        "after a poll ÷ back to back (p50) | after a poll ÷ idle floor (p50) | scrapes after a poll |",
        "|---|---|---|---|---|---|---|---|---|", *rows, "",
        "### After a poll: gpu-exporter ÷ nvitop-exporter", "",
        "Below 1 means gpu-exporter is cheaper; polling CPU net of the simulated NVML, from the same runs.", "",
        "| node | after a poll p50 | after a poll p99 | polling CPU |", "|---|---|---|---|", *ratios, "",
        *(["### Goals of the scrape after a poll", "", "| goal | measured | status |", "|---|---|---|",
           *goal_rows, ""] if with_goals else []),
    ]


def _node(r: ScrapeResult) -> str:
    return f"{r.gpus} GPU{'s' if r.gpus != 1 else ''}, {r.processes} processes"


def _parse_nodes(text: str) -> tuple[tuple[int, int], ...]:
    try:
        nodes = tuple((int(g), int(p)) for g, p in (part.split("x") for part in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--nodes wants GPUSxPROCESSES,... like 1x0,64x512, not {text!r}") from None
    return nodes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spaced", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=_parse_nodes, default=NODES, metavar="GxP,...",
                        help="simulated nodes as GPUSxPROCESSES (default 1x0,8x64,16x256,64x512)")
    parser.add_argument("--spaced", type=int, default=DURATIONS.spaced, help="scrapes after a poll per exporter")
    parser.add_argument("--burst", type=int, default=DURATIONS.burst, help="back-to-back scrapes per exporter")
    args = parser.parse_args(argv)
    if args.spaced < 2 or args.burst < 1:
        parser.error("--spaced must be at least 2 and --burst at least 1")
    durations = dataclasses.replace(DURATIONS, burst=args.burst, spaced=args.spaced, floor=args.spaced)
    before = os.getloadavg()
    results = measure_nodes(args.nodes, durations, lambda m: print(f"bench: {m}", file=sys.stderr, flush=True))
    after = os.getloadavg()
    print("\n".join(section(results, durations, with_goals=True)))
    print(f"Load average before / after: {' '.join(f'{x:.2f}' for x in before)} / "
          f"{' '.join(f'{x:.2f}' for x in after)}.")
    return 0 if all(met for _, _, met in goals(results)) else 1


if __name__ == "__main__":
    sys.exit(main())
