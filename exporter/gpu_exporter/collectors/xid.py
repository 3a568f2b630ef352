"""XID errors from the NVML event API, counted per GPU and XID code.

``nvmlEventSetWait`` blocks, so the events live on their own thread: it registers every GPU
for critical XID events, waits in one-second slices (so it notices new GPUs and shutdown),
and re-registers when discovery changes the GPU list or the driver comes back. Scrapes read
the counts under a lock; the thread never touches the scrape path.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
from prometheus_client.core import CounterMetricFamily, Metric

from gpu_exporter import catalog
from gpu_exporter.collectors.base import Assembly, Discovery
from gpu_exporter.exposition import Family, join_lines
from gpu_exporter.nvml import CallFailed, DriverLost, Gpu, GpuLost, Nvml, handle_key

log = logging.getLogger(__name__)
WAIT_MS = 1000
_FAMILY = catalog.GPU_XID_ERRORS_TOTAL


class XidCollector:
    """``gpu_xid_errors_total{gpu,uuid,xid}`` fed by a background event thread."""

    name = "xid"

    def __init__(self, nvml: Nvml, discovery: Callable[[], Discovery]) -> None:
        """``discovery()`` gives the poller's latest GPUs; a new generation triggers re-registration."""
        self._nvml = nvml
        self._discovery = discovery
        self._counts: Counter[tuple[str, str, str]] = Counter()
        self._lock = threading.Lock()
        self._family = Family(_FAMILY.base, _FAMILY.kind, _FAMILY.help, _FAMILY.labels)
        self._text: bytes | None = b""  # rendered once per new event; None: render on the next scrape
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-exporter-xid", daemon=True)
        self.healthy = True

    @classmethod
    def build(cls, assembly: Assembly) -> XidCollector:
        """The exporter's (gpu_exporter.collectors): events of the GPUs the poller found."""
        return cls(assembly.nvml, lambda: assembly.poller.discovery)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def exposition(self) -> bytes:
        """Text of the counts, rendered once per new event (exposition.Source)."""
        with self._lock:
            if self._text is None:
                lines: list[str] = []
                if self._counts:
                    self._family.lines(sorted(self._counts.items()), lines)
                self._text = join_lines(lines)
            return self._text

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(_FAMILY.base, _FAMILY.help, labels=list(_FAMILY.labels))
        with self._lock:
            for labels, count in sorted(self._counts.items()):
                family.add_metric(list(labels), count)
        if family.samples:
            yield family

    def _run(self) -> None:
        while not self._stop.is_set():
            found = self._discovery()
            if not self._nvml.initialized or not found.gpus:
                self._stop.wait(1.0)
                continue
            try:
                self._listen(found)
            except (DriverLost, GpuLost, CallFailed) as err:
                log.warning("XID event listener restarting: %s", err)
                self.healthy = False
                self._stop.wait(1.0)

    def _listen(self, found: Discovery) -> None:
        event_set = self._nvml.call("system", "nvmlEventSetCreate")
        if event_set is None:
            self._stop.wait(5.0)
            return
        try:
            by_handle: dict[int, Gpu] = {}
            for gpu in found.gpus:
                supported = self._nvml.call(gpu.uuid, "nvmlDeviceGetSupportedEventTypes", gpu.handle) or 0
                if supported & pynvml.nvmlEventTypeXidCriticalError:
                    self._nvml.call(gpu.uuid, "nvmlDeviceRegisterEvents", gpu.handle,
                                    pynvml.nvmlEventTypeXidCriticalError, event_set)
                    by_handle[handle_key(gpu.handle)] = gpu
            self.healthy = True
            while not self._stop.is_set() and self._discovery().generation == found.generation:
                if not by_handle:
                    self._stop.wait(1.0)
                    continue
                self._wait_once(event_set, by_handle)
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(event_set)

    def _wait_once(self, event_set: Any, by_handle: dict[int, Gpu]) -> None:
        data = self._nvml.call("system", "nvmlEventSetWait_v2", event_set, WAIT_MS)
        if data is None:  # timed out: no event in this slice
            return
        if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
            gpu = by_handle.get(handle_key(data.device))
            if gpu is not None:
                log.warning("XID %d on GPU %d (%s)", data.eventData, gpu.index, gpu.uuid)
                with self._lock:
                    self._counts[(str(gpu.index), gpu.uuid, str(int(data.eventData)))] += 1
                    self._text = None
