"""The verdict ladder: every verdict a GPU can get, as one table, and the judge that walks it.

:data:`LADDER` lists the rows in the order the judge tries them; the first row whose condition holds names the
GPU's verdict. Each row carries its condition in words, the thresholds.yml keys it reads, its remedy, the alerts
that speak for it and the PromQL that expresses it, both from the definitions the generated rules are built from
(tests/test_causes_conformance.py feeds the same cases to promtool and to :func:`judge`). The causes are rows
too, one per row of :data:`~gpu_exporter.verdict.causes.CAUSES`; among them the finding that sorts first by
:func:`~gpu_exporter.verdict.causes.cause_order` wins.

=================================  ==============================================================================
verdict                            when
=================================  ==============================================================================
unknown                            NVML reports no utilization (GPUs in MIG mode)
memory_bound, sm_batch_too_small,  at or above the target with work, but SM activity (GPM or dcgm-exporter) says
tensor_cores_idle, ineffective     the SMs are not used well (a row of :data:`~.efficiency.EFFICIENCY` holds)
healthy                            useful utilization at or above ``utilization_target``
unused                             no memory, process or live run on the GPU
<cause> (M1-M4, CK, ST, CM)        a cause of the table applies to a live run on the GPU: "input-bound (M1)", up to
                                   the target "below target: input-bound (M1)"; with its projection
not instrumented (with a hint)     no live run, and /proc evidence passes a row of ``HINTS``
idle but allocated                 below ``idle_utilization_threshold`` while work holds the GPU
not instrumented                   below target, work on the GPU, but no live training run reports
underutilized / below target       a live run reports, but no cause passes its threshold
=================================  ==============================================================================

The level is judged at the GPU's useful utilization (:func:`~gpu_exporter.verdict.levels.useful_utilization`);
"idle but allocated" reads ``u`` itself (a GPU in a spinning collective is not idle; its run's ST or CM names the wait).

Every verdict carries the effective-use line (``Verdict.effective``): SM activity beside busy utilization, or,
without an SM source, "SM activity unknown: ..." (a busy GPU is never called effective without one).

>>> [row.name for row in LADDER][:7]
['unknown', 'memory_bound', 'sm_batch_too_small', 'tensor_cores_idle', 'ineffective', 'healthy', 'unused']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gpu_exporter import catalog
from gpu_exporter.thresholds import Thresholds
from gpu_exporter.training.protocol import COMPUTE
from gpu_exporter.verdict.alerts import (
    IDLE_BUT_ALLOCATED,
    UTILIZATION_BELOW_TARGET,
    UTILIZATION_LOW,
    Compared,
    runbook_anchor,
)
from gpu_exporter.verdict.causes import CAUSES, cause_order
from gpu_exporter.verdict.code import IdleSplit, idle_split
from gpu_exporter.verdict.efficiency import EFFICIENCY, Activity, GpuCause, GpuFinding, effective_line, find_efficiency
from gpu_exporter.verdict.format import pct
from gpu_exporter.verdict.hints import EVIDENCE_ALERT, HINTS, HINTS_BY_ID
from gpu_exporter.verdict.kinds import Cause, Finding, Launch
from gpu_exporter.verdict.levels import BY_LEVEL, LEVELS, LOW, TARGET, level, threshold, useful_text, useful_utilization
from gpu_exporter.verdict.promql import AT_TARGET, cause_share, efficiency_held
from gpu_exporter.verdict.views import GpuView, RunView, Verdict, evolve

INSTRUMENT_SNIPPET = """\
from gpu_exporter import training
run = training.start("my-run")                # pushes to $GPU_EXPORTER_URL (default http://127.0.0.1:9445)
for batch in run.data(loader):                # time spent waiting for the batch is phase "data"
    with run.phase("compute"): loss = train_step(batch)
    run.step(samples=len(batch))"""
"""The five lines that instrument a training loop (docs/training.md has the rest)."""

WORK_KEY = "work_memory_used_ratio"
"""The memory share above which a GPU holds work without a process or live run (``gpu:gpu_has_work:bool``, in
prometheus/templates/gpu-recording.rules.yml.in, reads the same key)."""


@dataclass(frozen=True)
class Facts:
    """What the ladder's conditions read of one GPU: its view, its utilization (NVML busy time), its level (judged at
    its useful utilization), its live runs and their findings."""

    view: GpuView
    utilization: float | None
    level: str | None
    live: tuple[RunView, ...]
    found: tuple[tuple[Finding, RunView], ...]
    """Every finding of the live runs, in :func:`cause_order`."""
    efficiency: GpuFinding | None = None
    """The GPU-level cause of a GPU at or above the target with work (verdict/efficiency.py), or None."""

    @property
    def u(self) -> float:
        """The utilization, for the rows below ``unknown`` (which take the GPUs without one)."""
        assert self.utilization is not None
        return self.utilization

    def now(self, noun: str = " utilization") -> str:
        """The figure the level is judged at, in words: ``"8% utilization"``, or ``"35% useful utilization (95%
        busy, 65% of the step in collectives)"`` when the live run's collectives hide part of it."""
        return useful_text(self.u, *(r.shares for r in self.live), noun=noun)


@dataclass(frozen=True)
class Row:
    """One verdict of the ladder. ``holds`` is its condition, ``say`` the verdict it gives; ``keys`` the
    thresholds.yml keys its condition reads. What a row describes comes from the definitions the generated rules are
    built from, never typed twice."""

    name: str
    verdict: str
    title: str
    when: str
    keys: tuple[str, ...]
    remedy: str
    alerts: tuple[str, ...]
    """The alerts that speak for the row: at level ``low`` (or at any level), then at ``target`` where another
    alert does; none for a row no alert speaks for (unknown, healthy, unused)."""
    promql: str
    """The PromQL (template text) of the rules that express the row: each alert's comparison (a cause's recorded
    share, the evidence's hint series), or the row's condition where no alert speaks for it."""
    holds: Callable[[Facts, Thresholds], bool]
    say: Callable[[Row, Facts, Thresholds], Verdict]

    @property
    def anchor(self) -> str:
        """The runbook section of the row (its first alert's), or "" without an alert."""
        return runbook_anchor(self.alerts[0]) if self.alerts else ""

    @property
    def target_anchor(self) -> str:
        """The runbook section at level ``target``, where another alert than at ``low`` speaks for the row."""
        return runbook_anchor(self.alerts[1]) if len(self.alerts) > 1 else ""

    def titled(self, lvl: str | None) -> str:
        """The title at level ``lvl``: ``"input-bound (M1)"`` or ``"below target: input-bound (M1)"``."""
        return self.title if lvl in (None, LOW) else f"below target: {self.title}"

    def runbook(self, t: Thresholds, lvl: str | None = None) -> str:
        """The runbook link of this row at level ``lvl`` ("" without a section)."""
        anchor = self.target_anchor if lvl == TARGET and self.target_anchor else self.anchor
        return t.runbook_url(anchor) if anchor else ""


# --- what each row says (the conditions are short enough to sit in the table) ----------------------

def _says(reason: str) -> Callable[[Row, Facts, Thresholds], Verdict]:
    """What a row says that needs no figure: its title and ``reason``."""
    return lambda row, f, t: Verdict(row.verdict, row.title, reason)


def _healthy(row: Row, f: Facts, t: Thresholds) -> Verdict:
    sms = ("; how well its kernels use the SMs is unknown (no SM activity source)" if f.view.sm_active is None
           else f", and its SMs are {pct(f.view.sm_active)} active")  # busy is never called effective without one
    return Verdict(row.verdict, row.title, f"{f.now()}, at or above the {pct(t.utilization_target)} target{sms}.")


def _ineffective(row: Row, f: Facts, t: Thresholds) -> Verdict:
    found = f.efficiency
    assert found is not None and f.view.sm_active is not None
    said = found.cause.reason(_activity(f.view))
    verdict = Verdict(row.verdict, row.title, f"{said[0].upper()}{said[1:]} {found.projection()}.", row.remedy,
                      row.runbook(t), False, found.cause.code, projected=found.busy, worth=found.worth)
    return _suggested(f.live[0], verdict) if f.live else verdict


def _cause(row: Row, f: Facts, t: Thresholds) -> Verdict:
    (first, run), others = f.found[0], f.found[1:]
    also = "".join(f" Also {g.cause.label}: {g.cause.amount(g.value)}"
                   + (f" (at most ~{pct(g.projected)} without it)" if g.projected is not None else "") + "."
                   for g, _ in others)
    reason = f"{first.projection(f.u, run.shares)}. {first.cause.reason(first, run.run, run.rank)}{also}"
    return _suggested(run, Verdict(row.verdict, row.titled(f.level), reason, row.remedy, row.runbook(t), True,
                                   first.cause.code, f.level or "", first.projected))


def _finished(f: Facts) -> list[str]:
    """The runs on the GPU that finished or stopped pushing, by name."""
    return sorted({r.run for r in f.view.runs if not r.live})


def _gone(f: Facts) -> str:
    return f" (run {', '.join(_finished(f))} finished or stopped pushing)" if _finished(f) else ""


ENDED_REMEDY = ("If the job still runs, it stopped reaching the exporter: check that GPU_EXPORTER_URL points at this "
                "node's exporter and read the job's log for the pusher's warning. If it ended, its end is the low "
                "utilization: release the GPU, or instrument the job that holds it now.")
"""The remedy of a GPU below target whose training runs all ended or stopped pushing: it was instrumented."""


def _seen(f: Facts) -> str:
    return f" {f.view.evidence_text}" if f.view.evidence_text else ""


def _hinted(row: Row, f: Facts, t: Thresholds) -> Verdict:
    hint = HINTS_BY_ID[f.view.evidence_hint]
    title = (f"not instrumented: {hint.label}" if f.level == LOW else
             f"below target: not instrumented, {hint.label}")
    reason = (f"{pct(f.u)} utilization (target {pct(t.utilization_target)}) and no live training run "
              f"reports its phases{_gone(f)}. What /proc shows: {f.view.evidence_text} That points at {hint.label}.")
    return Verdict(row.verdict, title, reason, f"{hint.advice}\n{row.remedy}", row.runbook(t), True, hint.code,
                   f.level or "")


def _holder(view: GpuView, live: Sequence[RunView]) -> str:
    parts = [f"training run {live[0].run}"] if live else []
    parts += [f"pid {p.pid} {p.name} ({p.memory_bytes / 2**30:.1f} GiB)" for p in view.process_list]
    return ", ".join(parts) or f"{pct(view.memory_used_ratio or 0.0)} of its memory"


def _idle(row: Row, f: Facts, t: Thresholds) -> Verdict:
    return _below(row, f, t, f"{pct(f.u)} utilization while {_holder(f.view, f.live)} holds the GPU."
                             f"{_seen(f)}", title=row.title)


def _uninstrumented(row: Row, f: Facts, t: Thresholds) -> Verdict:
    verdict = _below(row, f, t, f"{pct(f.u)} utilization (target {pct(t.utilization_target)}) and no live "
                                f"training run reports its phases{_gone(f)}.{_seen(f)}")
    finished = _finished(f)
    if not finished:
        return verdict
    ended = f"run {', '.join(finished)} ended or stopped pushing"
    return replace(verdict, title=ended if f.level == LOW else f"below target: {ended}",
                   remedy=f"Run {', '.join(finished)} ended or stopped pushing: it was instrumented. {ENDED_REMEDY}")


def _underutilized(row: Row, f: Facts, t: Thresholds) -> Verdict:
    run = f.live[0]
    biggest = max(((p, s) for p, s in run.shares.items() if p != COMPUTE), key=lambda x: x[1], default=None)
    detail = f"; its largest phase besides compute is {biggest[0]} at {pct(biggest[1])}" if biggest else ""
    return _below(row, f, t, f"{f.now()} (target {pct(t.utilization_target)}); no cause "
                             f"passes its threshold for run {run.run}{detail}.",
                  title=row.title if f.level == LOW else "below target: no single cause")


def _below(row: Row, f: Facts, t: Thresholds, reason: str, title: str | None = None) -> Verdict:
    return Verdict(row.verdict, title if title is not None else row.titled(f.level), reason, row.remedy,
                   row.runbook(t, f.level), True, level=f.level or "")


def _suggested(run: RunView, verdict: Verdict) -> Verdict:
    """``verdict`` with the run's concrete remedy for its cause first in the remedy (once: diagnose and the live
    page print the reason and the remedy one after the other)."""
    if run.source:
        verdict = replace(verdict, reason=f"{verdict.reason} (Phases sampled from the Python stack with py-spy, "
                                          "not reported by the job.)")
    text = run.suggestions.get(verdict.name, "")
    return replace(verdict, remedy=f"{text}.\n{verdict.remedy}", suggestion=text) if text else verdict


def _idle_split(f: Facts) -> IdleSplit | None:
    """Below target, the first live run's split of the GPU's idle time (gpu_exporter.verdict.code.idle_split)."""
    if f.level is None or f.utilization is None or not f.live or not f.live[0].shares:
        return None
    run = f.live[0]
    return idle_split(f.utilization, run.shares, run.code, any(isinstance(x.cause, Launch) for x in run.findings))


def _cause_row(cause: Cause) -> Row:
    return Row(cause.cause, cause.cause, cause.label,
               f"the biggest finding of a live run on the GPU (allocator first) is {cause.label}", cause.keys,
               cause.advice, (cause.alert,), cause_share(cause.cause),
               lambda f, t: bool(f.found) and f.found[0][0].cause is cause, _cause)


def _efficiency_row(cause: GpuCause) -> Row:
    return Row(cause.cause, cause.cause, cause.label,
               f"at or above the target with work, and SM activity says {cause.doing}", cause.keys, cause.advice,
               (cause.alert,), efficiency_held(cause.cause),
               lambda f, t: f.efficiency is not None and f.efficiency.cause is cause and _has_work(f, t), _ineffective)


def _activity(view: GpuView) -> Activity:
    """The GPU's SM, tensor and DRAM activity beside its busy utilization (verdict/efficiency.py)."""
    return Activity(view.utilization or 0.0, view.sm_active, view.tensor_active, view.dram_active,
                    view.memory_used_ratio, view.sm_source, view.fp32_active, view.fp16_active, view.fp64_active)


def _has_work(f: Facts, t: Thresholds) -> bool:
    memory = f.view.memory_used_ratio
    return bool(f.view.processes or f.live or (memory is not None and memory > threshold(t, WORK_KEY)))


LEVEL_KEYS = tuple(lv.key for lv in LEVELS)
"""The lines of the levels (gpu_exporter.verdict.levels): what a row below target reads through the level."""
BELOW: tuple[Compared, ...] = (UTILIZATION_LOW, UTILIZATION_BELOW_TARGET)
"""The alerts of a GPU below target that no cause names, one per level, and their comparisons."""
BELOW_ALERTS, BELOW_PROMQL = tuple(c.name for c in BELOW), "\nor\n".join(c.promql for c in BELOW)


LADDER: tuple[Row, ...] = (
    Row("unknown", "unknown", "unknown", "NVML reports no utilization (MIG mode)", (), "", (),
        f"absent({catalog.GPU_UTILIZATION_AVG5M.name})", lambda f, t: f.utilization is None,
        _says(f"NVML reports no utilization for this GPU (MIG mode); look at {catalog.GPU_SM_ACTIVE_RATIO.name} (GPM) "
              "instead.")),
    *(_efficiency_row(c) for c in EFFICIENCY),
    Row("healthy", "healthy", "healthy", "useful utilization at or above the target", (BY_LEVEL[TARGET].key,), "", (),
        AT_TARGET, lambda f, t: f.level is None, _healthy),
    Row("unused", "unused", "unused", f"no process, no live run, memory at most {WORK_KEY}", (WORK_KEY,), "", (),
        f"{catalog.GPU_HAS_WORK_BOOL.name} == 0", lambda f, t: not _has_work(f, t),
        _says("no process, live training run or memory on the GPU: free capacity.")),
    *(_cause_row(c) for c in CAUSES),
    Row("not_instrumented_evidence", "not_instrumented", "not instrumented",
        "no live run reports, and the processes' /proc evidence passes a row of HINTS",
        tuple(dict.fromkeys(k for h in HINTS for k in h.keys)), f"Instrument it to confirm:\n{INSTRUMENT_SNIPPET}",
        (EVIDENCE_ALERT,), catalog.PROCESS_HINT_VALUE.name,
        lambda f, t: not f.live and bool(f.view.evidence_hint), _hinted),
    Row("idle_but_allocated", "idle_but_allocated", "idle but allocated",
        f"utilization below {IDLE_BUT_ALLOCATED.threshold} while work holds the GPU", (IDLE_BUT_ALLOCATED.threshold,),
        "Release the GPU (stop the idle notebook kernel or the finished job), or find what the job waits for: "
        "its input pipeline or a collective with a dead rank.", (IDLE_BUT_ALLOCATED.name,), IDLE_BUT_ALLOCATED.promql,
        lambda f, t: IDLE_BUT_ALLOCATED.holds(f.u, t), _idle),
    Row("not_instrumented", "not_instrumented", "not instrumented",
        "below target with work on the GPU, and no live training run reports its phases (the alerts without a run "
        "label)", LEVEL_KEYS,
        "Instrument the job with gpu_exporter.training so the phases show the cause (input pipeline, metrics, "
        f"checkpoints, batch size, allocator):\n{INSTRUMENT_SNIPPET}", BELOW_ALERTS, BELOW_PROMQL,
        lambda f, t: not f.live, _uninstrumented),
    Row("underutilized", "underutilized", "underutilized",
        "below target, a live run reports, but no cause passes its threshold (the alerts with a run label, and no "
        f"{catalog.RUN_TRAINING_CAUSE_SHARE.name})", LEVEL_KEYS,
        "No phase passes its threshold: look at the largest phase besides compute, then the batch size (M3); "
        "inference servers: batch requests or share the GPU (MIG).", BELOW_ALERTS, BELOW_PROMQL,
        lambda f, t: True, _underutilized),
)
"""Every verdict, in the order :func:`judge` tries them (a row's order is its position)."""

BY_ROW: dict[str, Row] = {row.name: row for row in LADDER}

VERDICT_TITLES: dict[str, str] = {row.verdict: row.title for row in reversed(LADDER)}
"""Each verdict's title (its first row's), without the level: ``input_bound -> "input-bound (M1)"``."""


def judge(view: GpuView, t: Thresholds) -> Verdict:
    """The one verdict for ``view`` under thresholds ``t``: the first row of :data:`LADDER` that holds (its live runs'
    findings come from the join, :func:`gpu_exporter.verdict.join.build_views`)."""
    util = view.utilization
    live = tuple(r for r in view.runs if r.live)
    found = tuple(sorted(((f, r) for r in live for f in r.findings), key=lambda fr: cause_order(fr[0])))
    lvl = None if util is None else level(useful_utilization(util, *(r.shares for r in live)), t)
    efficiency = (find_efficiency(_activity(view), t, view.efficiency_recorded) if util is not None and lvl is None
                  else None)
    facts = Facts(view, util, lvl, live, found, efficiency)
    for row in LADDER:
        if row.holds(facts, t):
            return evolve(row.say(row, facts, t), effective=effective_line(
                util, view.sm_active, view.sm_source, view.tensor_active, view.dram_active,
                live[0].shares if live else None, pipes=_activity(view).pipes()), idle=_idle_split(facts))
    raise AssertionError("the last row of the ladder always holds")  # pragma: no cover
