"""``python -m bench --quick|--full [--update-docs | --output FILE]``: run every benchmark, write the document.

Quick mode (about a minute; CI runs it) measures three node sizes with short stages; full mode
measures 1, 8 and 16 GPUs with 0, 64 and 256 processes, and 64 GPUs with 512. Both run the accuracy, instrumentation,
training-loop, CUDA-path (bench/cuda_path.py) and load benchmarks and write the document to a new temporary file
(its path is printed), to docs/benchmarks.md with ``--update-docs``, or to ``--output``. Writing to an existing
file replaces only the regions this run writes (bench.doc_regions) and keeps every other line of it. The load bench
(16 scrapers at 10/s and 32 pushers every 0.5 s) runs 5 s in quick mode and 300 s in full mode;
``--load-seconds`` changes that. Example::

    PYTHONPATH=exporter python -m bench --full --update-docs

The benchmarks need the ``test`` extra (nvitop-exporter, psutil, torch): ``pip install -e '.[test]'``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from bench import accuracy, cuda_path, doc_regions, hotspots, instrumentation, load, readme, report, scrape
from bench.node import Sleepers, write_scenario

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO / "docs" / "benchmarks.md"


@dataclass(frozen=True)
class Mode:
    """Sizes and durations of one bench mode."""

    name: str
    nodes: tuple[tuple[int, int], ...]
    """(GPUs, processes) of each simulated node."""
    durations: scrape.Durations
    accuracy_seconds: int
    micro_number: int
    micro_repeat: int
    training_pairs: int
    training_seconds: float
    profile_polls: int
    load_seconds: float
    load_node: tuple[int, int] = (8, 64)


QUICK = Mode("quick", ((1, 0), (8, 0), (8, 64)),
             scrape.Durations(warmup=0.5, idle=1.0, scrape=2.0, rate=4.0, burst=10, spaced=2, floor=2,
                              settle=0.5),
             accuracy_seconds=3600, micro_number=20_000, micro_repeat=3, training_pairs=2, training_seconds=0.4,
             profile_polls=3, load_seconds=5.0)
"""Every stage of FULL, each as short as still gives each figure (the test checks the document's form, not its
figures): about a minute on 2 cores."""
FULL = Mode("full", (*((g, p) for g in (1, 8, 16) for p in (0, 64, 256)), (64, 512)),
            scrape.Durations(warmup=4.0, idle=6.0, scrape=15.0, rate=4.0, burst=40, spaced=20, floor=20),
            accuracy_seconds=7200, micro_number=200_000, micro_repeat=9, training_pairs=8, training_seconds=2.5,
            profile_polls=20, load_seconds=300.0)


def _say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def run(mode: Mode, command: str) -> tuple[report.Results, cuda_path.CudaPath]:
    """Run every benchmark of ``mode``; ``command`` is recorded in the document."""
    started = time.perf_counter()
    started_utc = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_before = os.getloadavg()
    results: list[scrape.ScrapeResult] = []
    sim_rss: dict[tuple[int, int], float] = {}
    largest = max(mode.nodes)
    with tempfile.TemporaryDirectory(prefix="gpu-exporter-bench-") as tmp, \
            Sleepers(max(p for _, p in mode.nodes)) as pids:
        folder = Path(tmp)
        scenarios = {}
        for i, (gpus, processes) in enumerate(mode.nodes):
            scenario = scenarios[gpus, processes] = write_scenario(folder, gpus, pids[:processes])
            specs = [scrape.ours(scenario, folder / f"site-ours-{gpus}-{processes}"),
                     scrape.nvitop(scenario, folder / f"site-nvitop-{gpus}-{processes}")]
            for spec in specs if i % 2 == 0 else specs[::-1]:
                _say(f"{spec.name} on {gpus} GPU(s), {processes} processes")
                results.append(scrape.measure(spec, mode.durations, gpus, processes))
            sim_rss[gpus, processes] = scrape.simulation_rss_mb(scenario)
        _say(f"profiling {mode.profile_polls} polls on the largest node")
        profile = hotspots.profile_polls(scenarios[largest], mode.profile_polls)
        g, p = mode.load_node
        _say(f"load: {mode.load_seconds:g} s on {g} GPUs, {p} processes")
        load_scenario = scenarios.get(mode.load_node) or write_scenario(folder, g, pids[:p])
        under_load = load.measure_load(scrape.ours(load_scenario, folder / "site-load"),
                                       load.LoadPlan(seconds=mode.load_seconds))
    _say("accuracy on the bursty GPU")
    acc = accuracy.measure_accuracy(mode.accuracy_seconds)
    _say("phase enter/exit micro-benchmark")
    micro = instrumentation.measure_phase_overhead(mode.micro_number, mode.micro_repeat)
    _say("training loop A/B")
    training = instrumentation.measure_training(mode.training_pairs, mode.training_seconds)
    _say("phase cost and training loop on the CUDA path (simulated torch.cuda)")
    cuda = cuda_path.measure(mode.micro_number, mode.micro_repeat, mode.training_pairs, mode.training_seconds)
    return report.Results(
        mode=mode.name, command=command, started_utc=started_utc, elapsed_s=time.perf_counter() - started,
        load_before=load_before, load_after=os.getloadavg(), durations=mode.durations, scrape=results,
        simulation_rss_mb=sim_rss, profile=profile, profile_node=largest, accuracy=acc,
        accuracy_seconds=mode.accuracy_seconds, micro=micro, micro_number=mode.micro_number,
        micro_repeat=mode.micro_repeat, training=training, load=under_load, load_node=mode.load_node), cuda


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run, write the document; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n", 1)[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--quick", action="store_true", help="three node sizes, short stages (CI)")
    which.add_argument("--full", action="store_true", help="ten node sizes (about 30 minutes on 2 quiet cores)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--update-docs", action="store_true", help=f"write {DEFAULT_OUTPUT.relative_to(REPO)} "
                                                                  "(default: a new temporary file)")
    where.add_argument("--output", type=Path, metavar="FILE", help="write the document to FILE")
    parser.add_argument("--load-seconds", type=float, metavar="S",
                        help=f"length of the load bench (default {QUICK.load_seconds:g} quick, "
                             f"{FULL.load_seconds:g} full)")
    args = parser.parse_args(argv)
    if args.output is not None and not args.output.parent.is_dir():
        print(f"bench: error: the folder of --output {args.output} does not exist", file=sys.stderr)
        return 2
    mode = FULL if args.full else QUICK
    command = "PYTHONPATH=exporter python -m bench " + ("--full" if args.full else "--quick")
    if args.load_seconds is not None:
        if not args.load_seconds > 0:
            print(f"bench: error: --load-seconds must be > 0, not {args.load_seconds:g}", file=sys.stderr)
            return 2
        mode = dataclasses.replace(mode, load_seconds=args.load_seconds)
        command += f" --load-seconds {args.load_seconds:g}"
    if args.update_docs:
        command += " --update-docs"
    elif args.output is not None:
        command += f" --output {args.output}"
    results, cuda = run(mode, command)
    output = DEFAULT_OUTPUT if args.update_docs else args.output or _temporary_document()
    old = output.read_text() if output.is_file() else ""
    output.write_text(write(old, results, cuda, command))
    _say(f"wrote {output} in {results.elapsed_s:.0f} s")
    if args.update_docs:  # the README's Measured table is generated from the document just written
        readme.main([])
    return 0


def write(old: str, results: report.Results, cuda: cuda_path.CudaPath, command: str) -> str:
    """The page ``old`` after this run: each region the run writes (``bench.run.*``, ``bench.spaced``,
    ``bench.cuda_path``) replaced by the new one, every other line of ``old`` as it was (the regions of other
    benches, the sections kept by hand); the whole new page when ``old`` is empty."""
    new = report.render(results, after={"training": cuda_path.section(cuda, command)})
    return doc_regions.update(old, new)


def _temporary_document() -> Path:
    """A new file for the document when neither --update-docs nor --output says where."""
    fd, name = tempfile.mkstemp(prefix="gpu-exporter-benchmarks-", suffix=".md")
    os.close(fd)
    return Path(name)
