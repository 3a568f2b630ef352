"""What the fleet's GPUs lose below target, and why: the ``gpu-cost.recording`` group, which the GPU fleet cost
dashboard (monitoring.dashboards.cost) sums over its time range.

Two series, from the same definitions as ``gpu-exporter report --fleet`` (gpu_exporter.commands.fleet) and the
utilization alerts: a GPU is *below target* while it has work (``gpu:gpu_has_work:bool``, what the ladder's
"unused" row excludes) and its useful utilization (``gpu:gpu_useful_utilization:avg5m``, what its level is
judged at) is below ``utilization_target``; its *idle share* is then 1 - that utilization, the capacity lost.

- ``gpu:gpu_below_target:bool``: 1 or 0 per GPU, with the GPU's labels.
- ``gpu:gpu_idle_below_target:ratio``: the idle share of each GPU below target, with its workload (namespace,
  pod, container, run, as ``gpu:gpu_workload:info`` names them) and, where one is known, the ``code`` of its
  main cause: the cause the ladder names for its live run (the allocator first, then the biggest share, as
  ``gpu_exporter.verdict.causes.cause_order``), else the code of the /proc evidence of an uninstrumented job.
  A GPU below target with no known cause (idle but allocated, not instrumented, underutilized) has no code.

Summed over time each gives GPU-hours (a value of 1 held for an hour is one GPU-hour).
"""

from __future__ import annotations

from gpu_exporter import catalog as m
from gpu_exporter.verdict.causes import CAUSES
from gpu_exporter.verdict.promql import CAUSE_SHARE, C

from monitoring.model import Record, indent

RECORDING = "gpu-cost.recording"
BELOW = m.GPU_BELOW_TARGET_BOOL.name
USEFUL = m.GPU_USEFUL_UTILIZATION_AVG5M.name
FIRST = "|".join(c.cause for c in CAUSES if c.first)
"""The causes that come first whatever their value (cause_order: the allocator, which also explains the others)."""

MAIN_CAUSE = (
    f"group by ({C}, uuid, code) (\n"
    f"  topk by ({C}, uuid) (1,\n"
    f'      0 * max by ({C}, uuid, code) ({CAUSE_SHARE}{{cause=~"{FIRST}"}}) + 2\n'
    f"    or\n"
    f'      clamp_max(max by ({C}, uuid, code) ({CAUSE_SHARE}{{cause!~"{FIRST}"}}), 1)\n'
    f"  )\n"
    f")\n"
    f"or on ({C}, uuid)\n"
    f"topk by ({C}, uuid) (1, group by ({C}, uuid, code) ({m.PROCESS_HINT_VALUE.name}))"
)
"""One series (value 1) per GPU with a known main cause, its ``code`` label: a cause of a live run (the first
causes rank 2, the others their share, at most 1), else an evidence hint of an uninstrumented process."""


def records() -> list[Record]:
    """The ``gpu-cost.recording`` group: whether each GPU is below target, then the idle share of those below it
    (the rules of a group run in order, so the second reads this evaluation's first)."""
    below = (f"(\n  {USEFUL} < bool ${{utilization_target}}\n)\n"
             f"* on ({C}, uuid) group_left ()\n"
             f"max by ({C}, uuid) ({m.GPU_HAS_WORK_BOOL.name})\n")
    idle = (f"(\n    (1 - clamp_max({USEFUL}, 1))\n  and on ({C}, uuid)\n    ({BELOW} == 1)\n)\n"
            f"* on ({C}, uuid) group_left (namespace, pod, container, run)\n  {m.GPU_WORKLOAD_INFO.name}\n"
            f"* on ({C}, uuid) group_left (code)\n(\n  (\n{indent(MAIN_CAUSE, 4)}\n  )\n"
            f"  or on ({C}, uuid)\n  group by ({C}, uuid) ({BELOW})\n)\n")
    return [
        Record(RECORDING, BELOW, below,
               comment="1 while the GPU has work and its useful utilization is below the target (the GPUs\n"
                       "report --fleet counts below target), else 0; the GPU's labels."),
        Record(RECORDING, m.GPU_IDLE_BELOW_TARGET_RATIO.name, idle,
               comment="The idle share (1 - useful utilization) of each GPU below target: the capacity lost. With\n"
                       "its workload and, where known, the code of its main cause (a live run's cause, the\n"
                       "allocator first, then the biggest; else an uninstrumented process's evidence), so the\n"
                       "GPU-hours lost sum by cause, namespace, run or node."),
    ]
