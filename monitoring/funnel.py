"""The utilization funnel: allocated GPU-hours -> busy -> effective, and the panels that show effective utilization
(SM activity) beside busy utilization on the dashboards (monitoring.dashboards calls them).

The problem: NVML's utilization (busy) is the share of time at least one kernel ran; a GPU busy with small
kernels, fp32 math or memory-bound kernels reads 90-100% while most of its SMs idle. Effective utilization is
its SM activity (``gpu:gpu_sm_active:avg5m``, from GPM or dcgm-exporter, label ``source``; no series without
either). The funnel says where a fleet's GPU-hours go:

- allocated: GPU-hours with work (``gpu:gpu_has_work:bool`` 1);
- busy: allocated hours x busy utilization; the step allocated -> busy loses the idle time (by cause: the cost
  dashboard's ``gpu:gpu_idle_below_target:ratio``, monitoring.cost);
- effective: allocated hours x SM activity, where a source reports it; the step busy -> effective loses
  hours x (busy - SM activity), recorded here per GPU with the code of its SM cause.

Two recording rules, in the ``gpu-cost.recording`` group (the fleet's series budget, docs/fleet.md: one series per
GPU with work, an SM source and an efficiency cause, and at most five per node):

- ``gpu:gpu_busy_not_effective:ratio`` {cluster, node, gpu, uuid, cause}: busy utilization (at most 1) - SM
  activity (at least 0) of each GPU with work and an SM source where an efficiency cause holds (memory_bound,
  sm_batch_too_small, tensor_cores_idle, ineffective: the conditions of the efficiency alerts,
  monitoring.efficiency, from the table of gpu_exporter.verdict.efficiency; only at or above the target, as the
  verdict). Summed over time: the GPU-hours between busy and effective, by cause.
- ``node:gpu_funnel:sum`` {cluster, node, step}: the node's GPUs with work summed at each step (:data:`STEPS`):
  allocated, busy, effective, busy_not_effective (the same per-GPU formula as the ratio above, on every GPU with
  an SM source) and unknown (the busy share of those without one; no series where there is none).

The cost dashboard's funnel (:func:`cost_row`) reads only these: the hours of no cause (below the target, or SM
activity at or above ``sm_active_low``) are the node sums' busy_not_effective less the causes'. At 10,000 GPUs the
same panels computed per GPU at query time (a subquery joining the utilization, SM activity and work of every GPU
at each step of the range) took 5.1 s instant and 9.9 s as a 5-minute range (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpu_exporter import catalog as m
from gpu_exporter.verdict.efficiency import EFFICIENCY, GpuCause
from gpu_exporter.verdict.fleet import NONE
from gpu_exporter.verdict.promql import C
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, table

from monitoring.cost import RECORDING
from monitoring.efficiency import AT_TARGET
from monitoring.model import Record, indent, wrap
from monitoring.panels import Config, bar_gauge, query, stat_panel, steps, table_panel, timeseries

SM = m.GPU_SM_ACTIVE_AVG5M.name
BUSY = m.GPU_UTILIZATION_AVG5M.name
LOST = m.GPU_BUSY_NOT_EFFECTIVE_RATIO.name
UNKNOWN = "unknown"
"""The ``source`` the panels show for a GPU with no SM activity source (neither GPM nor dcgm-exporter)."""


def _holds(cause: GpuCause) -> str:
    """One series (value 1) per GPU with work at or above the target where ``cause`` holds, labelled with its id:
    the condition of the cause's alert (monitoring.efficiency, from the table of gpu_exporter.verdict.efficiency)."""
    value, conditions = cause.promql()
    holds = f"(\n  {value} {cause.op} ${{{cause.keys[0]}}}\n)\n{conditions}\nand on ({C}, uuid)\n  {AT_TARGET}"
    return f'label_replace(\n  group by ({C}, uuid) (\n{indent(holds, 4)}\n  ),\n  "cause", "{cause.cause}", "", ""\n)'


STEPS = {
    "allocated": "{work}",
    "busy": "{busy}\nand on ({c}, uuid)\n  {work}",
    "effective": "{busy}\n- on ({c}, uuid) group_left ()\n{lost}\nand on ({c}, uuid)\n  {work}",
    "busy_not_effective": "{lost}\nand on ({c}, uuid)\n  {work}",
    "unknown": "{busy}\nand on ({c}, uuid)\n  {work}\nunless on ({c}, uuid)\n  {sm}",
}
"""The steps of ``node:gpu_funnel:sum``, each summed by node from per-GPU series {cluster, node, uuid}: ``work`` (1 a
GPU with work), ``busy`` (its busy utilization, at most 1), ``lost`` (busy - SM activity, at least 0, where a source
reports it) and ``sm`` (its SM activity). Effective = busy - lost = min(SM activity, busy), as report --fleet counts
it (gpu_exporter.verdict.funnel): in a GPU's first 5 minutes rate() undercounts busy while avg_over_time does not."""
FUNNEL = m.NODE_GPU_FUNNEL_SUM.name


def _steps() -> list[Record]:
    """``node:gpu_funnel:sum``, one rule a step."""
    parts = {"c": C, "work": f"(max by ({C}, node, uuid) ({m.GPU_HAS_WORK_BOOL.name}) == 1)",
             "busy": f"max by ({C}, node, uuid) (clamp_max({BUSY}, 1))",
             "sm": f"max by ({C}, uuid) ({SM})"}
    parts["lost"] = f"clamp_min(\n  {parts['busy']}\n  - on ({C}, uuid) group_left ()\n  {parts['sm']},\n  0\n)"
    comment = wrap(
        f"The utilization funnel of each node's GPUs with work (monitoring/funnel.py), one series a step: allocated "
        "(the GPUs with work), busy (their busy utilization, each at most 1), effective (their SM activity, each at "
        "most the busy utilization, where a source reports it), busy_not_effective (busy - SM activity, at least 0, "
        f"of those with a source; by cause: {LOST}) and unknown (the busy utilization of "
        "those with no SM source; no series without one). Summed over time: the cost dashboard's GPU-hours at each "
        "step, read from these series instead of joining every GPU's at every step of its range.")
    return [Record(RECORDING, FUNNEL, f"sum by ({C}, node) (\n{indent(expr.format(**parts), 2)}\n)\n",
                   (("step", step),), comment=comment if i == 0 else "")
            for i, (step, expr) in enumerate(STEPS.items())]


def records() -> list[Record]:
    """``gpu:gpu_busy_not_effective:ratio`` and ``node:gpu_funnel:sum`` in the ``gpu-cost.recording`` group."""
    causes = f"\nor on ({C}, uuid)\n".join(_holds(cause) for cause in EFFICIENCY)
    # the parentheses: "*" binds tighter than "and", and the cause label is the whole product's. No series where no
    # cause holds (the series budget): the dashboard's total, lost_expr, is busy - SM activity at query time
    expr = (f"(\n  clamp_min(\n    max by ({C}, node, gpu, uuid) (clamp_max({BUSY}, 1))\n"
            f"    - on ({C}, uuid) group_left ()\n"
            f"    max by ({C}, uuid) ({SM}),\n    0\n  )\n"
            f"  and on ({C}, uuid)\n    (max by ({C}, uuid) ({m.GPU_HAS_WORK_BOOL.name}) == 1)\n)\n"
            f"* on ({C}, uuid) group_left (cause)\n(\n{indent(causes, 2)}\n)\n")
    return [Record(RECORDING, LOST, expr, comment=(
        "The step busy -> effective of the utilization funnel (monitoring/funnel.py), by cause: busy utilization\n"
        "(at most 1) - SM activity of each GPU with work and an SM source where a cause of the efficiency verdict\n"
        "holds (memory_bound, sm_batch_too_small, tensor_cores_idle, ineffective: at or above the target, as the\n"
        "efficiency alerts); no series where none holds (the series budget: the cost dashboard reads the\n"
        f"total from {FUNNEL}). Summed over time: GPU-hours by cause.")), *_steps()]


# ------------------------------------------------------------------------------------------- panels


def sourced(cfg: Config, series: str, *labels: str) -> str:
    """``series`` (per GPU, with cluster and uuid) with the ``source`` of each GPU's SM activity: gpm, dcgm, or
    :data:`UNKNOWN` where no source reports it. ``labels``: the variables ``series`` is selected by (``node``...),
    which select the SM activity too."""
    # ``series`` twice and the SM activity once, one join: the form with the sources joined first read ``series``
    # three times, and was the slowest range panel at 10,000 GPUs (docs/fleet.md)
    known = f"group by ({cfg.cluster}, uuid, source) ({cfg.sel(SM, *labels)})"
    return (f"({series}) * {cfg.on('uuid')} group_left (source) {known} or {cfg.on('uuid')} "
            f'label_replace({series}, "source", "{UNKNOWN}", "", "")')


def on_nodes(cfg: Config, series: str, *labels: str) -> str:
    """``series`` (cluster, uuid) of the GPUs of the ``node`` (and ``labels``) variables, with node and gpu (for
    dcgm-exporter's raw fields; the recorded SM activity carries both already)."""
    gpus = f"max {cfg.by('node', 'gpu', 'uuid')} ({cfg.sel(m.GPU_INFO.name, 'node', *labels)})"
    return f"{series} * {cfg.on('uuid')} group_left (node, gpu) {gpus}"



SOURCE_TEXT = (f"Effective utilization is SM activity ({SM}: GPM on Hopper and newer, else the cluster's "
               f"dcgm-exporter, {m.DCGM_SM_ACTIVE.name}); busy is NVML's utilization, the share of time a "
               f"kernel ran. Source '{UNKNOWN}': neither reports SM activity, so the GPU's effective use is not "
               "known (docs/effective-utilization.md).")


def _per_gpu(cfg: Config, expr: str) -> str:
    return f"max {cfg.by('node', 'gpu', 'uuid', 'source')} ({expr})"


def fleet_row(cfg: Config, board: dash.Dashboard) -> dash.Dashboard:
    """The fleet overview's row: effective utilization beside busy, and the GPUs whose SM activity is unknown."""
    c, low = cfg.cluster, cfg.percent("sm_active_low")
    busy, sm = cfg.sel(BUSY, "node"), cfg.sel(SM, "node")
    gpus = f"group {cfg.by('uuid')} ({cfg.sel(m.GPU_INFO.name, 'node')})"
    legend = f"{{{{{c}}}}} {{{{node}}}} GPU {{{{gpu}}}}"
    return (board.with_row(dash.Row("Effective utilization (SM activity)"))
            .with_panel(stat_panel(
                "Fleet effective utilization (5m)",
                f"Mean SM activity of the selected GPUs that report it, over the last 5 minutes; red below {low} "
                f"(sm_active_low). {SOURCE_TEXT}", query(f"avg({sm})"), unit="percentunit",
                thresholds=steps(("red", None), ("green", cfg.num("sm_active_low")))))  # red: likely ineffective
            .with_panel(stat_panel(
                "GPUs with SM activity unknown",
                "Selected GPUs with no SM activity source (no GPM, no dcgm-exporter profiling fields): their "
                "effective use is unknown, never assumed good.",
                query(f"count({gpus} unless {cfg.on('uuid')} {sm}) or vector(0)"),
                thresholds=steps(("green", None), ("orange", 1))))
            .with_panel(timeseries(
                "Busy vs effective utilization by GPU (5m mean)",
                f"Each GPU's busy utilization (dashed) and its SM activity (solid, with its source). {SOURCE_TEXT}",
                [query(sm, f"{legend} effective ({{{{source}}}})"),
                 query(f"{busy} and {cfg.on('uuid')} {sm}", f"{legend} busy")],
                unit="percentunit", w=10, dashed=".* busy"))
            .with_panel(table_panel(
                "Effective utilization by GPU",
                f"Busy and effective utilization (5m) of every selected GPU, lowest effective first; source "
                f"'{UNKNOWN}' where nothing reports SM activity. {SOURCE_TEXT}",
                [_per_gpu(cfg, sourced(cfg, busy, "node")), _per_gpu(cfg, sm)],
                unit="percentunit", w=6, hide=("uuid",),
                order=(c, "node", "gpu", "source", "Value #A", "Value #B"),
                rename={"Value #A": "Busy", "Value #B": "Effective", "source": "Source"},
                sort_by="Effective")))


def node_panels(cfg: Config, board: dash.Dashboard) -> dash.Dashboard:
    """The node detail's panels: busy against effective utilization per GPU, the source, tensor and DRAM activity
    (GPM's whole-GPU gauges, else dcgm-exporter's fields)."""
    busy = cfg.sel(BUSY, "node", "gpu")
    sm = cfg.sel(SM, "node", "gpu")

    def activity(gpm: str, dcgm: str) -> str:
        dcgm_uuid = f'label_join({cfg.sel(dcgm)}, "uuid", "", "{m.DCGM_UUID_LABEL}")'  # no $1: Grafana's variable
        return (f"max {cfg.by('node', 'gpu', 'uuid')} ({cfg.sel(gpm, 'node', 'gpu', mig_uuid='')}) or "
                f"{cfg.on('uuid')} max {cfg.by('node', 'gpu', 'uuid')} ({on_nodes(cfg, dcgm_uuid, 'gpu')})")

    return (board
            .with_panel(timeseries(
                "Busy vs effective utilization (SM activity)",
                f"Each GPU's busy utilization (5m, dashed) against its SM activity (5m, solid, with its source). "
                f"The gap is busy time in which most SMs idled. {SOURCE_TEXT}",
                [query(busy, "GPU {{gpu}} busy"), query(sm, "GPU {{gpu}} effective ({{source}})")],
                unit="percentunit", w=8, h=7, dashed=".* busy"))
            .with_panel(table_panel(
                "SM activity source",
                f"Where each GPU's SM activity comes from: gpm (NVML GPM, in this exporter), dcgm (the cluster's "
                f"dcgm-exporter) or {UNKNOWN} (neither: enable GPM on Hopper and newer, or DCGM profiling).",
                [f"max {cfg.by('node', 'gpu', 'source')} "
                 f"({sourced(cfg, cfg.sel(m.GPU_INFO.name, 'node', 'gpu'), 'node', 'gpu')})"],
                w=4, h=7, merge=False, hide=("Value",), rename={"source": "Source"}))
            .with_panel(timeseries(
                "Tensor and DRAM activity",
                "Whole-GPU tensor pipe and DRAM activity (5m scale: GPM's gauges, else dcgm-exporter's "
                f"{m.DCGM_TENSOR_ACTIVE.name} and {m.DCGM_DRAM_ACTIVE.name}). Tensor activity near 0 with SM "
                "activity high: fp32 math, the tensor cores idle (TC); DRAM high with SM low: memory-bound (MB).",
                [query(activity(m.GPU_TENSOR_ACTIVE_RATIO.name, m.DCGM_TENSOR_ACTIVE.name), "GPU {{gpu}} tensor"),
                 query(activity(m.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO.name, m.DCGM_DRAM_ACTIVE.name),
                       "GPU {{gpu}} DRAM")], unit="percentunit", w=12, h=7)))


def run_queries(cfg: Config, run_gpus: str) -> list[prometheus.Dataquery]:
    """The training run's effective utilization per rank (to draw beside its busy utilization)."""
    return [query(f"{cfg.sel(SM)} * {cfg.on('uuid')} group_right (source) {run_gpus}",
                  "effective (SM activity) rank {{rank}} ({{source}})")]


def run_table(cfg: Config, run_gpus: str) -> table.Panel:
    """Each rank's GPU: busy and effective utilization and the SM activity's source (unknown where none)."""
    busy = f"{cfg.sel(BUSY)} * {cfg.on('uuid')} group_right () {run_gpus}"
    sm = f"{cfg.sel(SM)} * {cfg.on('uuid')} group_right (source) {run_gpus}"

    def per_rank(expr: str) -> str:
        return f"max {cfg.by('rank', 'uuid', 'source')} ({expr})"

    return table_panel(
        "Effective utilization of the run's GPUs",
        f"Each rank's GPU: busy utilization (5m) and SM activity (5m), with the source ('{UNKNOWN}': neither GPM "
        "nor dcgm-exporter reports it). A GPU busy but below sm_active_low SM activity is busy but ineffective: "
        f"batch too small for the SMs (M3), memory-bound (MB) or tensor cores idle (TC). {SOURCE_TEXT}",
        [per_rank(sourced(cfg, busy)), per_rank(sm)], unit="percentunit", w=24, h=6,
        order=("rank", "source", "Value #A", "Value #B", "uuid"),
        rename={"rank": "Rank", "source": "Source", "Value #A": "Busy", "Value #B": "Effective", "uuid": "GPU uuid"})


def cost_row(cfg: Config, board: dash.Dashboard, hours: Callable[..., str],
             panel_links: Sequence[dash.DashboardLink]) -> dash.Dashboard:
    """The cost dashboard's funnel: allocated GPU-hours -> busy -> effective, with the hours lost at each step, from
    the recorded ``node:gpu_funnel:sum`` (and the causes' ``gpu:gpu_busy_not_effective:ratio``). ``hours(series,
    *by)`` sums a series over the dashboard's range in GPU-hours (monitoring.dashboards.cost); the hours of no cause
    are named as report --fleet names them (``(none)``)."""
    c = cfg.cluster

    def step(name: str) -> str:
        """The node sums of one step of :data:`STEPS`."""
        return cfg.sel(FUNNEL, "node", step=next(s for s in STEPS if s == name))

    def per_cluster(total: str) -> str:
        """A total (``sum(...)``) kept apart by cluster: a labelled series always carries its cluster."""
        return total.replace("sum(", f"sum {cfg.by()} (", 1)
    allocated, busy, lost = hours(step("allocated")), hours(step("busy")), hours(step("busy_not_effective"))
    by_cause = cfg.sel(LOST, "node")
    # the hours of no cause, per cluster: the total less the causes' (recorded only where a cause holds); the causes'
    # hours are 0 in a cluster where none held
    total, caused = per_cluster(lost), per_cluster(hours(by_cause))
    uncaused = f"clamp_min({total} - {cfg.on()} ({caused} or 0 * {total}), 0)"
    no_cause = f'label_replace({uncaused}, "cause", "{NONE}", "", "")'
    funnel = " or ".join(f'label_replace({per_cluster(hours(step(name)))}, "step", "{label}", "", "")'
                         for label, name in (("1 allocated", "allocated"), ("2 busy", "busy"),
                                             ("3 effective", "effective")))
    return (board.with_row(dash.Row("Funnel: allocated, busy, effective"))
            .with_panel(bar_gauge(
                "Funnel: allocated, busy, effective GPU-hours",
                "GPU-hours over the time range: allocated (the GPU had work: memory, processes or a training run), "
                "busy (allocated hours x NVML's utilization, the time a kernel ran) and effective (allocated hours x "
                "SM activity, at most the busy utilization, on the GPUs that report it). The gaps are the hours lost "
                "at each step. "
                f"{SOURCE_TEXT}", query(funnel, f"{{{{{c}}}}} {{{{step}}}}", instant=True), unit="h", w=8,
                thresholds=steps(("blue", None))))
            .with_panel(stat_panel(
                "GPU-hours lost, allocated to busy", "Allocated GPU-hours in which no kernel ran: allocated hours x "
                "(1 - busy utilization). Below target, their causes are the 'GPU-hours lost by cause' panel's.",
                query(f"{allocated} - {busy}", instant=True), unit="h"))
            .with_panel(stat_panel(
                "GPU-hours lost, busy to effective", "Busy GPU-hours in which most SMs idled: busy utilization - SM "
                "activity (at least 0) of each GPU with work, summed over the range, on the GPUs that report SM "
                "activity: the gap between the funnel's busy and effective bars there.",
                query(lost, instant=True), unit="h", thresholds=steps(("green", None), ("orange", 1))))
            .with_panel(stat_panel(
                "Busy GPU-hours with SM activity unknown", "Busy GPU-hours of GPUs that have no SM activity source "
                "(no GPM, no dcgm-exporter profiling fields): how much of the busy time the funnel cannot judge "
                "(0 when every GPU has a source).",
                query(f"{hours(step('unknown'))} or vector(0)", instant=True), unit="h",
                thresholds=steps(("green", None), ("orange", 1))))
            .with_panel(bar_gauge(
                "GPU-hours lost busy to effective, by cause", "The busy -> effective hours by the efficiency "
                "verdict of each GPU at or above the utilization target: memory_bound (MB), sm_batch_too_small "
                "(M3), tensor_cores_idle (TC), ineffective (SM activity below sm_active_low, no single cause); "
                f"{NONE}: below the target (its run causes explain it) or no cause holds, the total busy -> "
                f"effective hours less the causes' ({LOST} is recorded only where a cause holds). Runbooks: "
                "docs/runbooks.md.",
                query(f"{hours(by_cause, 'cause')} or {no_cause}", f"{{{{{c}}}}} {{{{cause}}}}", instant=True),
                unit="h",
                w=8, panel_links=panel_links)))
