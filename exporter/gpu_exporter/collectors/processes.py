"""Per-process GPU memory and SM utilization, labelled by pid and process name.

Series exist only while NVML lists the process, so they vanish when it ends. PIDs are host
PIDs (NVML reports them even inside containers). Process names come from
``nvmlSystemGetProcessName`` and are cached per pid while the process lives.
"""

from __future__ import annotations

from typing import Any

from gpu_exporter import catalog
from gpu_exporter.collectors.base import Families, PollContext, PollingCollector
from gpu_exporter.nvml import Gpu


class ProcessCollector(PollingCollector):
    """``gpu_process_memory_used_bytes`` and ``gpu_process_sm_utilization_ratio``."""

    name = "processes"

    def __init__(self) -> None:
        super().__init__()
        self._names: dict[int, str] = {}
        self._cursor: dict[str, int] = {}
        self._seen_pids: set[int] = set()

    def poll_gpu(self, ctx: PollContext, gpu: Gpu, out: Families) -> None:
        memory = ctx.processes(gpu)
        # No process listed, nothing to label: skip the per-process samples (one NVML call per GPU
        # per poll on an idle node). Buffered samples are read on the next poll that lists one.
        sm = self._sm_utilization(ctx, gpu) if memory else {}
        mem_family = out.of(catalog.GPU_PROCESS_MEMORY_USED_BYTES)
        sm_family = out.of(catalog.GPU_PROCESS_SM_UTILIZATION_RATIO)
        for pid in sorted(memory.keys() | sm.keys()):
            labels = [*gpu.labels, str(pid), self._name(ctx, gpu, pid)]
            self._seen_pids.add(pid)
            mem_family.add_metric(labels, memory.get(pid, 0))
            sm_family.add_metric(labels, sm.get(pid, 0.0))

    def _sm_utilization(self, ctx: PollContext, gpu: Gpu) -> dict[int, float]:
        samples: Any = ctx.nvml.call(gpu.uuid, "nvmlDeviceGetProcessUtilization", gpu.handle,
                                     self._cursor.get(gpu.uuid, 0))
        latest: dict[int, tuple[int, float]] = {}
        for s in samples or ():
            stamp = int(s.timeStamp)
            if stamp >= latest.get(int(s.pid), (-1, 0.0))[0]:
                latest[int(s.pid)] = (stamp, min(int(s.smUtil), 100) / 100.0)
            self._cursor[gpu.uuid] = max(self._cursor.get(gpu.uuid, 0), stamp)
        return {pid: value for pid, (_, value) in latest.items()}

    def _name(self, ctx: PollContext, gpu: Gpu, pid: int) -> str:
        name = self._names.get(pid)
        if name is None:
            raw = ctx.nvml.call(gpu.uuid, "nvmlSystemGetProcessName", pid)
            if isinstance(raw, bytes):
                raw = raw.decode(errors="replace")
            name = self._names[pid] = (str(raw) if raw else "").rsplit("/", 1)[-1] or "unknown"
        return name

    def poll(self, ctx: PollContext) -> bool:
        self._seen_pids = set()
        return super().poll(ctx)

    def finish_poll(self, ctx: PollContext) -> None:
        self._names = {pid: name for pid, name in self._names.items() if pid in self._seen_pids}
        present = {gpu.uuid for gpu in ctx.gpus}
        self._cursor = {uuid: ts for uuid, ts in self._cursor.items() if uuid in present}
