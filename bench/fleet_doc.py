"""bench.fleet_scale's report: the table of figures per fleet size with the line to 10,000 GPUs and the budgets,
the details of each run, the budgets missed, and its marked section of docs/benchmarks.md (``--update-docs``
replaces that region only, bench.doc_regions).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from bench import doc_regions
from bench.fleet_measure import (
    DCGM_DEFAULT_FIELDS,
    EVALUATION_INTERVAL,
    QUERY_BUDGET_SECONDS,
    RULE_BUDGET_SHARE,
    SERIES_PER_GPU_BUDGET,
    TARGET_GPUS,
    Figures,
)

REPO = Path(__file__).resolve().parents[1]


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
            Row("dashboard query, 5 min range at 15 s step (the panels Grafana asks a range of), slowest, ms",
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


def _one_line(expr: str, limit: int = 400) -> str:
    """A panel's PromQL on one line (its whitespace runs as one space), cut at ``limit`` characters."""
    line = " ".join(expr.split()).replace("`", "'")
    return line if len(line) <= limit else line[:limit - 3] + "..."


def slowest_panels(f: Figures, count: int = 3) -> str:
    """The ``count`` slowest panel queries of a size, instant and as a 5-minute range, by dashboard and panel, then
    the PromQL of the slowest of each (figures written before 2026-12-07 hold no PromQL)."""
    parts = []
    for index, kind in ((0, "instant"), (1, "5 min range")):
        slow = sorted(f.queries, key=lambda q: q[index], reverse=True)[:count]
        parts.append(f"slowest {kind} queries: " + "; ".join(f"{q[2]}/{q[3]} {q[index] * 1000:.0f} ms" for q in slow))
    for index, kind in ((0, "instant"), (1, "range")):
        slowest = max(f.queries, key=lambda q: q[index], default=None)
        if slowest is not None and len(slowest) > 5:
            parts.append(f"the slowest {kind} panel, {slowest[2]}/{slowest[3]}: `{_one_line(str(slowest[5]))}`")
    return "; ".join(parts)


def details(figs: Sequence[Figures]) -> str:
    out = []
    for f in figs:
        out.append(
            f"- {f.gpus:,} GPUs ({f.nodes} nodes, {f.runs} training runs): scrape every {f.scrape_interval:g} s, "
            f"rule groups every {'/'.join(sorted({f'{v:g}' for v in f.intervals.values()})) or '?'} s, "
            f"{f.seconds:g} s sampled "
            f"({min(len(v) for v in f.groups.values()) if f.groups else 0} evaluations per group); load average "
            f"{f.load[0]:.1f} -> {f.load[1]:.1f} on {os.cpu_count()} CPUs; evaluations missed: {f.missed:g}; "
            f"ALERTS series: {f.alert_series:g}; recorded series not per GPU or run: {f.recorded_other_series:g}; "
            f"simulator CPU {f.simulator_cpu_seconds * 1000:.0f} ms/s; diagnose exit status {f.diagnose_status}; "
            + slowest_panels(f) + "; slowest rules: "
            + ", ".join(f"{n} ({g}) {s * 1000:.0f} ms" for s, g, n in f.slowest_rules))
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


REGION = "bench.fleet_scale"
"""The region of docs/benchmarks.md that ``--update-docs`` owns (bench.doc_regions)."""
DOC = REPO / "docs" / "benchmarks.md"


def section(text: str) -> str:
    """The report ``text`` as the marked region of docs/benchmarks.md."""
    return doc_regions.region(REGION, "\n".join([
        "## The shipped rules at fleet scale", "",
        "Written by `python -m bench.fleet_scale --update-docs` (bench/fleet_scale.py says how it measures; "
        "docs/fleet.md sets the budgets and reads the figures). `~`: extrapolated on the straight line through the "
        "two largest measured sizes.", "", text.rstrip("\n")]))


def update_docs(doc: str, new: str) -> str:
    """``doc`` with its marked region replaced by ``new`` (appended when there is none), every other line as it
    was."""
    return doc_regions.update(doc, new)
