"""``gpu-exporter diagnose``: one verdict per GPU on why it is below the utilization target.

Reads a node's exporter (two scrapes ``--window`` apart, judged with the cause table of
:mod:`gpu_exporter.causes`) or Prometheus (only the recording rules generated from that same
table: ``gpu:gpu_utilization:avg5m``, ``gpu:gpu_has_work:bool``, ``run:gpu_training_phase:share5m``,
``run:gpu_training_cause:share`` and ``run:gpu_training_cause:projected_utilization``), joins the
live training runs on each GPU by ``uuid``, and gives each GPU one verdict:

=================================  ==============================================================
verdict                            when
=================================  ==============================================================
healthy                            utilization at or above ``utilization_target`` (85%)
<cause> (M1, M2, CK, M3, M4)       a cause of the table applies to a live run on the GPU: below
                                   ``utilization_low_threshold`` the title is the cause
                                   ("input-bound (M1)"), up to the target it reads
                                   "below target: input-bound (M1)"; with its projection
idle but allocated                 below ``idle_utilization_threshold`` while work holds the GPU;
                                   names the processes (pid, name, memory)
not instrumented                   below target, work on the GPU, but no live training run reports
underutilized / below target       a live run reports, but no cause passes its threshold
unused                             no memory, process or live run on the GPU
unknown                            NVML reports no utilization (GPUs in MIG mode)
=================================  ==============================================================

``--prometheus-url`` with ``--window`` and/or ``--at`` judges any window ending at any time Prometheus
still holds: the recording rules' signals are computed for that window from the raw counters
(:func:`from_prometheus_window`: ``rate``/``increase`` over the window, evaluated at ``--at``) and
judged with the same cause table and judge (:func:`gpu_exporter.causes.find_causes`, which the
conformance test holds equal to the generated rules).

Only live runs count: a run that finished (it reports no current phase) or has not pushed for
``max(30 s, 2 x window)`` is listed as finished and ignored when judging. ``--run`` judges only
that run. Runs whose snapshots carry no GPU UUID cannot be joined to a GPU: they are listed
separately with the fix.

Exit status: 0 when no GPU with work is below the target, 1 when one is, 2 on bad input or an
unreachable source. Example::

    $ gpu-exporter diagnose --url http://127.0.0.1:9445 --window 30s
    $ gpu-exporter diagnose --prometheus-url http://prometheus:9090 --namespace ml-team --output json
    $ gpu-exporter diagnose --prometheus-url http://prometheus:9090 --run resnet --window 2h --at=-8h
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TextIO

from gpu_exporter import remedies
from gpu_exporter.causes import BY_ID, LOW, TARGET, Finding, RunSignals, find_causes, level, pct
from gpu_exporter.commands import evidence as process_evidence
from gpu_exporter.commands import ranks as run_ranks
from gpu_exporter.commands.metrics_client import (
    ExporterSource,
    Labels,
    MetricsError,
    Prometheus,
    Snapshot,
    fail,
    iso,
    parse_time,
    promql_duration,
    read_after,
)
from gpu_exporter.thresholds import Thresholds, ThresholdsError, load_thresholds, parse_duration
from gpu_exporter.training.protocol import OTHER, STANDARD_PHASES

DEFAULT_URL = "http://127.0.0.1:9445"
DEFAULT_WINDOW_EXPORTER = "15s"
PROMETHEUS_WINDOW = "5m"
"""The window of the recording rules diagnose reads from Prometheus."""
STALE_SECONDS = 30.0
"""A run that has not pushed for this long (or two windows, if longer) is not live."""

INSTRUMENT_SNIPPET = """\
from gpu_exporter import training
run = training.start("my-run")                # pushes to $GPU_EXPORTER_URL (default http://127.0.0.1:9445)
for batch in run.data(loader):                # time spent waiting for the batch is phase "data"
    with run.phase("compute"): loss = train_step(batch)
    run.step(samples=len(batch))"""
"""The five lines that instrument a training loop (docs/training.md has the rest)."""

NO_UUID_FIX = ("its snapshots carry no GPU UUID, so it cannot be joined to a GPU: start the job with "
               "CUDA_VISIBLE_DEVICES=GPU-<uuid> (nvidia-smi -L lists the UUIDs) or pass "
               "training.start(..., uuid=\"GPU-<uuid>\")")

RunKey = tuple[str, str, str]


@dataclass(frozen=True)
class RunView:
    """A training run (rank) on a GPU, over the window, with the causes that apply to it."""

    run: str
    rank: str
    shares: dict[str, float]
    seconds: float
    since_start: bool
    batch_size: float | None
    allocator_retries: float
    allocator_ooms: float
    live: bool = True
    findings: tuple[Finding, ...] = ()
    world_size: int = 1
    step_seconds: float | None = None
    """Mean seconds per training step over the window (None: no step in it)."""
    suggestions: dict[str, str] = field(default_factory=dict)
    """Concrete remedy per cause id, from the run's reported context (gpu_exporter.remedies)."""
    source: str = ""
    """"sampled": phases estimated from the Python stack by the exporter (gpu_exporter.sampling)."""


@dataclass(frozen=True)
class Process:
    """A process holding memory on a GPU."""

    pid: str
    name: str
    memory_bytes: float


@dataclass(frozen=True)
class GpuView:
    """What diagnose knows about one GPU."""

    uuid: str
    gpu: str
    name: str
    node: str
    utilization: float | None
    memory_used_ratio: float | None
    processes: int
    pods: tuple[str, ...]
    runs: tuple[RunView, ...]
    process_list: tuple[Process, ...] = ()
    evidence: tuple[process_evidence.ProcessSignals, ...] = ()
    """What /proc showed of its processes (commands/evidence.py); ``evidence_hint``: the first hint that
    passed (an id of causes.HINTS) and ``evidence_finding`` its sentence; ``evidence_text`` all processes."""
    evidence_hint: str = ""
    evidence_finding: str = ""
    evidence_text: str = ""


@dataclass(frozen=True)
class Verdict:
    """The diagnosis of one GPU. ``projected`` is the utilization reachable without the cause."""

    verdict: str
    title: str
    reason: str
    remedy: str = ""
    runbook: str = ""
    below_target: bool = False
    code: str = ""
    level: str = ""
    projected: float | None = None
    suggestion: str = ""
    """The concrete remedy, with the run's own numbers (gpu_exporter.remedies); "" without them."""


@dataclass
class Readings:
    """Everything read from a source, keyed by GPU uuid or (run, rank, uuid)."""

    info: list[Labels] = field(default_factory=list)
    utilization: dict[str, float] = field(default_factory=dict)
    memory_used: dict[str, float] = field(default_factory=dict)
    memory_total: dict[str, float] = field(default_factory=dict)
    memory_ratio: dict[str, float] = field(default_factory=dict)
    processes: dict[str, list[Process]] = field(default_factory=dict)
    pods: dict[str, set[str]] = field(default_factory=dict)
    phase_window: dict[RunKey, dict[str, float]] = field(default_factory=dict)
    phase_total: dict[RunKey, dict[str, float]] = field(default_factory=dict)
    retries: dict[RunKey, float] = field(default_factory=dict)
    ooms: dict[RunKey, float] = field(default_factory=dict)
    batch_size: dict[RunKey, float] = field(default_factory=dict)
    world_size: dict[RunKey, float] = field(default_factory=dict)
    step_seconds: dict[RunKey, float] = field(default_factory=dict)
    live: set[RunKey] = field(default_factory=set)
    findings: dict[RunKey, list[Finding]] | None = None
    evidence: dict[str, list[process_evidence.ProcessSignals]] = field(default_factory=dict)
    hints: dict[tuple[str, str], list[tuple[Any, float]]] | None = None
    """Evidence hints per (uuid, pid) from the recording rules; None: apply causes.HINTS here."""
    contexts: dict[RunKey, remedies.Context] = field(default_factory=dict)
    sampled: set[RunKey] = field(default_factory=set)
    """Causes read from Prometheus' recording rules; None: judge here with the cause table."""


def _run_key(labels: Labels) -> RunKey:
    return labels.get("run", ""), labels.get("rank", ""), labels.get("uuid", "")


def _phases(pairs: Iterable[tuple[Labels, float]]) -> dict[RunKey, dict[str, float]]:
    out: dict[RunKey, dict[str, float]] = {}
    for labels, value in pairs:
        out.setdefault(_run_key(labels), {})[labels.get("phase", OTHER)] = value
    return out


def _per_run(pairs: Iterable[tuple[Labels, float]]) -> dict[RunKey, float]:
    return {_run_key(labels): value for labels, value in pairs}


def _per_gpu(pairs: Iterable[tuple[Labels, float]]) -> dict[str, float]:
    return {labels.get("uuid", ""): value for labels, value in pairs}


def _common(readings: Readings, cur: Iterable[tuple[str, list[tuple[Labels, float]]]]) -> Readings:
    """Fill the instant parts of ``readings`` from (metric name, samples) pairs."""
    for name, pairs in cur:
        if name == "gpu_info":
            readings.info = [labels for labels, _ in pairs]
        elif name == "gpu_memory_used_bytes":
            readings.memory_used = _per_gpu(pairs)
        elif name == "gpu_memory_total_bytes":
            readings.memory_total = _per_gpu(pairs)
        elif name == "gpu_process_memory_used_bytes":
            for labels, value in pairs:
                readings.processes.setdefault(labels.get("uuid", ""), []).append(
                    Process(labels.get("pid", ""), labels.get("process_name", ""), value))
        elif name == "gpu_pod_info":
            for labels, _ in pairs:
                readings.pods.setdefault(labels.get("uuid", ""), set()).add(
                    f"{labels.get('namespace', '')}/{labels.get('pod', '')}")
        elif name == "gpu_training_phase_seconds_total":
            readings.phase_total = _phases(pairs)
        elif name == "gpu_training_batch_size":
            readings.batch_size = _per_run(pairs)
        elif name == "gpu_training_world_size":
            readings.world_size = _per_run(pairs)
    return readings


_INSTANT = ("gpu_info", "gpu_memory_used_bytes", "gpu_memory_total_bytes", "gpu_process_memory_used_bytes",
            "gpu_pod_info", "gpu_training_phase_seconds_total", "gpu_training_batch_size", "gpu_training_world_size")


def from_snapshots(prev: Snapshot, cur: Snapshot) -> Readings:
    """Readings from two scrapes of one exporter: utilization and run activity are the deltas between them.

    A run is live when it reports a current phase (it has not finished) and pushed within
    ``max(STALE_SECONDS, 2 x window)`` of the second scrape.
    """
    readings = _common(Readings(), ((name, cur.series(name)) for name in _INSTANT))
    elapsed = cur.at - prev.at
    before = _per_gpu(prev.series("gpu_busy_seconds_total"))
    for uuid, after in _per_gpu(cur.series("gpu_busy_seconds_total")).items():
        if uuid in before and elapsed > 0 and after >= before[uuid]:
            readings.utilization[uuid] = min((after - before[uuid]) / elapsed, 1.0)
    old_phases = _phases(prev.series("gpu_training_phase_seconds_total"))
    for key, phases in readings.phase_total.items():
        old = old_phases.get(key, {})
        restarted = any(phases.get(p, 0.0) < v for p, v in old.items())
        readings.phase_window[key] = {p: v - (0.0 if restarted else old.get(p, 0.0)) for p, v in phases.items()}
    for counter, target in (("gpu_training_allocator_retries_total", readings.retries),
                            ("gpu_training_allocator_ooms_total", readings.ooms)):
        old_counts = _per_run(prev.series(counter))
        for key, value in _per_run(cur.series(counter)).items():
            base = old_counts.get(key, 0.0)
            target[key] = value - base if value >= base else value
    old_steps = _per_run(prev.series("gpu_training_steps_total"))
    for key, steps in _per_run(cur.series("gpu_training_steps_total")).items():
        wall = sum(v for v in readings.phase_window.get(key, {}).values() if v > 0)
        if steps > old_steps.get(key, steps) and wall > 0:  # seconds per step: the run's own clock
            readings.step_seconds[key] = wall / (steps - old_steps[key])
    current = {key for key, value in _per_run(
        (labels, value) for labels, value in cur.series("gpu_training_current_phase") if value == 1.0).items()}
    stale = max(STALE_SECONDS, 2 * elapsed)
    pushed = _per_run(cur.series("gpu_training_last_push_timestamp_seconds"))
    readings.live = {key for key in current if cur.wall - pushed.get(key, cur.wall) <= stale}
    readings.evidence = process_evidence.from_snapshots(prev, cur)
    readings.contexts = remedies.read_contexts(cur.series)
    readings.sampled = _sampled(cur.series("gpu_training_phase_seconds_total"))
    return readings


def from_prometheus_window(prom: Prometheus, seconds: float) -> Readings:
    """Readings from Prometheus over any window ending at ``prom.at``: the recording rules' signals for it.

    ``rate(gpu_busy_seconds_total[W])`` is ``gpu:gpu_utilization:avg5m`` with the window W, the phases'
    ``increase(...[W])`` give ``run:gpu_training_phase:share5m``'s shares, allocator events are counted over
    W; the causes are then judged with the cause table (``findings`` None). Needs no rules loaded.
    """
    w = promql_duration(seconds)
    prom.require("gpu_info", "15m")
    readings = _common(Readings(), ((name, prom.query(name)) for name in _INSTANT))
    readings.utilization = {u: min(v, 1.0) for u, v in _per_gpu(prom.query(f"rate(gpu_busy_seconds_total[{w}])"))
                            .items() if math.isfinite(v)}
    readings.phase_window = _phases(prom.query(f"increase(gpu_training_phase_seconds_total[{w}])"))
    readings.retries = _per_run(prom.query(f"increase(gpu_training_allocator_retries_total[{w}])"))
    readings.ooms = _per_run(prom.query(f"increase(gpu_training_allocator_ooms_total[{w}])"))
    readings.live = {key for key, value in _per_run(
        prom.query("max without (phase) (gpu_training_current_phase)")).items() if value == 1.0}
    return readings


def from_prometheus(prom: Prometheus) -> Readings:
    """Readings from Prometheus: the recording rules generated from the cause table, instant values.

    Utilization, memory, phase shares and causes come only from the recording rules (5m windows, at
    ``prom.at``); names, processes, pods and batch sizes from the exporter's instant series.
    """
    prom.require("gpu_info", "15m")
    if not prom.query("count(gpu:gpu_utilization:avg5m)"):
        raise MetricsError(f"Prometheus at {prom.base} has no gpu:gpu_utilization:avg5m series: load the rules "
                           "of prometheus/rules/*.rules.yml (rule_files) so diagnose can read the cause series")
    readings = _common(Readings(), ((name, prom.query(name)) for name in _INSTANT if
                                    name != "gpu_training_phase_seconds_total"))
    readings.utilization = {u: min(v, 1.0) for u, v in _per_gpu(prom.query("gpu:gpu_utilization:avg5m")).items()
                            if math.isfinite(v)}
    readings.memory_ratio = _per_gpu(prom.query("gpu:gpu_memory_used:ratio"))
    readings.phase_window = readings.phase_total = _phases(prom.query("run:gpu_training_phase:share5m"))
    readings.step_seconds = _per_run(prom.query("run:gpu_training_step_seconds:avg5m"))
    readings.live = {key for key, value in _per_run(
        prom.query("max without (phase) (gpu_training_current_phase)")).items() if value == 1.0}
    projected = {(*_run_key(labels), labels.get("cause", "")): value for labels, value in
                 prom.query("run:gpu_training_cause:projected_utilization")}
    readings.findings = {}
    for labels, value in prom.query("run:gpu_training_cause:share"):
        cause = BY_ID.get(labels.get("cause", ""))
        if cause is None or labels.get("level") not in (LOW, TARGET):
            continue
        key = _run_key(labels)
        readings.findings.setdefault(key, []).append(Finding(
            cause, labels["level"], value, projected.get((*key, cause.cause)), readings.batch_size.get(key),
            straggler=labels.get("straggler_rank", ""), step_seconds=readings.step_seconds.get(key)))
    readings.evidence, readings.hints = process_evidence.from_prometheus(prom)
    readings.contexts = remedies.read_contexts(prom.query)
    readings.sampled = _sampled(prom.query("run:gpu_training_phase:share5m"))
    return readings


def build_views(readings: Readings, t: Thresholds | None = None, window_seconds: float = 0.0) -> list[GpuView]:
    """One GpuView per GPU of ``gpu_info``, with its runs joined by uuid, in (node, index) order.

    With thresholds ``t`` the causes of each live run are found here (exporter readings) or
    taken from the recording rules (Prometheus readings).
    """
    runs: dict[str, list[RunView]] = {}
    memory = {uuid: used / readings.memory_total[uuid] for uuid, used in readings.memory_used.items()
              if readings.memory_total.get(uuid)}
    memory.update(readings.memory_ratio)
    for key, totals in readings.phase_total.items():
        window = readings.phase_window.get(key, {})
        seconds = sum(v for v in window.values() if v > 0)
        since_start = seconds <= 0
        basis = totals if since_start else window
        total = sum(v for v in basis.values() if v > 0)
        shares = {p: round(max(v, 0.0) / total, 4) for p, v in basis.items()} if total > 0 else {}
        view = RunView(run=key[0], rank=key[1], shares=shares, seconds=total, since_start=since_start,
                       batch_size=readings.batch_size.get(key), allocator_retries=readings.retries.get(key, 0.0),
                       allocator_ooms=readings.ooms.get(key, 0.0), live=key in readings.live,
                       world_size=int(readings.world_size.get(key, 1)), step_seconds=readings.step_seconds.get(key))
        runs.setdefault(key[2], []).append(view)
    communication = run_ranks.communication_by_run(r for views_of_gpu in runs.values() for r in views_of_gpu)
    if t is not None:  # judged after every rank's shares are known: the straggler cause compares ranks
        runs = {uuid: [replace(view, findings=tuple(_findings(readings, (view.run, view.rank, uuid), view,
                                                              memory.get(uuid), t, window_seconds,
                                                              communication.get(view.run)))) if view.live else view
                       for view in views_of_gpu] for uuid, views_of_gpu in runs.items()}
    views = []
    for labels in readings.info:
        uuid = labels.get("uuid", "")
        procs = tuple(sorted(readings.processes.get(uuid, []), key=lambda p: -p.memory_bytes))
        evidence = tuple(readings.evidence.get(uuid, ()))
        text, hint = process_evidence.explain(uuid, evidence, t, readings.hints) if t is not None else ("", None)
        if t is not None:
            runs[uuid] = [_suggest(r, readings, uuid, t) for r in runs.get(uuid, [])]
        views.append(GpuView(
            uuid=uuid, gpu=labels.get("gpu", ""), name=labels.get("name", ""),
            node=labels.get("node") or labels.get("instance", ""),
            utilization=readings.utilization.get(uuid), memory_used_ratio=memory.get(uuid),
            processes=len(procs), pods=tuple(sorted(readings.pods.get(uuid, ()))),
            runs=tuple(sorted(runs.get(uuid, []), key=lambda r: (not r.live, r.run, r.rank))), process_list=procs,
            evidence=evidence, evidence_hint=hint[0].hint if hint else "",
            evidence_finding=hint[1] if hint else "", evidence_text=text))
    return run_ranks.name_straggler_causes(
        sorted(views, key=lambda v: (v.node, int(v.gpu) if v.gpu.isdigit() else 1 << 30, v.uuid)))


def _findings(readings: Readings, key: RunKey, run: RunView, memory: float | None, t: Thresholds,
              window_seconds: float, communication: dict[str, float] | None = None) -> list[Finding]:
    if readings.findings is not None:
        return sorted(readings.findings.get(key, []), key=lambda f: (f.cause.kind != "allocator", -f.value))
    util = readings.utilization.get(key[2])
    if util is None or not run.shares:
        return []
    retry_limit = t.allocator_retries_threshold * max(1.0, window_seconds / t.allocator_window)
    signals = RunSignals(run.shares, run.allocator_retries, run.allocator_ooms, run.batch_size,
                         communication, run.step_seconds)
    return find_causes(util, memory, signals, t, retry_limit)


def unjoined_runs(readings: Readings) -> list[tuple[str, str]]:
    """(run, rank) of the runs whose snapshots carry no GPU UUID."""
    return sorted({(run, rank) for run, rank, uuid in readings.phase_total if not uuid})


_GENERIC = {
    "idle_but_allocated": ("Release the GPU (stop the idle notebook kernel or the finished job), or find what "
                           "the job waits for: its input pipeline or a collective with a dead rank.",
                           "gpuidlebutallocated"),
    "not_instrumented": ("Instrument the job with gpu_exporter.training so the phases show the cause "
                         "(input pipeline, metrics, checkpoints, batch size, allocator):\n"
                         + INSTRUMENT_SNIPPET, "gpuutilizationlow"),
    "underutilized": ("No phase passes its threshold: look at the largest phase besides compute, then the batch "
                      "size (M3); inference servers: batch requests or share the GPU (MIG).", "gpuutilizationlow"),
}


def _generic(kind: str, title: str, reason: str, t: Thresholds, lvl: str) -> Verdict:
    remedy, anchor = _GENERIC[kind]
    return Verdict(kind, title, reason, remedy, t.runbook_url(anchor), True, level=lvl)


def judge(view: GpuView, t: Thresholds) -> Verdict:
    """The one verdict for ``view`` under thresholds ``t`` (see the module docstring for the order).

    The causes of its live runs (``RunView.findings``) were found by :func:`build_views`; the
    biggest one names the verdict, the others are listed with it.
    """
    util = view.utilization
    if util is None:
        return Verdict("unknown", "unknown", "NVML reports no utilization for this GPU (MIG mode); "
                       "look at gpu_sm_active_ratio (GPM) instead.")
    lvl = level(util, t)
    if lvl is None:
        return Verdict("healthy", "healthy", f"{pct(util)} utilization, at or above the "
                                             f"{pct(t.utilization_target)} target.")
    live = [r for r in view.runs if r.live]
    memory = view.memory_used_ratio
    if not view.processes and not live and (memory is None or memory <= t.work_memory_used_ratio):
        return Verdict("unused", "unused", "no process, live training run or memory on the GPU: free capacity.")
    found = sorted(((f, r) for r in live for f in r.findings),
                   key=lambda fr: (fr[0].cause.kind != "allocator", -fr[0].value))
    if found:
        (first, run), others = found[0], found[1:]
        cause = first.cause
        title = cause.label if lvl == LOW else f"below target: {cause.label}"
        also = "".join(f" Also {f.cause.label}: {pct(f.value) if f.projected is not None else f'{f.value:.0f}'}"
                       + (f" (at most ~{pct(f.projected)} without it)" if f.projected is not None else "") + "."
                       for f, _ in others)
        reason = f"{first.projection(util)}. {first.reason(run.run, run.rank)}{also}"
        return _suggested(run, Verdict(cause.cause, title, reason, cause.advice, t.runbook_url(cause.anchor), True,
                                       cause.code, lvl, first.projected))
    finished = [r.run for r in view.runs if not r.live]
    gone = f" (run {', '.join(sorted(set(finished)))} finished or stopped pushing)" if finished else ""
    seen = f" {view.evidence_text}" if view.evidence_text else ""
    if not live and view.evidence_hint:
        return _uninstrumented(view, util, t, lvl, gone)
    if util < t.idle_utilization_threshold:
        return _generic("idle_but_allocated", "idle but allocated",
                        f"{pct(util)} utilization while {_holder(view, live)} holds the GPU.{seen}", t, lvl)
    if not live:
        return _generic("not_instrumented", "not instrumented" if lvl == LOW else "below target: not instrumented",
                        f"{pct(util)} utilization (target {pct(t.utilization_target)}) and no live training run "
                        f"reports its phases{gone}.{seen}", t, lvl)
    run = live[0]
    biggest = max(((p, s) for p, s in run.shares.items() if p != "compute"), key=lambda x: x[1], default=None)
    detail = f"; its largest phase besides compute is {biggest[0]} at {pct(biggest[1])}" if biggest else ""
    return _generic("underutilized", "underutilized" if lvl == LOW else "below target: no single cause",
                    f"{pct(util)} utilization (target {pct(t.utilization_target)}); no cause passes its threshold "
                    f"for run {run.run}{detail}.", t, lvl)


def _sampled(pairs: Iterable[tuple[Labels, float]]) -> set[RunKey]:
    """The runs whose phases the exporter sampled (label ``source="sampled"``, gpu_exporter.sampling)."""
    return {_run_key(labels) for labels, _ in pairs if labels.get("source") == "sampled"}


def _suggest(run: RunView, readings: Readings, uuid: str, t: Thresholds) -> RunView:
    """``run`` with the concrete remedies its reported context allows (gpu_exporter.remedies)."""
    if (run.run, run.rank, uuid) in readings.sampled:
        run = replace(run, source="sampled", batch_size=None)  # the sampler sees no batch
    ctx = readings.contexts.get((run.run, run.rank, uuid))
    if ctx is None:
        return run
    found = remedies.suggestions(ctx, run.shares, run.batch_size, readings.utilization.get(uuid),
                                 readings.memory_used.get(uuid), readings.memory_total.get(uuid),
                                 t.remedy_memory_target_ratio)
    return replace(run, suggestions=found)


def _suggested(run: RunView, verdict: Verdict) -> Verdict:
    """``verdict`` with the run's concrete remedy for its cause, first in the remedy and in the reason."""
    if run.source:
        verdict = replace(verdict, reason=f"{verdict.reason} (Phases sampled from the Python stack with py-spy, "
                                          "not reported by the job.)")
    text = run.suggestions.get(verdict.verdict, "")
    if not text:
        return verdict
    return replace(verdict, reason=f"{verdict.reason} {verdict.title.split(': ')[-1]}: {text}.",
                   remedy=f"{text}.\n{verdict.remedy}", suggestion=text)


def _uninstrumented(view: GpuView, util: float, t: Thresholds, lvl: str, gone: str) -> Verdict:
    """Not instrumented, but its processes' evidence passes a hint of causes.HINTS: say what it shows."""
    hint = process_evidence.HINTS_BY_ID[view.evidence_hint]
    title = f"not instrumented: {hint.label}" if lvl == LOW else f"below target: not instrumented, {hint.label}"
    reason = (f"{pct(util)} utilization (target {pct(t.utilization_target)}) and no live training run reports its "
              f"phases{gone}. What /proc shows: {view.evidence_text} That points at {hint.label}.")
    remedy = f"{hint.advice}\nInstrument it to confirm:\n{INSTRUMENT_SNIPPET}"
    runbook = t.runbook_url(process_evidence.EVIDENCE_ALERT.lower())
    return Verdict("not_instrumented", title, reason, remedy, runbook, True, hint.code, lvl)


def _holder(view: GpuView, live: Sequence[RunView]) -> str:
    parts = [f"training run {live[0].run}"] if live else []
    parts += [f"pid {p.pid} {p.name} ({p.memory_bytes / 2**30:.1f} GiB)" for p in view.process_list]
    if not parts:
        return f"{pct(view.memory_used_ratio or 0.0)} of its memory"
    return ", ".join(parts)


def select(views: Sequence[GpuView], node: str | None, namespace: str | None, run: str | None,
           ids: str | None) -> list[GpuView]:
    """The GPUs matching every filter given (node, pod namespace, training run, index or uuid).

    With ``run``, each GPU keeps only that run, so the verdict is the run's.
    """
    wanted = {i.strip() for i in ids.split(",") if i.strip()} if ids else None
    out = [v for v in views
           if (node is None or node in (v.node, v.node.rpartition(":")[0]))
           and (namespace is None or any(p.split("/", 1)[0] == namespace for p in v.pods))
           and (run is None or any(r.run == run for r in v.runs))
           and (wanted is None or v.gpu in wanted or v.uuid in wanted)]
    if run is not None:
        out = [replace(v, runs=tuple(r for r in v.runs if r.run == run)) for v in out]
    return out


def _phase_order(shares: dict[str, float]) -> list[str]:
    standard = [p for p in (*STANDARD_PHASES, OTHER) if p in shares]
    return standard + sorted(p for p in shares if p not in standard)


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def render_text(results: Sequence[tuple[GpuView, Verdict]], window: str, t: Thresholds, out: TextIO,
                unjoined: Sequence[tuple[str, str]] = ()) -> None:
    """Readable report: one block per GPU, the runs without a GPU UUID, then a summary line."""
    for view, verdict in results:
        where = f"  on {view.node}" if view.node else ""
        out.write(f"GPU {view.gpu}  {view.name}  {view.uuid}{where}\n")
        util = "n/a" if view.utilization is None else f"{view.utilization * 100:.1f}%"
        memory = "n/a" if view.memory_used_ratio is None else pct(view.memory_used_ratio)
        procs = f"{view.processes} process{'' if view.processes == 1 else 'es'}"
        out.write(f"  utilization  {util} over {window} (target {pct(t.utilization_target)}, alert below "
                  f"{pct(t.utilization_low_threshold)}), memory {memory} used, {procs}\n")
        for pod in view.pods:
            out.write(f"  pod          {pod}\n")
        for r in view.runs:
            phases = ", ".join(f"{p} {pct(r.shares[p])}" for p in _phase_order(r.shares)) or "no phase time yet"
            basis = "since the run started" if r.since_start else "in the window"
            batch = f", batch {r.batch_size:.0f}" if r.batch_size is not None else ""
            state = " [sampled from the Python stack]" if r.source else ""
            state += "" if r.live else "  [finished or not pushing: ignored]"
            out.write(f"  run          {r.run} (rank {r.rank}): {phases} ({basis}){batch}{state}\n")
        out.write(f"  verdict      {verdict.title}: {verdict.reason}\n")
        if verdict.remedy:
            first, *rest = verdict.remedy.split("\n")
            out.write(f"  remedy       {first}\n")
            out.write("".join(f"                 {line}\n" for line in rest))
        if verdict.runbook:
            out.write(f"  runbook      {verdict.runbook}\n")
        out.write("\n")
    for run, rank in unjoined:
        out.write(f"Run {run} (rank {rank}) is not on any GPU above: {NO_UUID_FIX}.\n\n")
    out.write(run_ranks.render_text(run_ranks.distributed_runs(results)))
    below = sum(v.below_target for _, v in results)
    target = pct(t.utilization_target)
    out.write(f"{below} of {len(results)} GPU(s) below the {target} utilization target.\n" if below else
              f"No GPU with work is below the {target} utilization target ({len(results)} GPU(s) checked).\n")


def _finding_doc(f: Finding) -> dict[str, Any]:
    doc = {"cause": f.cause.cause, "code": f.cause.code, "level": f.level, "value": round(f.value, 4),
           "projected_utilization": None if f.projected is None else round(f.projected, 4)}
    if f.straggler:
        doc.update(straggler=f.straggler, straggler_cause=f.straggler_cause,
                   projected_step_seconds=f.projected_step_seconds)
    return doc


def render_json(results: Sequence[tuple[GpuView, Verdict]], source: str, window_seconds: float, t: Thresholds,
                out: TextIO, unjoined: Sequence[tuple[str, str]] = ()) -> None:
    """Machine-readable report: the source, the window, the thresholds and every GPU with its verdict."""
    doc = {
        "source": source,
        "window_seconds": window_seconds,
        "utilization_target": t.utilization_target,
        "utilization_low_threshold": t.utilization_low_threshold,
        "gpus_below_target": sum(v.below_target for _, v in results),
        "gpus": [{**{k: v for k, v in asdict(view).items() if k not in ("runs", "process_list")},
                  "process_list": [asdict(p) for p in view.process_list],
                  "runs": [{**{k: v for k, v in asdict(r).items() if k != "findings"},
                            "causes": [_finding_doc(f) for f in r.findings]} for r in view.runs],
                  "verdict": asdict(verdict)}
                 for view, verdict in results],
        "runs_without_gpu_uuid": [{"run": run, "rank": rank, "fix": NO_UUID_FIX} for run, rank in unjoined],
        "distributed_runs": run_ranks.to_doc(run_ranks.distributed_runs(results)),
    }
    out.write(json.dumps(doc, indent=2) + "\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``gpu-exporter diagnose``."""
    parser.epilog = ("exit status: 0 no GPU below the target (unused and MIG GPUs do not count), 1 a GPU with work "
                     "below the target, 2 an error (bad flag, unreachable exporter or Prometheus), 130 interrupted")
    parser.add_argument("--url", default=None, metavar="URL",
                        help=f"the node's exporter (default {DEFAULT_URL}); two scrapes --window apart")
    parser.add_argument("--prometheus-url", metavar="URL",
                        help="diagnose from Prometheus instead, reading the recording rules of "
                             "prometheus/rules (a fleet; narrow it with --node/--namespace/--run)")
    parser.add_argument("--window", metavar="DURATION",
                        help=f"time to average over (default {DEFAULT_WINDOW_EXPORTER} with --url; from Prometheus "
                             f"the recording rules' {PROMETHEUS_WINDOW}, any other window is computed for you)")
    parser.add_argument("--at", metavar="TIME",
                        help="with --prometheus-url: judge the window ending at TIME (default now): --at=-8h, Unix "
                             "seconds or 2026-12-03T05:00:00Z")
    parser.add_argument("--node", help="only GPUs of this node (its node or instance label; Prometheus only)")
    parser.add_argument("--namespace", help="only GPUs allocated to pods of this Kubernetes namespace")
    parser.add_argument("--run", dest="run_name", metavar="RUN",
                        help="only the GPUs of this training run, judged by this run alone")
    parser.add_argument("-i", "--id", metavar="ID[,ID...]", help="only these GPUs (indexes or UUIDs)")
    parser.add_argument("--thresholds", metavar="FILE",
                        help="thresholds YAML to judge with (default: the copy packaged with gpu_exporter, "
                             "which prometheus/thresholds.yml links to in a source checkout)")
    parser.add_argument("--output", choices=("text", "json"), default="text", help="text for people, json for tools")


def _window(text: str) -> tuple[float, str]:
    """Seconds and a label (``30s``, ``15m``) of a ``--window`` value: a duration or plain seconds."""
    plain = text.replace(".", "", 1).isdigit()
    try:
        seconds = float(text) if plain else parse_duration(text)
    except ValueError as err:
        raise MetricsError(f"--window: {err}") from None
    if seconds <= 0:
        raise MetricsError(f"--window must be longer than 0 s, not {text!r}")
    return seconds, f"{seconds:g}s" if plain else text


def _wait(seconds: float, url: str, err: TextIO) -> None:
    """Sleep ``seconds``, with a progress line on stderr (rewritten every second on a terminal)."""
    deadline = time.monotonic() + seconds
    tty = err.isatty()
    start, end = ("\r", "") if tty else ("", "\n")
    first = True
    while (left := deadline - time.monotonic()) > 0:
        if tty or first:
            err.write(f"{start}diagnose: second reading of {url} in {math.ceil(left)}s ...{end}")
            err.flush()
            first = False
        time.sleep(min(1.0, left))
    if tty:
        err.write("\r\033[K")
        err.flush()


def run(args: argparse.Namespace) -> int:
    """Run ``gpu-exporter diagnose``; 0 all at target, 1 any GPU with work below target, 2 on errors."""
    try:
        thresholds = load_thresholds(args.thresholds)
    except ThresholdsError as err:
        return fail(str(err))
    try:
        if args.url is not None and args.prometheus_url is not None:
            raise MetricsError("--url and --prometheus-url exclude each other: read one exporter or Prometheus")
        if args.node is not None and args.prometheus_url is None:
            raise MetricsError("--node needs --prometheus-url (an exporter only knows its own node)")
        if args.at is not None and args.prometheus_url is None:
            raise MetricsError("--at needs --prometheus-url (an exporter only knows the present)")
        if args.prometheus_url is not None:
            at = None if args.at is None else parse_time(args.at, "--at")
            prom = Prometheus(args.prometheus_url, at=at)
            seconds, window = _window(args.window or PROMETHEUS_WINDOW)
            ending = "" if at is None else f" ending {iso(at)}"
            if seconds == parse_duration(PROMETHEUS_WINDOW):
                window = f"{PROMETHEUS_WINDOW}{ending} (recording rules)"
                readings = from_prometheus(prom)
            else:
                window = f"{window}{ending} (the rules' signals over that window)"
                readings = from_prometheus_window(prom, seconds)
            source = prom.base
        else:
            seconds, window = _window(args.window or DEFAULT_WINDOW_EXPORTER)
            exporter = ExporterSource(args.url or DEFAULT_URL)
            first = exporter.read()
            _wait(max(0.0, seconds - (time.monotonic() - first.at)), exporter.url, sys.stderr)
            readings, source = from_snapshots(first, read_after(exporter, first.at, 5.0)), exporter.url
        views = select(build_views(readings, thresholds, seconds), args.node, args.namespace, args.run_name, args.id)
        if not views:
            filters = [f"--{flag} {getattr(args, dest)}" for flag, dest in
                       (("node", "node"), ("namespace", "namespace"), ("run", "run_name"), ("id", "id"))
                       if getattr(args, dest) is not None]
            raise MetricsError(f"no GPU matches {' '.join(filters)} at {source}" if filters else
                               f"{source} reports no GPUs")
    except MetricsError as err:
        return fail(str(err))
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    unjoined = [(r, k) for r, k in unjoined_runs(readings) if args.run_name in (None, r)]
    results = [(view, judge(view, thresholds)) for view in views]
    if args.output == "json":
        render_json(results, source, seconds, thresholds, sys.stdout, unjoined)
    else:
        render_text(results, window, thresholds, sys.stdout, unjoined)
    return 1 if any(verdict.below_target for _, verdict in results) else 0


def register(subcommands: dict[str, Any]) -> None:
    """Add ``diagnose`` to the CLI's sub-command registry (``gpu_exporter.cli.SUBCOMMANDS``)."""
    subcommands["diagnose"] = ("say per GPU why it is below the utilization target, and the remedy",
                               add_arguments, run)
