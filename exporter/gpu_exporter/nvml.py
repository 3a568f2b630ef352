"""The only module that talks to pynvml: init, device discovery, MIG, and error bookkeeping.

Every NVML call goes through :meth:`Nvml.call`, which

* remembers calls that are NOT_SUPPORTED (or missing from an old driver) per device and
  never repeats them,
* counts every other failure by function and error name (``gpu_exporter_nvml_errors_total``),
* turns "GPU is lost" and "driver gone" into exceptions the poller acts on.

Example::

    nvml = Nvml()
    nvml.init()                      # raises DriverNotFound without a driver
    for gpu in nvml.discover():
        used = nvml.call(gpu.uuid, "nvmlDeviceGetMemoryInfo", gpu.handle)
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pynvml

log = logging.getLogger(__name__)


def _named(prefix: str, skip: str = "") -> dict[int, str]:
    """pynvml's integer constants ``prefix<NAME>`` (but ``skip``) by value: ``<name>`` in lower case."""
    return {getattr(pynvml, name): name[len(prefix):].lower() for name in dir(pynvml)
            if name.startswith(prefix) and name != skip and isinstance(getattr(pynvml, name), int)}


_ERROR_NAMES = _named("NVML_ERROR_")
_UNSUPPORTED = {pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}
_DRIVER_GONE = {pynvml.NVML_ERROR_UNINITIALIZED, pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, pynvml.NVML_ERROR_LIBRARY_NOT_FOUND}
# No new samples (NOT_FOUND, NO_DATA; pynvml raises SUCCESS when a size query finds nothing) or
# an event wait that timed out: not an error.
_NO_DATA = {pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_NO_DATA, pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_TIMEOUT}

_ARCHITECTURES = _named("NVML_DEVICE_ARCH_", skip="NVML_DEVICE_ARCH_UNKNOWN")


def error_name(code: int) -> str:
    """Short snake-case name of an NVML return code.

    >>> error_name(pynvml.NVML_ERROR_GPU_IS_LOST)
    'gpu_is_lost'
    """
    return _ERROR_NAMES.get(code, f"code_{code}")


class DriverNotFound(RuntimeError):
    """NVML could not be initialised: no NVIDIA driver, or the library is missing."""


class DriverLost(RuntimeError):
    """NVML stopped answering (driver unloaded or reloaded); re-initialise."""


class GpuLost(RuntimeError):
    """One GPU fell off the bus or stopped responding."""


class CallFailed(RuntimeError):
    """An NVML call failed with an error other than NOT_SUPPORTED."""


def handle_key(handle: Any) -> int:
    """A hashable identity for an NVML device handle (its pointer value)."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class MigInstance:
    """A MIG device (GPU instance + compute instance) carved out of a GPU."""

    uuid: str
    handle: Any
    gpu_instance: int
    compute_instance: int
    profile: str


@dataclass(frozen=True)
class Gpu:
    """A physical GPU as found at discovery."""

    index: int
    uuid: str
    handle: Any
    name: str
    pci_bus_id: str
    architecture: str
    mig_enabled: bool
    mig_instances: tuple[MigInstance, ...] = ()

    @property
    def labels(self) -> list[str]:
        """Values of the ``gpu`` and ``uuid`` labels."""
        return [str(self.index), self.uuid]


@dataclass(frozen=True)
class NodeInfo:
    """Driver-wide facts read once per initialisation."""

    driver_version: str = ""
    cuda_version: str = ""


@dataclass
class Nvml:
    """Stateful NVML access with per-device NOT_SUPPORTED memory and error counters."""

    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    initialized: bool = False
    node: NodeInfo = field(default_factory=NodeInfo)
    _unsupported: set[tuple[str, str]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def init(self) -> None:
        """Initialise NVML; raise DriverNotFound with one sentence when there is no driver."""
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            self._count("nvmlInit", err.value)
            raise DriverNotFound(
                f"NVML could not be initialised ({error_name(err.value)}): the NVIDIA driver was not found "
                "or is not loaded. Install the driver (or run with --simulate to see the exporter without a GPU)."
            ) from None
        self.initialized = True
        with self._lock:
            self._unsupported.clear()
        driver = self.call("system", "nvmlSystemGetDriverVersion")
        cuda = self.call("system", "nvmlSystemGetCudaDriverVersion_v2") or self.call(
            "system", "nvmlSystemGetCudaDriverVersion")
        self.node = NodeInfo(driver_version=_text(driver) if driver is not None else "",
                             cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else "")

    def shutdown(self) -> None:
        """Shut NVML down, ignoring errors (the driver may already be gone)."""
        if self.initialized:
            self.initialized = False
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()

    def _count(self, function: str, code: int) -> None:
        with self._lock:
            self.errors[(function, error_name(code))] += 1

    def call(self, key: str, function: str, *args: Any, variant: str = "") -> Any:
        """Call ``pynvml.<function>(*args)`` for device ``key``; None when unsupported or no data.

        ``variant`` tells apart calls of one function that may be supported differently (for
        example memory info v1 and v2); it is part of what NOT_SUPPORTED memory remembers.

        NOT_SUPPORTED is remembered for (key, function) and the call is never made again;
        NOT_FOUND / NO_DATA (no new samples) return None silently. GPU_IS_LOST raises GpuLost,
        a vanished driver raises DriverLost, anything else is counted and raises CallFailed.
        """
        name = function + variant
        if (key, name) in self._unsupported:
            return None
        try:
            return getattr(pynvml, function)(*args)
        except pynvml.NVMLError as err:
            code = int(err.value)
            if code in _NO_DATA:
                return None
            self._count(function, code)
            if code in _UNSUPPORTED:
                with self._lock:
                    self._unsupported.add((key, name))
                log.debug("%s is not supported on %s; not asking again", name, key)
                return None
            if code == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(f"{key}: {function} failed: GPU is lost") from None
            if code in _DRIVER_GONE:
                raise DriverLost(f"{function} failed: {error_name(code)}") from None
            raise CallFailed(f"{key}: {function} failed: {error_name(code)}") from None

    def discover(self) -> list[Gpu]:
        """Enumerate GPUs and their MIG instances; GPUs that fail to answer are skipped."""
        count = self.call("system", "nvmlDeviceGetCount") or 0
        gpus = []
        for index in range(count):
            try:
                gpus.append(self._describe(index))
            except (GpuLost, CallFailed) as err:
                log.warning("GPU %d skipped at discovery: %s", index, err)
        return gpus

    def _describe(self, index: int) -> Gpu:
        key = f"gpu{index}"
        handle = self.call(key, "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            raise CallFailed(f"{key}: no handle")
        uuid = _text(self.call(key, "nvmlDeviceGetUUID", handle))
        pci = self.call(uuid, "nvmlDeviceGetPciInfo_v3", handle)
        arch = self.call(uuid, "nvmlDeviceGetArchitecture", handle)
        mig_mode = self.call(uuid, "nvmlDeviceGetMigMode", handle)
        mig_enabled = bool(mig_mode and mig_mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE)
        return Gpu(index=index, uuid=uuid, handle=handle,
                   name=_text(self.call(uuid, "nvmlDeviceGetName", handle) or ""),
                   pci_bus_id=_text(pci.busId) if pci is not None else "",
                   architecture=_ARCHITECTURES.get(arch, "unknown"), mig_enabled=mig_enabled,
                   mig_instances=self._mig_instances(uuid, handle) if mig_enabled else ())

    def _mig_instances(self, uuid: str, handle: Any) -> tuple[MigInstance, ...]:
        instances = []
        for slot in range(self.call(uuid, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
            mig = self.call(uuid, "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
            if mig is None:
                continue
            mig_uuid = _text(self.call(uuid, "nvmlDeviceGetUUID", mig))
            name = _text(self.call(mig_uuid, "nvmlDeviceGetName", mig) or "")
            instances.append(MigInstance(
                uuid=mig_uuid, handle=mig,
                gpu_instance=int(self.call(mig_uuid, "nvmlDeviceGetGpuInstanceId", mig) or 0),
                compute_instance=int(self.call(mig_uuid, "nvmlDeviceGetComputeInstanceId", mig) or 0),
                profile=name.rpartition("MIG ")[2]))  # "NVIDIA A100 MIG 1g.5gb" -> "1g.5gb"
        return tuple(instances)
