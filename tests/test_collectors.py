"""Each collector against simulated GPUs (the real pynvml wrapper code runs underneath)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from gpu_exporter import simulate
from gpu_exporter.app import polling_collectors
from gpu_exporter.catalog import CLOCK_EVENT_REASONS, SLOWDOWN_REASONS
from gpu_exporter.collectors.device import DeviceCollector
from gpu_exporter.collectors.xid import XidCollector
from gpu_exporter.config import ConfigError, load_config
from gpu_exporter.nvml import Nvml
from gpu_exporter.poller import Poller
from gpu_exporter.simulate.scenario import load_scenario
from harness import Harness, scenario_path

GIB = 1 << 30
MIB = 1 << 20


@pytest.fixture
def default() -> Iterator[Harness]:
    with Harness("default.yaml") as h:
        h.advance(10.0)
        yield h


def test_info_labels(default: Harness) -> None:
    info = default.samples("gpu_info")
    assert len(info) == 4
    gpu0 = default.samples("gpu_info", gpu="0")[0].labels
    assert gpu0["name"] == "NVIDIA H100 80GB HBM3"
    assert gpu0["uuid"].startswith("GPU-")
    assert gpu0["driver_version"] == "550.54.15" and gpu0["cuda_version"] == "12.4"
    assert gpu0["architecture"] == "hopper" and gpu0["mig_mode"] == "disabled"
    assert gpu0["pci_bus_id"]
    assert default.samples("gpu_info", gpu="3")[0].labels["mig_mode"] == "enabled"


def test_utilization_and_busy_counter(default: Harness) -> None:
    busy = default.value("gpu_busy_seconds_total", gpu="0")
    assert 0.75 * 10 < busy < 0.95 * 10  # ~85% of the 10 s integrated
    assert 0.7 < default.value("gpu_utilization_ratio", gpu="0") < 1.0
    assert 0.15 < default.value("gpu_utilization_ratio", gpu="2") < 0.35
    assert 0.0 <= default.value("gpu_memory_utilization_ratio", gpu="0") <= 1.0
    assert default.value("gpu_memory_busy_seconds_total", gpu="0") > 0
    # MIG-enabled GPU: NVML utilization is NOT_SUPPORTED, so no series (GPM covers it)
    assert default.samples("gpu_utilization_ratio", gpu="3") == []
    before = busy
    default.advance(5.0)
    assert default.value("gpu_busy_seconds_total", gpu="0") > before


def test_memory_power_thermal_clocks(default: Harness) -> None:
    assert default.value("gpu_memory_total_bytes", gpu="0") == 80 * GIB
    used = default.value("gpu_memory_used_bytes", gpu="0")
    free = default.value("gpu_memory_free_bytes", gpu="0")
    reserved = default.value("gpu_memory_reserved_bytes", gpu="0")
    assert used >= 71.5 * GIB
    assert used + free + reserved == pytest.approx(80 * GIB, rel=1e-6)
    assert 72 < default.value("gpu_power_watts", gpu="0") <= 700
    assert default.value("gpu_power_limit_watts", gpu="0") == 700
    assert 31 <= default.value("gpu_temperature_celsius", gpu="0") <= 68
    assert 345e6 <= default.value("gpu_sm_clock_hertz", gpu="0") <= 1980e6
    assert default.value("gpu_memory_clock_hertz", gpu="0") == 2619e6
    energy = default.value("gpu_energy_joules_total", gpu="0")
    default.advance(2.0)
    assert default.value("gpu_energy_joules_total", gpu="0") > energy
    reasons = {s.labels["reason"]: s.value for s in default.samples("gpu_clock_event_active", gpu="0")}
    assert set(reasons) == set(SLOWDOWN_REASONS) and set(reasons.values()) <= {0.0, 1.0}
    assert default.samples("gpu_fan_speed_ratio") == []  # scenario GPUs have no fan: NOT_SUPPORTED
    # PCIe traffic moves with the busy share between the scenario's idle and busy levels (MiB/s): GPU 1 idle, GPU 0
    # about 85% busy (was ">= 0", which no reading could fail)
    tx = [gpu.pcie_tx_mib_s for gpu in load_scenario("default").gpus]
    assert default.value("gpu_pcie_tx_bytes_per_second", gpu="1") == pytest.approx(tx[1].at(0.0) * MIB, rel=0.05)
    assert 0.95 * tx[0].at(0.7) * MIB < default.value("gpu_pcie_tx_bytes_per_second", gpu="0") < tx[0].at(1.0) * MIB


def test_clock_event_reasons_are_the_slowdowns_unless_configured(default: Harness) -> None:
    """gpu_clock_event_active has the five slowdown reasons by default; device.clock_event_reasons picks others
    (all: the nine NVML names), and a name NVML does not have is a one-line config error."""
    assert {s.labels["reason"] for s in default.samples("gpu_clock_event_active", gpu="1")} == set(SLOWDOWN_REASONS)
    everything = load_config(None, env={}, flags={"device.clock_event_reasons": "all"}).device_clock_event_reasons
    assert everything == tuple(CLOCK_EVENT_REASONS) and len(everything) == 9
    device = next(c for c in polling_collectors(clock_event_reasons=everything) if isinstance(c, DeviceCollector))
    assert device.clock_event_reasons == everything
    next(c for c in default.collectors if isinstance(c, DeviceCollector)).clock_event_reasons = everything
    default.advance(1.0)
    reasons = {s.labels["reason"]: s.value for s in default.samples("gpu_clock_event_active", gpu="1")}
    assert set(reasons) == set(everything) and reasons["gpu_idle"] == 1.0  # GPU 1 is idle for its first 18 s
    assert default.value("gpu_clock_event_active", gpu="0", reason="gpu_idle") == 0.0  # GPU 0 is busy
    picked = load_config(None, env={"GPU_EXPORTER_DEVICE_CLOCK_EVENT_REASONS": "gpu_idle, sw_power_cap"}, flags={})
    assert picked.device_clock_event_reasons == ("gpu_idle", "sw_power_cap")
    with pytest.raises(ConfigError, match=r"device.clock_event_reasons: unknown clock event reason\(s\) thermal; "
                                          r"known: all, gpu_idle,"):
        load_config(None, env={"GPU_EXPORTER_DEVICE_CLOCK_EVENT_REASONS": "gpu_idle,thermal"}, flags={})


def test_processes(default: Harness) -> None:
    procs = default.samples("gpu_process_memory_used_bytes", gpu="1")
    assert [(s.labels["pid"], s.labels["process_name"]) for s in procs] == [("41102", "jupyter-kernel")]
    assert procs[0].value == 30 * GIB
    assert len(default.samples("gpu_process_sm_utilization_ratio", gpu="0")) == 1
    mig_procs = default.samples("gpu_process_memory_used_bytes", gpu="3")
    assert sorted(s.labels["pid"] for s in mig_procs) == ["41304", "41305"]


def test_process_lists_are_read_once_per_gpu_per_poll(default: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    # The processes and evidence collectors both want the list: they share one read per GPU (PollContext.processes).
    assert {c.name for c in default.collectors} >= {"processes", "evidence"}
    seen: list[tuple[str, str]] = []
    real = Nvml.call

    def counting(self: Nvml, key: str, function: str, *args: object, **kwargs: str) -> object:
        if function.endswith("RunningProcesses"):
            seen.append((key, function))
        return real(self, key, function, *args, **kwargs)

    monkeypatch.setattr(Nvml, "call", counting)
    default.advance(1.0)
    gpus = {g.uuid for g in default.poller.discovery.gpus}
    assert len(gpus) == 4 and sorted(seen) == sorted((u, f) for u in gpus for f in (
        "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"))


def test_mig_and_gpm(default: Harness) -> None:
    instances = default.samples("gpu_mig_info", gpu="3")
    assert sorted(s.labels["profile"] for s in instances) == ["1g.10gb", "2g.20gb", "3g.40gb"]
    three_g = default.samples("gpu_mig_info", profile="3g.40gb")[0].labels
    assert default.value("gpu_mig_memory_used_bytes", mig_uuid=three_g["mig_uuid"]) == 31 * GIB
    # GPM on Hopper: whole GPU (mig_uuid="") for GPUs 0, 1, 3 and per MIG instance on GPU 3
    sm = default.samples("gpu_sm_active_ratio")
    assert {(s.labels["gpu"], s.labels["mig_uuid"] == "") for s in sm} >= {("0", True), ("3", True), ("3", False)}
    assert default.samples("gpu_sm_active_ratio", gpu="2") == []  # Ampere: no GPM
    busy_mig = default.value("gpu_sm_active_ratio", mig_uuid=three_g["mig_uuid"])
    idle_mig = default.value("gpu_sm_active_ratio", mig_uuid=default.samples(
        "gpu_mig_info", profile="1g.10gb")[0].labels["mig_uuid"])
    assert busy_mig > 0.5 > idle_mig
    for name in ("gpu_sm_occupancy_ratio", "gpu_tensor_active_ratio", "gpu_dram_bandwidth_utilization_ratio"):
        assert all(0 <= s.value <= 1 for s in default.samples(name))
        assert default.samples(name, gpu="0")


def test_health(default: Harness) -> None:
    assert default.value("gpu_exporter_gpus") == 4
    success = {s.labels["collector"]: s.value for s in default.samples("gpu_exporter_collector_success")}
    assert success == {"utilization": 1, "device": 1, "pcie": 1, "processes": 1, "evidence": 1, "mig": 1, "gpm": 1}
    assert default.value("gpu_exporter_last_sample_age_seconds") == 0
    default.clock.t += 7
    assert default.value("gpu_exporter_last_sample_age_seconds") == pytest.approx(7)
    build = default.samples("gpu_exporter_build_info")[0].labels
    assert build["version"] and build["pynvml_version"] != "unknown"


def test_xid_events_counted_from_event_thread() -> None:
    node = simulate.install(scenario_path("faults.yaml"))
    nvml = Nvml()
    try:
        nvml.init()
        poller = Poller(nvml, [], poll_interval=0.2)
        poller.poll_once()
        xid = XidCollector(nvml, lambda: poller.discovery)
        xid.start()
        deadline = time.monotonic() + 10
        counts: dict[tuple[str, str], float] = {}
        while time.monotonic() < deadline and ("0", "13") not in counts:
            time.sleep(0.2)
            counts = {(s.labels["gpu"], s.labels["xid"]): s.value for f in xid.collect() for s in f.samples}
        xid.stop()
        assert counts.get(("0", "13")) == 1, counts
        assert node.now() >= 2
    finally:
        nvml.shutdown()
        simulate.uninstall()



def test_the_registry_is_the_one_list_of_collectors() -> None:
    from gpu_exporter import collectors
    from gpu_exporter.app import POLLING_COLLECTORS
    from gpu_exporter.config import COLLECTOR_NAMES

    assert COLLECTOR_NAMES == collectors.NAMES == tuple(n for n, r in collectors.REGISTRY.items() if r.switch)
    for name, registration in collectors.REGISTRY.items():
        assert registration.load().name == name  # the class's collector label is its registered name
        assert registration.polling or callable(registration.load().build)  # the exporter builds the others
    assert [cls.name for cls in POLLING_COLLECTORS] == [n for n, r in collectors.REGISTRY.items() if r.polling]
    with pytest.raises(ValueError, match="registered twice"):
        collectors.register("xid", "xid:XidCollector")


def test_collectors_never_import_upward() -> None:
    """collectors/ import only collectors, nvml, exposition, the catalog and the wire protocol's names
    (training.protocol, standard library only: the phase names the stack sampler maps to), never the poller."""
    import ast
    from pathlib import Path

    from gpu_exporter import collectors

    allowed = ("gpu_exporter.collectors", "gpu_exporter.nvml", "gpu_exporter.exposition", "gpu_exporter.catalog",
               "gpu_exporter.training.protocol")
    for path in Path(collectors.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "gpu_exporter":  # from gpu_exporter import x
                module = "gpu_exporter." + node.names[0].name
            elif isinstance(node, ast.ImportFrom) and node.module:
                module = node.module if node.level == 0 else "gpu_exporter.collectors." + node.module
            elif isinstance(node, ast.Import):
                module = node.names[0].name
            else:
                continue
            if module.startswith("gpu_exporter"):
                assert module.startswith(allowed), f"{path.name} imports {module}"
