"""Where gpu-exporter's polling time goes on a node: cProfile of the poller, in-process.

The poller with every polling collector runs ``polls`` cycles on a generated scenario (real
clock, simulated NVML) under cProfile; the functions with the most own time come back with
their share. The simulated NVML's own functions are reported as one line, since on a real node
the driver takes their place. Example::

    profile = profile_polls(scenario, polls=20)
    print(profile.poll_ms, profile.top[0])
"""

from __future__ import annotations

import cProfile
import pstats
import time
from dataclasses import dataclass
from pathlib import Path

from gpu_exporter import simulate
from gpu_exporter.app import POLLING_COLLECTORS
from gpu_exporter.nvml import Nvml
from gpu_exporter.poller import Poller

SIMULATION_MARKER = "/gpu_exporter/simulate/"


@dataclass(frozen=True)
class Hotspot:
    """One function's own time over all profiled polls."""

    function: str
    calls: int
    own_percent: float


@dataclass(frozen=True)
class PollProfile:
    """Mean wall time of one poll (unprofiled and profiled) and the top functions by own time."""

    polls: int
    poll_ms: float
    simulation_percent: float
    top: list[Hotspot]


def _where(key: tuple[str, int, str]) -> str:
    filename, line, name = key
    if filename == "~":
        return name
    parts = Path(filename).parts
    for anchor in ("site-packages", "exporter", "lib"):
        if anchor in parts:
            parts = parts[len(parts) - parts[::-1].index(anchor):]
            break
    return f"{'/'.join(parts[-3:])}:{line} {name}"


def profile_polls(scenario: Path, polls: int, top: int = 10) -> PollProfile:
    """Time ``polls`` poller cycles on ``scenario``, then profile as many and rank functions by own time."""
    simulate.install(scenario)
    nvml = Nvml()
    poller = Poller(nvml, [cls() for cls in POLLING_COLLECTORS], poll_interval=1.0)
    try:
        nvml.init()
        poller.poll_once()  # discovery and first-poll caches
        started = time.perf_counter()
        for _ in range(polls):
            poller.poll_once()
        poll_ms = (time.perf_counter() - started) / polls * 1000
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(polls):
            poller.poll_once()
        profiler.disable()
    finally:
        nvml.shutdown()
        simulate.uninstall()
    stats = pstats.Stats(profiler)
    entries: dict[tuple[str, int, str], tuple[int, int, float, float, object]] = stats.stats  # type: ignore[attr-defined]
    total = sum(e[2] for e in entries.values()) or 1.0
    simulated = sum(e[2] for key, e in entries.items() if SIMULATION_MARKER in key[0])
    ranked = sorted(((key, e) for key, e in entries.items() if SIMULATION_MARKER not in key[0]),
                    key=lambda item: item[1][2], reverse=True)
    hotspots = [Hotspot(_where(key), e[1], e[2] / total * 100) for key, e in ranked[:top]]
    return PollProfile(polls, poll_ms, simulated / total * 100, hotspots)
