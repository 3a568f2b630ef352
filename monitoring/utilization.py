"""The utilization alerts of the device (GpuUtilizationLow, GpuUtilizationBelowTarget, GpuIdleButAllocated)
as model objects.

They judge one GPU's utilization against a threshold of thresholds.yml while work is held on it, and
join the workload (pod, run) for the text. GpuUtilizationLow and GpuUtilizationBelowTarget judge the
level, so they read the GPU's useful utilization (``gpu:gpu_useful_utilization:avg5m``: its live run's
time in collectives, where NCCL kernels spin, does not count; without a live run it is the
utilization); GpuIdleButAllocated reads the busy time itself. ``monitoring.rules`` splices them into the
``gpu-utilization.alerts`` group of gpu-alerts.rules.yml (where the template says so);
``monitoring.grafana_alerts`` mirrors them with the same query, comparison and ``for``.
"""

from __future__ import annotations

from gpu_exporter.catalog import GPU_HAS_WORK_BOOL, GPU_USEFUL_UTILIZATION_AVG5M, GPU_WORKLOAD_INFO
from gpu_exporter.verdict.alerts import IDLE_BUT_ALLOCATED, UTILIZATION_BELOW_TARGET, UTILIZATION_LOW, Compared
from gpu_exporter.verdict.causes import CAUSES
from gpu_exporter.verdict.promql import CAUSE_SHARE, GPU_SEL, HELD_LOW, C, busier

from monitoring.model import VALUE, Alert, where

GROUP = "gpu-utilization.alerts"


def _with_work(*unless: str) -> str:
    """A GPU's value while it holds memory, processes or a training run, less the GPUs of ``unless``,
    with the workload's labels."""
    less = "".join(f"  unless on ({C}, uuid)\n    {expr}\n" for expr in unless)
    return (f"(\n    {VALUE}\n  and on ({C}, uuid)\n    ({GPU_HAS_WORK_BOOL.name} == 1)\n{less})\n"
            f"* on ({C}, uuid) group_left (namespace, pod, container, run) {GPU_WORKLOAD_INFO.name}\n")


WITH_WORK = _with_work()
"""A GPU's value while it holds memory, processes or a training run, with the workload's labels."""
HELD_CAUSE = f"max by ({C}, uuid) (last_over_time({CAUSE_SHARE}[${{alert_hold}}]))"
"""A cause applied to a live run on the GPU (at either level) at any time in the last ``alert_hold``: what
the cause alerts read (monitoring.causes), so GpuTrainingBelowTarget and GpuUtilizationBelowTarget never
take turns either."""
BELOW_TARGET = _with_work(HELD_LOW, HELD_CAUSE)
"""WITH_WORK, less the GPUs GpuUtilizationLow covers (low at any time in the last alert_hold) and those
whose live run has a cause (GpuTrainingBelowTarget, or a cause warning alert, names it)."""
WHO = where("\n") + "\n"
"""The first two lines of each description: the GPU and its workload."""
BUSY_NOTE = (f"{busier(GPU_USEFUL_UTILIZATION_AVG5M.name, GPU_SEL)}"
             " NVML reads it {{ . | first | value | humanizePercentage }} busy now, but the time its training run "
             "spends in collectives (phase communication, where NCCL kernels spin while they wait) is not useful "
             "work and does not count.{{ end }}")
"""A note when the GPU's useful utilization is below its busy time (GpuUtilizationLow, ...BelowTarget)."""

LOW_DESCRIPTION = (
    WHO +
    'has been below ${utilization_low_threshold|percent} utilization for ${utilization_low_for} (5m mean, down to\n'
    '{{ $value | humanizePercentage }} in the last ${alert_hold}) while it holds memory, processes or a training run.'
    f'{BUSY_NOTE} '
    '{{ with $labels.run }}Run {{ . }} reports its phases:\n'
    f'a cause alert ({", ".join(c.alert for c in CAUSES)})\n'
    'names the remedy when one cause explains the gap;\n'
    '`gpu-exporter diagnose --run {{ . }}` shows all phases, `gpu-exporter report --run {{ . }}` what the\n'
    'run has cost so far and how much shorter it would be without its main cause.{{ else }}No training run '
    'reports from\n'
    'this GPU: instrument the job with gpu_exporter.training to get the cause, or check in this order:\n'
    'input pipeline (M1), CPU work in the step such as metrics and logging (M2), checkpoints (CK), batch size\n'
    '(M3), allocator (M4).{{ end }}\n'
)
BELOW_TARGET_DESCRIPTION = (
    WHO +
    'has been below the ${utilization_target|percent} utilization target (at or above\n'
    '${utilization_low_threshold|percent}) for ${utilization_low_for} (5m mean, down to\n'
    '{{ $value | humanizePercentage }} in the last ${alert_hold}) while it holds memory, processes or a\n'
    f'training run, and no cause explains it.{BUSY_NOTE} '
    '{{ with $labels.run }}Run {{ . }} reports its phases, but none\n'
    'passes its threshold (underutilized): `gpu-exporter diagnose --run {{ . }}` shows the largest phase\n'
    'besides compute, `gpu-exporter report --run {{ . }}` what the run has cost so far; then look at the\n'
    'batch size (M3). Inference servers: batch requests or share the GPU (MIG).{{ else }}No training run\n'
    'reports from this GPU (not instrumented): instrument the job with gpu_exporter.training to get the\n'
    'cause, or check in this order: input pipeline (M1), CPU work in the step such as metrics and logging\n'
    '(M2), checkpoints (CK), batch size (M3), allocator (M4).{{ end }}\n'
)
IDLE_DESCRIPTION = (
    WHO +
    'has been at {{ $value | humanizePercentage }} utilization for ${idle_for} while memory is held on it.\n'
    'The GPU is wasted: release it (stop the idle notebook or job) or find what the job waits on (M1, M2).\n'
)


def _compared(compared: Compared, for_key: str, labels: tuple[tuple[str, str], ...], summary: str, description: str,
              shape: str, comment: str = "") -> Alert:
    """The alert of ``compared`` (its name, value, comparison and threshold key: gpu_exporter.verdict.alerts)."""
    return Alert(GROUP, compared.name, compared.value, for_key, labels, summary, description, op=compared.op,
                 threshold=compared.threshold, shape=shape, comment=comment)


def alerts() -> list[Alert]:
    """GpuUtilizationLow (the lowest 5m mean over alert_hold: hysteresis), GpuUtilizationBelowTarget (the
    same between the low line and the target, for GPUs without a cause) and GpuIdleButAllocated."""
    warning, info = (("severity", "warning"),), (("severity", "info"),)
    return [
        _compared(UTILIZATION_LOW, "utilization_low_for", warning,
                  "A GPU with work on it is below ${utilization_low_threshold|percent} utilization.", LOW_DESCRIPTION,
                  WITH_WORK,
                  "min_over_time: hysteresis, a GPU hovering around the line stays low (docs/prometheus.md)."),
        _compared(UTILIZATION_BELOW_TARGET, "utilization_low_for", info,
                  "A GPU with work on it is below the ${utilization_target|percent} utilization target and no cause "
                  "is known.", BELOW_TARGET_DESCRIPTION, BELOW_TARGET,
                  "The ladder's not_instrumented / underutilized rows up to the target "
                  "(gpu_exporter.verdict.ladder).\n"
                  "Hysteresis at both lines: below the target within alert_hold, unless low within it\n"
                  "(GpuUtilizationLow's) or a cause applied within it (the cause alerts'), so none take turns."),
        _compared(IDLE_BUT_ALLOCATED, "idle_for", warning, "A GPU is idle but allocated to a workload.",
                  IDLE_DESCRIPTION, WITH_WORK),
    ]
