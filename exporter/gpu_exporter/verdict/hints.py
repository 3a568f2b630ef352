"""The evidence table: what /proc shows of a GPU process nobody instrumented, and what it points at.

Its one job is :data:`HINTS` and its judge. A job that reports no phases still shows, from /proc
(collectors/evidence.py), how its main process and its workers use the CPU and whether its main thread
waits on storage (:class:`ProcessSignals`). Each :class:`Hint` is a condition on those readings and the cause
it points at; monitoring/evidence.py generates the recording rule ``process:gpu_process_hint:value`` and the
alert :data:`EVIDENCE_ALERT` from the table, :func:`find_hints` applies it for diagnose
(gpu_exporter.verdict.evidence reads the processes).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpu_exporter import catalog
from gpu_exporter.verdict.format import Labelled, cores, pct
from gpu_exporter.verdict.levels import threshold

if TYPE_CHECKING:
    from gpu_exporter.thresholds import Thresholds

__all__ = ["EVIDENCE_ALERT", "HINTS", "HINTS_BY_ID", "MAIN_BUSY", "STORAGE_WAIT", "WORKERS_BUSY", "Hint",
           "ProcessSignals", "find_hints", "hint_text"]

MAIN_BUSY, WORKERS_BUSY, STORAGE_WAIT = "main_busy", "workers_busy", "storage_wait"
"""The hints' ids: the main thread loads batches itself, the workers are saturated, the main thread waits on I/O."""


@dataclass(frozen=True)
class ProcessSignals:
    """What the node saw of one GPU process over the window (rates from the gpu_process_* counters).

    ``cpu_cores``: CPU seconds per second of the process (1.0 = one whole core);
    ``children_cpu_cores``: the same for its child processes; ``states``: share of the window its
    main thread was running / sleeping / disk / other; ``read_bytes_per_second`` None without the
    right to read /proc/PID/io."""

    pid: str
    cpu_cores: float
    children_cpu_cores: float
    child_processes: int
    states: Mapping[str, float]
    read_bytes_per_second: float | None = None
    name: str = ""

    def describe(self) -> str:
        """``"pid 4242 (python): the main process uses 98% of one core with 0 worker processes, ..."``."""
        who = f"pid {self.pid}" + (f" ({self.name})" if self.name else "")
        workers = (f"{self.child_processes} worker process{'' if self.child_processes == 1 else 'es'}"
                   + (f" using {cores(self.children_cpu_cores)}" if self.child_processes else ""))
        states = ", ".join(f"{_STATE_WORDS.get(s, s)} {pct(v)}" for s, v in
                           sorted(self.states.items(), key=lambda sv: -sv[1]) if v >= 0.005)
        reads = ("" if self.read_bytes_per_second is None else
                 f"; it reads {self.read_bytes_per_second / 2**20:.1f} MiB/s from storage")
        return (f"{who}: the main process uses {cores(self.cpu_cores)} with {workers}; its main thread is "
                f"{states or 'not sampled yet'}{reads}")


_STATE_WORDS = {"running": "runnable", "disk": "in disk wait"}


@dataclass(frozen=True)
class Hint(Labelled):
    """One row of the evidence table: a condition on a process's readings and what it points at.

    A process passes it when ``children`` holds for its child processes and ``compare`` holds for the
    value ``read`` from it and the threshold ``keys[0]``; ``promql`` is the same condition on one process
    (monitoring/evidence.py), its value the reading. ``per_core``: the value is CPU cores, not a share."""

    name: str
    code: str
    title: str
    keys: tuple[str, ...]
    finding: str
    advice: str
    read: Callable[[ProcessSignals], float]
    children: Callable[[int], bool]
    compare: Callable[[float, float], bool]
    promql: str
    per_core: bool = False


EVIDENCE_ALERT = "GpuUninstrumentedInputBound"
"""The alert of every hint (label ``hint`` tells them apart); its runbook section explains the evidence."""

HINTS: tuple[Hint, ...] = (
    Hint(STORAGE_WAIT, "M1", "likely input-bound on storage", ("evidence_io_wait_share",),
         finding="its main thread is blocked on I/O (state D) for {value} of the time",
         advice="M1: the job waits for storage: copy or cache the data set on local disk or in memory, read "
                "fewer larger files (shards), and overlap reading with compute with DataLoader(num_workers=N, "
                "prefetch_factor=4); then instrument it to measure the data phase.",
         read=lambda p: p.states.get("disk", 0.0), children=lambda n: True, compare=operator.gt,
         promql=f'max without (state) ({catalog.PROCESS_MAIN_THREAD_STATE_SHARE5M.name}{{state="disk"}})'
                " > ${evidence_io_wait_share}"),
    Hint(MAIN_BUSY, "M1", "likely input-bound", ("evidence_busy_core_ratio",),
         finding="its main thread is runnable (on a CPU or waiting for one) {value} of the time with 0 worker "
                 "processes while the GPU waits",
         advice="M1: the main process loads and decodes every batch itself: raise DataLoader(num_workers=N) "
                "(N up to the cores the job may use), pin_memory=True, persistent_workers=True; instrument it "
                "(gpu_exporter.training) to confirm the data phase.",
         # runnable, not CPU seconds: a loaded node must not hide a CPU-bound job
         read=lambda p: p.states.get("running", 0.0), children=lambda n: n == 0, compare=operator.ge,
         promql=f'max without (state) ({catalog.PROCESS_MAIN_THREAD_STATE_SHARE5M.name}{{state="running"}})'
                f" >= ${{evidence_busy_core_ratio}}\nand\n{catalog.GPU_PROCESS_CHILD_PROCESSES.name} == 0"),
    Hint(WORKERS_BUSY, "M1", "likely input-bound, workers saturated", ("evidence_busy_core_ratio",),
         finding="each of its worker processes uses {value} (all busy) while the GPU waits",
         advice="M1: every DataLoader worker is busy: more workers if the job has spare cores, cheaper decoding "
                "or augmentation (on the GPU, e.g. DALI), or cache decoded samples; instrument it to confirm.",
         read=lambda p: p.children_cpu_cores / p.child_processes if p.child_processes else 0.0,
         children=lambda n: n > 0, compare=operator.ge, per_core=True,
         promql=f"{catalog.PROCESS_CHILDREN_CPU_RATE5M.name}\n/\n({catalog.GPU_PROCESS_CHILD_PROCESSES.name} > 0)\n"
                ">= ${evidence_busy_core_ratio}"),
)
"""Every hint, in the order diagnose prefers them."""

HINTS_BY_ID: dict[str, Hint] = {h.name: h for h in HINTS}


def find_hints(p: ProcessSignals, t: Thresholds) -> list[tuple[Hint, float]]:
    """Every hint of :data:`HINTS` the readings of ``p`` pass, with the value that passes (table order).

    The caller applies them only to a GPU below target with no live reported run (the PromQL
    of monitoring/evidence.py does the same; tests/test_evidence.py checks they agree).

    >>> from gpu_exporter.thresholds import load_thresholds
    >>> t = load_thresholds()
    >>> [h.name for h, _ in find_hints(ProcessSignals("1", 0.98, 0.0, 0, {"running": 0.97, "sleeping": 0.03}), t)]
    ['main_busy']
    """
    found = ((hint, hint.read(p)) for hint in HINTS if hint.children(p.child_processes))
    return [(hint, value) for hint, value in found if hint.compare(value, threshold(t, hint.keys[0]))]


def hint_text(hint: Hint, value: float) -> str:
    """The hint's finding with its value: ``"the main process uses 98% of one core with 0 worker ..."``."""
    return hint.finding.format(value=cores(value) if hint.per_core else pct(value))
