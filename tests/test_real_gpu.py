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
from servers import http_get, run_exporter

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
