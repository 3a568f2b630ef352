"""The simulated nodes the exporters run on: generated scenarios and real host processes.

Simulated GPU processes carry the PIDs of real, sleeping host processes, because a peer that
looks each GPU process up on the host (nvitop reads its user, command and CPU through psutil)
must pay that cost as it would on a real node. Example::

    with Sleepers(64) as pids:
        path = write_scenario(tmp_dir, gpus=8, pids=pids)
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import yaml

GPU_MODEL = "NVIDIA H100 80GB HBM3"
MEMORY_GIB = 80
MAX_GPUS = 64
BUSES = 28
"""PCI buses 0x18, 0x20, ... 0xF0 per PCI domain; GPU 28 and later go to the next domain."""


def scenario_document(gpus: int, pids: Sequence[int]) -> dict[str, object]:
    """A scenario with ``gpus`` H100s and one process per PID, spread round-robin over the GPUs.

    >>> doc = scenario_document(2, [10, 11, 12])
    >>> [len(g["processes"]) for g in doc["gpus"]]
    [2, 1]
    """
    if not 1 <= gpus <= MAX_GPUS:
        raise ValueError(f"a bench scenario has 1 to {MAX_GPUS} GPUs, got {gpus}")
    per_gpu: list[list[int]] = [[] for _ in range(gpus)]
    for i, pid in enumerate(pids):
        per_gpu[i % gpus].append(pid)
    docs = []
    for index, gpu_pids in enumerate(per_gpu):
        share = min(1.0, (MEMORY_GIB * 0.9) / max(1, len(gpu_pids)))
        docs.append({
            "name": GPU_MODEL,
            "architecture": "hopper",
            "memory_gib": MEMORY_GIB,
            "pci_bus_id": f"{index // BUSES:08X}:{0x18 + 0x08 * (index % BUSES):02X}:00.0",
            "utilization": {"constant": round(0.2 + 0.7 * index / max(1, gpus - 1), 3), "noise": 0.05},
            "memory_utilization": {"constant": 0.2, "noise": 0.03},
            "power_limit_watts": 700,
            "power_watts": {"idle": 72, "busy": 640},
            "processes": [{"pid": pid, "name": f"python worker.py --rank {n}", "memory_gib": round(share, 3)}
                          for n, pid in enumerate(gpu_pids)],
        })
    return {"driver_version": "550.54.15", "cuda_version": "12.4", "gpus": docs}


def write_scenario(folder: Path, gpus: int, pids: Sequence[int]) -> Path:
    """Write the scenario for ``gpus`` GPUs and ``pids`` into ``folder``; returns its path."""
    path = folder / f"node-{gpus}gpu-{len(pids)}proc.yaml"
    path.write_text(yaml.safe_dump(scenario_document(gpus, pids), sort_keys=False))
    return path


class Sleepers:
    """``count`` real sleeping host processes whose PIDs stand in for GPU processes."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> list[int]:
        sleep = shutil.which("sleep")
        if sleep is None:
            raise RuntimeError("bench: the `sleep` command is missing (coreutils); it provides the host processes")
        try:
            for _ in range(self.count):
                self._procs.append(subprocess.Popen([sleep, "86400"], stdin=subprocess.DEVNULL,
                                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        except BaseException:
            self._stop()
            raise
        return [p.pid for p in self._procs]

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop()

    def _stop(self) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            proc.wait()
        self._procs.clear()
