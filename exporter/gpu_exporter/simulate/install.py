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
        if pynvml.nvmlLib is not None and installed() is None:
            raise RuntimeError("the real NVML library is already loaded in this process; "
                               "install the simulation before the first nvmlInit")
        _replace(FakeNvmlLibrary(node))
    return node


def uninstall() -> None:
    """Remove the simulation: pynvml returns to "library not loaded" (no-op when none is installed)."""
    with pynvml.libLoadLock:
        if installed() is not None:
            _replace(None)


def _replace(library: FakeNvmlLibrary | None) -> None:
    """Make ``library`` pynvml's (with ``libLoadLock`` held), closing the node of the simulation it replaces."""
    node = installed()
    if node is not None:
        node.close()
    pynvml.nvmlLib = library
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml._nvmlLib_refcount = 0


def installed() -> SimulatedNode | None:
    """The node currently installed under pynvml, or None."""
    current = pynvml.nvmlLib
    return current.node if isinstance(current, FakeNvmlLibrary) else None
