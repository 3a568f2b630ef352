"""Accuracy on a bursty GPU: the busy-time counter against instant gauges, in-process and exact.

The packaged ``bursty.yaml`` GPU runs 3 s at 95% and 7 s idle, every 10 s (mean 28.5%). The
poller and the utilization collector run on a hand-driven clock, one poll per simulated
second, so an hour takes a second or two and the ground truth
(``SimulatedNode.true_busy_seconds``) is exact. After every poll we record what a scrape
would read: ``gpu_busy_seconds_total``, our ``gpu_utilization_ratio`` (mean over the last poll)
and ``nvmlDeviceGetUtilizationRates`` (the instant value nvitop-exporter and other peers
export). Scrape schedules at 15 s and 60 s are then cut from that record at every phase of
the burst. Example::

    rows = measure_accuracy(simulated_seconds=1800)
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass

import pynvml
from gpu_exporter import catalog, simulate
from gpu_exporter.collectors.base import PollingCollector
from gpu_exporter.collectors.utilization import UtilizationCollector
from gpu_exporter.nvml import Nvml
from gpu_exporter.poller import Poller

SCRAPE_INTERVALS = (15, 60)
WINDOW = 300
"""The averaging window of the second comparison: rate(...[5m]) against avg_over_time(...[5m])."""
START = 0.37
"""Simulated second of the first poll: off the burst edges, so polls see every sub-second phase."""
METHODS = ("busy counter (gpu-exporter)", f"{catalog.GPU_UTILIZATION_RATIO.name} gauge (gpu-exporter)",
           "instant NVML gauge (nvitop-exporter)")


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclass(frozen=True)
class AccuracyRow:
    """Errors of one method at one scrape interval, in percentage points of utilization."""

    interval: int
    method: str
    points: int
    point_mean_pp: float
    point_max_pp: float
    windows: int
    window_mean_pp: float
    window_max_pp: float


@dataclass(frozen=True)
class _Record:
    t: float
    busy: float
    gauge: float
    instant: float


def _family_value(collector: PollingCollector, sample_name: str) -> float:
    for family in collector.collect():
        for sample in family.samples:
            if sample.name == sample_name:
                return float(sample.value)
    raise LookupError(f"bench: {sample_name} missing from the utilization collector")


def _record(simulated_seconds: int) -> tuple[list[_Record], simulate.SimulatedNode]:
    clock = _Clock()
    node = simulate.install("bursty.yaml", clock=clock)
    nvml = Nvml()
    collector = UtilizationCollector()
    poller = Poller(nvml, [collector], poll_interval=1.0, clock=clock)
    records = []
    try:
        nvml.init()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        clock.t += START
        poller.poll_once()
        for _ in range(simulated_seconds):
            clock.t += 1.0
            poller.poll_once()
            records.append(_Record(node.now(), _family_value(collector, catalog.GPU_BUSY_SECONDS_TOTAL.name),
                                   _family_value(collector, catalog.GPU_UTILIZATION_RATIO.name),
                                   pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0))
    finally:
        nvml.shutdown()
        simulate.uninstall()
    return records, node


def measure_accuracy(simulated_seconds: int = 3600) -> list[AccuracyRow]:
    """Errors of the three methods at 15 s and 60 s scrape intervals over ``simulated_seconds``.

    "Point" errors compare each scraped value with the true mean since the previous scrape
    (the counter's value is its increase over the interval); "window" errors compare the
    5-minute mean (counter increase / 300 s, or the mean of the scraped gauge values, as
    avg_over_time does) with the true 5-minute mean. Every phase offset of the schedule is used.
    """
    records, node = _record(simulated_seconds)
    rows = []
    for interval in SCRAPE_INTERVALS:
        point_err: dict[str, list[float]] = {m: [] for m in METHODS}
        window_err: dict[str, list[float]] = {m: [] for m in METHODS}
        per_window = WINDOW // interval
        for offset in range(interval):
            scrapes = records[offset::interval]
            for prev, cur in itertools.pairwise(scrapes):
                truth = node.true_busy_seconds(0, prev.t, cur.t) / (cur.t - prev.t)
                values = ((cur.busy - prev.busy) / (cur.t - prev.t), cur.gauge, cur.instant)
                for method, value in zip(METHODS, values, strict=True):
                    point_err[method].append(abs(value - truth) * 100)
            for end in range(per_window, len(scrapes)):
                first, last = scrapes[end - per_window], scrapes[end]
                inside = scrapes[end - per_window + 1:end + 1]
                truth = node.true_busy_seconds(0, first.t, last.t) / (last.t - first.t)
                values = ((last.busy - first.busy) / (last.t - first.t),
                          statistics.fmean(r.gauge for r in inside), statistics.fmean(r.instant for r in inside))
                for method, value in zip(METHODS, values, strict=True):
                    window_err[method].append(abs(value - truth) * 100)
        for method in METHODS:
            p, w = point_err[method], window_err[method]
            rows.append(AccuracyRow(interval, method, len(p), statistics.fmean(p), max(p),
                                    len(w), statistics.fmean(w), max(w)))
    return rows
