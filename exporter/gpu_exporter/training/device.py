"""Find out which GPU and rank a training process uses, and read torch's allocator figures.

Everything here is best effort and never imports torch: torch is used only when the job has
already imported it (importing it here would cost seconds in jobs that do not use it), and
pynvml only as the last resort for the GPU UUID. Example::

    >>> resolve_uuid("GPU-1234", device=0)
    'GPU-1234'
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from .protocol import check_label

_UUID_PREFIXES = ("GPU-", "MIG-")
log = logging.getLogger("gpu_exporter.training")
_warned = threading.Event()

NO_UUID_WARNING = (
    "gpu_exporter.training: cannot tell which GPU this process uses (CUDA_VISIBLE_DEVICES names no GPU UUID, "
    "torch has no CUDA device, NVML has no driver); the run's phases are pushed without a uuid and join no GPU: "
    "pass training.start(..., uuid=\"GPU-...\") or set CUDA_VISIBLE_DEVICES=GPU-... "
    "(gpu-exporter query --query-gpu=index,uuid lists them)")
"""Logged once per process when :func:`resolve_uuid` finds nothing."""


def _torch_cuda_available() -> bool:
    try:
        return bool(sys.modules["torch"].cuda.is_available())
    except Exception:  # torch not imported by the job, or a broken CUDA setup, means "no CUDA" here
        return False


def resolve_device(explicit: int | None) -> int:
    """The CUDA device index (among the visible ones) this process uses.

    ``explicit``, else torch's current device when CUDA is initialised, else ``$LOCAL_RANK``, else 0.

    >>> resolve_device(1)
    1
    """
    if explicit is not None:
        return explicit
    torch = sys.modules.get("torch")
    with contextlib.suppress(Exception):  # CUDA broken: fall back to the environment
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    try:
        return int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        return 0


def resolve_uuid(explicit: str | None, device: int) -> str:
    """The UUID of the GPU (or MIG instance) behind visible CUDA device ``device``; "" if unknown.

    Tried in order: ``explicit``; ``CUDA_VISIBLE_DEVICES`` when it lists UUIDs; torch's device
    properties when torch with CUDA is loaded; NVML (pynvml) for the physical index that
    ``CUDA_VISIBLE_DEVICES`` maps ``device`` to. NVML numbers GPUs in PCI bus order; CUDA does
    too only with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so on mixed-model nodes pass the UUID.
    When all of them fail it logs :data:`NO_UUID_WARNING` once per process (a job on a CPU, or
    one that cannot see its GPU, would otherwise push phases that silently join nothing).

    >>> import os; os.environ["CUDA_VISIBLE_DEVICES"] = "GPU-aa,GPU-bb"
    >>> resolve_uuid(None, 1)
    'GPU-bb'
    """
    if explicit is not None:
        return explicit
    uuid = _find_uuid(device)
    if not uuid and not _warned.is_set():
        _warned.set()
        log.warning(NO_UUID_WARNING)
    return uuid


def _find_uuid(device: int) -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in visible.split(",")] if visible is not None else None
    if entries is not None:
        if device >= len(entries) or not entries[device]:
            return ""
        if entries[device].startswith(_UUID_PREFIXES):
            return entries[device]
    if from_torch := _torch_uuid(device):
        return from_torch
    if entries is None:
        return _nvml_uuid(device)
    try:
        return _nvml_uuid(int(entries[device]))
    except ValueError:
        return ""


def _torch_uuid(device: int) -> str:
    if not _torch_cuda_available():
        return ""
    try:
        uuid = str(sys.modules["torch"].cuda.get_device_properties(device).uuid)
    except Exception:  # old torch without .uuid, or a bad index
        return ""
    return uuid if uuid.startswith(_UUID_PREFIXES) else "GPU-" + uuid


def _nvml_uuid(index: int) -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no pynvml, or no driver
        return ""
    try:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
        return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    except Exception:  # bad index, lost GPU
        return ""
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


class GpuIdentity:
    """A run's (GPU UUID or "", CUDA device index), found once on first call (may ask torch or NVML), from any thread.

    A UUID that is no valid label (the exporter would refuse the snapshot) becomes "".

    >>> GpuIdentity("GPU-1", 0)()
    ('GPU-1', 0)
    """

    def __init__(self, uuid: str | None, device: int | None) -> None:
        self._explicit_uuid, self._explicit_device = uuid, device
        self._identity: tuple[str, int] | None = None
        self._lock = threading.Lock()

    def __call__(self) -> tuple[str, int]:
        with self._lock:
            if self._identity is None:
                index = resolve_device(self._explicit_device)
                uuid = resolve_uuid(self._explicit_uuid, index)
                self._identity = (uuid if check_label("uuid", uuid) is None else "", index)
            return self._identity


ALLOCATOR_STATS = {"allocated_bytes": "allocated_bytes.all.current", "reserved_bytes": "reserved_bytes.all.current",
                   "retries": "num_alloc_retries", "ooms": "num_ooms"}
"""The snapshot's ``allocator`` fields and the ``torch.cuda.memory_stats`` keys they are read from."""


def allocator_stats(device: int) -> dict[str, int] | None:
    """torch's caching-allocator figures for ``device``, or None without initialised CUDA.

    Called from the pusher thread only, never on the training hot path.

    >>> allocator_stats(0) is None  # no CUDA on this machine
    True
    """
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        stats = torch.cuda.memory_stats(device)
    except Exception:
        return None
    return {key: int(stats.get(stat, 0)) for key, stat in ALLOCATOR_STATS.items()}


def synchronizer(device: int) -> Callable[[], None] | None:
    """A function that waits for all queued CUDA work on ``device``, or None without CUDA.

    >>> synchronizer(0) is None  # no CUDA on this machine
    True
    """
    return functools.partial(sys.modules["torch"].cuda.synchronize, device) if _torch_cuda_available() else None


def timing_event_factory() -> Callable[[], Any] | None:
    """A function that makes a timing CUDA event (``torch.cuda.Event(enable_timing=True)``), or None without CUDA.

    >>> timing_event_factory() is None  # no CUDA on this machine
    True
    """
    return functools.partial(sys.modules["torch"].cuda.Event, enable_timing=True) if _torch_cuda_available() else None
