"""One reading of a node as plain samples: what every source of the verdict hands the join.

An exporter scrape (``diagnose --url``), the collectors in this process (the status page) and
the NVML source of ``query`` all become a :class:`Snapshot`: samples by metric name as
(labels, value) pairs, with the monotonic time the NVML values were taken and the wall time.

>>> s = Snapshot({"gpu_power_watts": [({"gpu": "0"}, 250.0)]}, at=1.0, wall=0.0)
>>> s.value("gpu_power_watts", gpu="0")
250.0
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
