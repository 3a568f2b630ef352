"""The utilization levels, defined once: below which line a GPU is ``low``, below which ``target``.

The verdict, the status page (its JSON carries :func:`describe`, the page's script colours bars
from that), the alert rules (monitoring/rules.py) and the report all read these rows, so the
levels' names and thresholds keys exist only here.

>>> from gpu_exporter.thresholds import load_thresholds
>>> t = load_thresholds()
>>> level(0.1, t), level(0.5, t), level(0.95, t)
('low', 'target', None)
>>> [d["level"] for d in describe(t)]
['low', 'target']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
    """One level: utilization below the thresholds.yml value of ``key`` (and at or above the previous level's)."""

    level: str
    key: str
    severity: str
    meaning: str

    def below(self, t: Thresholds) -> float:
        """The utilization under which this level applies."""
        value = getattr(t, self.key)
        assert isinstance(value, int | float)
        return float(value)


LEVELS: tuple[Level, ...] = (
    Level(LOW, "utilization_low_threshold", "warning", "below the low line: warning alerts name the cause"),
    Level(TARGET, "utilization_target", "info", "above the low line, below the target: one info alert"),
)
"""The levels, lowest first. A utilization matches the first level whose line it is below."""

BY_LEVEL: dict[str, Level] = {lv.level: lv for lv in LEVELS}


def level(utilization: float, t: Thresholds) -> str | None:
    """``"low"``, ``"target"`` or None (at or above ``utilization_target``)."""
    for lv in LEVELS:
        if utilization < lv.below(t):
            return lv.level
    return None


def describe(t: Thresholds) -> list[dict[str, Any]]:
    """The levels with their lines under ``t``, for JSON clients (the status page's script)."""
    return [{"level": lv.level, "key": lv.key, "below": lv.below(t)} for lv in LEVELS]
