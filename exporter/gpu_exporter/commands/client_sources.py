"""A node's GPU metrics as a :class:`~gpu_exporter.verdict.samples.Snapshot` per read, for ``query`` and ``diagnose``.

Three sources, one shape: an exporter's ``/metrics`` page (:class:`ExporterSource`), a dcgm-exporter's
(:class:`DcgmSource`), and NVML in this process through the exporter's own collectors (:class:`NvmlSource`, also
on simulated GPUs); :func:`read_after` waits for a new NVML poll. Example::

    source = ExporterSource("http://127.0.0.1:9445")
    first = source.read(); time.sleep(1); second = source.read()
    busy = second.value("gpu_busy_seconds_total", gpu="0") - first.value("gpu_busy_seconds_total", gpu="0")
    utilization = busy / (second.at - first.at)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter import catalog
from gpu_exporter.commands.client_http import Connection, MetricsError, fetch, normalize_url
from gpu_exporter.verdict.samples import Snapshot, snapshot_of


class NoDriver(MetricsError):
    """The NVIDIA driver (libnvidia-ml) is not there: the command exits with EXIT_NO_DRIVER."""


class Source(Protocol):
    """Anything that returns a Snapshot per read (an exporter or in-process NVML)."""

    def read(self) -> Snapshot: ...


def new_poll_gap(source: Source) -> float:
    """How much newer a reading's NVML poll must be to count as a new poll: half the poll interval (two scrapes of
    one poll differ in ``at`` by the scrape-time jitter, two polls by the poll interval); 0 in-process, which polls
    on every read."""
    return float(getattr(source, "poll_interval", 0.0)) / 2


def read_after(source: Source, after: float, patience: float, min_gap: float | None = None) -> Snapshot:
    """The first reading whose NVML poll is at least ``min_gap`` (default :func:`new_poll_gap`) newer than ``after``;
    after ``patience`` seconds the latest reading (the caller checks ``snapshot.at`` for a repeated poll)."""
    gap = max(new_poll_gap(source) if min_gap is None else min_gap, 1e-6)
    deadline = time.monotonic() + patience
    while True:
        snapshot = source.read()
        if snapshot.at >= after + gap or time.monotonic() >= deadline:
            return snapshot
        time.sleep(min(0.1, max(gap / 4, 0.01)))


class ExporterSource:
    """Scrapes a running gpu-exporter's metrics page.

    >>> ExporterSource("127.0.0.1:9445").url
    'http://127.0.0.1:9445/metrics'
    """

    def __init__(self, url: str, timeout: float = 5.0, connection: Connection | None = None) -> None:
        from gpu_exporter.config import DEFAULTS

        self.url = normalize_url(url, "/metrics", "exporter")
        self.timeout = timeout
        self.connection = connection or Connection()
        self.poll_interval = float(DEFAULTS.poll_interval)
        """``gpu_exporter_poll_interval_seconds`` once a scrape shows it, else the exporter's default."""

    def read(self) -> Snapshot:
        """Scrape once; raises MetricsError when the page is unreachable or not a gpu-exporter's."""
        started = time.monotonic()
        body = fetch(self.url, "exporter", self.timeout, self.connection)
        at, wall = (started + time.monotonic()) / 2, time.time()
        try:
            snapshot = snapshot_of(text_string_to_metric_families(body.decode("utf-8", "replace")), at, wall)
        except (ValueError, TypeError, IndexError):
            raise MetricsError(f"{self.url} does not serve Prometheus metrics: is it a gpu-exporter?") from None
        build_info = catalog.GPU_EXPORTER_BUILD_INFO.name
        if build_info not in snapshot.samples:
            raise MetricsError(f"{self.url} serves no gpu-exporter metrics ({build_info} is missing): "
                               "point --url at a gpu-exporter")
        age = snapshot.value(catalog.GPU_EXPORTER_LAST_SAMPLE_AGE_SECONDS.name)
        interval = snapshot.value(catalog.GPU_EXPORTER_POLL_INTERVAL_SECONDS.name)
        if interval is not None and interval > 0:
            self.poll_interval = interval
        return Snapshot(snapshot.samples, at=at - (age or 0.0), wall=wall)


class DcgmSource:
    """Scrapes NVIDIA's dcgm-exporter (``diagnose --dcgm-url``): the SM, tensor and DRAM activity of GPUs without
    GPM (A100 and older), by UUID.

    >>> DcgmSource("127.0.0.1:9400").url
    'http://127.0.0.1:9400/metrics'
    """

    def __init__(self, url: str, timeout: float = 5.0, connection: Connection | None = None) -> None:
        self.url = normalize_url(url, "/metrics", "dcgm-exporter")
        self.timeout = timeout
        self.connection = connection or Connection()

    def read(self) -> Snapshot:
        """Scrape once; raises MetricsError when the page is unreachable or has no DCGM profiling field."""
        body = fetch(self.url, "dcgm-exporter", self.timeout, self.connection)
        try:
            snapshot = snapshot_of(text_string_to_metric_families(body.decode("utf-8", "replace")), time.monotonic(),
                                   time.time())
        except (ValueError, TypeError, IndexError):
            raise MetricsError(f"{self.url} does not serve Prometheus metrics: is it a dcgm-exporter?") from None
        sm = catalog.DCGM_SM_ACTIVE.name
        if sm not in snapshot.samples:
            raise MetricsError(f"{self.url} serves no {sm}: point --dcgm-url at a dcgm-exporter with the profiling "
                               "fields enabled (docs/dcgm-exporter.md)")
        return snapshot


@dataclass
class NvmlSource:
    """Reads NVML in this process with the exporter's utilization, device and process collectors; ``simulate``:
    None for the real driver, "" for the packaged simulated node, or a scenario name or file. :meth:`close` it."""

    simulate: str | None = None
    _state: dict[str, Any] = field(default_factory=dict)

    def _open(self) -> None:
        from gpu_exporter.collectors.device import DeviceCollector
        from gpu_exporter.collectors.processes import ProcessCollector
        from gpu_exporter.collectors.utilization import UtilizationCollector
        from gpu_exporter.nvml import DriverNotFound, Nvml

        if self.simulate is not None:
            from gpu_exporter import simulate

            try:
                simulate.install(self.simulate or None)
            except (ValueError, OSError) as err:
                raise MetricsError(str(err)) from None
        nvml = Nvml()
        try:
            nvml.init()
        except DriverNotFound as err:
            raise NoDriver(str(err)) from None
        self._state.update(nvml=nvml, gpus=nvml.discover(),
                           collectors=(UtilizationCollector(), DeviceCollector(), ProcessCollector()))

    def read(self) -> Snapshot:
        """Poll every GPU once; the first call initialises NVML (MetricsError without a driver)."""
        from gpu_exporter.collectors.base import PollContext
        from gpu_exporter.nvml import DriverLost

        if not self._state:
            self._open()
        now = time.monotonic()
        ctx = PollContext(nvml=self._state["nvml"], gpus=self._state["gpus"], now=now)
        families: list[Metric] = []
        try:
            for collector in self._state["collectors"]:
                collector.poll(ctx)
                families.extend(collector.collect())
        except DriverLost as err:
            raise MetricsError(f"NVML stopped answering ({err}); is the NVIDIA driver still loaded?") from None
        return snapshot_of(families, at=now, wall=time.time())

    def close(self) -> None:
        """Shut NVML down (and remove the simulated node, if one was installed)."""
        if self._state:
            self._state["nvml"].shutdown()
            self._state.clear()
        if self.simulate is not None:
            from gpu_exporter import simulate

            simulate.uninstall()
