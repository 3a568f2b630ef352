"""The fleet overview dashboard (grafana/dashboards/gpu-fleet-overview.json, uid ``gpu-fleet``): which GPUs
run below the low threshold, for how long, who holds them and why; the fleet's effective-utilization row
comes from monitoring.funnel.
"""

from __future__ import annotations

from gpu_exporter import catalog as m
from gpu_exporter.verdict.alerts import UTILIZATION_LOW
from grafana_foundation_sdk.builders import dashboard as dash

from monitoring import funnel
from monitoring import panels as p
from monitoring.dashboards.shared import FLEET_UID, GPU_TABLE_LINK, RUN_TABLE_LINK, PanelKey, cause_runbooks, gpu_link

UNDERUSED = PanelKey(FLEET_UID, "Underused GPUs: owner and likely cause")
"""The table of GPUs below the low line with owner and cause (GpuUtilizationLow's and ...BelowTarget's Grafana
mirrors point at it)."""


def fleet(cfg: p.Config) -> dash.Dashboard:
    """Which GPUs run below the low threshold, for how long, who holds them and why."""
    low = cfg.text("utilization_low_threshold")
    pct = cfg.percent("utilization_low_threshold")
    c = cfg.cluster
    util = cfg.sel(m.GPU_UTILIZATION_AVG5M.name, "node")
    under = cfg.sel(m.GPU_UNDERUTILIZED_BOOL5M.name, "node")
    below = f"({util} < {low})"
    time_steps = p.steps(("green", None), ("orange", cfg.num("dashboard_time_below_warn")),
                         ("red", cfg.num("dashboard_time_below_critical")))
    board = p.dashboard(cfg, FLEET_UID, "GPU fleet overview",
                        f"Which GPUs run below {pct} utilization, for how long, who holds them and why.", "24h", [
                          p.variable(cfg, "node", "Node", m.GPU_INFO.name),
                          p.variable(cfg, "namespace", "Namespace", m.GPU_POD_INFO.name),
                          p.variable(cfg, "pod", "Pod", m.GPU_POD_INFO.name, "namespace"),
                        ])
    board = (board.with_row(dash.Row("Now"))
             .with_panel(p.stat_panel(
                 f"GPUs below {pct} now",
                 f"GPUs whose mean utilization over the last 5 minutes (busy-time counter) is below {pct}.",
                 p.query(f"sum({under})"), thresholds=p.steps(("green", None), ("orange", 1))))
             .with_panel(p.stat_panel("GPUs monitored", f"GPUs the exporters see now ({m.GPU_INFO.name} series).",
                                      p.query(f"count({cfg.sel(m.GPU_INFO.name, 'node')})")))
             .with_panel(p.stat_panel("Fleet utilization (5m)",
                                      "Mean utilization of all selected GPUs over the last 5 minutes.",
                                      p.query(f"avg({util})"), unit="percentunit", thresholds=cfg.utilization_steps()))
             .with_panel(p.stat_panel(
                 f"Time below {pct} (24h)",
                 f"Share of GPU time in the last 24 hours during which GPUs were below {pct} (mean over GPUs).",
                 p.query(f"avg(avg_over_time({under}[1d]))"), unit="percentunit", thresholds=time_steps))
             .with_panel(p.stat_panel(
                 "Idle GPU-hours (last hour)",
                 f"GPU-hours spent below {pct} utilization in the last hour, all selected nodes "
                 f"({m.NODE_IDLE_HOURS_INCREASE1H.name}).",
                 p.query(f"sum({cfg.sel(m.NODE_IDLE_HOURS_INCREASE1H.name, 'node')})"), unit="h"))
             .with_panel(p.stat_panel(
                 "Idle GPU-hours (24h)",
                 f"GPU-hours spent below {pct} in the last 24 hours: each GPU's share of the day below {pct} "
                 f"times 24 h, summed (like {m.NODE_IDLE_HOURS_INCREASE1H.name}, a GPU monitored for part of the "
                 "day counts as if that part were typical).",
                 p.query(f"sum(avg_over_time({under}[1d])) * 24"), unit="h"))
             .with_row(dash.Row("Utilization over time"))
             .with_panel(p.state_timeline(
                 "Utilization by GPU (5m mean)",
                 f"Each row is one GPU; red is below {pct}, yellow below the "
                 f"{cfg.percent('utilization_target')} target, green above. Click for the GPU's detail.",
                 p.query(util, f"{{{{{c}}}}} {{{{node}}}} GPU {{{{gpu}}}}"), unit="percentunit",
                 thresholds=cfg.utilization_steps(), w=24, h=9, legend=True, links=[gpu_link()]))
             .with_panel(p.utilization_timeseries(
                 cfg, "Utilization by node (5m mean)",
                 f"Mean utilization of each node's GPUs; the line is the {pct} threshold.",
                 [p.query(cfg.sel(m.NODE_UTILIZATION_AVG5M.name, "node"), f"{{{{{c}}}}} {{{{node}}}}")]))
             .with_panel(p.timeseries(
                 f"GPUs below {pct} by node", f"How many GPUs of each node were below {pct} over time.",
                 [p.query(f"sum {cfg.by('node')} ({under})", f"{{{{{c}}}}} {{{{node}}}}")],
                 unit="none", bars=True, stacked=True, fill=60))
             .with_panel(p.bar_gauge("Utilization by GPU model (5m mean)",
                                     f"Mean utilization per GPU model (name from {m.GPU_INFO.name}).",
                                     p.query(cfg.sel(m.MODEL_UTILIZATION_AVG5M.name), f"{{{{{c}}}}} {{{{name}}}}",
                                             instant=True), thresholds=cfg.utilization_steps()))
             .with_panel(p.bar_gauge(
                 "Utilization by namespace (5m mean)",
                 f"Mean utilization of the GPUs allocated to each Kubernetes namespace (from {m.GPU_POD_INFO.name}).",
                 p.query(cfg.sel(m.NAMESPACE_UTILIZATION_AVG5M.name, "namespace"), f"{{{{{c}}}}} {{{{namespace}}}}",
                         instant=True), thresholds=cfg.utilization_steps()))
             .with_panel(p.timeseries("Idle GPU-hours per hour by node",
                                      f"GPU-hours below {pct} in the trailing hour, per node.",
                                      [p.query(cfg.sel(m.NODE_IDLE_HOURS_INCREASE1H.name, "node"),
                                               f"{{{{{c}}}}} {{{{node}}}}")], unit="h", w=8))
             .with_row(dash.Row("Underused GPUs"))
             .with_panel(p.table_panel(
                 UNDERUSED.title,
                 f"GPUs below {pct} over the last 5 minutes, with their model, the pod or training run holding "
                 f"them, and the causes the cause engine found ({m.RUN_TRAINING_CAUSE_SHARE.name}: the share of time "
                 "that explains it, and the utilization the GPU could reach without it; see docs/runbooks.md). "
                 "Click a GPU for its detail dashboard, a run for the training-run dashboard.",
                 [below, *(f"{expr} and {cfg.on('uuid')} {below}" for expr in (
                     f"max {cfg.by('node', 'gpu', 'uuid', 'name')} ({cfg.sel(m.GPU_INFO.name, 'node')})",
                     cfg.sel(m.GPU_MEMORY_USED_RATIO.name, "node"),
                     cfg.sel(m.GPU_WORKLOAD_INFO.name, "namespace", "pod"),
                     f"max {cfg.by('uuid', 'code', 'remedy')} ({cfg.sel(m.RUN_TRAINING_CAUSE_SHARE.name)})",
                     f"max {cfg.by('uuid', 'code', 'remedy')} "
                     f"({cfg.sel(m.RUN_TRAINING_CAUSE_PROJECTED_UTILIZATION.name)})"))],
                 unit="percentunit", w=24, h=10,
                 hide=("Value #B", "Value #D", "container"),
                 order=(c, "node", "gpu", "name", "Value #A", "Value #C", "namespace", "pod", "run", "code",
                        "remedy", "Value #E", "Value #F", "uuid"),
                 rename={"Value #A": "Utilization (5m)", "Value #C": "Memory used", "name": "Model",
                         "code": "Cause", "remedy": "Likely remedy", "Value #E": "Share of time",
                         "Value #F": "Could reach"},
                 overrides={"Utilization (5m)": {"custom_cellOptions": {"type": "color-background"},
                                                 "thresholds": cfg.utilization_steps().build(),
                                                 "color": {"mode": "thresholds"}},
                            "gpu": {"links": [GPU_TABLE_LINK]}, "run": {"links": [RUN_TABLE_LINK]}},
                 sort_by="Utilization (5m)", panel_links=cause_runbooks(cfg, UTILIZATION_LOW.name))))
    return funnel.fleet_row(cfg, board)
