"""Busy but not effective: the GPU-level causes read from SM activity, one table like the run causes.

NVML's utilization is the share of time at least one kernel ran: a GPU busy with small kernels, fp32
math (tensor cores idle) or memory-bound kernels reads 90-100% while most of its SMs idle. GPM (Hopper
and newer, collectors/gpm.py) and the cluster's dcgm-exporter report what the SMs did; *effective
utilization* is the SM activity, never more than the busy utilization. NVIDIA's guidance: ~0.8 is
needed for good use, below 0.5 is likely ineffective (thresholds.yml ``sm_active_low``).

:data:`EFFICIENCY` is the table, in precedence order (memory-bound, then batch too small, then tensor
cores idle, then the fallback "busy but ineffective"). Each kind holds its condition twice, for the judge
(:meth:`GpuCause.holds`) and for the generated rules (monitoring/efficiency.py: :meth:`GpuCause.promql`), with its
alert, remedy and advice; tests/test_causes_conformance.py feeds the same GPUs to promtool and to
:func:`find_efficiency`. They apply only to a GPU with work at or above ``utilization_target`` (judged as the
ladder's level): below the target the run causes and the below-target alerts speak.

The worth of a finding is the share of the GPU between busy and effective (``busy - sm``): times the
hours, the GPU-hours it is worth.

>>> from gpu_exporter.thresholds import load_thresholds
>>> t = load_thresholds()
>>> f = find_efficiency(Activity(0.96, 0.25, 0.4, 0.1, 0.2, "gpm"), t)
>>> f.cause.cause, f.cause.code, round(f.worth, 2)
('sm_batch_too_small', 'M3', 0.71)
>>> find_efficiency(Activity(0.96, 0.85, 0.6, 0.3, 0.5, "gpm"), t) is None
True
>>> effective_line(0.96, None, None)
'SM activity unknown: enable GPM (Hopper and newer) or DCGM profiling (docs/dcgm-exporter.md)'
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from gpu_exporter import catalog as m
from gpu_exporter.training.protocol import COMPUTE
from gpu_exporter.verdict.format import Labelled, pct
from gpu_exporter.verdict.levels import threshold

if TYPE_CHECKING:
    from gpu_exporter.thresholds import Thresholds

__all__ = ["DRAM", "EFFICIENCY", "EFFICIENCY_BY_ID", "FP_PIPES", "MEMORY", "SM", "SOURCES", "TENSOR", "UNKNOWN",
           "Activity", "FpPipe", "GpuCause", "GpuFinding", "compute_sm", "dram_query", "effective_line",
           "find_efficiency", "for_cluster", "sm_query", "tensor_query"]

C = "${cluster_label}"
SOURCES = {"gpm": "GPM", "dcgm": "DCGM"}
"""The sources of SM activity (the recorded series' ``source`` label) and their names in words."""
UNKNOWN = "SM activity unknown: enable GPM (Hopper and newer) or DCGM profiling (docs/dcgm-exporter.md)"
"""The effective-use line of a GPU without an SM source: never called effective."""


def _gpm(gpm: m.MetricFamily, window: str) -> str:
    """The whole GPU's mean of a GPM gauge over ``window`` (labels: the cluster label and uuid)."""
    return f'max by ({C}, uuid) (avg_over_time({gpm.name}{{mig_uuid=""}}[{window}]))'


def _dcgm(dcgm: m.ExternalSeries, window: str) -> str:
    """dcgm-exporter's field averaged over ``window``, its UUID label as uuid (labels: the cluster label and uuid)."""
    return (f'max by ({C}, uuid) (label_replace(avg_over_time({dcgm.name}[{window}]), "uuid", "$1", '
            f'"{m.DCGM_UUID_LABEL}", "(.+)"))')


def sm_query(window: str = "5m") -> str:
    """SM activity over ``window`` {cluster, node, gpu, uuid, source}: GPM wins, else DCGM, else nothing (with
    ``5m``: the recording rule of ``gpu:gpu_sm_active:avg5m``). It carries the GPU's ``node`` and ``gpu`` so that
    dashboards need no join with ``gpu_info`` at every step: for DCGM joined once here, ``gpu_info`` the many side
    (a UUID seen on two nodes gives two series, never a many-to-many error that would drop every GPU's)."""
    gpm = f'max by ({C}, node, gpu, uuid) (avg_over_time({m.GPU_SM_ACTIVE_RATIO.name}{{mig_uuid=""}}[{window}]))'
    dcgm = (f'group by ({C}, node, gpu, uuid) ({m.GPU_INFO.name})\n    * on ({C}, uuid) group_left ()\n  '
            f'{_dcgm(m.DCGM_SM_ACTIVE, window)}')
    return (f'label_replace(\n  {gpm},\n  "source", "gpm", "", ""\n)\n'
            f'or on ({C}, uuid)\nlabel_replace(\n  {dcgm},\n  "source", "dcgm", "", ""\n)\n')


def tensor_query(window: str = "5m") -> str:
    """Tensor pipe activity over ``window`` {cluster, uuid}, GPM's else DCGM's."""
    return f"{_gpm(m.GPU_TENSOR_ACTIVE_RATIO, window)}\nor on ({C}, uuid)\n{_dcgm(m.DCGM_TENSOR_ACTIVE, window)}"


def dram_query(window: str = "5m") -> str:
    """DRAM activity over ``window`` {cluster, uuid}, GPM's else DCGM's."""
    return (f"{_gpm(m.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO, window)}\nor on ({C}, uuid)\n"
            f"{_dcgm(m.DCGM_DRAM_ACTIVE, window)}")


@dataclass(frozen=True)
class FpPipe:
    """One of dcgm-exporter's fp pipe fields (``DCGM_FI_PROF_PIPE_FP32_ACTIVE`` and its FP16 and FP64 siblings):
    evidence in the text of tensor cores idle, never part of a condition. ``doing``: what the math does where this
    pipe carries the most of it (None: the cause's own ``doing``). None is read from GPM (series per GPU against the
    fleet's budget), so no series where dcgm-exporter's counters file leaves the fields out (its default)."""

    name: str
    series: m.ExternalSeries
    doing: str | None = None

    @property
    def key(self) -> str:
        """``"fp32"``: the name of its reading (``Activity.fp32``, ``GpuView.fp32_active``, the JSON's)."""
        return self.name.lower()

    def query(self, window: str = "5m") -> str:
        return _dcgm(self.series, window)


FP_PIPES: tuple[FpPipe, ...] = (
    FpPipe("FP32", m.DCGM_FP32_ACTIVE),
    FpPipe("FP16", m.DCGM_FP16_ACTIVE,
           "its half-precision math runs on the CUDA cores and the tensor cores idle (elementwise fp16 ops, or "
           "matmul shapes the tensor cores cannot take)"),
    FpPipe("FP64", m.DCGM_FP64_ACTIVE,
           "its math runs in float64 and the tensor cores idle: check the tensors' dtype first (numpy arrays "
           "default to float64 and torch.from_numpy keeps it)"),
)
"""The fp pipes, in the order a tie names them (fp32 first) and the effective line lists them."""


def for_cluster(expr: str, cluster_label: str) -> str:
    """A fragment as sent to Prometheus by diagnose: the thresholds' ``cluster_label`` in place of its placeholder."""
    return expr.replace(C, cluster_label)


SM_RECORD = sm_query()
"""The recording rule of ``gpu:gpu_sm_active:avg5m``."""
SM = m.GPU_SM_ACTIVE_AVG5M.name
"""The GPU's effective utilization (5m mean SM activity), recorded."""
TENSOR = tensor_query()
"""The GPU's tensor pipe activity (5m mean), read inline (no recorded series: the fleet's series budget)."""
DRAM = dram_query()
"""The GPU's DRAM activity (5m mean), read inline."""
MEMORY = f"max by ({C}, uuid) ({m.GPU_MEMORY_USED_RATIO.name})"
"""The GPU's share of memory used."""


@dataclass(frozen=True)
class Activity:
    """What one GPU's SMs did over the window, beside its busy utilization (ratios 0-1, None: unknown)."""

    busy: float
    sm: float | None
    tensor: float | None = None
    dram: float | None = None
    memory: float | None = None
    source: str | None = None
    fp32: float | None = None
    fp16: float | None = None
    fp64: float | None = None
    """FP32, FP16, FP64 pipe activity, from dcgm-exporter where it serves them (evidence for tensor cores idle)."""

    def pipes(self) -> dict[FpPipe, float]:
        """The fp pipes served (:data:`FP_PIPES`' order) and their activity; empty without dcgm-exporter's fields."""
        return {p: v for p in FP_PIPES if (v := getattr(self, p.key)) is not None}


@dataclass(frozen=True)
class GpuFinding:
    """A GPU-level cause that holds: its kind and the reading its alert reports (``value``), and the worth."""

    cause: GpuCause
    value: float
    sm: float
    busy: float

    @property
    def worth(self) -> float:
        """The share of the GPU between busy and effective: ``busy - sm`` (never below 0)."""
        return max(0.0, self.busy - self.sm)

    def projection(self) -> str:
        return f"SM activity could reach at most ~{pct(self.busy)} (the busy utilization) if the kernels filled the GPU"



@dataclass(frozen=True)
class GpuCause(Labelled):
    """One row of the table; its class is its kind. ``keys``: the thresholds.yml keys its condition reads (the
    first is the one its compared value is compared with). ``doing``: what the GPU does, for the reason."""

    cause: str
    code: str
    title: str
    alert: str
    keys: tuple[str, ...]
    doing: str
    remedy: str
    advice: str

    op: ClassVar[str] = "<"
    """How :meth:`value` compares with ``keys[0]`` (the alert's comparison; Grafana's evaluator)."""

    def value(self, a: Activity) -> float | None:
        """The reading the alert compares and reports: the SM activity (tensor pipe for tensor cores idle)."""
        return a.sm

    def holds(self, a: Activity, t: Thresholds) -> bool:
        """The condition on a GPU at or above the target with work (the caller checks that)."""
        raise NotImplementedError

    def promql(self) -> tuple[str, str]:
        """``(value, conditions)``: the compared value (its comparison is ``op keys[0]``) and the PromQL that
        follows it (``and`` / ``unless`` on the GPU's cluster and uuid), as template text."""
        raise NotImplementedError

    def reason(self, a: Activity) -> str:
        """One sentence on what the readings show, for diagnose."""
        return (f"its SMs are {pct(a.sm or 0.0)} active ({SOURCES.get(a.source or '', a.source)}) while NVML "
                f"reads it {pct(a.busy)} busy: {self.doing}.")


def _low(a: Activity, t: Thresholds) -> bool:
    return a.sm is not None and a.sm < threshold(t, "sm_active_low")


def _dram_bound(a: Activity, t: Thresholds) -> bool:
    return a.dram is not None and a.dram >= threshold(t, "dram_bound_ratio")


def _memory_left(a: Activity, t: Thresholds) -> bool:
    return a.memory is not None and a.memory < threshold(t, "batch_memory_used_ratio")


DRAM_BOUND = f"(\n{textwrap.indent(DRAM, '  ')}\n) >= ${{dram_bound_ratio}}"
MEMORY_LEFT = f"{MEMORY} < ${{batch_memory_used_ratio}}"


def _indented(text: str) -> str:
    """``text`` with every line after the first indented by two spaces (it follows an indented operator line)."""
    return text.replace("\n", "\n  ")


class MemoryBound(GpuCause):
    """MB: SM activity low while DRAM is at or above its line: the kernels wait on memory bandwidth."""

    def holds(self, a: Activity, t: Thresholds) -> bool:
        return _low(a, t) and _dram_bound(a, t)

    def promql(self) -> tuple[str, str]:
        return SM, f"and on ({C}, uuid)\n  {_indented(DRAM_BOUND)}"

    def reason(self, a: Activity) -> str:
        return (f"its SMs are {pct(a.sm or 0.0)} active ({SOURCES.get(a.source or '', a.source)}) while NVML "
                f"reads it {pct(a.busy)} busy and DRAM is {pct(a.dram or 0.0)} active: {self.doing}.")


class SmBatch(GpuCause):
    """M3, the SM form: SM activity low with memory left (and not memory-bound): too little work per kernel."""

    def holds(self, a: Activity, t: Thresholds) -> bool:
        return _low(a, t) and _memory_left(a, t) and not _dram_bound(a, t)

    def promql(self) -> tuple[str, str]:
        return SM, f"and on ({C}, uuid)\n  {MEMORY_LEFT}\nunless on ({C}, uuid)\n  {_indented(DRAM_BOUND)}"

    def reason(self, a: Activity) -> str:
        return f"{super().reason(a)} Only {pct(a.memory or 0.0)} of its memory is used."


class TensorIdle(GpuCause):
    """TC: the SMs are busy enough but the tensor pipe idles: fp32 math on a GPU built for bf16 / TF32."""

    def value(self, a: Activity) -> float | None:
        return a.tensor

    def holds(self, a: Activity, t: Thresholds) -> bool:
        return (a.sm is not None and not _low(a, t) and a.tensor is not None
                and a.tensor < threshold(t, "tensor_idle_ratio"))

    def promql(self) -> tuple[str, str]:
        return f"(\n{textwrap.indent(TENSOR, '  ')}\n)", f"and on ({C}, uuid)\n  {SM} >= ${{sm_active_low}}"

    def reason(self, a: Activity) -> str:
        """With dcgm-exporter's fp pipe fields, the busiest pipe (:data:`FP_PIPES`) is the evidence of the precision
        the math runs in, and says what it does.

        >>> TENSOR_IDLE.reason(Activity(0.97, 0.78, 0.0, 0.3, 0.6, "dcgm", 0.31))
        'its SMs are 78% active (DCGM) but its tensor pipe only 0% and its FP32 pipe 31% (DCGM): its math runs on \
the fp32 pipes and the tensor cores idle.'
        >>> TENSOR_IDLE.reason(Activity(0.97, 0.78, 0.0, 0.3, 0.6, "dcgm", 0.02, 0.0, 0.4))
        "its SMs are 78% active (DCGM) but its tensor pipe only 0% and its FP64 pipe 40% (DCGM): its math runs in \
float64 and the tensor cores idle: check the tensors' dtype first (numpy arrays default to float64 and \
torch.from_numpy keeps it)."
        """
        pipes = a.pipes()
        pipe = max(pipes, key=pipes.__getitem__) if pipes else None  # the first of the busiest
        evidence = f" and its {pipe.name} pipe {pct(pipes[pipe])} (DCGM)" if pipe else ""
        return (f"its SMs are {pct(a.sm or 0.0)} active ({SOURCES.get(a.source or '', a.source)}) but its tensor "
                f"pipe only {pct(a.tensor or 0.0)}{evidence}: {pipe.doing if pipe and pipe.doing else self.doing}.")


class Ineffective(GpuCause):
    """No cause found, yet SM activity is low: busy but ineffective (the ladder's fallback row)."""

    def holds(self, a: Activity, t: Thresholds) -> bool:
        return _low(a, t) and not _dram_bound(a, t) and not _memory_left(a, t)

    def promql(self) -> tuple[str, str]:
        return SM, f"unless on ({C}, uuid)\n  {_indented(DRAM_BOUND)}\nunless on ({C}, uuid)\n  {MEMORY_LEFT}"


BATCH_REMEDY_TEXT = ("raise the batch size within memory, larger model shards per GPU, fewer tiny kernels "
                     "(torch.compile, CUDA graphs)")
EFFICIENCY: tuple[GpuCause, ...] = (
    MemoryBound("memory_bound", "MB", "memory-bound kernels", "GpuMemoryBoundKernels",
                ("sm_active_low", "dram_bound_ratio"),
                doing="its kernels wait on memory bandwidth (memory-bound)",
                remedy="fuse elementwise ops (torch.compile), fewer materialized intermediates, larger arithmetic "
                       "intensity",
                advice="MB: the GPU is busy but its kernels stream memory instead of computing. Fuse elementwise "
                       "and normalization ops (torch.compile(model), fused optimizers such as "
                       "torch.optim.AdamW(fused=True), flash attention via "
                       "torch.nn.functional.scaled_dot_product_attention), avoid materializing intermediates (in-place "
                       "ops, activation checkpointing trades memory traffic for compute), and raise the arithmetic "
                       "intensity (larger batch or hidden sizes, bf16 halves the bytes moved)."),
    SmBatch("sm_batch_too_small", "M3", "batch too small for the SMs", "GpuSmBatchTooSmall",
            ("sm_active_low", "batch_memory_used_ratio", "dram_bound_ratio"),
            doing="each kernel is too small to fill the SMs (small batches or kernels, launch-bound)",
            remedy=BATCH_REMEDY_TEXT,
            advice="M3: the GPU runs kernels all the time but each one fills few SMs, and memory is left. Raise the "
                   "batch size within memory (gpu-exporter diagnose suggests one when the run reports its batch "
                   "size), give each GPU a larger model shard, and launch fewer tiny kernels: torch.compile(model, "
                   "mode=\"reduce-overhead\") or CUDA graphs (torch.cuda.graphs) fuse them and cut launch overhead."),
    TensorIdle("tensor_cores_idle", "TC", "tensor cores idle", "GpuTensorCoresIdle",
               ("tensor_idle_ratio", "sm_active_low"),
               doing="its math runs on the fp32 pipes and the tensor cores idle",
               remedy="bf16 autocast (torch.autocast(\"cuda\", dtype=torch.bfloat16)) or TF32 "
                      "(torch.backends.cuda.matmul.allow_tf32 = True)",
               advice="TC: the SMs compute, but in fp32, so the tensor cores (most of the GPU's math throughput) "
                      "idle. Train in bf16 (wrap the forward pass in torch.autocast(\"cuda\", "
                      "dtype=torch.bfloat16)), or allow TF32 for fp32 matmuls and convolutions: "
                      "torch.backends.cuda.matmul.allow_tf32 = True (torch.set_float32_matmul_precision(\"high\")) "
                      "and torch.backends.cudnn.allow_tf32 = True."),
    Ineffective("ineffective", "", "busy but ineffective", "GpuSmActivityLow",
                ("sm_active_low", "dram_bound_ratio", "batch_memory_used_ratio"),
                doing="most of its SMs idle while kernels run, and no single cause explains it",
                remedy="profile the step (torch.profiler, Nsight Systems) for small or serialized kernels, "
                       "host syncs and CPU-bound launches",
                advice="The GPU is busy by NVML's count but most SMs idle, with memory used and DRAM not saturated: "
                       "look for small or serialized kernels (one stream, no overlap), host synchronizations "
                       "(.item(), .cpu()) between kernels and CPU-bound launch loops with torch.profiler or Nsight "
                       "Systems; torch.compile and CUDA graphs cut launch overhead, and a larger batch (within "
                       "memory) fills more SMs."),
)
"""Every GPU-level cause, in precedence order (the first that holds names the verdict). The conditions exclude each
other: memory-bound first, batch too small unless memory-bound, tensor cores idle only with SM activity at or above
the line, the fallback only when no other holds."""

EFFICIENCY_BY_ID: dict[str, GpuCause] = {c.cause: c for c in EFFICIENCY}
TENSOR_IDLE = EFFICIENCY_BY_ID["tensor_cores_idle"]


def find_efficiency(a: Activity, t: Thresholds, recorded: str = "") -> GpuFinding | None:
    """The first cause of :data:`EFFICIENCY` that holds for a GPU at or above the target with work, or None.

    Mirrors the generated PromQL (tests/test_causes_conformance.py checks it); None without an SM source. A cause the
    recording rules found (``recorded``: diagnose --prometheus-url) comes first, so diagnose names what the alerts
    name: the rules read the tensor and DRAM activity over their own windows, diagnose over 5m.

    >>> from gpu_exporter.thresholds import load_thresholds
    >>> dram_low = Activity(0.96, 0.3, 0.2, 0.3, 0.6, "gpm")
    >>> find_efficiency(dram_low, load_thresholds()).cause.cause
    'ineffective'
    >>> find_efficiency(dram_low, load_thresholds(), recorded="memory_bound").cause.cause
    'memory_bound'
    """
    if a.sm is None:
        return None
    cause = EFFICIENCY_BY_ID.get(recorded) or next((c for c in EFFICIENCY if c.holds(a, t)), None)
    if cause is None:
        return None
    value = cause.value(a)
    return GpuFinding(cause, a.sm if value is None else value, a.sm, a.busy)


def compute_sm(sm: float, shares: Mapping[str, float]) -> float | None:
    """The compute phase's SM activity: SM activity / compute share (at most 1); None without a compute phase.

    >>> compute_sm(0.2, {"compute": 0.5, "data": 0.5}), compute_sm(0.2, {"data": 1.0})
    (0.4, None)
    """
    share = shares.get(COMPUTE, 0.0)
    return min(1.0, sm / share) if share > 0 else None


def effective_line(busy: float | None, sm: float | None, source: str | None, tensor: float | None = None,
                   dram: float | None = None, shares: Mapping[str, float] | None = None, *,
                   pipes: Mapping[FpPipe, float] | None = None) -> str:
    """The effective-use line of a verdict: SM activity beside busy utilization, or :data:`UNKNOWN`; the pipes
    known (the fp pipes, :meth:`Activity.pipes`, only where dcgm-exporter serves them).

    >>> effective_line(0.96, 0.25, "dcgm", 0.0, 0.1, {"compute": 0.9, "data": 0.1})
    'effective utilization (SM activity, DCGM) 25% while 96% busy; tensor pipe 0%, DRAM 10%; compute phase (90% of \
the step) 28% SM activity'
    >>> effective_line(0.96, 0.8, "dcgm", 0.0, 0.3, pipes=Activity(0.96, 0.8, fp32=0.4, fp64=0.05).pipes())
    'effective utilization (SM activity, DCGM) 80% while 96% busy; tensor pipe 0%, FP32 pipe 40%, FP64 pipe 5%, DRAM \
30%'

    Effective utilization is never more than the busy one: SM activity read a little above it (GPM's or DCGM's
    samples and NVML's busy time cover slightly different moments) is said as the busy utilization.

    >>> effective_line(0.84, 0.85, "gpm")
    'effective utilization (SM activity, GPM) 84% while 84% busy'
    """
    if sm is None:
        return UNKNOWN
    busy_text = "" if busy is None else f" while {pct(busy)} busy"
    parts = [f"effective utilization (SM activity, {SOURCES.get(source or '', source or '?')}) "
             f"{pct(sm if busy is None else min(sm, busy))}{busy_text}"]
    known = [("tensor pipe", tensor), *((f"{p.name} pipe", v) for p, v in (pipes or {}).items()), ("DRAM", dram)]
    said = [f"{name} {pct(v)}" for name, v in known if v is not None]
    if said:
        parts.append(", ".join(said))
    in_compute = compute_sm(sm, shares or {})
    if in_compute is not None and shares is not None:
        parts.append(f"compute phase ({pct(shares[COMPUTE])} of the step) {pct(in_compute)} SM activity")
    return "; ".join(parts)
