"""The polling thread: owns NVML, discovers GPUs, runs every polling collector each interval.

Scrapes never call NVML; they read what the last poll published. The poller also keeps the
exporter's own health: per-collector success and duration, the time of the newest complete
poll (for ``/readyz`` and ``gpu_exporter_last_sample_age_seconds``), and NVML recovery: when
the driver disappears it shuts NVML down, drops per-GPU state and re-initialises on later
polls without a restart.

Example::

    poller = Poller(Nvml(), [UtilizationCollector(), DeviceCollector()], poll_interval=1.0)
    poller.start()           # background thread
    ...
    poller.stop()
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpu_exporter.collectors.base import Discovery, PollContext, PollingCollector
from gpu_exporter.nvml import DriverLost, DriverNotFound, Nvml

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CollectorStatus:
    """Outcome of a collector's latest poll."""

    success: bool
    duration_seconds: float


class Poller:
    """Background NVML poller; thread-safe readers: :attr:`discovery`, :attr:`status`, :meth:`sample_age`."""

    def __init__(self, nvml: Nvml, collectors: Sequence[PollingCollector], poll_interval: float = 1.0,
                 discovery_interval: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.nvml = nvml
        self.collectors = list(collectors)
        self.poll_interval = poll_interval
        self.discovery_interval = discovery_interval
        self._clock = clock
        self._discovery = Discovery(0, ())
        self._discovered_at: float | None = None
        self.status: dict[str, CollectorStatus] = {}
        self.last_complete_poll: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-exporter-poller", daemon=True)
        self._driver_ok: bool | None = None
        self.after_poll: Callable[[], None] | None = None
        """Called on the poller thread after each complete poll (the exporter prepares an expected scrape)."""

    @property
    def discovery(self) -> Discovery:
        """The GPUs found and their generation, which grows whenever the list changes (replaced whole)."""
        return self._discovery

    def sample_age(self) -> float | None:
        """Seconds since the newest complete poll, or None before the first."""
        if self.last_complete_poll is None:
            return None
        return max(0.0, self._clock() - self.last_complete_poll)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.nvml.shutdown()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = self._clock()
            self.poll_once()
            self._stop.wait(max(0.0, self.poll_interval - (self._clock() - started)))

    def poll_once(self) -> None:
        """One cycle: (re)initialise and (re)discover when due, then run every collector."""
        now = self._clock()
        if not self.nvml.initialized and not self._initialise():
            return
        try:
            if self._discovered_at is None or now - self._discovered_at >= self.discovery_interval:
                self._discover(now)
            ctx = PollContext(nvml=self.nvml, gpus=self._discovery.gpus, now=now)
            for collector in self.collectors:
                started = self._clock()
                try:
                    ok = collector.poll(ctx)
                except DriverLost:
                    raise
                except Exception:
                    log.exception("collector %s failed", collector.name)
                    ok = False
                self.status[collector.name] = CollectorStatus(ok, self._clock() - started)
        except DriverLost as err:
            self._lose_driver(str(err))
            return
        if ctx.lost:
            self._discovered_at = None  # re-enumerate on the next poll
        self.last_complete_poll = self._clock()
        if self.after_poll is not None:
            try:
                self.after_poll()
            except Exception:
                log.exception("preparing the scrape after a poll failed")

    def _initialise(self) -> bool:
        try:
            self.nvml.init()
        except DriverNotFound as err:
            if self._driver_ok is not False:
                log.error("%s", err)
            self._driver_ok = False
            return False
        if self._driver_ok is False:
            log.warning("NVML is back; resuming collection")
        self._driver_ok = True
        self._discovered_at = None
        return True

    def _discover(self, now: float) -> None:
        gpus = tuple(self.nvml.discover())
        old = self._discovery.gpus
        if [(g.uuid, g.index, tuple(m.uuid for m in g.mig_instances)) for g in gpus] != [
                (g.uuid, g.index, tuple(m.uuid for m in g.mig_instances)) for g in old]:
            log.info("found %d GPU(s): %s", len(gpus), ", ".join(f"{g.index}={g.uuid}" for g in gpus) or "none")
            self._discovery = Discovery(self._discovery.generation + 1, gpus)
        self._discovered_at = now

    def _lose_driver(self, reason: str) -> None:
        log.error("NVML stopped answering (%s); will re-initialise", reason)
        self._driver_ok = False
        self.nvml.shutdown()
        self._discovery = Discovery(self._discovery.generation + 1, ())
        for collector in self.collectors:
            collector.reset()
