"""Why a GPU is below its utilization target: the cause table, and the pure judge that applies it.

Its one job is the rows (:data:`CAUSES`) and their judge (:func:`find_causes`, :func:`cause_order`). The table is
the single definition of every cause: ``monitoring/causes.py`` turns it into the Prometheus recording rules
``run:gpu_training_cause:share`` and ``run:gpu_training_cause:projected_utilization`` and the alerts that read only
those series; :func:`find_causes` applies it in Python for ``gpu-exporter diagnose --url`` and the status page. A
conformance test feeds the same cases to promtool and to :func:`find_causes` and requires the same verdicts, so the
two cannot drift apart. What differs between rows is their kind (gpu_exporter.verdict.kinds); what a run reports
is its signals (gpu_exporter.verdict.signals).

Two levels, judged at the GPU's *useful* utilization (:func:`~gpu_exporter.verdict.levels.useful_utilization`):
``low`` (warning alerts) and ``target`` (one info alert); at or above the target no cause is named. A projection is
an upper bound (gpu_exporter.verdict.kinds): 8% busy with 90% of the step loading data projects to 0.08 / (1 - 0.9).

>>> from gpu_exporter.thresholds import load_thresholds
>>> t = load_thresholds()
>>> [f.summary(0.08) for f in find_causes(0.08, 0.2, RunSignals({"data": 0.9, "compute": 0.1}), t)]
['input-bound (M1): 8% now, at most ~80% if loading overlapped compute']
>>> waiting = {"compute": 0.35, "communication": 0.65}  # rank 0 of 2 on a real GPU: NCCL spins, 95% busy
>>> (st,) = find_causes(0.95, 0.2, RunSignals(waiting, communication={"0": 0.65, "1": 0.05}), t)
>>> st.level, st.projection(0.95, waiting)
('target', '35% useful (95% busy, 65% of the step in collectives) now, at most ~87% if rank 1 kept up')
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_exporter import catalog
from gpu_exporter.training.protocol import CALLBACK_PHASE, CHECKPOINT, COMMUNICATION, COMPUTE, DATA, METRICS
from gpu_exporter.verdict.code import FrameworkOverhead, HostWork
from gpu_exporter.verdict.kinds import Allocator, CallbackPhase, Cause, Communication, Finding, Launch, Phase, Straggler
from gpu_exporter.verdict.levels import level, useful_utilization
from gpu_exporter.verdict.remedies import BATCH_REMEDY, WORKERS_REMEDY
from gpu_exporter.verdict.signals import RunSignals

if TYPE_CHECKING:
    from gpu_exporter.thresholds import Thresholds

__all__ = ["BATCH_CAUSE", "BY_ID", "CAUSES", "CONTEXT_CAUSES", "cause_order", "find_causes"]

CAUSES: tuple[Cause, ...] = (
    Phase("input_bound", "M1", "input-bound", "GpuTrainingInputBound", DATA, ("input_bound_share",),
          doing="waiting for the next batch", hidden="if loading overlapped compute", suggests=WORKERS_REMEDY,
          remedy="more DataLoader workers, pinned memory, prefetch, cache the data set",
          advice="M1: feed the GPU faster: DataLoader(num_workers=N, pin_memory=True, prefetch_factor=4, "
                 "persistent_workers=True), preload or cache the data set, move augmentation to the GPU."),
    Phase("metrics_bound", "M2", "metrics-bound", "GpuTrainingMetricsBound", METRICS,
          ("metrics_bound_share",),
          doing="on CPU work in the step that is not GPU work (metrics, logging, .item()/.cpu(), host-side "
                "preprocessing)",
          hidden="if metrics ran off the training path",
          remedy="move CPU work out of the step (metrics every N steps or on the GPU, async logging, no per-step "
                 ".item())",
          advice="M2: the step does CPU work that is not GPU work (Python metrics, logging, a .item()/.cpu() per "
                 "step, host-side preprocessing inside training_step): compute metrics every N steps or at epoch "
                 "end and keep them on the GPU (torchmetrics), drop the ones nobody reads, avoid .item()/.cpu() per "
                 "step, log asynchronously, and move preprocessing into the DataLoader's workers or onto the GPU."),
    CallbackPhase("checkpoint", "CK", "checkpoint-bound", "GpuTrainingCheckpointBound", CHECKPOINT,
          ("checkpoint_share",),
          doing="saving checkpoints", hidden="if checkpoints were written asynchronously",
          remedy="save checkpoints asynchronously or less often",
          advice="CK: save checkpoints less often (every N minutes, not every N steps), write them from a "
                 "background thread or process (torch.distributed.checkpoint.async_save), copy the state "
                 "to CPU memory first and write it off the training path, save to fast local disk."),
    CallbackPhase("callback_bound", "CB", "callback-bound", "GpuTrainingCallbackBound", CALLBACK_PHASE,
          ("metrics_bound_share",),
          doing="in callback hooks of its own (work on the training thread between steps that is not GPU work)",
          hidden="if the callbacks' work ran off the training thread",
          remedy="move the callback's work off the training thread (a background thread or process), or do it "
                 "every N steps",
          advice="CB: a callback of the job's own (the verdict names it: Class.hook) runs on the training thread "
                 "every step while the GPU waits: move its work to a background thread or process (a queue the "
                 "hook only puts into), do it every N steps or at epoch end (trainer.global_step % N), and drop "
                 "what nobody reads. Logging and metrics the framework calls (log, log_dict, compute_metrics) "
                 "stay metrics (M2)."),
    Launch("batch_too_small", "M3", "batch too small", "GpuBatchTooSmall", COMPUTE,
          ("batch_compute_share", "batch_busy_ratio", "batch_memory_used_ratio"),
          doing="in compute with the GPU idle", hidden="if the GPU were busy through the whole compute phase",
          suggests=BATCH_REMEDY,
          remedy="raise the batch size while memory allows; fewer, larger kernels (launch overhead; Python work "
                 "in the step is M2)",
          advice="M3: raise the batch size while memory allows (scale the learning rate with it) or "
                 "accumulate gradients; fewer, larger kernels with torch.compile, CUDA graphs or mixed "
                 "precision. M3 is launch overhead, the CPU inside torch operators issuing many small kernels while "
                 "the GPU idles; Python or CPU work in the step that is not GPU work is M2 instead, told apart by the "
                 "phase shares (that time counts as metrics, not compute) or sampled stacks (frames in your own "
                 "code, not in torch operators)."),
    FrameworkOverhead("framework_overhead", "FO", "framework overhead", "GpuTrainingFrameworkOverhead", COMPUTE,
          ("metrics_bound_share",),
          doing="in the framework's own code (the training loop, hooks and optimizer closure of Lightning, the "
                "Trainer or accelerate) while the GPU waits",
          hidden="without the framework's per-step overhead",
          remedy="a larger batch where memory allows (fewer steps for the same data), torch.compile or CUDA graphs, "
                 "fewer per-step hooks and logging",
          advice="FO: the framework's own Python between the operators (its loop, hooks, the optimizer closure, "
                 "per-step logging) keeps the GPU idle each step; the cost is per step, so raise the batch size "
                 "where memory allows (or accumulate gradients) to pay it less often, capture the step with "
                 "torch.compile (mode=\"reduce-overhead\": CUDA graphs), and drop per-step hooks, progress bars "
                 "and self.log(..., on_step=True) nobody reads (log every N steps)."),
    HostWork("host_work", "HW", "host work in the step", "GpuTrainingHostWork", COMPUTE,
          ("metrics_bound_share",),
          doing="in its own code inside the compute phase while the GPU waits (host work in the step: a numpy loss, "
                "a Python augmentation)",
          hidden="if that work ran in the DataLoader's workers or on the GPU",
          remedy="move the host work into the DataLoader (the Dataset or collate_fn, in workers) or onto the GPU "
                 "(torch operations on the batch on the device)",
          advice="HW: the job's own code runs on the CPU inside the step while the GPU waits (the verdict names the "
                 "function): move per-sample work (augmentation, tokenization, numpy preprocessing) into the "
                 "Dataset's __getitem__ or a collate_fn so DataLoader(num_workers=N) runs it ahead of the step, and "
                 "write per-batch work (a loss or transform in numpy) as torch operations on the GPU tensors "
                 "(no .cpu()/.numpy() round trip)."),
    Allocator("allocator", "M4", "allocator trouble", "GpuMemoryAllocatorThrashing", "",
          ("allocator_window", "allocator_retries_threshold"),
          doing="", hidden="",
          remedy="expandable_segments, stable tensor shapes, no empty_cache() in the loop",
          advice="M4: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, stable tensor shapes, no "
                 "torch.cuda.empty_cache() in the loop; lower the batch size a little if memory is really "
                 "too small."),
    Straggler("straggler", "ST", "waiting for a straggler", "GpuTrainingStraggler", COMMUNICATION,
          ("straggler_wait_share",),
          doing="waiting in collectives for a slower rank", hidden="if the straggler kept up",
          remedy="remove the straggler's own cause (its verdict names it); balance data and work across ranks",
          advice="ST: this rank is fine; it waits for the straggler named above. Fix the straggler's own cause "
                 "(input pipeline M1, metrics M2, checkpoints CK on one rank only, ...), give every rank the same "
                 "share of the data and work (same batch size, sequence lengths, no rank-0-only work in the "
                 f"step), and check the straggler's GPU for throttling ({catalog.GPU_CLOCK_EVENT_ACTIVE.name})."),
    Communication("communication_bound", "CM", "communication-bound", "GpuTrainingCommunicationBound",
                  COMMUNICATION, ("communication_bound_share",),
          doing="in collectives that every rank of the run pays", hidden="if communication overlapped compute",
          remedy="fewer all-reduces (gradient accumulation), larger DDP buckets overlapping backward, gradient "
                 "compression, a faster interconnect",
          advice="CM: every rank of the run waits this long in collectives (the part no straggler explains): the "
                 "gradient exchange itself takes the time. Accumulate gradients over N micro-batches (DDP "
                 "no_sync(): one all-reduce per N samples' worth), raise DDP(bucket_cap_mb=...) so fewer, larger "
                 "all-reduces overlap the backward pass, compress gradients (register_comm_hook with PowerSGD or "
                 "fp16_compress_hook), and use a faster interconnect (NVLink, InfiniBand; NCCL_DEBUG=INFO shows "
                 "which one NCCL picked, NCCL_IB_HCA / NCCL_SOCKET_IFNAME choose it)."),
)
"""Every cause, in the order the generated rules and alerts list them. Findings are ranked by :func:`cause_order`
(the allocator first: it also explains the others; then the biggest); equal ones keep this order."""

BY_ID: dict[str, Cause] = {c.cause: c for c in CAUSES}

CONTEXT_CAUSES: tuple[str, ...] = tuple(c.cause for c in CAUSES if c.suggests is not None)
"""The causes a run's context gives numbers for (``Cause.suggests``): a run found with none of them needs no context
(diagnose reads the context gauges of the others only)."""
BATCH_CAUSE = next(c.cause for c in CAUSES if c.suggests is BATCH_REMEDY)
"""The cause whose remedy is the batch suggestion (M3); diagnose reads the context of a busy run with low SM activity
as for it (the SM form of M3, gpu_exporter.verdict.efficiency)."""


def cause_order(finding: Finding) -> tuple[bool, float]:
    """The one tie-break of findings (sort key): the allocator first (it also explains the others), then biggest.

    >>> from gpu_exporter.thresholds import load_thresholds
    >>> fs = find_causes(0.1, 0.3, RunSignals({"data": 0.6, "metrics": 0.2}, allocator_ooms=1), load_thresholds())
    >>> [f.cause.code for f in sorted(fs, key=cause_order)]
    ['M4', 'M1']
    """
    return not finding.cause.first, -finding.value


def find_causes(utilization: float, memory_used_ratio: float | None, run: RunSignals, t: Thresholds,
                window_seconds: float = 0.0) -> list[Finding]:
    """Every cause of :data:`CAUSES` that applies to ``run`` on a GPU at ``utilization``, biggest first.

    ``utilization`` is the GPU's; the level and the projections start from the run's useful utilization.
    ``window_seconds`` is the judged window, which a counted cause (M4) scales its limit to (0: the rules' own).

    >>> from gpu_exporter.thresholds import load_thresholds
    >>> t = load_thresholds()
    >>> [f.cause.code for f in find_causes(0.4, 0.3, RunSignals({"data": 0.38, "metrics": 0.34}), t)]
    ['M1', 'M2']
    >>> find_causes(0.9, 0.3, RunSignals({"data": 0.5}), t)
    []
    """
    utilization = useful_utilization(utilization, run.shares)
    lvl = level(utilization, t)
    if lvl is None:
        return []
    found = (cause.find(utilization, memory_used_ratio, run, t, lvl, window_seconds) for cause in CAUSES)
    return sorted((f for f in found if f is not None), key=cause_order)
