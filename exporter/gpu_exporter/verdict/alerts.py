"""The alerts that speak for a GPU's verdict: their names, once, and the one way to their runbook section.

Its one job is the names of the alerts that are no row of a table, and what the utilization alerts compare.
The rows' alerts are their tables' (a cause's ``Cause.alert`` in gpu_exporter.verdict.causes, the
busy-but-ineffective ones in gpu_exporter.verdict.efficiency, ``EVIDENCE_ALERT`` in gpu_exporter.verdict.hints);
the utilization alerts are :class:`Compared` here: the value, the comparison and the thresholds.yml key.
monitoring/utilization.py builds GpuUtilizationLow, GpuUtilizationBelowTarget and GpuIdleButAllocated from them,
and the verdict ladder (gpu_exporter.verdict.ladder) shows the same PromQL in its rows and judges the idle row with
the same key and comparison. :func:`runbook_anchor` is the runbook section of any alert, for the generated rules'
links (monitoring.model), the cause tables and the ladder alike.

>>> IDLE_BUT_ALLOCATED.promql
'gpu:gpu_utilization:avg5m < ${idle_utilization_threshold}'
>>> runbook_anchor(UTILIZATION_LOW.name)
'gpuutilizationlow'
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpu_exporter import catalog
from gpu_exporter.verdict.levels import BY_LEVEL, LOW, TARGET, threshold

if TYPE_CHECKING:
    from gpu_exporter.thresholds import Thresholds

__all__ = ["IDLE_BUT_ALLOCATED", "TRAINING_BELOW_TARGET", "UTILIZATION_BELOW_TARGET", "UTILIZATION_LOW", "Compared",
           "runbook_anchor"]

OPS: dict[str, Callable[[float, float], bool]] = {"<": operator.lt, "<=": operator.le, ">": operator.gt,
                                                  ">=": operator.ge}
"""A PromQL comparison in Python."""


def runbook_anchor(alert: str) -> str:
    """The runbook section of the alert named ``alert``: GitHub's anchor of its heading, the lower-cased name."""
    return alert.lower()


@dataclass(frozen=True)
class Compared:
    """An alert that compares one value (PromQL, template text) with one thresholds.yml key."""

    name: str
    value: str
    op: str
    threshold: str

    @property
    def promql(self) -> str:
        """The comparison as PromQL: what the alert's expression holds where its value goes."""
        return f"{self.value} {self.op} ${{{self.threshold}}}"

    def holds(self, value: float, t: Thresholds) -> bool:
        """The same comparison in Python, of ``value`` under thresholds ``t``."""
        return OPS[self.op](value, threshold(t, self.threshold))


LOWEST = f"min_over_time({catalog.GPU_USEFUL_UTILIZATION_AVG5M.name}[${{alert_hold}}])"
"""The GPU's lowest 5m useful utilization in the last ``alert_hold``: hysteresis, a GPU hovering around a line stays
below it (docs/prometheus.md)."""
UTILIZATION_LOW = Compared("GpuUtilizationLow", LOWEST, "<", BY_LEVEL[LOW].key)
"""A GPU with work below the low line (the ladder's not_instrumented / underutilized rows at level ``low``)."""
UTILIZATION_BELOW_TARGET = Compared("GpuUtilizationBelowTarget", LOWEST, "<", BY_LEVEL[TARGET].key)
"""A GPU with work below the target and no cause (the same rows at level ``target``)."""
IDLE_BUT_ALLOCATED = Compared("GpuIdleButAllocated", catalog.GPU_UTILIZATION_AVG5M.name, "<",
                              "idle_utilization_threshold")
"""A GPU with work at almost no utilization (the ladder's idle_but_allocated row)."""
TRAINING_BELOW_TARGET = "GpuTrainingBelowTarget"
"""The info alert of every cause at level ``target`` (label ``cause``), one rule per row of the cause table."""
