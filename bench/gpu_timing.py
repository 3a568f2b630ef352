"""What GPU-truthful phases cost a training step: a phase enter+exit with and without events at its phase changes.

The library records a CUDA event at every phase change when it sees CUDA (training/run.py ``GpuClock``), and
the pusher thread folds completed events in. This machine has no GPU, so the events here are stand-ins that
do nothing (``record()``, ``query()`` and ``elapsed_time()`` return at once): the figures are the library's own
Python cost, side by side with the plain phase path (as without CUDA), interleaved in one run, medians of
repeated ``timeit`` runs (robust to a busy machine). A 1 ms step of three phases has six phase changes: the
added cost is three enter+exit pairs plus six folds. On a real GPU each event also costs ``cudaEventRecord``
through torch's binding: bench/real_gpu.py measures that where a GPU is lent. Run::

    PYTHONPATH=exporter python -m bench.gpu_timing --number 100000 --repeats 9
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit
from typing import Any

from gpu_exporter.training.run import GpuClock, Run, _EventPhase


class _NoopEvent:
    """A CUDA event that is always complete and took no time (the Python cost of the library only)."""

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: Any) -> float:
        return 0.0


def _run(events: bool) -> Run:
    run = Run("bench", uuid="")
    if events:
        run._gpu = GpuClock(_NoopEvent, run._other, run._start)
        run._phase_class = _EventPhase
        for phase in run._order:
            phase.__class__ = _EventPhase
    return run


def measure(number: int, repeats: int) -> dict[str, float]:
    """Nanoseconds per phase enter+exit (two phase changes) without and with events, interleaved, median of
    ``repeats``; the pusher's cost to fold in one event; and what events add to a 1 ms step of three phases."""
    plain: list[float] = []
    timed: list[float] = []
    folds: list[float] = []
    for _ in range(repeats):
        for events, out in ((False, plain), (True, timed)):
            run = _run(events)
            compute = run.phase("compute")

            def pair(compute: Any = compute) -> None:
                with compute:
                    pass

            out.append(timeit.timeit(pair, number=number) / number * 1e9)
            if events:
                began = time.perf_counter()
                run.phase_seconds()  # folds in the 2 * number events recorded above
                folds.append((time.perf_counter() - began) / (2 * number) * 1e9)
            run.close()
    a, b, fold = statistics.median(plain), statistics.median(timed), statistics.median(folds)
    per_step = 3 * (b - a) + 6 * fold  # three phases: six changes, each recorded and later folded in
    return {"plain_ns": a, "events_ns": b, "fold_ns": fold, "step_added_us": per_step / 1e3,
            "added_percent": per_step / 1e6 * 100}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=9)
    ns = parser.parse_args()
    r = measure(ns.number, ns.repeats)
    print(f"phase enter+exit: {r['plain_ns']:.0f} ns plain, {r['events_ns']:.0f} ns with events; folding in one "
          f"event (pusher thread): {r['fold_ns']:.0f} ns; a 1 ms step of 3 phases: +{r['step_added_us']:.2f} us "
          f"= {r['added_percent']:.2f}% (stand-in events: add cudaEventRecord's own cost on a GPU)")


if __name__ == "__main__":
    main()
