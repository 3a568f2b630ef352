"""The exporter's own metrics (``gpu_exporter_*``): build info, collector outcomes, NVML errors,
sample age, GPU count, and HTTP authentication failures; and ``process_*`` (CPU, memory, open
files), which stay whole at the open-file limit.

They are computed at scrape time from the poller's bookkeeping, so this module sits beside
the poller and imports it; the collectors never import upward. Example::

    metrics, process = SelfMetrics(poller), ProcessMetrics()
    server = MetricsServer(..., sources=[*collectors, metrics, process], accept_guard=process.guard)
"""

from __future__ import annotations

import contextlib
import os
import platform
import threading
from collections.abc import Callable, Iterator
from importlib import metadata

from prometheus_client import ProcessCollector
from prometheus_client.core import Metric

from gpu_exporter import __version__, catalog
from gpu_exporter.collectors.base import Assembly
from gpu_exporter.poller import Poller


def _pynvml_version() -> str:
    try:
        return metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        return "unknown"


class SelfMetrics:
    """``gpu_exporter_*`` families; ``extra_status`` returns the success flag of collectors that do not poll
    through the poller (XID thread, Kubernetes attribution), keyed by collector name."""

    name = "self"

    @classmethod
    def build(cls, assembly: Assembly) -> SelfMetrics:
        """The exporter's (gpu_exporter.collectors), with the ``healthy`` flag of each source (XID, Kubernetes)."""
        def status() -> dict[str, bool]:
            return {name: bool(source.healthy) for name, source in assembly.built.items() if hasattr(source, "healthy")}

        return cls(assembly.poller, status, with_age=False)

    def __init__(self, poller: Poller, extra_status: Callable[[], dict[str, bool]] = dict,
                 with_age: bool = True) -> None:
        self._poller = poller
        self._with_age = with_age
        """False where a :class:`SampleAge` source serves the sample age (the exporter, last of its sources)."""
        self._extra_status = extra_status
        self._build = [__version__, platform.python_version(), _pynvml_version()]
        self._auth_failures = 0
        self._lock = threading.Lock()

    def count_auth_failure(self) -> None:
        """Record one request rejected for missing or wrong credentials."""
        with self._lock:
            self._auth_failures += 1

    def collect(self) -> Iterator[Metric]:
        build = catalog.GPU_EXPORTER_BUILD_INFO.new()
        build.add_metric(self._build, 1)
        yield build

        success = catalog.GPU_EXPORTER_COLLECTOR_SUCCESS.new()
        duration = catalog.GPU_EXPORTER_COLLECTOR_DURATION_SECONDS.new()
        for name, status in sorted(self._poller.status.items()):
            success.add_metric([name], 1 if status.success else 0)
            duration.add_metric([name], status.duration_seconds)
        for name, ok in sorted(self._extra_status().items()):
            success.add_metric([name], 1 if ok else 0)
        yield success
        yield duration

        errors = catalog.GPU_EXPORTER_NVML_ERRORS_TOTAL.new()
        for (function, error), count in sorted(self._poller.nvml.errors.copy().items()):
            errors.add_metric([function, error], count)
        yield errors

        if self._with_age:
            yield from SampleAge(self._poller).collect()
        yield catalog.GPU_EXPORTER_POLL_INTERVAL_SECONDS.new(self._poller.poll_interval)
        yield catalog.GPU_EXPORTER_GPUS.new(len(self._poller.discovery.gpus))
        with self._lock:
            failures = self._auth_failures
        yield catalog.GPU_EXPORTER_HTTP_AUTH_FAILURES_TOTAL.new(failures)


class SampleAge:
    """``gpu_exporter_last_sample_age_seconds`` alone, ``live``: a /metrics body rendered ahead of a scrape
    (exposition.Body.prepare) still renders it at the scrape, so the age is the scrape's, not the poll's.
    Clients time the exporter's polls with it (the scrape time minus the age)."""

    name = "age"
    live = True

    @classmethod
    def build(cls, assembly: Assembly) -> SampleAge:
        return cls(assembly.poller)

    def __init__(self, poller: Poller) -> None:
        self._poller = poller

    def collect(self) -> Iterator[Metric]:
        age = self._poller.sample_age()
        if age is not None:
            yield catalog.GPU_EXPORTER_LAST_SAMPLE_AGE_SECONDS.new(age)


class ProcessMetrics:
    """``process_*`` from /proc (prometheus_client's ProcessCollector), whole even at the open-file limit.

    The collector opens /proc/self/stat, /proc/self/limits and /proc/self/fd at each scrape. At the
    limit (a flood of connections) those opens fail and the families vanish exactly when they
    matter. So ``spare`` descriptors are held in reserve and closed just before collecting, and
    ``guard`` is held meanwhile: the server accepts connections only under it, so no accept can
    take the freed descriptors. They are opened again afterwards (whatever another thread took in
    between is retried at the next scrape).

    >>> names = {m.name for m in ProcessMetrics().collect()}
    >>> {"process_cpu_seconds", "process_open_fds", "process_resident_memory_bytes"} <= names
    True
    """

    name = "process"

    @classmethod
    def build(cls, assembly: Assembly) -> ProcessMetrics:
        return cls()

    def __init__(self, spare: int = 2) -> None:
        self._collector = ProcessCollector(registry=None)
        self.guard = threading.Lock()
        self._wanted = spare
        self._spare: list[int] = []
        self._refill()

    def _refill(self) -> None:
        with contextlib.suppress(OSError):
            while len(self._spare) < self._wanted:
                self._spare.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))

    def collect(self) -> Iterator[Metric]:
        with self.guard:
            while self._spare:
                os.close(self._spare.pop())
            try:
                families = list(self._collector.collect())
            finally:
                self._refill()
        yield from families
