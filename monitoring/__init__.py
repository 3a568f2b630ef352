"""One generator for all monitoring content: ``python -m monitoring`` (``--check`` reports drift).

Each module below contributes ``generate() -> {path: text}`` from the one config
(exporter/gpu_exporter/thresholds.yml and the cause table in gpu_exporter.causes);
:data:`GENERATORS` lists them, and ``__main__`` writes or checks their union.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from monitoring import dashboards, grafana_alerts, rules

GENERATORS: list[Callable[[], dict[Path, str]]] = [rules.generate, dashboards.generate, grafana_alerts.generate]
