"""The fleet cost dashboard (grafana/dashboards/gpu-fleet-cost.json, uid ``gpu-fleet-cost``): what the GPUs
below target lost over the time range, in GPU-hours and money, by cause, team, namespace, node and
workload; the effective-utilization row comes from monitoring.funnel.
"""

from __future__ import annotations

from gpu_exporter import catalog as m
from gpu_exporter.verdict.alerts import UTILIZATION_BELOW_TARGET
from gpu_exporter.verdict.fleet import NONE, TEAM_TAG
from grafana_foundation_sdk.builders import dashboard as dash

from monitoring import funnel
from monitoring import panels as p
from monitoring.dashboards.shared import COST_UID, RUN_TABLE_LINK, cause_runbooks


def cost(cfg: p.Config) -> dash.Dashboard:
    """What the GPUs below target lost over the time range, in GPU-hours and money, and why (the
    ``gpu-cost.recording`` series of monitoring.cost, with ``gpu-exporter report --fleet``'s definitions)."""
    target = cfg.percent("utilization_target")
    c = cfg.cluster
    below = cfg.sel(m.GPU_BELOW_TARGET_BOOL.name, "node")
    idle = cfg.sel(m.GPU_IDLE_BELOW_TARGET_RATIO.name, "node")
    team = f"tag_{TEAM_TAG}"

    def hours(series: str, *by: str, over: str = "sum_over_time") -> str:
        """GPU-hours of ``series`` over the dashboard's range: its values summed at every ``$__interval``
        (each stands for that interval), in hours; summed over the GPUs, or by ``by``."""
        return (f"sum {cfg.by(*by) if by else ''} ({over}({series}[$__range:$__interval])) "
                f"* $__interval_ms / 3600000").replace("sum  (", "sum(")

    def named(series: str, label: str) -> str:
        """``series`` with an empty or absent ``label`` (summed: each group without it) named as report --fleet
        names it (``(none)``)."""
        return f'label_replace({series}, "{label}", "{NONE}", "{label}", "")'

    teams = (f"{idle} * {cfg.on('run')} group_left ({team}) topk {cfg.by('run')} (1, max {cfg.by('run', team)} "
             f'({m.GPU_TRAINING_RUN_INFO.name}{{{c}=~"$cluster", {team}!=""}}))')
    lost = hours(idle)
    workloads = hours(idle, "node", "namespace", "pod", "run", "code")
    board = p.dashboard(cfg, COST_UID, "GPU fleet cost",
                        f"What the GPUs below the {target} utilization target lost over the time range, in GPU-hours "
                        "and money, by cause, team, namespace and node.", "24h", [
                          p.variable(cfg, "node", "Node", m.GPU_INFO.name),
                          p.textbox("price", "Price per GPU-hour", cfg.text("dashboard_gpu_hour_price"),
                                    "What one GPU-hour costs, in your currency (default dashboard_gpu_hour_price of "
                                    "thresholds.yml): money lost = GPU-hours lost x price."),
                        ])
    board = (board.with_row(dash.Row("Over the time range"))
             .with_panel(p.stat_panel(
                 "GPU-hours in range", f"GPU-hours of the selected GPUs over the time range (each GPU with a "
                 f"utilization, {m.GPU_BELOW_TARGET_BOOL.name} counted at every interval).",
                 p.query(hours(below, over="count_over_time"), instant=True), unit="h", w=6))
             .with_panel(p.stat_panel(
                 "GPU-hours below target", f"GPU-hours during which a GPU had work and its useful utilization "
                 f"was below the {target} target ({m.GPU_BELOW_TARGET_BOOL.name}; report --fleet's 'below target').",
                 p.query(hours(below), instant=True), unit="h", w=6))
             .with_panel(p.stat_panel(
                 "GPU-hours lost", "The idle share (1 - useful utilization) of the GPUs below target, summed over "
                 f"the time range ({m.GPU_IDLE_BELOW_TARGET_RATIO.name}): the capacity lost.",
                 p.query(lost, instant=True), unit="h", w=6, thresholds=p.steps(("green", None), ("orange", 1))))
             .with_panel(p.stat_panel(
                 "Money lost", "GPU-hours lost times the price per GPU-hour (the price variable; default "
                 f"{cfg.text('dashboard_gpu_hour_price')} from thresholds.yml), in the price's currency.",
                 p.query(f"{lost} * $price", instant=True), w=6, thresholds=p.steps(("green", None), ("orange", 1)))))
    return (funnel.cost_row(cfg, board, hours, cause_runbooks(cfg, "GpuSmActivityLow"))
            .with_row(dash.Row("Where the hours went"))
            .with_panel(p.bar_gauge(
                "GPU-hours lost by cause", "GPU-hours lost by the code of each GPU's main cause: a live run's "
                "cause (the allocator first, then the biggest share), else the evidence of an uninstrumented "
                f"job; {NONE} where none is known (idle but allocated, not instrumented, no single cause). "
                "Runbooks: docs/runbooks.md.",
                p.query(named(hours(idle, "code"), "code"), f"{{{{{c}}}}} {{{{code}}}}", instant=True), unit="h",
                panel_links=cause_runbooks(cfg, UTILIZATION_BELOW_TARGET.name)))
            .with_panel(p.bar_gauge(
                "GPU-hours lost by team", f"GPU-hours lost on the GPUs of training runs tagged with a team "
                f"(label {team} of {m.GPU_TRAINING_RUN_INFO.name}: GPU_EXPORTER_TAGS=\"{TEAM_TAG}=vision\"); "
                "GPUs without such a run do not show here.",
                p.query(hours(f"({teams})", team), f"{{{{{c}}}}} {{{{{team}}}}}", instant=True), unit="h"))
            .with_panel(p.bar_gauge(
                "GPU-hours lost by namespace", "GPU-hours lost by the Kubernetes namespace of the pod holding "
                f"the GPU ({m.GPU_WORKLOAD_INFO.name}); {NONE}: no pod.",
                p.query(named(hours(idle, "namespace"), "namespace"), f"{{{{{c}}}}} {{{{namespace}}}}",
                        instant=True), unit="h"))
            .with_panel(p.bar_gauge(
                "GPU-hours lost by node", "GPU-hours lost by node.",
                p.query(hours(idle, "node"), f"{{{{{c}}}}} {{{{node}}}}", instant=True), unit="h", w=12))
            .with_panel(p.timeseries(
                "Capacity lost by cause", "GPUs' worth of idle capacity below target at each moment (the sum "
                f"of {m.GPU_IDLE_BELOW_TARGET_RATIO.name}), stacked by the code of the main cause.",
                [p.query(named(f"sum {cfg.by('code')} ({idle})", "code"), f"{{{{{c}}}}} {{{{code}}}}")],
                unit="none", stacked=True, fill=60, w=12))
            .with_row(dash.Row("Workloads"))
            .with_panel(p.table_panel(
                "Workloads by GPU-hours lost", "The GPUs' workloads (node, namespace, pod, training run) and "
                "main cause by GPU-hours lost over the time range, most first, with the money lost at the price "
                "variable. Click a run for the training-run dashboard.",
                [named(workloads, "code"), named(f"{workloads} * $price", "code")],
                w=24, h=10, order=(c, "node", "namespace", "pod", "run", "code", "Value #A", "Value #B"),
                rename={"code": "Cause", "Value #A": "GPU-hours lost", "Value #B": "Money lost"},
                overrides={"GPU-hours lost": {"unit": "h"}, "run": {"links": [RUN_TABLE_LINK]}},
                sort_by="GPU-hours lost", sort_desc=True,
                panel_links=cause_runbooks(cfg, UTILIZATION_BELOW_TARGET.name))))
