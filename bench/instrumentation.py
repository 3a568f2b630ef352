"""Cost of timing a training phase, and of the library in a real CPU PyTorch loop.

Micro-benchmark: nanoseconds per enter+exit pair of a ``run.phase("compute")`` block against
the floor (two bare ``perf_counter()`` calls), ``prometheus_client`` ``Histogram.time()`` and
``torch.profiler.record_function`` (no profiler running). The run's pusher points at a closed
port with an hour-long push interval, so no I/O happens while measuring. Example::

    rows = measure_phase_overhead(number=100_000, repeat=7)
    ab = measure_training(pairs=3, seconds=1.0)
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import socket
import statistics
import timeit
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from gpu_exporter import training
from prometheus_client import CollectorRegistry, Histogram


@dataclass(frozen=True)
class MicroRow:
    """Median (and spread over repeats) of one timed statement, nanoseconds per iteration."""

    name: str
    code: str
    median_ns: float
    min_ns: float
    max_ns: float


@dataclass(frozen=True)
class TrainingAB:
    """Steps per second of the same loop without (A) and with (B) the library, per repetition."""

    threads: int
    steps_per_rep: int
    a: list[float]
    b: list[float]

    @property
    def diff_percent(self) -> float:
        """Mean of B relative to mean of A, in percent (negative: the library slowed it)."""
        return (statistics.fmean(self.b) / statistics.fmean(self.a) - 1) * 100

    @property
    def noise_percent(self) -> float:
        """Two standard errors of the difference of the means, in percent of A's mean."""
        variance = statistics.variance(self.a) / len(self.a) + statistics.variance(self.b) / len(self.b)
        return 2 * math.sqrt(variance) / statistics.fmean(self.a) * 100


@contextlib.contextmanager
def _quiet_pusher() -> Iterator[None]:
    """The pusher reports the closed port once at close(); that is expected here."""
    log = logging.getLogger("gpu_exporter.training")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def measure_phase_overhead(number: int, repeat: int) -> list[MicroRow]:
    """Time each candidate ``repeat`` times over ``number`` iterations (the loop itself is a row too)."""
    from torch.profiler import record_function

    with _quiet_pusher():
        return _time_candidates(number, repeat, record_function)


def _time_candidates(number: int, repeat: int, record_function: Any) -> list[MicroRow]:
    run = training.start("bench", url=_closed_port_url(), uuid="", push_interval=3600.0, timeout=0.2)
    histogram = Histogram("bench_phase_seconds", "bench", registry=CollectorRegistry())
    namespace: dict[str, Any] = {
        "run": run, "compute": run.phase("compute"), "histogram": histogram,
        "record_function": record_function, "perf_counter": __import__("time").perf_counter,
    }
    candidates = (
        ("empty loop (timeit's own cost per iteration)", "pass"),
        ("floor: two perf_counter() calls", "perf_counter(); perf_counter()"),
        ("gpu_exporter.training phase, kept object", "with compute: pass"),
        ("gpu_exporter.training run.phase(\"compute\")", "with run.phase('compute'): pass"),
        ("prometheus_client Histogram.time()", "with histogram.time(): pass"),
        ("torch.profiler.record_function", "with record_function('compute'): pass"),
    )
    rows = []
    try:
        for name, code in candidates:
            times = timeit.Timer(code, globals=namespace).repeat(repeat=repeat, number=number)
            per = [t / number * 1e9 for t in times]
            rows.append(MicroRow(name, code, statistics.median(per), min(per), max(per)))
    finally:
        run.close()
    return rows


def measure_training(pairs: int, seconds: float, threads: int = 1) -> TrainingAB:
    """A/B/A/B... repetitions of a small MLP's training loop on the CPU, ``seconds`` each."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    batches = [(torch.randn(64, 256), torch.randint(0, 10, (64,))) for _ in range(32)]

    def train_step(x: Any, y: Any) -> Any:
        optimizer.zero_grad()
        out = model(x)
        loss_fn(out, y).backward()
        optimizer.step()
        return out

    def metrics(out: Any, y: Any) -> float:
        return float((out.argmax(1) == y).float().mean().item())

    def plain(steps: int) -> None:
        for x, y in itertools.islice(itertools.cycle(batches), steps):
            out = train_step(x, y)
            metrics(out, y)

    def instrumented(steps: int) -> None:
        compute, metric_phase = run.phase("compute"), run.phase("metrics")
        for x, y in run.data(itertools.islice(itertools.cycle(batches), steps)):
            with compute:
                out = train_step(x, y)
            with metric_phase:
                metrics(out, y)
            run.step(samples=len(x))

    a: list[float] = []
    b: list[float] = []
    with _quiet_pusher():
        run = training.start("bench-loop", url=_closed_port_url(), uuid="", push_interval=3600.0, timeout=0.2)
        try:
            steps = _calibrate(plain, seconds)
            instrumented(20)  # warm-up of the instrumented path too
            for _ in range(pairs):
                a.append(_steps_per_second(plain, steps))
                b.append(_steps_per_second(instrumented, steps))
        finally:
            run.close()
    return TrainingAB(threads, steps, a, b)


def _calibrate(loop: Callable[[int], None], seconds: float) -> int:
    loop(20)  # warm-up: allocator, autograd graph caches
    rate = _steps_per_second(loop, 50)
    return max(50, int(rate * seconds))


def _steps_per_second(loop: Callable[[int], None], steps: int) -> float:
    started = timeit.default_timer()
    loop(steps)
    return steps / (timeit.default_timer() - started)


def ratios(rows: Iterable[MicroRow]) -> Iterator[tuple[str, float]]:
    """(name, median relative to the kept-object phase) for every row."""
    rows = list(rows)
    phase = next(r for r in rows if r.code == "with compute: pass")
    for row in rows:
        yield row.name, row.median_ns / phase.median_ns
