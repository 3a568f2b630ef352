"""What every polling collector shares: per-poll metric rows, and their text rendered on demand.

A polling collector reads NVML on the poller thread (:meth:`PollingCollector.poll`) and
publishes the values it read as plain rows (label values, value). The first time the text is
wanted after a publication (a scrape, or the poller preparing for an expected scrape) the
rows are rendered straight to text by ``exposition.Family``, which keeps each series' label
prefix from one render to the next; later scrapes reuse the text. So no NVML call ever
happens on the scrape path, a poll that no scrape reads (most of them: the exporter polls
every second, Prometheus scrapes every 15 s or so) costs only its NVML calls, and no
prometheus_client family object is built unless someone calls :meth:`PollingCollector.collect`.

Example::

    class Temperature(PollingCollector):
        name = "temperature"
        def poll_gpu(self, ctx, gpu, out):
            out.of(catalog.GPU_TEMPERATURE_CELSIUS).add_metric(
                gpu.labels, ctx.nvml.call(gpu.uuid, "nvmlDeviceGetTemperature", gpu.handle, 0))
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpu_exporter.catalog import COUNTER, MetricFamily
from gpu_exporter.exposition import Family, join_lines
from gpu_exporter.nvml import CallFailed, Gpu, GpuLost, Nvml

log = logging.getLogger(__name__)


class Discovery(NamedTuple):
    """The GPUs the poller found last, and the generation of that list: it grows whenever the list changes."""

    generation: int
    gpus: tuple[Gpu, ...]


@dataclass
class PollContext:
    """What one poll cycle sees: the NVML wrapper, the GPUs and the monotonic time of the cycle."""

    nvml: Nvml
    gpus: Sequence[Gpu]
    now: float
    lost: set[str] = field(default_factory=set)
    _processes: dict[str, dict[int, int]] = field(default_factory=dict)

    PROCESS_LISTS = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses")

    def processes(self, gpu: Gpu) -> dict[int, int]:
        """PID -> GPU memory bytes (0 when NVML does not say) of the processes NVML lists on ``gpu``.

        Read once per cycle: every collector that wants the list (``processes``, ``evidence``) shares it.
        """
        listed = self._processes.get(gpu.uuid)
        if listed is None:
            listed = {}
            for function in self.PROCESS_LISTS:
                for proc in self.nvml.call(gpu.uuid, function, gpu.handle) or ():
                    used = proc.usedGpuMemory if isinstance(proc.usedGpuMemory, int) else 0
                    listed[int(proc.pid)] = max(listed.get(int(proc.pid), 0), used)
            self._processes[gpu.uuid] = listed
        return listed


class Rows:
    """The samples of one metric family in one poll, as (label values, value) rows.

    It has the ``add_metric`` of prometheus_client's families, at the cost of a list append;
    the collector renders the rows to text, and :meth:`family` builds the real family for
    ``collect()``.

    >>> rows = Rows(GaugeMetricFamily, "gpu_temperature_celsius", "Temperature.", ("gpu",))
    >>> rows.add_metric(["0"], 41)
    >>> rows.family().samples[0].value
    41
    """

    __slots__ = ("documentation", "kind", "kind_name", "labels", "name", "rows")

    def __init__(self, kind: type[GaugeMetricFamily | CounterMetricFamily], name: str, documentation: str,
                 labels: Sequence[str]) -> None:
        self.kind, self.name, self.documentation, self.labels = kind, name, documentation, labels
        self.kind_name = "counter" if kind is CounterMetricFamily else "gauge"
        self.rows: list[tuple[Sequence[str], float]] = []

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        """Record one sample (label values in the order of the family's labels)."""
        self.rows.append((labels, value))

    def family(self) -> Metric:
        """The prometheus_client family with every recorded sample."""
        family = self.kind(self.name, self.documentation, labels=self.labels)
        for labels, value in self.rows:
            family.add_metric(labels, value)
        return family


class Families:
    """Metric rows of one poll, one :class:`Rows` per family, kept in creation order."""

    def __init__(self) -> None:
        self._families: dict[str, Rows] = {}

    def gauge(self, name: str, documentation: str, labels: Sequence[str]) -> Rows:
        """The rows of gauge family ``name``, created on first use."""
        return self._families.setdefault(name, Rows(GaugeMetricFamily, name, documentation, labels))

    def of(self, family: MetricFamily) -> Rows:
        """The rows of catalogued ``family`` (its name, type, help and labels), created on first use."""
        rows = self._families.get(family.base)
        if rows is None:
            kind = CounterMetricFamily if family.kind == COUNTER else GaugeMetricFamily
            rows = self._families[family.base] = Rows(kind, family.base, family.help, family.labels)
        return rows

    def collect(self) -> list[Rows]:
        """The families that received at least one sample."""
        return [f for f in self._families.values() if f.rows]


class PollingCollector:
    """Base class: override :meth:`poll_gpu` (per GPU) and optionally :meth:`finish_poll`."""

    name = "base"

    def __init__(self) -> None:
        self._rows: list[Rows] = []
        self._text: bytes | None = b""
        self._renderers: dict[str, Family] = {}
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
            except (GpuLost, CallFailed) as err:
                log.warning("%s collector: %s", self.name, err)
                if isinstance(err, GpuLost):
                    ctx.lost.add(gpu.uuid)
                ok = False
        self.finish_poll(ctx)
        self.publish(out.collect())
        return ok

    def publish(self, rows: list[Rows]) -> None:
        """Make ``rows`` what scrapes see; their text is rendered when first wanted."""
        with self._lock:
            self._rows, self._text = rows, None

    def _render(self) -> bytes:
        """Text of the latest publication (call with the lock held); series prefixes are reused."""
        renderers: dict[str, Family] = {}
        lines: list[str] = []
        for rows in self._rows:
            family = self._renderers.get(rows.name)
            if family is None or not family.matches(rows.kind_name, rows.documentation, rows.labels):
                family = Family(rows.name, rows.kind_name, rows.documentation, rows.labels)
            renderers[rows.name] = family
            family.lines(rows.rows, lines)
        self._renderers = renderers  # a family absent from this publication forgets its series
        return join_lines(lines)

    @property
    def exposition(self) -> bytes:
        """Text exposition of the latest publication, rendered at most once per publication.

        The same bytes object until the next publication (``exposition.Body`` relies on it).
        """
        with self._lock:
            if self._text is None:
                self._text = self._render()
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
        """The families of the latest poll (the prometheus_client Collector protocol; not the scrape path)."""
        with self._lock:
            rows = self._rows
        return iter([r.family() for r in rows])


@dataclass
class Assembly:
    """What ``build(assembly)`` of a source that does not poll gets (``collectors.build_sources``); ``built``:
    the sources built before it, by name. The poller is typed loosely: collectors never import upward."""

    config: Any
    nvml: Nvml
    poller: Any
    polling: Sequence[PollingCollector]
    simulated: Any = None
    built: dict[str, Any] = field(default_factory=dict)
