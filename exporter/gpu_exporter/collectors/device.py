"""Per-GPU static info, memory, power, energy, temperature, clocks, clock events and fan."""

from __future__ import annotations

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

        memory = (call(uuid, "nvmlDeviceGetMemoryInfo", h, pynvml.nvmlMemory_v2, variant="_v2")  # a struct, or None
                  or call(uuid, "nvmlDeviceGetMemoryInfo", h))
        if memory is not None:
            for attr, family in (("used", catalog.GPU_MEMORY_USED_BYTES), ("free", catalog.GPU_MEMORY_FREE_BYTES),
                                 ("total", catalog.GPU_MEMORY_TOTAL_BYTES),
                                 ("reserved", catalog.GPU_MEMORY_RESERVED_BYTES)):
                value = getattr(memory, attr, None)
                if value is not None:
                    out.of(family).add_metric(gpu.labels, value)

        for function, family in (
            ("nvmlDeviceGetPowerUsage", catalog.GPU_POWER_WATTS),
            ("nvmlDeviceGetEnforcedPowerLimit", catalog.GPU_POWER_LIMIT_WATTS),
        ):
            value = call(uuid, function, h)
            if value is not None:
                out.of(family).add_metric(gpu.labels, value * 1e-3)  # milliwatts

        energy = call(uuid, "nvmlDeviceGetTotalEnergyConsumption", h)
        if energy is not None:
            out.of(catalog.GPU_ENERGY_JOULES_TOTAL).add_metric(gpu.labels, energy / 1000.0)

        temperature = call(uuid, "nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU)
        if temperature is not None:
            out.of(catalog.GPU_TEMPERATURE_CELSIUS).add_metric(gpu.labels, temperature)

        for clock, family in (
            (pynvml.NVML_CLOCK_SM, catalog.GPU_SM_CLOCK_HERTZ),
            (pynvml.NVML_CLOCK_MEM, catalog.GPU_MEMORY_CLOCK_HERTZ),
        ):
            mhz = call(uuid, "nvmlDeviceGetClockInfo", h, clock, variant=f"[{clock}]")
            if mhz is not None:
                out.of(family).add_metric(gpu.labels, mhz * 1e6)

        reasons = call(uuid, "nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None:
            reasons = call(uuid, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        if reasons is not None:
            events = out.of(catalog.GPU_CLOCK_EVENT_ACTIVE)
            for reason in self.clock_event_reasons:
                events.add_metric([*gpu.labels, reason], 1 if reasons & catalog.CLOCK_EVENT_REASONS[reason] else 0)

        fan = call(uuid, "nvmlDeviceGetFanSpeed", h)
        if fan is not None:
            out.of(catalog.GPU_FAN_SPEED_RATIO).add_metric(gpu.labels, fan / 100.0)
