"""What the five dashboard builders share: each dashboard's uid, the links from a table row or a series
to a GPU's and a training run's dashboard, the runbook links of the causes, and :class:`PanelKey`, the
identity of a panel a Grafana-managed alert points at (monitoring.grafana_alerts). The builders
(monitoring.dashboards.fleet_overview, .node, .training, .health, .fleet_cost) import these; this module
imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_exporter.verdict.causes import CAUSES
from grafana_foundation_sdk.builders import dashboard as dash

from monitoring.panels import Config, link_url, runbook_links

FLEET_UID = "gpu-fleet"
NODE_UID = "gpu-node"
RUN_UID = "gpu-training-run"
HEALTH_UID = "gpu-exporter-health"
COST_UID = "gpu-fleet-cost"
"""The dashboards' uids: their URLs (``/d/<uid>``), the links between them and the Grafana alerts' targets."""

GPU_TABLE_LINK = {"title": "GPU detail",
                  "url": link_url(NODE_UID, node="${__data.fields.node}", gpu="${__data.fields.gpu}")}
RUN_TABLE_LINK = {"title": "Training run ${__data.fields.run}",
                  "url": link_url(RUN_UID, run="${__data.fields.run}")}
"""A table cell's links to the row's GPU and to its training run."""


@dataclass(frozen=True)
class PanelKey:
    """A panel that something outside its dashboard names (a Grafana alert's ``__panelId__``): the uid of
    its dashboard and its title. The builder titles the panel with ``title`` and the alert looks it up with
    the same object, so a renamed panel renames its alerts' target with it."""

    dashboard: str
    title: str


def gpu_link() -> dash.DashboardLink:
    """A series' link to its GPU on the node dashboard (series labelled ``node`` and ``gpu``)."""
    return dash.DashboardLink("GPU detail: ${__field.labels.node} GPU ${__field.labels.gpu}").url(
        link_url(NODE_UID, node="${__field.labels.node}", gpu="${__field.labels.gpu}"))


def cause_runbooks(cfg: Config, first: str) -> list[dash.DashboardLink]:
    """Runbook links of ``first`` and of every cause in the cause table (gpu_exporter.verdict.causes.CAUSES)."""
    return runbook_links(cfg, [(first, first), *((c.label, c.alert) for c in CAUSES)])
