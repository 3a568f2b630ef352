"""The utilization alerts of the device (GpuUtilizationLow, GpuIdleButAllocated) as model objects.

They judge one GPU's utilization against a threshold of thresholds.yml while work is held on it, and
join the workload (pod, run) for the text. ``monitoring.rules`` writes them into the
``gpu-utilization.alerts`` group of gpu-alerts.rules.yml (where the template says so);
``monitoring.grafana_alerts`` mirrors them with the same query, comparison and ``for``.
"""

from __future__ import annotations

from gpu_exporter.catalog import GPU_HAS_WORK_BOOL, GPU_UTILIZATION_AVG5M, GPU_WORKLOAD_INFO
from gpu_exporter.causes import CAUSES

from monitoring.model import VALUE, Alert

GROUP = "gpu-utilization.alerts"
C = "${cluster_label}"
WITH_WORK = (f"(\n    {VALUE}\n  and on ({C}, uuid)\n    ({GPU_HAS_WORK_BOOL.name} == 1)\n)\n"
             f"* on ({C}, uuid) group_left (namespace, pod, container, run) {GPU_WORKLOAD_INFO.name}\n")
"""A GPU's value while it holds memory, processes or a training run, with the workload's labels."""

LOW_DESCRIPTION = (
    'GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on node {{ $labels.node }}{{ with $labels.pod }},\n'
    'pod {{ $labels.namespace }}/{{ . }}{{ end }}{{ with $labels.run }}, training run {{ . }}{{ end }}\n'
    'has been below ${utilization_low_threshold|percent} utilization for ${utilization_low_for} (5m mean, down to\n'
    '{{ $value | humanizePercentage }} in the last ${alert_hold}) while it holds memory, processes or a training run. '
    '{{ with $labels.run }}Run {{ . }} reports its phases:\n'
    f'a cause alert ({", ".join(c.alert for c in CAUSES)})\n'
    'names the remedy when one cause explains the gap;\n'
    '`gpu-exporter diagnose --run {{ . }}` shows all phases, `gpu-exporter report --run {{ . }}` what the\n'
    'run has cost so far and how much shorter it would be without its main cause.{{ else }}No training run '
    'reports from\n'
    'this GPU: instrument the job with gpu_exporter.training to get the cause, or check in this order:\n'
    'input pipeline (M1), metric computations (M2), checkpoints (CK), batch size (M3), allocator (M4).{{ end }}\n'
)
IDLE_DESCRIPTION = (
    'GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on node {{ $labels.node }}{{ with $labels.pod }},\n'
    'pod {{ $labels.namespace }}/{{ . }}{{ end }}{{ with $labels.run }}, training run {{ . }}{{ end }}\n'
    'has been at {{ $value | humanizePercentage }} utilization for ${idle_for} while memory is held on it.\n'
    'The GPU is wasted: release it (stop the idle notebook or job) or find what the job waits on (M1, M2).\n'
)


def alerts() -> list[Alert]:
    """GpuUtilizationLow (the lowest 5m mean over alert_hold: hysteresis) and GpuIdleButAllocated."""
    warning = (("severity", "warning"),)
    return [
        Alert(GROUP, "GpuUtilizationLow", f"min_over_time({GPU_UTILIZATION_AVG5M.name}[${{alert_hold}}])",
              "utilization_low_for", warning,
              "A GPU with work on it is below ${utilization_low_threshold|percent} utilization.", LOW_DESCRIPTION,
              "gpuutilizationlow", op="<", threshold="utilization_low_threshold", shape=WITH_WORK,
              comment="min_over_time: hysteresis, a GPU hovering around the line stays low (docs/prometheus.md)."),
        Alert(GROUP, "GpuIdleButAllocated", GPU_UTILIZATION_AVG5M.name, "idle_for", warning,
              "A GPU is idle but allocated to a workload.", IDLE_DESCRIPTION, "gpuidlebutallocated",
              op="<", threshold="idle_utilization_threshold", shape=WITH_WORK),
    ]
