"""MIG instances of MIG-enabled GPUs: which exist, and their memory."""

from __future__ import annotations

from gpu_exporter import catalog
from gpu_exporter.collectors.base import Families, PollContext, PollingCollector
from gpu_exporter.nvml import Gpu


class MigCollector(PollingCollector):
    """``gpu_mig_info`` and ``gpu_mig_memory_{used,total}_bytes``."""

    name = "mig"

    def poll_gpu(self, ctx: PollContext, gpu: Gpu, out: Families) -> None:
        for mig in gpu.mig_instances:
            labels = [*gpu.labels, mig.uuid, str(mig.gpu_instance), str(mig.compute_instance)]
            out.of(catalog.GPU_MIG_INFO).add_metric([*labels, mig.profile], 1)
            memory = ctx.nvml.call(mig.uuid, "nvmlDeviceGetMemoryInfo", mig.handle)
            if memory is not None:
                out.of(catalog.GPU_MIG_MEMORY_USED_BYTES).add_metric(labels, memory.used)
                out.of(catalog.GPU_MIG_MEMORY_TOTAL_BYTES).add_metric(labels, memory.total)
