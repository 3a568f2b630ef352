"""A stand-in for libnvidia-ml: an object whose attributes are NVML's C functions.

pynvml looks every C function up with ``getattr(nvmlLib, name)`` and calls it with ctypes
arguments; :class:`FakeNvmlLibrary` answers those calls from a :class:`SimulatedNode`, so pynvml's
own wrapper code (two-call size protocols, struct versions, error mapping) runs unchanged.
Unknown names raise AttributeError, which pynvml reports as FunctionNotFound. Example:

>>> from gpu_exporter.simulate.scenario import load_scenario
>>> lib = FakeNvmlLibrary(SimulatedNode(load_scenario(None)))
>>> lib.nvmlInitWithFlags(0)
0
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass, field
from functools import partial, partialmethod
from typing import Any, TypeVar

from gpu_exporter.catalog import CLOCK_EVENT_REASONS
from gpu_exporter.simulate.node import SimulatedNode
from gpu_exporter.simulate.patterns import Pattern, integral
from gpu_exporter.simulate.spec import GIB, GpuSpec, Level, MigInstanceSpec

# NVML return codes (nvml.h)
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_GPU_IS_LOST = 15
ERROR_ARGUMENT_VERSION_MISMATCH = 25

GPU_UTILIZATION_SAMPLES = 1
MEMORY_UTILIZATION_SAMPLES = 2
VALUE_TYPE_UNSIGNED_INT = 1
CLOCK_SM = 1
CLOCK_MEM = 2
EVENT_TYPE_XID = 0x8
SUPPORTED_EVENT_TYPES = 0x1 | 0x2 | 0x4 | 0x8 | 0x10
MEMORY_V2_VERSION = 0x02000028
GPM_VERSION = 1
GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_ANY_TENSOR_UTIL, GPM_DRAM_BW_UTIL = 2, 3, 5, 10
ARCH_HOPPER = 9
ARCH_AMPERE = 7
MAX_MIG_DEVICES = 7
NO_INSTANCE = 0xFFFFFFFF
COMPUTE_CAPABILITY = {
    "kepler": (3, 7), "maxwell": (5, 2), "pascal": (6, 0), "volta": (7, 0), "turing": (7, 5),
    "ampere": (8, 0), "ada": (8, 9), "hopper": (9, 0), "blackwell": (10, 0),
}

_GPU_HANDLE_STRIDE = 0x10000
_EVENT_SET_BASE = 0x7E000000
_GPM_SAMPLE_BASE = 0x6D000000

F = TypeVar("F", bound=Callable[..., int])
T = TypeVar("T")


class _Status(Exception):
    """Raised inside a fake function to return an NVML error code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _symbol(*aliases: str, locked: bool = True, whole: bool = False) -> Callable[[F], F]:
    """Give a method (named as its C function) ``aliases`` and flags: ``whole``: a whole GPU's only (a MIG handle
    gets NOT_SUPPORTED); ``locked=False``: it runs without the node's lock (it waits)."""

    def mark(fn: F) -> F:
        fn.__dict__["nvml_symbol"] = (aliases, locked, whole)
        return fn

    return mark


@dataclass(frozen=True)
class _Target:
    """What a device handle points at: a GPU, or one MIG instance of it, at simulated time ``t``."""

    gpu: GpuSpec
    mig_index: int | None
    t: float
    node: SimulatedNode

    @property
    def mig(self) -> MigInstanceSpec | None:
        return None if self.mig_index is None or self.gpu.mig_instances is None \
            else self.gpu.mig_instances[self.mig_index]

    @property
    def busy(self) -> float:
        """The GPU's current utilization ratio (also drives power, temperature, clocks)."""
        return self.node.instant(self.node.utilization_pattern(self.gpu.index),
                                 self.node.sample_time(self.gpu.index, self.t))


@dataclass
class _EventSet:
    registered: dict[int, float] = field(default_factory=dict)  # GPU index -> registration time
    delivered: set[tuple[int, int]] = field(default_factory=set)  # (GPU index, event position)


@dataclass(frozen=True)
class _GpmSample:
    t: float
    gpu: int
    mig_index: int | None


def _value(arg: Any) -> int:
    return int(arg.value) if hasattr(arg, "value") else int(arg)


def _out(ref: Any) -> Any:
    """The ctypes object behind ``byref(x)``."""
    if ref is None:
        raise _Status(ERROR_INVALID_ARGUMENT)
    return ref._obj


def _address(pointer: Any) -> int | None:
    return None if pointer is None else ctypes.cast(pointer, ctypes.c_void_p).value


def _write_value(ref: Any, value: int) -> int:
    """Write ``value`` through ``byref(x)``; like each _write_* helper, returns SUCCESS (a fake function ends on it)."""
    _out(ref).value = value
    return SUCCESS


def _write_pointer(ref: Any, address: int) -> int:
    ctypes.c_void_p.from_buffer(_out(ref)).value = address
    return SUCCESS


def _write_string(buffer: Any, length: Any, text: str) -> int:
    data = text.encode()
    if len(data) + 1 > _value(length):
        raise _Status(ERROR_INSUFFICIENT_SIZE)
    buffer.value = data
    return SUCCESS


def _free(table: dict[int, Any], handle: Any) -> int:
    """Take the event set or GPM sample ``handle`` out of ``table``."""
    address = _address(handle)
    if address not in table:
        return ERROR_INVALID_ARGUMENT
    del table[address]
    return SUCCESS


def _write_number(number: Callable[..., float], dev: _Target, *args: Any) -> int:
    """Write ``number(dev, *args)`` (all arguments but the last), rounded, through the last argument."""
    return _write_value(args[-1], round(number(dev, *args[:-1])))


def _supported(value: T | None) -> T:
    """``value``; NOT_SUPPORTED where the device has none (no fan, not a MIG instance)."""
    if value is None:
        raise _Status(ERROR_NOT_SUPPORTED)
    return value


def _pick(arg: Any, choices: dict[int, T], code: int = ERROR_INVALID_ARGUMENT) -> T:
    """The choice the C argument ``arg`` names; ``code`` for any other value."""
    try:
        return choices[_value(arg)]
    except KeyError:
        raise _Status(code) from None


def _clock_level(dev: _Target, clock_type: Any) -> Level:
    return _pick(clock_type, {CLOCK_SM: dev.gpu.sm_clock_mhz, CLOCK_MEM: dev.gpu.memory_clock_mhz}, ERROR_NOT_SUPPORTED)


_NUMBERS: dict[str, tuple[bool, Callable[..., float]]] = {
    "nvmlDeviceGetIndex": (True, lambda dev: dev.gpu.index),
    "nvmlDeviceGetArchitecture": (False, lambda dev: dev.gpu.architecture_id),
    "nvmlDeviceIsMigDeviceHandle": (False, lambda dev: dev.mig_index is not None),
    "nvmlDeviceGetGpuInstanceId": (False, lambda dev: _supported(dev.mig).gpu_instance_id),
    "nvmlDeviceGetComputeInstanceId": (False, lambda dev: _supported(dev.mig).compute_instance_id),
    "nvmlDeviceGetPowerUsage": (True, lambda dev: 1000 * dev.gpu.power_watts.at(dev.busy)),
    **dict.fromkeys(("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"),
                    (True, lambda dev: 1000 * dev.gpu.power_limit_watts)),
    "nvmlDeviceGetTemperature": (True, lambda dev, sensor: _pick(  # sensor 0: the GPU's
        sensor, {0: dev.gpu.temperature_celsius}).at(dev.busy)),
    "nvmlDeviceGetClockInfo": (True, lambda dev, clock_type: _clock_level(dev, clock_type).at(dev.busy)),
    "nvmlDeviceGetMaxClockInfo": (True, lambda dev, clock_type: max(astuple(_clock_level(dev, clock_type)))),
    "nvmlDeviceGetFanSpeed": (True, lambda dev: _supported(dev.gpu.fan_percent).at(dev.busy)),
    "nvmlDeviceGetPcieThroughput": (True, lambda dev, counter: 1024 * _pick(  # KB/s
        counter, {0: dev.gpu.pcie_tx_mib_s, 1: dev.gpu.pcie_rx_mib_s}).at(dev.busy)),
    "nvmlDeviceGetPerformanceState": (True, lambda dev: 0 if dev.busy >= 0.05 else 8),  # P0 busy, P8 idle
    "nvmlDeviceGetPersistenceMode": (False, lambda dev: 1),
    **dict.fromkeys(("nvmlDeviceGetComputeMode", "nvmlDeviceGetDisplayMode", "nvmlDeviceGetDisplayActive"),
                    (False, lambda dev: 0)),  # NVML_COMPUTEMODE_DEFAULT; display off
    "nvmlDeviceGetSupportedEventTypes": (False, lambda dev: SUPPORTED_EVENT_TYPES),
}
"""The device functions that write one number through their last argument: C name -> (whole GPU only, the
number, rounded, from the device and the arguments before that one)."""


class FakeNvmlLibrary:
    """The object installed as ``pynvml.nvmlLib``; attributes are NVML C functions: each ``nvml*`` method under its
    name and aliases, and each of :data:`_NUMBERS`, wrapped (instance attributes: pynvml never gets a bare method)."""

    def __init__(self, node: SimulatedNode) -> None:
        self.node = node
        self._init_count = 0
        self._event_sets: dict[int, _EventSet] = {}
        self._gpm_samples: dict[int, _GpmSample | None] = {}
        self._next_id = 1
        self._busy_so_far: dict[int, tuple[float, float]] = {}  # GPU index -> (t, busy seconds 0..t)
        for attr in [a for a in dir(type(self)) if a.startswith("nvml")]:
            method = getattr(self, attr)
            aliases, locked, whole = getattr(method, "nvml_symbol", ((), True, False))
            device = "dev" in inspect.signature(method).parameters  # its first argument: a device handle
            for name in (attr, *aliases):
                setattr(self, name, self._wrap(method, name, device, locked, whole))
        for name, (whole, number) in _NUMBERS.items():
            setattr(self, name, self._wrap(partial(_write_number, number), name, True, True, whole))

    def __getattr__(self, name: str) -> Callable[..., int]:
        raise AttributeError(f"simulated NVML has no function {name}")

    def functions(self) -> dict[str, Callable[..., int]]:
        """Every simulated C function by name, as pynvml finds it; ``setattr`` one to wrap it (bench/scrape.py)."""
        return {name: f for name, f in vars(self).items() if name.startswith("nvml")}

    # --- dispatch --------------------------------------------------------------------------

    def _wrap(self, method: Callable[..., int], name: str, device: bool, locked: bool,
              whole: bool) -> Callable[..., int]:
        node = self.node

        def call(*args: Any) -> int:
            with node.lock:
                node.call_counts[name] = node.call_counts.get(name, 0) + 1
            node.refresh_training()
            try:
                with node.lock if locked else contextlib.nullcontext():
                    self._check_loaded(name)
                    if device:
                        dev = self._resolve(args[0], name)
                        if whole and dev.mig_index is not None:
                            raise _Status(ERROR_NOT_SUPPORTED)
                        return method(dev, *args[1:])
                    return method(*args)
            except _Status as status:
                return status.code

        call.__name__ = name
        return call

    def _check_loaded(self, name: str) -> None:
        if name in ("nvmlInitWithFlags", "nvmlInit_v2", "nvmlShutdown"):
            return  # they check for themselves
        if self.node.scenario.driver_missing or self._init_count == 0:
            raise _Status(ERROR_UNINITIALIZED)
        if not self.node.driver_loaded:
            raise _Status(ERROR_DRIVER_NOT_LOADED)

    def _resolve(self, handle: Any, name: str) -> _Target:
        address = _address(handle)
        if address is None:
            raise _Status(ERROR_INVALID_ARGUMENT)
        index, rest = divmod(address, _GPU_HANDLE_STRIDE)
        index -= 1
        gpus = self.node.scenario.gpus
        if not 0 <= index < len(gpus) or rest % 0x100:
            raise _Status(ERROR_INVALID_ARGUMENT)
        gpu = gpus[index]
        mig_index = rest // 0x100 - 1 if rest else None
        if mig_index is not None and (gpu.mig_instances is None or mig_index >= len(gpu.mig_instances)):
            raise _Status(ERROR_INVALID_ARGUMENT)
        t = self.node.now()
        if self.node.is_lost(index, t):
            raise _Status(ERROR_GPU_IS_LOST)
        if self.node.is_not_supported(index, name, t):
            raise _Status(ERROR_NOT_SUPPORTED)
        return _Target(gpu, mig_index, t, self.node)

    @staticmethod
    def _handle(gpu: int, mig_index: int | None = None) -> int:
        return (gpu + 1) * _GPU_HANDLE_STRIDE + (0 if mig_index is None else (mig_index + 1) * 0x100)

    def _allocate(self, table: dict[int, Any], base: int, value: Any, ref: Any) -> int:
        """Put ``value`` in ``table`` under a new handle (an address from ``base`` on) and write it through ``ref``."""
        self._next_id += 1
        table[base + self._next_id * 0x10] = value
        return _write_pointer(ref, base + self._next_id * 0x10)

    # --- library and system ----------------------------------------------------------------

    @_symbol("nvmlInit_v2")
    def nvmlInitWithFlags(self, *flags: Any) -> int:
        if self.node.scenario.driver_missing:
            return ERROR_LIBRARY_NOT_FOUND
        if not self.node.driver_loaded:
            return ERROR_DRIVER_NOT_LOADED
        self._init_count += 1
        return SUCCESS

    def nvmlShutdown(self) -> int:
        if self._init_count == 0:
            return ERROR_UNINITIALIZED
        self._init_count -= 1
        return SUCCESS

    def nvmlSystemGetDriverVersion(self, buffer: Any, length: Any) -> int:
        return _write_string(buffer, length, self.node.scenario.driver_version)

    def nvmlSystemGetNVMLVersion(self, buffer: Any, length: Any) -> int:
        major = self.node.scenario.cuda_version.split(".")[0]
        return _write_string(buffer, length, f"{major}.{self.node.scenario.driver_version}")

    @_symbol("nvmlSystemGetCudaDriverVersion_v2")
    def nvmlSystemGetCudaDriverVersion(self, ref: Any) -> int:
        return _write_value(ref, self.node.scenario.cuda_version_number)

    def nvmlSystemGetProcessName(self, pid: Any, buffer: Any, length: Any) -> int:
        names = [p.name for gpu in self.node.scenario.gpus for p in gpu.processes if p.pid == _value(pid)]
        return _write_string(buffer, length, names[0]) if names else ERROR_NOT_FOUND

    # --- devices ---------------------------------------------------------------------------

    def nvmlDeviceGetCount_v2(self, ref: Any) -> int:
        return _write_value(ref, len(self.node.scenario.gpus))

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> int:
        i = _value(index)
        if not 0 <= i < len(self.node.scenario.gpus):
            return ERROR_INVALID_ARGUMENT
        if self.node.is_lost(i, self.node.now()):
            return ERROR_GPU_IS_LOST
        return _write_pointer(ref, self._handle(i))

    def nvmlDeviceGetHandleByUUID(self, uuid: Any, ref: Any) -> int:
        wanted = uuid.decode() if isinstance(uuid, bytes) else str(getattr(uuid, "value", b"").decode())
        for gpu in self.node.scenario.gpus:
            if gpu.uuid == wanted:
                return _write_pointer(ref, self._handle(gpu.index))
            for i, inst in enumerate(gpu.mig_instances or ()):
                if inst.uuid == wanted:
                    return _write_pointer(ref, self._handle(gpu.index, i))
        return ERROR_NOT_FOUND

    def nvmlDeviceGetName(self, dev: _Target, buffer: Any, length: Any) -> int:
        mig = dev.mig
        return _write_string(buffer, length, dev.gpu.name if mig is None else f"{dev.gpu.name} MIG {mig.profile}")

    def nvmlDeviceGetUUID(self, dev: _Target, buffer: Any, length: Any) -> int:
        return _write_string(buffer, length, dev.gpu.uuid if dev.mig is None else dev.mig.uuid)

    def nvmlDeviceGetPciInfo_v3(self, dev: _Target, ref: Any) -> int:
        info = _out(ref)
        domain, bus, rest = dev.gpu.pci_bus_id.split(":")
        slot = rest.split(".")[0]
        info.busId = dev.gpu.pci_bus_id.encode()
        info.busIdLegacy = f"{int(domain, 16):04X}:{bus}:{rest}".encode()
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(slot, 16)
        info.pciDeviceId = 0x233010DE if dev.gpu.architecture_id >= ARCH_HOPPER else 0x20B010DE
        info.pciSubSystemId = 0x16C110DE
        return SUCCESS

    # --- MIG -------------------------------------------------------------------------------

    @_symbol(whole=True)
    def nvmlDeviceGetMigMode(self, dev: _Target, current: Any, pending: Any) -> int:
        if dev.gpu.architecture_id < ARCH_AMPERE:
            return ERROR_NOT_SUPPORTED
        mode = int(dev.gpu.mig_instances is not None)
        _out(current).value = mode
        return _write_value(pending, mode)

    @_symbol(whole=True)
    def nvmlDeviceGetMaxMigDeviceCount(self, dev: _Target, ref: Any) -> int:
        if dev.gpu.architecture_id < ARCH_AMPERE:
            return ERROR_NOT_SUPPORTED
        return _write_value(ref, MAX_MIG_DEVICES if dev.gpu.mig_instances is not None else 0)

    @_symbol(whole=True)
    def nvmlDeviceGetMigDeviceHandleByIndex(self, dev: _Target, index: Any, ref: Any) -> int:
        if dev.gpu.mig_instances is None:
            return ERROR_INVALID_ARGUMENT
        i = _value(index)
        if not 0 <= i < MAX_MIG_DEVICES:
            return ERROR_INVALID_ARGUMENT
        if i >= len(dev.gpu.mig_instances):
            return ERROR_NOT_FOUND
        return _write_pointer(ref, self._handle(dev.gpu.index, i))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, dev: _Target, ref: Any) -> int:
        if dev.mig_index is None:
            return ERROR_INVALID_ARGUMENT
        return _write_pointer(ref, self._handle(dev.gpu.index))

    # --- utilization -----------------------------------------------------------------------

    def _pattern_for_samples(self, dev: _Target, sampling_type: int) -> Pattern:
        if dev.mig_index is not None or dev.gpu.mig_instances is not None:
            raise _Status(ERROR_NOT_SUPPORTED)  # no utilization counters in MIG mode
        return _pick(sampling_type, {GPU_UTILIZATION_SAMPLES: self.node.utilization_pattern(dev.gpu.index),
                                     MEMORY_UTILIZATION_SAMPLES: dev.gpu.memory_utilization}, ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetSamples(self, dev: _Target, sampling_type: Any, last_seen: Any, value_type: Any, count: Any,
                buffer: Any) -> int:
        pattern = self._pattern_for_samples(dev, _value(sampling_type))
        slots = self.node.recent_slots(self.node.sample_time(dev.gpu.index, dev.t), _value(last_seen))
        if not slots:
            return ERROR_NOT_FOUND
        _out(value_type).value = VALUE_TYPE_UNSIGNED_INT
        counter = _out(count)
        if buffer is None:
            return _write_value(count, len(slots))
        slots = slots[: min(counter.value, len(buffer))]
        for i, slot in enumerate(slots):
            buffer[i].timeStamp = self.node.slot_timestamp(slot)
            buffer[i].sampleValue.uiVal = round(100 * self.node.slot_mean(pattern, slot))
        return _write_value(count, len(slots))

    def nvmlDeviceGetUtilizationRates(self, dev: _Target, ref: Any) -> int:
        gpu_pattern = self._pattern_for_samples(dev, GPU_UTILIZATION_SAMPLES)
        util = _out(ref)
        util.gpu = round(100 * self.node.instant(gpu_pattern, self.node.sample_time(dev.gpu.index, dev.t)))
        util.memory = round(100 * self.node.instant(dev.gpu.memory_utilization, dev.t))
        return SUCCESS

    # --- memory ----------------------------------------------------------------------------

    def _memory(self, dev: _Target) -> tuple[int, int, int]:
        mig = dev.mig
        if mig is not None:
            return int(mig.memory_gib * GIB), 0, int(mig.memory_used_gib * GIB)
        gpu = dev.gpu
        return int(gpu.memory_gib * GIB), int(gpu.memory_reserved_gib * GIB), int(gpu.memory_used_gib * GIB)

    def nvmlDeviceGetMemoryInfo(self, dev: _Target, ref: Any) -> int:
        total, reserved, used = self._memory(dev)
        info = _out(ref)
        info.total, info.used, info.free = total, used + reserved, total - used - reserved
        return SUCCESS

    def nvmlDeviceGetMemoryInfo_v2(self, dev: _Target, ref: Any) -> int:
        info = _out(ref)
        if info.version != MEMORY_V2_VERSION:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        total, reserved, used = self._memory(dev)
        info.total, info.reserved, info.used, info.free = total, reserved, used, total - used - reserved
        return SUCCESS

    # --- power, thermals, clocks, PCIe -------------------------------------------------------

    @_symbol(whole=True)
    def nvmlDeviceGetTotalEnergyConsumption(self, dev: _Target, ref: Any) -> int:
        if dev.gpu.architecture_id < 5:
            return ERROR_NOT_SUPPORTED  # Volta and newer only
        power = dev.gpu.power_watts
        busy = self._busy_seconds_until(dev.gpu.index, dev.t)
        return _write_value(ref, round(1000 * (power.idle * dev.t + (power.busy - power.idle) * busy)))

    def _busy_seconds_until(self, index: int, t: float) -> float:
        """Busy seconds from 0 to t, integrated incrementally so long runs stay cheap."""
        since, busy = self._busy_so_far.get(index, (0.0, 0.0))
        if t < since:
            since, busy = 0.0, 0.0
        busy += integral(self.node.utilization_pattern(index), since, t)
        self._busy_so_far[index] = (t, busy)
        return busy

    @_symbol("nvmlDeviceGetCurrentClocksThrottleReasons", whole=True)
    def nvmlDeviceGetCurrentClocksEventReasons(self, dev: _Target, ref: Any) -> int:
        names = dev.gpu.clock_event_reasons
        if names is None:
            names = ("gpu_idle",) if dev.busy < 0.05 else ()
        return _write_value(ref, sum(CLOCK_EVENT_REASONS[name] for name in set(names)))  # distinct bits: sum is OR

    # --- static properties other NVML tools (e.g. nvitop) read --------------------------------

    def nvmlDeviceGetCudaComputeCapability(self, dev: _Target, major: Any, minor: Any) -> int:
        _out(major).value, _out(minor).value = COMPUTE_CAPABILITY[dev.gpu.architecture]
        return SUCCESS

    @_symbol("nvmlDeviceGetDecoderUtilization", whole=True)
    def nvmlDeviceGetEncoderUtilization(self, dev: _Target, ref: Any, period: Any) -> int:
        _out(ref).value, _out(period).value = 0, 167_000
        return SUCCESS

    # --- processes -------------------------------------------------------------------------

    def _processes(self, graphics: bool, dev: _Target, count: Any, buffer: Any) -> int:
        procs = [p for p in dev.gpu.processes
                 if p.graphics == graphics and (dev.mig_index is None or p.mig_instance == dev.mig_index)]
        counter = _out(count)
        if buffer is None or counter.value < len(procs):
            counter.value = len(procs)
            return ERROR_INSUFFICIENT_SIZE if procs else SUCCESS
        for i, p in enumerate(procs):
            inst = _Target(dev.gpu, p.mig_instance, dev.t, self.node).mig
            buffer[i].pid = p.pid
            buffer[i].usedGpuMemory = int(p.memory_gib * GIB)
            buffer[i].gpuInstanceId = NO_INSTANCE if inst is None else inst.gpu_instance_id
            buffer[i].computeInstanceId = NO_INSTANCE if inst is None else inst.compute_instance_id
        return _write_value(count, len(procs))

    nvmlDeviceGetComputeRunningProcesses_v3 = partialmethod(_processes, False)
    nvmlDeviceGetGraphicsRunningProcesses_v3 = partialmethod(_processes, True)

    def nvmlDeviceGetProcessUtilization(self, dev: _Target, buffer: Any, count: Any, last_seen: Any) -> int:
        pattern = self._pattern_for_samples(dev, GPU_UTILIZATION_SAMPLES)
        procs = dev.gpu.processes
        counter = _out(count)
        if not procs:
            return _write_value(count, 0)  # what drivers do with no processes (pynvml then raises NVMLError(0))
        slots = self.node.recent_slots(dev.t, _value(last_seen))
        if not slots:
            return ERROR_NOT_FOUND
        if buffer is None or counter.value < len(procs):
            counter.value = len(procs)
            return ERROR_INSUFFICIENT_SIZE
        slot = slots[-1]
        sm_share = self.node.slot_mean(pattern, slot) / len(procs)
        mem_share = self.node.slot_mean(dev.gpu.memory_utilization, slot) / len(procs)
        for i, p in enumerate(procs):
            buffer[i].pid = p.pid
            buffer[i].timeStamp = self.node.slot_timestamp(slot)
            buffer[i].smUtil = round(100 * (sm_share if p.sm_utilization is None else p.sm_utilization))
            buffer[i].memUtil = round(100 * (mem_share if p.memory_utilization is None
                                             else p.memory_utilization))
            buffer[i].encUtil = buffer[i].decUtil = 0
        return _write_value(count, len(procs))

    # --- events ----------------------------------------------------------------------------

    def nvmlEventSetCreate(self, ref: Any) -> int:
        return self._allocate(self._event_sets, _EVENT_SET_BASE, _EventSet(), ref)

    def _event_set(self, handle: Any) -> _EventSet:
        events = self._event_sets.get(_address(handle) or 0)
        if events is None:
            raise _Status(ERROR_INVALID_ARGUMENT)
        return events

    @_symbol(whole=True)
    def nvmlDeviceRegisterEvents(self, dev: _Target, event_types: Any, event_set: Any) -> int:
        events = self._event_set(event_set)
        types = _value(event_types)
        if types & ~SUPPORTED_EVENT_TYPES:
            return ERROR_NOT_SUPPORTED
        if types & EVENT_TYPE_XID:
            events.registered.setdefault(dev.gpu.index, dev.t)
        return SUCCESS

    def _pending(self, events: _EventSet) -> list[tuple[float, int, int]]:
        """The undelivered XID events of the registered GPUs since registration: (at, GPU index, position)."""
        return [(xid.at, index, position) for index, since in events.registered.items()
                for position, xid in enumerate(self.node.scenario.gpus[index].xid_events)
                if xid.at >= since and (index, position) not in events.delivered]

    @_symbol(locked=False)
    def nvmlEventSetWait_v2(self, event_set: Any, ref: Any, timeout_ms: Any) -> int:
        deadline = time.monotonic() + _value(timeout_ms) / 1000.0
        with self.node.changed:
            events = self._event_set(event_set)
            while True:
                if not self.node.driver_loaded:
                    return ERROR_DRIVER_NOT_LOADED
                t = self.node.now()
                pending = self._pending(events)
                due = [event for event in pending if event[0] <= t]
                if due:
                    _, index, position = min(due, key=lambda event: event[0])  # the earliest, first registered
                    events.delivered.add((index, position))
                    data = _out(ref)
                    data.device = ctypes.cast(ctypes.c_void_p(self._handle(index)), type(data.device))
                    data.eventType = EVENT_TYPE_XID
                    data.eventData = self.node.scenario.gpus[index].xid_events[position].xid
                    data.gpuInstanceId = data.computeInstanceId = NO_INSTANCE
                    return SUCCESS
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return ERROR_TIMEOUT
                # Sleep until the next scheduled event (state changes notify ``changed``); a short
                # floor keeps hand-driven test clocks, whose time moves without notice, responsive.
                next_at = min((at for at, _, _ in pending), default=float("inf"))
                self.node.changed.wait(min(remaining, max(0.02, next_at - t)))

    def nvmlEventSetFree(self, event_set: Any) -> int:
        return _free(self._event_sets, event_set)

    # --- GPM (Hopper and newer) --------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, dev: _Target, ref: Any) -> int:
        support = _out(ref)
        if support.version != GPM_VERSION:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        support.isSupportedDevice = int(dev.gpu.gpm)
        return SUCCESS

    def nvmlGpmSampleAlloc(self, ref: Any) -> int:
        return self._allocate(self._gpm_samples, _GPM_SAMPLE_BASE, None, ref)

    def nvmlGpmSampleFree(self, sample: Any) -> int:
        return _free(self._gpm_samples, sample)

    def _gpm_record(self, dev: _Target, mig_index: int | None, sample: Any) -> int:
        if not dev.gpu.gpm:
            return ERROR_NOT_SUPPORTED
        address = _address(sample)
        if address not in self._gpm_samples:
            return ERROR_INVALID_ARGUMENT
        self._gpm_samples[address] = _GpmSample(dev.t, dev.gpu.index, mig_index)
        return SUCCESS

    def nvmlGpmSampleGet(self, dev: _Target, sample: Any) -> int:
        return self._gpm_record(dev, dev.mig_index, sample)

    @_symbol(whole=True)
    def nvmlGpmMigSampleGet(self, dev: _Target, gpu_instance_id: Any, sample: Any) -> int:
        wanted = _value(gpu_instance_id)
        for i, inst in enumerate(dev.gpu.mig_instances or ()):
            if inst.gpu_instance_id == wanted:
                return self._gpm_record(dev, i, sample)
        return ERROR_INVALID_ARGUMENT

    def nvmlGpmMetricsGet(self, ref: Any) -> int:
        request = _out(ref)
        if request.version != GPM_VERSION:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        first = self._gpm_samples.get(_address(request.sample1) or 0)
        second = self._gpm_samples.get(_address(request.sample2) or 0)
        if first is None or second is None or (first.gpu, first.mig_index) != (second.gpu, second.mig_index):
            return ERROR_INVALID_ARGUMENT
        if second.t <= first.t or request.numMetrics > len(request.metrics):
            return ERROR_INVALID_ARGUMENT
        profile = self.node.profile(first.gpu, first.t, second.t, first.mig_index)
        values = {GPM_SM_UTIL: profile.sm, GPM_SM_OCCUPANCY: profile.occupancy, GPM_ANY_TENSOR_UTIL: profile.tensor,
                  GPM_DRAM_BW_UTIL: profile.dram}
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            known = metric.metricId in values
            metric.value = 100.0 * values[metric.metricId] if known else 0.0
            metric.nvmlReturn = SUCCESS if known else ERROR_NOT_SUPPORTED
        return SUCCESS
