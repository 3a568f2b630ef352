"""PCIe throughput. Each NVML PCIe throughput call samples for about 20 ms, so this collector
reads it at most every ``PCIE_INTERVAL_SECONDS`` and republishes the last values in between."""

from __future__ import annotations

import pynvml

from gpu_exporter import catalog
from gpu_exporter.collectors.base import Families, PollContext, PollingCollector
from gpu_exporter.nvml import Gpu

PCIE_INTERVAL_SECONDS = 10.0


class PcieCollector(PollingCollector):
    """``gpu_pcie_tx_bytes_per_second`` and ``gpu_pcie_rx_bytes_per_second``."""

    name = "pcie"

    def __init__(self) -> None:
        super().__init__()
        self._last_read: float | None = None

    def poll(self, ctx: PollContext) -> bool:
        if self._last_read is not None and ctx.now - self._last_read < PCIE_INTERVAL_SECONDS:
            return True
        self._last_read = ctx.now
        return super().poll(ctx)

    def poll_gpu(self, ctx: PollContext, gpu: Gpu, out: Families) -> None:
        for counter, family in ((pynvml.NVML_PCIE_UTIL_TX_BYTES, catalog.GPU_PCIE_TX_BYTES_PER_SECOND),
                                (pynvml.NVML_PCIE_UTIL_RX_BYTES, catalog.GPU_PCIE_RX_BYTES_PER_SECOND)):
            kbps = ctx.nvml.call(gpu.uuid, "nvmlDeviceGetPcieThroughput", gpu.handle, counter,
                                 variant=f"[{counter}]")
            if kbps is not None:
                out.of(family).add_metric(gpu.labels, kbps * 1000.0)
