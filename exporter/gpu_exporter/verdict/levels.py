"""The utilization levels, defined once: below which line a GPU is ``low``, below which ``target``.

The utilization a GPU is judged at is its *useful* utilization (:func:`useful_utilization`): on a
real GPU an NCCL collective's kernel spins while its rank waits for the slower ranks, so NVML reads
a rank that waits for a straggler, or every rank of a communication-bound run, as ~100% busy. The
GPU cannot have computed while its rank sat in collectives, so a training run's GPU is judged at
``min(u, 1 - communication share)`` of that run (rank); a GPU with no live run keeps ``u``. The
generated rules record the same as ``run:gpu_useful_utilization:avg5m`` and
``gpu:gpu_useful_utilization:avg5m`` (prometheus/templates/gpu-recording.rules.yml.in).

The verdict, the status page (its JSON carries :func:`describe`, the page's script colours bars
from that), the alert rules (monitoring/causes.py) and the report all read these rows, so the
levels' names and thresholds keys exist only here.

>>> from gpu_exporter.thresholds import load_thresholds
>>> t = load_thresholds()
>>> level(0.1, t), level(0.5, t), level(0.95, t)
('low', 'target', None)
>>> [d["level"] for d in describe(t)]
['low', 'target']
>>> u = useful_utilization(0.95, {"compute": 0.35, "communication": 0.65})
>>> round(u, 2), level(u, t), useful_text(0.95, {"compute": 0.35, "communication": 0.65})
(0.35, 'target', '35% useful (95% busy, 65% of the step in collectives)')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_exporter.training.protocol import COMMUNICATION

if TYPE_CHECKING:
    from gpu_exporter.thresholds import Thresholds

LOW = "low"
"""Level label: utilization below ``utilization_low_threshold`` (warning alerts)."""
TARGET = "target"
"""Level label: at or above the low threshold, below ``utilization_target`` (info alert)."""
OK = "ok"
"""Not a level: at or above ``utilization_target`` (no verdict below target, no alert)."""


@dataclass(frozen=True)
class Level:
    """One level: utilization below the thresholds.yml value of ``key`` (and at or above the previous level's);
    ``severity``: that of the cause alerts (and the evidence alert) at this level."""

    name: str
    key: str
    severity: str


def threshold(t: Thresholds, key: str) -> float:
    """The number of ``t`` named by the thresholds.yml key ``key``."""
    value = getattr(t, key)
    assert isinstance(value, int | float)
    return float(value)


LEVELS: tuple[Level, ...] = (
    Level(LOW, "utilization_low_threshold", "warning"),  # below the low line: warning alerts name the cause
    Level(TARGET, "utilization_target", "info"),  # above the low line, below the target: one info alert
)
"""The levels, lowest first. A utilization matches the first level whose line it is below."""

BY_LEVEL: dict[str, Level] = {lv.name: lv for lv in LEVELS}


def level(utilization: float, t: Thresholds) -> str | None:
    """``"low"``, ``"target"`` or None (at or above ``utilization_target``)."""
    return next((lv.name for lv in LEVELS if utilization < threshold(t, lv.key)), None)


def useful_utilization(utilization: float, *shares: Mapping[str, float]) -> float:
    """The utilization a GPU is judged at: ``min(u, 1 - communication share)`` of the run (rank) on it.

    ``shares`` are the phase shares of the live runs on the GPU: of one run, the run's own; of
    several, the most useful of them (the GPU did useful work for at least that one); of none, ``u``.
    A run without a ``communication`` phase (or a small one below ``1 - u``) keeps ``u``.

    >>> useful_utilization(0.9, {"communication": 0.6}), useful_utilization(0.9), useful_utilization(0.3, {"data": 1})
    (0.4, 0.9, 0.3)
    """
    caps = [1.0 - s.get(COMMUNICATION, 0.0) for s in shares]
    return min(utilization, max(caps)) if caps else utilization


def useful_text(utilization: float, *shares: Mapping[str, float], noun: str = "") -> str:
    """The figure a GPU is judged at, in words: ``"8%"`` (``u`` itself), or, when its run's collectives
    hide part of ``u``, ``"35% useful (95% busy, 65% of the step in collectives)"``. ``noun`` follows the figure.

    >>> useful_text(0.08, {"data": 0.9}, noun=" utilization")
    '8% utilization'
    """
    useful = useful_utilization(utilization, *shares)
    if useful >= utilization:
        return f"{utilization * 100:.0f}%{noun}"
    return (f"{useful * 100:.0f}% useful{noun} ({utilization * 100:.0f}% busy, {(1 - useful) * 100:.0f}% of the step "
            "in collectives)")


def describe(t: Thresholds) -> list[dict[str, Any]]:
    """The levels with their lines under ``t``, for JSON clients (the status page's script)."""
    return [{"level": lv.name, "key": lv.key, "below": threshold(t, lv.key)} for lv in LEVELS]
