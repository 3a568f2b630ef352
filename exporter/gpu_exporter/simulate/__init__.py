"""Simulated GPUs behind the real pynvml, for tests, CI and demos without a GPU.

>>> from gpu_exporter.simulate import install, uninstall
>>> node = install()            # the packaged 4-GPU default scenario
>>> import pynvml
>>> pynvml.nvmlInit()
>>> pynvml.nvmlDeviceGetCount()
4
>>> uninstall()
"""

from __future__ import annotations

from gpu_exporter.simulate.install import install, installed, uninstall
from gpu_exporter.simulate.node import SimulatedNode
from gpu_exporter.simulate.scenario import Scenario, ScenarioError, load_scenario

__all__ = ["Scenario", "ScenarioError", "SimulatedNode", "install", "installed", "load_scenario", "uninstall"]
