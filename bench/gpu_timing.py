"""What GPU-truthful phases cost a training step: a 1 ms step with and without events at its phase changes.

The library records a CUDA event at every phase change when it sees CUDA (training/run.py ``GpuClock``). This
machine has no GPU, so the events here are stand-ins that do nothing (``record()``, ``query()`` and
``elapsed_time()`` return at once): the figure is the library's own Python cost per step, side by side with the
same loop without events (the plain phase path, as without CUDA), interleaved in one run. On a real GPU each
event adds ``cudaEventRecord`` (host-side, a few microseconds through torch's Python binding): bench/real_gpu.py
measures that where a GPU is lent. The step is 1 ms of busy CPU in three phases (data, compute, metrics); the
pusher reads the events every 0.1 s, as often as it can run. Run::

    PYTHONPATH=exporter python -m bench.gpu_timing --steps 3000 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
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


def _spin(until: float) -> None:
    while time.perf_counter() < until:
        pass


def _run(events: bool, steps: int) -> float:
    """Seconds per step beyond the step's own 1 ms, for one run of ``steps`` steps."""
    run = Run("bench", uuid="")
    if events:
        run._gpu = GpuClock(_NoopEvent, run._other, run._start)
        run._phase_class = _EventPhase
        for phase in run._order:
            phase.__class__ = _EventPhase
    data, compute, metrics = run.phase("data"), run.phase("compute"), run.phase("metrics")
    stop = threading.Event()

    def pusher() -> None:
        while not stop.wait(0.1):
            run.phase_seconds()

    reader = threading.Thread(target=pusher, daemon=True)
    reader.start()
    began = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        with data:
            _spin(t + 0.0002)
        with compute:
            _spin(t + 0.0008)
        with metrics:
            _spin(t + 0.001)
        run.step(32)
    took = time.perf_counter() - began
    stop.set()
    reader.join()
    run.close()
    return took / steps - 0.001


def measure(steps: int, repeats: int) -> dict[str, float]:
    """Median extra seconds per 1 ms step with and without events, interleaved; and the events' share of a step."""
    plain: list[float] = []
    timed: list[float] = []
    for _ in range(repeats):
        plain.append(_run(False, steps))
        timed.append(_run(True, steps))
    a, b = statistics.median(plain), statistics.median(timed)
    return {"plain_us": a * 1e6, "events_us": b * 1e6, "added_us": (b - a) * 1e6,
            "added_percent": (b - a) / 0.001 * 100}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=7)
    ns = parser.parse_args()
    r = measure(ns.steps, ns.repeats)
    print(f"per 1 ms step (3 phases, 6 phase changes): plain path {r['plain_us']:.1f} us over the step, "
          f"with events {r['events_us']:.1f} us; events add {r['added_us']:.1f} us = {r['added_percent']:.2f}% "
          f"of the step")


if __name__ == "__main__":
    main()
