"""The simulated GPUs, exercised through the real pynvml wrappers (no GPU needed)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
from gpu_exporter.simulate import ScenarioError, SimulatedNode, install, installed, load_scenario, uninstall
from gpu_exporter.simulate.patterns import Bursts, Constant, Noisy, Steps, Timeline, integral

SCENARIOS = Path(__file__).resolve().parents[1] / "exporter" / "gpu_exporter" / "simulate" / "scenarios"
GIB = 1 << 30


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sim(clock: FakeClock, request: pytest.FixtureRequest) -> Iterator[SimulatedNode]:
    """Install a scenario (default, or the file passed by ``scenario(...)``) and nvmlInit."""
    name = getattr(request, "param", None)
    node = install(SCENARIOS / name if name else None, clock=clock)
    pynvml.nvmlInit()
    yield node
    uninstall()


def scenario(name: str) -> pytest.MarkDecorator:
    """Run the test on the packaged scenario file ``name`` instead of the default."""
    return pytest.mark.parametrize("sim", [name], indirect=True)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


# --- devices, memory, processes -------------------------------------------------------------


def test_default_scenario_devices(sim: SimulatedNode) -> None:
    assert pynvml.nvmlDeviceGetCount() == 4
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12040
    uuids = set()
    for i in range(4):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        uuids.add(pynvml.nvmlDeviceGetUUID(h))
        assert pynvml.nvmlDeviceGetIndex(h) == i
        assert pynvml.nvmlDeviceGetPciInfo(h).busId.startswith("00000000:")
    assert len(uuids) == 4 and all(u.startswith("GPU-") for u in uuids)
    h0 = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetName(h0) == "NVIDIA H100 80GB HBM3"
    assert pynvml.nvmlDeviceGetArchitecture(h0) == pynvml.NVML_DEVICE_ARCH_HOPPER
    assert pynvml.nvmlDeviceGetMigMode(h0) == [0, 0]
    by_uuid = pynvml.nvmlDeviceGetHandleByUUID(pynvml.nvmlDeviceGetUUID(h0))
    assert pynvml.nvmlDeviceGetIndex(by_uuid) == 0


def test_memory_info_v1_and_v2(sim: SimulatedNode) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert v2.total == 80 * GIB and v2.used == int(71.5 * GIB) and v2.reserved == GIB // 2
    assert v2.used + v2.free + v2.reserved == v2.total
    assert v1.used == v2.used + v2.reserved and v1.free == v2.free


def test_memory_info_v2_rejects_wrong_struct_version(sim: SimulatedNode) -> None:
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0), version=0x01000028)


def test_processes_and_names(sim: SimulatedNode) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(41102, 30 * GIB)]
    assert pynvml.nvmlSystemGetProcessName(41102) == "jupyter-kernel"
    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(h) == []
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlSystemGetProcessName(1)


@scenario("eight_gpus.yaml")
def test_many_processes_two_call_protocol(sim: SimulatedNode) -> None:
    pids = [p.pid for i in range(8)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))]
    assert len(pids) == 64 == len(set(pids))
    # first call with a NULL buffer reports the count
    assert sim.call_counts["nvmlDeviceGetComputeRunningProcesses_v3"] == 16


def test_power_energy_clocks_and_thermals(sim: SimulatedNode, clock: FakeClock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(1)  # 18 s idle, then 2 s at 95%, every 20 s
    assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 0  # the idle GPU is idle at start
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 72000
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == pynvml.nvmlClocksEventReasonGpuIdle
    clock.advance(19.0)
    busy_power = pynvml.nvmlDeviceGetPowerUsage(h)
    assert busy_power == pytest.approx(1000 * (72 + (640 - 72) * 0.95), abs=1)
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == 0
    clock.advance(9.0)
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 72000
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 345
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == pynvml.nvmlClocksEventReasonGpuIdle
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == 700_000
    # energy is the exact integral of power: 28 s idle floor plus (busy - idle) x 1.9 busy seconds
    expected_mj = 1000 * (72 * 28 + (640 - 72) * 2 * 0.95)
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == pytest.approx(expected_mj, abs=1)
    assert 20 < pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) < 90
    assert pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES) == 5 * 1024
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetFanSpeed(h)


# --- utilization samples ----------------------------------------------------------------------


@scenario("bursty.yaml")
def test_samples_cursor_and_not_found(sim: SimulatedNode, clock: FakeClock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotFound):  # no complete 1/6 s sample yet
        pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    clock.advance(1.0)
    value_type, samples = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert [s.sampleValue.uiVal for s in samples] == [95] * 6
    stamps = [s.timeStamp for s in samples]
    assert stamps == sorted(set(stamps))
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing newer than the cursor
        pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, stamps[-1])
    clock.advance(0.5)
    _, newer = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, stamps[-1])
    assert len(newer) == 3 and newer[0].timeStamp > stamps[-1]
    _, memory = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_MEMORY_UTILIZATION_SAMPLES, 0)
    assert {s.sampleValue.uiVal for s in memory} == {50}


@scenario("bursty.yaml")
def test_sample_mean_matches_true_busy_seconds(sim: SimulatedNode, clock: FakeClock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    cursor, busy = 0, 0.0
    for _ in range(12):  # 60 s, read every 5 s as a poller would
        clock.advance(5.0)
        _, samples = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, cursor)
        busy += sum(s.sampleValue.uiVal for s in samples) / 100 / 6
        cursor = samples[-1].timeStamp
    assert sim.true_busy_seconds(0, 0.0, 60.0) == pytest.approx(0.285 * 60)
    assert busy == pytest.approx(sim.true_busy_seconds(0, 0.0, 60.0), abs=0.01)


def test_noisy_samples_mean_matches_ground_truth(sim: SimulatedNode, clock: FakeClock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(2)  # 25% with noise 0.08
    clock.advance(20.0)
    _, samples = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert len(samples) == 120 and len({s.sampleValue.uiVal for s in samples}) > 5
    measured = sum(s.sampleValue.uiVal for s in samples) / 100 / 6
    assert measured == pytest.approx(sim.true_busy_seconds(2, 0.0, 20.0), abs=0.05)


def test_ring_buffer_keeps_twenty_seconds(sim: SimulatedNode, clock: FakeClock) -> None:
    clock.advance(300.0)
    _, samples = pynvml.nvmlDeviceGetSamples(pynvml.nvmlDeviceGetHandleByIndex(0),
                                            pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert len(samples) == 120


def test_utilization_rates_and_process_utilization(sim: SimulatedNode, clock: FakeClock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError) as no_samples:
        pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    assert no_samples.value.value == pynvml.NVML_ERROR_NOT_FOUND
    clock.advance(3.0)
    rates = pynvml.nvmlDeviceGetUtilizationRates(h)
    assert 75 <= rates.gpu <= 95 and 35 <= rates.memory <= 55
    (sample,) = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    assert sample.pid == 41001 and sample.smUtil == rates.gpu
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(h, sample.timeStamp)


def test_process_utilization_without_processes_is_pynvml_value_zero_quirk(tmp_path: Path) -> None:
    path = write(tmp_path, "gpus: [{name: T4, architecture: turing, memory_gib: 16, utilization: 0.5}]\n")
    with install(path, clock=lambda: 5.0):
        pynvml.nvmlInit()
        with pytest.raises(pynvml.NVMLError) as quirk:
            pynvml.nvmlDeviceGetProcessUtilization(pynvml.nvmlDeviceGetHandleByIndex(0), 0)
        assert quirk.value.value == 0


# --- MIG -------------------------------------------------------------------------------------


def test_mig_devices(sim: SimulatedNode) -> None:
    gpu = pynvml.nvmlDeviceGetHandleByIndex(3)
    assert pynvml.nvmlDeviceGetMigMode(gpu) == [1, 1]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu) == 7
    migs = []
    for i in range(7):
        try:
            migs.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i))
        except pynvml.NVMLError_NotFound:
            continue
    assert len(migs) == 3
    first = migs[0]
    assert pynvml.nvmlDeviceIsMigDeviceHandle(first).value == 1
    assert pynvml.nvmlDeviceIsMigDeviceHandle(gpu).value == 0
    assert pynvml.nvmlDeviceGetName(first) == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert pynvml.nvmlDeviceGetUUID(first).startswith("MIG-")
    assert [pynvml.nvmlDeviceGetGpuInstanceId(m) for m in migs] == [1, 5, 13]
    assert pynvml.nvmlDeviceGetComputeInstanceId(first) == 0
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(first)
    assert pynvml.nvmlDeviceGetUUID(parent) == pynvml.nvmlDeviceGetUUID(gpu)
    assert pynvml.nvmlDeviceGetMemoryInfo(first).total == int(39.5 * GIB)
    (proc,) = pynvml.nvmlDeviceGetComputeRunningProcesses(first)
    assert (proc.pid, proc.gpuInstanceId, proc.computeInstanceId) == (41304, 1, 0)
    assert len(pynvml.nvmlDeviceGetComputeRunningProcesses(gpu)) == 2


def test_mig_utilization_not_supported(sim: SimulatedNode, clock: FakeClock) -> None:
    clock.advance(2.0)
    gpu = pynvml.nvmlDeviceGetHandleByIndex(3)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    for handle in (gpu, mig):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetUtilizationRates(handle)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerUsage(mig)


# --- GPM -------------------------------------------------------------------------------------


def gpm_metrics(first: object, second: object, ids: list[int]) -> dict[int, float]:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(ids)
    request.sample1, request.sample2 = first, second
    for i, metric_id in enumerate(ids):
        request.metrics[i].metricId = metric_id
    pynvml.nvmlGpmMetricsGet(request)
    assert all(request.metrics[i].nvmlReturn == 0 for i in range(len(ids)))
    return {request.metrics[i].metricId: request.metrics[i].value for i in range(len(ids))}


def test_gpm_whole_gpu_and_mig(sim: SimulatedNode, clock: FakeClock) -> None:
    ids = [pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
           pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL]
    h1 = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlGpmQueryDeviceSupport(h1).isSupportedDevice == 1
    assert pynvml.nvmlGpmQueryDeviceSupport(pynvml.nvmlDeviceGetHandleByIndex(2)).isSupportedDevice == 0
    a, b = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(h1, a)
    clock.advance(20.0)  # one whole burst period: 2 s at 95%
    pynvml.nvmlGpmSampleGet(h1, b)
    values = gpm_metrics(a, b, ids)
    assert values[pynvml.NVML_GPM_METRIC_SM_UTIL] == pytest.approx(9.5)
    assert values[pynvml.NVML_GPM_METRIC_SM_OCCUPANCY] == pytest.approx(9.5 * 0.5)
    assert values[pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL] == pytest.approx(9.5 * 0.7)
    assert values[pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL] == pytest.approx(4.0)

    mig_gpu = pynvml.nvmlDeviceGetHandleByIndex(3)
    pynvml.nvmlGpmMigSampleGet(mig_gpu, 13, a)
    clock.advance(1.0)
    pynvml.nvmlGpmMigSampleGet(mig_gpu, 13, b)
    assert gpm_metrics(a, b, ids[:1]) == {pynvml.NVML_GPM_METRIC_SM_UTIL: 0.0}
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # the second sample must be newer
        gpm_metrics(b, a, ids[:1])
    pynvml.nvmlGpmSampleFree(a)
    pynvml.nvmlGpmSampleFree(b)


# --- events ----------------------------------------------------------------------------------


@scenario("faults.yaml")
def test_xid_events(sim: SimulatedNode, clock: FakeClock) -> None:
    events = pynvml.nvmlEventSetCreate()
    h0 = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetSupportedEventTypes(h0) & pynvml.nvmlEventTypeXidCriticalError
    pynvml.nvmlDeviceRegisterEvents(h0, pynvml.nvmlEventTypeXidCriticalError, events)
    started = time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait(events, 50)
    assert time.monotonic() - started >= 0.04
    # an event arriving while another thread waits
    threading.Timer(0.05, clock.advance, args=(3.0,)).start()
    data = pynvml.nvmlEventSetWait(events, 2000)
    assert data.eventType == pynvml.nvmlEventTypeXidCriticalError and data.eventData == 13
    assert pynvml.nvmlDeviceGetUUID(data.device) == pynvml.nvmlDeviceGetUUID(h0)
    with pytest.raises(pynvml.NVMLError_Timeout):  # delivered once
        pynvml.nvmlEventSetWait(events, 0)
    pynvml.nvmlEventSetFree(events)


# --- faults ----------------------------------------------------------------------------------


@scenario("faults.yaml")
def test_scenario_faults(sim: SimulatedNode, clock: FakeClock) -> None:
    h0, h1 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
    for _ in range(3):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetPowerUsage(h0)
    assert sim.call_counts["nvmlDeviceGetPowerUsage"] == 3
    assert pynvml.nvmlDeviceGetPowerUsage(h1) > 0
    clock.advance(5.0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetMemoryInfo(h1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetMemoryInfo(h0).total == 40 * GIB


def test_lose_and_restore_gpu(sim: SimulatedNode) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(3)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    sim.lose_gpu(3)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetUUID(h)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetMemoryInfo(mig)
    assert pynvml.nvmlDeviceGetCount() == 4
    sim.restore_gpu(3)
    assert pynvml.nvmlDeviceGetUUID(h).startswith("GPU-")
    with pytest.raises(IndexError, match="no simulated GPU 9"):
        sim.lose_gpu(9)


def test_set_not_supported_is_per_gpu_and_function(sim: SimulatedNode) -> None:
    sim.set_not_supported(2, "nvmlDeviceGetTemperature")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTemperature(pynvml.nvmlDeviceGetHandleByIndex(2), 0)
    assert pynvml.nvmlDeviceGetTemperature(pynvml.nvmlDeviceGetHandleByIndex(1), 0) > 0
    assert pynvml.nvmlDeviceGetPowerUsage(pynvml.nvmlDeviceGetHandleByIndex(2)) > 0


def test_driver_unload_and_reload(sim: SimulatedNode) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    sim.unload_driver()
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlDeviceGetUUID(h)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    sim.reload_driver()
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 4


def test_driver_missing(tmp_path: Path) -> None:
    with install(write(tmp_path, "driver_missing: true\n")):
        with pytest.raises(pynvml.NVMLError_LibraryNotFound):
            pynvml.nvmlInit()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()


def test_unknown_symbol_is_function_not_found(sim: SimulatedNode) -> None:
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetNvLinkState(pynvml.nvmlDeviceGetHandleByIndex(0), 0)


def test_install_uninstall_state() -> None:
    node = install()
    assert installed() is node
    second = install()  # replaces the first
    assert installed() is second
    uninstall()
    assert installed() is None and pynvml.nvmlLib is None
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    uninstall()  # no-op


def test_leaving_with_uninstalls_the_installed_node_only() -> None:
    with install() as node:
        assert installed() is node
    assert installed() is None and pynvml.nvmlLib is None
    node = install()
    try:
        with SimulatedNode(load_scenario(None)):  # never installed: leaving closes it, the installed node stays
            pass
        assert installed() is node
    finally:
        uninstall()


# --- training-driven utilization ------------------------------------------------------------


@scenario("demo-training.yaml")
def test_follow_training(sim: SimulatedNode, clock: FakeClock) -> None:
    uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    phase = {"value": "data"}
    sim.set_training_source(lambda u: phase["value"] if u == uuid else None)
    clock.advance(1.0)
    sim.refresh_training()
    phase["value"] = "compute"
    sim.refresh_training()
    clock.advance(3.0)
    sim.refresh_training()
    phase["value"] = "metrics"
    sim.refresh_training()
    clock.advance(1.0)
    assert sim.true_busy_seconds(0, 0.0, 5.0) == pytest.approx(0.01 * 2 + 0.95 * 3)
    _, samples = pynvml.nvmlDeviceGetSamples(pynvml.nvmlDeviceGetHandleByIndex(0),
                                            pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert [s.sampleValue.uiVal for s in samples] == [1] * 6 + [95] * 18 + [1] * 6


@scenario("demo-training.yaml")
def test_follow_training_uses_the_compute_share_of_each_snapshot_interval(sim: SimulatedNode,
                                                                          clock: FakeClock) -> None:
    """The GPU follows what the job did between two snapshots, not the phase it was in when it pushed."""
    uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    pushed: dict[str, dict[str, float] | None] = {"phases": None}
    sim.set_training_source(lambda u: pushed["phases"] if u == uuid else None)
    clock.advance(2.0)  # no run yet: idle
    pushed["phases"] = {"data": 0.0, "compute": 0.0, "metrics": 0.0}
    sim.refresh_training()  # first snapshot: nothing done yet, the level stays
    clock.advance(4.0)
    pushed["phases"] = {"data": 1.0, "compute": 1.0, "metrics": 2.0}  # 25% compute
    sim.refresh_training()
    clock.advance(4.0)
    sim.refresh_training()  # no new snapshot: the level holds
    pushed["phases"] = {"data": 1.0, "compute": 4.0, "metrics": 3.0}  # 3 of 4 s compute
    sim.refresh_training()
    clock.advance(2.0)
    pushed["phases"] = None  # the run finished
    sim.refresh_training()
    clock.advance(2.0)
    level_25 = 0.95 * 0.25 + 0.01 * 0.75
    level_75 = 0.95 * 0.75 + 0.01 * 0.25
    assert sim.true_busy_seconds(0, 0.0, 14.0) == pytest.approx(0.01 * 6 + level_25 * 4 + level_75 * 2 + 0.01 * 2)


@scenario("launch-bound.yaml")
def test_busy_utilization_sets_how_busy_the_gpu_is_while_the_job_computes(sim: SimulatedNode,
                                                                          clock: FakeClock) -> None:
    uuids = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(2)]
    state = {"t": 0.0}
    sim.set_training_source(lambda u: {"compute": 0.9 * state["t"], "data": 0.1 * state["t"]}
                            if u in uuids else None)
    for _ in range(10):
        clock.advance(1.0)
        state["t"] += 1.0
        sim.refresh_training()
    healthy, launch_bound = (sim.true_busy_seconds(i, 1.0, 10.0) / 9.0 for i in range(2))
    assert healthy == pytest.approx(0.97 * 0.9 + 0.01 * 0.1)
    assert launch_bound == pytest.approx(0.25 * 0.9 + 0.01 * 0.1)


# --- patterns --------------------------------------------------------------------------------


def test_pattern_integrals() -> None:
    assert integral(Bursts(10.0, 0.3, 1.0, 0.0), 0.0, 20.0) == pytest.approx(6.0)
    assert integral(Bursts(10.0, 0.3, 1.0, 0.0), 2.0, 13.5) == pytest.approx(1.0 + 3.0)
    steps = Steps([60.0, 120.0], [0.9, 0.1], repeat=True)
    assert integral(steps, 0.0, 240.0) == pytest.approx(120.0)
    assert integral(steps, 100.0, 130.0) == pytest.approx(20 * 0.1 + 10 * 0.9)
    assert Steps([60.0, 120.0], [0.9, 0.1], repeat=False).value(500.0) == 0.1
    noisy = Noisy(Constant(0.5), 0.2, "seed")
    assert noisy.value(1.0) == Noisy(Constant(0.5), 0.2, "seed").value(1.0)
    assert integral(noisy, 0.0, 100.0) == pytest.approx(50.0, abs=2.0)
    timeline = Timeline(0.0)
    timeline.record(1.0, 1.0)
    timeline.record(3.0, 0.5)
    assert integral(timeline, 0.0, 4.0) == pytest.approx(2.5)


# --- scenario validation ---------------------------------------------------------------------


def test_packaged_scenarios_load() -> None:
    counts = {p.name: len(load_scenario(p).gpus) for p in SCENARIOS.glob("*.yaml")}
    assert counts == {"default.yaml": 4, "bursty.yaml": 1, "eight_gpus.yaml": 8,
                      "demo-training.yaml": 2, "faults.yaml": 2, "launch-bound.yaml": 2}
    assert load_scenario(None).gpus[3].mig_instances is not None


@pytest.mark.parametrize(("text", "expected"), [
    ("gpus: [{name: X, architecture: hopper, memory_gib: 80, colour: red}]", "gpus[0].colour: unknown key"),
    ("gpus: [{name: X, architecture: hoper, memory_gib: 80}]", "gpus[0].architecture: must be one of"),
    ("gpus: [{name: X, architecture: hopper}]", "gpus[0].memory_gib: is required"),
    ("gpus: [{name: X, architecture: hopper, memory_gib: 80, utilization: 1.5}]",
     "gpus[0].utilization: must be between 0 and 1, got 1.5"),
    ("gpus: [{name: X, architecture: hopper, memory_gib: 80,"
     " utilization: {bursts: {period: 10, duty: 2, high: 1}}}]",
     "gpus[0].utilization.bursts.duty: must be between 0 and 1"),
    ("gpus: [{name: X, architecture: hopper, memory_gib: 80, utilization: {constant: 0.5, steps: []}}]",
     "gpus[0].utilization: needs exactly one of constant, bursts, steps"),
    ("gpus: [{name: X, architecture: hopper, memory_gib: 80,"
     " utilization: {steps: [{until: 5, value: 1}, {until: 3, value: 0}]}}]",
     "gpus[0].utilization.steps[1].until: must be greater than 0 and than the previous"),
    ("gpus: [{name: X, architecture: hopper, memory_gib: 8, processes: [{pid: 1, name: a, memory_gib: 9}]}]",
     "gpus[0].memory_used_gib: 9 GiB plus 0.5 GiB reserved exceeds memory_gib 8"),
    ("gpus: [{name: X, architecture: volta, memory_gib: 32, mig: {instances: [{profile: 1g.5gb,"
     " memory_gib: 4}]}}]", "gpus[0].mig: MIG needs ampere or newer"),
    ("gpus: [{name: X, architecture: hopper, memory_gib: 80, faults: [{at: 1, kind: melted}]}]",
     "gpus[0].faults[0].kind: must be one of lost, not_supported"),
    ("gpus: [{name: X, architecture: hopper, memory_gib: 80, faults: [{kind: not_supported}]}]",
     "gpus[0].faults[0].function: is required"),
    ("gpus: []", "gpus: must list at least one GPU"),
    ("gpus: [{name: X, architecture: hopper, memory_gib: 80}]\ncuda_version: twelve",
     "cuda_version: must look like 12.4"),
    ("gpus: [1]", "gpus[0]: must be a mapping, got 1"),
    ("gpus: [{name: X, architecture: hopper, memory_gib: 80}\n", ":2: invalid YAML"),
    ("gpu: []", "gpu: unknown key"),
])
def test_scenario_errors_are_one_line_naming_the_key(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as error:
        load_scenario(path)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{path}:")
    assert expected in message
    assert isinstance(error.value, ValueError)


def test_packaged_scenario_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_scenario("bursty").gpus[0].name == "NVIDIA A100-SXM4-80GB"
    assert load_scenario("faults.yaml").source.endswith("scenarios/faults.yaml")
    (tmp_path / "bursty.yaml").write_text("gpus: [{name: Local, architecture: ada, memory_gib: 24}]\n")
    assert load_scenario("bursty.yaml").gpus[0].name == "Local"  # an existing file wins
    with pytest.raises(ScenarioError, match=r"^nope: cannot read"):
        load_scenario("nope")


def test_missing_scenario_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"nope\.yaml: cannot read the scenario file"):
        load_scenario(tmp_path / "nope.yaml")


def test_real_nvml_is_never_replaced_silently(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pynvml, "nvmlLib", object())
    with pytest.raises(RuntimeError, match="real NVML library is already loaded"):
        install()


def test_concurrent_polling_and_event_wait() -> None:
    errors: list[BaseException] = []
    stop = threading.Event()

    def poll() -> None:
        try:
            cursor = 0
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            while not stop.is_set():
                try:
                    _, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, cursor)
                    cursor = samples[-1].timeStamp
                except pynvml.NVMLError_NotFound:
                    pass
                pynvml.nvmlDeviceGetMemoryInfo(handle)
                pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except BaseException as exc:  # surfaced to the test below
            errors.append(exc)

    with install() as node:
        pynvml.nvmlInit()
        events = pynvml.nvmlEventSetCreate()
        pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(0),
                                        pynvml.nvmlEventTypeXidCriticalError, events)
        pollers = [threading.Thread(target=poll) for _ in range(2)]
        for thread in pollers:
            thread.start()
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait(events, 400)
        stop.set()
        for thread in pollers:
            thread.join()
        assert not errors
        assert node.call_counts["nvmlDeviceGetMemoryInfo"] > 10


def test_other_nvml_tools_see_the_simulated_node(tmp_path: Path) -> None:
    """nvitop, a peer tool built on pynvml, reads the same simulated GPUs (own process: nvitop keeps state)."""
    script = (
        "from gpu_exporter.simulate import install\n"
        "install(clock=lambda: 5.0)\n"
        "from nvitop import Device\n"
        "for d in Device.all():\n"
        "    print(d.name(), d.cuda_compute_capability(), d.memory_used(), d.is_mig_mode_enabled())\n"
    )
    exporter_root = str(SCENARIOS.parents[2])
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": exporter_root}, check=True)
    lines = result.stdout.splitlines()
    assert lines[0] == f"NVIDIA H100 80GB HBM3 (9, 0) {int(71.5 * GIB)} False"
    assert lines[2].startswith("NVIDIA A100-SXM4-80GB (8, 0)")
    assert lines[3].endswith("True") and len(lines) == 4
