"""Utilization over simulated time: piecewise-constant patterns with exact integrals.

Every pattern is piecewise constant, so the integral over any window is exact: split the window
at the pattern's edges and sum value x length. Example:

>>> integral(Bursts(period=10.0, duty=0.3, high=1.0, low=0.0), 0.0, 20.0)
6.0
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
import threading
from collections.abc import Iterable
from typing import Protocol

SLOT_SECONDS = 1.0 / 6.0
"""Length of one NVML utilization sample (the driver samples every 1/6 s)."""


class Pattern(Protocol):
    """A ratio 0-1 as a piecewise-constant function of simulated seconds."""

    def value(self, t: float) -> float:
        """The ratio at simulated time ``t``."""

    def edges(self, t0: float, t1: float) -> Iterable[float]:
        """The points in the open interval (t0, t1) where the value may change."""


def integral(pattern: Pattern, t0: float, t1: float) -> float:
    """Exact integral of ``pattern`` over [t0, t1] (0 when t1 <= t0).

    >>> integral(Constant(0.5), 0.0, 4.0)
    2.0
    """
    if t1 <= t0:
        return 0.0
    points = [t0, *sorted(set(pattern.edges(t0, t1))), t1]
    return math.fsum(pattern.value((a + b) / 2.0) * (b - a) for a, b in itertools.pairwise(points))


def mean(pattern: Pattern, t0: float, t1: float) -> float:
    """Mean of ``pattern`` over [t0, t1]; the value at t0 for an empty window."""
    if t1 <= t0:
        return pattern.value(t0)
    return integral(pattern, t0, t1) / (t1 - t0)


class Constant:
    """The same ratio at all times."""

    def __init__(self, level: float) -> None:
        self.level = level

    def value(self, t: float) -> float:
        return self.level

    def edges(self, t0: float, t1: float) -> Iterable[float]:
        return ()


class Bursts:
    """``high`` for the first ``duty`` share of every ``period`` seconds, ``low`` for the rest."""

    def __init__(self, period: float, duty: float, high: float, low: float) -> None:
        self.period, self.duty, self.high, self.low = period, duty, high, low

    def value(self, t: float) -> float:
        return self.high if (t % self.period) < self.duty * self.period else self.low

    def edges(self, t0: float, t1: float) -> Iterable[float]:
        k = math.floor(t0 / self.period)
        while k * self.period < t1:
            for edge in (k * self.period, (k + self.duty) * self.period):
                if t0 < edge < t1:
                    yield edge
            k += 1


class Steps:
    """Step ``i`` holds its value until ``untils[i]`` seconds; then repeats or holds the last value."""

    def __init__(self, untils: list[float], values: list[float], repeat: bool) -> None:
        self.untils, self.values, self.repeat = untils, values, repeat
        self.cycle = untils[-1]

    def value(self, t: float) -> float:
        if self.repeat:
            t = t % self.cycle
        i = bisect.bisect_right(self.untils, t)
        return self.values[min(i, len(self.values) - 1)]

    def edges(self, t0: float, t1: float) -> Iterable[float]:
        if not self.repeat:
            return [u for u in self.untils if t0 < u < t1]
        out: list[float] = []
        k = math.floor(t0 / self.cycle)
        while k * self.cycle < t1:
            out.extend(k * self.cycle + u for u in (0.0, *self.untils) if t0 < k * self.cycle + u < t1)
            k += 1
        return out


class Noisy:
    """``base`` plus a deterministic offset in [-amplitude, amplitude] per 1/6 s slot, clipped to 0-1."""

    def __init__(self, base: Pattern, amplitude: float, seed: str) -> None:
        self.base, self.amplitude, self.seed = base, amplitude, seed

    def _offset(self, slot: int) -> float:
        digest = hashlib.blake2b(f"{self.seed}:{slot}".encode(), digest_size=8).digest()
        unit = int.from_bytes(digest, "big") / float(1 << 64)
        return (2.0 * unit - 1.0) * self.amplitude

    def value(self, t: float) -> float:
        raw = self.base.value(t) + self._offset(math.floor(t / SLOT_SECONDS))
        return min(1.0, max(0.0, raw))

    def edges(self, t0: float, t1: float) -> Iterable[float]:
        yield from self.base.edges(t0, t1)
        k = math.floor(t0 / SLOT_SECONDS) + 1
        while k * SLOT_SECONDS < t1:
            if k * SLOT_SECONDS > t0:
                yield k * SLOT_SECONDS
            k += 1


class Timeline:
    """A recorded step function: ``record(t, v)`` sets the value from ``t`` on (``t`` never decreases).

    Used for GPUs that follow a live training job: the phase observed at each refresh holds until
    the next one, and the recorded history stays the exact ground truth.
    """

    def __init__(self, initial: float) -> None:
        self._times: list[float] = [0.0]
        self._values: list[float] = [initial]
        self._lock = threading.Lock()

    def record(self, t: float, level: float) -> None:
        with self._lock:
            t = max(t, self._times[-1])
            if level == self._values[-1]:
                return
            if t == self._times[-1]:
                self._values[-1] = level
            else:
                self._times.append(t)
                self._values.append(level)

    def value(self, t: float) -> float:
        with self._lock:
            return self._values[max(0, bisect.bisect_right(self._times, t) - 1)]

    def edges(self, t0: float, t1: float) -> Iterable[float]:
        with self._lock:
            lo = bisect.bisect_right(self._times, t0)
            hi = bisect.bisect_left(self._times, t1)
            return self._times[lo:hi]
