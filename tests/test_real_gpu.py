"""Checks on a real NVIDIA GPU and driver: the NVML paths the simulator stands in for.

Marked ``gpu``; they skip cleanly where no driver is present (CI). Run them on a GPU machine
with ``pytest -m gpu tests/test_real_gpu.py``.
"""

from __future__ import annotations

import ctypes.util
import time

import pytest
from gpu_exporter.app import POLLING_COLLECTORS
from gpu_exporter.collectors.base import PollContext
from gpu_exporter.nvml import Nvml
from prometheus_client.parser import text_string_to_metric_families

from testbed import http_get, run_exporter

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is None, reason="no NVIDIA driver (libnvidia-ml)"),
]


def test_nvml_paths_on_real_hardware() -> None:
    nvml = Nvml()
    nvml.init()
    try:
        gpus = nvml.discover()
        assert gpus, "driver present but no GPU found"
        collectors = [cls() for cls in POLLING_COLLECTORS]
        for _ in range(3):
            ctx = PollContext(nvml=nvml, gpus=gpus, now=time.monotonic())
            assert all(c.poll(ctx) for c in collectors)
            time.sleep(0.5)
        names = {f.name for c in collectors for f in c.collect()}
        assert {"gpu_info", "gpu_memory_used_bytes", "gpu_power_watts"} <= names
        if not any(g.mig_enabled for g in gpus):
            assert "gpu_busy_seconds" in names
    finally:
        nvml.shutdown()


def test_exporter_process_on_real_gpu() -> None:
    with run_exporter(["--poll-interval", "0.5"]) as url:
        time.sleep(2)
        families = {f.name for f in text_string_to_metric_families(http_get(url + "/metrics"))}
        assert "gpu_info" in families and "gpu_exporter_gpus" in families


def test_gpu_truthful_phases_on_a_real_cuda_device() -> None:
    """The README's loop on CUDA: CPU decoding in data, kernels queued in compute, loss.item() in metrics.

    The library's default phases (an event at every phase change) give the GPU's idle time while the CPU
    decodes to ``data`` and the wait in ``.item()`` to ``compute``, without one ``torch.cuda.synchronize``;
    the CPU's clock calls that wait ``metrics``. (bench/real_gpu.py runs the longer check with the exporter.)
    """
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    from gpu_exporter.training.run import Run

    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    matmuls = max(1, round(0.05 / ((time.perf_counter() - t0) / 10)))  # about 50 ms of kernels per step

    calls = [0]
    original = torch.cuda.synchronize

    def counted(*args: object, **kwargs: object) -> None:
        calls[0] += 1
        original(*args, **kwargs)

    torch.cuda.synchronize = counted
    try:
        run = Run("real-readme", uuid="GPU-real-test")
        assert run._gpu is not None, "no GPU-truthful clock on CUDA"
        data, compute, metrics = run.phase("data"), run.phase("compute"), run.phase("metrics")
        for _ in range(12):
            with data:
                deadline = time.perf_counter() + 0.03  # decoding on the CPU
                while time.perf_counter() < deadline:
                    pass
            with compute:
                x = a
                for _ in range(matmuls):
                    x = torch.tanh(x @ a) / 64
            with metrics:
                x.sum().item()
            run.step(samples=1)
        time.sleep(0.2)  # the last events complete
        gpu = run.phase_seconds()
        cpu = run.cpu_phase_seconds()
        run.close()
    finally:
        torch.cuda.synchronize = original
    assert calls[0] == 0
    total_gpu, total_cpu = sum(gpu.values()), sum(cpu.values())
    assert gpu["data"] / total_gpu == pytest.approx(0.03 / 0.08, abs=0.12), gpu
    assert gpu["metrics"] / total_gpu < 0.1, gpu
    assert cpu["metrics"] / total_cpu > 0.3, cpu
