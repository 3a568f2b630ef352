"""GPU-truthful phases against an asynchronous simulated GPU, in one process (no exporter).

The loop of the issue that found the gap: 30 ms of CPU decoding in ``data``, 50 ms of kernels queued in
``compute``, then ``loss.item()`` in ``metrics``. The GPU idles only while the CPU decodes; by the CPU's clock
the step is mostly ``metrics`` (the wait in ``.item()``), which named M2 first. The library's default phases
on CUDA (events at phase changes) must say what the device knows.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from gpu_exporter.simulate import torch_cuda
from gpu_exporter.simulate.device import AsyncDevice, OpsDevice
from gpu_exporter.thresholds import load_thresholds
from gpu_exporter.training.run import Run
from gpu_exporter.verdict.causes import find_causes
from gpu_exporter.verdict.signals import RunSignals


@pytest.fixture
def gpu(tmp_path: Path) -> Iterator[AsyncDevice]:
    device = AsyncDevice("GPU-truth", directory=tmp_path)
    undo = torch_cuda.install(device)
    try:
        yield device
    finally:
        undo()
        device.close()


def _readme_loop(run: Run, gpu: AsyncDevice, steps: int) -> None:
    data, compute, metrics = run.phase("data"), run.phase("compute"), run.phase("metrics")
    for _ in range(steps):
        with data:
            gpu.doing("data")
            time.sleep(0.03)  # decoding on the CPU
        with compute:
            gpu.doing("compute")
            gpu.launch(0.05)  # the forward and backward kernels, queued
        with metrics:
            gpu.doing("metrics")
            gpu.item(cpu_seconds=0.002)  # loss.item(), then a little Python
        gpu.doing("other")
        run.step(samples=32)


def _shares(seconds: dict[str, float]) -> dict[str, float]:
    total = sum(seconds.values())
    return {k: v / total for k, v in seconds.items()}


def test_default_phases_on_cuda_say_what_starved_the_gpu(gpu: AsyncDevice) -> None:
    began = time.monotonic()
    run = Run("readme", uuid="GPU-truth")
    _readme_loop(run, gpu, 15)
    time.sleep(0.06)  # the last events complete
    truth = gpu.truth(since=began)
    wall, idle = truth["wall"], truth["idle"]
    library = _shares(run.phase_seconds())
    cpu = _shares(run.cpu_phase_seconds())
    run.close()

    assert library["data"] == pytest.approx(idle["data"] / wall, abs=0.05)
    assert library["metrics"] == pytest.approx(idle["metrics"] / wall, abs=0.05)
    assert library["compute"] == pytest.approx(1 - (idle["data"] + idle["metrics"]) / wall, abs=0.05)
    assert cpu["metrics"] > 0.5  # the CPU's clock: the wait in .item() reads as metrics
    assert gpu.torch_synchronize_calls == 0  # the default path never synchronizes

    # The cause table on each, at the true utilization: the library's phases name M1 only.
    u = truth["busy"] / wall
    t = load_thresholds()
    assert [f.cause.code for f in find_causes(u, 0.3, RunSignals(library), t)] == ["M1"]
    assert next(f.cause.code for f in find_causes(u, 0.3, RunSignals(cpu), t)) == "M2"


def test_a_snapshot_carries_both_clocks_and_the_final_one_adds_up_to_wall_time(gpu: AsyncDevice) -> None:
    run = Run("both", uuid="GPU-truth")
    _readme_loop(run, gpu, 3)
    gpu.launch(0.2)  # still running when the run closes
    body: dict[str, Any] = run.snapshot(finished=True)
    run.close()
    assert set(body["cpu_phases"]) == set(body["phases"])
    assert sum(body["phases"].values()) == pytest.approx(sum(body["cpu_phases"].values()), abs=0.01)


def test_sync_every_is_the_diagnostic_path_and_synchronizes(gpu: AsyncDevice) -> None:
    run = Run("synced", uuid="GPU-truth", sync_every=1)
    _readme_loop(run, gpu, 4)
    run.close()
    assert run._gpu is None
    assert gpu.torch_synchronize_calls > 0


def test_without_cuda_the_phases_are_the_cpus_clock() -> None:
    run = Run("cpu", uuid="")
    with run.phase("data"):
        time.sleep(0.01)
    assert run._gpu is None and "cpu_phases" not in run.snapshot()
    assert run.phase_seconds()["data"] >= 0.01
    run.close()


@pytest.mark.parametrize("wait_busy", [True, False])
def test_an_emulated_nccl_all_reduce_waits_for_the_slowest_rank(tmp_path: Path, wait_busy: bool) -> None:
    fast = AsyncDevice("GPU-r0", directory=tmp_path, group="g", rank=0, world=2, wait_busy=wait_busy)
    slow = AsyncDevice("GPU-r1", directory=tmp_path, group="g", rank=1, world=2, wait_busy=wait_busy)
    try:
        began = time.monotonic()
        fast.launch(0.01)
        fast.all_reduce(0.005)
        launched = time.monotonic()
        time.sleep(0.1)  # rank 1 arrives about 0.1 s later
        arriving = time.monotonic()
        slow.all_reduce(0.005)
        arrived = time.monotonic()
        fast.synchronize()
        assert time.monotonic() - began >= 0.1
        # Rank 0's collective starts when its 0.01 s kernel ends (launched between `began` and `launched`) and
        # ends 0.005 s after rank 1 arrives (between `arriving` and `arrived`): bounds from the clock readings
        # the test took, not from the sleep, so a loaded machine that stretches the sleep cannot fail it.
        shortest = arriving - (launched + 0.01) + 0.005
        longest = arrived - (began + 0.01) + 0.005
        collective = fast.truth(since=began)["collective"]
        assert shortest - 0.002 <= collective <= longest + 0.002
        # NCCL's kernel spins while it waits (busy), unless the wait is a CPU-side one
        busy = fast.busy_seconds(began)
        if wait_busy:
            assert 0.01 + shortest - 0.002 <= busy <= 0.01 + longest + 0.002
        else:
            assert busy == pytest.approx(0.015, abs=0.002)
    finally:
        fast.close()
        slow.close()


def test_ops_mode_is_busy_inside_torch_operators_only(tmp_path: Path) -> None:
    import torch

    device = OpsDevice("GPU-ops", directory=tmp_path).start()
    try:
        began = time.monotonic()
        # operators long enough (a 512x512 matmul is milliseconds) that the Python between them is small
        x = torch.randn(512, 512)
        device.doing("ops")
        for _ in range(10):
            x = torch.tanh(x @ x) / 32
        device.doing("python")
        deadline = time.perf_counter() + 0.05
        while time.perf_counter() < deadline:
            sum(range(100))
        device.doing("other")
        truth = device.truth(since=began)
    finally:
        device.close()
    assert truth["idle"]["python"] == pytest.approx(truth["cpu"]["python"], rel=0.05)
    assert truth["idle"]["ops"] < 0.3 * truth["cpu"]["ops"]
    assert (tmp_path / "GPU-ops.busy").read_text().count("\n") > 0
