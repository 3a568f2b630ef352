"""What timing a training phase costs on the library's CUDA path, measured on the simulated torch.cuda.

When torch.cuda is available the training library records a CUDA event at every phase change (training/run.py
``GpuClock``). This machine has no GPU, so the path runs on ``gpu_exporter.simulate.torch_cuda`` (the torch.cuda
subset on the async simulated device): the library's code is the real one, its events are Python stand-ins.
bench/instrumentation.py measures (``measure_cuda_phase``, ``measure_training(..., cuda=True)``); this module
writes the marked section of docs/benchmarks.md, which ``python -m bench`` also writes in both modes and
``python -m bench.readme`` cites in the README's "training library, CUDA path" row. Run alone (about a minute)::

    PYTHONPATH=exporter python -m bench.cuda_path --update-docs
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from gpu_exporter.training.run import FOLD_EVERY

from bench import instrumentation
from bench.instrumentation import MicroRow, TrainingAB

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench.cuda_path: begin -->", "<!-- bench.cuda_path: end -->"
"""The markers around the section this bench owns in docs/benchmarks.md."""
HEADING = "## Phase cost on the CUDA path"
LOOP_HEADING = "### A real training loop on the CUDA path"
AFTER = "## Instrumentation overhead"
"""The section this one follows when it is first written (the CPU path's figures)."""
EVENT_RECORD_SOURCE = "https://github.com/NVIDIA/NVTX/issues/3"
"""Where a real cudaEventRecord's rate is quoted: an NVIDIA engineer's benchmark (harrism/cuda_event_benchmark)."""


@dataclass(frozen=True)
class CudaPath:
    """One run of the CUDA-path bench: the phase rows, the training loop, and when and where it ran."""

    micro: list[MicroRow]
    number: int
    repeat: int
    training: TrainingAB
    started_utc: str
    commit: str
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    elapsed_s: float


def measure(number: int, repeat: int, pairs: int, seconds: float) -> CudaPath:
    """The phase rows (``number`` enter+exit pairs, ``repeat`` interleaved rounds), then the training loop."""
    started = time.perf_counter()
    started_utc = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_before = os.getloadavg()
    micro = instrumentation.measure_cuda_phase(number, repeat)
    training = instrumentation.measure_training(pairs, seconds, cuda=True)
    return CudaPath(micro, number, repeat, training, started_utc, git_commit(), load_before, os.getloadavg(),
                    time.perf_counter() - started)


def git_commit() -> str:
    """The short commit of the checkout (what was measured), or a note when it is none."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return out.stdout.strip()


def _num(x: float) -> str:
    """About three significant digits, as docs/benchmarks.md prints figures.

    >>> _num(1234.5), _num(56.78), _num(2.345), _num(-1.2)
    ('1234', '56.8', '2.35', '-1.20')
    """
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def _load(load: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in load)


def section(result: CudaPath, command: str) -> str:
    """The marked section of docs/benchmarks.md for ``result``, made by ``command``."""
    rows = {m.code: m for m in result.micro}
    cpu, sim, noop = (rows[code].median_ns for code in ("with cpu: pass", "with sim: pass", "with noop: pass"))
    record = rows["event.record()"].median_ns
    table = ["| what | statement | median ns | range ns | relative to the CPU path |", "|---|---|---|---|---|"]
    table += [f"| {m.name} | `{m.code}` | {_num(m.median_ns)} | {_num(m.min_ns)}-{_num(m.max_ns)} | "
              f"{_num(m.median_ns / cpu)}x |" for m in result.micro]
    ab = result.training
    loop = [f"| {what} | {len(xs)} | {_num(statistics.fmean(xs))} | {_num(min(xs))} | {_num(max(xs))} | "
            f"{_num(statistics.stdev(xs))} |"
            for what, xs in (("A: without the library", ab.a),
                             ("B: with gpu_exporter.training, CUDA path (simulated events)", ab.b))]
    step_us = 1e6 / statistics.fmean(ab.a)
    return "\n".join([
        BEGIN, HEADING, "",
        f"    {command}", "",
        f"Run {result.started_utc} at commit {result.commit}, in {result.elapsed_s:.0f} s, load average "
        f"{_load(result.load_before)} before and {_load(result.load_after)} after (the 2-core machine above, "
        "shared: compare the rows with each other, not with other runs). `python -m bench` measures this too "
        "(both modes) and rewrites this marked section; `python -m bench.readme` cites it in the README's "
        "\"training library, CUDA path\" row.", "",
        "When torch.cuda is available (and `gpu_timing` is on, the default), the training library records a CUDA "
        "event at every phase change ([GPU-truthful phases](training.md#honest-timing-under-cuda-asynchrony)), "
        f"and every {FOLD_EVERY}th change the training thread folds in the events the stream has reached "
        "(`query()`, then `elapsed_time()`), so the events pending stay bounded without a pusher. This machine "
        "has no GPU, so the path runs on the simulated torch.cuda (`gpu_exporter.simulate.torch_cuda` on the "
        "async simulated device): the library's code is the real one, but the events are Python objects on the "
        "simulated device's clock, and **their cost is not a real CUDA event's**. Three runs in one process, the "
        f"statements interleaved in each of {result.repeat} rounds of {result.number} iterations (median and "
        "range over the rounds): the CPU path (`gpu_timing=False`, what a job without CUDA runs), the CUDA path "
        "on the simulated events, and the CUDA path on events that do nothing, which leaves **the library's own "
        "overhead on that path**. The last row is one simulated event's `record()` alone.", "",
        *table, "",
        f"The library's own overhead on the CUDA path: {_num(noop - cpu)} ns per enter+exit above the CPU path "
        f"({_num(noop)} against {_num(cpu)} ns). The simulated events add {_num(sim - noop)} ns more (two "
        f"`record()` calls, {_num(2 * record)} ns measured alone, and their `query()` and `elapsed_time()` in the "
        "folds). On a real GPU each enter+exit instead pays two `torch.cuda.Event.record()` calls (each a "
        "`cudaEventRecord` through torch's Python binding) and, in the folds, `cudaEventQuery` and "
        "`cudaEventElapsedTime`: **not measured here** (no GPU). For scale only: an NVIDIA engineer's event "
        "benchmark recorded about 400,000 timing events a second, about 2.5 µs each, from C++ on a V100 with "
        f"CUDA 10.2 ([quoted here]({EVENT_RECORD_SOURCE})); torch's binding adds its own cost on top. "
        "bench/real_gpu.py measures whole loops where a GPU is lent.", "",
        LOOP_HEADING, "",
        f"The small MLP of [A real training loop](#a-real-training-loop), {ab.steps_per_rep} steps per repetition, "
        f"A and B alternated {len(ab.a)} times, {ab.threads} torch thread, both under the simulated torch.cuda "
        "(the model stays on the CPU); B times phases `data`, `compute` and `metrics` (six phase changes a step), "
        "each recording a simulated event.", "",
        "| loop | repetitions | mean steps/s | min | max | stdev |", "|---|---|---|---|---|---|", *loop, "",
        f"B relative to A: {ab.diff_percent:+.2f}%; the noise (two standard errors of the difference) is "
        f"±{_num(ab.noise_percent)}%. Three enter+exit pairs a step at the simulated events' cost are "
        f"{_num(3 * sim / 1e3)} µs against a step of {_num(step_us)} µs.", "",
        END, ""])


def update_docs(doc: str, new: str) -> str:
    """``doc`` with its marked section replaced by ``new``; without one, ``new`` goes in after the
    Instrumentation overhead section (at the end when that is missing too).

    >>> update_docs("# B\\n" + BEGIN + "\\nold\\n" + END + "\\ntail\\n", BEGIN + "\\nnew\\n" + END + "\\n")
    '# B\\n<!-- bench.cuda_path: begin -->\\nnew\\n<!-- bench.cuda_path: end -->\\ntail\\n'
    >>> update_docs("## Instrumentation overhead\\nx\\n## Under load\\n", "S\\n")
    '## Instrumentation overhead\\nx\\nS\\n\\n## Under load\\n'
    """
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        return head + new.rstrip("\n") + rest.split(END, 1)[1]
    at = doc.find(AFTER + "\n")
    following = doc.find("\n## ", at + len(AFTER)) if at >= 0 else -1
    if following < 0:
        return doc.rstrip("\n") + "\n\n" + new
    return doc[:following + 1] + new.rstrip("\n") + "\n\n" + doc[following + 1:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cuda_path", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--number", type=int, default=100_000, help="enter+exit pairs per round (default 100000)")
    parser.add_argument("--repeat", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--pairs", type=int, default=6, help="A/B pairs of the training loop (default 6)")
    parser.add_argument("--seconds", type=float, default=1.5, help="seconds per loop repetition (default 1.5)")
    parser.add_argument("--update-docs", action="store_true",
                        help=f"replace this bench's section of {DOC.relative_to(REPO)} (and the README's row)")
    args = parser.parse_args(argv)
    if args.number < 1 or args.repeat < 1 or args.pairs < 2 or not args.seconds > 0:
        parser.error("--number and --repeat must be at least 1, --pairs at least 2, --seconds above 0")
    command = "PYTHONPATH=exporter python -m bench.cuda_path " + " ".join(sys.argv[1:] if argv is None else argv)
    text = section(measure(args.number, args.repeat, args.pairs, args.seconds), command.strip())
    print(text)
    if args.update_docs:
        from bench import readme

        DOC.write_text(update_docs(DOC.read_text(), text))
        return readme.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main())
