"""SM activity on simulated GPUs: kernels that use a share of the GPU, through the real pynvml's GPM.

A device GPU's GPM metrics come from the kernels its job ran (the channel's SM/tensor/DRAM seconds), not from a
factor of its utilization, so a GPU busy with kernels that fill a quarter of its SMs reads busy ~ high and SM
activity ~ a quarter of that. Each test compares what the exporter's collector reports with the device's own truth.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
from gpu_exporter import simulate
from gpu_exporter.collectors.gpm import GpmCollector
from gpu_exporter.exposition import exposition
from gpu_exporter.nvml import Nvml
from gpu_exporter.poller import Poller
from gpu_exporter.simulate.channel import (
    CHANNEL_ENV,
    SETTLE_SECONDS,
    Activity,
    Chunks,
    DeviceTrace,
    Kernel,
    channel_path,
)
from gpu_exporter.simulate.device import COLLECTIVE_KERNEL, KERNEL_ENV, AsyncDevice, OpsDevice, kernel_from_env
from gpu_exporter.simulate.scenario import ScenarioError, load_scenario
from prometheus_client.parser import text_string_to_metric_families

UUID = "GPU-sm-quarter"
NODE = f"""
gpus:
  - {{name: "NVIDIA H100 80GB HBM3", architecture: hopper, memory_gib: 80, uuid: {UUID}, device: true}}
  - {{name: "NVIDIA H100 80GB HBM3", architecture: hopper, memory_gib: 80, uuid: GPU-sm-nogpm, device: true,
     gpm: false}}
  - {{name: "NVIDIA H100 80GB HBM3", architecture: hopper, memory_gib: 80, utilization: 0.8,
     gpm: {{occupancy_factor: 0.5, tensor_factor: 0.25}}}}
"""
RATIO_TOLERANCE = 2e-3
"""The channel writes seconds with 6 decimals (1 us); a window of ~0.5 s over a few hundred lines is exact to well
under 1e-3, and the collector's percent is a float: anything looser would hide a wrong share."""


class Clock:
    """A hand-driven clock on ``time.monotonic``'s scale (the channel's), so each poll's time is exact."""

    def __init__(self) -> None:
        self.t = time.monotonic()

    def __call__(self) -> float:
        return self.t


class GpmNode:
    """The simulated node above with the real pynvml, the project's Nvml wrapper and GpmCollector."""

    def __init__(self, directory: Path) -> None:
        self.clock = Clock()
        scenario = directory / "node.yaml"
        scenario.write_text(NODE)
        self.node = simulate.install(scenario, clock=self.clock)
        self.nvml = Nvml()
        self.gpm = GpmCollector()
        self.poller = Poller(self.nvml, [self.gpm], clock=self.clock)
        self.nvml.init()

    def poll_at(self, t: float) -> None:
        self.clock.t = t
        self.poller.poll_once()

    def values(self, name: str) -> dict[str, float]:
        """``name``'s value per GPU index (whole GPU)."""
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(exposition([self.gpm]).decode()):
            for s in family.samples:
                if s.name == name and s.labels["mig_uuid"] == "":
                    out[s.labels["gpu"]] = s.value
        return out


@pytest.fixture
def gpm_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[GpmNode]:
    monkeypatch.setenv(CHANNEL_ENV, str(tmp_path))
    node = GpmNode(tmp_path)
    yield node
    node.nvml.shutdown()
    simulate.uninstall()


def _quarter_sm_work(device: AsyncDevice) -> None:
    """Busy about two thirds of the time with small-batch fp32 kernels: a quarter of the SMs, no tensor pipe."""
    for _ in range(4):
        for _ in range(5):
            device.launch(0.016)  # the device's kernel: sm=0.25, tensor=0, dram=0.1
        device.synchronize()
        time.sleep(0.04)
    device.launch(0.03, sm=0.5, tensor=0.4)  # one kernel of its own shares
    device.synchronize()


def test_a_kernel_using_a_quarter_of_the_sms_reads_a_quarter_of_busy_through_real_gpm(
        gpm_node: GpmNode, tmp_path: Path) -> None:
    began = gpm_node.clock.t
    gpm_node.poll_at(began)  # the first GPM sample (the collector reports from the second on)
    device = AsyncDevice(UUID, directory=tmp_path, kernel=Kernel(sm=0.25, tensor=0.0, dram=0.1))
    _quarter_sm_work(device)
    ended = time.monotonic()
    device.close()  # writes the last chunks
    truth = device.truth(since=began, until=ended)
    # the device GPU's samples lag SETTLE_SECONDS: polling that much later makes the GPM window [began, ended]
    gpm_node.poll_at(ended + SETTLE_SECONDS)

    wall = ended - began
    busy, sm, tensor, dram = truth["busy"] / wall, truth["sm"] / wall, truth["tensor"] / wall, truth["dram"] / wall
    assert 0.3 < busy < 0.95  # the GPU is busy, its kernels run at a quarter of its SMs
    assert sm == pytest.approx((0.25 * (busy * wall - 0.03) + 0.5 * 0.03) / wall, rel=1e-6)
    reported = {name: gpm_node.values(name)["0"] for name in (
        "gpu_sm_active_ratio", "gpu_tensor_active_ratio", "gpu_dram_bandwidth_utilization_ratio",
        "gpu_sm_occupancy_ratio")}
    assert reported["gpu_sm_active_ratio"] == pytest.approx(sm, abs=RATIO_TOLERANCE)
    assert reported["gpu_tensor_active_ratio"] == pytest.approx(tensor, abs=RATIO_TOLERANCE)
    assert tensor == pytest.approx(0.4 * 0.03 / wall, rel=1e-6)  # only the one kernel used the tensor pipe
    assert reported["gpu_dram_bandwidth_utilization_ratio"] == pytest.approx(dram, abs=RATIO_TOLERANCE)
    assert reported["gpu_sm_occupancy_ratio"] == pytest.approx(0.5 * sm, abs=RATIO_TOLERANCE)  # occupancy_factor


def test_tensor_zero_kernels_give_tensor_zero_and_no_work_gives_zero(gpm_node: GpmNode, tmp_path: Path) -> None:
    began = gpm_node.clock.t
    gpm_node.poll_at(began)
    device = AsyncDevice(UUID, directory=tmp_path, kernel=Kernel(sm=0.8, tensor=0.0, dram=0.5))
    device.launch(0.1)
    device.synchronize()
    ended = time.monotonic()
    device.close()
    gpm_node.poll_at(ended + SETTLE_SECONDS)
    values = gpm_node.values("gpu_tensor_active_ratio")
    assert values["0"] == 0.0
    assert gpm_node.values("gpu_sm_active_ratio")["0"] == pytest.approx(
        device.truth(since=began, until=ended)["sm"] / (ended - began), abs=RATIO_TOLERANCE)
    assert gpm_node.values("gpu_sm_active_ratio")["0"] > 0.05
    # the pattern GPU keeps its factors: SM = utilization, tensor = SM x tensor_factor
    assert gpm_node.values("gpu_sm_active_ratio")["2"] == pytest.approx(0.8)
    assert values["2"] == pytest.approx(0.8 * 0.25)
    gpm_node.poll_at(ended + SETTLE_SECONDS + 1.0)  # a window with no kernels
    assert gpm_node.values("gpu_sm_active_ratio")["0"] == 0.0


def test_gpm_false_is_unsupported_and_the_collector_emits_no_gpm_series(gpm_node: GpmNode) -> None:
    gpm_node.poll_at(gpm_node.clock.t)
    gpm_node.poll_at(gpm_node.clock.t + 1.0)
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmSampleGet(handle, pynvml.nvmlGpmSampleAlloc())
    for name in ("gpu_sm_active_ratio", "gpu_sm_occupancy_ratio", "gpu_tensor_active_ratio",
                 "gpu_dram_bandwidth_utilization_ratio"):
        assert set(gpm_node.values(name)) == {"0", "2"}


@pytest.mark.parametrize(("value", "expected"), [
    ("gpm: maybe", "gpus[0].gpm: must be false, true or a mapping {occupancy_factor, tensor_factor}, got 'maybe'"),
    ("gpm: [1]", "gpus[0].gpm: must be false, true or a mapping"),
    ("gpm: {tensor_factor: 2}", "gpus[0].gpm.tensor_factor: must be between 0 and 1, got 2"),
    ("gpm: {supported: false}", "gpus[0].gpm.supported: unknown key"),
])
def test_bad_gpm_values_are_one_line_errors(tmp_path: Path, value: str, expected: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(f"gpus:\n  - {{name: H100, architecture: hopper, memory_gib: 80, {value}}}\n")
    with pytest.raises(ScenarioError) as raised:
        load_scenario(path)
    assert expected in str(raised.value) and "\n" not in str(raised.value)


def test_gpm_true_needs_hopper_and_defaults_follow_the_architecture(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("gpus:\n  - {name: A100, architecture: ampere, memory_gib: 80}\n"
                    "  - {name: H100, architecture: hopper, memory_gib: 80}\n"
                    "  - {name: H100, architecture: hopper, memory_gib: 80, gpm: false}\n")
    assert [g.gpm for g in load_scenario(path).gpus] == [False, True, False]
    path.write_text("gpus:\n  - {name: A100, architecture: ampere, memory_gib: 80, gpm: true}\n")
    with pytest.raises(ScenarioError, match=r"gpus\[0\]\.gpm: GPM needs hopper or newer, this GPU is ampere"):
        load_scenario(path)


# --- the channel and the kernel -------------------------------------------------------------------


def test_kernel_shares_parse_and_reject_bad_input() -> None:
    assert Kernel.parse("sm=0.25, tensor=0") == Kernel(sm=0.25, tensor=0.0, dram=0.3)
    assert Kernel.parse("") == Kernel()
    for bad, message in (("sm=1.5", "Kernel sm must be a number between 0 and 1, got 1.5"),
                         ("sm=x", "kernel share sm must be a number between 0 and 1, got 'x'"),
                         ("occupancy=0.5", "kernel shares must look like sm=0.25,tensor=0,dram=0.1"),
                         ("0.25", "kernel shares must look like")):
        with pytest.raises(ValueError, match=message):
            Kernel.parse(bad)
    with pytest.raises(ValueError, match="Kernel tensor must be"):
        Kernel(tensor=-0.1)


def test_old_channel_lines_still_parse(tmp_path: Path) -> None:
    path = tmp_path / "GPU-old.busy"
    path.write_text("10.0 10.5\n"             # a 2-field line: busy all through, the default kernel
                    "11.0 11.001 0.0005\n"    # a 3-field line: busy seconds, the default kernel
                    "12.0 13.0 0.5 0.1 0.0 0.25\n"  # a 6-field line: SM/tensor/DRAM seconds as written
                    "not numbers\n"
                    "14.0 14.5")              # a partly written line waits for the next refresh
    trace = DeviceTrace(path, origin=10.0)
    trace.refresh()
    d = Kernel()
    old = trace.activity(0.0, 1.5)
    assert old == pytest.approx(Activity(0.5005, 0.5005 * d.sm, 0.5005 * d.tensor, 0.5005 * d.dram))
    assert trace.activity(2.0, 2.5) == pytest.approx(Activity(0.25, 0.05, 0.0, 0.125))
    assert trace.value(2.5) == pytest.approx(0.5)


def test_chunks_sum_kernels_of_different_shares_within_one_chunk() -> None:
    c = Chunks()
    c.add(0.0, 0.0002, kernel=Kernel(sm=1.0, tensor=1.0, dram=0.0))
    c.add(0.0004, 0.0008, kernel=Kernel(sm=0.25, tensor=0.0, dram=1.0))
    assert len(c.starts) == 1  # one chunk, the shares weighted by each kernel's busy seconds
    assert c.activity(0.0, 1.0) == pytest.approx(Activity(0.0006, 0.0002 + 0.0001, 0.0002, 0.0004))
    line = c.line(0).split()
    assert [float(x) for x in line] == pytest.approx([0.0, 0.0008, 0.0006, 0.0003, 0.0002, 0.0004, 0.0, 0.0, 0.0])


def test_fp_pipe_shares_parse_and_travel_through_the_channel(tmp_path: Path) -> None:
    assert Kernel.parse("tensor=0,fp32=0.4,fp64=0.05") == Kernel(tensor=0.0, fp32=0.4, fp16=0.0, fp64=0.05)
    assert (Kernel().fp32, Kernel().fp16, Kernel().fp64) == (0.0, 0.0, 0.0)  # the default bf16 kernel: none
    with pytest.raises(ValueError, match=r"Kernel fp16 must be a number between 0 and 1, got 2\.0"):
        Kernel.parse("fp16=2")
    c = Chunks()
    c.add(0.0, 0.0004, kernel=Kernel(fp32=0.5, fp16=0.25, fp64=0.1))
    c.add(0.0004, 0.0008, kernel=Kernel(fp32=0.0))
    path = tmp_path / "GPU-fp.busy"
    path.write_text(c.line(0) + "1.0 1.5 0.5 0.1 0.0 0.25\n")  # and an older writer's 6-field line: no fp pipes
    trace = DeviceTrace(path, origin=0.0)
    trace.refresh()
    assert trace.activity(0.0, 0.001)[4:] == pytest.approx((0.0002, 0.0001, 0.00004))
    assert trace.activity(0.9, 2.0) == pytest.approx(Activity(0.5, 0.1, 0.0, 0.25, 0.0, 0.0, 0.0))


def test_a_collective_uses_few_sms(tmp_path: Path) -> None:
    device = AsyncDevice("GPU-coll", directory=tmp_path)
    try:
        began = time.monotonic()
        device.all_reduce(0.02)
        device.copy(0.01)  # holds the stream, not busy, no activity
        device.synchronize()
        act = device.activity(began)
    finally:
        device.close()
    assert act.busy == pytest.approx(0.02, abs=1e-6)
    assert act.sm == pytest.approx(0.02 * COLLECTIVE_KERNEL.sm, abs=1e-6)
    assert act.tensor == 0.0


def test_ops_device_takes_its_kernel_from_gpu_sim_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setenv(KERNEL_ENV, "sm=0.3,tensor=0")
    device = OpsDevice("GPU-ops-env", directory=tmp_path).start()
    try:
        x = torch.randn(256, 256)
        for _ in range(5):
            x = torch.tanh(x @ x) / 16
    finally:
        device.close()
    assert device.kernel == Kernel(sm=0.3, tensor=0.0, dram=0.3)
    truth = device.truth()
    assert truth["busy"] > 0
    assert (truth["sm"], truth["tensor"], truth["dram"]) == pytest.approx((0.3 * truth["busy"], 0.0,
                                                                           0.3 * truth["busy"]))
    # what the channel carries is what the device knows
    trace = DeviceTrace(channel_path("GPU-ops-env", tmp_path), origin=0.0)
    trace.refresh()
    written = trace.activity(0.0, time.monotonic())
    assert written == pytest.approx(Activity(truth["busy"], truth["sm"], truth["tensor"], truth["dram"]), abs=1e-4)
    async_device = AsyncDevice("GPU-async-env", directory=tmp_path)  # an async device reads it too
    async_device.close()
    assert async_device.kernel == Kernel(sm=0.3, tensor=0.0, dram=0.3)
    monkeypatch.setenv(KERNEL_ENV, "sm=2")
    with pytest.raises(ValueError, match=r"^\$GPU_SIM_KERNEL: Kernel sm must be a number between 0 and 1, got 2.0$"):
        kernel_from_env()


@pytest.mark.slow  # a subprocess that imports torch: ~5 s on 2 busy cores
def test_run_script_flags_set_the_kernel(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text("import torch\nx = torch.randn(128, 128)\nfor _ in range(20):\n    x = torch.tanh(x @ x)\n")
    truth_file = tmp_path / "truth.json"
    subprocess.run([sys.executable, "-m", "gpu_exporter.simulate.device", "--uuid", "GPU-script", "--dir",
                    str(tmp_path), "--sm", "0.2", "--dram", "0.05", "--truth", str(truth_file), "--", str(script)],
                   check=True, timeout=120, env={**os.environ, KERNEL_ENV: "tensor=0.1"})
    truth = json.loads(truth_file.read_text())
    assert truth["busy"] > 0
    assert truth["sm"] == pytest.approx(0.2 * truth["busy"])  # the flag
    assert truth["tensor"] == pytest.approx(0.1 * truth["busy"])  # the environment, for what no flag names
    assert truth["dram"] == pytest.approx(0.05 * truth["busy"])
    trace = DeviceTrace(channel_path("GPU-script", tmp_path), origin=0.0)
    trace.refresh()
    assert trace.activity(0.0, time.monotonic()).sm == pytest.approx(truth["sm"], abs=1e-4)
    bad = subprocess.run([sys.executable, "-m", "gpu_exporter.simulate.device", "--uuid", "GPU-script", "--dir",
                          str(tmp_path), "--sm", "1.5", "--", str(script)], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "Kernel sm must be a number between 0 and 1, got 1.5" in bad.stderr


# --- the stand-in dcgm-exporter -------------------------------------------------------------------

DCGM_NODE = f"""
driver_version: "550.90.07"
gpus:
  - {{name: "NVIDIA H100 80GB HBM3", architecture: hopper, memory_gib: 80, uuid: {UUID}, device: true, gpm: false}}
  - {{name: "NVIDIA A100-SXM4-80GB", architecture: ampere, memory_gib: 80, uuid: GPU-sm-a100, utilization: 0.8,
     memory_utilization: 0.3, gpm: {{occupancy_factor: 0.5, tensor_factor: 0.25}}}}
  - name: "NVIDIA H100 80GB HBM3"
    architecture: hopper
    memory_gib: 80
    uuid: GPU-sm-mig
    mig: {{instances: [{{profile: "3g.40gb", memory_gib: 40, gpu_instance_id: 2, utilization: 0.6}}]}}
  - {{name: "Tesla P100-PCIE-16GB", architecture: pascal, memory_gib: 16, uuid: GPU-sm-p100, utilization: 0.5}}
"""
PROFILING = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY",
             "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE")


def _scrape(url: str) -> dict[str, dict[str, tuple[dict[str, str], float]]]:
    """name -> UUID (+ "/GPU_I_ID" for a MIG instance) -> (labels, value), parsed by prometheus_client."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    out: dict[str, dict[str, tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge"
        for s in family.samples:
            key = s.labels["UUID"] + (f"/{s.labels['GPU_I_ID']}" if "GPU_I_ID" in s.labels else "")
            assert key not in out.setdefault(s.name, {})
            out[s.name][key] = (s.labels, s.value)
    return out


def test_the_stand_in_serves_a_device_gpus_own_truth_without_gpm(tmp_path: Path) -> None:
    from gpu_exporter.simulate.dcgm_exporter import serve

    scenario = tmp_path / "node.yaml"
    scenario.write_text(DCGM_NODE)
    clock = Clock()
    began = clock.t
    device = AsyncDevice(UUID, directory=tmp_path, kernel=Kernel(sm=0.25, tensor=0.0, dram=0.1))
    _quarter_sm_work(device)
    ended = time.monotonic()
    device.close()
    truth = device.truth(since=began, until=ended)
    wall = ended - began
    # the window of the scrape at ended + SETTLE_SECONDS, `interval` long and lagged like NVML's: [began, ended]
    with serve(scenario, hostname="node-7", interval=wall, directory=tmp_path, clock=clock) as dcgm:
        clock.t = ended + SETTLE_SECONDS
        metrics = _scrape(dcgm.url)
        import urllib.error
        import urllib.request

        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(dcgm.url.replace("/metrics", "/other"), timeout=10)

    labels, sm = metrics["DCGM_FI_PROF_SM_ACTIVE"][UUID]
    assert labels == {"gpu": "0", "UUID": UUID, "pci_bus_id": "00000000:18:00.0", "device": "nvidia0",
                      "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "node-7", "DCGM_FI_DRIVER_VERSION": "550.90.07"}
    busy = truth["busy"] / wall
    assert 0.3 < busy < 0.95 and sm < 0.5 * busy  # busy, but not effective
    assert sm == pytest.approx(truth["sm"] / wall, abs=RATIO_TOLERANCE)
    assert metrics["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"][UUID][1] == pytest.approx(truth["tensor"] / wall,
                                                                                abs=RATIO_TOLERANCE)
    assert metrics["DCGM_FI_PROF_DRAM_ACTIVE"][UUID][1] == pytest.approx(truth["dram"] / wall, abs=RATIO_TOLERANCE)
    assert metrics["DCGM_FI_PROF_GR_ENGINE_ACTIVE"][UUID][1] == pytest.approx(busy, abs=RATIO_TOLERANCE)
    assert metrics["DCGM_FI_PROF_SM_OCCUPANCY"][UUID][1] == pytest.approx(0.5 * sm, abs=RATIO_TOLERANCE)
    util = metrics["DCGM_FI_DEV_GPU_UTIL"][UUID][1]
    assert util == int(util) and util == pytest.approx(100 * busy, abs=1)  # whole percents, like dcgm-exporter

    # a pattern GPU (an A100: DCGM profiling, no GPM): SM = utilization, its factors
    assert [metrics[name]["GPU-sm-a100"][1] for name in PROFILING] == pytest.approx([0.8, 0.8, 0.4, 0.2, 0.3])
    assert not any(name.startswith("DCGM_FI_PROF_PIPE_FP") for name in metrics)  # not in the default counters
    assert metrics["DCGM_FI_DEV_GPU_UTIL"]["GPU-sm-a100"][1] == 80
    # a MIG-mode GPU: per GPU instance, no utilization; a Pascal GPU: utilization only
    mig_labels, mig_sm = metrics["DCGM_FI_PROF_SM_ACTIVE"]["GPU-sm-mig/2"]
    assert mig_sm == pytest.approx(0.6) and mig_labels["GPU_I_PROFILE"] == "3g.40gb"
    assert "GPU-sm-mig" not in metrics["DCGM_FI_PROF_SM_ACTIVE"]
    assert not any(key.startswith("GPU-sm-mig") for key in metrics["DCGM_FI_DEV_GPU_UTIL"])
    assert metrics["DCGM_FI_DEV_GPU_UTIL"]["GPU-sm-p100"][1] == 50
    assert not any("GPU-sm-p100" in metrics[name] for name in PROFILING)


def test_the_stand_in_serves_the_fp_pipes_of_the_kernels_when_the_scenario_enables_them(tmp_path: Path) -> None:
    from gpu_exporter.simulate.dcgm_exporter import serve

    scenario = tmp_path / "node.yaml"
    scenario.write_text("dcgm_pipe_fields: true\n" + DCGM_NODE)
    clock = Clock()
    began = clock.t
    device = AsyncDevice(UUID, directory=tmp_path, kernel=Kernel(sm=0.25, tensor=0.0, dram=0.1, fp32=0.4, fp64=0.05))
    _quarter_sm_work(device)
    ended = time.monotonic()
    device.close()
    truth = device.truth(since=began, until=ended)
    wall = ended - began
    with serve(scenario, hostname="node-7", interval=wall, directory=tmp_path, clock=clock) as dcgm:
        clock.t = ended + SETTLE_SECONDS
        metrics = _scrape(dcgm.url)
    fp32, fp16, fp64 = (metrics[f"DCGM_FI_PROF_PIPE_{p}_ACTIVE"][UUID][1] for p in ("FP32", "FP16", "FP64"))
    assert 0.3 * 0.4 < truth["fp32"] / wall < 0.95 * 0.4  # busy about two thirds of the time at fp32=0.4
    assert fp32 == pytest.approx(truth["fp32"] / wall, abs=RATIO_TOLERANCE)
    assert fp64 == pytest.approx(truth["fp64"] / wall, abs=RATIO_TOLERANCE) and fp64 > 0
    assert fp16 == 0.0 and truth["fp16"] == 0.0
    assert metrics["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"][UUID][1] == pytest.approx(truth["tensor"] / wall,
                                                                                abs=RATIO_TOLERANCE)
    # a pattern GPU has no per-precision shares: 0; a Pascal GPU no profiling fields at all
    assert [metrics[f"DCGM_FI_PROF_PIPE_{p}_ACTIVE"]["GPU-sm-a100"][1] for p in ("FP32", "FP16", "FP64")] == [0.0] * 3
    assert not any("GPU-sm-p100" in metrics[f"DCGM_FI_PROF_PIPE_{p}_ACTIVE"] for p in ("FP32", "FP16", "FP64"))


def test_the_stand_in_as_a_subprocess_with_pods(tmp_path: Path) -> None:
    from gpu_exporter.simulate.dcgm_exporter import spawn

    scenario = tmp_path / "node.yaml"
    scenario.write_text(DCGM_NODE)
    with spawn(scenario, hostname="node-8", interval=1.0, directory=tmp_path,
               pods={"GPU-sm-a100": ("team-a", "trainer-0", "pytorch")}) as dcgm:
        metrics = _scrape(dcgm.url)
    labels, sm = metrics["DCGM_FI_PROF_SM_ACTIVE"]["GPU-sm-a100"]
    assert sm == pytest.approx(0.8)
    assert (labels["pod"], labels["namespace"], labels["container"], labels["Hostname"]) == (
        "trainer-0", "team-a", "pytorch", "node-8")
    assert metrics["DCGM_FI_PROF_SM_ACTIVE"][UUID][0]["pod"] == ""  # no pod holds it
    assert metrics["DCGM_FI_PROF_SM_ACTIVE"][UUID][1] == 0.0  # no job ran on it
    assert dcgm.process.poll() is not None  # stopped

    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus:\n  - {name: H100, architecture: hopper, memory_gib: 80, gpm: maybe}\n")
    with pytest.raises(RuntimeError, match=r"did not start: error: .*bad\.yaml: gpus\[0\]\.gpm: must be false"):
        spawn(bad)
