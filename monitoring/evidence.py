"""Rules for GPU processes nobody instrumented, generated from the evidence table (gpu_exporter.verdict.hints.HINTS).

:func:`records` are the ``gpu-process-evidence.recording`` group, :func:`alerts` the
``gpu-process-evidence.alerts`` group (each spliced where its template names it). The recording rules turn the
gpu_process_* counters of ``collectors/evidence.py`` into 5m rates and shares, and record one
``process:gpu_process_hint:value`` series (labels ``hint``, ``code``) per process whose evidence
passes a row of the table, on a GPU below ``utilization_target`` with no live training run.

The alert ``GpuUninstrumentedInputBound`` reads that series at two levels, like the cause alerts: below
``utilization_low_threshold`` (held over ``alert_hold``, the very condition of GpuUtilizationLow) it is a
*warning* with ``level="low"``, and prometheus/alertmanager.yml lets it replace GpuUtilizationLow for the
GPU, so the one warning an operator gets for an uninstrumented job carries the /proc evidence and the
real utilization; between that line and the target it is *info* (``level="target"``) and replaces
GpuUtilizationBelowTarget. ``gpu_exporter.verdict.hints.find_hints`` is the same logic in Python
(tests/test_evidence.py, ``test_promql_hints_equal_find_hints``, runs both on the same cases).
"""

from __future__ import annotations

from gpu_exporter import catalog as m
from gpu_exporter.verdict import evidence
from gpu_exporter.verdict.hints import EVIDENCE_ALERT, HINTS, Hint
from gpu_exporter.verdict.levels import BY_LEVEL, LOW, TARGET
from gpu_exporter.verdict.promql import GPU_SEL, HELD_LOW, C

from monitoring.model import Alert, Record, indent, wrap

UNINSTRUMENTED = (f"max by ({C}, uuid) ({m.GPU_UTILIZATION_AVG5M.name}) < ${{utilization_target}}\n"
                  f"unless on ({C}, uuid)\n({m.GPU_TRAINING_CURRENT_PHASE.name} == 1)")
"""GPUs below target on which no live training run reports (the sampled phases of collectors/stacks.py count as one)."""

_CPU, _CHILDREN, _READ, _STATES = evidence.rates("5m")
"""The counters' rates, as ``diagnose --window`` computes them for any window (gpu_exporter.verdict.evidence)."""
RATES = (
    (m.PROCESS_CPU_RATE5M.name, _CPU, "CPU cores used by each GPU process (1 = one whole core)."),
    (m.PROCESS_CHILDREN_CPU_RATE5M.name, _CHILDREN,
     "CPU cores used by each GPU process's child processes (DataLoader workers)."),
    (m.PROCESS_READ_BYTES_RATE5M.name, _READ,
     "Bytes per second each GPU process and its live children read from storage."),
    (m.PROCESS_MAIN_THREAD_STATE_SHARE5M.name,
     f"{_STATES}\n/ ignoring (state) group_left ()\n(sum without (state) ({_STATES}) > 0)",
     "Share of the window the main thread of each GPU process was running, sleeping, in disk wait, other."),
)


RECORDING = "gpu-process-evidence.recording"


def records() -> list[Record]:
    """The ``gpu-process-evidence.recording`` group: rates, shares and one hint rule per row of HINTS."""
    rules = [Record(RECORDING, name, expr, comment=doc) for name, expr, doc in RATES]
    for hint in HINTS:
        expr = f"(\n{indent(hint.promql, 2)}\n)\nand on ({C}, uuid)\n(\n{indent(UNINSTRUMENTED, 2)}\n)\n"
        rules.append(Record(RECORDING, m.PROCESS_HINT_VALUE.name, expr,
                            (("hint", hint.name), ("code", hint.code)),
                            f"{hint.label}: {hint.finding.format(value='<value>')}."))
    return rules


def _finding(hint: Hint) -> str:
    per_core = " of one core" if hint.per_core else ""
    return hint.finding.format(value="{{ $value | humanizePercentage }}" + per_core)


ALERTS = "gpu-process-evidence.alerts"
GPU_NOW = (f'{{{{ with printf "{m.GPU_UTILIZATION_AVG5M.name}{GPU_SEL[0]}" {GPU_SEL[1]} | query }}}}'
           "{{ . | first | value | humanizePercentage }}{{ end }}")
"""Template text: the GPU's 5m mean utilization now (a GPU without a live run is judged at it)."""
GAP = {LOW: "below the ${utilization_low_threshold|percent} alert threshold",
       TARGET: "below the ${utilization_target|percent} target (at or above ${utilization_low_threshold|percent})"}
"""Where the GPU stands, per level: the line it is below (the warning names the real level, not the target)."""
SUMMARY = {LOW: "A GPU job nobody instrumented is below ${utilization_low_threshold|percent} utilization",
           TARGET: "A GPU job nobody instrumented is below the ${utilization_target|percent} target"}


def _evidence_alert(hint: Hint, lvl: str) -> Alert:
    """GpuUninstrumentedInputBound of ``hint`` at level ``lvl``: ``low`` (the GPU's useful utilization below
    the low line within alert_hold, as GpuUtilizationLow judges it) is a warning that replaces GpuUtilizationLow
    (prometheus/alertmanager.yml inhibits that for the GPU); ``target`` (the rest, up to the target) is info."""
    keep = "and" if lvl == LOW else "unless"
    expr = (f'(\n    {m.PROCESS_HINT_VALUE.name}{{hint="{hint.name}"}}\n  {keep} on ({C}, uuid)\n'
            f"    {HELD_LOW}\n)\n"
            f"* on ({C}, uuid) group_left (gpu, namespace, pod, container) {m.GPU_WORKLOAD_INFO.name}\n")
    description = (
        "Process {{ $labels.pid }} on GPU {{ $labels.gpu }} ({{ $labels.uuid }}), node {{ $labels.node }}"
        "{{ with $labels.pod }}, pod {{ $labels.namespace }}/{{ . }}{{ end }}, reports no training phases "
        f"(not instrumented), and {_finding(hint)}. The GPU is at {GPU_NOW}, {GAP[lvl]}: {hint.label}. "
        f"{hint.advice}")
    labels = (("severity", BY_LEVEL[lvl].severity), ("level", lvl), ("hint", hint.name))
    return Alert(ALERTS, EVIDENCE_ALERT, expr, "cause_for", labels,
                 f"{SUMMARY[lvl]}; its processes point at {hint.label}.", wrap(description))


def alerts() -> list[Alert]:
    """The ``gpu-process-evidence.alerts`` group: GpuUninstrumentedInputBound, one rule per hint and level
    (the warnings of level low first, then the info alerts of level target)."""
    return [_evidence_alert(hint, lvl) for lvl in (LOW, TARGET) for hint in HINTS]
