"""The five Grafana dashboards (grafana/dashboards/*.json), built with grafana-foundation-sdk.

The problem: operators need the same answers in Grafana that the rules and ``diagnose`` give (which
GPUs idle, who holds them, why), for one cluster or many, without the dashboards drifting from the
thresholds. Every number below comes from the one config (:class:`monitoring.panels.Config`), every
query filters on the ``$cluster`` variable (label from ``cluster_label``) and keeps that label in
aggregations and joins, and the cause panels read only the cause-engine recording rules
(``run:gpu_training_cause:share`` and ``:projected_utilization``). Example::

    python -m monitoring          # rewrites grafana/dashboards/*.json among the rest
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_exporter import catalog as m
from gpu_exporter.verdict.alerts import TRAINING_BELOW_TARGET, UTILIZATION_BELOW_TARGET, UTILIZATION_LOW
from gpu_exporter.verdict.causes import CAUSES
from gpu_exporter.verdict.fleet import NONE, TEAM_TAG
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus
from grafana_foundation_sdk.models import common as cm

from monitoring import funnel
from monitoring.model import Model
from monitoring.panels import (
    Config,
    bar_gauge,
    dashboard,
    link_url,
    model,
    override,
    query,
    render,
    runbook_links,
    stat_panel,
    state_timeline,
    steps,
    table_panel,
    table_query,
    textbox,
    timeseries,
    utilization_timeseries,
    variable,
)
from monitoring.paths import DASHBOARD_DIR

GPU_TABLE_LINK = {"title": "GPU detail",
                  "url": link_url("gpu-node", node="${__data.fields.node}", gpu="${__data.fields.gpu}")}
RUN_TABLE_LINK = {"title": "Training run ${__data.fields.run}",
                  "url": link_url("gpu-training-run", run="${__data.fields.run}")}
"""A table cell's links to the row's GPU and to its training run."""


def gpu_link() -> dash.DashboardLink:
    return dash.DashboardLink("GPU detail: ${__field.labels.node} GPU ${__field.labels.gpu}").url(
        link_url("gpu-node", node="${__field.labels.node}", gpu="${__field.labels.gpu}"))


def fleet(cfg: Config) -> dash.Dashboard:
    """Which GPUs run below the low threshold, for how long, who holds them and why."""
    low = cfg.text("utilization_low_threshold")
    pct = f"{cfg.num('utilization_low_threshold') * 100:g}%"
    c = cfg.cluster
    util = cfg.sel(m.GPU_UTILIZATION_AVG5M.name, "node")
    under = cfg.sel(m.GPU_UNDERUTILIZED_BOOL5M.name, "node")
    below = f"({util} < {low})"
    time_steps = steps(("green", None), ("orange", cfg.num("dashboard_time_below_warn")),
                       ("red", cfg.num("dashboard_time_below_critical")))
    board = dashboard(cfg, "gpu-fleet", "GPU fleet overview",
                      f"Which GPUs run below {pct} utilization, for how long, who holds them and why.", "24h", [
                          variable(cfg, "node", "Node", m.GPU_INFO.name),
                          variable(cfg, "namespace", "Namespace", m.GPU_POD_INFO.name),
                          variable(cfg, "pod", "Pod", m.GPU_POD_INFO.name, "namespace"),
                      ])
    board = (board.with_row(dash.Row("Now"))
             .with_panel(stat_panel(
                 f"GPUs below {pct} now",
                 f"GPUs whose mean utilization over the last 5 minutes (busy-time counter) is below {pct}.",
                 query(f"sum({under})"), thresholds=steps(("green", None), ("orange", 1))))
             .with_panel(stat_panel("GPUs monitored", f"GPUs the exporters see now ({m.GPU_INFO.name} series).",
                                    query(f"count({cfg.sel(m.GPU_INFO.name, 'node')})")))
             .with_panel(stat_panel("Fleet utilization (5m)",
                                    "Mean utilization of all selected GPUs over the last 5 minutes.",
                                    query(f"avg({util})"), unit="percentunit", thresholds=cfg.utilization_steps()))
             .with_panel(stat_panel(
                 f"Time below {pct} (24h)",
                 f"Share of GPU time in the last 24 hours during which GPUs were below {pct} (mean over GPUs).",
                 query(f"avg(avg_over_time({under}[1d]))"), unit="percentunit", thresholds=time_steps))
             .with_panel(stat_panel(
                 "Idle GPU-hours (last hour)",
                 f"GPU-hours spent below {pct} utilization in the last hour, all selected nodes "
                 f"({m.NODE_IDLE_HOURS_INCREASE1H.name}).",
                 query(f"sum({cfg.sel(m.NODE_IDLE_HOURS_INCREASE1H.name, 'node')})"), unit="h"))
             .with_panel(stat_panel(
                 "Idle GPU-hours (24h)",
                 f"GPU-hours spent below {pct} in the last 24 hours: each GPU's share of the day below {pct} "
                 f"times 24 h, summed (like {m.NODE_IDLE_HOURS_INCREASE1H.name}, a GPU monitored for part of the "
                 "day counts as if that part were typical).",
                 query(f"sum(avg_over_time({under}[1d])) * 24"), unit="h"))
             .with_row(dash.Row("Utilization over time"))
             .with_panel(state_timeline(
                 "Utilization by GPU (5m mean)",
                 f"Each row is one GPU; red is below {pct}, yellow below the "
                 f"{cfg.num('utilization_target') * 100:g}% target, green above. Click for the GPU's detail.",
                 query(util, f"{{{{{c}}}}} {{{{node}}}} GPU {{{{gpu}}}}"), unit="percentunit",
                 thresholds=cfg.utilization_steps(), w=24, h=9, legend=True, links=[gpu_link()]))
             .with_panel(utilization_timeseries(
                 cfg, "Utilization by node (5m mean)",
                 f"Mean utilization of each node's GPUs; the line is the {pct} threshold.",
                 [query(cfg.sel(m.NODE_UTILIZATION_AVG5M.name, "node"), f"{{{{{c}}}}} {{{{node}}}}")]))
             .with_panel(timeseries(
                 f"GPUs below {pct} by node", f"How many GPUs of each node were below {pct} over time.",
                 [query(f"sum {cfg.by('node')} ({under})", f"{{{{{c}}}}} {{{{node}}}}")],
                 unit="none", bars=True, stacked=True, fill=60))
             .with_panel(bar_gauge("Utilization by GPU model (5m mean)",
                                   f"Mean utilization per GPU model (name from {m.GPU_INFO.name}).",
                                   query(cfg.sel(m.MODEL_UTILIZATION_AVG5M.name), f"{{{{{c}}}}} {{{{name}}}}",
                                         instant=True), thresholds=cfg.utilization_steps()))
             .with_panel(bar_gauge(
                 "Utilization by namespace (5m mean)",
                 f"Mean utilization of the GPUs allocated to each Kubernetes namespace (from {m.GPU_POD_INFO.name}).",
                 query(cfg.sel(m.NAMESPACE_UTILIZATION_AVG5M.name, "namespace"), f"{{{{{c}}}}} {{{{namespace}}}}",
                       instant=True), thresholds=cfg.utilization_steps()))
             .with_panel(timeseries("Idle GPU-hours per hour by node",
                                    f"GPU-hours below {pct} in the trailing hour, per node.",
                                    [query(cfg.sel(m.NODE_IDLE_HOURS_INCREASE1H.name, "node"),
                                           f"{{{{{c}}}}} {{{{node}}}}")], unit="h", w=8))
             .with_row(dash.Row("Underused GPUs"))
             .with_panel(table_panel(
                 "Underused GPUs: owner and likely cause",
                 f"GPUs below {pct} over the last 5 minutes, with their model, the pod or training run holding "
                 f"them, and the causes the cause engine found ({m.RUN_TRAINING_CAUSE_SHARE.name}: the share of time "
                 "that explains it, and the utilization the GPU could reach without it; see docs/runbooks.md). "
                 "Click a GPU for its detail dashboard, a run for the training-run dashboard.",
                 [table_query(below), *(table_query(f"{expr} and {cfg.on('uuid')} {below}") for expr in (
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
                 overrides=[override("Utilization (5m)", custom_cellOptions={"type": "color-background"},
                                     thresholds=cfg.utilization_steps().build(), color={"mode": "thresholds"}),
                            override("gpu", links=[GPU_TABLE_LINK]),
                            override("run", links=[RUN_TABLE_LINK])],
                 sort_by="Utilization (5m)", panel_links=cause_runbooks(cfg, UTILIZATION_LOW.name))))
    return funnel.fleet_row(cfg, board)


def cause_runbooks(cfg: Config, first: str) -> list[dash.DashboardLink]:
    """Runbook links of ``first`` and of every cause in the cause table (gpu_exporter.verdict.causes.CAUSES)."""
    return runbook_links(cfg, [(first, first), *((c.label, c.alert) for c in CAUSES)])


def node_detail(cfg: Config) -> dash.Dashboard:
    """Everything one node's GPUs report."""
    pct = f"{cfg.num('utilization_low_threshold') * 100:g}%"

    def sel(metric: str, **fixed: str) -> str:
        return cfg.sel(metric, "node", "gpu", **fixed)

    def series(metric: str, legend: str = "GPU {{gpu}}") -> list[prometheus.Dataquery]:
        return [query(sel(metric), legend)]

    board = dashboard(cfg, "gpu-node", "GPU node detail",
                      "Everything one node's GPUs report: utilization from busy-time counters, memory, power, "
                      "temperature, clocks and throttling, GPM activity, MIG, processes, pods and XID errors.", "3h", [
                          variable(cfg, "node", "Node", m.GPU_INFO.name, multi=False),
                          variable(cfg, "gpu", "GPU", m.GPU_INFO.name, "node"),
                      ])
    identity = cfg.by("node", "gpu", "uuid", "name", "driver_version", "cuda_version", "architecture", "mig_mode")
    gpm = [(m.GPU_SM_ACTIVE_RATIO.name, "SM active"), (m.GPU_SM_OCCUPANCY_RATIO.name, "SM occupancy"),
           (m.GPU_TENSOR_ACTIVE_RATIO.name, "tensor active"), (m.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO.name, "DRAM BW")]
    board = (board.with_row(dash.Row("Utilization"))
             .with_panel(utilization_timeseries(
                 cfg, "GPU utilization (busy-time counter)",
                 f"rate({m.GPU_BUSY_SECONDS_TOTAL.name}): the true mean share of time a kernel ran, integrated "
                 "from NVML "
                 f"samples polled faster than the scrape, so it does not alias. The line is {pct}.",
                 [query(f"rate({sel(m.GPU_BUSY_SECONDS_TOTAL.name)}[$__rate_interval])", "GPU {{gpu}}"),
                  query(sel(m.GPU_UTILIZATION_AVG5M.name), "GPU {{gpu}} (5m mean)")], w=16))
             .with_panel(stat_panel("Utilization, last hour",
                                    f"rate({m.GPU_BUSY_SECONDS_TOTAL.name}[1h]): mean utilization per GPU over the "
                                    "last hour, computed for this node's GPUs only when the dashboard asks.",
                                    query(f"rate({sel(m.GPU_BUSY_SECONDS_TOTAL.name)}[1h])", "GPU {{gpu}}"), unit="percentunit",
                                    thresholds=cfg.utilization_steps(), w=8, h=8))
             .with_panel(timeseries(
                 "Memory-controller utilization",
                 f"rate({m.GPU_MEMORY_BUSY_SECONDS_TOTAL.name}): share of time the memory controller was busy.",
                 [query(f"rate({sel(m.GPU_MEMORY_BUSY_SECONDS_TOTAL.name)}[$__rate_interval])", "GPU {{gpu}}")],
                 unit="percentunit", h=7))
             .with_panel(timeseries(
                 "SM and tensor activity (GPM, Hopper and newer)",
                 "GPM metrics of the whole GPU (mig_uuid empty) or of each MIG instance: SM active, SM occupancy, "
                 "tensor pipes active, DRAM bandwidth. Empty on GPUs older than Hopper.",
                 [query(sel(metric), f"GPU {{{{gpu}}}} {{{{mig_uuid}}}} {name}") for metric, name in gpm],
                 unit="percentunit", h=7)))
    board = (funnel.node_panels(cfg, board)
             .with_row(dash.Row("Memory"))
             .with_panel(timeseries(
                 "Memory used vs total", "Framebuffer memory used, reserved by the driver, and installed.",
                 [query(sel(f"gpu_memory_{kind}_bytes"), f"GPU {{{{gpu}}}} {kind}")
                  for kind in ("used", "reserved", "total")], unit="bytes", w=16, dashed=".*total"))
             .with_panel(bar_gauge(
                 "Memory used", "Used share of each GPU's memory.",
                 query(sel(m.GPU_MEMORY_USED_RATIO.name), "GPU {{gpu}}", instant=True),
                 thresholds=steps(("green", None), ("orange", cfg.num("dashboard_memory_warn_ratio")),
                                  ("red", cfg.num("memory_nearly_full_ratio")))))
             .with_panel(timeseries(
                 "MIG instances: memory used", "Memory used by each MIG instance against its size "
                 f"(profile from {m.GPU_MIG_INFO.name}).",
                 [query(f"{sel(m.GPU_MIG_MEMORY_USED_BYTES.name)} * {cfg.on('mig_uuid')} group_left (profile) "
                        f"max {cfg.by('mig_uuid', 'profile')} ({cfg.sel(m.GPU_MIG_INFO.name)})",
                        "GPU {{gpu}} {{profile}} GI {{gpu_instance}} used"),
                  query(sel(m.GPU_MIG_MEMORY_TOTAL_BYTES.name), "GPU {{gpu}} GI {{gpu_instance}} total")],
                 unit="bytes", w=24, h=7, dashed=".*total"))
             .with_row(dash.Row("Power, temperature, clocks"))
             .with_panel(timeseries("Power vs limit", "Power draw and the enforced power limit.",
                                    [query(sel(m.GPU_POWER_WATTS.name), "GPU {{gpu}} draw"),
                                     query(sel(m.GPU_POWER_LIMIT_WATTS.name), "GPU {{gpu}} limit")],
                                    unit="watt", w=8, dashed=".*limit"))
             .with_panel(timeseries(
                 "Temperature", "GPU die temperature.", series(m.GPU_TEMPERATURE_CELSIUS.name), unit="celsius", w=8,
                 thresholds=steps(("green", None), ("orange", cfg.num("dashboard_temperature_warn_celsius")),
                                  ("red", cfg.num("dashboard_temperature_critical_celsius"))),
                 threshold_style=cm.GraphThresholdsStyleMode.DASHED))
             .with_panel(timeseries("Energy per hour", "Energy drawn, from the energy counter (kWh per hour).",
                                    [query(f"increase({sel(m.GPU_ENERGY_JOULES_TOTAL.name)}[1h]) / 3.6e6",
                                           "GPU {{gpu}}")],
                                    unit="kwatth", w=8))
             .with_panel(timeseries("Clocks", "Current SM and memory clocks.",
                                    [query(sel(m.GPU_SM_CLOCK_HERTZ.name), "GPU {{gpu}} SM"),
                                     query(sel(m.GPU_MEMORY_CLOCK_HERTZ.name), "GPU {{gpu}} memory")],
                                    unit="hertz", w=8))
             .with_panel(state_timeline(
                 "Clock event (throttle) reasons",
                 "Which clock event reasons were active: power, thermal and hardware slowdowns make a busy GPU "
                 "slower than rated (the exporter's device.clock_event_reasons adds others, e.g. gpu_idle).",
                 query(sel(m.GPU_CLOCK_EVENT_ACTIVE.name), "GPU {{gpu}} {{reason}}"),
                 unit="bool_on_off", thresholds=steps(("transparent", None), ("orange", 1)), w=8))
             .with_panel(timeseries("Fan speed", "Fan speed as a share of its maximum (absent on passively "
                                    "cooled GPUs).", series(m.GPU_FAN_SPEED_RATIO.name), unit="percentunit", w=8))
             .with_panel(timeseries("PCIe throughput", "PCIe transmit (up) and receive (down).",
                                    [query(sel(m.GPU_PCIE_TX_BYTES_PER_SECOND.name), "GPU {{gpu}} tx"),
                                     query(f"-{sel(m.GPU_PCIE_RX_BYTES_PER_SECOND.name)}", "GPU {{gpu}} rx")],
                                    unit="Bps", h=7))
             .with_panel(timeseries(
                 "XID errors", "XID errors reported through the NVML event API, by code; see NVIDIA's XID table. "
                 "Any non-zero value deserves a look.",
                 [query(f"sum {cfg.by('gpu', 'xid')} (increase({sel(m.GPU_XID_ERRORS_TOTAL.name)}[$__rate_interval]))",
                        "GPU {{gpu}} XID {{xid}}")], unit="none", bars=True, h=7))
             .with_row(dash.Row("Who uses the GPU"))
             .with_panel(table_panel(
                 "Processes", "Compute processes on the selected GPUs: memory and SM share.",
                 [table_query(sel(m.GPU_PROCESS_MEMORY_USED_BYTES.name)),
                  table_query(sel(m.GPU_PROCESS_SM_UTILIZATION_RATIO.name))],
                 unit="bytes", hide=("uuid",), order=("node", "gpu", "pid", "process_name", "Value #A", "Value #B"),
                 rename={"Value #A": "Memory used", "Value #B": "SM share"},
                 overrides=[override("SM share", unit="percentunit")]))
             .with_panel(table_panel(
                 "Kubernetes pods and GPU identity",
                 "The pod holding each GPU (kubelet pod-resources) and the GPU's static attributes.",
                 [table_query(f"max {identity} ({sel(m.GPU_INFO.name)})"),
                  table_query(f"max {cfg.by('uuid', 'namespace', 'pod', 'container')} "
                              f"({sel(m.GPU_POD_INFO.name, mig_uuid='')})")],
                 hide=("Value #A", "Value #B"), order=("node", "gpu", "name", "namespace", "pod", "container"),
                 rename={"name": "Model"})))
    return board


def training_run(cfg: Config) -> dash.Dashboard:
    """One instrumented training run: where each step's time goes and which cause to fix."""
    pct = f"{cfg.num('utilization_low_threshold') * 100:g}%"

    def sel(metric: str, **fixed: str) -> str:
        return cfg.sel(metric, "run", "rank", **fixed)

    def rate(metric: str) -> str:
        return f"rate({sel(metric)}[$__rate_interval])"

    run_gpus = f"group {cfg.by('uuid', 'run', 'rank')} ({sel(m.GPU_TRAINING_STEPS_TOTAL.name)})"
    board = dashboard(cfg, "gpu-training-run", "GPU training run",
                      "One instrumented training run: where each step's time goes, throughput, memory, and the "
                      "causes (M1-M4, CK, ST, CM) that hold GPU utilization down; a distributed run's ranks side by "
                      "side.",
                      "3h", [
                          variable(cfg, "run", "Run", m.GPU_TRAINING_STEPS_TOTAL.name, multi=False),
                          variable(cfg, "rank", "Rank", m.GPU_TRAINING_STEPS_TOTAL.name, "run"),
                      ])
    phase_share = (f"sum {cfg.by('phase')} (increase({sel(m.GPU_TRAINING_PHASE_SECONDS_TOTAL.name)}[$__range])) "
                   f"/ ignoring (phase) group_left "
                   f"sum {cfg.by()} (increase({sel(m.GPU_TRAINING_PHASE_SECONDS_TOTAL.name)}[$__range]))")
    causes = cfg.sel(m.RUN_TRAINING_CAUSE_SHARE.name, "run")
    projected = cfg.sel(m.RUN_TRAINING_CAUSE_PROJECTED_UTILIZATION.name, "run")
    cause_labels = cfg.by("uuid", "code", "cause", "remedy", "level", "straggler_rank")
    board = (board.with_row(dash.Row("Where the time goes"))
             .with_panel(timeseries(
                 "Phase shares (5m)",
                 "Share of the run's wall time spent in each phase (data, compute, metrics, checkpoint, other, "
                 "custom), averaged over the selected ranks, stacked to 100%. Much data time calls for M1, much "
                 "metrics time (CPU work in the step) for M2.",
                 [query(f"avg {cfg.by('phase')} ({sel(m.RUN_TRAINING_PHASE_SHARE5M.name)})", "{{phase}}")],
                 unit="percentunit", h=9, stacked=True, fill=70))
             .with_panel(utilization_timeseries(
                 cfg, "GPU utilization of the run's GPUs",
                 "Utilization (busy-time counter, 5m mean) of the GPUs this run pushes from (joined on uuid), "
                 "beside each rank's useful utilization (what the level is judged at: min(utilization, 1 - its "
                 "communication share), since an NCCL kernel spins on the GPU while its rank waits in a collective) "
                 f"and the compute-phase share, and its effective utilization (SM activity, from GPM or dcgm-exporter: "
                 f"busy time in which most SMs idle does not count). The line is {pct}.",
                 [query(f"{cfg.sel(m.GPU_UTILIZATION_AVG5M.name)} * {cfg.on('uuid')} group_right (node, gpu) "
                        f"{run_gpus}", "GPU utilization rank {{rank}}"),
                  query(sel(m.RUN_USEFUL_UTILIZATION_AVG5M.name), "useful utilization rank {{rank}}"),
                  query(f"avg {cfg.by('rank')} ({sel(m.RUN_TRAINING_PHASE_SHARE5M.name, phase='compute')})",
                        "compute share rank {{rank}}"), *funnel.run_queries(cfg, run_gpus)], h=9, links=[gpu_link()]))
             .with_panel(bar_gauge("Phase shares over the selected range",
                                   "Share of each phase over the whole time range shown.",
                                   query(phase_share, "{{phase}}", instant=True)))
             .with_panel(table_panel(
                 "Likely causes",
                 f"The causes the cause engine finds for this run now ({m.RUN_TRAINING_CAUSE_SHARE.name}, from the "
                 "same cause table as diagnose and the cause alerts): the share of time that explains it, and the "
                 "utilization the GPU could reach without it (an upper bound). Level low: the GPU is below "
                 f"{pct}; target: below the {cfg.num('utilization_target') * 100:g}% target. "
                 "Runbooks: docs/runbooks.md.",
                 [table_query(f"max {cause_labels} ({causes})"), table_query(f"max {cause_labels} ({projected})")],
                 unit="percentunit", w=16,
                 order=("code", "remedy", "Value #A", "Value #B", "straggler_rank", "level", "cause", "uuid"),
                 rename={"code": "Cause", "remedy": "Likely remedy", "Value #A": "Share of time",
                         "Value #B": "Could reach", "uuid": "GPU uuid", "cause": "Signal", "level": "Level",
                         "straggler_rank": "Waits for rank"},
                 panel_links=cause_runbooks(cfg, TRAINING_BELOW_TARGET)))
             .with_panel(table_panel(
                 "Concrete remedies",
                 "What the run reports about itself (DataLoader workers, CPU cores, batch size) and the numbers "
                 "the formulas of docs/runbooks.md (Concrete remedies) suggest: M1 workers that keep up with "
                 f"compute ({m.RUN_TRAINING_REMEDY_NUM_WORKERS.name}), M3 the batch its memory and GPU allow "
                 f"({m.RUN_TRAINING_REMEDY_BATCH_SIZE.name}). Empty where the run reports no DataLoader or memory.",
                 [table_query(f"max {cfg.by('rank')} ({sel(metric)})")
                  for metric in (m.GPU_TRAINING_LOADER_WORKERS.name, m.GPU_TRAINING_CPU_CORES.name,
                                 m.RUN_TRAINING_REMEDY_NUM_WORKERS.name, m.GPU_TRAINING_BATCH_SIZE.name,
                                 m.RUN_TRAINING_REMEDY_BATCH_SIZE.name)],
                 w=8, order=("rank", "Value #A", "Value #B", "Value #C", "Value #D", "Value #E"),
                 rename={"rank": "Rank", "Value #A": "Workers", "Value #B": "Cores", "Value #C": "Try workers",
                         "Value #D": "Batch", "Value #E": "Try batch"}))
             .with_panel(funnel.run_table(cfg, run_gpus))
             .with_row(dash.Row("Ranks"))
             .with_panel(bar_gauge(
                 "Phases by rank", "Each rank's phase shares (5m) side by side. In a distributed run a rank with "
                 "much communication waits in collectives for the rank with little (the straggler, cause ST); "
                 "the straggler's own large phase is what to fix.",
                 query(f"max {cfg.by('rank', 'phase')} ({sel(m.RUN_TRAINING_PHASE_SHARE5M.name)} > 0)",
                       "rank {{rank}} {{phase}}", instant=True), w=8, h=9))
             .with_panel(timeseries(
                 "Communication by rank", "Share of each rank's time in collectives (phase communication). "
                 "Ranks far above the lowest one wait for it (straggler, ST); all of them high together is "
                 "communication-bound (CM): the lowest line is what every rank pays.",
                 [query(f"max {cfg.by('rank')} ({sel(m.RUN_TRAINING_PHASE_SHARE5M.name, phase='communication')})",
                        "rank {{rank}}")], unit="percentunit", w=8, h=9))
             .with_panel(table_panel(
                 "Ranks", f"The run's ranks across nodes ({m.RUN_TRAINING_RANK_WORLD_SIZE.name}): node, GPU index and "
                 "uuid, the job's world size, and each rank's step time (5m).",
                 [table_query(f"max {cfg.by('rank', 'node', 'gpu', 'uuid')} "
                              f"({sel(m.RUN_TRAINING_RANK_WORLD_SIZE.name)})"),
                  table_query(f"max {cfg.by('rank', 'uuid')} ({sel(m.RUN_TRAINING_STEP_SECONDS_AVG5M.name)})")],
                 w=8, h=9, order=("rank", "node", "gpu", "uuid", "Value #A", "Value #B"),
                 rename={"rank": "Rank", "node": "Node", "gpu": "GPU", "uuid": "GPU uuid", "Value #A": "World size",
                         "Value #B": "Step time"}, overrides=[override("Value #B", unit="s")]))
             .with_row(dash.Row("Throughput"))
             .with_panel(timeseries(
                 "Step time", "Mean wall time per training step, per rank.",
                 [query(f"sum {cfg.by('rank')} ({rate(m.GPU_TRAINING_PHASE_SECONDS_TOTAL.name)}) "
                        f"/ sum {cfg.by('rank')} ({rate(m.GPU_TRAINING_STEPS_TOTAL.name)})", "rank {{rank}}")],
                 unit="s", w=8))
             .with_panel(timeseries(
                 "Samples per second", "Training throughput, per rank and in total.",
                 [query(f"sum {cfg.by('rank')} ({rate(m.GPU_TRAINING_SAMPLES_TOTAL.name)})", "rank {{rank}}"),
                  query(f"sum({rate(m.GPU_TRAINING_SAMPLES_TOTAL.name)})", "total")], unit="suffix: samples/s", w=8))
             .with_panel(timeseries("Batch size", "Batch size reported by each rank (M3: raise it while memory "
                                    "allows).", [query(sel(m.GPU_TRAINING_BATCH_SIZE.name), "rank {{rank}}")],
                                    unit="suffix: samples", w=8))
             .with_row(dash.Row("Memory and allocator"))
             .with_panel(timeseries(
                 "Allocator memory vs GPU memory",
                 "PyTorch caching-allocator allocated and reserved bytes, against the GPU's total memory. Reserved "
                 "far above allocated hints at fragmentation (M4).",
                 [query(sel(m.GPU_TRAINING_ALLOCATOR_ALLOCATED_BYTES.name), "rank {{rank}} allocated"),
                  query(sel(m.GPU_TRAINING_ALLOCATOR_RESERVED_BYTES.name), "rank {{rank}} reserved"),
                  query(f"{cfg.sel(m.GPU_MEMORY_TOTAL_BYTES.name)} * {cfg.on('uuid')} "
                        f"group_right (node, gpu) {run_gpus}",
                        "rank {{rank}} GPU total")], unit="bytes", dashed=".*GPU total"))
             .with_panel(timeseries(
                 "Allocator retries and OOMs", "cudaMalloc retries after freeing cached blocks, and out-of-memory "
                 "errors, per interval. Any of these calls for M4.",
                 [query(f"sum {cfg.by('rank')} (increase({sel(f'gpu_training_allocator_{kind}_total')}"
                        f"[$__rate_interval]))", f"rank {{{{rank}}}} {name}")
                  for kind, name in (("retries", "retries"), ("ooms", "OOMs"))], unit="none", bars=True, w=6))
             .with_panel(stat_panel(
                 "Seconds since last push", "Age of each rank's newest snapshot; a stalled or finished run stops "
                 "pushing (the exporter drops it after ingest.stale_after_seconds).",
                 query(f"time() - {sel(m.GPU_TRAINING_LAST_PUSH_TIMESTAMP_SECONDS.name)}", "rank {{rank}}"), unit="s",
                 w=6, h=8, thresholds=steps(("green", None), ("orange", cfg.num("dashboard_push_age_warn_seconds")),
                                            ("red", cfg.default("ingest.stale_after_seconds"))))))
    return board


def exporter_health(cfg: Config) -> dash.Dashboard:
    """Whether the exporters themselves work; only targets of the exporter job count."""
    c = cfg.cluster
    job = f'job=~"{cfg.exporter_job}"'

    def sel(metric: str) -> str:
        return cfg.sel(metric, "node")

    def jobsel(metric: str) -> str:
        return sel(metric).replace("{", "{" + job + ", ", 1)

    board = dashboard(cfg, "gpu-exporter-health", "GPU exporter health",
                      "Is the exporter itself healthy: targets up, collectors succeeding, NVML errors, sample age, "
                      "training ingest.", "6h", [variable(cfg, "node", "Node", m.GPU_EXPORTER_BUILD_INFO.name)])
    stale = cfg.default("stale_after")
    legend = f"{{{{{c}}}}} {{{{node}}}}"
    board = (board
             .with_panel(stat_panel(
                 "Exporters up", f"Exporter scrape targets (job matching {cfg.exporter_job}) of the selected "
                 "nodes that answered the last scrape; other targets such as kubelets do not count.",
                 query(f"sum({jobsel('up')})"), w=6))
             .with_panel(stat_panel("GPUs visible",
                                    f"GPUs the exporters see now ({m.GPU_EXPORTER_GPUS.name}), all selected "
                                    "nodes.", query(f"sum({sel(m.GPU_EXPORTER_GPUS.name)})"), w=6))
             .with_panel(stat_panel("Training runs tracked", "Training runs (run, rank) whose snapshots the "
                                    "exporters hold.", query(f"sum({sel(m.GPU_EXPORTER_TRAINING_RUNS.name)})"), w=6))
             .with_panel(stat_panel(
                 "Newest sample age", f"Age of the newest NVML sample; /readyz fails when it grows past "
                 f"stale_after ({stale:g} s by default); orange from half that.",
                 query(f"max({sel(m.GPU_EXPORTER_LAST_SAMPLE_AGE_SECONDS.name)})", "oldest node"), unit="s", w=6,
                 thresholds=steps(("green", None), ("orange", stale / 2), ("red", stale))))
             .with_panel(state_timeline(
                 "Collector success", "1 while a collector's last run succeeded; a failing collector never fails "
                 "the scrape, it shows here.", query(sel(m.GPU_EXPORTER_COLLECTOR_SUCCESS.name),
                                                    f"{legend} {{{{collector}}}}"),
                 unit="bool_on_off", thresholds=steps(("red", None), ("green", 1))))
             .with_panel(timeseries("Collector duration", "Time each collector took on the last scrape.",
                                    [query(sel(m.GPU_EXPORTER_COLLECTOR_DURATION_SECONDS.name),
                                           f"{legend} {{{{collector}}}}")], unit="s"))
             .with_panel(timeseries(
                 "NVML errors", "NVML calls that failed, by function and error, per interval.",
                 [query(f"sum {cfg.by('node', 'function', 'error')} "
                        f"(increase({sel(m.GPU_EXPORTER_NVML_ERRORS_TOTAL.name)}[$__rate_interval]))",
                        f"{legend} {{{{function}}}}: {{{{error}}}}")], unit="none", bars=True))
             .with_panel(timeseries(
                 "Sample age and scrape duration", "Age of the newest NVML sample and the time Prometheus needed "
                 "to scrape each exporter (exporter jobs only).",
                 [query(sel(m.GPU_EXPORTER_LAST_SAMPLE_AGE_SECONDS.name), f"{legend} sample age"),
                  query(jobsel("scrape_duration_seconds"), f"{legend} scrape duration")], unit="s"))
             .with_panel(timeseries(
                 "Training ingest", "Snapshots pushed by training jobs per second, by outcome (accepted, or the "
                 "reason for rejection). Outcomes without a push in the interval are not drawn: every exporter "
                 "serves each outcome from 0, and at 10,000 GPUs those zeros made this the slowest query "
                 "(docs/fleet.md).",
                 [query(f"sum {cfg.by('node', 'outcome')} "
                        f"(rate({sel(m.GPU_EXPORTER_INGEST_REQUESTS_TOTAL.name)}[$__rate_interval])) > 0",
                        f"{legend} {{{{outcome}}}}")], unit="reqps"))
             .with_panel(timeseries(
                 "HTTP authentication failures", "Requests rejected for bad credentials, per interval.",
                 [query(f"sum {cfg.by('node')} "
                        f"(increase({sel(m.GPU_EXPORTER_HTTP_AUTH_FAILURES_TOTAL.name)}[$__rate_interval]))", legend)],
                 unit="none", bars=True))
             .with_panel(table_panel(
                 "Build info", "Exporter, Python and nvidia-ml-py versions per node.",
                 [table_query(f"max {cfg.by('node', 'version', 'python_version', 'pynvml_version')} "
                              f"({sel(m.GPU_EXPORTER_BUILD_INFO.name)})")],
                 w=24, h=6, merge=False, hide=("Value",))))
    return board


def cost(cfg: Config) -> dash.Dashboard:
    """What the GPUs below target lost over the time range, in GPU-hours and money, and why (the
    ``gpu-cost.recording`` series of monitoring.cost, with ``gpu-exporter report --fleet``'s definitions)."""
    target = f"{cfg.num('utilization_target') * 100:g}%"
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
    board = dashboard(cfg, "gpu-fleet-cost", "GPU fleet cost",
                      f"What the GPUs below the {target} utilization target lost over the time range, in GPU-hours "
                      "and money, by cause, team, namespace and node.", "24h", [
                          variable(cfg, "node", "Node", m.GPU_INFO.name),
                          textbox("price", "Price per GPU-hour", cfg.text("dashboard_gpu_hour_price"),
                                  "What one GPU-hour costs, in your currency (default dashboard_gpu_hour_price of "
                                  "thresholds.yml): money lost = GPU-hours lost x price."),
                      ])
    board = (board.with_row(dash.Row("Over the time range"))
             .with_panel(stat_panel(
                 "GPU-hours in range", f"GPU-hours of the selected GPUs over the time range (each GPU with a "
                 f"utilization, {m.GPU_BELOW_TARGET_BOOL.name} counted at every interval).",
                 query(hours(below, over="count_over_time"), instant=True), unit="h", w=6))
             .with_panel(stat_panel(
                 "GPU-hours below target", f"GPU-hours during which a GPU had work and its useful utilization "
                 f"was below the {target} target ({m.GPU_BELOW_TARGET_BOOL.name}; report --fleet's 'below target').",
                 query(hours(below), instant=True), unit="h", w=6))
             .with_panel(stat_panel(
                 "GPU-hours lost", "The idle share (1 - useful utilization) of the GPUs below target, summed over "
                 f"the time range ({m.GPU_IDLE_BELOW_TARGET_RATIO.name}): the capacity lost.",
                 query(lost, instant=True), unit="h", w=6, thresholds=steps(("green", None), ("orange", 1))))
             .with_panel(stat_panel(
                 "Money lost", "GPU-hours lost times the price per GPU-hour (the price variable; default "
                 f"{cfg.text('dashboard_gpu_hour_price')} from thresholds.yml), in the price's currency.",
                 query(f"{lost} * $price", instant=True), w=6, thresholds=steps(("green", None), ("orange", 1)))))
    board = (funnel.cost_row(cfg, board, hours, cause_runbooks(cfg, "GpuSmActivityLow"))
             .with_row(dash.Row("Where the hours went"))
             .with_panel(bar_gauge(
                 "GPU-hours lost by cause", "GPU-hours lost by the code of each GPU's main cause: a live run's "
                 "cause (the allocator first, then the biggest share), else the evidence of an uninstrumented "
                 f"job; {NONE} where none is known (idle but allocated, not instrumented, no single cause). "
                 "Runbooks: docs/runbooks.md.",
                 query(named(hours(idle, "code"), "code"), f"{{{{{c}}}}} {{{{code}}}}", instant=True), unit="h",
                 panel_links=cause_runbooks(cfg, UTILIZATION_BELOW_TARGET.name)))
             .with_panel(bar_gauge(
                 "GPU-hours lost by team", f"GPU-hours lost on the GPUs of training runs tagged with a team "
                 f"(label {team} of {m.GPU_TRAINING_RUN_INFO.name}: GPU_EXPORTER_TAGS=\"{TEAM_TAG}=vision\"); "
                 "GPUs without such a run do not show here.",
                 query(hours(f"({teams})", team), f"{{{{{c}}}}} {{{{{team}}}}}", instant=True), unit="h"))
             .with_panel(bar_gauge(
                 "GPU-hours lost by namespace", "GPU-hours lost by the Kubernetes namespace of the pod holding "
                 f"the GPU ({m.GPU_WORKLOAD_INFO.name}); {NONE}: no pod.",
                 query(named(hours(idle, "namespace"), "namespace"), f"{{{{{c}}}}} {{{{namespace}}}}",
                       instant=True), unit="h"))
             .with_panel(bar_gauge(
                 "GPU-hours lost by node", "GPU-hours lost by node.",
                 query(hours(idle, "node"), f"{{{{{c}}}}} {{{{node}}}}", instant=True), unit="h", w=12))
             .with_panel(timeseries(
                 "Capacity lost by cause", "GPUs' worth of idle capacity below target at each moment (the sum "
                 f"of {m.GPU_IDLE_BELOW_TARGET_RATIO.name}), stacked by the code of the main cause.",
                 [query(named(f"sum {cfg.by('code')} ({idle})", "code"), f"{{{{{c}}}}} {{{{code}}}}")],
                 unit="none", stacked=True, fill=60, w=12))
             .with_row(dash.Row("Workloads"))
             .with_panel(table_panel(
                 "Workloads by GPU-hours lost", "The GPUs' workloads (node, namespace, pod, training run) and "
                 "main cause by GPU-hours lost over the time range, most first, with the money lost at the price "
                 "variable. Click a run for the training-run dashboard.",
                 [table_query(named(workloads, "code")), table_query(named(f"{workloads} * $price", "code"))],
                 w=24, h=10, order=(c, "node", "namespace", "pod", "run", "code", "Value #A", "Value #B"),
                 rename={"code": "Cause", "Value #A": "GPU-hours lost", "Value #B": "Money lost"},
                 overrides=[override("GPU-hours lost", unit="h"), override("run", links=[RUN_TABLE_LINK])],
                 sort_by="GPU-hours lost", sort_desc=True,
                 panel_links=cause_runbooks(cfg, UTILIZATION_BELOW_TARGET.name))))
    return board


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
