"""What the node sees of every GPU process without touching it: CPU, worker children, reads, thread state.

A job nobody instrumented reports no phases, yet /proc says a lot about why its GPU waits: a
main process that uses a whole core with no DataLoader worker is decoding batches itself; busy
workers mean the input pipeline is at its limit; a main thread in uninterruptible sleep waits
for storage. For every process NVML lists on a GPU (host PIDs), this collector reads
``/proc/PID/stat``, ``/proc/PID/task/*/children`` and ``/proc/PID/io`` and exports:

* ``gpu_process_cpu_seconds_total``: user + system CPU of the process (all its threads);
* ``gpu_process_children_cpu_seconds_total``: CPU of its child processes, live and exited;
* ``gpu_process_child_processes``: live child processes (DataLoader workers and the like);
* ``gpu_process_read_bytes_total``: bytes the process and its live children read from storage
  (``read_bytes`` of /proc/PID/io; page-cache hits are not counted);
* ``gpu_process_main_thread_state_seconds_total{state}``: seconds the main thread was seen
  ``running`` (R: on a CPU or runnable), ``sleeping`` (S: waiting on a pipe, socket, lock,
  queue or the GPU), ``disk`` (D: blocked on I/O) or ``other``; sampled at each read, the time
  since the previous read of that process is given to the state seen now.

Budget: reading a process costs about 0.06 ms of CPU (docs/benchmarks.md, "Evidence collector with real GPU
processes"). The collector keeps to ``cpu_share`` of one CPU (``evidence.cpu_share``, default 2%): each poll it
earns that share of the time since the previous poll and spends it reading the processes read longest ago (a
process NVML lists for the first time is read at once). Past the budget each process is read every few polls and
its series keep their last values in between, but none waits longer than ``MAX_AGE`` seconds. ``cpu_share`` 0
reads every process at every poll.

Privileges: the PIDs are host PIDs, so the exporter must share the host PID namespace
(``hostPID: true`` in the DaemonSet, ``--pid=host`` for a container). Without it no PID resolves
and this collector exports nothing (it stays successful: nothing is wrong with it).
``/proc/PID/io`` of another user's process needs CAP_SYS_PTRACE (root in the host user namespace
has it); without it ``gpu_process_read_bytes_total`` is left out and the rest still works.
docs/runbooks.md ("Evidence for uninstrumented jobs") says what each reading means.

>>> parse_stat("42 (python3 (x)) R 1 42 42 0 -1 4194304 0 0 0 0 150 50 10 5 20 0 1 0 1 0 0".encode())
Stat(state='R', ppid=1, cpu_ticks=200, children_ticks=15)
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpu_exporter import catalog
from gpu_exporter.collectors.base import Families, PollContext, PollingCollector
from gpu_exporter.nvml import Gpu

log = logging.getLogger(__name__)

STATES = {"R": "running", "S": "sleeping", "D": "disk"}
"""/proc state letters and the ``state`` label value each gets; every other letter is ``other``."""
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
"""Clock ticks per second of the CPU times in /proc/PID/stat."""
CPU_SHARE = 0.02
"""Default share of one CPU the /proc reads may take (config ``evidence.cpu_share``)."""
MAX_AGE = 60.0
"""Seconds after which a process is read whatever the budget (the rules' rates span 5 minutes)."""
MAX_CREDIT_POLLS = 2.0
"""Budget saved up is capped at this many polls' worth (polls of a second at least), so a quiet spell never
buys a long poll."""


@dataclass(frozen=True)
class Stat:
    """The fields of /proc/PID/stat this collector uses (CPU times in clock ticks)."""

    state: str
    ppid: int
    cpu_ticks: int
    """utime + stime: the process, all its threads."""
    children_ticks: int
    """cutime + cstime: its children that exited and were waited for."""


def parse_stat(raw: bytes) -> Stat:
    """Parse /proc/PID/stat; the command name may hold spaces and parentheses, so split after the last ')'."""
    rest = raw[raw.rindex(b")") + 2:].split()
    # rest[0] is field 3 (state); utime, stime, cutime, cstime are fields 14-17
    return Stat(rest[0].decode(), int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14]))


@dataclass(frozen=True)
class Evidence:
    """One reading of a process and its children; ``read_bytes`` is None without the right to read it."""

    state: str
    cpu_seconds: float
    children_cpu_seconds: float
    child_processes: int
    read_bytes: float | None


class ProcReader:
    """Reads processes from a /proc tree (``root``; tests point it elsewhere)."""

    def __init__(self, root: str | Path = "/proc") -> None:
        self.root = Path(root)
        self._prefix = f"{self.root}/"
        self._children_files: bool | None = None

    def stat(self, pid: int) -> Stat | None:
        """The process's stat, or None when it is gone or not in our PID namespace."""
        try:
            with open(f"{self._prefix}{pid}/stat", "rb") as f:  # plain paths: pathlib costs a third of a read
                return parse_stat(f.read())
        except (OSError, ValueError, IndexError):
            return None

    def read_bytes(self, pid: int) -> float | None:
        """``read_bytes`` of /proc/PID/io, or None (no permission, gone, or a kernel without I/O accounting)."""
        try:
            with open(f"{self._prefix}{pid}/io") as f:
                return next((float(line[11:]) for line in f if line.startswith("read_bytes:")), None)
        except OSError:
            return None

    def children(self, pid: int) -> list[int]:
        """Live child processes of ``pid`` (any of its threads may have started them)."""
        if self._children_files is not False:
            try:
                found: list[int] = []
                tasks = f"{self._prefix}{pid}/task/"
                for task in os.listdir(tasks):
                    with open(f"{tasks}{task}/children") as f:
                        found += [int(c) for c in f.read().split()]
                self._children_files = True
                return found
            except FileNotFoundError:
                if self._children_files is not None or not (self.root / str(pid)).exists():
                    return []
                self._children_files = False  # a kernel without CONFIG_PROC_CHILDREN: scan /proc below
            except (OSError, ValueError):
                return []
        pids = (int(entry.name) for entry in self.root.iterdir() if entry.name.isdigit())
        return [child for child in pids if (stat := self.stat(child)) is not None and stat.ppid == pid]

    def evidence(self, pid: int) -> Evidence | None:
        """Everything about ``pid`` and its live children, or None when the process cannot be seen."""
        stat = self.stat(pid)
        if stat is None:
            return None
        children_ticks = stat.children_ticks
        reads = self.read_bytes(pid)
        kids = self.children(pid)
        for child in kids:
            cs = self.stat(child)
            if cs is not None:
                children_ticks += cs.cpu_ticks + cs.children_ticks
            if reads is not None:
                reads += self.read_bytes(child) or 0.0
        return Evidence(STATES.get(stat.state, "other"), stat.cpu_ticks / TICKS, children_ticks / TICKS,
                        len(kids), reads)


class _Counters:
    """Per-process state kept between reads: counters that never go down, state seconds, live children."""

    __slots__ = ("children", "children_cpu", "cpu", "labels", "polled_at", "read_bytes", "state_labels", "states")

    def __init__(self, now: float, labels: list[str]) -> None:
        self.relabel(labels)
        self.cpu = self.children_cpu = 0.0
        self.children = 0
        self.read_bytes: float | None = None
        self.states = dict.fromkeys((*STATES.values(), "other"), 0.0)
        self.polled_at = now

    def relabel(self, labels: list[str]) -> None:
        """gpu, uuid, pid: kept as lists for the rows of every poll (reads are rarer than polls)."""
        self.labels = labels
        self.state_labels = [[*labels, state] for state in (*STATES.values(), "other")]

    def update(self, ev: Evidence, now: float) -> None:
        # A child reaped between two reads moves from "live" to cutime; never let a counter step back.
        self.cpu = max(self.cpu, ev.cpu_seconds)
        self.children_cpu = max(self.children_cpu, ev.children_cpu_seconds)
        self.children = ev.child_processes
        if ev.read_bytes is not None:
            self.read_bytes = max(self.read_bytes or 0.0, ev.read_bytes)
        self.states[ev.state] += max(0.0, now - self.polled_at)
        self.polled_at = now


class EvidenceCollector(PollingCollector):
    """The gpu_process_* evidence series of every process on every GPU (see the module docstring)."""

    name = "evidence"
    hint_hidden = True
    """Log once that a GPU process is outside this PID namespace (the app turns it off for simulated GPUs)."""

    def __init__(self, proc: ProcReader | None = None, cpu_share: float = CPU_SHARE,
                 cpu_clock: Callable[[], float] = time.thread_time) -> None:
        super().__init__()
        self.proc = proc or ProcReader()
        self.cpu_share = cpu_share
        self._cpu_clock = cpu_clock
        self._counters: dict[tuple[str, int], _Counters] = {}
        self._read_at: dict[tuple[str, int], float] = {}
        """When each listed process was last read (visible or not): the oldest are read first."""
        self._due: set[tuple[str, int]] = set()
        """The processes read this poll besides the new ones (chosen by :meth:`poll`)."""
        self._credit = 0.0
        """CPU seconds the budget still allows (negative: spent ahead)."""
        self._cost = 0.0
        """CPU seconds of one read, averaged (0 until the first read)."""
        self._polled_at: float | None = None
        self.reads = 0
        """Processes read so far (each read is three to five /proc files)."""
        self._seen: set[tuple[str, int]] = set()
        self._listed: set[tuple[str, int]] = set()
        self.processes: tuple[tuple[int, str, str], ...] = ()
        """(pid, gpu index, uuid) of the visible GPU processes of the latest poll (read by the stack sampler)."""
        self._polled: list[tuple[int, str, str]] = []
        self._hidden_logged = False

    def reset(self) -> None:
        type(self).__init__(self, self.proc, self.cpu_share, self._cpu_clock)

    def poll(self, ctx: PollContext) -> bool:
        self._seen, self._listed, self._polled = set(), set(), []
        self._due = self._choose(ctx.now)
        return super().poll(ctx)

    def _choose(self, now: float) -> set[tuple[str, int]]:
        """The known processes to read this poll: all within budget, else the oldest reads the budget pays for."""
        elapsed = 0.0 if self._polled_at is None else max(0.0, now - self._polled_at)
        self._polled_at = now
        known = self._read_at
        if self.cpu_share <= 0 or not known:
            return set(known)
        cap = self.cpu_share * MAX_CREDIT_POLLS * max(elapsed, 1.0)
        self._credit = min(self._credit + self.cpu_share * elapsed, cap)
        if self._cost <= 0:
            return set(known)
        affordable = max(0, math.floor(self._credit / self._cost))
        if affordable >= len(known):
            return set(known)
        oldest = sorted(known, key=known.__getitem__)
        due = set(oldest[:affordable])
        due.update(k for k in oldest[affordable:] if now - known[k] >= MAX_AGE)
        return due

    def _read(self, key: tuple[str, int], now: float) -> Evidence | None:
        started = self._cpu_clock()
        ev = self.proc.evidence(key[1])
        cost = max(0.0, self._cpu_clock() - started)
        self._credit -= cost
        self._cost = cost if self.reads == 0 else 0.9 * self._cost + 0.1 * cost
        self.reads += 1
        self._read_at[key] = now
        return ev

    def poll_gpu(self, ctx: PollContext, gpu: Gpu, out: Families) -> None:
        pids = ctx.processes(gpu).keys()
        if not pids:
            return
        cpu = out.of(catalog.GPU_PROCESS_CPU_SECONDS_TOTAL)
        children_cpu = out.of(catalog.GPU_PROCESS_CHILDREN_CPU_SECONDS_TOTAL)
        kids = out.of(catalog.GPU_PROCESS_CHILD_PROCESSES)
        reads = out.of(catalog.GPU_PROCESS_READ_BYTES_TOTAL)
        states = out.of(catalog.GPU_PROCESS_MAIN_THREAD_STATE_SECONDS_TOTAL)
        for pid in sorted(pids):
            key = (gpu.uuid, pid)
            self._listed.add(key)
            counters = self._counters.get(key)
            if key in self._due or key not in self._read_at:
                ev = self._read(key, ctx.now)
                if ev is None:
                    self._counters.pop(key, None)
                    self._note_hidden(pid)
                    continue
                if counters is None:
                    counters = self._counters[key] = _Counters(ctx.now, [*gpu.labels, str(pid)])
                counters.update(ev, ctx.now)
            elif counters is None:
                continue  # not visible when last read
            if counters.labels[0] != gpu.labels[0]:  # the GPU's index changed at a re-discovery
                counters.relabel([*gpu.labels, str(pid)])
            self._seen.add(key)
            self._polled.append((pid, gpu.labels[0], gpu.uuid))
            labels = counters.labels
            cpu.add_metric(labels, counters.cpu)
            children_cpu.add_metric(labels, counters.children_cpu)
            kids.add_metric(labels, counters.children)
            if counters.read_bytes is not None:
                reads.add_metric(labels, counters.read_bytes)
            for state_labels, seconds in zip(counters.state_labels, counters.states.values(), strict=True):
                states.add_metric(state_labels, seconds)

    def _note_hidden(self, pid: int) -> None:
        if not self._hidden_logged:
            self._hidden_logged = True
            # not for e.g. simulated GPUs: their PIDs need not exist here, and hostPID would not help
            if self.hint_hidden:
                log.info("evidence collector: GPU process %d is not in this PID namespace (run the exporter with "
                         "hostPID / --pid=host to export what /proc shows of GPU processes)", pid)

    def finish_poll(self, ctx: PollContext) -> None:
        self._counters = {k: v for k, v in self._counters.items() if k in self._seen}
        self._read_at = {k: v for k, v in self._read_at.items() if k in self._listed}
        self.processes = tuple(self._polled)
