"""The document a run's pusher sends: everything the exporter learns of one training process, in one snapshot.

The problem: the exporter knows a training process only by what it pushes, pushes get lost, and counters
must never go down within one process (the ingest refuses a ``decreasing_counter``). So each snapshot is
cumulative (phase seconds, steps and samples since the start) and says who sends it (run, run id, rank,
GPU uuid, pid, ``started_at``), beside the optional sections the run has: tags, the CPU clock's phases
next to GPU-truthful ones, allocator figures, the loader's and the machine's context, the job's callbacks
and its code (the stack sampler). :func:`document` builds it for ``Run.snapshot`` (training/run.py) on the
pusher thread; the schema is in docs/training.md ("Snapshot schema"), its checks in training/protocol.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import context as _context
from .protocol import SCHEMA_VERSION
from .sampler import StackSampler


def document(run: Any, finished: bool, pid: int, cpu_phases: Callable[[], dict[str, float]] | None,
             allocator: Callable[[int], dict[str, int] | None], sampler: StackSampler | None) -> dict[str, Any]:
    """The cumulative snapshot of ``run`` (a :class:`~gpu_exporter.training.run.Run`, which imports this module,
    hence ``Any``); ``finished`` for the last one. The rest are the run's own: the process id, its CPU-clock
    phases when its phases are GPU-truthful (else None), its allocator reader and its stack sampler (or None)."""
    uuid, index = run.identity()
    body: dict[str, Any] = {
        "version": SCHEMA_VERSION, "run": run.name, "run_id": run.run_id, "rank": run.rank, "uuid": uuid,
        "started_at": run.started_at, "pid": pid, "phases": run.phase_seconds(finished),
        "current_phase": "" if finished else run.current_phase.name, "steps": run.steps, "samples": run.samples,
        "batch_size": run.batch_size, "world_size": run.world_size, "finished": finished}
    optional = {"tags": run.tags or None, "cpu_phases": None if cpu_phases is None else cpu_phases(),
                "allocator": allocator(index), "context": _context.snapshot_context(run, index),
                "callbacks": None if run.callback_report is None else run.callback_report(),
                "code": None if sampler is None else sampler.snapshot()}
    return body | {key: value for key, value in optional.items() if value is not None}
