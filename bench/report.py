"""Render one bench run as docs/benchmarks.md: machine, method, every figure, ratios and goals.

Example::

    text = render(results)          # results: a bench.report.Results; every part a marked region
    page.write_text(doc_regions.update(page.read_text(), text))   # only those regions change
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import gpu_exporter
import psutil

from bench import doc_regions, spaced
from bench import scrape as bench_scrape
from bench.accuracy import SCRAPE_INTERVALS, WINDOW, AccuracyRow
from bench.hotspots import PollProfile
from bench.instrumentation import MicroRow, TrainingAB
from bench.load import LoadResult
from bench.scrape import Durations, ScrapeResult

OURS, PEER = "gpu-exporter", "nvitop-exporter"
RSS_LIMIT_MB = 40.0
POLL_CPU_SHARE = 0.5
"""Polling CPU goal: at most this share of nvitop-exporter's on every node (net of the simulated NVML)."""
PHASE_LIMIT_NS = 1000.0
HISTOGRAM_FACTOR = 3.0
PACKAGES = ("prometheus-client", "nvidia-ml-py", "nvitop", "nvitop-exporter", "torch", "psutil", "PyYAML")


@dataclass(frozen=True)
class Results:
    """Everything one run measured, plus how it was run."""

    mode: str
    command: str
    started_utc: str
    elapsed_s: float
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    durations: Durations
    scrape: list[ScrapeResult]
    simulation_rss_mb: dict[tuple[int, int], float]
    profile: PollProfile
    profile_node: tuple[int, int]
    accuracy: list[AccuracyRow]
    accuracy_seconds: int
    micro: list[MicroRow]
    micro_number: int
    micro_repeat: int
    training: TrainingAB
    load: LoadResult
    load_node: tuple[int, int]


def num(x: float) -> str:
    """A figure with about three significant digits, never in exponent form.

    >>> num(0.000271), num(1.5837), num(22.06), num(1241.8)
    ('0.00', '1.58', '22.1', '1242')
    """
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def ratio(x: float | None) -> str:
    """A ratio like ``12.3x``; None (a zero denominator) shows as n/a."""
    return "n/a" if x is None else f"{num(x)}x"


def div(a: float, b: float) -> float | None:
    """``a / b``, or None when ``b`` is 0 (CPU below psutil's 10 ms tick over a short stage).

    >>> div(1.0, 4.0), div(0.0, 0.0)
    (0.25, None)
    """
    return a / b if b else None


def _worst(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def _git_commit() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return out.stdout.strip()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def net_poll(r: ScrapeResult) -> float:
    """CPU s/min of polling alone, less the simulated NVML's (a real driver's cost instead)."""
    return max(0.0, r.poll_cpu_s_per_min - r.sim_poll_s_per_min)


def net_scraped(r: ScrapeResult) -> float:
    """CPU s/min under the steady scraper, less the simulated NVML's."""
    return max(0.0, r.cpu_s_per_min - r.sim_scraped_s_per_min)


def net_rss(results: Results, r: ScrapeResult) -> float:
    """RSS less what the simulated NVML adds to a process (see Method)."""
    return max(0.0, r.rss_mb - results.simulation_rss_mb[r.gpus, r.processes])


def _pairs(results: Results) -> list[tuple[ScrapeResult, ScrapeResult]]:
    ours = {(r.gpus, r.processes): r for r in results.scrape if r.exporter == OURS}
    peer = {(r.gpus, r.processes): r for r in results.scrape if r.exporter == PEER}
    return [(ours[k], peer[k]) for k in sorted(ours) if k in peer]


def _node(r: ScrapeResult) -> str:
    return f"{r.gpus} GPU{'s' if r.gpus > 1 else ''}, {r.processes} processes"


def fit(points: Sequence[tuple[float, float, float]]) -> tuple[float, float, float]:
    """Least-squares ``y = a + b*g + c*p`` through (g, p, y) points; returns (a, b, c).

    >>> [round(v, 6) for v in fit([(1, 0, 3), (2, 0, 5), (1, 10, 13), (2, 10, 15)])]
    [1.0, 2.0, 1.0]
    """
    rows = [(1.0, g, p) for g, p, _ in points]
    ys = [y for _, _, y in points]
    m = [[sum(r[i] * r[j] for r in rows) for j in range(3)] + [sum(r[i] * y for r, y in zip(rows, ys, strict=True))]
         for i in range(3)]
    for col in range(3):  # Gauss-Jordan elimination with partial pivoting
        pivot = max(range(col, 3), key=lambda i: abs(m[i][col]))
        if abs(m[pivot][col]) < 1e-12:
            raise ValueError("bench: the node sizes do not separate GPUs from processes; add a node size")
        m[col], m[pivot] = m[pivot], m[col]
        for i in range(3):
            if i != col:
                factor = m[i][col] / m[col][col]
                m[i] = [a - factor * b for a, b in zip(m[i], m[col], strict=True)]
    a, b, c = (m[i][3] / m[i][i] for i in range(3))
    return a, b, c


def _goals(results: Results) -> list[tuple[str, str, bool]]:
    pairs = _pairs(results)
    p99 = _worst([div(o.p99_ms, p.p99_ms) for o, p in pairs])
    cpu = _worst([div(net_scraped(o), net_scraped(p)) for o, p in pairs])
    idle = _worst([div(net_poll(o), net_poll(p)) for o, p in pairs])
    gross = _worst([div(o.poll_cpu_s_per_min, p.poll_cpu_s_per_min) for o, p in pairs])
    rss = max(net_rss(results, o) for o, _ in pairs)
    load = results.load
    micro = {m.code: m for m in results.micro}
    phase = max(micro["with compute: pass"].median_ns, micro["with run.phase('compute'): pass"].median_ns)
    hist = micro["with histogram.time(): pass"].median_ns
    ab = results.training
    after_poll = [g for g in spaced.goals(results.scrape) if g[0].startswith("scrape right after a poll")]
    return [
        *after_poll,
        ("scrape p99 below nvitop-exporter's on every node",
         f"worst ratio gpu-exporter / nvitop-exporter = {ratio(p99)}", p99 is not None and p99 < 1),
        (f"polling CPU at most {POLL_CPU_SHARE:g}x nvitop-exporter's on every node, net of the simulated NVML",
         f"worst ratio gpu-exporter / nvitop-exporter = {ratio(idle)} (with the simulated NVML: {ratio(gross)})",
         idle is not None and idle <= POLL_CPU_SHARE),
        ("CPU under the scraper below nvitop-exporter's on every node, net of the simulated NVML",
         f"worst ratio gpu-exporter / nvitop-exporter = {ratio(cpu)}", cpu is not None and cpu < 1),
        (f"exporter RSS ≤ {RSS_LIMIT_MB:g} MB, net of the simulated NVML", f"largest {num(rss)} MB",
         rss <= RSS_LIMIT_MB),
        (f"no error under load ({load.plan.scrapers} scrapers at {num(load.plan.scrape_rate)}/s, "
         f"{load.plan.pushers} pushers every {num(load.plan.push_interval)} s, {num(load.plan.seconds)} s)",
         f"{load.errors} errors in {load.scrapes + load.pushes} requests", load.errors == 0),
        ("phase enter+exit ≤ 1 µs", f"{num(phase)} ns (slower of the two forms)", phase <= PHASE_LIMIT_NS),
        (f"phase ≥ {HISTOGRAM_FACTOR:g}x cheaper than Histogram.time()",
         f"{ratio(hist / phase)} cheaper", hist / phase >= HISTOGRAM_FACTOR),
        ("training throughput unchanged within noise",
         f"{ab.diff_percent:+.2f}% (noise ±{num(ab.noise_percent)}%)", abs(ab.diff_percent) <= ab.noise_percent),
    ]


REGIONS = ("intro", "headline", "machine", "method", "scrape", "growth", "profile", "accuracy", "instrumentation",
           "training", "load")
"""The regions of the page this run writes, each ``bench.run.<name>``, in order (the spaced scrapes' section,
``bench.spaced``, comes after ``scrape``; other regions go in with :func:`render`'s ``after``)."""


def render(results: Results, after: dict[str, str] | None = None) -> str:
    """The whole docs/benchmarks.md for ``results``: a title, then every part marked as a region of its own
    (bench.doc_regions), so that a rewrite of the page replaces only these and keeps the rest.
    ``after``: region name -> more marked text to put right after it (``bench.cuda_path`` after ``training``)."""
    parts = {
        "intro": _intro(results), "headline": _headline(results), "machine": _machine(results),
        "method": _method(results), "scrape": _scrape(results), "growth": _growth(results),
        "profile": _profile(results), "accuracy": _accuracy(results), "instrumentation": _instrumentation(results),
        "training": _training(results), "load": _load(results),
    }
    out = ["# Benchmarks\n"]
    for name in REGIONS:
        out.append(doc_regions.region(f"bench.run.{name}", "\n".join(parts[name])))
        if name == "scrape":
            out.append(doc_regions.region("bench.spaced", "\n".join(spaced.section(results.scrape,
                                                                                   results.durations))))
        if after and name in after:
            out.append(after[name].rstrip("\n") + "\n")
    return "\n".join(out)


def _intro(results: Results) -> list[str]:
    return [f"Generated by `{results.command}` ({results.mode} mode) on {results.started_utc}, "
            f"in {num(results.elapsed_s)} s, on the machine described, at load average "
            f"{' '.join(num(x) for x in results.load_before)} before and "
            f"{' '.join(num(x) for x in results.load_after)} after (1, 5 and 15 minutes): on a shared machine the "
            "figures measured side by side in this run (the ratios) are what counts, not a figure against another "
            "run's. The sections marked `bench.run.*` and "
            "`bench.spaced` in the source of this page come from that one run: rerun the command (from the "
            "repository root) to rewrite them, and commit the result. Other marked sections are written by their "
            "own benches, each naming its command and run; the unmarked sections are kept by hand, each naming "
            "its own run. A rewrite replaces only its own marked sections and keeps every other line as it is."]


def _headline(results: Results) -> list[str]:
    pairs = _pairs(results)
    o, p = max(pairs, key=lambda pair: (pair[0].gpus, pair[0].processes))
    acc = {(r.interval, r.method.split(" (")[0]): r for r in results.accuracy}
    micro = {m.code: m for m in results.micro}
    phase = micro["with compute: pass"].median_ns
    record = micro["with record_function('compute'): pass"]
    lines = ["## Headline", "",
             f"On the largest simulated node ({_node(o)}), against nvitop-exporter on the same node:", "",
             f"- scrape latency p99 {num(o.p99_ms)} ms vs {num(p.p99_ms)} ms: {ratio(div(p.p99_ms, o.p99_ms))} lower "
             f"(p50 {ratio(div(p.p50_ms, o.p50_ms))} lower);",
             f"- CPU {num(net_scraped(o))} vs {num(net_scraped(p))} s per minute under "
             f"{num(results.durations.rate)} scrapes/s ({ratio(div(net_scraped(p), net_scraped(o)))} less), "
             f"{num(net_poll(o))} vs {num(net_poll(p))} s/min polling alone "
             f"({ratio(div(net_poll(p), net_poll(o)))} less), net of the simulated NVML "
             f"({num(o.poll_cpu_s_per_min)} vs {num(p.poll_cpu_s_per_min)} s/min with it);",
             f"- RSS {num(net_rss(results, o))} MB vs {num(net_rss(results, p))} MB net of the simulated NVML "
             f"({num(o.rss_mb)} vs {num(p.rss_mb)} MB with it);",
             f"- on a bursty GPU scraped every 15 s, the busy counter is off by "
             f"{num(acc[15, 'busy counter'].point_mean_pp)} percentage points on average, the instant gauge "
             f"peers export by {num(acc[15, 'instant NVML gauge'].point_mean_pp)};",
             f"- timing a training phase costs {num(phase)} ns, "
             f"{ratio(micro['with histogram.time(): pass'].median_ns / phase)} less than "
             f"`Histogram.time()` and {ratio(record.median_ns / phase)} less than "
             "`torch.profiler.record_function`.",
             "", "### Goals", ""]
    rows = [[goal, measured, "met" if met else "**missed**"] for goal, measured, met in _goals(results)]
    return lines + _table(["goal", "measured", "status"], rows)


def _machine(results: Results) -> list[str]:
    mem = psutil.virtual_memory().total / 1e9
    rows = [
        ["CPU", f"{_cpu_model()}, {os.cpu_count()} logical cores"],
        ["memory", f"{num(mem)} GB"],
        ["OS", platform.platform()],
        ["Python", f"{platform.python_implementation()} {platform.python_version()}"],
        ["gpu-exporter", f"{gpu_exporter.__version__} (commit {_git_commit()})"],
        *[[name, _version(name)] for name in PACKAGES],
        ["load average before / after", f"{' '.join(num(x) for x in results.load_before)} / "
                                        f"{' '.join(num(x) for x in results.load_after)}"],
    ]
    return ["## Machine", "", "No GPU: both exporters read simulated GPUs through the real pynvml "
            "(docs/simulation.md). The machine is shared, so compare figures within this run, not across runs.",
            "", *_table(["", ""], rows)]


def _method(results: Results) -> list[str]:
    d = results.durations
    return [
        "## Method", "",
        "- **Nodes.** Scenarios are generated for each node size: N H100s (Hopper, so gpu-exporter also polls "
        "GPM) with utilization from 20% to 90%, and P processes spread round-robin over the GPUs. Each simulated "
        "process carries the PID of a real sleeping host process, so a peer that looks GPU processes up on the "
        "host (nvitop reads user, command, CPU and memory through psutil) pays that cost as on a real node.",
        f"- **Exporters.** `{sys.executable.rsplit('/', 1)[-1]} -m gpu_exporter --poll-interval 1` and "
        "`python -m nvitop_exporter --interval 1`, one at a time (the order alternates between node sizes), "
        "each in its own process. Both load the simulated NVML the same way, through a `sitecustomize.py` on "
        "their PYTHONPATH that calls `gpu_exporter.simulate.install(SCENARIO)` at interpreter start, so both "
        "read the same simulated GPUs through the same pynvml, and gpu-exporter runs as on a real driver "
        "(no `--simulate`). nvitop's NVLink queries (`nvmlDeviceGetFieldValues`) are not simulated and come "
        "back N/A, which if anything saves it work.",
        f"- **Scraper.** After the exporter serves GPU metrics: {num(d.warmup)} s warm-up at the steady rate, "
        f"then RSS (psutil), then {num(d.idle)} s without scrapes (CPU of polling alone, from "
        f"{num(d.settle)} s after the last scrape: gpu-exporter may still render once for a scrape its "
        f"scraper's interval made it expect), then {num(d.scrape)} s "
        f"of steady scraping at {num(d.rate)} scrapes/s, one at a time, each on a fresh connection with the "
        "headers Prometheus 2.x sends (OpenMetrics preferred, `Accept-Encoding: gzip`). Latency is request "
        "sent to body read. CPU is in seconds per minute: for polling alone, the sum of the exporter's threads' "
        "`/proc/PID/task/TID/schedstat` run time (nanoseconds); under the scraper, the process's user+system "
        "time from psutil (10 ms ticks, but it keeps the time of the finished per-request threads). CPU per "
        "scrape is the scraped stage's CPU minus the polling rate, per scrape. At Prometheus's usual 15 s "
        "interval, the CPU an exporter costs is about the polling figure.",
        "- **CPU and the simulation.** The simulated NVML is Python running inside each exporter process, "
        "where a real driver is a C library (and the kernel): on these nodes it takes a large share of either "
        "exporter's polling CPU, in proportion to the NVML calls each makes (its event wait for XID errors "
        "included, which only gpu-exporter has). The `sitecustomize.py` meters it: every simulated NVML "
        "function is wrapped to add its thread CPU time (`time.thread_time_ns`) to a per-process total, which "
        f"a thread writes with a timestamp every {bench_scrape.METER_INTERVAL:g} s (its own CPU counts as "
        "simulation). The tables show that CPU in its own columns, and compare both exporters net of it: "
        "their own work, which is what a real node pays on top of the driver.",
        "- **RSS and the simulation.** The simulated NVML lives inside each exporter process. The table gives "
        "its share, measured as the RSS of a Python process that loads pynvml and PyYAML and installs the "
        "scenario minus one that only loads pynvml and PyYAML, and the RSS net of it, which is what a node "
        "with a real driver pays.",
        f"- **Accuracy.** In-process and exact: the poller and utilization collector poll the packaged "
        f"`bursty.yaml` GPU (3 s at 95%, 7 s idle, mean 28.5%) on a hand-driven clock, once per simulated "
        f"second for {results.accuracy_seconds} simulated seconds; the ground truth is "
        "`SimulatedNode.true_busy_seconds`. See bench/accuracy.py.",
        f"- **Instrumentation.** `timeit`, {results.micro_number} iterations, {results.micro_repeat} repeats "
        "per statement, median per iteration; the run's pusher points at a closed port with an hour-long "
        "interval, so nothing is sent while timing. The training loop is a small MLP (256-512-512-10, batch "
        "64, SGD) on the CPU with one torch thread, run alternately without (A) and with (B) the library "
        "(`run.data`, phases `compute` and `metrics`, `run.step`), the same number of steps each time.",
        "",
    ]


def _scrape(results: Results) -> list[str]:
    rows = []
    for o, p in _pairs(results):
        sim = results.simulation_rss_mb[o.gpus, o.processes]
        for r in (o, p):
            rows.append([_node(r), r.exporter, str(r.series), str(r.wire_bytes), num(r.p50_ms), num(r.p99_ms),
                         num(r.max_ms), str(r.scrapes), num(r.poll_cpu_s_per_min), num(r.sim_poll_s_per_min),
                         num(r.cpu_s_per_min), num(r.sim_scraped_s_per_min), num(r.cpu_ms_per_scrape),
                         num(r.rss_mb), num(sim), num(net_rss(results, r))])
    lines = ["## Scrape cost side by side", "",
             *_table(["node", "exporter", "series", "bytes on the wire", "p50 ms", "p99 ms", "max ms", "scrapes",
                      "CPU s/min polling", "of which simulated NVML", "CPU s/min scraped",
                      "of which simulated NVML", "CPU ms per scrape", "RSS MB", "of which simulation MB",
                      "RSS net of simulation MB"], rows),
             "### Ratios (nvitop-exporter ÷ gpu-exporter; above 1 means gpu-exporter is cheaper)", "",
             "Measured side by side on the same simulated node. CPU and RSS net of the simulated NVML, except "
             "the column that says otherwise.", ""]
    ratio_rows = [[_node(o), ratio(div(p.p50_ms, o.p50_ms)), ratio(div(p.p99_ms, o.p99_ms)),
                   ratio(div(net_poll(p), net_poll(o))), ratio(div(p.poll_cpu_s_per_min, o.poll_cpu_s_per_min)),
                   ratio(div(net_scraped(p), net_scraped(o))), ratio(div(net_rss(results, p), net_rss(results, o)))]
                  for o, p in _pairs(results)]
    return lines + _table(["node", "p50", "p99", "CPU polling", "CPU polling with the simulated NVML",
                           "CPU scraped", "RSS"], ratio_rows)


def _growth(results: Results) -> list[str]:
    rows = []
    for exporter in (OURS, PEER):
        mine = [r for r in results.scrape if r.exporter == exporter]
        for label, value in (("CPU s/min polling (net)", net_poll),
                             ("scrape p50 ms", lambda r: r.p50_ms), ("RSS MB", lambda r: r.rss_mb)):
            a, b, c = fit([(r.gpus, r.processes, value(r)) for r in mine])
            rows.append([exporter, label, num(a), num(b), num(c * 100)])
    return ["## How cost grows with GPUs and processes", "",
            "A least-squares fit of each figure as base + per GPU * GPUs + per process * processes over the node "
            "sizes of this run (the per-process slope is given per 100 processes).", "",
            *_table(["exporter", "figure", "base", "per GPU", "per 100 processes"], rows)]


def _profile(results: Results) -> list[str]:
    prof = results.profile
    g, p = results.profile_node
    rows = [[f"`{h.function}`", str(h.calls), num(h.own_percent)] for h in prof.top]
    return ["## Where gpu-exporter's polling time goes", "",
            f"cProfile of {prof.polls} in-process poller cycles (every polling collector) on the {g}-GPU, "
            f"{p}-process node: one cycle takes {num(prof.poll_ms)} ms unprofiled. The simulated NVML takes "
            f"{num(prof.simulation_percent)}% of the profiled time (on a real node the driver takes its place); "
            "the rest, by own time:", "",
            *_table(["function", "calls", "% of profiled time"], rows),
            "A poll only records its values as plain rows. Their text is rendered straight from the rows "
            "(each series' label prefix kept from the previous render, no prometheus_client family objects) "
            "when a scrape first wants it, or on the polling thread right after the poll when a scraper's "
            "interval says a scrape is due before the next poll; later scrapes of the same poll reuse the "
            "text and the gzip of it, so polls that no scrape reads cost no rendering.", ""]


def _accuracy(results: Results) -> list[str]:
    rows = [[f"{r.interval} s", r.method, str(r.points), num(r.point_mean_pp), num(r.point_max_pp), str(r.windows),
             num(r.window_mean_pp), num(r.window_max_pp)] for r in results.accuracy]
    return ["## Accuracy on a bursty GPU", "",
            f"Error in percentage points against the truth. *Per scrape*: each scraped value against the true "
            f"mean since the previous scrape (for the counter, its increase over the interval, which is what "
            f"`rate()` over one interval gives). *{WINDOW // 60}-minute mean*: counter increase over the window "
            f"against the mean of the scraped gauge values (`avg_over_time`), each against the true mean. Scrape "
            f"intervals {' and '.join(f'{i} s' for i in SCRAPE_INTERVALS)}, every phase offset of the schedule.",
            "",
            *_table(["scrape interval", "method", "scrapes", "per scrape: mean error pp", "max pp",
                     f"{WINDOW // 60}-min windows", "window: mean error pp", "max pp"], rows),
            "The 10 s burst period beats against both intervals: every 15 s scrape alternates between two "
            "phases of the burst, and a 60 s scrape always lands on the same phase, so a gauge can read 0% or "
            "95% for the whole hour while the GPU runs at 28.5%. The counter integrates every 1/6 s sample "
            "(its remaining error is the 1/6 s sampling edge at the end of an interval).", ""]


def _instrumentation(results: Results) -> list[str]:
    micro = {m.code: m for m in results.micro}
    phase = micro["with compute: pass"].median_ns
    rows = [[m.name, f"`{m.code}`", num(m.median_ns), f"{num(m.min_ns)}-{num(m.max_ns)}",
             ratio(m.median_ns / phase)] for m in results.micro]
    return ["## Instrumentation overhead", "",
            "Nanoseconds per enter+exit pair (one iteration), median over repeats; the last column is relative "
            "to the gpu_exporter.training phase with the phase object kept.", "",
            *_table(["what", "statement", "median ns", "range ns", "relative to phase"], rows)]


def _training(results: Results) -> list[str]:
    phase = {m.code: m for m in results.micro}["with compute: pass"].median_ns
    ab = results.training
    tr_rows = [["A: without the library", str(len(ab.a)), num(statistics.fmean(ab.a)), num(min(ab.a)),
                num(max(ab.a)), num(statistics.stdev(ab.a))],
               ["B: with gpu_exporter.training", str(len(ab.b)), num(statistics.fmean(ab.b)), num(min(ab.b)),
                num(max(ab.b)), num(statistics.stdev(ab.b))]]
    return ["### A real training loop", "",
            f"Steps per second, {ab.steps_per_rep} steps per repetition, A and B alternated "
            f"{len(ab.a)} times, {ab.threads} torch thread.", "",
            *_table(["loop", "repetitions", "mean steps/s", "min", "max", "stdev"], tr_rows),
            f"B relative to A: {ab.diff_percent:+.2f}%; the noise (two standard errors of the difference) is "
            f"±{num(ab.noise_percent)}%. Three phase changes per step at the measured phase cost are "
            f"{num(3 * phase / 1e3)} µs against a step of "
            f"{num(1e6 / statistics.fmean(ab.a))} µs.", ""]


def _load(results: Results) -> list[str]:
    load, (g, p) = results.load, results.load_node
    plan = load.plan
    rows = [[str(plan.scrapers), num(plan.scrape_rate), str(plan.pushers), num(plan.push_interval),
             num(plan.seconds), str(load.scrapes), str(load.pushes), str(load.errors), num(load.scrape_p50_ms),
             num(load.scrape_p99_ms), num(load.scrape_max_ms), num(load.push_p99_ms), num(load.rss_start_mb),
             num(load.rss_end_mb), num(load.cpu_s_per_min)]]
    errors = "; ".join(load.first_errors) or "none"
    return ["## Under load", "",
            f"One gpu-exporter on the {g}-GPU, {p}-process node (simulated NVML as above), {plan.scrapers} "
            f"scrapers each scraping `/metrics` {num(plan.scrape_rate)} times a second and {plan.pushers} training "
            f"runs each pushing a snapshot every {num(plan.push_interval)} s, for {num(plan.seconds)} s. Clients "
            "run as threads in 4 worker processes on the same 2 cores, each request on a fresh connection; an "
            "answer other than 200 (scrape) or 202 (push), a connection error or a 10 s timeout counts as an "
            f"error. Each client waits for its answer before its next request, so on a saturated machine the "
            f"achieved rate drops instead of requests piling up: {num(load.scrapes / plan.seconds)} scrapes/s "
            f"achieved of {num(plan.scrapers * plan.scrape_rate)} planned, {num(load.pushes / plan.seconds)} "
            f"pushes/s of {num(plan.pushers / plan.push_interval)}. RSS is the exporter's (simulated NVML "
            f"included) before and after the load. Errors seen: {errors}.", "",
            *_table(["scrapers", "scrapes/s each", "pushers", "push interval s", "seconds", "scrapes", "pushes",
                     "errors", "scrape p50 ms", "scrape p99 ms", "scrape max ms", "push p99 ms",
                     "RSS at start MB", "RSS at end MB", "CPU s/min"], rows)]
