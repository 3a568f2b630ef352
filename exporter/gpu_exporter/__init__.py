"""gpu_exporter: a Prometheus exporter that finds underused NVIDIA GPUs and explains why."""

from __future__ import annotations

__version__ = "0.1.0"
