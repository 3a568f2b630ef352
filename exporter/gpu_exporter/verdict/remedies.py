"""Concrete remedies: the numbers a verdict suggests, from what the job reports about itself, in Python and in PromQL.

The training library sends a ``context`` object with each snapshot (training/context.py): the
DataLoader's settings, the CPU cores the process may use, its GPU memory. Ingest validates it
and exports it as the gpu_training_* gauges of :data:`GAUGES` (gpu_exporter.ingest), and the
formulas below (derived in docs/runbooks.md, "Concrete remedies") turn it into a suggestion
for the cause that applies.

Each formula is written here twice, side by side: in Python for the judge (:func:`suggested_workers`,
:func:`batch_factor`: diagnose, the status page, the report) and in PromQL (:data:`WORKERS`, :data:`BATCH`:
the recording rules ``run:gpu_training_remedy:num_workers``, ``run:gpu_training_remedy:batch_factor`` and
``run:gpu_training_remedy:batch_size``, with the sentence a cause alert's description gets from them,
:meth:`Remedy.alert_text`). The cause table's rows carry them (``Cause.suggests``: M1 :data:`WORKERS_REMEDY`,
M3 :data:`BATCH_REMEDY`). monitoring/remedies.py only turns :data:`RULES` into the ``gpu-remedy.recording``
group; tests/test_remedies.py (``test_promql_remedies_equal_the_python_formulas``, promtool) checks the
rules give the Python formulas' numbers.

M1 (input-bound, data share ``s``, ``w`` workers, ``C`` cores)::

    workers = min(floor(C) - 1, max(w + 1, ceil(max(w, s) / (1 - s))))

M3 (batch too small, batch ``b``, utilization ``u``, compute share ``c``, memory used ``m`` of ``M``)::

    factor = 2 ** floor(log2(min(remedy_memory_target_ratio * M / m, c / u)));  batch = b * factor

>>> ctx = Context.of({"num_workers": 0, "cpu_cores": 16, "pin_memory": False, "persistent_workers": False})
>>> workers_suggestion(ctx, 0.9)
'num_workers=0 with 16 cores available: try num_workers=9, pin_memory=True, persistent_workers=True'
>>> [rule.name for rule in RULES]  # doctest: +NORMALIZE_WHITESPACE
['run:gpu_training_remedy:num_workers', 'run:gpu_training_remedy:batch_factor',
 'run:gpu_training_remedy:batch_size']
>>> WORKERS_REMEDY.text(ctx, {"compute": 1.0}, None, 0.5, None, None, 0.8)  # no data phase: no numbers
''
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from textwrap import indent
from typing import Any, Protocol

from gpu_exporter import catalog
from gpu_exporter.catalog import MetricFamily
from gpu_exporter.training.protocol import COMPUTE, CONTEXT_FIELDS, DATA
from gpu_exporter.verdict.promql import RUN, C, run_query, share

GAUGES: dict[str, MetricFamily] = {
    "num_workers": catalog.GPU_TRAINING_LOADER_WORKERS,
    "pin_memory": catalog.GPU_TRAINING_LOADER_PIN_MEMORY,
    "prefetch_factor": catalog.GPU_TRAINING_LOADER_PREFETCH_FACTOR,
    "persistent_workers": catalog.GPU_TRAINING_LOADER_PERSISTENT_WORKERS,
    "loader_batch_size": catalog.GPU_TRAINING_LOADER_BATCH_SIZE,
    "cpu_cores": catalog.GPU_TRAINING_CPU_CORES,
    "gpu_memory_used_bytes": catalog.GPU_TRAINING_MEMORY_USED_BYTES,
    "gpu_memory_total_bytes": catalog.GPU_TRAINING_MEMORY_TOTAL_BYTES,
    "allocator_peak_bytes": catalog.GPU_TRAINING_ALLOCATOR_PEAK_BYTES,
}
"""Context field -> its gauge (labels run, rank, uuid)."""


@dataclass(frozen=True)
class Context:
    """A run's reported context; None where it did not report the field."""

    num_workers: float | None = None
    pin_memory: float | None = None
    prefetch_factor: float | None = None
    persistent_workers: float | None = None
    loader_batch_size: float | None = None
    cpu_cores: float | None = None
    gpu_memory_used_bytes: float | None = None
    gpu_memory_total_bytes: float | None = None
    allocator_peak_bytes: float | None = None

    @classmethod
    def of(cls, fields: Mapping[str, float]) -> Context:
        """From a mapping of context field -> value (unknown keys ignored)."""
        return cls(**{k: float(v) for k, v in fields.items() if k in CONTEXT_FIELDS})


def read_contexts(series: Any) -> dict[tuple[str, str, str], Context]:
    """Every run's Context from the gauges, ``series(name)`` giving (labels, value) pairs (diagnose)."""
    fields: dict[tuple[str, str, str], dict[str, float]] = {}
    for key, family in GAUGES.items():
        for labels, value in series(family.name):
            run = (labels.get("run", ""), labels.get("rank", ""), labels.get("uuid", ""))
            fields.setdefault(run, {})[key] = value
    return {run: Context.of(f) for run, f in fields.items()}


# -- the formulas: each in Python, then the same in PromQL (template text, ``${key}`` of thresholds.yml) -----------

@dataclass(frozen=True)
class Rule:
    """A recorded series of a remedy: its name (a generated series of the catalog), its comment, its PromQL."""

    name: str
    doc: str
    promql: str


def _min(a: str, b: str) -> str:
    """``min(a, b)`` where both have a value, else ``b``."""
    return f"(\n  (\n{indent(a, ' ' * 4)}\n  )\n  <=\n  (\n{indent(b, ' ' * 4)}\n  )\n)\nor\n(\n{indent(b, ' ' * 2)}\n)"


def _per_run(gpu_metric: str) -> str:
    """The GPU's NVML figure (> 0) as one series per run on the GPU (the fallback where a run reports none)."""
    return (f"(\n    max by ({C}, uuid) ({gpu_metric} > 0)\n"
            f"  * on ({C}, uuid) group_right ()\n    (0 * {catalog.GPU_TRAINING_BATCH_SIZE.name} + 1)\n)")


def suggested_workers(workers: float, data_share: float, cores: float) -> float:
    """The M1 formula (module docstring): the workers that keep up, one core left for the main process.

    >>> suggested_workers(0, 0.9, 16), suggested_workers(4, 0.5, 16), suggested_workers(12, 0.5, 8)
    (9, 8, 7)
    """
    spare = math.floor(cores) - 1
    if data_share >= 1.0:
        return spare
    # - 1e-9: 0.9 / 0.1 is 9.000000000000002 in floating point (the PromQL rule subtracts the same)
    return min(spare, max(workers + 1, math.ceil(max(workers, data_share) / (1.0 - data_share) - 1e-9)))


_W, _S = catalog.GPU_TRAINING_LOADER_WORKERS.name, share(DATA)
_NEEDED = (f"ceil(\n  (\n      ({_W} >= {_S})\n    or\n      {_S}\n  )\n  / (1 - ({_S} < 1))\n  - 1e-9\n)\n"
           f"or\n({_S} >= 1) * 0 + Inf")
"""Workers that keep up with compute: ``ceil(max(w, s) / (1 - s))``; +Inf when all the time is data."""
WORKERS = (
    Rule(catalog.RUN_TRAINING_REMEDY_NUM_WORKERS.name,
         "M1: DataLoader workers that keep up with compute, one core left for the main process:\n"
         "min(floor(cores) - 1, max(w + 1, ceil(max(w, s) / (1 - s)))) (gpu_exporter.verdict.remedies).",
         _min(f"(\n  (\n{indent(_NEEDED, ' ' * 4)}\n  )\n  >= ({_W} + 1)\n)\nor\n{_W} + 1",
              f"floor({catalog.GPU_TRAINING_CPU_CORES.name}) - 1")),
)
""":func:`suggested_workers` in PromQL: ``max(w, s) / (1 - s)``, bounded by ``w + 1`` and the cores. One recorded
series a rank (an intermediate one for the first step cost 0.6 series a GPU at fleet scale)."""


def batch_factor(memory_used: float, memory_total: float, utilization: float, compute_share: float,
                 memory_target: float) -> int:
    """The M3 formula (module docstring): the power of two the batch can grow by (1: none).

    >>> batch_factor(3 * 2**30, 80 * 2**30, 0.05, 0.9, 0.8)
    16
    """
    limits = [memory_target * memory_total / memory_used if memory_used > 0 else math.inf,
              compute_share / utilization if utilization > 0 else math.inf]
    k = min(limits)
    return 1 if not math.isfinite(k) or k < 2 else 2 ** math.floor(math.log2(k))


_USED = (f"({catalog.GPU_TRAINING_ALLOCATOR_PEAK_BYTES.name} > 0)\nor\n"
         f"({catalog.GPU_TRAINING_MEMORY_USED_BYTES.name} > 0)\nor\n" + _per_run(catalog.GPU_MEMORY_USED_BYTES.name))
_TOTAL = f"({catalog.GPU_TRAINING_MEMORY_TOTAL_BYTES.name} > 0)\nor\n" + _per_run(catalog.GPU_MEMORY_TOTAL_BYTES.name)
_BUSY_LIMIT = (f"({share(COMPUTE)} > 0)\n/ on ({C}, uuid) group_left ()\n"
               f"max by ({C}, uuid) ({catalog.GPU_UTILIZATION_AVG5M.name})")
_K = _min(f"${{remedy_memory_target_ratio}} * (\n{indent(_TOTAL, ' ' * 4)}\n) / (\n{indent(_USED, ' ' * 4)}\n)",
          _BUSY_LIMIT)
_BATCH = f"({catalog.GPU_TRAINING_BATCH_SIZE.name} > 0)\nor\n{catalog.GPU_TRAINING_LOADER_BATCH_SIZE.name}"
BATCH = (
    Rule(catalog.RUN_TRAINING_REMEDY_BATCH_FACTOR.name,
         "M3: the power of two the batch can grow by: 2^floor(log2(min(remedy_memory_target_ratio * total /\n"
         "used, compute share / utilization))), where at least 2 (gpu_exporter.verdict.remedies).",
         f"2 ^ floor(log2(\n  (\n{indent(_K, ' ' * 4)}\n  ) >= 2\n))"),
    Rule(catalog.RUN_TRAINING_REMEDY_BATCH_SIZE.name, "M3: the suggested batch size: the batch times that factor.",
         f"({_BATCH})\n* {catalog.RUN_TRAINING_REMEDY_BATCH_FACTOR.name}"),
)
""":func:`batch_factor` in PromQL (memory used: the allocator's peak, else the job's reading, else NVML's; total:
the job's reading, else NVML's, as :func:`batch_suggestion`), then the batch it suggests."""

RULES = (*WORKERS, *BATCH)
"""The ``gpu-remedy.recording`` group, in order (monitoring/remedies.py)."""


# -- the suggestion text: the judge's (diagnose, the status page) and the alerts' ---------------------------------

def _n(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:g}"


def workers_suggestion(ctx: Context, data_share: float) -> str:
    """The M1 suggestion, or "" without the loader's settings or the cores."""
    if ctx.num_workers is None or ctx.cpu_cores is None:
        return ""
    w = ctx.num_workers
    have = f"num_workers={_n(w)} with {_n(ctx.cpu_cores)} cores available"
    target = suggested_workers(w, data_share, ctx.cpu_cores)
    low_prefetch = w > 0 and ctx.prefetch_factor is not None and ctx.prefetch_factor < 4
    extra = [setting for setting, wanted in (("pin_memory=True", not ctx.pin_memory),
                                             ("persistent_workers=True", not ctx.persistent_workers),
                                             ("prefetch_factor=4", low_prefetch)) if wanted]
    if target <= w:
        more = f"; also {', '.join(extra)}" if extra else ""
        return f"{have}: no core left for more workers: cache or preload the data set, decode on the GPU{more}"
    return f"{have}: try " + ", ".join([f"num_workers={_n(target)}", *extra])


def batch_suggestion(ctx: Context, batch: float | None, utilization: float, compute_share: float,
                     gpu_used: float | None, gpu_total: float | None, memory_target: float) -> str:
    """The M3 suggestion, or "" without a batch size or memory figures (used: the allocator's peak, else the job's
    own reading, else NVML's for the GPU; total: the job's reading, else NVML's)."""
    b = batch if batch else ctx.loader_batch_size
    used = next((m for m in (ctx.allocator_peak_bytes, ctx.gpu_memory_used_bytes, gpu_used) if m), None)
    total = ctx.gpu_memory_total_bytes or gpu_total
    if not b or not used or not total:
        return ""
    have = f"batch {_n(b)} uses {used / 2**30:.1f} of {total / 2**30:.0f} GiB"
    k = batch_factor(used, total, utilization, compute_share, memory_target)
    if k < 2:
        return f"{have}: no room to double it: accumulate gradients, CUDA graphs or torch.compile instead"
    return f"{have}: try batch {_n(b * k)} and scale the learning rate by {k}"


class Remedy(Protocol):
    """A concrete remedy a row of the cause table carries (``Cause.suggests``): its suggestion from one run's
    readings (:meth:`text`, the judge's) and the same from the recorded series of :data:`RULES` (:meth:`alert_text`,
    template text the cause's alerts put before its advice, monitoring/causes.py). The cause is asked, never named:
    a row without one (``suggests=None``) gets no numbers."""

    def text(self, ctx: Context, shares: Mapping[str, float], batch: float | None, utilization: float | None,
             gpu_used: float | None, gpu_total: float | None, memory_target: float) -> str: ...

    def alert_text(self) -> str: ...


class Workers(Remedy):
    """M1's: the DataLoader workers that keep up (:func:`workers_suggestion`, :data:`WORKERS`)."""

    def text(self, ctx: Context, shares: Mapping[str, float], batch: float | None, utilization: float | None,
             gpu_used: float | None, gpu_total: float | None, memory_target: float) -> str:
        return workers_suggestion(ctx, shares[DATA]) if DATA in shares else ""

    def alert_text(self) -> str:
        pin = run_query(catalog.GPU_TRAINING_LOADER_PIN_MEMORY.name, " == 0")
        persistent = run_query(catalog.GPU_TRAINING_LOADER_PERSISTENT_WORKERS.name, " == 0")
        more = run_query(catalog.RUN_TRAINING_REMEDY_NUM_WORKERS.name, f" > on {RUN} ", joined=_W)
        return (f"{{{{ with {more} | query }}}}With its cores the run can use DataLoader(num_workers="
                f"{{{{ . | first | value }}}}{{{{ with {pin} | query }}}}, pin_memory=True{{{{ end }}}}"
                f"{{{{ with {persistent} | query }}}}, persistent_workers=True{{{{ end }}}}). {{{{ end }}}}")


class Batch(Remedy):
    """M3's: the batch the GPU's memory and idle time allow (:func:`batch_suggestion`, :data:`BATCH`)."""

    def text(self, ctx: Context, shares: Mapping[str, float], batch: float | None, utilization: float | None,
             gpu_used: float | None, gpu_total: float | None, memory_target: float) -> str:
        compute = shares.get(COMPUTE, 0.0)
        if utilization is None or compute <= 0:
            return ""
        return batch_suggestion(ctx, batch, utilization, compute, gpu_used, gpu_total, memory_target)

    def alert_text(self) -> str:
        batch = run_query(catalog.RUN_TRAINING_REMEDY_BATCH_SIZE.name)
        factor = run_query(catalog.RUN_TRAINING_REMEDY_BATCH_FACTOR.name)
        return (f"{{{{ with {batch} | query }}}}Its memory allows batch {{{{ . | first | value }}}}"
                f"{{{{ with {factor} | query }}}} (scale the learning rate by {{{{ . | first | value }}}})"
                "{{ end }}. {{ end }}")


WORKERS_REMEDY, BATCH_REMEDY = Workers(), Batch()
"""The remedies of the cause table's M1 row and M3 row (gpu_exporter.verdict.causes)."""


class Suggesting(Protocol):
    """A cause as :func:`suggestions` asks it (gpu_exporter.verdict.kinds.Cause)."""

    @property
    def cause(self) -> str: ...

    def suggestion(self, ctx: Context, shares: Mapping[str, float], batch: float | None, utilization: float | None,
                   gpu_used: float | None, gpu_total: float | None, memory_target: float) -> str: ...


def suggestions(ctx: Context, causes: Iterable[Suggesting], shares: Mapping[str, float], batch: float | None,
                utilization: float | None, gpu_used: float | None, gpu_total: float | None,
                memory_target: float) -> dict[str, str]:
    """The suggestion of each of ``causes`` (the run's findings' causes) that has one for the run (cause id ->
    text), from one run's readings: each cause is asked (``Cause.suggestion``)."""
    out = {c.cause: c.suggestion(ctx, shares, batch, utilization, gpu_used, gpu_total, memory_target)
           for c in causes}
    return {k: v for k, v in out.items() if v}
