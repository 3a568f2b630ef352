"""One reading of a node as plain samples: what every source of the verdict hands the join.

An exporter scrape (``diagnose --url``), the collectors in this process (the status page) and
the NVML source of ``query`` all become a :class:`Snapshot`: samples by metric name as
(labels, value) pairs, with the monotonic time the NVML values were taken and the wall time.

>>> s = Snapshot({"gpu_power_watts": [({"gpu": "0"}, 250.0)]}, at=1.0, wall=0.0)
>>> s.value("gpu_power_watts", gpu="0")
250.0
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

Labels = dict[str, str]


@dataclass(frozen=True)
class Snapshot:
    """One reading of a node: every sample by metric name, and when the NVML values were taken.

    ``at`` is this process's monotonic clock at the NVML poll the values come from (for an
    exporter: the scrape time minus ``gpu_exporter_last_sample_age_seconds``), so busy-second
    deltas divide by the time NVML really covered. ``wall`` is the Unix time of the reading.
    """

    samples: dict[str, list[tuple[Labels, float]]]
    at: float
    wall: float

    def series(self, name: str, **match: str) -> list[tuple[Labels, float]]:
        """Samples of ``name`` whose labels include every ``match`` pair."""
        return [(labels, value) for labels, value in self.samples.get(name, [])
                if all(labels.get(k) == v for k, v in match.items())]

    def value(self, name: str, **match: str) -> float | None:
        """The value of the first sample of ``name`` matching ``match``, or None."""
        found = self.series(name, **match)
        return found[0][1] if found else None


def snapshot_of(families: Iterable[Metric], at: float, wall: float) -> Snapshot:
    """A Snapshot of prometheus_client metric families (parsed or collected)."""
    samples: dict[str, list[tuple[Labels, float]]] = {}
    for family in families:
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return Snapshot(samples, at=at, wall=wall)


def window_shares(run_key: Callable[[Labels], Any], label: str, prev: Iterable[tuple[Labels, float]],
                  cur: Iterable[tuple[Labels, float]], phase_window: Mapping[Any, Mapping[str, float]],
                  new_ones: bool = False) -> Iterator[tuple[Any, Labels, float]]:
    """(run key, labels, share of the run's phase seconds) of each counter of ``cur`` that grew over the window
    between two readings of an exporter, told apart by ``label`` (``diagnose --url``: the callback hooks', the code's
    and the functions' seconds). Unless ``new_ones``, one absent at the first reading of a run seen then has no window
    (it was not the biggest then) and is left out."""
    before = {(run_key(labels), labels.get(label, "")): value for labels, value in prev}
    seen = {key for key, _ in before}
    for labels, value in cur:
        key, name = run_key(labels), labels.get(label, "")
        wall = sum(v for v in phase_window.get(key, {}).values() if v > 0)
        delta = value - before.get((key, name), 0.0)
        if (new_ones or (key, name) in before or key not in seen) and wall > 0 and delta >= 0:
            yield key, labels, delta / wall
