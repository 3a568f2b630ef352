"""The utilization funnel of a fleet: allocated GPU-hours -> busy -> effective, with the hours lost at each step
by cause. Pure: ``gpu-exporter report --fleet`` (gpu_exporter.commands.fleet) feeds it the judged points of a range;
the GPU fleet cost dashboard shows the same funnel from the recorded series (monitoring/funnel.py: the busy ->
effective total at query time, its causes recorded where one holds).

- *allocated*: the time a GPU had work (its verdict is not ``unused``) and a busy utilization;
- *busy*: allocated time x NVML's utilization (the share of time a kernel ran). The step allocated -> busy loses
  allocated x (1 - busy), by the GPU's verdict (input-bound, idle but allocated, not instrumented, healthy, ...);
- *effective*: allocated time x SM activity (GPM or dcgm-exporter), where a source reports it. The step
  busy -> effective loses allocated x (busy - SM activity) (never below 0), by the GPU's efficiency verdict
  (gpu_exporter.verdict.efficiency: memory_bound, sm_batch_too_small, tensor_cores_idle, ineffective; they apply at
  or above the utilization target), else :data:`NO_CAUSE`. Busy time of a GPU with no SM source is *unknown*: it is
  neither effective nor lost.

So busy = effective + lost to ineffective use + unknown (where SM activity never exceeds busy; a sample where it
does counts its SM activity as effective and loses nothing).

>>> f = Funnel()
>>> f.add(Slice(3600.0, 0.9, 0.3, "sm_batch_too_small"))
>>> f.add(Slice(3600.0, 0.5, None, "not_instrumented"))
>>> round(f.allocated, 3), round(f.busy, 3), round(f.effective, 3), round(f.unknown, 3)
(2.0, 1.4, 0.3, 0.5)
>>> {k: round(v, 3) for k, v in f.idle_by.items()}, {k: round(v, 3) for k, v in f.ineffective_by.items()}
({'sm_batch_too_small': 0.1, 'not_instrumented': 0.5}, {'sm_batch_too_small': 0.6})
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpu_exporter.verdict.efficiency import EFFICIENCY_BY_ID

NO_CAUSE = "(none)"
"""The busy -> effective hours of a GPU with no efficiency verdict: below the target (its other verdict explains
the GPU), or SM activity at or above ``sm_active_low``."""
UNUSED = "unused"
"""The ladder's verdict of a GPU without work: free capacity, not allocated."""


@dataclass(frozen=True)
class Slice:
    """Some seconds of one GPU, judged: its busy utilization (0-1), SM activity (0-1, None: no source) and verdict."""

    seconds: float
    busy: float | None
    sm: float | None
    verdict: str


def _add(into: dict[str, float], key: str, hours: float) -> None:
    into[key] = into.get(key, 0.0) + hours


def _ranked(values: dict[str, float]) -> dict[str, float]:
    return dict(sorted(values.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass
class Funnel:
    """GPU-hours at each step of the funnel and those lost between steps, by cause (verdict id)."""

    allocated: float = 0.0
    busy: float = 0.0
    effective: float = 0.0
    unknown: float = 0.0
    """Busy GPU-hours of GPUs with no SM activity source: neither effective nor lost."""
    idle_by: dict[str, float] = field(default_factory=dict)
    """allocated -> busy: allocated x (1 - busy), by verdict."""
    ineffective_by: dict[str, float] = field(default_factory=dict)
    """busy -> effective: allocated x (busy - SM activity), by efficiency verdict (:data:`NO_CAUSE` otherwise)."""

    def add(self, s: Slice) -> None:
        """Count one slice (a slice without work or without a busy utilization counts nowhere)."""
        if s.verdict == UNUSED or s.busy is None or s.seconds <= 0:
            return
        hours, busy = s.seconds / 3600, min(max(s.busy, 0.0), 1.0)
        self.allocated += hours
        self.busy += hours * busy
        _add(self.idle_by, s.verdict, hours * (1.0 - busy))
        if s.sm is None:
            self.unknown += hours * busy
            return
        sm = min(max(s.sm, 0.0), busy)
        self.effective += hours * sm
        _add(self.ineffective_by, s.verdict if s.verdict in EFFICIENCY_BY_ID else NO_CAUSE, hours * (busy - sm))

    @property
    def idle(self) -> float:
        """GPU-hours lost allocated -> busy."""
        return sum(self.idle_by.values())

    @property
    def ineffective(self) -> float:
        """GPU-hours lost busy -> effective (on GPUs that report SM activity)."""
        return sum(self.ineffective_by.values())

    def to_json(self) -> dict[str, Any]:
        def hours(values: dict[str, float]) -> dict[str, float]:
            return {k: round(v, 6) for k, v in _ranked(values).items()}
        return {"allocated_gpu_hours": round(self.allocated, 6), "busy_gpu_hours": round(self.busy, 6),
                "effective_gpu_hours": round(self.effective, 6), "sm_unknown_busy_gpu_hours": round(self.unknown, 6),
                "lost_allocated_to_busy": hours(self.idle_by), "lost_busy_to_effective": hours(self.ineffective_by)}


def funnel(slices: Iterable[Slice]) -> Funnel:
    """The funnel of ``slices``."""
    out = Funnel()
    for s in slices:
        out.add(s)
    out.idle_by, out.ineffective_by = _ranked(out.idle_by), _ranked(out.ineffective_by)
    return out


def lines(f: Funnel, titles: dict[str, str], top: int = 5) -> list[tuple[str, str]]:
    """The funnel as (label, text) rows for a report: each step's GPU-hours and the biggest causes of each loss
    (``titles``: a verdict's words, else its id)."""
    def pct_of(part: float, whole: float) -> str:
        return f" ({part / whole * 100:.0f}%)" if whole > 0 else ""

    def causes(values: dict[str, float]) -> str:
        shown = [(k, v) for k, v in _ranked(values).items() if v > 0][:top]
        return "; ".join(f"{titles.get(k, k)} {v:.3f}" for k, v in shown) or "none"

    rows = [("allocated GPU-hours", f"{f.allocated:.3f} (with work)"),
            ("busy GPU-hours", f"{f.busy:.3f}{pct_of(f.busy, f.allocated)} (a kernel ran: NVML utilization)"),
            ("  lost, allocated -> busy", f"{f.idle:.3f}: {causes(f.idle_by)}"),
            ("effective GPU-hours", f"{f.effective:.3f}{pct_of(f.effective, f.allocated)} (SM activity)"),
            ("  lost, busy -> effective", f"{f.ineffective:.3f}: {causes(f.ineffective_by)}")]
    if f.unknown > 0:
        rows.append(("  busy, SM activity unknown",
                     f"{f.unknown:.3f}{pct_of(f.unknown, f.busy)} of the busy hours: no GPM, no dcgm-exporter"))
    return rows
