"""Cost of timing a training phase, and of the library in a real CPU PyTorch loop.

Micro-benchmark: nanoseconds per enter+exit pair of a ``run.phase("compute")`` block against
the floor (two bare ``perf_counter()`` calls), ``prometheus_client`` ``Histogram.time()`` and
``torch.profiler.record_function`` (no profiler running). The run's pusher points at a closed
port with an hour-long push interval, so no I/O happens while measuring. Example::

    rows = measure_phase_overhead(number=100_000, repeat=7)
    ab = measure_training(pairs=3, seconds=1.0)

The CUDA path (the library records a CUDA event at every phase change when torch.cuda is available:
training/run.py ``GpuClock``) is measured on the simulated torch.cuda (:func:`simulated_cuda`), whose
events are Python objects on the simulated device's clock, not a real driver's: see
:func:`measure_cuda_phase` and ``measure_training(..., cuda=True)``; bench/cuda_path.py writes the section.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import statistics
import tempfile
import timeit
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from gpu_exporter import training
from prometheus_client import CollectorRegistry, Histogram

from testbed import closed_url


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


def measure_phase_overhead(number: int, repeat: int) -> list[MicroRow]:
    """Time each candidate ``repeat`` times over ``number`` iterations (the loop itself is a row too)."""
    from torch.profiler import record_function

    with _quiet_pusher():
        return _time_candidates(number, repeat, record_function)


def _time_candidates(number: int, repeat: int, record_function: Any) -> list[MicroRow]:
    run = training.start("bench", url=closed_url(), uuid="", push_interval=3600.0, timeout=0.2)
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


class _NoopEvent:
    """A CUDA event that is complete at once and took no time: what is left is the library's own cost."""

    def record(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Any) -> float:
        return 0.0


@contextlib.contextmanager
def simulated_cuda(events: bool = True) -> Iterator[Any]:
    """``torch.cuda`` on a simulated async device (gpu_exporter.simulate.torch_cuda) while inside; yields the device.

    A run started inside takes the library's CUDA path (an event at every phase change). ``events=False``
    makes ``torch.cuda.Event`` one that does nothing (:class:`_NoopEvent`), leaving the library's own cost.
    Everything is undone on leaving; start torch's own CUDA-aware calls (``torch.manual_seed``) outside."""
    from gpu_exporter.simulate import torch_cuda
    from gpu_exporter.simulate.device import AsyncDevice

    with tempfile.TemporaryDirectory(prefix="gpu-exporter-bench-cuda-") as tmp:
        device = AsyncDevice("GPU-bench-cuda-path", directory=tmp)
        undo = torch_cuda.install(device)
        if not events:
            _swap_event(_noop_event)  # undo() puts torch's own back
        try:
            yield device
        finally:
            undo()
            device.close()


def _noop_event(**kwargs: Any) -> _NoopEvent:
    return _NoopEvent()


def _swap_event(new: Any) -> Any:
    """Make ``torch.cuda.Event`` ``new``; returns the one it replaces."""
    import torch

    cuda: Any = torch.cuda
    old = cuda.Event
    cuda.Event = new
    return old


CUDA_CANDIDATES = (
    ("CPU path (no CUDA): phase, kept object", "with cpu: pass"),
    ("CUDA path, simulated events: phase, kept object", "with sim: pass"),
    ("CUDA path, simulated events: run.phase(\"compute\")", "with sim_run.phase('compute'): pass"),
    ("CUDA path, events that do nothing: phase, kept object", "with noop: pass"),
    ("a simulated event's record() alone", "event.record()"),
)
"""(name, statement) of :func:`measure_cuda_phase`: ``cpu`` is the CPU path's phase (``gpu_timing=False``, as
without CUDA), ``sim`` the CUDA path's on simulated events, ``noop`` the CUDA path's on events that do nothing."""


def measure_cuda_phase(number: int, repeat: int) -> list[MicroRow]:
    """Nanoseconds per phase enter+exit on the CPU path and on the CUDA path, in one process, the candidates
    interleaved in each of ``repeat`` rounds of ``number`` iterations (a busy machine slows them alike).

    All three runs live under :func:`simulated_cuda`; the CPU path's run has ``gpu_timing=False``, so it records
    no event (the path of a job without CUDA). An enter+exit is two phase changes: two events recorded, and every
    ``FOLD_EVERY``-th change (training/run.py) the training thread folds in the reached ones (``query()``,
    ``elapsed_time()``)."""
    with _quiet_pusher(), simulated_cuda() as device:
        url = closed_url()
        runs = {"cpu": training.start("bench-cpu", url=url, uuid="", push_interval=3600.0, timeout=0.2,
                                      gpu_timing=False),
                "sim": training.start("bench-cuda", url=url, uuid="", push_interval=3600.0, timeout=0.2)}
        simulated_event = _swap_event(_noop_event)  # for the third run only
        try:
            runs["noop"] = training.start("bench-noop", url=url, uuid="", push_interval=3600.0, timeout=0.2)
        finally:
            _swap_event(simulated_event)
        try:
            namespace: dict[str, Any] = {name: run.phase("compute") for name, run in runs.items()}
            namespace.update(sim_run=runs["sim"], event=simulated_event(enable_timing=True))
            for name, run in runs.items():  # a CUDA-path snapshot carries the CPU's clock beside the GPU's
                if ("cpu_phases" in run.snapshot()) != (name != "cpu"):
                    raise RuntimeError(f"bench: the {name} run is not on the path it should measure")
            times: dict[str, list[float]] = {code: [] for _, code in CUDA_CANDIDATES}
            for _ in range(repeat):
                for _, code in CUDA_CANDIDATES:
                    times[code].append(timeit.Timer(code, globals=namespace).timeit(number) / number * 1e9)
            device.synchronize()
        finally:
            for run in runs.values():
                run.close()
    return [MicroRow(name, code, statistics.median(times[code]), min(times[code]), max(times[code]))
            for name, code in CUDA_CANDIDATES]


def measure_training(pairs: int, seconds: float, threads: int = 1, cuda: bool = False) -> TrainingAB:
    """A/B/A/B... repetitions of a small MLP's training loop on the CPU, ``seconds`` each.

    ``cuda``: the run (B) takes the library's CUDA path, an event at every phase change, on the simulated
    torch.cuda (:func:`simulated_cuda`; the model stays on the CPU); A runs under it too."""
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
    with _quiet_pusher(), simulated_cuda() if cuda else contextlib.nullcontext():
        run = training.start("bench-loop", url=closed_url(), uuid="", push_interval=3600.0, timeout=0.2)
        if cuda and "cpu_phases" not in run.snapshot():
            run.close()
            raise RuntimeError("bench: the training loop's run is not on the CUDA path")
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
