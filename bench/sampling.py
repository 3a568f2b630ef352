"""CPU cost of sampled phases (collectors/stacks.py): py-spy's CPU per sampled process, and the job's slowdown.

The exporter runs ``py-spy record --idle --threads --format raw`` on each GPU process in 5 s windows.
Here one target process runs a Python loop with a training-like stack (about 30 frames deep, the depth
of a PyTorch step under a DataLoader) for ``seconds``; for each rate, py-spy records it in the
exporter's windows and its CPU time (user + system, from the children's rusage) per second of wall
time is the cost. The target counts its loop iterations, so its throughput with and without the
sampler shows what the job pays. Both of py-spy's modes are measured: paused reads (the exporter's)
and ``--nonblocking`` reads, which never pause the job but can race it and fail (py-spy counts the
failures: the last column). Example::

    python -m bench.sampling --seconds 10 --rates 5,20,50 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from gpu_exporter.collectors.stacks import WINDOW_SECONDS, pyspy_binary

TARGET = """
import sys, time
def frame(depth, end):
    if depth:
        return frame(depth - 1, end)
    n = 0
    while time.perf_counter() < end:
        sum(i * i for i in range(50))
        n += 1
    return n
end = time.perf_counter() + float(sys.argv[1])
count = 0
while time.perf_counter() < end:
    count += frame(30, min(end, time.perf_counter() + 0.01))
print(count)
"""


@dataclass(frozen=True)
class Row:
    """One rate and mode: py-spy's CPU per second of wall time, the target's loop rate relative to unsampled
    (median of the repetitions, each against the unsampled run beside it), and the samples py-spy lost."""

    rate: float
    mode: str
    pyspy_cpu_per_second: float
    target_throughput: float
    lost: float


MODES = {"nonblocking": ("--nonblocking",), "blocking": ()}
"""py-spy's two ways to read a stack: without pausing the process (a read can race it and fail), or paused."""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_target(seconds: float, rate: float, pyspy: str, flags: tuple[str, ...] = ()) -> tuple[float, float, float]:
    """(py-spy CPU seconds per wall second, target iterations, share of samples py-spy failed to read) for one
    run at ``rate`` (0: unsampled), py-spy given ``flags``."""
    target = subprocess.Popen([sys.executable, "-c", TARGET, str(seconds)], stdout=subprocess.PIPE, text=True)
    cpu, wall, samples, errors = 0.0, 0.0, 0, 0
    time.sleep(0.2)
    with tempfile.TemporaryDirectory() as tmp:
        deadline = time.monotonic() + seconds - 0.5
        while rate and time.monotonic() + WINDOW_SECONDS <= deadline:
            before, started = _children_cpu(), time.monotonic()
            done = subprocess.run([pyspy, "record", "--pid", str(target.pid), "--rate", f"{rate:g}", "--duration",
                                   str(WINDOW_SECONDS), "--format", "raw", "--idle", "--threads", *flags,
                                   "--output", os.path.join(tmp, "raw.txt")],
                                  capture_output=True, check=True, text=True)
            counted = re.search(r"Samples: (\d+) Errors: (\d+)", done.stdout + done.stderr)
            if counted:
                samples, errors = samples + int(counted[1]), errors + int(counted[2])
            cpu += _children_cpu() - before
            wall += time.monotonic() - started
    out, _ = target.communicate()
    return (cpu / wall if wall else 0.0), float(out.strip()), errors / (samples + errors) if samples else 0.0


def measure(seconds: float, rates: list[float], repeats: int = 1) -> list[Row]:
    """Per rate and mode, ``repeats`` pairs of an unsampled and a sampled run; py-spy missing or refused
    raises RuntimeError."""
    pyspy = pyspy_binary()
    if pyspy is None:
        raise RuntimeError("py-spy is not installed: pip install py-spy (it is in the test extra)")
    rows = []
    for rate in rates:
        for mode, flags in MODES.items():
            runs = []
            for _ in range(repeats):
                base = _run_target(seconds, 0, pyspy)[1]
                cost, count, lost = _run_target(seconds, rate, pyspy, flags)
                runs.append((cost, count / base, lost))
            rows.append(Row(rate, mode, *(statistics.median(r[i] for r in runs) for i in range(3))))
    return rows


def markdown(rows: list[Row], seconds: float, repeats: int) -> str:
    """The table for docs/benchmarks.md."""
    lines = ["| rate (samples/s) | py-spy mode | py-spy CPU per sampled process | target's throughput vs unsampled "
             "| samples py-spy failed to read |", "|---|---|---|---|---|"]
    lines += [f"| {r.rate:g} | {r.mode} | {r.pyspy_cpu_per_second * 100:.1f}% of a core | "
              f"{r.target_throughput * 100:.1f}% | {r.lost * 100:.1f}% |" for r in rows]
    note = (f"({seconds:g} s per run, medians of {repeats} pairs of an unsampled and a sampled run; "
            f"{WINDOW_SECONDS} s py-spy windows as the exporter runs them.)")
    return "\n".join(lines) + "\n\n" + note + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sampling", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per rate (default 20)")
    parser.add_argument("--rates", default="5,20,50", help="comma-separated sampling rates (default 5,20,50)")
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs per rate and mode (default 3)")
    args = parser.parse_args(argv)
    try:
        rows = measure(args.seconds, [float(r) for r in args.rates.split(",")], args.repeats)
    except (RuntimeError, subprocess.CalledProcessError) as err:
        print(f"bench.sampling: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(markdown(rows, args.seconds, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
