"""Per-GPU static info, memory, power, energy, temperature, clocks, clock events and fan."""

from __future__ import annotations

import pynvml

from gpu_exporter.collectors.base import Families, PollContext, PollingCollector
from gpu_exporter.nvml import Gpu

LABELS = ("gpu", "uuid")
INFO_LABELS = ("gpu", "uuid", "name", "pci_bus_id", "driver_version", "cuda_version", "mig_mode",
               "architecture")

# NVML clock event (throttle) reason bits and the label value each gets.
CLOCK_EVENT_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

_MIB = 1024 * 1024


class DeviceCollector(PollingCollector):
    """Everything NVML reports about a GPU as a whole, except utilization."""

    name = "device"

    def poll_gpu(self, ctx: PollContext, gpu: Gpu, out: Families) -> None:
        call, uuid, h = ctx.nvml.call, gpu.uuid, gpu.handle
        node = ctx.nvml.node
        out.gauge("gpu_info", "Static attributes of the GPU; always 1.", INFO_LABELS).add_metric(
            [*gpu.labels, gpu.name, gpu.pci_bus_id, node.driver_version, node.cuda_version,
             "enabled" if gpu.mig_enabled else "disabled", gpu.architecture], 1)

        memory = call(uuid, "nvmlDeviceGetMemoryInfo", h, pynvml.nvmlMemory_v2, variant="_v2")
        if memory is None:
            memory = call(uuid, "nvmlDeviceGetMemoryInfo", h)
        if memory is not None:
            for attr, doc in (("used", "Framebuffer memory in use."), ("free", "Framebuffer memory free."),
                              ("total", "Framebuffer memory installed."),
                              ("reserved", "Framebuffer memory reserved by the driver and firmware.")):
                value = getattr(memory, attr, None)
                if value is not None:
                    out.gauge(f"gpu_memory_{attr}_bytes", doc, LABELS).add_metric(gpu.labels, value)

        for function, metric, doc, scale in (
            ("nvmlDeviceGetPowerUsage", "gpu_power_watts", "Power draw in watts.", 1e-3),
            ("nvmlDeviceGetEnforcedPowerLimit", "gpu_power_limit_watts", "Enforced power limit in watts.", 1e-3),
        ):
            value = call(uuid, function, h)
            if value is not None:
                out.gauge(metric, doc, LABELS).add_metric(gpu.labels, value * scale)

        energy = call(uuid, "nvmlDeviceGetTotalEnergyConsumption", h)
        if energy is not None:
            out.counter("gpu_energy_joules", "Energy consumed since the driver loaded, in joules.",
                        LABELS).add_metric(gpu.labels, energy / 1000.0)

        temperature = call(uuid, "nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU)
        if temperature is not None:
            out.gauge("gpu_temperature_celsius", "GPU die temperature in degrees Celsius.",
                      LABELS).add_metric(gpu.labels, temperature)

        for clock, metric, doc in (
            (pynvml.NVML_CLOCK_SM, "gpu_sm_clock_hertz", "Current SM clock in hertz."),
            (pynvml.NVML_CLOCK_MEM, "gpu_memory_clock_hertz", "Current memory clock in hertz."),
        ):
            mhz = call(uuid, "nvmlDeviceGetClockInfo", h, clock, variant=f"[{clock}]")
            if mhz is not None:
                out.gauge(metric, doc, LABELS).add_metric(gpu.labels, mhz * 1e6)

        reasons = call(uuid, "nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None:
            reasons = call(uuid, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        if reasons is not None:
            family = out.gauge("gpu_clock_event_active",
                               "1 while the clock event (throttle) reason is active, else 0.", (*LABELS, "reason"))
            for bit, reason in CLOCK_EVENT_REASONS:
                family.add_metric([*gpu.labels, reason], 1 if reasons & bit else 0)

        fan = call(uuid, "nvmlDeviceGetFanSpeed", h)
        if fan is not None:
            out.gauge("gpu_fan_speed_ratio", "Fan speed as a share of its maximum (0-1).",
                      LABELS).add_metric(gpu.labels, fan / 100.0)
