"""The join: readings of a source -> one :class:`~gpu_exporter.verdict.views.GpuView` per GPU.

Runs are joined to their GPU by GPU key (``uuid``, or cluster and uuid in a fleet); each live
run's causes are found with the cause table (node readings) or taken from the recording rules
(Prometheus readings, ``Readings.findings``), after every rank's shares are known (the straggler
cause compares ranks). Its concrete remedies and the processes' evidence are attached here too,
so :func:`gpu_exporter.verdict.ladder.judge` needs nothing but the view.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gpu_exporter.thresholds import Thresholds
from gpu_exporter.training.protocol import COMPUTE
from gpu_exporter.verdict import evidence, ranks, remedies
from gpu_exporter.verdict.causes import cause_order, find_causes
from gpu_exporter.verdict.efficiency import EFFICIENCY_BY_ID, FP_PIPES
from gpu_exporter.verdict.kinds import Finding
from gpu_exporter.verdict.readings import Keys
from gpu_exporter.verdict.signals import RunSignals
from gpu_exporter.verdict.views import GpuView, Readings, RunKey, RunView, evolve

SM_BATCH = EFFICIENCY_BY_ID["sm_batch_too_small"].cause
"""The SM form of M3, whose remedy is the batch suggestion too."""


def build_views(readings: Readings, t: Thresholds | None = None, window_seconds: float = 0.0) -> list[GpuView]:
    """One GpuView per GPU of ``gpu_info``, with its runs joined by GPU key, in (node, index) order; with
    thresholds ``t``, each live run's causes (found here, or taken from the recording rules)."""
    keys = Keys(cluster_label=readings.cluster_label)
    runs: dict[str, list[RunView]] = {}
    memory = {gpu: used / readings.memory_total[gpu] for gpu, used in readings.memory_used.items()
              if readings.memory_total.get(gpu)}
    memory.update(readings.memory_ratio)
    for key, totals in readings.phase_total.items():
        window = readings.phase_window.get(key, {})
        since_start = sum(v for v in window.values() if v > 0) <= 0
        basis = totals if since_start else window
        total = sum(v for v in basis.values() if v > 0)
        shares = {p: round(max(v, 0.0) / total, 4) for p, v in basis.items()} if total > 0 else {}
        view = RunView(run=key[0], rank=key[1], shares=shares, seconds=total, since_start=since_start,
                       batch_size=readings.batch_size.get(key), allocator_retries=readings.retries.get(key, 0.0),
                       allocator_ooms=readings.ooms.get(key, 0.0), live=key in readings.live,
                       world_size=int(readings.world_size.get(key, 1)), step_seconds=readings.step_seconds.get(key))
        runs.setdefault(key[2], []).append(view)
    cluster = {keys.gpu(labels): labels.get(readings.cluster_label, "") for labels in readings.info
               } if readings.cluster_label else {}
    communication = ranks.communication_by_run((cluster.get(gpu, ""), r) for gpu, rs in runs.items() for r in rs)
    if t is not None:  # judged after every rank's shares are known: the straggler cause compares ranks
        runs = {gpu: [_judged(view, readings, gpu, memory.get(gpu), t, window_seconds,
                              communication.get((cluster.get(gpu, ""), view.run))) for view in views_of_gpu]
                for gpu, views_of_gpu in runs.items()}
    views = []
    for labels in readings.info:
        gpu = keys.gpu(labels)
        procs = tuple(sorted(readings.processes.get(gpu, []), key=lambda p: -p.memory_bytes))
        seen = tuple(readings.evidence.get(gpu, ()))
        text, hint = evidence.explain(gpu, seen, t, readings.hints) if t is not None else ("", None)
        views.append(GpuView(
            uuid=labels.get("uuid", ""), gpu=labels.get("gpu", ""), name=labels.get("name", ""),
            node=labels.get("node") or labels.get("instance", ""),
            utilization=readings.utilization.get(gpu), memory_used_ratio=memory.get(gpu),
            processes=len(procs), pods=tuple(sorted(readings.pods.get(gpu, ()))),
            runs=tuple(sorted(runs.get(gpu, []), key=lambda r: (not r.live, r.run, r.rank))), process_list=procs,
            evidence=seen, evidence_hint=hint[0].name if hint else "",
            evidence_finding=hint[1] if hint else "", evidence_text=text,
            cluster=cluster.get(gpu, ""), **_activity(readings, gpu)))
    return ranks.name_straggler_causes(
        sorted(views, key=lambda v: (v.cluster, v.node, int(v.gpu) if v.gpu.isdigit() else 1 << 30, v.uuid)))


def _activity(readings: Readings, gpu: str) -> dict[str, Any]:
    """The GpuView fields of the GPU's activity readings (None: unknown) and the GPU-level cause the rules found."""
    sm = readings.sm_active.get(gpu)
    return {"sm_active": sm[0] if sm else None, "sm_source": sm[1] if sm else None,
            "efficiency_recorded": readings.efficiency.get(gpu, ""),
            "tensor_active": readings.tensor_active.get(gpu), "dram_active": readings.dram_active.get(gpu),
            **{f"{pipe.key}_active": readings.fp_active.get(pipe.key, {}).get(gpu) for pipe in FP_PIPES}}


def _findings(readings: Readings, key: RunKey, run: RunView, memory: float | None, t: Thresholds,
              window_seconds: float, communication: dict[str, float] | None = None) -> list[Finding]:
    if readings.findings is not None:
        return sorted(readings.findings.get(key, []), key=cause_order)
    util = readings.utilization.get(key[2])
    if util is None or not run.shares:
        return []
    signals = RunSignals(run.shares, run.allocator_retries, run.allocator_ooms, run.batch_size,
                         communication, run.step_seconds, readings.callbacks.get(key), readings.code.get(key),
                         readings.host_functions.get(key))
    return find_causes(util, memory, signals, t, window_seconds)


def _judged(run: RunView, readings: Readings, gpu: str, memory: float | None, t: Thresholds,
            window_seconds: float, communication: dict[str, float] | None) -> RunView:
    """``run`` with its causes (a live run) and the concrete remedies its reported context allows, in one copy."""
    key = (run.run, run.rank, gpu)
    changes: dict[str, Any] = {"code": readings.code[key]} if key in readings.code else {}
    if run.live:
        changes["findings"] = tuple(_findings(readings, key, run, memory, t, window_seconds, communication))
    batch = run.batch_size
    if key in readings.sampled:
        changes.update(source="sampled", batch_size=None)  # the stack sampler sees no batch
        batch = None
    ctx = readings.contexts.get(key)
    causes = {f.cause.cause: f.cause for f in changes.get("findings", run.findings)}
    if ctx is not None and causes:
        changes["suggestions"] = remedies.suggestions(ctx, causes.values(), run.shares, batch,
                                                      readings.utilization.get(gpu), readings.memory_used.get(gpu),
                                                      readings.memory_total.get(gpu), t.remedy_memory_target_ratio)
    sm, busy = readings.sm_active.get(gpu), readings.utilization.get(gpu)
    if (ctx is not None and run.live and not causes and busy is not None and busy >= t.utilization_target
            and sm is not None and sm[0] < t.sm_active_low and run.shares.get(COMPUTE)):
        # the SM form of M3 (verdict/efficiency.py), which a busy GPU only gets (a run with a cause of its own is
        # below the target): the batch that fills the SMs, from the SM activity in compute
        text = remedies.batch_suggestion(ctx, batch, sm[0], run.shares[COMPUTE], readings.memory_used.get(gpu),
                                         readings.memory_total.get(gpu), t.remedy_memory_target_ratio)
        if text:
            changes["suggestions"] = {**changes.get("suggestions", {}), SM_BATCH: text}
    return evolve(run, **changes) if changes else run


def unjoined_runs(readings: Readings) -> list[tuple[str, str]]:
    """(run, rank) of the runs whose snapshots carry no GPU UUID."""
    return sorted({(run, rank) for run, rank, gpu in readings.phase_total if not gpu})


def select(views: Sequence[GpuView], node: str | None, namespace: str | None, run: str | None,
           ids: str | None) -> list[GpuView]:
    """The GPUs matching every filter given (node, pod namespace, training run, index or uuid); with ``run``, each
    GPU keeps only that run, so the verdict is the run's."""
    wanted = {i.strip() for i in ids.split(",") if i.strip()} if ids else None
    out = [v for v in views
           if (node is None or node in (v.node, v.node.rpartition(":")[0]))
           and (namespace is None or any(p.split("/", 1)[0] == namespace for p in v.pods))
           and (run is None or any(r.run == run for r in v.runs))
           and (wanted is None or v.gpu in wanted or v.uuid in wanted)]
    if run is not None:
        out = [replace(v, runs=tuple(r for r in v.runs if r.run == run)) for v in out]
    return out
