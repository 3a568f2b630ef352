"""What every polling collector shares: per-poll metric families, cached exposition text.

A polling collector reads NVML on the sampler thread (:meth:`PollingCollector.poll`) and
publishes immutable metric families; the first scrape after a publication renders their text
exposition once and later scrapes reuse it, so no NVML call ever happens on the scrape path and
polls that no scrape reads cost no rendering.

Example::

    class Temperature(PollingCollector):
        name = "temperature"
        def poll_gpu(self, ctx, gpu, out):
            out.gauge("gpu_temperature_celsius", "GPU temperature.", ["gpu", "uuid"]).add_metric(
                gpu.labels, ctx.nvml.call(gpu.uuid, "nvmlDeviceGetTemperature", gpu.handle, 0))
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpu_exporter.exposition import render
from gpu_exporter.nvml import CallFailed, Gpu, GpuLost, Nvml

log = logging.getLogger(__name__)


@dataclass
class PollContext:
    """What one poll cycle sees: the NVML wrapper, the GPUs and the monotonic time of the cycle."""

    nvml: Nvml
    gpus: Sequence[Gpu]
    now: float
    lost: set[str] = field(default_factory=set)


class Families:
    """Metric families of one poll, created on first use and kept in creation order."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def gauge(self, name: str, documentation: str, labels: Sequence[str]) -> GaugeMetricFamily:
        """The gauge family ``name``, created on first use."""
        family = self._family(GaugeMetricFamily, name, documentation, labels)
        assert isinstance(family, GaugeMetricFamily)
        return family

    def counter(self, name: str, documentation: str, labels: Sequence[str]) -> CounterMetricFamily:
        """The counter family ``name`` (give the name without ``_total``), created on first use."""
        family = self._family(CounterMetricFamily, name, documentation, labels)
        assert isinstance(family, CounterMetricFamily)
        return family

    def _family(self, kind: type[Metric], name: str, documentation: str, labels: Sequence[str]) -> Metric:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = kind(name, documentation, labels=labels)  # type: ignore[call-arg]
        return family

    def collect(self) -> list[Metric]:
        """The families that received at least one sample."""
        return [f for f in self._families.values() if f.samples]


class PollingCollector:
    """Base class: override :meth:`poll_gpu` (per GPU) and optionally :meth:`finish_poll`."""

    name = "base"

    def __init__(self) -> None:
        self._families: list[Metric] = []
        self._text: bytes | None = b""
        self._lock = threading.Lock()

    def poll(self, ctx: PollContext) -> bool:
        """Read NVML for every GPU and publish the result; False when any GPU failed."""
        out = Families()
        ok = True
        for gpu in ctx.gpus:
            if gpu.uuid in ctx.lost:  # an earlier collector of this cycle found it gone
                ok = False
                continue
            try:
                self.poll_gpu(ctx, gpu, out)
            except GpuLost as err:
                log.warning("%s collector: %s", self.name, err)
                ctx.lost.add(gpu.uuid)
                ok = False
            except CallFailed as err:
                log.warning("%s collector: %s", self.name, err)
                ok = False
        self.finish_poll(ctx)
        self.publish(out.collect())
        return ok

    def publish(self, families: list[Metric]) -> None:
        """Make ``families`` what scrapes see; their text is rendered on the next scrape."""
        with self._lock:
            self._families, self._text = families, None

    @property
    def exposition(self) -> bytes:
        """Text exposition of the latest publication, rendered at most once per publication."""
        with self._lock:
            if self._text is None:
                self._text = render(self._families)
            return self._text

    def reset(self) -> None:
        """Forget all per-GPU state and published series (the driver went away)."""
        type(self).__init__(self)

    def poll_gpu(self, ctx: PollContext, gpu: Gpu, out: Families) -> None:
        """Read one GPU and add its samples to ``out``."""
        raise NotImplementedError

    def finish_poll(self, ctx: PollContext) -> None:
        """Hook after all GPUs were read (drop state of GPUs that are gone)."""

    def collect(self) -> Iterator[Metric]:
        """The families of the latest poll (the prometheus_client Collector protocol)."""
        return iter(self._families)
