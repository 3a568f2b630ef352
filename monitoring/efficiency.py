"""Busy but not effective: the recorded SM activity and the GPU-level alerts, from the table of
gpu_exporter.verdict.efficiency (EFFICIENCY).

:func:`records` is the ``gpu-efficiency.recording`` group: one series per GPU, ``gpu:gpu_sm_active:avg5m``
{cluster, uuid, source}, GPM's whole-GPU SM activity where the exporter reports it, else dcgm-exporter's
(joined by UUID), else none. :func:`alerts` gives each kind its own group ``gpu-efficiency-<cause>.alerts``
(groups evaluate concurrently, docs/fleet.md): GpuMemoryBoundKernels, GpuSmBatchTooSmall, GpuTensorCoresIdle and
GpuSmActivityLow, all info (the GPU is busy), ``for: ${cause_for}``, only for a GPU at or above
``utilization_target`` (its useful utilization, the ladder's level) that has work. Each fires while its cause held
at any time in the last ``alert_hold`` (:func:`held`: the cause's series of ``gpu:gpu_busy_not_effective:ratio``,
recorded only where the condition holds), the hysteresis of the other causes' alerts: a GPU whose SM activity, DRAM
or utilization hovers at a line stays firing instead of flapping between pending and resolved. Tensor and DRAM
activity are read inline (no recorded series: the fleet's series budget). Each alert makes one join for the
workload's labels. GpuTensorCoresIdle's text names the busiest of the FP32, FP16 and FP64 pipes where dcgm-exporter
serves ``DCGM_FI_PROF_PIPE_FP*_ACTIVE`` (:func:`_pipes`, read from the raw series when the text is rendered: no
recorded series, and nothing where the fields are absent), and what the math does there.
"""

from __future__ import annotations

from gpu_exporter import catalog as m
from gpu_exporter.verdict.efficiency import EFFICIENCY, FP_PIPES, SM, SM_RECORD, GpuCause
from gpu_exporter.verdict.promql import AT_TARGET as AT_TARGET  # monitoring.funnel's too
from gpu_exporter.verdict.promql import GPU_SEL, C, efficiency_held

from monitoring.model import VALUE, Alert, Record, where, wrap

RECORDING = "gpu-efficiency.recording"
ALERTS = "gpu-efficiency-{cause}.alerts"
WORK = (f"(\n    {m.GPU_WORKLOAD_INFO.name}\n  * on ({C}, uuid) group_left (node)\n"
        f"    ({m.GPU_HAS_WORK_BOOL.name} == 1)\n)")
"""The GPUs with work, with the workload's labels and the node: the one join of each alert."""
WHO = where()
"""The GPU and its workload, at the start of each description."""
BUSY = (f'{{{{ with printf "clamp_max(max by ({C}, uuid) ({m.GPU_UTILIZATION_AVG5M.name}{GPU_SEL[0]}), 1)" '
        f'{GPU_SEL[1]} | query }}}}'
        "{{ . | first | value | humanizePercentage }}{{ end }}")
"""The GPU's busy utilization (NVML) now, in the alert's text."""
def _pipes(doing: str) -> str:
    """The text after the tensor pipe in tensor cores idle: the busiest of dcgm-exporter's fp pipes
    (:data:`~gpu_exporter.verdict.efficiency.FP_PIPES`, one query, read when the text renders) and what the math does
    where it carries the most (the table's words, as diagnose says them); ``doing`` alone where dcgm-exporter serves
    no fp pipe field (its default counters file)."""
    each = " or ".join(f'label_replace(max(avg_over_time({p.series.name}{{{C}=%q,{m.DCGM_UUID_LABEL}=%q}}[5m])), '
                       f'\\"pipe\\", \\"{p.name}\\", \\"\\", \\"\\")' for p in FP_PIPES)
    args = " ".join(GPU_SEL[1] for _ in FP_PIPES)
    what = "".join(f'{{{{ {"if" if i == 0 else "else if"} eq $pipe "{p.name}" }}}}{p.doing}'
                   for i, p in enumerate(q for q in FP_PIPES if q.doing)) + f"{{{{ else }}}}{doing}{{{{ end }}}}"
    return (f'{{{{ with printf "topk(1, {each})" {args} | query }}}}{{{{ $pipe := . | first | label "pipe" }}}}'
            f", and its {{{{ $pipe }}}} pipe {{{{ . | first | value | humanizePercentage }}}} active (DCGM): {what}"
            f"{{{{ else }}}}: {doing}{{{{ end }}}}")


def records() -> list[Record]:
    """``gpu:gpu_sm_active:avg5m``: GPM wins, else DCGM joined by UUID."""
    return [Record(RECORDING, SM, SM_RECORD, comment=wrap(
        "Effective utilization: the 5m mean SM activity of the whole GPU (0-1), from GPM (the exporter's "
        f"{m.GPU_SM_ACTIVE_RATIO.name}, mig_uuid=\"\") where present, else from dcgm-exporter "
        f"({m.DCGM_SM_ACTIVE.name}, its {m.DCGM_UUID_LABEL} label as uuid, node and gpu from "
        f"{m.GPU_INFO.name}); label source = gpm or dcgm. No series without either (diagnose then says SM activity "
        "unknown). Labels cluster, node, gpu, uuid: the dashboards select it by node with no join."))]


def _alert(cause: GpuCause) -> Alert:
    # the value: the GPU's SM activity now (with its source), on a GPU where the cause held within alert_hold; no
    # comparison (a Grafana rule fires on any series: SM activity > 0 on a busy GPU)
    shape = (f"(\n    {VALUE}\n  and on ({C}, uuid)\n    {efficiency_held(cause.cause)}\n)\n"
             f"* on ({C}, uuid) group_left (node, gpu, namespace, pod, container, run)\n{WORK}\n")
    reading = "{{ $value | humanizePercentage }}"
    tensor = cause.keys[0] == "tensor_idle_ratio"
    now = f"its SMs are {reading} active ({{{{ $labels.source }}}})" + (
        f" but its tensor pipe below ${{tensor_idle_ratio|percent}}{_pipes(cause.doing)}" if tensor
        else f": {cause.doing}")
    line = ("Tensor pipe activity below ${tensor_idle_ratio|percent} while the SMs are at least "
            "${sm_active_low|percent} active means the math runs on the CUDA cores, not the tensor cores."
            if tensor else
            "Effective utilization (SM activity) below ${sm_active_low|percent} is likely ineffective use.")
    description = (f"{WHO} is busy ({BUSY} utilization, at or above the ${{utilization_target|percent}} target) but "
                   f"{now}. {line} Cause: {cause.label}, held within the last ${{alert_hold}}. "
                   f"{cause.advice}")
    summary = f"A busy GPU is not used effectively, cause {cause.label}."
    return Alert(ALERTS.format(cause=cause.cause), cause.alert, SM, "cause_for",
                 (("severity", "info"), ("cause", cause.cause)) + ((("code", cause.code),) if cause.code else ()),
                 summary, wrap(description), shape=shape)


def alerts() -> list[Alert]:
    """One alert per kind of the table, each in its own group."""
    return [_alert(cause) for cause in EFFICIENCY]
