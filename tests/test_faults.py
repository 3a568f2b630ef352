"""Fault injection: a GPU lost mid-run, NOT_SUPPORTED calls, a missing driver, NVML recovering."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_exporter import simulate
from gpu_exporter.nvml import DriverNotFound, Nvml
from harness import Harness


def test_gpu_lost_mid_run_keeps_other_gpus() -> None:
    with Harness("faults.yaml") as h:
        h.advance(3.0)
        assert {s.labels["gpu"] for s in h.samples("gpu_info")} == {"0", "1"}
        h.advance(4.0)  # GPU 1 is lost at t=5
        scrape = h.scrape()
        assert {s.labels["gpu"] for s in h.samples("gpu_info")} == {"0"}
        assert h.value("gpu_exporter_gpus") == 1
        assert h.value("gpu_utilization_ratio", gpu="0") == pytest.approx(0.7, abs=0.01)
        lost_errors = h.samples("gpu_exporter_nvml_errors_total", error="gpu_is_lost")
        assert sum(s.value for s in lost_errors) >= 1
        assert "gpu_busy_seconds_total" in scrape


def test_not_supported_is_remembered_per_gpu_and_not_retried() -> None:
    with Harness("faults.yaml") as h:
        h.advance(1.0)
        calls = h.node.call_counts.get("nvmlDeviceGetPowerUsage", 0)
        h.advance(3.0)  # three polls; GPU 0 power is NOT_SUPPORTED, GPU 1 answers
        assert h.node.call_counts["nvmlDeviceGetPowerUsage"] - calls == 3
        assert h.samples("gpu_power_watts", gpu="0") == []
        assert len(h.samples("gpu_power_watts", gpu="1")) == 1
        not_supported = h.samples("gpu_exporter_nvml_errors_total", function="nvmlDeviceGetPowerUsage",
                                  error="not_supported")
        assert [s.value for s in not_supported] == [1.0]  # counted once, when first seen
        success = {s.labels["collector"]: s.value for s in h.samples("gpu_exporter_collector_success")}
        assert success["device"] == 1  # NOT_SUPPORTED is not a failure


def test_driver_unload_and_reload_recovers_without_restart() -> None:
    with Harness("default.yaml") as h:
        h.advance(2.0)
        assert h.value("gpu_exporter_gpus") == 4
        h.node.unload_driver()
        h.advance(3.0)
        assert h.samples("gpu_info") == []
        assert h.value("gpu_exporter_gpus") == 0
        assert h.value("gpu_exporter_last_sample_age_seconds") >= 2.0  # stale: /readyz fails
        h.node.reload_driver()
        h.advance(2.0)
        assert h.value("gpu_exporter_gpus") == 4
        assert len(h.samples("gpu_utilization_ratio")) == 3
        assert h.value("gpu_exporter_last_sample_age_seconds") == 0


def test_driver_missing_at_start(tmp_path: Path) -> None:
    scenario = tmp_path / "nodriver.yaml"
    scenario.write_text("driver_missing: true\ngpus: []\n")
    simulate.install(scenario)
    try:
        with pytest.raises(DriverNotFound, match=r"NVIDIA driver was not found.*--simulate"):
            Nvml().init()
    finally:
        simulate.uninstall()
