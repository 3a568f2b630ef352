"""``diagnose``'s renderings: the verdicts of the GPUs as text for people or JSON for tools.

Both take the (view, verdict) pairs of :func:`gpu_exporter.verdict.ladder.judge`, the runs that
could not be joined to a GPU, and the thresholds (for the target and low lines they quote).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import is_dataclass
from typing import Any, TextIO

from gpu_exporter.thresholds import Thresholds
from gpu_exporter.training.protocol import phase_order
from gpu_exporter.verdict import ranks
from gpu_exporter.verdict.format import pct
from gpu_exporter.verdict.kinds import Finding
from gpu_exporter.verdict.views import GpuView, Verdict

NO_UUID_FIX = ("its snapshots carry no GPU UUID, so it cannot be joined to a GPU: start the job with "
               "CUDA_VISIBLE_DEVICES=GPU-<uuid> (nvidia-smi -L lists the UUIDs) or pass "
               "training.start(..., uuid=\"GPU-<uuid>\")")


def render_text(results: Sequence[tuple[GpuView, Verdict]], window: str, t: Thresholds, out: TextIO,
                unjoined: Sequence[tuple[str, str]] = ()) -> None:
    """Readable report: one block per GPU, the runs without a GPU UUID, then a summary line."""
    for view, verdict in results:
        where = (f"  on {view.node}" if view.node else "") + (f"  in cluster {view.cluster}" if view.cluster else "")
        out.write(f"GPU {view.gpu}  {view.name}  {view.uuid}{where}\n")
        util = "n/a" if view.utilization is None else f"{view.utilization * 100:.1f}%"
        memory = "n/a" if view.memory_used_ratio is None else pct(view.memory_used_ratio)
        procs = f"{view.processes} process{'' if view.processes == 1 else 'es'}"
        out.write(f"  utilization  {util} over {window} (target {pct(t.utilization_target)}, alert below "
                  f"{pct(t.utilization_low_threshold)}), memory {memory} used, {procs}\n")
        out.write(f"  effective    {verdict.effective}\n")
        if verdict.idle is not None:
            out.write(f"  idle         {verdict.idle.text()}\n")
        out.write("".join(f"  pod          {pod}\n" for pod in view.pods))
        for r in view.runs:
            phases = ", ".join(f"{p} {pct(r.shares[p])}" for p in phase_order(r.shares)) or "no phase time yet"
            basis = "since the run started" if r.since_start else "in the window"
            batch = f", batch {r.batch_size:.0f}" if r.batch_size is not None else ""
            state = " [sampled from the Python stack]" if r.source else ""
            state += "" if r.live else "  [finished or not pushing: ignored]"
            out.write(f"  run          {r.run} (rank {r.rank}): {phases} ({basis}){batch}{state}\n")
        out.write(f"  verdict      {verdict.title}: {verdict.reason}\n")
        if verdict.worth is not None:
            out.write(f"  worth        {pct(verdict.worth)} of the GPU between busy and effective: "
                      f"{verdict.worth:.2f} GPU-hours an hour\n")
        if verdict.remedy:
            out.write("  remedy       " + verdict.remedy.replace("\n", "\n                 ") + "\n")
        if verdict.runbook:
            out.write(f"  runbook      {verdict.runbook}\n")
        out.write("\n")
    for run, rank in unjoined:
        out.write(f"Run {run} (rank {rank}) is not on any GPU above: {NO_UUID_FIX}.\n\n")
    out.write(ranks.render_text(ranks.distributed_runs(results)))
    below = sum(v.below_target for _, v in results)
    target = pct(t.utilization_target)
    out.write(f"{below} of {len(results)} GPU(s) below the {target} utilization target.\n" if below else
              f"No GPU with work is below the {target} utilization target ({len(results)} GPU(s) checked).\n")
    ineffective = sum(v.worth is not None for _, v in results)
    if ineffective:
        out.write(f"{ineffective} busy GPU(s) not used effectively: SM activity below "
                  f"{pct(t.sm_active_low)}, or the tensor cores idle (the verdicts above).\n")


def _finding_doc(f: Finding) -> dict[str, Any]:
    doc = {"cause": f.cause.cause, "code": f.cause.code, "level": f.level, "value": round(f.value, 4),
           "projected_utilization": None if f.projected is None else round(f.projected, 4)}
    if f.straggler:
        doc.update(straggler=f.straggler, straggler_cause=f.straggler_cause,
                   projected_step_seconds=f.projected_step_seconds)
    return doc


def _fields(value: Any) -> Any:
    """What the JSON encoder cannot write itself (its ``default``): a dataclass as the dict of its fields. The C
    encoder walks everything else: no Python call per field, no deep copy (``dataclasses.asdict``)."""
    if is_dataclass(value) and not isinstance(value, type):  # a dataclass's __dict__ holds its fields, in order
        return vars(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _without(value: Any, *names: str) -> dict[str, Any]:
    return {key: field for key, field in vars(value).items() if key not in names}


def _gpu_doc(view: GpuView, verdict: Verdict) -> dict[str, Any]:
    doc = _without(view, "runs", "process_list", "efficiency_recorded")  # the verdict names it
    doc["process_list"] = [vars(p) for p in view.process_list]  # the encoder's default (_fields) per process costs more
    doc["runs"] = [{**_without(r, "findings"), "causes": [_finding_doc(f) for f in r.findings]} for r in view.runs]
    doc["verdict"] = {"verdict": verdict.name, **_without(verdict, "name")}
    return doc


def render_json(results: Sequence[tuple[GpuView, Verdict]], source: str, window_seconds: float, t: Thresholds,
                out: TextIO, unjoined: Sequence[tuple[str, str]] = ()) -> None:
    """Machine-readable report: the source, the window, the thresholds and every GPU with its verdict."""
    write_json({
        "source": source,
        "window_seconds": window_seconds,
        "utilization_target": t.utilization_target,
        "utilization_low_threshold": t.utilization_low_threshold,
        "gpus_below_target": sum(v.below_target for _, v in results),
        "gpus": [_gpu_doc(view, verdict) for view, verdict in results],
        "runs_without_gpu_uuid": [{"run": run, "rank": rank, "fix": NO_UUID_FIX} for run, rank in unjoined],
        "distributed_runs": ranks.to_doc(ranks.distributed_runs(results)),
    }, out)


def write_json(doc: dict[str, Any], out: TextIO) -> None:
    """Write ``doc`` as JSON with a key per line and each item of a list at the top on a line of its own (a GPU a
    line), piece by piece: the C encoder writes each line (``json.dumps`` with ``indent`` runs the pure-Python one),
    to ``out`` as it goes (joining 25 MB of text at 10,000 GPUs first took a third of the render).

    >>> import sys
    >>> write_json({"a": 1, "gpus": [{"uuid": "GPU-1"}, {"uuid": "GPU-2"}], "none": []}, sys.stdout)
    {
      "a": 1,
      "gpus": [
        {"uuid": "GPU-1"},
        {"uuid": "GPU-2"}
      ],
      "none": []
    }
    """
    encode = json.JSONEncoder(default=_fields).encode
    for i, (key, value) in enumerate(doc.items()):
        out.write(f"{',' if i else '{'}\n  {encode(key)}: ")
        if isinstance(value, list) and value:
            for j, item in enumerate(value):
                out.write(f"{',' if j else '['}\n    {encode(item)}")
            out.write("\n  ]")
        else:
            out.write(encode(value))
    out.write("\n}\n")
