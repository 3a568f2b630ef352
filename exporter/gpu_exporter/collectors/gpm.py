"""GPU Performance Monitoring (Hopper and newer): SM active, SM occupancy, tensor active and
DRAM bandwidth, for whole GPUs and for each MIG instance (where NVML's utilization calls are
NOT_SUPPORTED). Each target keeps two NVML GPM samples; every poll fills the older one and
asks NVML for the metrics between the two (they must be more than 100 ms apart)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import pynvml

from gpu_exporter import catalog
from gpu_exporter.collectors.base import Families, PollContext, PollingCollector
from gpu_exporter.nvml import Gpu, Nvml

MIN_SPACING_SECONDS = 0.1
METRICS = (
    (pynvml.NVML_GPM_METRIC_SM_UTIL, catalog.GPU_SM_ACTIVE_RATIO),
    (pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, catalog.GPU_SM_OCCUPANCY_RATIO),
    (pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, catalog.GPU_TENSOR_ACTIVE_RATIO),
    (pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, catalog.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO),
)


@dataclass
class _Target:
    """Two GPM sample buffers for one GPU or MIG instance."""

    older: Any
    newer: Any
    taken_at: float | None = None


class GpmCollector(PollingCollector):
    """The ``gpu_*_ratio`` GPM families, labelled with ``mig_uuid`` ("" for the whole GPU)."""

    name = "gpm"

    def __init__(self) -> None:
        super().__init__()
        self._supported: dict[str, bool] = {}
        self._targets: dict[tuple[str, str], _Target] = {}

    def poll_gpu(self, ctx: PollContext, gpu: Gpu, out: Families) -> None:
        if not self._is_supported(ctx.nvml, gpu):
            return
        targets: list[tuple[str, int | None]] = [("", None)]
        targets += [(mig.uuid, mig.gpu_instance) for mig in gpu.mig_instances]
        for mig_uuid, gpu_instance in targets:
            values = self._read(ctx, gpu, mig_uuid, gpu_instance)
            for (_, family), value in zip(METRICS, values, strict=True):
                if value is not None:
                    out.of(family).add_metric([*gpu.labels, mig_uuid], value / 100.0)

    def _is_supported(self, nvml: Nvml, gpu: Gpu) -> bool:
        if gpu.uuid not in self._supported:
            support = nvml.call(gpu.uuid, "nvmlGpmQueryDeviceSupport", gpu.handle)
            self._supported[gpu.uuid] = bool(support is not None and support.isSupportedDevice)
        return self._supported[gpu.uuid]

    def _read(self, ctx: PollContext, gpu: Gpu, mig_uuid: str, gpu_instance: int | None) -> list[float | None]:
        nvml = ctx.nvml
        key = (gpu.uuid, mig_uuid)
        target = self._targets.get(key)
        if target is None:
            older = nvml.call(gpu.uuid, "nvmlGpmSampleAlloc")
            newer = nvml.call(gpu.uuid, "nvmlGpmSampleAlloc")
            if older is None or newer is None:
                return [None] * len(METRICS)
            target = self._targets[key] = _Target(older, newer)
        if target.taken_at is not None and ctx.now - target.taken_at < MIN_SPACING_SECONDS:
            return [None] * len(METRICS)
        if gpu_instance is None:
            nvml.call(gpu.uuid, "nvmlGpmSampleGet", gpu.handle, target.older)
        else:
            nvml.call(gpu.uuid, "nvmlGpmMigSampleGet", gpu.handle, gpu_instance, target.older)
        target.older, target.newer = target.newer, target.older
        first = target.taken_at is None
        target.taken_at = ctx.now
        if first:
            return [None] * len(METRICS)
        request = pynvml.c_nvmlGpmMetricsGet_t(version=pynvml.NVML_GPM_METRICS_GET_VERSION, numMetrics=len(METRICS),
                                               sample1=target.older, sample2=target.newer)
        for i, (metric_id, _) in enumerate(METRICS):
            request.metrics[i].metricId = metric_id
        if nvml.call(gpu.uuid, "nvmlGpmMetricsGet", request) is None:
            return [None] * len(METRICS)
        return [float(request.metrics[i].value) if request.metrics[i].nvmlReturn == 0 else None
                for i in range(len(METRICS))]

    def finish_poll(self, ctx: PollContext) -> None:
        present = {gpu.uuid for gpu in ctx.gpus} - ctx.lost
        for key in [k for k in self._targets if k[0] not in present]:
            target = self._targets.pop(key)
            for sample in (target.older, target.newer):
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlGpmSampleFree(sample)
        self._supported = {uuid: ok for uuid, ok in self._supported.items() if uuid in present}
