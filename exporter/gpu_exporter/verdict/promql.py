"""The PromQL fragments the generated rules share, as template text (``${key}`` placeholders of thresholds.yml).

A leaf: the cause kinds of gpu_exporter.verdict.causes (each holds its PromQL next to its Python) and the
evidence, remedy and utilization rules of monitoring/ import these, so each fragment is written once.
"""

from __future__ import annotations

from gpu_exporter import catalog as m
from gpu_exporter.verdict.levels import BY_LEVEL, LOW, TARGET

C = "${cluster_label}"
"""The cluster label: every aggregation and join keeps it, so two clusters never merge."""
RUN = f"({C}, uuid, run, rank)"
"""The labels of a run (rank) on a GPU: what the useful utilization and the cause series join on."""
USEFUL = m.RUN_USEFUL_UTILIZATION_AVG5M.name
"""The run's useful utilization, min(u, 1 - communication share) (prometheus/templates/gpu-recording.rules.yml.in,
gpu_exporter.verdict.levels.useful_utilization): what the levels and the projections start from."""
LIVE = m.RUN_TRAINING_LIVE_INFO.name
"""The run (rank) reports a current phase: it is live. Recorded once in gpu-utilization.recording as
``max without (phase) (gpu_training_current_phase) == 1`` (the phase series' labels but phase), so a join on it
matches as the raw phase series did: a raw read costs VictoriaMetrics every sample of its window (docs/fleet.md)."""
CAUSE_SHARE = m.RUN_TRAINING_CAUSE_SHARE.name
"""The recording series of the causes: what the cause alerts, the projections and the dashboards read."""
AT_TARGET = f"{m.GPU_USEFUL_UTILIZATION_AVG5M.name} >= ${{{BY_LEVEL[TARGET].key}}}"
"""The GPU at or above the target, judged at its useful utilization like the ladder's level: the efficiency alerts'
condition (monitoring/efficiency.py), the ladder's healthy row."""


def cause_share(cause: str) -> str:
    """The recorded share series of ``cause`` (its alerts and projection read it; the ladder's cause row shows it)."""
    return f'{CAUSE_SHARE}{{cause="{cause}"}}'


def share(phase: str) -> str:
    """The run's (rank's) 5m share of ``phase``."""
    return f'max without (phase) ({m.RUN_TRAINING_PHASE_SHARE5M.name}{{phase="{phase}"}})'


# Hysteresis (docs/prometheus.md): the alerts do not read the level of the cause series, which flips
# whenever utilization crosses a line, but whether the cause applied (at any level below target) and
# whether the (useful) utilization was low at any time in the last ${alert_hold}. The warning (low) and
# info (target) alert of a cause exclude each other through the same held condition, so each keeps its
# identity and its for: while utilization hovers around the low threshold or the target.
def held_low(series: str, by: str) -> str:
    """``series`` was below the low line at any time within ``alert_hold``."""
    return f"max by {by} (min_over_time({series}[${{alert_hold}}])) < ${{{BY_LEVEL[LOW].key}}}"


def efficiency_held(cause: str) -> str:
    """The GPUs where efficiency cause ``cause`` held within ``alert_hold`` (its ``gpu:gpu_busy_not_effective:ratio``
    series, recorded only where it holds): its alert fires on it, its ladder row shows it."""
    return f'last_over_time({m.GPU_BUSY_NOT_EFFECTIVE_RATIO.name}{{cause="{cause}"}}[${{alert_hold}}])'


HELD_LOW = held_low(m.GPU_USEFUL_UTILIZATION_AVG5M.name, f"({C}, uuid)")
"""The GPU's useful utilization was low within ``alert_hold`` (GpuUtilizationLow's, GpuUtilizationBelowTarget's)."""
GPU_SEL = (f"{{{C}=%q,uuid=%q}}", f"$labels.{C} $labels.uuid")
"""A selector of an alert's GPU for the queries of its text, with its printf arguments."""
RUN_SEL = (f"{{{C}=%q,run=%q,rank=%q,uuid=%q}}", f"$labels.{C} $labels.run $labels.rank $labels.uuid")
"""A selector of an alert's run (rank) on its GPU, in its cluster (as in the rules), with its printf arguments."""


def run_query(metric: str, extra: str = "", joined: str = "") -> str:
    """Template text: a printf of the query of ``metric`` for the alert's run (rank) on its GPU, ``extra`` after it,
    then ``joined`` with the same selector: a lookup selects only the alert's series on both sides of a join (a
    bare metric name on one side selected the whole fleet's, 1.5 ms a lookup at 992 GPUs against 0.04 ms)."""
    sel, args = RUN_SEL
    return (f'printf "{metric}{sel}{extra}{joined}{sel if joined else ""}" {args}{f" {args}" if joined else ""}')


def projected_query(cause: str) -> str:
    """Template text: a printf of the query of the utilization the alert's GPU could reach without ``cause``."""
    return (f'printf "{m.RUN_TRAINING_CAUSE_PROJECTED_UTILIZATION.name}{{cause=%q,{RUN_SEL[0][1:]}" '
            f'"{cause}" {RUN_SEL[1]}')


def busier(useful: str, sel: tuple[str, str]) -> str:
    """Template text: ``with`` the GPU's busy time where it exceeds ``useful`` (the collectives hid part of it)."""
    return (f'{{{{ with printf "max by ({C}, uuid) ({m.GPU_UTILIZATION_AVG5M.name}{GPU_SEL[0]}) > on ({C}, uuid) '
            f'max by ({C}, uuid) ({useful}{sel[0]})" {GPU_SEL[1]} {sel[1]} | query }}}}')
