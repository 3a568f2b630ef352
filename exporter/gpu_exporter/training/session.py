"""``training.start`` and ``training.watch_distributed``: a run that reports, and its collectives timed.

The package re-exports both (``from gpu_exporter import training; training.start(...)``); they live
here so that ``hooks`` (``training.watch``) and ``auto`` (zero-code) call them without importing the
package back. Importing this module loads the timing code and the HTTP pusher; importing the package
does not (it loads this module on first use of either name).
"""

from __future__ import annotations

import os
from typing import Any

from . import distributed as _distributed
from .protocol import DEFAULT_MAX_CUSTOM_PHASES, DEFAULT_URL, INGEST_PATH, normalize_url
from .pusher import Pusher
from .run import Run

__all__ = ["start", "watch_distributed"]


def start(name: str, *, url: str | None = None, token: str | None = None, rank: str | int | None = None,
          uuid: str | None = None, device: int | None = None, push_interval: float = 5.0,
          timeout: float = 2.0, sync_every: int = 0, gpu_timing: bool = True,
          max_custom_phases: int = DEFAULT_MAX_CUSTOM_PHASES, world_size: int | None = None,
          run_id: str | None = None, tags: dict[str, str] | None = None) -> Run:
    """Start timing run ``name`` and push its snapshots to the exporter in the background.

    ``url``: exporter base URL (default ``$GPU_EXPORTER_URL``, else http://127.0.0.1:9445);
    ``token``: bearer token (default ``$GPU_EXPORTER_TOKEN``); ``rank``: default ``$RANK`` /
    ``$LOCAL_RANK`` / 0; ``uuid``: GPU UUID (default: found from CUDA_VISIBLE_DEVICES, torch or
    NVML); ``device``: CUDA device index; ``sync_every``: call ``torch.cuda.synchronize()`` at
    phase boundaries on every N-th step so queued GPU work is counted in the phase that issued it
    (0 = never, the default; a diagnostic); ``gpu_timing``: on CUDA, GPU-truthful phases from an event
    at every phase change (the default; see :class:`~gpu_exporter.training.run.GpuClock`);
    ``world_size``: ranks in the job (default ``$WORLD_SIZE``, the process group's size, else 1;
    rank too comes from the process group when ``$RANK`` is unset). When torch.distributed is
    initialized, its collectives are timed as phase ``communication``
    (:func:`watch_distributed`; pass it your DDP model to time the gradient all-reduce too).
    ``run_id``: this launch's id, shared by the job's ranks (default ``$GPU_EXPORTER_RUN_ID``, torchrun's
    rendezvous id, ``$SLURM_JOB_ID``, else one drawn per process: gpu_exporter.training.identity);
    ``tags``: up to 8 ``key: value`` strings (team, user, git revision, ...; also ``$GPU_EXPORTER_TAGS``),
    exported as ``tag_<key>`` labels of ``gpu_training_run_info``.
    Raises ValueError on a bad name or setting.

    >>> from gpu_exporter import training
    >>> run = training.start("bert-base", url="http://127.0.0.1:1", uuid="GPU-0c8b1f1e")  # nothing listens
    >>> with run.phase("compute"):
    ...     pass
    >>> run.step(samples=32)
    >>> run.close()  # the final push fails at once: logged, never raised
    >>> run.closed, run.steps
    (True, 1)
    """
    run = Run(name, rank=rank, uuid=uuid, device=device, sync_every=sync_every, gpu_timing=gpu_timing,
              max_custom_phases=max_custom_phases, world_size=world_size, run_id=run_id, tags=tags)
    try:
        base = normalize_url(url or os.environ.get("GPU_EXPORTER_URL") or DEFAULT_URL)
    except ValueError as err:
        raise ValueError(f"training.start: {err}") from None
    token = token if token is not None else os.environ.get("GPU_EXPORTER_TOKEN") or None
    run.attach(Pusher(run, base + INGEST_PATH, token, push_interval, timeout))
    watch_distributed(run)
    return run


def watch_distributed(run: Run, ddp_model: Any = None) -> bool:
    """Time ``run``'s torch.distributed collectives (and ``ddp_model``'s gradient all-reduce) as ``communication``.

    Call it after ``init_process_group`` with your ``DistributedDataParallel`` model, before the first step; False
    (and nothing done) when the job is not distributed. See gpu_exporter.training.distributed.

    >>> from gpu_exporter.training.run import Run
    >>> watch_distributed(Run("demo"))
    False
    """
    return _distributed.watch(run, ddp_model)
