"""PromQL of the concrete remedies (gpu_exporter.remedies): recording rules and the alerts' suggestion text.

``run:gpu_training_remedy:num_workers`` (M1) and ``run:gpu_training_remedy:batch_size`` /
``run:gpu_training_remedy:batch_factor`` (M3) are the formulas of gpu_exporter.remedies, computed
from the gpu_training_* context gauges the library reports; :func:`annotation` is the sentence a
cause alert's description gets from them (monitoring.causes puts it before the cause's advice).
tests/test_remedies.py (``test_promql_remedies_equal_the_python_formulas``) checks the rules against the
Python formulas' results with promtool.
"""

from __future__ import annotations

from gpu_exporter import catalog as m
from gpu_exporter.verdict.causes import Cause
from gpu_exporter.verdict.promql import C, run_query, share

from monitoring.model import Record, indent


def _per_run(gpu_metric: str) -> str:
    """The GPU's NVML figure (> 0) as one series per run on the GPU (the fallback where a run reports none)."""
    return (f"(\n    max by ({C}, uuid) ({gpu_metric} > 0)\n"
            f"  * on ({C}, uuid) group_right ()\n    (0 * {m.GPU_TRAINING_BATCH_SIZE.name} + 1)\n)")


def _min(a: str, b: str) -> str:
    return f"(\n    ({a})\n  <=\n    ({b})\n)\nor\n({b})"


W = m.GPU_TRAINING_LOADER_WORKERS.name
S = share("data")
NEED = (f"ceil(\n  (\n      ({W} >= {S})\n    or\n      {S}\n  )\n  / (1 - ({S} < 1))\n  - 1e-9\n)\n"
        f"or\n({S} >= 1) * 0 + Inf")
NEEDED = m.RUN_TRAINING_REMEDY_WORKERS_NEEDED.name
AT_LEAST = f"({NEEDED} >= ({W} + 1))\nor\n({W} + 1)"
SPARE = f"floor({m.GPU_TRAINING_CPU_CORES.name}) - 1"
USED = (f"({m.GPU_TRAINING_ALLOCATOR_PEAK_BYTES.name} > 0)\nor\n({m.GPU_TRAINING_MEMORY_USED_BYTES.name} > 0)\nor\n"
        + _per_run(m.GPU_MEMORY_USED_BYTES.name))
TOTAL = f"({m.GPU_TRAINING_MEMORY_TOTAL_BYTES.name} > 0)\nor\n" + _per_run(m.GPU_MEMORY_TOTAL_BYTES.name)
BUSY_LIMIT = (f"({share('compute')} > 0)\n/ on ({C}, uuid) group_left ()\n"
              f"max by ({C}, uuid) ({m.GPU_UTILIZATION_AVG5M.name})")
K = _min(f"${{remedy_memory_target_ratio}} * (\n{indent(TOTAL, 4)}\n) / (\n{indent(USED, 4)}\n)", BUSY_LIMIT)
BATCH = f"({m.GPU_TRAINING_BATCH_SIZE.name} > 0)\nor\n{m.GPU_TRAINING_LOADER_BATCH_SIZE.name}"
FACTOR = f"2 ^ floor(log2(\n  (\n{indent(K, 4)}\n  ) >= 2\n))"

RULES = (
    (NEEDED, "M1: workers that keep up with compute: ceil(max(w, s) / (1 - s)); +Inf when all the time is data.",
     NEED),
    (m.RUN_TRAINING_REMEDY_NUM_WORKERS.name,
     "M1: DataLoader workers that keep up with compute, one core left for the main process:\n"
     "min(floor(cores) - 1, max(w + 1, ceil(max(w, s) / (1 - s)))) (gpu_exporter.remedies).",
     _min(AT_LEAST, SPARE)),
    (m.RUN_TRAINING_REMEDY_BATCH_FACTOR.name,
     "M3: the power of two the batch can grow by: 2^floor(log2(min(remedy_memory_target_ratio * total /\n"
     "used, compute share / utilization))), where at least 2 (gpu_exporter.remedies).", FACTOR),
    (m.RUN_TRAINING_REMEDY_BATCH_SIZE.name, "M3: the suggested batch size: the batch times that factor.",
     f"({BATCH})\n* {m.RUN_TRAINING_REMEDY_BATCH_FACTOR.name}"),
)


GROUP = "gpu-remedy.recording"


def records() -> list[Record]:
    """The ``gpu-remedy.recording`` group."""
    return [Record(GROUP, name, expr, comment=doc) for name, doc, expr in RULES]


def annotation(cause: Cause) -> str:
    """The suggestion a cause alert's description carries (before the advice), or "" for other causes."""
    if cause.cause == "input_bound":
        pin = run_query(m.GPU_TRAINING_LOADER_PIN_MEMORY.name, " == 0")
        persistent = run_query(m.GPU_TRAINING_LOADER_PERSISTENT_WORKERS.name, " == 0")
        more = run_query(m.RUN_TRAINING_REMEDY_NUM_WORKERS.name, " > on (run, rank, uuid) ", joined=W)
        return (f"{{{{ with {more} | query }}}}With its cores the run can use DataLoader(num_workers="
                f"{{{{ . | first | value }}}}{{{{ with {pin} | query }}}}, pin_memory=True{{{{ end }}}}"
                f"{{{{ with {persistent} | query }}}}, persistent_workers=True{{{{ end }}}}). {{{{ end }}}}")
    if cause.cause == "batch_too_small":
        batch = run_query(m.RUN_TRAINING_REMEDY_BATCH_SIZE.name)
        factor = run_query(m.RUN_TRAINING_REMEDY_BATCH_FACTOR.name)
        return (f"{{{{ with {batch} | query }}}}Its memory allows batch {{{{ . | first | value }}}}"
                f"{{{{ with {factor} | query }}}} (scale the learning rate by {{{{ . | first | value }}}})"
                "{{ end }}. {{ end }}")
    return ""
