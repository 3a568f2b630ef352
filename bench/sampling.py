"""CPU cost of sampled phases (gpu_exporter.sampling): py-spy's CPU per sampled process, and the job's slowdown.

The exporter runs ``py-spy record --nonblocking --idle --threads --format raw`` on each GPU process in
5 s windows. Here one target process runs a Python loop with a training-like stack (about 30 frames
deep, the depth of a PyTorch step under a DataLoader) for ``seconds``; for each rate, py-spy records it
in the exporter's windows and its CPU time (user + system, from the children's rusage) per second of
wall time is the cost. The target counts its loop iterations, so its throughput with and without the
sampler shows what the job pays (``--nonblocking``: py-spy never pauses it). Example::

    python -m bench.sampling --seconds 20 --rates 5,20,50
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from gpu_exporter.sampling import WINDOW_SECONDS, pyspy_binary

TARGET = """
import sys, time
def frame(depth, end):
    if depth:
        return frame(depth - 1, end)
    n = 0
    while time.perf_counter() < end:
        n += sum(i * i for i in range(50))
    return n
end = time.perf_counter() + float(sys.argv[1])
count = 0
while time.perf_counter() < end:
    frame(30, min(end, time.perf_counter() + 0.01))
    count += 1
print(count)
"""


@dataclass(frozen=True)
class Row:
    """One rate: py-spy's CPU per second of wall time, and the target's loop rate relative to unsampled."""

    rate: float
    pyspy_cpu_per_second: float
    target_throughput: float


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_target(seconds: float, rate: float, pyspy: str) -> tuple[float, float]:
    """(py-spy CPU seconds per wall second, target iterations) for one run at ``rate`` (0: unsampled)."""
    target = subprocess.Popen([sys.executable, "-c", TARGET, str(seconds)], stdout=subprocess.PIPE, text=True)
    cpu, wall = 0.0, 0.0
    time.sleep(0.2)
    with tempfile.TemporaryDirectory() as tmp:
        deadline = time.monotonic() + seconds - 0.5
        while rate and time.monotonic() + WINDOW_SECONDS <= deadline:
            before, started = _children_cpu(), time.monotonic()
            subprocess.run([pyspy, "record", "--pid", str(target.pid), "--rate", f"{rate:g}", "--duration",
                            str(WINDOW_SECONDS), "--format", "raw", "--idle", "--threads", "--nonblocking",
                            "--output", os.path.join(tmp, "raw.txt")], capture_output=True, check=True)
            cpu += _children_cpu() - before
            wall += time.monotonic() - started
    out, _ = target.communicate()
    return (cpu / wall if wall else 0.0), float(out.strip())


def measure(seconds: float, rates: list[float]) -> list[Row]:
    """One unsampled run, then one per rate; py-spy missing or refused raises RuntimeError."""
    pyspy = pyspy_binary()
    if pyspy is None:
        raise RuntimeError("py-spy is not installed: pip install py-spy (it is in the test extra)")
    _, base = _run_target(seconds, 0, pyspy)
    rows = []
    for rate in rates:
        cost, count = _run_target(seconds, rate, pyspy)
        rows.append(Row(rate, cost, count / base))
    return rows


def markdown(rows: list[Row], seconds: float) -> str:
    """The table for docs/benchmarks.md."""
    lines = ["| rate (samples/s) | py-spy CPU per sampled process | target's throughput vs unsampled |",
             "|---|---|---|"]
    lines += [f"| {r.rate:g} | {r.pyspy_cpu_per_second * 100:.1f}% of a core | {r.target_throughput * 100:.0f}% |"
              for r in rows]
    note = f"({seconds:g} s per rate, {WINDOW_SECONDS} s py-spy windows as the exporter runs them.)"
    return "\n".join(lines) + "\n\n" + note + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sampling", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per rate (default 20)")
    parser.add_argument("--rates", default="5,20,50", help="comma-separated sampling rates (default 5,20,50)")
    args = parser.parse_args(argv)
    try:
        rows = measure(args.seconds, [float(r) for r in args.rates.split(",")])
    except (RuntimeError, subprocess.CalledProcessError) as err:
        print(f"bench.sampling: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(markdown(rows, args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
