"""What a training job can tell about its own settings, so a verdict can carry numbers.

A remedy such as "more DataLoader workers" only helps when it says how many: the job knows its
DataLoader's ``num_workers``, ``pin_memory``, ``prefetch_factor``, ``persistent_workers`` and batch
size, the CPU cores it may use (its affinity and its cgroup's CPU quota) and the GPU memory it
uses, leaves free and peaked at. Each snapshot carries them in its ``context`` object
(docs/training.md); the exporter exports them as gpu_training_* gauges and the cause table turns
them into concrete suggestions (gpu_exporter.verdict.remedies, formulas in docs/runbooks.md).

Everything here is best effort and off the hot path: the loader is read once per ``run.data()``
call (its attributes, duck-typed: torch is never imported here), the cores once per process, the
GPU memory by the pusher thread, through torch only when the job has initialised CUDA.

>>> class Loader:
...     num_workers, pin_memory, prefetch_factor, persistent_workers, batch_size = 0, False, None, False, 32
>>> loader_settings(Loader())
{'num_workers': 0, 'pin_memory': False, 'persistent_workers': False, 'loader_batch_size': 32}
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any

CGROUP = Path("/sys/fs/cgroup")
"""Root of the cgroup file system (cgroup v2: cpu.max; v1: cpu/cpu.cfs_quota_us and cpu.cfs_period_us)."""


def loader_settings(loader: Any) -> dict[str, Any] | None:
    """The DataLoader settings of ``loader`` (any object with a ``num_workers`` attribute), or None.

    Keys: ``num_workers``, ``pin_memory``, ``persistent_workers``, ``prefetch_factor`` (absent when
    the loader has none: torch sets it to None without workers) and ``loader_batch_size`` (absent
    for a loader with a custom batch sampler or ``batch_size=None``).
    """
    workers = getattr(loader, "num_workers", None)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        return None
    out: dict[str, Any] = {"num_workers": workers,
                           "pin_memory": bool(getattr(loader, "pin_memory", False)),
                           "persistent_workers": bool(getattr(loader, "persistent_workers", False))}
    for key, attribute, least in (("prefetch_factor", "prefetch_factor", 0), ("loader_batch_size", "batch_size", 1)):
        value = getattr(loader, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= least:
            out[key] = value
    return out


def note_loader(run: Any, loader: Any) -> None:
    """Remember ``loader``'s settings on ``run`` (``run.data(loader)`` calls this once per epoch)."""
    if (settings := loader_settings(loader)) is not None:
        run._loader_settings = settings


def cgroup_cpu_limit(root: Path = CGROUP) -> float | None:
    """CPUs the cgroup quota allows (quota / period), or None without a quota.

    >>> import tempfile; d = Path(tempfile.mkdtemp()); _ = (d / "cpu.max").write_text("250000 100000\\n")
    >>> cgroup_cpu_limit(d)
    2.5
    """
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


@functools.cache
def cpu_cores() -> float:
    """CPU cores this process may use: its affinity, capped by the cgroup's CPU quota (read once).

    >>> cpu_cores() >= 1
    True
    """
    try:
        cores = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        cores = float(os.cpu_count() or 1)
    limit = cgroup_cpu_limit()
    return min(cores, limit) if limit else cores


def gpu_memory(device: int) -> dict[str, int] | None:
    """GPU memory used and total of ``device`` and the caching allocator's peak, or None without CUDA.

    >>> gpu_memory(0) is None  # no CUDA on this machine
    True
    """
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        free, total = torch.cuda.mem_get_info(device)
        peak = torch.cuda.max_memory_allocated(device)
    except Exception:  # a broken CUDA setup means "nothing to report"
        return None
    return {"gpu_memory_used_bytes": int(total - free), "gpu_memory_total_bytes": int(total),
            "allocator_peak_bytes": int(peak)}


def snapshot_context(run: Any, device: int) -> dict[str, Any]:
    """The snapshot's ``context`` object for ``run`` (called by the pusher thread)."""
    return {**(getattr(run, "_loader_settings", None) or {}), "cpu_cores": cpu_cores(), **(gpu_memory(device) or {})}
