"""GPU and memory-controller utilization without aliasing.

NVML's utilization is the share of a short window (1/6 s to 1 s) in which a kernel ran; a
gauge scraped every 15 s sees one such window. This collector polls ``nvmlDeviceGetSamples``
with a cursor (the newest timestamp seen) every poll interval, takes the mean of the new
samples and integrates it over the interval into ``gpu_busy_seconds_total``, so that
``rate(gpu_busy_seconds_total[w])`` is the true mean over any window ``w``. Where samples are
unavailable (idle GPU: NOT_FOUND; old driver: NOT_SUPPORTED) it falls back to the instant
``nvmlDeviceGetUtilizationRates``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pynvml

from gpu_exporter import catalog
from gpu_exporter.collectors.base import Families, PollContext, PollingCollector
from gpu_exporter.nvml import Gpu


@dataclass
class BusyIntegrator:
    """Running busy-time integral of one utilization signal of one GPU.

    >>> b = BusyIntegrator()
    >>> _ = b.advance(0.5, now=10.0); _ = b.advance(0.5, now=12.0); b.busy_seconds
    1.0
    """

    cursor: int = 0
    busy_seconds: float = 0.0
    ratio: float | None = None
    last_poll: float | None = None

    def advance(self, ratio: float, now: float) -> float:
        """Account ``ratio`` as the mean since the previous poll, which ended at ``now``; returns it clamped to 0-1."""
        ratio = min(max(ratio, 0.0), 1.0)
        if self.last_poll is not None and now > self.last_poll:
            self.busy_seconds += ratio * (now - self.last_poll)
        self.ratio = ratio
        self.last_poll = now
        return ratio


class UtilizationCollector(PollingCollector):
    """``gpu_busy_seconds_total`` / ``gpu_utilization_ratio`` and the memory-controller pair."""

    name = "utilization"
    _SIGNALS = (
        (pynvml.NVML_GPU_UTILIZATION_SAMPLES, "gpu", catalog.GPU_BUSY_SECONDS_TOTAL, catalog.GPU_UTILIZATION_RATIO),
        (pynvml.NVML_MEMORY_UTILIZATION_SAMPLES, "memory", catalog.GPU_MEMORY_BUSY_SECONDS_TOTAL,
         catalog.GPU_MEMORY_UTILIZATION_RATIO),
    )

    def __init__(self) -> None:
        super().__init__()
        self._state: dict[tuple[str, int], BusyIntegrator] = {}

    def poll_gpu(self, ctx: PollContext, gpu: Gpu, out: Families) -> None:
        rates: list[Any] = []
        for kind, field, counter, gauge in self._SIGNALS:
            state = self._state.setdefault((gpu.uuid, kind), BusyIntegrator())
            ratio = self._sampled_ratio(ctx, gpu, kind, state)
            if ratio is None:
                if not rates:
                    rates.append(ctx.nvml.call(gpu.uuid, "nvmlDeviceGetUtilizationRates", gpu.handle))
                ratio = getattr(rates[0], field) / 100.0 if rates[0] is not None else None
            if ratio is None:
                continue
            ratio = state.advance(ratio, ctx.now)
            out.of(counter).add_metric(gpu.labels, state.busy_seconds)
            out.of(gauge).add_metric(gpu.labels, ratio)

    @staticmethod
    def _sampled_ratio(ctx: PollContext, gpu: Gpu, kind: int, state: BusyIntegrator) -> float | None:
        result = ctx.nvml.call(gpu.uuid, "nvmlDeviceGetSamples", gpu.handle, kind, state.cursor,
                               variant=f"[{kind}]")
        if not result or not result[1]:
            return None
        samples = result[1]
        state.cursor = max(state.cursor, *(int(s.timeStamp) for s in samples))
        return sum(int(s.sampleValue.uiVal) for s in samples) / (100.0 * len(samples))

    def finish_poll(self, ctx: PollContext) -> None:
        present = {gpu.uuid for gpu in ctx.gpus} - ctx.lost
        self._state = {key: value for key, value in self._state.items() if key[0] in present}
