"""Why a GPU is below its utilization target: one table of causes, and the pure judge that applies it.

The same table (:data:`CAUSES`) is the single definition of every cause. ``monitoring/causes.py``
turns it into the Prometheus recording rules ``run:gpu_training_cause:share`` and
``run:gpu_training_cause:projected_utilization`` and the alerts that read only those series;
:func:`find_causes` applies it in Python for ``gpu-exporter diagnose --url`` and the status page.
A conformance test feeds the same cases to promtool and to :func:`find_causes` and requires the
same verdicts, so the two cannot drift apart.

The signals, per training run (and rank) on a GPU, over one window:

* ``u``: the GPU's interval-mean utilization (busy seconds / wall seconds);
* the run's phase shares (``data``, ``compute``, ``metrics``, ``checkpoint``, ... adding up to 1);
* the share of GPU memory used; caching-allocator retries and OOMs in the window;
* for a distributed run, the ``communication`` share of each of its live ranks: a rank whose
  share exceeds the run's lowest by more than ``straggler_wait_share`` waits for that rank, the
  straggler (ST). Its value is that excess (the wait), so the projections below hold for it too,
  and the run's step time if the straggler kept up is this rank's step time times ``1 - wait``.
  The part every rank pays, the run's lowest live communication share (a single rank's own share),
  is communication-bound (CM) above ``communication_bound_share``: a balanced run whose ranks all sit
  in the all-reduce has no straggler, yet the collectives hold every GPU down. A waiting rank's
  share splits in two: the common part (CM) and its excess over it (ST), never counted twice.

Two levels, judged at the GPU's *useful* utilization ``u' = min(u, 1 - communication share)`` of the
run (:func:`~gpu_exporter.verdict.levels.useful_utilization`: an NCCL kernel spins on the GPU while
its rank waits in a collective, so ``u`` alone calls a waiting rank busy): ``low`` (``u'`` below
``utilization_low_threshold``: warning alerts) and ``target`` (``u'`` at or above that but below
``utilization_target``: one info alert). At or above the target no cause is named. The projection
is an upper bound: hiding a phase of share ``s`` (overlapping it with compute) shortens the step to
``1 - s`` of its time with the same GPU work, so utilization can reach at most ``u' / (1 - s)``; a
launch-bound GPU (M3) can reach at most the compute share. (M3 needs ``u < compute / 2``, where
``u' = u``: its condition reads the same with either.)

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

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, TypeAlias

from gpu_exporter import catalog
from gpu_exporter.training.protocol import CALLBACK_PHASE
from gpu_exporter.verdict.callbacks import CB_WORDS, NamedCallback
from gpu_exporter.verdict.levels import LOW, TARGET, level, threshold, useful_text, useful_utilization
from gpu_exporter.verdict.promql import CAUSE_SHARE, LIVE, C, projected_query, run_query, share

if TYPE_CHECKING:
    from gpu_exporter.thresholds import Thresholds

__all__ = ["BY_ID", "CAUSES", "EVIDENCE_ALERT", "HINTS", "HINTS_BY_ID", "LOW",
           "MAIN_BUSY", "STORAGE_WAIT", "TARGET", "WORKERS_BUSY", "Allocator", "Cause",
           "Communication", "Finding", "Hint", "Launch", "Phase", "ProcessSignals", "RunSignals", "Straggler",
           "allocator_limit", "cause_order", "common_communication", "cores", "find_causes", "find_hints", "hint_text",
           "level", "pct", "seconds", "straggler_of"]

HIDDEN, COMPUTED = "hidden", "computed"
"""How ``run:gpu_training_cause:projected_utilization`` projects a kind: ``u / (1 - share)``, or ``u + share``."""
UTIL, STEP = f"max by ({C}, uuid) ({catalog.GPU_UTILIZATION_AVG5M.name})", catalog.RUN_TRAINING_STEP_SECONDS_AVG5M.name
LABEL = "straggler_rank"
"""The label of a waiting rank's ST series that names the rank it waits for."""
Found: TypeAlias = "Finding | None"


@dataclass(frozen=True)
class Cause:
    """One row of the cause table; its class is its kind, which holds everything that differs between kinds.

    ``keys`` are the thresholds.yml keys its condition reads. A kind gives the same thing twice, for the
    judge in Python and for the generated rules (monitoring/causes.py) in PromQL and alert text: its
    condition (:meth:`find`: the finding of a run at useful ``utilization``, or None; :meth:`promql`: the
    query before the level filter, its value the share, M4: events, that explains it; the filter also keeps only
    live runs, as a run's level is recorded only while it reports a current phase), the reason of a
    finding (:meth:`reason`, :meth:`alert_reason`), its projection (:meth:`projection`, :meth:`alert_projection`),
    how a straggler with it reads (:meth:`own`, :meth:`alert_own`), the value of its
    series (:meth:`value_text`, the rule's comment) and further recording rules (:meth:`records`: name,
    expression, comment). A new kind is one new subclass.
    """

    cause: str
    code: str
    title: str
    alert: str
    phase: str
    keys: tuple[str, ...]
    doing: str
    hidden: str
    remedy: str
    advice: str

    first: ClassVar[bool] = False
    """Ranked before the others by :func:`cause_order` (it also explains them)."""
    run_wide: ClassVar[bool] = False
    """Judged across the ranks of a run: never a rank's own cause (what a straggler is named for)."""
    waits: ClassVar[bool] = False
    """Its findings wait for another rank (``Finding.straggler``, the step time projected without the wait)."""
    projected_by: ClassVar[str] = HIDDEN
    """How the projected-utilization rule projects it (:data:`HIDDEN`, :data:`COMPUTED`; "": not at all)."""
    measures, owns, alert_amount = "share of the step", "{} of its time in {phase}", "{{ $v | humanizePercentage }}"
    """What a value is in the Grafana alert's words; a straggler with it after its label (``{}`` the value);
    a value ``$v`` as Go template text."""

    @property
    def label(self) -> str:
        """``"input-bound (M1)"``."""
        return f"{self.title} ({self.code})"

    @property
    def anchor(self) -> str:
        """The runbook section of the cause's alert (GitHub's anchor for its heading)."""
        return self.alert.lower()

    def find(self, u: float, memory: float | None, run: RunSignals, t: Thresholds, lvl: str, limit: float) -> Found:
        """The finding of ``run`` at useful utilization ``u`` and level ``lvl`` (M4: ``limit`` retries), or None."""
        share = run.shares.get(self.phase, 0.0)
        return Finding(self, lvl, share, _hidden(u, share)) if share > threshold(t, self.keys[0]) else None

    def promql(self) -> str:
        return f"{share(self.phase)} > ${{{self.keys[0]}}}"

    def value_text(self) -> str:
        return "the share of the step it takes"

    def projection(self, f: Finding, now: str) -> str:
        """``"8% now, at most ~90% if loading overlapped compute"`` (``f.projected`` is set)."""
        return f"{now} now, at most ~{pct(f.projected or 0.0)} {self.hidden}"

    def alert_projection(self) -> str:
        return (f"{{{{ with {projected_query(self.cause)} | query }}}} If that were removed the GPU could reach at "
                f"most {{{{ . | first | value | humanizePercentage }}}} ({self.hidden}).{{{{ end }}}}")

    def reason(self, f: Finding, run: str, rank: str) -> str:
        """One sentence on what the run does, for diagnose."""
        return f"run {run} rank {rank} spends {pct(f.value)} of its time {self.doing}."

    def alert_reason(self) -> str:
        return f"spends {{{{ $value | humanizePercentage }}}} of its time {self.doing}."

    def amount(self, value: float) -> str:
        """A finding's value in words: ``"38%"`` (M4: ``"3"`` events)."""
        return pct(value)

    def own(self, value: float) -> str:
        return self.owns.format(self.amount(value), phase=self.phase)

    def alert_own(self) -> str:
        return self.owns.format(self.alert_amount, phase=self.phase)

    def records(self) -> tuple[tuple[str, str, str], ...]:
        return ()

    def run_share(self, share: float, communication: Mapping[str, float], utilization: float | None) -> float | None:
        """The share of a finished run's wall time the cause takes (the report's projection, docs/cli.md):
        ``share`` its phase's share over the ranks it applied to, ``communication`` each rank's
        communication share over the whole run, ``utilization`` the run's mean; None: not projected."""
        return min(share, 1.0)


class Phase(Cause):
    """A phase of the step above its share (M1, M2, CK): the base class's behaviour."""


class CallbackPhase(NamedCallback, Phase):
    """A phase cause (CK, CB) whose verdict names the job's own callback hook that fills it (verdict/callbacks.py)."""


class Launch(Cause):
    """M3: the GPU idle inside the compute phase while memory is left: its value is compute share - ``u``."""

    projected_by = COMPUTED
    owns = "its GPU idle for {} of the step inside compute"

    def find(self, u: float, memory: float | None, run: RunSignals, t: Thresholds, lvl: str, limit: float) -> Found:
        compute = run.shares.get(self.phase, 0.0)
        compute_key, busy_key, memory_key = self.keys
        if (compute > threshold(t, compute_key) and u / compute < threshold(t, busy_key)
                and memory is not None and memory < threshold(t, memory_key)):
            return Finding(self, lvl, compute - u, min(1.0, compute), run.batch_size)
        return None

    def promql(self) -> str:
        compute_key, busy_key, memory_key = self.keys
        compute = f"({share(self.phase)} > ${{{compute_key}}})"
        return (f"(\n    {compute}\n  - on ({C}, uuid) group_left ()\n    {UTIL}\n)\n"
                f"and\n(\n    {UTIL}\n  / on ({C}, uuid) group_right ()\n    {compute}\n"
                f"  < ${{{busy_key}}}\n)\n"
                f"and on ({C}, uuid)\n(max by ({C}, uuid) ({catalog.GPU_MEMORY_USED_RATIO.name})"
                f" < ${{{memory_key}}})")

    def run_share(self, share: float, communication: Mapping[str, float], utilization: float | None) -> float | None:
        return max(0.0, share - utilization) if utilization is not None else None

    def reason(self, f: Finding, run: str, rank: str) -> str:
        batch = f" with batch size {f.batch_size:.0f}" if f.batch_size is not None else ""
        return (f"run {run} rank {rank} computes{batch}, but the GPU is idle for {pct(f.value)} of the "
                "step inside the compute phase (small kernels, launch overhead).")

    def alert_reason(self) -> str:
        _, busy_key, memory_key = self.keys
        return ("keeps its GPU idle for {{ $value | humanizePercentage }} of the step inside the compute phase: "
                f"the GPU is busy for less than ${{{busy_key}|percent}} of the time the job computes while less "
                f"than ${{{memory_key}|percent}} of its memory is used (small batches or kernels, launch "
                "overhead).")


class Allocator(Cause):
    """M4: allocator retries above the window's limit, or an OOM: counted, not timed (no projection)."""

    first = True
    projected_by, measures, owns = "", "allocator events", "{} allocator retries and OOMs"
    alert_amount = "{{ $v | humanize }}"

    def find(self, u: float, memory: float | None, run: RunSignals, t: Thresholds, lvl: str, limit: float) -> Found:
        if run.allocator_ooms > 0 or run.allocator_retries > limit:
            return Finding(self, lvl, run.allocator_retries + run.allocator_ooms, None)
        return None

    def run_share(self, share: float, communication: Mapping[str, float], utilization: float | None) -> float | None:
        return None

    def promql(self) -> str:
        window_key, retries_key = self.keys
        retries = f"increase({catalog.GPU_TRAINING_ALLOCATOR_RETRIES_TOTAL.name}[${{{window_key}}}])"
        ooms = f"increase({catalog.GPU_TRAINING_ALLOCATOR_OOMS_TOTAL.name}[${{{window_key}}}])"
        return f"{retries} + {ooms}\nand\n({retries} > ${{{retries_key}}} or {ooms} > 0)"

    def value_text(self) -> str:
        return f"allocator retries + OOMs in ${{{self.keys[0]}}}"

    def amount(self, value: float) -> str:
        return f"{value:.0f}"

    def alert_projection(self) -> str:
        return ""

    def reason(self, f: Finding, run: str, rank: str) -> str:
        return f"run {run} rank {rank}: the CUDA caching allocator had {self.amount(f.value)} retries/OOMs."

    def alert_reason(self) -> str:
        window_key, retries_key = self.keys
        return ("had {{ $value | humanize }} caching-allocator retries and out-of-memory errors in the last "
                f"${{{window_key}}} (the limit is ${{{retries_key}}} retries and no OOM); each "
                "retry frees the cache and stalls the GPU.")


class Straggler(Cause):
    """ST: a rank waits in collectives for the run's least-communicating rank (``bottomk by (cluster, run)``, its
    rank as label :data:`LABEL`); the alert names that straggler's own cause from its series."""

    run_wide, waits = True, True

    def find(self, u: float, memory: float | None, run: RunSignals, t: Thresholds, lvl: str, limit: float) -> Found:
        straggler = straggler_of(run.communication or {})
        wait = run.shares.get(self.phase, 0.0) - straggler[1] if straggler else 0.0
        if straggler is not None and wait > threshold(t, self.keys[0]):
            return Finding(self, lvl, wait, _hidden(u, wait), straggler=straggler[0], step_seconds=run.step_seconds)
        return None

    def promql(self) -> str:
        comm = share(self.phase)
        lowest = (f"label_replace(\n      bottomk by ({C}, run) (1, {comm} and {LIVE}),\n"
                  f'      "{LABEL}", "$1", "rank", "(.*)"\n    )')
        return (f"(\n    {comm}\n  - on ({C}, run) group_left ({LABEL})\n    {lowest}\n)\n"
                f"> ${{{self.keys[0]}}}")

    def projection(self, f: Finding, now: str) -> str:
        step = ""
        if f.step_seconds is not None:
            step = (f"; the run's step would take ~{seconds(f.projected_step_seconds or 0.0)} instead of "
                    f"{seconds(f.step_seconds)}")
        return f"{now} now, at most ~{pct(f.projected or 0.0)} if rank {f.straggler} kept up{step}"

    def alert_projection(self) -> str:
        """The step shrinks by the wait, the alert's value: no lookup of the step time itself (every lookup of
        every waiting rank's alert costs its group ~0.1-0.4 ms an evaluation, docs/fleet.md)."""
        util = projected_query(self.cause)
        projected = run_query(catalog.RUN_TRAINING_STRAGGLER_PROJECTED_STEP_SECONDS.name)
        return (f"{{{{ with {util} | query }}}} If rank {{{{ $labels.{LABEL} }}}} kept up, the GPU could reach at "
                f"most {{{{ . | first | value | humanizePercentage }}}}{{{{ end }}}}{{{{ with {projected} | query }}}} "
                f"and the run's step would take ~{{{{ . | first | value | humanizeDuration }}}}, {{{{ $value | "
                "humanizePercentage }} less{{ end }}.")

    def reason(self, f: Finding, run: str, rank: str) -> str:
        why = f.straggler_cause or f"rank {f.straggler} is slower"
        return (f"run {run} rank {rank} is waiting for rank {f.straggler} (straggler): {why}. "
                f"{pct(f.value)} of rank {rank}'s time is that wait (its communication beyond rank "
                f"{f.straggler}'s).")

    def alert_reason(self) -> str:
        run_wide = "|".join(c.cause for c in CAUSES if c.run_wide)  # not the straggler's own cause
        query = (f'printf "topk(1, max without (level) ({CAUSE_SHARE}{{{C}=%q,run=%q,rank=%q,'
                 f'cause!~\\"{run_wide}\\"}}))" $labels.{C} $labels.run $labels.{LABEL}')
        chain = "".join(f'{{{{ {"if" if i == 0 else "else if"} eq $c "{other.cause}" }}}}{other.label}, '
                        f"{other.alert_own()}" for i, other in enumerate(c for c in CAUSES if not c.run_wide))
        return (f"is waiting for rank {{{{ $labels.{LABEL} }}}} (straggler): {{{{ with {query} | query }}}}"
                f'{{{{ $c := . | first | label "cause" }}}}{{{{ $v := . | first | value }}}}'
                f"rank {{{{ $labels.{LABEL} }}}} is {chain}{{{{ else }}}}{{{{ $c }}}}{{{{ end }}}}"
                f"{{{{ else }}}}rank {{{{ $labels.{LABEL} }}}} has no cause of its own above the thresholds (more "
                f"work, or a slower or throttled GPU){{{{ end }}}}. {{{{ $value | humanizePercentage }}}} of this "
                f"rank's time is that wait (its communication beyond rank {{{{ $labels.{LABEL} }}}}'s).")

    def run_share(self, share: float, communication: Mapping[str, float], utilization: float | None) -> float | None:
        """The waiting ranks' mean communication beyond the straggler's."""
        straggler = straggler_of(communication)
        waiting = [v for r, v in communication.items() if straggler is not None and r != straggler[0]]
        return max(0.0, sum(waiting) / len(waiting) - straggler[1]) if straggler is not None and waiting else None

    def records(self) -> tuple[tuple[str, str, str], ...]:
        return ((catalog.RUN_TRAINING_STRAGGLER_PROJECTED_STEP_SECONDS.name,
                 f"{STEP}\n* on ({C}, run, rank, uuid) group_right ()\n"
                 f"(1 - max by ({C}, run, rank, uuid, {LABEL}) ({CAUSE_SHARE}{{cause=\"{self.cause}\"}}))\n",
                 f"The run's step time if rank {LABEL} kept up: the waiting rank's step time without its wait."),)


class Communication(Cause):
    """CM: the run's lowest live communication share (``min by (cluster, run)``), what every rank pays."""

    run_wide = True

    def find(self, u: float, memory: float | None, run: RunSignals, t: Thresholds, lvl: str, limit: float) -> Found:
        if self.phase not in run.shares:
            return None
        common = common_communication(run.shares[self.phase], run.communication)
        return Finding(self, lvl, common, _hidden(u, common)) if common > threshold(t, self.keys[0]) else None

    def promql(self) -> str:
        comm = share(self.phase)
        return (f"(\n    0 * {comm}\n  + on ({C}, run) group_left ()\n    min by ({C}, run) ({comm} and {LIVE})\n)\n"
                f"> ${{{self.keys[0]}}}")

    def run_share(self, share: float, communication: Mapping[str, float], utilization: float | None) -> float | None:
        """The communication every rank pays: the run's lowest share."""
        return min(communication.values()) if communication else None

    def reason(self, f: Finding, run: str, rank: str) -> str:
        return (f"run {run} rank {rank} spends {pct(f.value)} of its time in collectives that every live rank "
                "of the run pays (the run's least-communicating rank spends as much, so no straggler explains "
                "it): the gradient exchange itself is slow.")

    def alert_reason(self) -> str:
        return ("spends {{ $value | humanizePercentage }} of its time in collectives (phase communication) that "
                "every live rank of the run pays (the run's least-communicating rank spends as much, so no straggler "
                "explains it): the gradient exchange itself is slow.")


CAUSES: tuple[Cause, ...] = (
    Phase("input_bound", "M1", "input-bound", "GpuTrainingInputBound", "data", ("input_bound_share",),
          doing="waiting for the next batch", hidden="if loading overlapped compute",
          remedy="more DataLoader workers, pinned memory, prefetch, cache the data set",
          advice="M1: feed the GPU faster: DataLoader(num_workers=N, pin_memory=True, prefetch_factor=4, "
                 "persistent_workers=True), preload or cache the data set, move augmentation to the GPU."),
    Phase("metrics_bound", "M2", "metrics-bound", "GpuTrainingMetricsBound", "metrics",
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
    CallbackPhase("checkpoint", "CK", "checkpoint-bound", "GpuTrainingCheckpointBound", "checkpoint",
          ("checkpoint_share",),
          doing="saving checkpoints", hidden="if checkpoints were written asynchronously",
          remedy="save checkpoints asynchronously or less often",
          advice="CK: save checkpoints less often (every N minutes, not every N steps), write them from a "
                 "background thread or process (torch.distributed.checkpoint.async_save), copy the state "
                 "to CPU memory first and write it off the training path, save to fast local disk."),
    CallbackPhase("callback_bound", "CB", "callback-bound", "GpuTrainingCallbackBound", CALLBACK_PHASE,
                  ("metrics_bound_share",), **CB_WORDS),
    Launch("batch_too_small", "M3", "batch too small", "GpuBatchTooSmall", "compute",
          ("batch_compute_share", "batch_busy_ratio", "batch_memory_used_ratio"),
          doing="in compute with the GPU idle", hidden="if the GPU were busy through the whole compute phase",
          remedy="raise the batch size while memory allows; fewer, larger kernels (launch overhead; Python work "
                 "in the step is M2)",
          advice="M3: raise the batch size while memory allows (scale the learning rate with it) or "
                 "accumulate gradients; fewer, larger kernels with torch.compile, CUDA graphs or mixed "
                 "precision. M3 is launch overhead, the CPU inside torch operators issuing many small kernels while "
                 "the GPU idles; Python or CPU work in the step that is not GPU work is M2 instead, told apart by the "
                 "phase shares (that time counts as metrics, not compute) or sampled stacks (frames in your own "
                 "code, not in torch operators)."),
    Allocator("allocator", "M4", "allocator trouble", "GpuMemoryAllocatorThrashing", "",
          ("allocator_window", "allocator_retries_threshold"),
          doing="", hidden="",
          remedy="expandable_segments, stable tensor shapes, no empty_cache() in the loop",
          advice="M4: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, stable tensor shapes, no "
                 "torch.cuda.empty_cache() in the loop; lower the batch size a little if memory is really "
                 "too small."),
    Straggler("straggler", "ST", "waiting for a straggler", "GpuTrainingStraggler", "communication",
          ("straggler_wait_share",),
          doing="waiting in collectives for a slower rank", hidden="if the straggler kept up",
          remedy="remove the straggler's own cause (its verdict names it); balance data and work across ranks",
          advice="ST: this rank is fine; it waits for the straggler named above. Fix the straggler's own cause "
                 "(input pipeline M1, metrics M2, checkpoints CK on one rank only, ...), give every rank the same "
                 "share of the data and work (same batch size, sequence lengths, no rank-0-only work in the "
                 f"step), and check the straggler's GPU for throttling ({catalog.GPU_CLOCK_EVENT_ACTIVE.name})."),
    Communication("communication_bound", "CM", "communication-bound", "GpuTrainingCommunicationBound",
                  "communication", ("communication_bound_share",),
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


@dataclass(frozen=True)
class RunSignals:
    """What one training run (rank) on a GPU reported over the window.

    ``allocator_retries`` / ``allocator_ooms`` count events within ``allocator_window`` (diagnose
    scales a shorter window's limit, see :func:`find_causes`).
    """

    shares: Mapping[str, float]
    allocator_retries: float = 0.0
    allocator_ooms: float = 0.0
    batch_size: float | None = None
    communication: Mapping[str, float] | None = None
    """ST, CM: the ``communication`` share of every live rank of the same run (rank -> share, this one included)."""
    step_seconds: float | None = None
    """ST: this rank's mean step time over the window, for the run's projected step time."""
    callback: tuple[str, str, float] | None = None
    """CK, CB: the run's biggest callback hook of its own: (Class.hook, its phase, its share of the step)."""


@dataclass(frozen=True)
class Finding:
    """One cause that applies: its level, the value that explains it and the projected utilization.

    ``value`` is the share of the run's time the cause takes (for M4: allocator events in the
    window); ``projected`` the utilization the GPU could reach if it were removed (None for M4).
    """

    cause: Cause
    level: str
    value: float
    projected: float | None
    batch_size: float | None = field(default=None, compare=False)
    straggler: str = ""
    """ST: the rank this one waits for (the run's rank with the least communication)."""
    step_seconds: float | None = field(default=None, compare=False)
    """ST: this rank's step time now; times ``1 - value`` it is the run's step time if the straggler kept up."""
    straggler_cause: str = field(default="", compare=False)
    """ST: what holds the straggler back, in words (diagnose fills it from the straggler's own verdict)."""
    callback: str = field(default="", compare=False)
    """CK, CB: the callback hook of the job's own behind it, in words (verdict/callbacks.py)."""

    def summary(self, utilization: float, shares: Mapping[str, float] | None = None) -> str:
        """``"input-bound (M1): 8% now, at most ~90% if loading overlapped compute"``."""
        return f"{self.cause.label}: {self.projection(utilization, shares)}"

    def projection(self, utilization: float, shares: Mapping[str, float] | None = None) -> str:
        """``"8% now, at most ~90% if loading overlapped compute"``: ``utilization`` is the GPU's, ``shares``
        the run's phase shares (its collectives make the figure its useful utilization, see
        :func:`~gpu_exporter.verdict.levels.useful_text`)."""
        now = useful_text(utilization, *(() if shares is None else (shares,)))
        if self.projected is None:
            return f"{now} now; no projection (allocator stalls are counted, not timed)"
        return self.cause.projection(self, now)

    @property
    def projected_step_seconds(self) -> float | None:
        """ST: the run's step time if the straggler kept up (this rank's step time without its wait)."""
        return None if self.step_seconds is None or not self.cause.waits else self.step_seconds * (1.0 - self.value)


def pct(ratio: float) -> str:
    """``0.084 -> "8%"``."""
    return f"{ratio * 100:.0f}%"


def seconds(value: float) -> str:
    """``0.2634 -> "0.26 s"``, ``12.5 -> "12.5 s"``."""
    return f"{value:.3g} s"


def straggler_of(communication: Mapping[str, float]) -> tuple[str, float] | None:
    """(rank, communication share) of the rank that waits least in a run of two or more ranks, else None.

    Ties go to the lowest rank label (PromQL's ``bottomk`` picks any one of them).

    >>> straggler_of({"0": 0.7, "1": 0.05, "2": 0.68})
    ('1', 0.05)
    """
    if len(communication) < 2:
        return None
    rank = min(communication, key=lambda r: (communication[r], r))
    return rank, communication[rank]


def common_communication(own: float, communication: Mapping[str, float] | None) -> float:
    """CM: the communication share every rank of the run pays, the lowest of its live ranks (``own`` included).

    A single rank's is its own share; a waiting rank's excess over it is ST's wait, not this.

    >>> common_communication(0.7, {"0": 0.7, "1": 0.05, "2": 0.68}), common_communication(0.4, None)
    (0.05, 0.4)
    """
    return min([own, *(communication or {}).values()])


def _hidden(utilization: float, share: float) -> float:
    """The utilization if a share ``share`` of the step were hidden: ``u / (1 - s)``, at most 1."""
    return 1.0 if share >= 1.0 else min(1.0, utilization / (1.0 - share))


def cause_order(finding: Finding) -> tuple[bool, float]:
    """The one tie-break of findings (sort key): the allocator first (it also explains the others), then biggest.

    >>> from gpu_exporter.thresholds import load_thresholds
    >>> fs = find_causes(0.1, 0.3, RunSignals({"data": 0.6, "metrics": 0.2}, allocator_ooms=1), load_thresholds())
    >>> [f.cause.code for f in sorted(fs, key=cause_order)]
    ['M4', 'M1']
    """
    return not finding.cause.first, -finding.value


def allocator_limit(t: Thresholds, window_seconds: float) -> float:
    """M4's retry limit for a window: ``allocator_retries_threshold`` per ``allocator_window``, never less.

    The keys are the allocator row's own (:attr:`Cause.keys`: window, then retries per window).
    """
    window_key, retries_key = BY_ID["allocator"].keys
    return threshold(t, retries_key) * max(1.0, window_seconds / threshold(t, window_key))


def find_causes(utilization: float, memory_used_ratio: float | None, run: RunSignals, t: Thresholds,
                retry_limit: float | None = None) -> list[Finding]:
    """Every cause of :data:`CAUSES` that applies to ``run`` on a GPU at ``utilization``, biggest first.

    Mirrors the generated PromQL exactly (the conformance test checks it). ``utilization`` is the
    GPU's; the level and the projections start from the run's useful utilization
    (:func:`~gpu_exporter.verdict.levels.useful_utilization`). ``retry_limit`` is the allocator retry
    limit for the window (default ``allocator_retries_threshold``, the limit per ``allocator_window``
    the rules use). Nothing at or above the target.

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
    limit = threshold(t, BY_ID["allocator"].keys[1]) if retry_limit is None else retry_limit
    found = (cause.find(utilization, memory_used_ratio, run, t, lvl, limit) for cause in CAUSES)
    return sorted((f for f in found if f is not None), key=cause_order)


# --- evidence for GPU processes nobody instrumented (collectors/evidence.py) -------------------------
# A job that reports no phases still shows, from /proc, how its main process and its workers use
# the CPU and whether its main thread waits on storage. HINTS is the table of what that evidence
# points at; monitoring/evidence.py generates the recording rule process:gpu_process_hint:value and
# the alert GpuUninstrumentedInputBound from it, find_hints applies it for diagnose.

MAIN_BUSY = "main_busy"
"""The main thread is runnable most of the time and the process has no worker process: it loads batches itself."""
WORKERS_BUSY = "workers_busy"
"""Every worker process uses most of a core: the input pipeline is at its limit."""
STORAGE_WAIT = "storage_wait"
"""The main thread is blocked on I/O (state D) for much of the time."""


@dataclass(frozen=True)
class ProcessSignals:
    """What the node saw of one GPU process over the window (rates from the gpu_process_* counters).

    ``cpu_cores``: CPU seconds per second of the process (1.0 = one whole core);
    ``children_cpu_cores``: the same for its child processes; ``states``: share of the window its
    main thread was running / sleeping / disk / other; ``read_bytes_per_second`` None without the
    right to read /proc/PID/io.
    """

    pid: str
    cpu_cores: float
    children_cpu_cores: float
    child_processes: int
    states: Mapping[str, float]
    read_bytes_per_second: float | None = None
    name: str = ""

    def describe(self) -> str:
        """``"pid 4242 (python): the main process uses 98% of one core with 0 worker processes, ..."``."""
        who = f"pid {self.pid}" + (f" ({self.name})" if self.name else "")
        workers = (f"{self.child_processes} worker process{'' if self.child_processes == 1 else 'es'}"
                   + (f" using {cores(self.children_cpu_cores)}" if self.child_processes else ""))
        states = ", ".join(f"{_STATE_WORDS.get(s, s)} {pct(v)}" for s, v in
                           sorted(self.states.items(), key=lambda sv: -sv[1]) if v >= 0.005)
        reads = ("" if self.read_bytes_per_second is None else
                 f"; it reads {self.read_bytes_per_second / 2**20:.1f} MiB/s from storage")
        return (f"{who}: the main process uses {cores(self.cpu_cores)} with {workers}; its main thread is "
                f"{states or 'not sampled yet'}{reads}")


_STATE_WORDS = {"running": "runnable", "disk": "in disk wait"}


def cores(value: float) -> str:
    """``0.98 -> "98% of one core"``, ``3.9 -> "3.9 cores"``."""
    return f"{pct(value)} of one core" if value < 1.5 else f"{value:.1f} cores"


@dataclass(frozen=True)
class Hint:
    """One row of the evidence table: a condition on a process's readings and what it points at.

    A process passes it when ``children`` holds for its child processes and ``compare`` holds for the
    value ``read`` from it and the threshold ``keys[0]``; ``promql`` is the same condition on one process
    (monitoring/evidence.py), its value the reading. ``per_core``: the value is CPU cores, not a share.
    """

    name: str
    code: str
    title: str
    keys: tuple[str, ...]
    finding: str
    advice: str
    read: Callable[[ProcessSignals], float]
    children: Callable[[int], bool]
    compare: Callable[[float, float], bool]
    promql: str
    per_core: bool = False

    @property
    def label(self) -> str:
        """``"likely input-bound (M1)"``."""
        return f"{self.title} ({self.code})"


EVIDENCE_ALERT = "GpuUninstrumentedInputBound"
"""The alert of every hint (label ``hint`` tells them apart); its runbook section explains the evidence."""

HINTS: tuple[Hint, ...] = (
    Hint(STORAGE_WAIT, "M1", "likely input-bound on storage", ("evidence_io_wait_share",),
         finding="its main thread is blocked on I/O (state D) for {value} of the time",
         advice="M1: the job waits for storage: copy or cache the data set on local disk or in memory, read "
                "fewer larger files (shards), and overlap reading with compute with DataLoader(num_workers=N, "
                "prefetch_factor=4); then instrument it to measure the data phase.",
         read=lambda p: p.states.get("disk", 0.0), children=lambda n: True, compare=operator.gt,
         promql=f'max without (state) ({catalog.PROCESS_MAIN_THREAD_STATE_SHARE5M.name}{{state="disk"}})'
                " > ${evidence_io_wait_share}"),
    Hint(MAIN_BUSY, "M1", "likely input-bound", ("evidence_busy_core_ratio",),
         finding="its main thread is runnable (on a CPU or waiting for one) {value} of the time with 0 worker "
                 "processes while the GPU waits",
         advice="M1: the main process loads and decodes every batch itself: raise DataLoader(num_workers=N) "
                "(N up to the cores the job may use), pin_memory=True, persistent_workers=True; instrument it "
                "(gpu_exporter.training) to confirm the data phase.",
         # runnable, not CPU seconds: a loaded node must not hide a CPU-bound job
         read=lambda p: p.states.get("running", 0.0), children=lambda n: n == 0, compare=operator.ge,
         promql=f'max without (state) ({catalog.PROCESS_MAIN_THREAD_STATE_SHARE5M.name}{{state="running"}})'
                f" >= ${{evidence_busy_core_ratio}}\nand\n{catalog.GPU_PROCESS_CHILD_PROCESSES.name} == 0"),
    Hint(WORKERS_BUSY, "M1", "likely input-bound, workers saturated", ("evidence_busy_core_ratio",),
         finding="each of its worker processes uses {value} (all busy) while the GPU waits",
         advice="M1: every DataLoader worker is busy: more workers if the job has spare cores, cheaper decoding "
                "or augmentation (on the GPU, e.g. DALI), or cache decoded samples; instrument it to confirm.",
         read=lambda p: p.children_cpu_cores / p.child_processes if p.child_processes else 0.0,
         children=lambda n: n > 0, compare=operator.ge, per_core=True,
         promql=f"{catalog.PROCESS_CHILDREN_CPU_RATE5M.name}\n/\n({catalog.GPU_PROCESS_CHILD_PROCESSES.name} > 0)\n"
                ">= ${evidence_busy_core_ratio}"),
)
"""Every hint, in the order diagnose prefers them."""

HINTS_BY_ID: dict[str, Hint] = {h.name: h for h in HINTS}


def find_hints(p: ProcessSignals, t: Thresholds) -> list[tuple[Hint, float]]:
    """Every hint of :data:`HINTS` the readings of ``p`` pass, with the value that passes (table order).

    The caller applies them only to a GPU below target with no live reported run (the PromQL
    of monitoring/evidence.py does the same; tests/test_evidence.py checks they agree).

    >>> from gpu_exporter.thresholds import load_thresholds
    >>> t = load_thresholds()
    >>> [h.name for h, _ in find_hints(ProcessSignals("1", 0.98, 0.0, 0, {"running": 0.97, "sleeping": 0.03}), t)]
    ['main_busy']
    """
    found = ((hint, hint.read(p)) for hint in HINTS if hint.children(p.child_processes))
    return [(hint, value) for hint, value in found if hint.compare(value, threshold(t, hint.keys[0]))]


def hint_text(hint: Hint, value: float) -> str:
    """The hint's finding with its value: ``"the main process uses 98% of one core with 0 worker ..."``."""
    return hint.finding.format(value=cores(value) if hint.per_core else pct(value))
