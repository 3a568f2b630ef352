"""MIG instances of MIG-enabled GPUs: which exist, and their memory."""

from __future__ import annotations

from gpu_exporter.collectors.base import Families, PollContext, PollingCollector
from gpu_exporter.nvml import Gpu

LABELS = ("gpu", "uuid", "mig_uuid", "gpu_instance", "compute_instance")


class MigCollector(PollingCollector):
    """``gpu_mig_info`` and ``gpu_mig_memory_{used,total}_bytes``."""

    name = "mig"

    def poll_gpu(self, ctx: PollContext, gpu: Gpu, out: Families) -> None:
        for mig in gpu.mig_instances:
            labels = [*gpu.labels, mig.uuid, str(mig.gpu_instance), str(mig.compute_instance)]
            out.gauge("gpu_mig_info", "A MIG device (GPU instance + compute instance); always 1.",
                      (*LABELS, "profile")).add_metric([*labels, mig.profile], 1)
            memory = ctx.nvml.call(mig.uuid, "nvmlDeviceGetMemoryInfo", mig.handle)
            if memory is not None:
                out.gauge("gpu_mig_memory_used_bytes", "Memory in use on the MIG device.", LABELS).add_metric(
                    labels, memory.used)
                out.gauge("gpu_mig_memory_total_bytes", "Memory of the MIG device.", LABELS).add_metric(
                    labels, memory.total)
