"""Put a simulated node under the real pynvml, and take it away again.

>>> node = install("exporter/gpu_exporter/simulate/scenarios/bursty.yaml")  # doctest: +SKIP
>>> import pynvml; pynvml.nvmlInit(); pynvml.nvmlDeviceGetCount()  # doctest: +SKIP
1
>>> uninstall()  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pynvml

from gpu_exporter.simulate.fake_nvml import FakeNvmlLibrary
from gpu_exporter.simulate.node import SimulatedNode
from gpu_exporter.simulate.scenario import Scenario, load_scenario


def install(scenario: Scenario | str | Path | None = None, *,
            clock: Callable[[], float] | None = None) -> SimulatedNode:
    """Install simulated GPUs as pynvml's NVML library; returns the node to steer them (``with install() as node:``
    uninstalls at the end).

    ``scenario`` is a loaded Scenario, a YAML path, or None for the packaged default.
    ``clock`` returns seconds (default ``time.monotonic``); simulated time 0 is now.
    Raises RuntimeError if the real NVML library is already loaded in this process.
    """
    loaded = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    node = SimulatedNode(loaded, clock, on_exit=uninstall)
    with pynvml.libLoadLock:
        current = pynvml.nvmlLib
        if current is not None and not isinstance(current, FakeNvmlLibrary):
            raise RuntimeError("the real NVML library is already loaded in this process; "
                               "install the simulation before the first nvmlInit")
        if isinstance(current, FakeNvmlLibrary):
            current.node.close()
        pynvml.nvmlLib = FakeNvmlLibrary(node)
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
    return node


def uninstall() -> None:
    """Remove the simulation: pynvml returns to "library not loaded" (no-op when none is installed)."""
    with pynvml.libLoadLock:
        current = pynvml.nvmlLib
        if not isinstance(current, FakeNvmlLibrary):
            return
        current.node.close()
        pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0


def installed() -> SimulatedNode | None:
    """The node currently installed under pynvml, or None."""
    current = pynvml.nvmlLib
    return current.node if isinstance(current, FakeNvmlLibrary) else None
