"""The ``torch.cuda`` subset the training library uses, on top of an :class:`~gpu_exporter.simulate.device.AsyncDevice`.

In a job's process on a CPU-only machine, :func:`install` makes ``torch.cuda`` report one GPU
(the device's UUID) whose events, synchronize and memory figures come from the simulated device,
so the library's CUDA code paths (GPU-truthful phases, ``sync_every``, the allocator figures) run
for real. Tensors stay on the CPU: the job hands the device its GPU work itself
(``device.launch(seconds)``, ``device.item()``). :func:`install` returns the function that undoes it.

>>> import torch  # doctest: +SKIP
>>> undo = install(AsyncDevice("GPU-x"))  # doctest: +SKIP
>>> torch.cuda.is_available()  # doctest: +SKIP
True
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from gpu_exporter.simulate.device import AsyncDevice, DeviceEvent

GIB = 1 << 30


def install(device: AsyncDevice, *, name: str = "NVIDIA H100 80GB HBM3", total_gib: float = 80.0,
            used_gib: float = 20.0) -> Callable[[], None]:
    """Patch ``torch.cuda`` so that it is ``device``; returns the undo function."""
    import torch

    cuda = torch.cuda
    total = int(total_gib * GIB)
    used = int(used_gib * GIB)
    missing = object()

    def synchronize(device_index: Any = None) -> None:
        device.torch_synchronize_calls += 1
        device.synchronize()

    replacements: dict[str, Any] = {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "synchronize": synchronize,
        "Event": lambda enable_timing=False, blocking=False, interprocess=False: _Event(device),
        "get_device_properties": lambda device_index=0: SimpleNamespace(
            name=name, uuid=device.uuid, total_memory=total, major=9, minor=0),
        "memory_stats": lambda device_index=None: {
            "allocated_bytes.all.current": used, "reserved_bytes.all.current": used,
            "num_alloc_retries": 0, "num_ooms": 0},
        "mem_get_info": lambda device_index=None: (total - used, total),
        "max_memory_allocated": lambda device_index=None: used,
    }
    saved = {attr: cuda.__dict__.get(attr, missing) for attr in replacements}
    for attr, value in replacements.items():
        setattr(cuda, attr, value)

    def undo() -> None:
        for attr, value in saved.items():
            if value is missing:
                delattr(cuda, attr)
            else:
                setattr(cuda, attr, value)

    return undo


class _Event(DeviceEvent):
    """``torch.cuda.Event``: ``record(stream=None)`` on the device's one stream."""

    def record(self, stream: Any = None) -> None:
        super().record()
