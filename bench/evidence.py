"""The evidence collector on a node with real GPU processes: what reading /proc costs, and its budget.

The evidence collector reads /proc/PID/stat, /proc/PID/task/*/children and /proc/PID/io of
every GPU process. Simulated PIDs usually do not exist, so that costs nothing in the other
benches' packaged scenarios; here every simulated GPU process is a real, sleeping host process
(bench/node.py), as on a real node. Two measurements:

- *per read*: in this process, :class:`ProcReader` reads every sleeper a few times; the CPU
  (``time.thread_time``) of one process's read, median over passes;
- *polling CPU*: gpu-exporter on the node (bench/scrape.py: the simulated NVML through
  ``sitecustomize.py``, metered, so CPU is also given net of it), started three times: with the
  evidence collector off, with it reading every process at every poll (``--evidence.cpu-share 0``),
  and with the default budget. Each runs ``settle`` s (the first reads of every process are paid
  back), then ``idle`` s unscraped: polling CPU from the threads' schedstat; then a few spaced scrapes
  give ``gpu_exporter_collector_duration_seconds{collector="evidence"}`` (median). The evidence
  collector's CPU is a run's polling CPU minus that of the run without it.

Example::

    PYTHONPATH=exporter python -m bench.evidence                 # 64 GPUs, 512 processes; about 2 minutes
    PYTHONPATH=exporter python -m bench.evidence --nodes 8x64,64x512 --idle 20
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpu_exporter import catalog
from gpu_exporter.collectors.evidence import CPU_SHARE, ProcReader

from bench import scrape
from bench.node import Sleepers, write_scenario

NODES: tuple[tuple[int, int], ...] = ((64, 512),)
VARIANTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("evidence off", ("--collectors.disabled", "evidence")),
    ("every process at every poll", ("--evidence.cpu-share", "0")),
    (f"default budget ({CPU_SHARE:g} of a CPU)", ()),
)


@dataclass(frozen=True)
class Run:
    """One gpu-exporter run on one node."""

    gpus: int
    processes: int
    variant: str
    poll_cpu_s_per_min: float
    sim_s_per_min: float
    evidence_poll_ms: float
    """Median ``gpu_exporter_collector_duration_seconds{collector="evidence"}`` of the spaced scrapes (wall)."""
    series: int

    @property
    def net_s_per_min(self) -> float:
        return max(0.0, self.poll_cpu_s_per_min - self.sim_s_per_min)


def read_cost_ms(pids: Sequence[int], passes: int = 5) -> float:
    """Median CPU milliseconds of one ProcReader.evidence() of a real process (over ``passes`` passes)."""
    reader = ProcReader()
    per_pass = []
    for _ in range(passes):
        started = time.thread_time()
        for pid in pids:
            if reader.evidence(pid) is None:
                raise RuntimeError(f"bench: process {pid} is not readable in /proc")
        per_pass.append((time.thread_time() - started) / len(pids) * 1000)
    return statistics.median(per_pass)


def _evidence_duration_ms(port: int) -> tuple[float, int]:
    """(evidence collector's last poll duration in ms, series) from one scrape."""
    _, status, body, encoding = scrape.scrape_once(port)
    if status != 200:
        raise RuntimeError(f"bench: scrape of 127.0.0.1:{port} answered HTTP {status}")
    text = (gzip.decompress(body) if encoding == "gzip" else body).decode()
    ms = float("nan")
    series = 0
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series += 1
            if line.startswith(f'{catalog.GPU_EXPORTER_COLLECTOR_DURATION_SECONDS.name}{{collector="evidence"}}'):
                ms = float(line.split()[-1]) * 1000
    return ms, series


def measure(scenario: Path, site: Path, gpus: int, processes: int, variant: str, extra: Sequence[str],
            settle: float, idle: float, scrapes: int) -> Run:
    """One gpu-exporter run (``extra`` flags) on ``scenario``: polling CPU unscraped, then spaced scrapes."""
    spec = scrape.ours(scenario, site)
    spec = scrape.ExporterSpec(spec.name, (*spec.argv, *extra), spec.env, spec.meter)
    with scrape.started(spec) as running:
        time.sleep(settle)
        m0 = scrape.read_meter(spec.meter)
        s0, t0 = scrape.thread_cpu_ns(running.proc.pid), time.perf_counter()
        time.sleep(idle)
        s1, t1 = scrape.thread_cpu_ns(running.proc.pid), time.perf_counter()
        m1 = scrape.read_meter(spec.meter)
        durations, series = [], 0
        for _ in range(scrapes):
            time.sleep(scrape.SPACING)
            ms, series = _evidence_duration_ms(running.port)
            durations.append(ms)
        running.check_alive("during the evidence bench")
    rate = scrape._delta(s0, s1) / (t1 - t0)
    sim = (m1[1] - m0[1]) / (m1[0] - m0[0]) if m1[0] > m0[0] else 0.0
    return Run(gpus, processes, variant, rate * 60, sim * 60, statistics.median(durations), series)


def measure_nodes(nodes: Sequence[tuple[int, int]], settle: float, idle: float, scrapes: int,
                  say: Callable[[str], None] = lambda _: None) -> tuple[dict[tuple[int, int], float], list[Run]]:
    """Per-read cost and every variant's run on every node (variants in alternating order)."""
    costs, runs = {}, []
    with tempfile.TemporaryDirectory(prefix="gpu-exporter-evidence-") as tmp, \
            Sleepers(max(p for _, p in nodes)) as pids:
        folder = Path(tmp)
        costs[(0, 0)] = read_cost_ms(pids)
        for i, (gpus, processes) in enumerate(nodes):
            scenario = write_scenario(folder, gpus, pids[:processes])
            costs[(gpus, processes)] = read_cost_ms(pids[:processes])
            for j, (variant, extra) in enumerate(VARIANTS if i % 2 == 0 else VARIANTS[::-1]):
                say(f"{gpus} GPUs, {processes} processes: {variant}")
                runs.append(measure(scenario, folder / f"site-{gpus}-{processes}-{j}", gpus, processes, variant,
                                    extra, settle, idle, scrapes))
    return costs, runs


def table(costs: dict[tuple[int, int], float], runs: Sequence[Run]) -> list[str]:
    """Markdown: one row per node and variant; the evidence collector's CPU net of the run without it."""
    rows = ["| node | variant | /proc read per process, CPU ms | polling CPU s/min | of which simulated NVML | "
            "net of it | evidence collector s/min | per GPU process, CPU ms per second | evidence poll ms (wall) | "
            "series |", "|---|---|---|---|---|---|---|---|---|---|"]
    off = {(r.gpus, r.processes): r for r in runs if r.variant == VARIANTS[0][0]}
    for r in runs:
        base = off.get((r.gpus, r.processes))
        extra = "—" if base is None or r is base else f"{max(0.0, r.net_s_per_min - base.net_s_per_min):.2f}"
        per = ("—" if base is None or r is base or not r.processes
               else f"{max(0.0, r.net_s_per_min - base.net_s_per_min) / 60 / r.processes * 1000:.3f}")
        poll = "—" if r.evidence_poll_ms != r.evidence_poll_ms else f"{r.evidence_poll_ms:.1f}"
        rows.append(f"| {r.gpus} GPUs, {r.processes} processes | {r.variant} | {costs[(r.gpus, r.processes)]:.3f} | "
                    f"{r.poll_cpu_s_per_min:.2f} | {r.sim_s_per_min:.2f} | {r.net_s_per_min:.2f} | {extra} | {per} | "
                    f"{poll} | {r.series} |")
    return rows


def _parse_nodes(text: str) -> tuple[tuple[int, int], ...]:
    try:
        return tuple((int(g), int(p)) for g, p in (part.split("x") for part in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--nodes wants GPUSxPROCESSES,... like 64x512, not {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.evidence", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=_parse_nodes, default=NODES, metavar="GxP,...",
                        help="simulated nodes as GPUSxPROCESSES (default 64x512)")
    parser.add_argument("--settle", type=float, default=8.0, help="seconds after start before measuring")
    parser.add_argument("--idle", type=float, default=15.0, help="seconds of polling measured, unscraped")
    parser.add_argument("--scrapes", type=int, default=5, help="spaced scrapes read for the collector's duration")
    args = parser.parse_args(argv)
    if any(p < 1 for _, p in args.nodes):
        parser.error("every node needs at least one process")
    before = os.getloadavg()
    costs, runs = measure_nodes(args.nodes, args.settle, args.idle, args.scrapes,
                                lambda m: print(f"bench: {m}", file=sys.stderr, flush=True))
    after = os.getloadavg()
    print("\n".join(table(costs, runs)))
    print(f"\nLoad average before / after: {' '.join(f'{x:.2f}' for x in before)} / "
          f"{' '.join(f'{x:.2f}' for x in after)}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
