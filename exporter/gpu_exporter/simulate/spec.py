"""What a scenario describes: a simulated node and its GPUs, as frozen, validated dataclasses.

A scenario file (gpu_exporter.simulate.scenario parses and validates it) and the simulation
that runs it (``node``, ``fake_nvml``, ``dcgm_exporter``) meet here: :class:`Scenario` holds
the node's driver facts and one :class:`GpuSpec` per GPU, with its processes, MIG instances,
XID events and injected faults; a :class:`Level` moves linearly with utilization. Nothing here
reads a file or checks a value: the parser has, before it builds them.

>>> Level(60, 600).at(0.5)
330.0
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_exporter.simulate.patterns import Pattern

ARCHITECTURES = {
    "kepler": 2, "maxwell": 3, "pascal": 4, "volta": 5, "turing": 6,
    "ampere": 7, "ada": 8, "hopper": 9, "blackwell": 10,
}
FAULT_KINDS = ("lost", "not_supported")
GIB = 1 << 30


@dataclass(frozen=True)
class Level:
    """A quantity that moves linearly with utilization: ``idle`` at 0, ``busy`` at 1."""

    idle: float
    busy: float

    def at(self, utilization: float) -> float:
        return self.idle + (self.busy - self.idle) * utilization


@dataclass(frozen=True)
class ProcessSpec:
    """One process using the GPU."""

    pid: int
    name: str
    memory_gib: float
    sm_utilization: float | None
    memory_utilization: float | None
    graphics: bool
    mig_instance: int | None


@dataclass(frozen=True)
class MigInstanceSpec:
    """One MIG instance (a GPU instance with one compute instance)."""

    profile: str
    memory_gib: float
    memory_used_gib: float
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str
    utilization: Pattern


@dataclass(frozen=True)
class XidEvent:
    """An XID error the GPU reports at simulated second ``at``."""

    at: float
    xid: int


@dataclass(frozen=True)
class Fault:
    """An injected failure between ``at`` and ``until`` (None: forever)."""

    at: float
    until: float | None
    kind: str
    function: str | None

    def active(self, t: float) -> bool:
        """Whether the fault is in effect at simulated time ``t``."""
        return self.at <= t and (self.until is None or t < self.until)


@dataclass(frozen=True)
class GpuSpec:
    """One simulated GPU."""

    index: int
    name: str
    architecture: str
    memory_gib: float
    uuid: str
    pci_bus_id: str
    utilization: Pattern
    memory_utilization: Pattern
    memory_used_gib: float
    memory_reserved_gib: float
    power_watts: Level
    power_limit_watts: float
    temperature_celsius: Level
    sm_clock_mhz: Level
    memory_clock_mhz: Level
    fan_percent: Level | None
    pcie_tx_mib_s: Level
    pcie_rx_mib_s: Level
    clock_event_reasons: tuple[str, ...] | None
    processes: tuple[ProcessSpec, ...]
    mig_instances: tuple[MigInstanceSpec, ...] | None
    device: bool
    follow_training: bool
    busy_utilization: float
    idle_utilization: float
    gpm: bool
    gpm_occupancy_factor: float
    gpm_tensor_factor: float
    xid_events: tuple[XidEvent, ...]
    faults: tuple[Fault, ...]

    @property
    def architecture_id(self) -> int:
        """NVML's number for the architecture (NVML_DEVICE_ARCH_*)."""
        return ARCHITECTURES[self.architecture]


@dataclass(frozen=True)
class Scenario:
    """A whole simulated node."""

    source: str
    gpus: tuple[GpuSpec, ...]
    driver_version: str
    cuda_version: str
    driver_missing: bool
    dcgm_pipe_fields: bool = False
    """Whether the stand-in dcgm-exporter serves DCGM_FI_PROF_PIPE_FP16/32/64_ACTIVE (its counters file enables
    them; dcgm-exporter's default file does not)."""

    @property
    def cuda_version_number(self) -> int:
        """CUDA version as NVML reports it: "12.4" -> 12040."""
        major, minor = self.cuda_version.split(".")
        return int(major) * 1000 + int(minor) * 10
