"""Per-GPU static info, memory, power, energy, temperature, clocks, clock events and fan."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml

from gpu_exporter import catalog
from gpu_exporter.collectors.base import Families, PollContext, PollingCollector
from gpu_exporter.nvml import Gpu


class DeviceCollector(PollingCollector):
    """Everything NVML reports about a GPU as a whole, except utilization."""

    name = "device"
    clock_event_reasons: tuple[str, ...] = catalog.SLOWDOWN_REASONS
    """The ``reason`` values of gpu_clock_event_active (setting ``device.clock_event_reasons``)."""

    def poll_gpu(self, ctx: PollContext, gpu: Gpu, out: Families) -> None:
        call, uuid, h = ctx.nvml.call, gpu.uuid, gpu.handle
        node = ctx.nvml.node
        out.of(catalog.GPU_INFO).add_metric(
            [*gpu.labels, gpu.name, gpu.pci_bus_id, node.driver_version, node.cuda_version,
             "enabled" if gpu.mig_enabled else "disabled", gpu.architecture], 1)

        def add(family: catalog.MetricFamily, value: Any, unit: Callable[[Any], Any] = lambda x: x) -> None:
            """One sample of ``family``: ``value`` (None: NVML had none) in the family's unit."""
            if value is not None:
                out.of(family).add_metric(gpu.labels, unit(value))

        memory = (call(uuid, "nvmlDeviceGetMemoryInfo", h, pynvml.nvmlMemory_v2, variant="_v2")  # a struct, or None
                  or call(uuid, "nvmlDeviceGetMemoryInfo", h))
        if memory is not None:
            for attr, family in (("used", catalog.GPU_MEMORY_USED_BYTES), ("free", catalog.GPU_MEMORY_FREE_BYTES),
                                 ("total", catalog.GPU_MEMORY_TOTAL_BYTES),
                                 ("reserved", catalog.GPU_MEMORY_RESERVED_BYTES)):
                add(family, getattr(memory, attr, None))
        add(catalog.GPU_POWER_WATTS, call(uuid, "nvmlDeviceGetPowerUsage", h), lambda mw: mw * 1e-3)
        add(catalog.GPU_POWER_LIMIT_WATTS, call(uuid, "nvmlDeviceGetEnforcedPowerLimit", h), lambda mw: mw * 1e-3)
        add(catalog.GPU_ENERGY_JOULES_TOTAL, call(uuid, "nvmlDeviceGetTotalEnergyConsumption", h),
            lambda mj: mj / 1000.0)
        add(catalog.GPU_TEMPERATURE_CELSIUS, call(uuid, "nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU))
        for clock, family in (
            (pynvml.NVML_CLOCK_SM, catalog.GPU_SM_CLOCK_HERTZ),
            (pynvml.NVML_CLOCK_MEM, catalog.GPU_MEMORY_CLOCK_HERTZ),
        ):
            add(family, call(uuid, "nvmlDeviceGetClockInfo", h, clock, variant=f"[{clock}]"), lambda mhz: mhz * 1e6)

        reasons = call(uuid, "nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None:
            reasons = call(uuid, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        if reasons is not None:
            events = out.of(catalog.GPU_CLOCK_EVENT_ACTIVE)
            for reason in self.clock_event_reasons:
                events.add_metric([*gpu.labels, reason], 1 if reasons & catalog.CLOCK_EVENT_REASONS[reason] else 0)
        add(catalog.GPU_FAN_SPEED_RATIO, call(uuid, "nvmlDeviceGetFanSpeed", h), lambda percent: percent / 100.0)
