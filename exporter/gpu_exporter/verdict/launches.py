"""Which launch of a run name ``diagnose --run`` / ``--run-id`` judges.

The problem: a run name may be shared by launches that have nothing to do with each other (a nightly
job, two users' ``train``), and ``diagnose --run NAME`` judged every rank of that name together.
Each launch has its own run id (gpu_training_run_start_timestamp_seconds{run_id}, docs/training.md#run-identity):
``--run-id`` keeps that launch's ranks only, and ``--run NAME`` keeps the latest launch of the name
(by start), with a one-line note when other launches of the name are live too. Ranks of one job that
drew ids of their own (no torchrun) are one launch when they started within
:data:`SAME_JOB_SECONDS` of each other on other ranks, as in ``gpu-exporter report``.

>>> launches = {("train", "0", "GPU-1"): ("a", 100.0), ("train", "0", "GPU-2"): ("b", 500.0)}
>>> keys, note = choose(launches, "train", None)
>>> sorted(keys), note
([('train', '0', 'GPU-2')], "note: run name 'train' is used by 2 live launches; judging the latest, run id b; \
the others: a: pick one with --run-id")
>>> choose(launches, None, "a")[0]
{('train', '0', 'GPU-1')}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpu_exporter.verdict.views import GpuView, RunKey

SAME_JOB_SECONDS = 120.0
"""Launches of one name on other (rank, GPU) pairs that started this close to the latest are its other ranks."""


def choose(launches: dict[RunKey, tuple[str, float]], run: str | None,
           run_id: str | None) -> tuple[set[RunKey] | None, str | None]:
    """(the run keys to judge, or None for no launch filter; a one-line note or None), from ``launches``: (run, rank,
    GPU key) -> (run id, start time). Without ``run_id`` and with one launch of ``run``, no filter."""
    if run_id is not None:
        return {key for key, (ident, _) in launches.items() if ident == run_id
                and (run is None or key[0] == run)}, None
    if run is None:
        return None, None
    by_id: dict[str, tuple[float, set[RunKey]]] = {}
    for key, (ident, start) in launches.items():
        if key[0] == run and ident:
            first, keys = by_id.get(ident, (start, set()))
            by_id[ident] = (min(first, start), keys | {key})
    if len(by_id) < 2:
        return None, None
    order = sorted(by_id, key=lambda ident: by_id[ident][0])
    latest = order[-1]
    start, chosen = by_id[latest]
    ids, others = [latest], []
    for ident in reversed(order[:-1]):
        first, keys = by_id[ident]
        if not keys & chosen and start - first <= SAME_JOB_SECONDS:
            chosen = chosen | keys
            ids.append(ident)
        else:
            others.append(ident)
    note = (f"note: run name {run!r} is used by {len(others) + 1} live launches; judging the latest, run id "
            f"{','.join(reversed(ids))}; the others: {', '.join(others)}: pick one with --run-id") if others else None
    return chosen, note


def keep(views: Sequence[GpuView], chosen: set[RunKey]) -> list[GpuView]:
    """``views`` with only the runs of ``chosen`` (keyed by GPU key, with or without its cluster); GPUs left
    without a run are dropped."""
    out = []
    for view in views:
        gpu_keys = {view.uuid, view.key}
        runs = tuple(r for r in view.runs if any((r.run, r.rank, key) in chosen for key in gpu_keys))
        if runs:
            out.append(replace(view, runs=runs))
    return out
