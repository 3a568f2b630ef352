"""The five Grafana dashboards (grafana/dashboards/*.json), built with grafana-foundation-sdk.

The problem: operators need the same answers in Grafana that the rules and ``diagnose`` give (which
GPUs idle, who holds them, why), for one cluster or many, without the dashboards drifting from the
thresholds. Every number below comes from the one config (:class:`monitoring.panels.Config`), every
query filters on the ``$cluster`` variable (label from ``cluster_label``) and keeps that label in
aggregations and joins, and the cause panels read only the cause-engine recording rules
(``run:gpu_training_cause:share`` and ``:projected_utilization``). Example::

    python -m monitoring          # rewrites grafana/dashboards/*.json among the rest

One module per dashboard, each with its builder: ``fleet_overview`` (:func:`fleet`), ``node``
(:func:`node_detail`), ``training`` (:func:`training_run`), ``health`` (:func:`exporter_health`) and
``fleet_cost`` (:func:`cost`); ``shared`` holds what they share (the uids, the links between the
dashboards, the cause runbook links, :class:`PanelKey`). This package gathers them into :data:`DASHBOARDS`,
:func:`build` and :func:`generate`.

Project imports: gpu_exporter.catalog, gpu_exporter.verdict, monitoring.funnel, monitoring.model, monitoring.panels,
monitoring.paths.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard as dash

from monitoring.dashboards.fleet_cost import cost
from monitoring.dashboards.fleet_overview import fleet
from monitoring.dashboards.health import exporter_health
from monitoring.dashboards.node import node_detail
from monitoring.dashboards.training import training_run
from monitoring.model import Model
from monitoring.panels import Config, model, render
from monitoring.paths import DASHBOARD_DIR

DASHBOARDS: dict[str, Callable[[Config], dash.Dashboard]] = {
    "gpu-fleet-overview.json": fleet,
    "gpu-node-detail.json": node_detail,
    "gpu-training-run.json": training_run,
    "gpu-exporter-health.json": exporter_health,
    "gpu-fleet-cost.json": cost,
}


def build(cfg: Config) -> dict[str, dict[str, Any]]:
    """The five dashboards as Grafana JSON models, by file name (part of :class:`monitoring.model.Model`)."""
    return {name: model(make(cfg)) for name, make in DASHBOARDS.items()}


def generate(model: Model) -> dict[Path, str]:
    """``{grafana/dashboards/<name>.json: JSON}`` for the five dashboards."""
    return {DASHBOARD_DIR / name: render(board) for name, board in model.dashboards.items()}
