"""One generator for all monitoring content: ``python -m monitoring`` (``--check`` reports drift).

The one config (exporter/gpu_exporter/thresholds.yml, read by gpu_exporter.thresholds) and the cause
table (gpu_exporter.verdict.causes) are built once into :class:`monitoring.model.Model` by :func:`build`:
each concern (monitoring.utilization, .causes, .evidence, .remedies, .cost, .efficiency) exports its records
and alerts, and the dashboards are built as Grafana models. Each writer below contributes
``generate(model) -> {path: text}``; :data:`GENERATORS` lists them, and ``__main__`` writes or checks their
union. No generator reads another's output. Every alert's runbook link is its name's section
(gpu_exporter.verdict.alerts.runbook_anchor), set for all alerts of a rules file in one pass
(monitoring.rules.runbooks).

Imports go one way: the writers (rules, dashboards, grafana_alerts) over the concerns, over the leaves
(model, paths, panels; the PromQL fragments are gpu_exporter.verdict.promql); tests/test_import_graph.py holds it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpu_exporter.thresholds import ThresholdsFile, read_thresholds_file

from monitoring import (
    causes,
    cost,
    dashboards,
    efficiency,
    evidence,
    funnel,
    grafana_alerts,
    remedies,
    rules,
    utilization,
)
from monitoring.model import Model
from monitoring.panels import Config


def build(config: ThresholdsFile | None = None) -> Model:
    """The model of ``config`` (default: the packaged thresholds.yml)."""
    config = read_thresholds_file() if config is None else config
    alerts = (*utilization.alerts(), *causes.alerts(), *evidence.alerts(), *efficiency.alerts())
    records = (*causes.records(), *evidence.records(), *remedies.records(), *cost.records(), *efficiency.records(),
               *funnel.records())
    return Model(config, alerts, records, dashboards.build(Config.load(config)))


GENERATORS: list[Callable[[Model], dict[Path, str]]] = [rules.generate, dashboards.generate, grafana_alerts.generate]
