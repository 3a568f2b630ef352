"""Cost of the library's stack sampler (gpu_exporter.training.sampler) in a real CPU PyTorch loop.

The loop: a 3-layer MLP's forward, backward and SGD step (torch on one thread) plus a small numpy augmentation,
all inside ``compute``, so the sampler reads a stack at every wake-up. Blocks of ``--seconds`` without the sampler
and with it at each ``--rates`` alternate ``--repeats`` times. Reported per rate: the median of (the loop's steps per
CPU second of its thread with the sampler / the same of the unsampled blocks beside it), the stacks read per second,
and the sampler thread's own CPU time per second of loop (``time.thread_time`` at its end). Both are CPU time, not
wall time: on a loaded machine other processes take wall time from the blocks unevenly. Example::

    PYTHONPATH=exporter python -m bench.stack_sampler --seconds 3 --rates 50,100 --repeats 5

``--accuracy`` measures what the sampler reads instead: a loop whose ``compute`` is a pure-Python augmentation
(~4 ms, timed with ``perf_counter``: the truth) and a small MLP step, with plain torch and under the simulated
GPU's dispatch mode (gpu_exporter.simulate.device.OpsDevice, where every operator runs Python), at Python's default
switch interval and at the sampler's (:data:`gpu_exporter.training.sampler.SWITCH_INTERVAL`). Reported: the host
share of compute, true and read, per case (median of ``--repeats`` blocks)::

    PYTHONPATH=exporter python -m bench.stack_sampler --accuracy --seconds 3 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

from gpu_exporter.training import sampler
from gpu_exporter.training.run import Run


class _Timed(sampler.StackSampler):
    """The sampler, keeping its thread's CPU seconds when it stops."""

    cpu = 0.0

    def _loop(self) -> None:
        try:
            super()._loop()
        finally:
            self.cpu = time.thread_time()


@dataclass(frozen=True)
class Row:
    rate: float
    throughput: float
    """Median over the repeats of steps per CPU second with the sampler over the unsampled blocks' beside it."""
    spread: tuple[float, float]
    samples_per_second: float
    cpu_share: float
    """The sampler thread's CPU seconds per second of loop (1.0 = one whole core)."""


def _block(seconds: float, rate: float, step: Any) -> tuple[float, int, float]:
    """(steps per CPU second of the training thread, samples, sampler CPU seconds) of one block at ``rate`` (0: no
    sampler). Per CPU second, not per wall second: on a loaded machine the other processes take wall time from both
    blocks unevenly; what the sampler costs the loop is CPU time (and the GIL hand-offs it causes)."""
    run = Run("bench", uuid="", gpu_timing=False)
    compute = run.phase("compute")
    s = _Timed(threading.get_ident(), lambda: run.current_phase.name, rate) if rate else None
    if s is not None:
        s.start()
    steps, deadline, cpu0 = 0, time.perf_counter() + seconds, time.thread_time()
    while time.perf_counter() < deadline:
        with compute:
            step()
        steps += 1
    rate_cpu = steps / (time.thread_time() - cpu0)
    if s is None:
        return rate_cpu, 0, 0.0
    s.stop()
    return rate_cpu, s.samples, s.cpu


def measure(seconds: float, rates: list[float], repeats: int) -> list[Row]:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 512)

    def step() -> None:
        batch = torch.from_numpy(np.ascontiguousarray(x.numpy()[:, ::-1]))
        loss = model(batch).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    _block(1.0, 0, step)  # warm-up
    ratios: dict[float, list[float]] = {r: [] for r in rates}
    samples: dict[float, list[float]] = {r: [] for r in rates}
    cpu: dict[float, list[float]] = {r: [] for r in rates}
    for _ in range(repeats):
        before = _block(seconds, 0, step)[0]
        for rate in rates:
            steps, n, used = _block(seconds, rate, step)
            after = _block(seconds, 0, step)[0]
            ratios[rate].append(steps / ((before + after) / 2))
            samples[rate].append(n / seconds)
            cpu[rate].append(used / seconds)
            before = after
    return [Row(r, statistics.median(ratios[r]), (min(ratios[r]), max(ratios[r])), statistics.median(samples[r]),
                statistics.median(cpu[r])) for r in rates]


def augment(a: Any) -> float:
    """The job's own host work in the accuracy loop: three Python passes over a 256x64 array's values."""
    total = 0.0
    for _ in range(3):
        for row in a:
            for value in row:
                total += float(value) * 1e-9
    return total


def accuracy(seconds: float, repeats: int) -> list[tuple[str, float, float, float]]:
    """(case, switch interval, true host share of compute, sampled host share), medians over ``repeats`` blocks."""
    import sys
    import tempfile

    import numpy as np
    import torch
    from gpu_exporter.simulate.device import OpsDevice

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = np.random.default_rng(0).normal(size=(256, 64))
    rows = []
    for case in ("plain torch", "simulated GPU (dispatch mode)"):
        with tempfile.TemporaryDirectory() as channel:
            device = OpsDevice("GPU-bench-sampler", channel).start() if case != "plain torch" else None
            try:
                for switch in (sampler.PYTHON_SWITCH_INTERVAL, sampler.SWITCH_INTERVAL):
                    truth, read = [], []
                    for _ in range(repeats):
                        s = sampler.StackSampler(threading.get_ident(), lambda: "compute")
                        s.start()
                        sys.setswitchinterval(switch)  # the case's interval, whatever start() chose
                        host = torch_s = 0.0
                        deadline = time.perf_counter() + seconds
                        while time.perf_counter() < deadline:
                            t0 = time.perf_counter()
                            x = torch.from_numpy(data).float() * (1.0 + augment(data))
                            t1 = time.perf_counter()
                            opt.zero_grad()
                            model(x).square().mean().backward()
                            opt.step()
                            host, torch_s = host + t1 - t0, torch_s + time.perf_counter() - t1
                        s.stop()
                        snap = s.snapshot()
                        truth.append(host / (host + torch_s))
                        read.append(snap["host"] / max(snap["host"] + snap["torch"], 1e-9))
                    rows.append((case, switch, statistics.median(truth), statistics.median(read)))
            finally:
                if device is not None:
                    device.close()
    sys.setswitchinterval(sampler.PYTHON_SWITCH_INTERVAL)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rates", default="50,100")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--accuracy", action="store_true", help="measure what it reads, not what it costs")
    args = parser.parse_args()
    if args.accuracy:
        load = os.getloadavg()[0]
        found = accuracy(args.seconds, args.repeats)
        print(f"load average {load:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print("| loop | switch interval | host share of compute, true | read by the sampler |")
        print("|---|---|---|---|")
        for case, switch, truth, read in found:
            print(f"| {case} | {switch * 1000:g} ms | {truth * 100:.0f}% | {read * 100:.0f}% |")
        return
    rates = [float(r) for r in args.rates.split(",")]
    load = os.getloadavg()[0]
    rows = measure(args.seconds, rates, args.repeats)
    print(f"load average {load:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("| rate (samples/s) | stacks read/s | sampler thread CPU | loop steps per CPU second vs unsampled (median; "
          "min-max) |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row.rate:g} | {row.samples_per_second:.1f} | {row.cpu_share * 100:.2f}% of one core | "
              f"{row.throughput * 100:.1f}% ({row.spread[0] * 100:.1f}-{row.spread[1] * 100:.1f}%) |")


if __name__ == "__main__":
    main()
