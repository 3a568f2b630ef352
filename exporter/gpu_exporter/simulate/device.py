"""A simulated GPU that does its own work: its busy time comes from what the job hands it.

The problem: a scenario GPU that follows the phases a job pushes (``follow_training``) agrees with
the job's phase clock by construction, so a phase counted wrongly can never show up as a wrong
verdict. A real CUDA GPU is asynchronous (kernels run after ``launch`` returns, and a ``.item()``
waits for them), and CPU work inside a framework's step is not GPU work. This module is a device
that behaves like that, in the job's process, and tells the exporter's simulated NVML when it was
busy:

* :class:`AsyncDevice` (**async mode**) stands in for a CUDA stream: :meth:`~AsyncDevice.launch`
  returns at once and the kernel runs in order on the device's own clock, :meth:`~AsyncDevice.synchronize`
  (what ``.item()``, ``.cpu()`` and ``torch.cuda.synchronize()`` do) blocks until the queue is done,
  :meth:`~AsyncDevice.record` is a CUDA event, and :meth:`~AsyncDevice.all_reduce` is an emulated NCCL
  collective that waits on the device for the slowest rank of its group.
  ``gpu_exporter.simulate.torch_cuda`` installs the ``torch.cuda`` subset the training library uses
  on top of it, so the library's CUDA code paths run on CPU-only machines.
* :class:`OpsDevice` (**ops mode**) is for real framework jobs on a CPU: the GPU is busy while the
  job's main thread is inside a torch operator (a ``TorchDispatchMode`` times each top-level aten op)
  and idle during everything else, Python inside ``training_step`` included. ``python -m
  gpu_exporter.simulate.device --uuid GPU-x -- train.py ARGS`` runs any script on one.

**Kernels.** A kernel uses a share of the GPU while it runs (:class:`Kernel`: SM activity, tensor pipe,
DRAM bandwidth); NVML's utilization counts only that a kernel ran, GPM and DCGM profiling the shares. A
device has a default kernel (``kernel=``, else ``$GPU_SIM_KERNEL``, else the defaults), and
:meth:`AsyncDevice.launch` takes ``sm=``, ``tensor=``, ``dram=`` per kernel.

**The channel** (:mod:`gpu_exporter.simulate.channel`). Each device appends what it did to
``DIR/<uuid>.busy`` (``$GPU_SIM_DEVICE_DIR``, else ``gpu-exporter-sim-device`` in the temp dir), where a
scenario GPU with ``device: true`` reads it. The file is all the two sides share: this module and
``torch_cuda`` (the job's side) import no module of the exporter's (node, fake NVML, scenario), and no module
of the exporter's side imports them.

**The truth.** A device also knows, exactly, how long it sat idle while the job's CPU did each
thing: the job marks what its CPU does with :meth:`SimDevice.doing` (its own ground truth, apart
from what any library reports), and :meth:`SimDevice.truth` returns the idle seconds per mark, and the
SM-, tensor-, DRAM- and fp-pipe-seconds of its kernels.

>>> import tempfile
>>> dev = AsyncDevice("GPU-doc", directory=tempfile.mkdtemp(prefix="gpu-sim-doc-"))
>>> dev.launch(0.02, sm=0.25); dev.synchronize()
>>> [round(x, 3) for x in dev.activity()]  # busy, SM, tensor, DRAM, FP32, FP16, FP64 seconds
[0.02, 0.005, 0.012, 0.006, 0.0, 0.0, 0.0]
>>> dev.close()
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_exporter.simulate.channel import (
    CHANNEL_ENV,
    CHUNK_SECONDS,
    FLUSH_SECONDS,
    Activity,
    ChannelWriter,
    Chunks,
    Intervals,
    Kernel,
    channel_path,
)

# The job's side, and the channel's names a job writes with (its reader, DeviceTrace, is the exporter's).
__all__ = [
    "CHANNEL_ENV", "CHUNK_SECONDS", "COLLECTIVE_KERNEL", "FLUSH_SECONDS", "KERNEL_ENV", "Activity", "AsyncDevice",
    "Chunks", "DeviceEvent", "Intervals", "Kernel", "OpsDevice", "SimDevice", "channel_path", "run_script", "spin",
]

KERNEL_ENV = "GPU_SIM_KERNEL"
"""Environment variable with the default kernel shares of an ops-mode device (``sm=0.25,tensor=0,dram=0.1``)."""
COLLECTIVE_KERNEL = Kernel(sm=0.1, tensor=0.0, dram=0.05)
"""What an emulated NCCL collective uses while it is busy (its spinning wait and its transfer): NCCL runs a few
blocks on a handful of SMs, no tensor math, and moves data at network speed, far below DRAM bandwidth."""


class SimDevice:
    """What both modes share: the channel, the record of busy intervals, the flusher and the truth."""

    def __init__(self, uuid: str, directory: str | Path | None = None, *, kernel: Kernel | None = None) -> None:
        self.uuid = uuid
        self.kernel = kernel if kernel is not None else kernel_from_env()
        """The shares of the GPU the device's kernels use unless a launch says otherwise (default: those
        ``$GPU_SIM_KERNEL`` names, else :class:`Kernel`'s defaults)."""
        self.history = Chunks()
        """Every busy interval so far (monotonic seconds): the device's own truth."""
        self.collectives = Intervals()
        """When the stream was in a collective (waiting for the other ranks, then transferring)."""
        self.waits = Intervals()
        """When the stream waited, idle, for the other ranks of a collective."""
        self._marks: list[tuple[float, str]] = []
        self._history_lock = threading.Lock()
        self._channel = ChannelWriter(uuid, directory, self.history)
        self._started = time.monotonic()
        self._closed = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, name=f"gpu-sim-{uuid}", daemon=True)
        self._flusher.start()
        atexit.register(self.close)

    def _busy(self, start: float, end: float, kernel: Kernel | None = None) -> None:
        if os.getpid() != self._channel.pid:  # a forked DataLoader worker does no GPU work of this device
            return
        with self._history_lock:
            self.history.add(start, end, kernel=kernel or self.kernel)

    def _flush_loop(self) -> None:
        while not self._closed.wait(FLUSH_SECONDS):
            self._tick()
            self._channel.flush(self._history_lock)

    def _tick(self) -> None:
        """Work the flusher does each round besides flushing (the async device resolves collectives)."""

    def doing(self, what: str) -> None:
        """Mark what the job's CPU does from now on (``"data"``, ``"compute"``, ...): the truth's phases."""
        self._marks.append((time.monotonic(), what))

    @contextlib.contextmanager
    def marked(self, what: str) -> Iterator[None]:
        """``with dev.marked("metrics"):`` marks ``what`` and returns to the previous mark afterwards."""
        before = self._marks[-1][1] if self._marks else "other"
        self.doing(what)
        try:
            yield
        finally:
            self.doing(before)

    def busy_seconds(self, t0: float | None = None, t1: float | None = None) -> float:
        """Seconds the device was busy between monotonic times t0 (its start) and t1 (now)."""
        return self.activity(t0, t1).busy

    def activity(self, t0: float | None = None, t1: float | None = None) -> Activity:
        """Busy, SM-, tensor-, DRAM- and fp32/fp16/fp64-pipe-seconds between monotonic times t0 (its start) and t1
        (now): what the exporter's simulated NVML and the stand-in dcgm-exporter read from the channel, exactly."""
        with self._history_lock:
            return self.history.activity(self._started if t0 is None else t0, time.monotonic() if t1 is None else t1)

    def truth(self, since: float | None = None, until: float | None = None) -> dict[str, Any]:
        """The device's own account from ``since`` (its start) to ``until`` (now): ``wall``, :meth:`activity`'s
        seconds (``sm / wall`` is the SM activity GPM and DCGM report; ``sm / busy`` the mean share of SMs its kernels
        used), ``idle`` and ``cpu`` seconds per marked CPU phase (before the first mark: ``other``), and
        ``collective``, the seconds the stream spent in collectives (its idle wait there is not in ``idle``)."""
        end = time.monotonic() if until is None else until
        begin = self._started if since is None else since
        before = [what for t, what in self._marks if t <= begin]
        spans = [(begin, before[-1] if before else "other"), *((t, w) for t, w in self._marks if t > begin), (end, "")]
        idle: dict[str, float] = {}
        cpu: dict[str, float] = {}
        with self._history_lock:
            for (a, what), (b, _) in itertools.pairwise(spans):
                b = min(b, end)
                if b <= a:
                    continue
                cpu[what] = cpu.get(what, 0.0) + (b - a)
                idle[what] = idle.get(what, 0.0) + (b - a) - self.history.busy(a, b) - self.waits.busy(a, b)
            act = self.history.activity(begin, end)
            return {"wall": end - begin, **act._asdict(), "idle": idle, "cpu": cpu,
                    "collective": self.collectives.busy(begin, end)}

    def close(self) -> None:
        """Stop the flusher and write what is left (also at exit)."""
        if self._closed.is_set():
            return
        self._closed.set()
        atexit.unregister(self.close)
        if self._flusher is not threading.current_thread():
            self._flusher.join(timeout=1.0)
        self._tick()
        self._channel.flush(self._history_lock, final=True)


@dataclass
class _Op:
    launched: float
    seconds: float
    kind: str  # "kernel", "copy" or "collective"
    seq: int = 0
    kernel: Kernel | None = None


class DeviceEvent:
    """A CUDA event on an :class:`AsyncDevice`: done when the stream has run everything queued before it."""

    def __init__(self, device: AsyncDevice) -> None:
        self._device = device
        self.time: float | None = None
        """Monotonic seconds at which the event completed (None until the stream reaches it)."""

    def record(self) -> None:
        self._device._record(self)

    def query(self) -> bool:
        self._device.advance()
        return self.time is not None and self.time <= time.monotonic()

    def synchronize(self) -> None:
        while not self.query():  # sleep until the known completion time, or a moment while it waits for other ranks
            time.sleep(max(0.0, self.time - time.monotonic()) if self.time is not None else 0.0005)

    def elapsed_time(self, end: DeviceEvent) -> float:
        """Milliseconds from this event to ``end``; both must be complete (as in CUDA)."""
        if self.time is None or end.time is None or not (self.query() and end.query()):
            raise RuntimeError("elapsed_time: both events must have completed (query() is True)")
        return (end.time - self.time) * 1000.0


class AsyncDevice(SimDevice):
    """A stand-in for a CUDA stream on one GPU: asynchronous kernels, copies, events and collectives.

    ``group``/``rank``/``world`` make :meth:`all_reduce` an emulated NCCL collective: the ranks of a
    group (one device each, any processes) meet through files in the channel directory. The device
    is busy while a kernel or a collective's transfer runs; a copy (``.cpu()``, ``.to("cuda")``)
    holds the stream but is not busy (NVML counts kernels only), and so is a collective's wait for
    the slowest rank: by default (``wait_busy``) that wait is busy too, as NCCL's kernel spins while it waits and
    NVML counts it; ``wait_busy=False`` makes the wait idle (a CPU-side wait, e.g. gloo). A collective's busy time
    uses :data:`COLLECTIVE_KERNEL`, a :meth:`launch` the device's ``kernel`` unless it says otherwise.
    """

    def __init__(self, uuid: str, directory: str | Path | None = None, *, group: str = "", rank: int = 0,
                 world: int = 1, wait_busy: bool = True, kernel: Kernel | None = None) -> None:
        self._lock = threading.RLock()
        self._queue: list[_Op] = []
        """Ops not yet placed on the device's clock (only behind a collective whose peers have not arrived)."""
        self._tail = 0.0
        """When the last placed op ends (monotonic seconds)."""
        self._events: list[tuple[int, float, DeviceEvent]] = []
        self._launched = self._placed = self._collectives = 0  # ops launched and placed, collectives launched
        self.group, self.rank, self.world, self.wait_busy = group, rank, world, wait_busy
        self.torch_synchronize_calls = 0
        """How often ``torch.cuda.synchronize()`` was called (simulate/torch_cuda.py installs it)."""
        super().__init__(uuid, directory, kernel=kernel)
        self._meeting = self._channel.path.parent / f"collectives-{group or uuid}"
        if world > 1:
            self._meeting.mkdir(parents=True, exist_ok=True)

    # --- what the job does --------------------------------------------------------------------

    def launch(self, seconds: float, cpu_seconds: float = 0.0, *, sm: float | None = None,
               tensor: float | None = None, dram: float | None = None) -> None:
        """Queue a kernel of ``seconds`` GPU time; issuing it costs ``cpu_seconds`` of CPU first (launch overhead).

        ``sm``, ``tensor``, ``dram``: the shares of the GPU it uses while it runs (None: the device's kernel's),
        e.g. ``launch(0.01, sm=0.2)`` for a small batch that fills a fifth of the SMs."""
        kernel = self.kernel.replace(sm, tensor, dram)
        spin(cpu_seconds)
        self._enqueue(_Op(time.monotonic(), seconds, "kernel", kernel=kernel))

    def copy(self, seconds: float) -> None:
        """Queue a copy between host and device (holds the stream, not counted busy)."""
        self._enqueue(_Op(time.monotonic(), seconds, "copy"))

    def all_reduce(self, seconds: float) -> None:
        """Queue an emulated NCCL all-reduce whose transfer takes ``seconds`` once every rank's stream reached it."""
        self._collectives += 1
        self._enqueue(_Op(time.monotonic(), seconds, "collective", self._collectives))

    def synchronize(self) -> None:
        """Block until everything queued so far has run (``torch.cuda.synchronize()``)."""
        self.record().synchronize()

    def free_and_retry(self, seconds: float) -> None:
        """A caching-allocator retry (M4): free the cached blocks (which waits for the stream, as ``cudaFree``
        does), then ``seconds`` with the GPU idle to malloc again, inside the device like torch's allocator."""
        self.synchronize()
        time.sleep(seconds)

    def item(self, cpu_seconds: float = 0.0) -> None:
        """``tensor.item()`` / ``.cpu()``: wait for the queue, then a tiny copy; ``cpu_seconds`` of CPU after."""
        self.synchronize()
        spin(cpu_seconds)

    def record(self) -> DeviceEvent:
        """A new event recorded now on the stream."""
        event = DeviceEvent(self)
        event.record()
        return event

    # --- the device's clock -------------------------------------------------------------------

    def _enqueue(self, op: _Op) -> None:
        with self._lock:
            self._launched += 1
            self._queue.append(op)
            self.advance()

    def _record(self, event: DeviceEvent) -> None:
        with self._lock:
            now = time.monotonic()
            event.time = None if self._queue else max(now, self._tail)
            if self._queue:
                self._events.append((self._launched, now, event))

    def advance(self) -> None:
        """Place every op that can be placed on the device's clock (never blocks)."""
        with self._lock:
            while self._queue:
                op = self._queue[0]
                start = max(op.launched, self._tail)
                if op.kind == "collective":
                    arrived = self._meet(op.seq, start)
                    if arrived is None:
                        break
                    transfer_start = max(arrived)
                    if self.wait_busy:
                        self._busy(start, transfer_start, COLLECTIVE_KERNEL)
                    else:
                        self.waits.add(start, transfer_start)
                    self.collectives.add(start, transfer_start + op.seconds)
                    start = transfer_start
                end = start + op.seconds
                if op.kind != "copy":
                    self._busy(start, end, op.kernel or COLLECTIVE_KERNEL)
                self._tail = end
                self._queue.pop(0)
                self._placed += 1
                for n, recorded, event in self._events:
                    if n <= self._placed:
                        event.time = max(recorded, self._tail)
                self._events = [(n, t, e) for n, t, e in self._events if n > self._placed]

    _tick = advance

    def _meet(self, seq: int, arrival: float) -> list[float] | None:
        """Post this rank's arrival at collective ``seq``; every rank's arrival once all have posted."""
        if self.world <= 1:
            return [arrival]
        mine = self._meeting / f"{seq}.{self.rank}"
        if not mine.exists():
            tmp = mine.with_suffix(f".{self.rank}.tmp")
            tmp.write_text(repr(arrival))
            tmp.replace(mine)
        try:
            return [float((self._meeting / f"{seq}.{rank}").read_text()) for rank in range(self.world)]
        except (OSError, ValueError):  # a rank has not posted (or is writing) yet
            return None


def spin(seconds: float) -> None:
    """Use the CPU for ``seconds`` (wall clock) in Python: CPU work that is not GPU work."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


class OpsDevice(SimDevice):
    """Busy while this process's main thread is inside a torch operator; idle otherwise.

    :meth:`start` enters a ``TorchDispatchMode`` that times each top-level aten operator (the ones autograd runs in
    ``backward()`` too) at the device's ``kernel``; collectives (``c10d``) are communication, not GPU work.
    """

    SKIP_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")

    def __init__(self, uuid: str, directory: str | Path | None = None, *, kernel: Kernel | None = None) -> None:
        super().__init__(uuid, directory, kernel=kernel)
        self._mode: Any = None

    def start(self) -> OpsDevice:
        from torch.utils._python_dispatch import TorchDispatchMode

        device = self
        clock = time.monotonic
        skip = self.SKIP_NAMESPACES

        class _Busy(TorchDispatchMode):  # type: ignore[no-untyped-call]
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                if func.namespace in skip:
                    return func(*args, **(kwargs or {}))
                t0 = clock()
                try:
                    return func(*args, **(kwargs or {}))
                finally:
                    device._busy(t0, clock())

        self._mode = _Busy()  # type: ignore[no-untyped-call]
        self._mode.__enter__()
        return self

    def close(self) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:
            with contextlib.suppress(Exception):
                mode.__exit__(None, None, None)
        super().close()


def kernel_from_env() -> Kernel:
    """The kernel ``$GPU_SIM_KERNEL`` names (the defaults when it is unset or empty).

    Raises ValueError, one line naming the variable, on a bad value."""
    text = os.environ.get(KERNEL_ENV, "").strip()
    try:
        return Kernel.parse(text)
    except ValueError as exc:
        raise ValueError(f"${KERNEL_ENV}: {exc}") from None


def run_script(argv: list[str]) -> int:
    """The command line: ``python -m gpu_exporter.simulate.device --uuid GPU-x [OPTIONS] -- script.py ARGS``."""
    import argparse
    import json
    import runpy

    parser = argparse.ArgumentParser(prog="python -m gpu_exporter.simulate.device",
                                     description="Run a Python training script on an ops-mode simulated GPU "
                                                 "(busy while the script is inside torch operators).")
    parser.add_argument("--uuid", required=True, help="the simulated GPU's UUID (a scenario GPU with device: true)")
    parser.add_argument("--dir", default=None, help=f"channel directory (default ${CHANNEL_ENV} or the temp dir)")
    parser.add_argument("--truth", default=None, help="write the device's own account (JSON) here at exit")
    for share, what in (("sm", "SM activity"), ("tensor", "tensor pipe activity"), ("dram", "DRAM bandwidth"),
                        ("fp32", "fp32 pipe activity"), ("fp16", "fp16 pipe activity"),
                        ("fp64", "fp64 pipe activity")):
        parser.add_argument(f"--{share}", type=float, default=None,
                            help=f"the {what} (0-1) every operator runs at (default: ${KERNEL_ENV}, else "
                                 f"{getattr(Kernel(), share)})")
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    ns = parser.parse_args(argv)
    try:
        kernel = kernel_from_env().replace(ns.sm, ns.tensor, ns.dram, fp32=ns.fp32, fp16=ns.fp16, fp64=ns.fp64)
    except ValueError as exc:
        parser.error(str(exc))
    device = OpsDevice(ns.uuid, ns.dir, kernel=kernel).start()
    sys.argv = [ns.script, *ns.args]
    try:
        runpy.run_path(ns.script, run_name="__main__")
    finally:
        device.close()
        if ns.truth:
            Path(ns.truth).write_text(json.dumps(device.truth()))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(sys.argv[1:]))
