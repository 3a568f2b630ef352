"""The channel between a simulated GPU's job and the exporter: what the device did, second by second.

A job's simulated device (:mod:`gpu_exporter.simulate.device`) appends to ``DIR/<uuid>.busy`` one line
per chunk of at most :data:`CHUNK_SECONDS` (or one longer interval)::

    START END BUSY SM TENSOR DRAM FP32 FP16 FP64

``START``/``END``: seconds of ``CLOCK_MONOTONIC`` (``time.monotonic()``, one clock for every process of the
machine); ``BUSY``: the seconds within the chunk that a kernel ran (NVML's utilization); ``SM``, ``TENSOR``,
``DRAM``: SM-, tensor-pipe- and DRAM-bandwidth-seconds within it, each a kernel's share times its busy
seconds (a kernel with ``sm=0.25`` busy for 4 ms adds 1 ms of SM activity); ``FP32``, ``FP16``, ``FP64``: the
seconds of the fp32, fp16 and fp64 pipes (DCGM's PIPE_FP*_ACTIVE), the same way. Lines of older writers still
parse: ``START END`` is busy all through, a line without the last six ran the default :class:`Kernel`
(``sm=0.9, tensor=0.6, dram=0.3``, no fp pipes), and one without the last three no fp pipes. ``DIR`` is
``$GPU_SIM_DEVICE_DIR``, else ``gpu-exporter-sim-device`` in the temp dir.

The exporter's side reads the file with :class:`DeviceTrace`; the job's side writes it with
:class:`ChannelWriter`. Both keep the chunks in :class:`Chunks`, whose integrals are exact to the chunk.

>>> c = Chunks(); c.add(0.0, 0.004, kernel=Kernel(sm=0.25, tensor=0.0, dram=0.1, fp32=0.5))
>>> [round(x, 6) for x in c.activity(0.0, 1.0)]  # busy, SM, tensor, DRAM, FP32, FP16, FP64 seconds
[0.004, 0.001, 0.0, 0.0004, 0.002, 0.0, 0.0]
"""

from __future__ import annotations

import bisect
import math
import os
import tempfile
import threading
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NamedTuple

CHANNEL_ENV = "GPU_SIM_DEVICE_DIR"
"""Environment variable naming the channel directory (both sides read it)."""
SETTLE_SECONDS = 0.5
"""How far behind real time a device GPU's NVML samples are taken. The writer flushes every 10 ms, but on a
loaded machine its thread can wake up much later, and a sample taken before its chunks are in would stay idle."""
FLUSH_SECONDS = 0.01
CHUNK_SECONDS = 0.001
"""Busy intervals within this span are kept (and written) as one chunk with their busy seconds: an ops-mode
device makes tens of thousands of intervals a second, a few microseconds apart, and the idle gaps between them
(Python between two small ops: launch overhead) are what M3 is about, so they are summed, never merged away."""


@dataclass(frozen=True)
class Kernel:
    """The shares of the GPU a kernel uses while it runs: SM activity (the share of SMs with a warp resident),
    tensor pipe activity, DRAM bandwidth, and the fp32, fp16 and fp64 pipes' activity (DCGM's PIPE_FP*_ACTIVE),
    each 0-1. The defaults model a healthy bf16 kernel, its math on the tensor pipe (the fp pipes 0: a model,
    not a measurement; give ``fp32=`` for a kernel whose math runs in fp32).

    >>> Kernel.parse("sm=0.25,tensor=0,dram=0.1")
    Kernel(sm=0.25, tensor=0.0, dram=0.1, fp32=0.0, fp16=0.0, fp64=0.0)
    >>> Kernel.parse("tensor=0,fp32=0.4").fp32
    0.4
    """

    sm: float = 0.9
    tensor: float = 0.6
    dram: float = 0.3
    fp32: float = 0.0
    fp16: float = 0.0
    fp64: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise ValueError(f"Kernel {f.name} must be a number between 0 and 1, got {value!r}")
            object.__setattr__(self, f.name, float(value))

    def replace(self, sm: float | None = None, tensor: float | None = None, dram: float | None = None, *,
                fp32: float | None = None, fp16: float | None = None, fp64: float | None = None) -> Kernel:
        """This kernel with the shares given (None: keep this kernel's)."""
        given = {"sm": sm, "tensor": tensor, "dram": dram, "fp32": fp32, "fp16": fp16, "fp64": fp64}
        return Kernel(**{k: getattr(self, k) if v is None else v for k, v in given.items()})

    def seconds(self, busy: float) -> tuple[float, ...]:
        """SM-, tensor-, DRAM-, fp32-, fp16- and fp64-seconds of ``busy`` seconds at these shares."""
        return tuple(busy * getattr(self, f.name) for f in fields(self))

    @classmethod
    def parse(cls, text: str, base: Kernel | None = None) -> Kernel:
        """``"sm=0.25,tensor=0,dram=0.1"`` (any subset; the rest from ``base``, else the defaults), the form of
        ``$GPU_SIM_KERNEL``. Raises ValueError with a one-line message on anything else."""
        shares: dict[str, float] = {}
        names = [f.name for f in fields(cls)]
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            key, sep, value = (s.strip() for s in part.partition("="))
            if not sep or key not in names:
                raise ValueError(f"kernel shares must look like sm=0.25,tensor=0,dram=0.1,fp32=0 (keys: "
                                 f"{', '.join(names)}), got {text!r}")
            try:
                shares[key] = float(value)
            except ValueError:
                raise ValueError(f"kernel share {key} must be a number between 0 and 1, got {value!r}") from None
        return (base or cls()).replace(**shares)


DEFAULT_KERNEL = Kernel()
"""What a chunk without shares ran (lines of older writers, ``Chunks.add`` without a kernel)."""


class Activity(NamedTuple):
    """Seconds within a window: busy (a kernel ran), and SM-, tensor-pipe-, DRAM- and fp32/fp16/fp64-pipe-seconds."""

    busy: float
    sm: float
    tensor: float
    dram: float
    fp32: float = 0.0
    fp16: float = 0.0
    fp64: float = 0.0

    def ratios(self, seconds: float) -> Activity:
        """Each as a share of a window of ``seconds`` (all 0 for an empty window)."""
        return Activity(*(x / seconds if seconds > 0 else 0.0 for x in self))


def channel_path(uuid: str, directory: str | Path | None = None) -> Path:
    """``DIR/<uuid>.busy``, the file one simulated GPU's busy intervals go to. ``DIR``: ``directory``, else
    ``$GPU_SIM_DEVICE_DIR``, else ``gpu-exporter-sim-device`` in the temp dir."""
    if directory is None:
        directory = os.environ.get(CHANNEL_ENV, "").strip() or Path(tempfile.gettempdir()) / "gpu-exporter-sim-device"
    return Path(directory) / f"{uuid}.busy"


class Intervals:
    """Disjoint busy intervals as one sorted list of edges (even: starts, odd: ends), with exact integrals.

    >>> iv = Intervals(); iv.add(1.0, 2.0); iv.add(1.5, 3.0); iv.add(5.0, 6.0)
    >>> iv.points, iv.busy(0.0, 10.0)
    ([1.0, 3.0, 5.0, 6.0], 3.0)
    """

    def __init__(self) -> None:
        self.points: list[float] = []

    def add(self, start: float, end: float) -> None:
        if end <= start:
            return
        p = self.points
        if not p or start > p[-1]:
            p.extend((start, end))
            return
        if start >= p[-2]:  # overlaps or touches the last interval: extend it
            p[-1] = max(p[-1], end)
            return
        lo = bisect.bisect_left(p, start)
        hi = bisect.bisect_right(p, end)
        p[lo:hi] = ([] if lo % 2 else [start]) + ([] if hi % 2 else [end])

    def busy(self, t0: float, t1: float) -> float:
        if t1 <= t0:
            return 0.0
        p = self.points
        lo = bisect.bisect_right(p, t0)
        hi = bisect.bisect_left(p, t1)
        cuts = ([t0] if lo % 2 else []) + p[lo:hi] + ([t1] if hi % 2 else [])
        return sum(b - a for a, b in zip(cuts[::2], cuts[1::2], strict=False))


class Chunks:
    """Busy time as chunks ``[start, end)`` of at most :data:`CHUNK_SECONDS` (or one longer interval), each with its
    busy seconds and its SM-, tensor-, DRAM- and fp-pipe-seconds, spread evenly over the chunk: exact to the chunk
    for every integral, at a bounded size.

    >>> c = Chunks(); c.add(0.0, 0.0002); c.add(0.0005, 0.0007); c.add(1.0, 3.0)
    >>> [round(x, 6) for x in (c.value(0.0003), c.busy(0.0, 0.001), c.busy(0.0, 2.0), c.value(2.5))]
    [0.571429, 0.0004, 1.0004, 1.0]
    """

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.busies: list[float] = []
        self._columns: tuple[list[float], ...] = (self.busies, *([] for _ in fields(Kernel)))
        """The busy seconds, then a kernel's share-seconds in :class:`Kernel`'s order: a channel line's columns."""

    def add(self, start: float, end: float, busy: float | None = None, *, kernel: Kernel | None = None,
            seconds: tuple[float, ...] | None = None) -> None:
        """Add ``busy`` seconds (default: all of it) within [start, end), run at ``kernel``'s shares, or with
        ``seconds`` = (SM, tensor, DRAM[, FP32, FP16, FP64]) seconds as given (a channel line; without the fp
        pipes' none); neither: the default kernel."""
        busy = end - start if busy is None else busy
        if end <= start or busy <= 0:
            return
        shares = (kernel or DEFAULT_KERNEL).seconds(busy) if seconds is None else (*seconds, 0.0, 0.0, 0.0)[:6]
        if self.starts:
            first, last = self.starts[-1], self.ends[-1]
            if start >= first and end - first <= CHUNK_SECONDS:  # into the open chunk
                self.ends[-1] = max(last, end)
                keep = min(1.0, (self.ends[-1] - first) / (self.busies[-1] + busy))  # overlaps: busy at most all of it
                for column, value in zip(self._columns, (busy, *shares), strict=True):
                    column[-1] = (column[-1] + value) * keep
                return
            if start < last:  # overlaps the last chunk (out of order): keep what lies after it
                part = max(0.0, end - last) / (end - start)
                busy, shares, start = busy * part, tuple(x * part for x in shares), last
                if end <= start:
                    return
        keep = min(1.0, (end - start) / busy)
        self.starts.append(start)
        self.ends.append(end)
        for column, value in zip(self._columns, (busy, *shares), strict=True):
            column.append(value * keep)

    def line(self, i: int) -> str:
        """Chunk ``i`` as a channel line."""
        return " ".join(f"{x:.6f}" for x in (self.starts[i], self.ends[i], *(c[i] for c in self._columns))) + "\n"

    def value(self, t: float) -> float:
        i = bisect.bisect_right(self.starts, t) - 1
        if i < 0 or t >= self.ends[i]:
            return 0.0
        return self.busies[i] / (self.ends[i] - self.starts[i])

    def edges(self, t0: float, t1: float) -> list[float]:
        lo = max(0, bisect.bisect_right(self.starts, t0) - 1)
        hi = bisect.bisect_left(self.starts, t1)
        return [x for i in range(lo, hi) for x in (self.starts[i], self.ends[i]) if t0 < x < t1]

    def _weights(self, t0: float, t1: float) -> list[tuple[int, float]]:
        """(chunk, share of it inside [t0, t1]) for every chunk that overlaps the window."""
        out = []
        for i in range(max(0, bisect.bisect_right(self.starts, t0) - 1), bisect.bisect_left(self.starts, t1)):
            a, b = self.starts[i], self.ends[i]
            overlap = min(b, t1) - max(a, t0)
            if overlap > 0:
                out.append((i, overlap / (b - a)))
        return out

    def busy(self, t0: float, t1: float) -> float:
        return math.fsum(self.busies[i] * w for i, w in self._weights(t0, t1))

    def activity(self, t0: float, t1: float) -> Activity:
        weights = self._weights(t0, t1)
        return Activity(*(math.fsum(column[i] * w for i, w in weights) for column in self._columns))


class DeviceTrace:
    """The exporter's side of the channel: a utilization pattern (and the activity) read from ``DIR/<uuid>.busy``,
    whose ``origin`` is the ``time.monotonic()`` reading of simulated time 0.

    :meth:`refresh` reads the lines appended since the last call (a partly written last line waits for the next).
    """

    def __init__(self, path: Path, origin: float) -> None:
        self.path = path
        self.origin = origin
        self._chunks = Chunks()
        self._offset = 0
        self._lock = threading.Lock()

    def refresh(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:  # no job has used this GPU yet
            return
        end = chunk.rfind(b"\n") + 1
        if not end:
            return
        with self._lock:
            self._offset += end
            for line in chunk[:end].splitlines():
                try:
                    start, stop, *rest = (float(x) for x in line.split())
                except ValueError:  # not numbers: skip it, a trace must never break NVML
                    continue
                busy = rest[0] if rest else None
                seconds = tuple(rest[1:7]) if len(rest) >= 4 else None
                self._chunks.add(start - self.origin, stop - self.origin, busy, seconds=seconds)

    def value(self, t: float) -> float:
        with self._lock:
            return self._chunks.value(t)

    def edges(self, t0: float, t1: float) -> list[float]:
        with self._lock:
            return self._chunks.edges(t0, t1)

    def activity(self, t0: float, t1: float) -> Activity:
        """Busy, SM-, tensor-, DRAM- and fp-pipe-seconds between simulated times t0 and t1."""
        with self._lock:
            return self._chunks.activity(t0, t1)


class ChannelWriter:
    """The job's side: appends the device's closed chunks to the channel file."""

    def __init__(self, uuid: str, directory: str | Path | None, chunks: Chunks) -> None:
        self.path = channel_path(uuid, directory)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.pid = os.getpid()
        self._chunks = chunks
        self._written = 0

    def flush(self, lock: threading.Lock, final: bool = False) -> None:
        """Write the chunks that can no longer grow (all of them when ``final``)."""
        if os.getpid() != self.pid:  # a forked DataLoader worker is not the device's owner
            return
        c = self._chunks
        with lock:
            upto = len(c.starts)
            if (not final and upto and c.ends[-1] - c.starts[-1] < CHUNK_SECONDS
                    and c.starts[-1] > time.monotonic() - CHUNK_SECONDS):
                upto -= 1  # the open chunk may still grow (a longer one, e.g. a queued kernel, cannot)
            lines = "".join(c.line(i) for i in range(self._written, upto))
            self._written = max(self._written, upto)
        if lines:
            with self.path.open("a") as f:
                f.write(lines)
