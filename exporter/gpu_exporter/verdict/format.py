"""The verdict's figures in words: a share as a percentage, a duration in seconds, CPU use in cores; a row's label.

Its one job is formatting: diagnose, the status page, the report and the fleet view print their figures
with these, so a figure reads the same everywhere.

>>> pct(0.084), seconds(0.2634), cores(0.98), cores(3.9)
('8%', '0.263 s', '98% of one core', '3.9 cores')
"""

from __future__ import annotations

__all__ = ["Labelled", "cores", "pct", "seconds"]


def pct(ratio: float) -> str:
    """``0.084 -> "8%"``."""
    return f"{ratio * 100:.0f}%"


def seconds(value: float) -> str:
    """``0.2634 -> "0.263 s"``, ``12.5 -> "12.5 s"`` (three significant digits)."""
    return f"{value:.3g} s"


def cores(value: float) -> str:
    """``0.98 -> "98% of one core"``, ``3.9 -> "3.9 cores"``."""
    return f"{pct(value)} of one core" if value < 1.5 else f"{value:.1f} cores"


class Labelled:
    """A row of a table (a cause, an efficiency cause, a hint) named in words by its title and code."""

    title: str
    code: str

    @property
    def label(self) -> str:
        """``"input-bound (M1)"``; the title alone without a code (``"busy but ineffective"``)."""
        return f"{self.title} ({self.code})" if self.code else self.title
