"""One generator for all monitoring content: ``python -m monitoring`` (``--check`` reports drift).

The one config (exporter/gpu_exporter/thresholds.yml, read by gpu_exporter.thresholds) and the cause
table (gpu_exporter.verdict.causes) are built once into :class:`monitoring.model.Model`: the generated alerts
as objects with their parts, and the dashboards as Grafana models. Each module below contributes
``generate(model) -> {path: text}`` from that model; :data:`GENERATORS` lists them, and ``__main__``
writes or checks their union. No generator reads another's output.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from monitoring import dashboards, grafana_alerts, rules
from monitoring.model import Model

GENERATORS: list[Callable[[Model], dict[Path, str]]] = [rules.generate, dashboards.generate, grafana_alerts.generate]
