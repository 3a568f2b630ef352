"""Simulated GPUs behind the real pynvml, for tests, CI and demos without a GPU.

>>> from gpu_exporter.simulate import install, uninstall
>>> node = install()            # the packaged 4-GPU default scenario
>>> import pynvml
>>> pynvml.nvmlInit()
>>> pynvml.nvmlDeviceGetCount()
4
>>> uninstall()

Two sides, apart, that share only the channel files:

* the exporter's side, in import order: ``patterns`` (utilization over time), ``spec`` (the node's dataclasses),
  ``scenario`` (the YAML node), ``channel`` (the busy files: written by the job, read here), ``node``
  (:class:`SimulatedNode`: time, faults, truth), ``fake_nvml`` (the C library pynvml calls), ``install`` (puts it
  under pynvml), ``dcgm_exporter`` (a stand-in dcgm-exporter reading the same node);
* the job's side: ``device`` (simulated GPUs doing the job's work: ``AsyncDevice``, ``OpsDevice``, the
  ``python -m gpu_exporter.simulate.device`` CLI) and ``torch_cuda`` (``torch.cuda`` over an ``AsyncDevice``).

A module imports only modules listed before it on its side, and the job's side only ``channel`` of the
exporter's (tests/test_import_graph.py checks both). This package imports the exporter's side (below), so
importing ``gpu_exporter.simulate.device`` loads it too, without installing anything.

Project imports: gpu_exporter.catalog, gpu_exporter.yamlfile.
"""

from __future__ import annotations

from gpu_exporter.simulate.install import install, installed, uninstall
from gpu_exporter.simulate.node import SimulatedNode
from gpu_exporter.simulate.scenario import Scenario, ScenarioError, load_scenario

__all__ = ["Scenario", "ScenarioError", "SimulatedNode", "install", "installed", "load_scenario", "uninstall"]
